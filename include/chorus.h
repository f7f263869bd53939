/*
 * chorus.h: Chorus extensions to the NCCL API.
 *
 * Native nonblocking collectives return a request at once; the op runs while the caller computes
 * (driven by the communicator's progress thread, or by chorusTest/chorusWait). They work for host
 * and device buffers. Ops on one communicator complete in the order they were issued, and every
 * rank must issue the same sequence, as with NCCL.
 *
 * A request is released by the call that reports it complete: chorusTest with *done = 1,
 * chorusWait, or chorusWaitAll. Using it afterwards is undefined.
 *
 * Inside ncclGroupStart/ncclGroupEnd the async calls are deferred like the NCCL calls: each one
 * checks its arguments and returns its request at once, but the op is issued (connected and
 * queued, in call order with the group's other ops) only at the outermost ncclGroupEnd, which
 * does not wait for it. Before that End, chorusTest reports *done = 0, and chorusWait or
 * chorusWaitAll called by the thread that holds the open group return ncclInvalidUsage without
 * releasing the request (the op could never start). An invalid call inside the group returns its
 * error and no request, and ncclGroupEnd returns that error too; if the group cannot be issued
 * (a connection setup fails), ncclGroupEnd returns the error and every request of the group
 * completes with it. A group ended by ncclGroupSimulateEnd runs nothing: its requests complete
 * with ncclInvalidUsage.
 */
#ifndef CHORUS_H_
#define CHORUS_H_

#include <stddef.h>
#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CHORUS_VERSION_MAJOR 0
#define CHORUS_VERSION_MINOR 1

typedef struct chorusRequest *chorusRequest_t;

/* Build a communicator from the launcher's environment: torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR, MASTER_PORT), Open MPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK, with the root
 * address from MASTER_ADDR/MASTER_PORT or NCCL_COMM_ID), Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID, same root address variables) and chorusrun (which sets the torchrun names).
 * Rank 0 hosts the bootstrap root at the given address. */
ncclResult_t chorusCommInitFromEnv(ncclComm_t *comm);

ncclResult_t chorusAllReduceAsync(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  chorusRequest_t *request);
ncclResult_t chorusReduceScatterAsync(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      chorusRequest_t *request);
ncclResult_t chorusAllGatherAsync(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm,
                                  chorusRequest_t *request);
ncclResult_t chorusBroadcastAsync(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  chorusRequest_t *request);
ncclResult_t chorusReduceAsync(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               chorusRequest_t *request);
ncclResult_t chorusAlltoAllAsync(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm,
                                 chorusRequest_t *request);
ncclResult_t chorusGatherAsync(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               chorusRequest_t *request);
ncclResult_t chorusScatterAsync(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                chorusRequest_t *request);
ncclResult_t chorusSendAsync(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, chorusRequest_t *request);
ncclResult_t chorusRecvAsync(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, chorusRequest_t *request);

/* *done = 1 when the op finished (the request is then released); returns the op's error. */
ncclResult_t chorusTest(chorusRequest_t request, int *done);
/* Block (driving progress) until the op finishes; releases the request; returns the op's error. */
ncclResult_t chorusWait(chorusRequest_t request);
/* Wait for all n requests; releases them all; returns the first error. */
ncclResult_t chorusWaitAll(int n, chorusRequest_t *requests);

#ifdef __cplusplus
}
#endif
#endif
