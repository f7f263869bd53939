/*
 * nccl.h: Chorus's NCCL-compatible public interface.
 *
 * Chorus implements the API and ABI of NCCL 2.28 (names, signatures, enum values, struct layouts),
 * so programs built against NVIDIA's nccl.h run on libnccl.so.2 from Chorus unchanged. This text is
 * Chorus's own. Beyond NCCL, every call also accepts host (CPU) buffers, and several ranks may share
 * one GPU. Chorus extensions live in chorus.h.
 *
 * The header compiles with or without the CUDA headers: without them, cudaStream_t is an opaque
 * pointer (ABI-identical to CUDA's `struct CUstream_st*`).
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__has_include)
#if __has_include(<cuda_runtime.h>) && !defined(CHORUS_NO_CUDA_HEADERS)
#include <cuda_runtime.h>
#define CHORUS_NCCL_H_HAVE_CUDA 1
#endif
#endif
#ifndef CHORUS_NCCL_H_HAVE_CUDA
#ifndef __CUDA_RUNTIME_H__
typedef struct CUstream_st *cudaStream_t;
#endif
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22809
/* Releases up to 2.8 used X*1000+Y*100+Z; later ones X*10000+Y*100+Z. */
#define NCCL_VERSION(X, Y, Z)                                                                      \
    (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque handles. */
typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* Passed by value; made by ncclGetUniqueId on one rank and shared with the others. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* Window registration flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* CTA policy (config.CTAPolicy). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke flags: 0 is the only value defined. */
#define NCCL_REVOKE_DEFAULT 0x00

/* Communicator configuration. Create it with NCCL_CONFIG_INITIALIZER, then set fields. The leading
 * size, magic and version let a library accept configs made with older (smaller) headers. */
typedef struct ncclConfig_v22800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                    \
    {                                                                                              \
        sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),        \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                           \
    }

/* Filled by ncclGroupSimulateEnd. */
typedef struct ncclSimInfo_v22200 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                                                  \
    { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

/* Reduction ops. Values from ncclNumOps up are made at run time by ncclRedOpCreatePreMulSum. The
 * dummy enum pins the enum's size to that of int. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

/* Where the PreMulSum scalar lives. */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* Allocate memory suited to communication: device memory when a GPU is in use, page-aligned host memory otherwise. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t pncclMemAlloc(void **ptr, size_t size);

/* Free memory from ncclMemAlloc. */
ncclResult_t ncclMemFree(void *ptr);
ncclResult_t pncclMemFree(void *ptr);

/* The library's NCCL_VERSION_CODE. */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t pncclGetVersion(int *version);

/* Make the id that ncclCommInitRank takes. Call on one rank and share the bytes with the others. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId);

/* Create a communicator with a configuration (config may be NULL). Collective over all nranks ranks. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config);

/* Create a communicator. Collective over all nranks ranks. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);

/* Create ndev communicators in this process, one per device (or host-memory ranks when no GPU is present). */
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);

/* Create a communicator from several unique ids (spreads the bootstrap load). */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds, ncclConfig_t *config);

/* Finish outstanding operations; the communicator can then be destroyed. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* Free a communicator's resources. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* Stop all outstanding operations and free the communicator. Never blocks on peers. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Stop outstanding operations; the communicator accepts no new ones but may still be shrunk or destroyed. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Split by color, ordering ranks by key. NCCL_SPLIT_NOCOLOR yields a NULL newcomm. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);

/* A communicator without the listed ranks. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);

/* A description of a result code. */
const char * ncclGetErrorString(ncclResult_t result);
const char * pncclGetErrorString(ncclResult_t result);

/* The text of the last error (comm may be NULL). */
const char * ncclGetLastError(ncclComm_t comm);
const char * pncclGetLastError(ncclComm_t comm);

/* Re-read NCCL_DEBUG and its friends on next use. */
void ncclResetDebugInit(void);
void pncclResetDebugInit(void);

/* ncclInProgress while a nonblocking init or op runs; the first asynchronous error otherwise. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);

/* Number of ranks. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int *count);

/* The CUDA device of the communicator (-1 for a host-only communicator). */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device);

/* This rank. */
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank);

/* Register a buffer for communication. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);

/* Release a registration. */
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle);

/* Register a window (collective). */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags);

/* Release a window (collective). */
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ---- NCCL 2.30 additions. Chorus exports them all, with NCCL's prototypes, so that programs
 * built against NCCL 2.30 (PyTorch 2.x) load; the README says which ones work. ---- */

/* The user pointer a window was registered with. */
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr);
ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr);

/* Release (NCCL_SUSPEND_MEM) and take back a communicator's dynamic GPU memory. */
#define NCCL_SUSPEND_MEM 0x01
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t pncclCommResume(ncclComm_t comm);

/* Memory statistics of a communicator, in bytes (ncclStatGpuMemSuspended: 0 or 1). */
typedef enum {
    ncclStatGpuMemSuspend = 0,
    ncclStatGpuMemSuspended = 1,
    ncclStatGpuMemPersist = 2,
    ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value);
ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value);

/* Growing a communicator: an id made by an existing rank, then ncclCommGrow on old and new ranks. */
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId);
ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank, ncclComm_t *newcomm, ncclConfig_t *config);

/* One-sided operations on registered windows, ordered on a stream. */
typedef struct {
    int opCnt;  /* signals to wait for */
    int peer;   /* from this rank */
    int sigIdx; /* on this signal index */
    int ctx;    /* in this context */
} ncclWaitSignalDesc_t;
ncclResult_t ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm, cudaStream_t stream);

/* Host entry points of NCCL's device API (nccl_device/core.h there). The structures stay
 * incomplete here: Chorus has no device communicator, and a caller only passes pointers. */
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclDevComm ncclDevComm_t;
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm);
ncclResult_t pncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm);
ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr);
ncclResult_t pncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void **outPtr);
ncclResult_t pncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void **outPtr);

/* An op that multiplies each input by *scalar, then sums. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);

/* Release an op from ncclRedOpCreatePreMulSum. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* Reduce count elements from every rank into recvbuff on root. */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);

/* In-place broadcast (older form of ncclBroadcast). */
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* Copy count elements from root's sendbuff to every rank's recvbuff. */
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* Reduce count elements across ranks; every rank gets the result. */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/* Reduce nranks*recvcount elements; rank i gets block i. */
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/* Concatenate every rank's sendcount elements, in rank order, on every rank. */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Block j of sendbuff goes to rank j; block i of recvbuff comes from rank i (count elements each). */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Root receives count elements from every rank, in rank order. */
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* Root sends block i of sendbuff to rank i. */
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* Send to peer; matched by a ncclRecv on peer. */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);

/* Receive from peer. */
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);

/* Start a group: calls until ncclGroupEnd are queued and run together. Groups nest. */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

/* End a group and run what it queued; returns the group's first error. */
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/* Like ncclGroupEnd, but only estimates the time and runs nothing. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
