"""ctypes bindings to Chorus's C API (include/nccl.h and include/chorus.h).

The library is found, in this order: the file named by CHORUS_LIB; the libchorus.so that
`pip install ./python` put into this package; the one a build of the source tree next to this
package left in build/lib; then the dynamic linker's search path. Functions are taken by their
pnccl* names, which only Chorus's library defines strongly, so a process that has NVIDIA's
libnccl.so.2 loaded as well (CUDA builds of torch) still calls Chorus.
"""
import ctypes
import ctypes.util
import os
import threading

NCCL_UNIQUE_ID_BYTES = 128

# ncclDataType_t
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)
# ncclRedOp_t
SUM, PROD, MAX, MIN, AVG = range(5)
SCALAR_HOST_IMMEDIATE = 1


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


_comm_t = ctypes.c_void_p
_req_t = ctypes.c_void_p
_res = ctypes.c_int
_sz = ctypes.c_size_t
_i = ctypes.c_int
_p = ctypes.c_void_p

# name -> (argtypes); every function returns ncclResult_t unless listed in _RESTYPE.
_PROTOS = {
    "pncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "pncclCommInitRank": [ctypes.POINTER(_comm_t), _i, UniqueId, _i],
    "pncclCommDestroy": [_comm_t],
    "pncclCommAbort": [_comm_t],
    "pncclCommGetAsyncError": [_comm_t, ctypes.POINTER(_i)],
    "pncclGetErrorString": [_i],
    "pncclGetLastError": [_comm_t],
    "pncclGetVersion": [ctypes.POINTER(_i)],
    "pncclGroupStart": [],
    "pncclGroupEnd": [],
    "pncclRedOpCreatePreMulSum": [ctypes.POINTER(_i), _p, _i, _i, _comm_t],
    "pncclRedOpDestroy": [_i, _comm_t],
    "chorusAllReduceAsync": [_p, _p, _sz, _i, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusReduceScatterAsync": [_p, _p, _sz, _i, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusAllGatherAsync": [_p, _p, _sz, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusBroadcastAsync": [_p, _p, _sz, _i, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusReduceAsync": [_p, _p, _sz, _i, _i, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusAlltoAllAsync": [_p, _p, _sz, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusGatherAsync": [_p, _p, _sz, _i, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusScatterAsync": [_p, _p, _sz, _i, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusSendAsync": [_p, _sz, _i, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusRecvAsync": [_p, _sz, _i, _i, _comm_t, ctypes.POINTER(_req_t)],
    "chorusTest": [_req_t, ctypes.POINTER(_i)],
    "chorusWait": [_req_t],
    "chorusWaitAll": [_i, ctypes.POINTER(_req_t)],
}
_RESTYPE = {"pncclGetErrorString": ctypes.c_char_p, "pncclGetLastError": ctypes.c_char_p}


def _candidates():
    env = os.environ.get("CHORUS_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "lib", "libchorus.so")
    yield os.path.join(os.path.dirname(os.path.dirname(here)), "build", "lib", "libchorus.so")
    found = ctypes.util.find_library("chorus")
    if found:
        yield found


class _Lib:
    def __init__(self):
        errors = []
        self.path = None
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                errors.append(f"{path}: no such file")
                continue
            try:
                self.dll = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
                self.path = path
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        if self.path is None:
            raise ImportError("chorus_torch: cannot load libchorus.so (set CHORUS_LIB to its path, "
                              "or pip install ./python from the Chorus source tree): " +
                              "; ".join(errors or ["nothing found"]))
        for name, args in _PROTOS.items():
            try:
                f = getattr(self.dll, name)
            except AttributeError:
                raise ImportError(f"chorus_torch: {self.path} has no {name}: not a Chorus library "
                                  "or too old") from None
            f.argtypes = args
            f.restype = _RESTYPE.get(name, _res)
            setattr(self, name[1:] if name.startswith("pnccl") else name, f)

    def error_text(self, rc):
        s = self.ncclGetErrorString(rc)
        return s.decode(errors="replace") if s else f"error {rc}"

    def last_error(self):
        s = self.ncclGetLastError(None)
        return s.decode(errors="replace") if s else ""

    def version(self):
        v = _i(0)
        self.ncclGetVersion(ctypes.byref(v))
        return v.value


_lib = None
_lib_lock = threading.Lock()


def lib():
    """The loaded library (loaded on first use)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _Lib()
        return _lib


class ChorusError(RuntimeError):
    """A Chorus call failed; the text carries Chorus's own message, which names the rank."""


def check(rc, what, rank):
    if rc != 0:
        L = lib()
        last = L.last_error()
        raise ChorusError(f"chorus: {what} failed on rank {rank}: {L.error_text(rc)}"
                          + (f": {last}" if last else ""))
