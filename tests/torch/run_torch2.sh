#!/usr/bin/env bash
# Run the chorus backend's torch tests on a pinned PyPI torch 2.x, every multi-rank test under
# real torchrun (ctest label torch2), and check that torch's CUDA build loads Chorus's
# libnccl.so.2 in place of its own NCCL.
#
#   tests/torch/run_torch2.sh [build-dir]        (default: build; configured and built already)
#
# Environment:
#   CHORUS_TORCH2_VERSION  the torch to pin (default 2.15.0)
#   CHORUS_TORCH2_CACHE    the wheel cache (default ~/.cache/chorus/torch2-wheels): filled by
#                          `pip download` when it lacks the pinned torch, installed from offline
#   CHORUS_TORCH2_VENV     the venv (default ~/.cache/chorus/venv-torch<version>); made when missing
#   PYTHON                 the Python that makes the venv (default python3; torch wheels exist
#                          for CPython 3.10-3.13)
#
# The CUDA wheel and its nvidia-* dependencies take about 3 GB to download and 5 GB installed,
# which is why CI (scripts/test.sh) runs Debian's torch 1.13 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
version=${CHORUS_TORCH2_VERSION:-2.15.0}
cache=${CHORUS_TORCH2_CACHE:-$HOME/.cache/chorus/torch2-wheels}
venv=${CHORUS_TORCH2_VENV:-$HOME/.cache/chorus/venv-torch$version}
python=${PYTHON:-python3}

have='import torch, sys; sys.exit(torch.__version__.split("+")[0] != sys.argv[1])'
if ! "$venv/bin/python" -c "$have" "$version" 2>/dev/null; then
  mkdir -p "$cache"
  if ! ls "$cache"/torch-"$version"-*.whl >/dev/null 2>&1; then
    echo "== downloading torch $version and its dependencies into $cache"
    "$python" -m pip download --only-binary=:all: -d "$cache" "torch==$version" numpy
  fi
  echo "== installing torch $version into $venv (offline, from $cache)"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --no-index --find-links "$cache" "torch==$version" numpy
fi
py=$venv/bin/python
"$py" -c "import torch; print('torch', torch.__version__)"

echo "== torch's nccl backend on Chorus's libnccl.so.2 (LD_PRELOAD)"
# torch.cuda.nccl.version() is the NCCL torch was built with; ProcessGroupNCCL asks the library.
chorus_version=$("$py" - "$build/lib/libnccl.so.2" <<'PY'
import ctypes, sys
v = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print(f"({v.value // 10000}, {v.value // 100 % 100}, {v.value % 100})")
PY
)
got=$(LD_PRELOAD="$PWD/$build/lib/libnccl.so.2" "$py" -c "import torch
from torch._C._distributed_c10d import ProcessGroupNCCL as P
print(P.get_runtime_nccl_version())")
echo "ProcessGroupNCCL.get_runtime_nccl_version() = $got, Chorus's ncclGetVersion = $chorus_version"
if [ "$got" != "$chorus_version" ]; then
  echo "FAIL: torch did not load Chorus's libnccl.so.2" >&2
  exit 1
fi

echo "== the nccl* symbols torch $version imports, against tests/core/torch_nccl_symbols.txt"
lib=$("$py" -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib/libtorch_cuda.so
diff <(nm -D --undefined-only "$lib" | grep -o ' nccl[A-Za-z0-9_]*' | tr -d ' ' | sort -u) \
     <(grep -v '^#' tests/core/torch_nccl_symbols.txt | sed '/^$/d' | sort -u)
echo "the recorded list matches"

echo "== ctest -L torch2 (CHORUS_TORCH2_PYTHON=$py)"
cmake -S . -B "$build" -DCHORUS_TORCH2_PYTHON="$py" >/dev/null
(cd "$build" && ctest --output-on-failure --timeout 600 -L torch2)
