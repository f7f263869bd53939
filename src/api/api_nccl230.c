/*
 * api_nccl230.c: the entry points NCCL 2.30 added to the API.
 *
 * Programs built against NCCL 2.30 bind every one of them when they load (PyTorch 2.x's
 * libtorch_cuda.so does, so `import torch` fails on a library without them). ncclWinGetUserPtr
 * is implemented. The others need what Chorus does not have yet (releasing GPU memory on demand,
 * adding ranks to a live communicator, one-sided signals, NCCL's device API): each returns
 * ncclInvalidUsage with a WARN that names it, and never succeeds quietly.
 */
#include <pthread.h>

#include "check.h"
#include "comm.h"
#include "api.h"
#include "util.h"
#include "log.h"

static ncclResult_t unsupported(const char *api, const char *what) {
    WARN("%s: not supported by Chorus (%s)", api, what);
    return ncclInvalidUsage;
}

NCCL_API(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void **outUserPtr);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr) {
    CHECK(comm_check(comm, "ncclWinGetUserPtr"));
    ARGCHECK(outUserPtr != NULL, "ncclWinGetUserPtr: outUserPtr is NULL");
    ARGCHECK(win != NULL, "ncclWinGetUserPtr: win is NULL");
    void *base = NULL;
    int found = 0;
    pthread_mutex_lock(&comm->lock);
    for (const comm_reg_t *r = comm->regs; r; r = r->next) {
        if ((const void *)r == (const void *)win && r->magic == COMM_WIN_MAGIC) {
            base = r->base;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&comm->lock);
    ARGCHECK(found, "ncclWinGetUserPtr: window %p is not a window of comm %p", (void *)win,
             (void *)comm);
    *outUserPtr = base;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags);
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
    (void)comm;
    (void)flags;
    return unsupported("ncclCommSuspend", "it cannot release a communicator's memory on demand");
}

NCCL_API(ncclResult_t, ncclCommResume, ncclComm_t comm);
ncclResult_t ncclCommResume(ncclComm_t comm) {
    (void)comm;
    return unsupported("ncclCommResume", "communicators are never suspended");
}

NCCL_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat,
         uint64_t *value);
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
    (void)comm;
    (void)stat;
    (void)value;
    return unsupported("ncclCommMemStats", "it does not count a communicator's GPU memory");
}

NCCL_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId *uniqueId);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId) {
    (void)comm;
    (void)uniqueId;
    return unsupported("ncclCommGetUniqueId", "communicators cannot grow");
}

NCCL_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId,
         int rank, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                          ncclComm_t *newcomm, ncclConfig_t *config) {
    (void)comm;
    (void)nRanks;
    (void)uniqueId;
    (void)rank;
    (void)config;
    if (newcomm != NULL) *newcomm = NULL;
    return unsupported("ncclCommGrow", "communicators cannot grow; make a new one");
}

NCCL_API(ncclResult_t, ncclPutSignal, const void *localbuff, size_t count,
         ncclDataType_t datatype, int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx,
         int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
    (void)localbuff;
    (void)count;
    (void)datatype;
    (void)peer;
    (void)peerWin;
    (void)peerWinOffset;
    (void)sigIdx;
    (void)ctx;
    (void)flags;
    (void)comm;
    (void)stream;
    return unsupported("ncclPutSignal", "no one-sided operations yet");
}

NCCL_API(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream) {
    (void)peer;
    (void)sigIdx;
    (void)ctx;
    (void)flags;
    (void)comm;
    (void)stream;
    return unsupported("ncclSignal", "no one-sided operations yet");
}

NCCL_API(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t *signalDescs,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
                            cudaStream_t stream) {
    (void)nDesc;
    (void)signalDescs;
    (void)comm;
    (void)stream;
    return unsupported("ncclWaitSignal", "no one-sided operations yet");
}

NCCL_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
         ncclDevComm_t *outDevComm);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                               ncclDevComm_t *outDevComm) {
    (void)comm;
    (void)reqs;
    (void)outDevComm;
    return unsupported("ncclDevCommCreate", "NCCL's device API is not implemented");
}

NCCL_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, const ncclDevComm_t *devComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm) {
    (void)comm;
    (void)devComm;
    return unsupported("ncclDevCommDestroy", "NCCL's device API is not implemented");
}

NCCL_API(ncclResult_t, ncclGetLsaMultimemDevicePointer, ncclWindow_t window, size_t offset,
         void **outPtr);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr) {
    (void)window;
    (void)offset;
    if (outPtr != NULL) *outPtr = NULL;
    return unsupported("ncclGetLsaMultimemDevicePointer", "no multimem (NVLS) support");
}

NCCL_API(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t window, size_t offset, int peer,
         void **outPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                      void **outPtr) {
    (void)window;
    (void)offset;
    (void)peer;
    if (outPtr != NULL) *outPtr = NULL;
    return unsupported("ncclGetPeerDevicePointer", "windows are not mapped into peers");
}
