/*
 * cuda_devpath.h: collectives on device buffers run as the collective kernel on the user's stream
 * (the device path of the NCCL entry points; cuda_enqueue.c calls in here first).
 *
 * At init a communicator whose ranks are all threads of this process on one device, and whose
 * CHORUS_DEVICE_PATH (with CHORUS_DEVICE_EMU) selects the kernel, sets up the kernel's world
 * once: rank 0 allocates through the device runtime (ch_rt.h) every connection (control block,
 * SIMPLE and LL slots) of every channel, the ring table and the error word, and the bootstrap
 * allgather hands the world to the other ranks (they share the address space). Each call on
 * device buffers then builds a plan and kernel arguments and launches on the user's stream: no
 * worker thread, no staging. The connections' counters persist across launches. Inside a group,
 * each communicator's collectives launch in call order, then its sends and receives, paired
 * into one send/receive launch per ring distance d (a send to rank + d with a receive from
 * rank - d), so every rank works through the distances in the same order.
 *
 * Ranks that are processes of one host run copy-engine programs, or the kernel itself
 * (CHORUS_DEVICE_PATH=kernel), over connections in device memory they share
 * (cuda_devpath_ce.h).
 *
 * Errors: the error word (shared by the ranks) turns into the call's result and the
 * communicator's async error (ch_error_result: a mismatched op is ncclInvalidUsage on every
 * rank); ncclCommAbort writes CH_ERR_ABORT into it, which releases a spinning launch; a watchdog
 * thread per world writes CH_ERR_TIMEOUT when running blocks count no start or end within
 * CHORUS_TIMEOUT (a rank that never launches its part); finalize and destroy wait for the launched
 * work
 * (CHORUS_TIMEOUT, then the error word is set to CH_ERR_TIMEOUT so the kernels return).
 */
#ifndef CHORUS_CUDA_DEVPATH_H_
#define CHORUS_CUDA_DEVPATH_H_

#include "coll_api.h"
#include "nccl.h"

struct ncclComm;

/* End of a successful init: choose the path and set up the kernel's world (collective: every
 * rank takes the same decision from the locality records and the parameters). */
void devpath_comm_init(struct ncclComm *comm);
/* A call: *handled_p = 1 when the device path took it (its result is the call's). */
ncclResult_t devpath_hook(const coll_args_t *a, int *handled_p);
/* The outermost ncclGroupEnd of this thread: launch the device ops kept since ncclGroupStart. */
ncclResult_t devpath_group_end(void);
void devpath_group_discard(void);
/* Wait until the work launched on comm has run (finalize, destroy). */
ncclResult_t devpath_drain(struct ncclComm *comm);
/* ncclCommAbort: release every launch of comm. */
void devpath_abort(struct ncclComm *comm);
/* The error word as comm's async error (ncclCommGetAsyncError). */
void devpath_poll_error(struct ncclComm *comm);
/* 1 when comm runs device-buffer ops on the device path (not staged; tests). */
int devpath_kernel_on(const struct ncclComm *comm);
/* How comm runs device-buffer ops: "kernel" (thread ranks), "kernel-procs" (the kernel between
 * processes), "kernel-hosts" (the kernel between hosts), "ce" (copy-engine programs) or "staged"
 * (tests, logs). */
const char *devpath_path_name(const struct ncclComm *comm);
/* Between hosts: the edges of the kernel's first ring between hosts, and the peers of this host
 * connected through device memory (-1 on other paths; tests). */
int devpath_net_host_crossings(const struct ncclComm *comm);
int devpath_net_direct_peers(const struct ncclComm *comm);
/* comm_free: drain, then drop this rank's share of the world. */
void devpath_comm_free(struct ncclComm *comm);
/* ncclCommRegister / ncclCommDeregister of device memory on a communicator whose ranks run
 * copy-engine programs: the range becomes readable zero-copy by the peers (cuda_devpath_ce.h);
 * nothing on other communicators. Deregistration first waits for this rank's launched work. */
ncclResult_t devpath_register(struct ncclComm *comm, void *buff, size_t size);
ncclResult_t devpath_deregister(struct ncclComm *comm, const void *buff, size_t size);
/* Ops this rank launched zero-copy (tests). */
unsigned long devpath_zero_copy_ops(struct ncclComm *comm);
/* Ops this rank launched as the kernel's direct mode (tests). */
unsigned long devpath_direct_ops(struct ncclComm *comm);

#endif
