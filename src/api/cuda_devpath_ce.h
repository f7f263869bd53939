/*
 * cuda_devpath_ce.h: the device path between processes of one host (private to cuda_devpath*.c):
 * connections in device memory the processes share, run by copy-engine programs (processes
 * sharing a GPU) or by the collective kernel (CHORUS_DEVICE_PATH=kernel: a GPU each, or MPS).
 *
 * Each rank allocates the receiving ends of its connections, for every channel and every sender:
 * the SIMPLE slots in device memory other processes of the host can map (peer_mem.h: cuMem memory
 * whose file descriptor goes to each peer process over the descriptor channel, fd_chan.h, or a
 * legacy IPC block), the control blocks in host memory every rank maps and registers for the
 * device (ch_rt_t host_register); rank 0's host block starts with the communicator's error word.
 * The bootstrap allgather hands out the handles and channel addresses, and every rank maps every
 * peer's blocks, so each rank can address every connection.
 *
 * Copy-engine programs: an op becomes one program per channel (ch_ce_build over the schedule; the
 * next step of every connection is kept here, on the host, from op to op), queued on the user's
 * stream (ce_launch). Programs exchange no op header (stream operations cannot compare): each
 * rank publishes its collectives' headers in its host block at launch, and the watchdogs compare
 * them (dp_ce_launch). A stream wait cannot see the error word, so a watchdog thread per
 * communicator turns a peer process that ended (CH_ERR_PEER, naming it), no progress within
 * CHORUS_TIMEOUT (CH_ERR_TIMEOUT), a mismatched collective (CH_ERR_MISMATCH) and any error word
 * set elsewhere (abort, a failed launch) into released waits: it writes the awaited counters from
 * the host.
 *
 * The kernel: the control blocks and LL slots live in the receiver's device block too (its
 * blocks poll them there; the host never writes them), only the connections the kernel uses
 * exist, and each rank keeps the connection table, the ring and its op counters in its own
 * device memory, pointing into its own mappings of the peers' blocks. Launches are the kernel's,
 * with op headers (a mismatch is ncclInvalidUsage on every rank) and graph capture as between
 * threads. The watchdog watches the starts and ends this rank's blocks count in its host block
 * (replays of a captured launch too), and whom each last spun waiting for: a running block that
 * waits for a peer whose process is gone without having left the communicator, with no block
 * starting or ending for CE_DEAD_GRACE_MS, sets CH_ERR_PEER; running blocks with none starting or
 * ending for CHORUS_TIMEOUT, CH_ERR_TIMEOUT; the blocks see the error word in their waits.
 */
#ifndef CHORUS_CUDA_DEVPATH_CE_H_
#define CHORUS_CUDA_DEVPATH_CE_H_

#include "device/ch_plan.h"
#include "device/ch_rt.h"
#include "nccl.h"
#include "reduce.h"

struct ncclComm;
typedef struct dp_ce dp_ce_t;

/* Collective over comm's ranks (all of them call it, and all get NULL if any rank failed, or
 * passed local_ok 0: its runtime cannot run the programs). kernel: the connections are for the
 * collective kernel instead (dp_ce_kernel_args), with LL slots of ll_bytes and every pair
 * connected on the first p2p_nch channels only. */
dp_ce_t *dp_ce_setup(struct ncclComm *comm, const ch_rt_t *rt, int local_ok, int nch, int nslots,
                     size_t slot_bytes, int kernel, int p2p_nch, size_t ll_bytes);
void dp_ce_free(dp_ce_t *ce);
/* The error word (in rank 0's block, mapped here). */
uint32_t *dp_ce_err(const dp_ce_t *ce);
/* The rank a watchdog found dead (the error word is then CH_ERR_PEER), or -1. */
int dp_ce_dead_peer(const dp_ce_t *ce);
/* The ring table and slot size a plan over these connections uses. */
const int *dp_ce_ring(const dp_ce_t *ce);
size_t dp_ce_slot_bytes(const dp_ce_t *ce);
/* The collective kernel between processes (dp_ce_setup with kernel 1): what a launch of this rank
 * takes, all in memory its device reaches: the connection table [c][src][dst], the ring table,
 * the op counters [c], and the words [c][2] its blocks count their starts and ends in (the
 * watchdog's view of which blocks run, and whether they progress; their device copy in
 * blocks_seq). */
int dp_ce_kernel(const dp_ce_t *ce);
void dp_ce_kernel_args(const dp_ce_t *ce, const ch_conn_t **conns, const int **ring,
                       uint64_t **op_seq, uint64_t **blocks, uint64_t **blocks_seq);
/* Build plan's programs (one per channel) and queue them on stream; immediate: the call was made
 * outside a group (only such calls may run zero-copy, below). hdr: the op's header; a
 * collective's (numbered by hdr->seq from 0, in call order) is published in this rank's host
 * block, where the peers' watchdogs compare it with theirs: ranks that disagree about the k-th
 * collective set CH_ERR_MISMATCH (ncclInvalidUsage) within a watchdog round, as long as no rank
 * ran more than CE_NHDRS collectives ahead of a peer (else that op is not compared). */
ncclResult_t dp_ce_launch(dp_ce_t *ce, const ch_plan_t *plan, const void *sendbuff, void *recvbuff,
                          const chorus_redop_t *rop, const ch_op_hdr_t *hdr, void *stream,
                          int immediate);

/* Registered buffers, read zero-copy (cuda_devpath_zc.c). ncclCommRegister of device memory
 * records the range in this rank's registration table (in its host block, which every rank
 * maps): cuMem memory with its description, its file descriptor sent at once to every peer
 * process (whose watchdog takes it into its channel's queue); other device memory (cudaMalloc's)
 * with the legacy IPC handle of its allocation and the range's offset; memory with neither only
 * for the ranks of this process, which use it at its address. An all-gather, broadcast,
 * all-reduce, reduce-scatter or reduce called outside a group (not in place where the fold would
 * overwrite an input before reading it, nor an all-reduce in place on some ranks only:
 * cuda_devpath_zc.c) is announced to the peers with the registration its input lies in (a
 * non-root of a broadcast and a reduce's root read only); when every rank announced one, each
 * reads the peers' inputs directly (imported at first use, kept until the owner deregisters),
 * and the slots are not used. Deregistration waits for this rank's launched work first; peers
 * unmap a registration once its owner marked it gone, and the deregistration returns once they
 * have (the buffer may be freed then). */
ncclResult_t dp_ce_register(dp_ce_t *ce, void *buff, size_t size);
/* ncclInvalidArgument when [buff, buff + size) is not registered here. */
ncclResult_t dp_ce_deregister(dp_ce_t *ce, const void *buff, size_t size);
unsigned long dp_ce_zero_copy_ops(dp_ce_t *ce);

#endif
