/*
 * cuda_devpath_net.h: the collective kernel between hosts (private to cuda_devpath*.c).
 *
 * Ranks on several hosts run device-buffer ops as the collective kernel on the user's stream,
 * as ranks of one host do. A connection to a rank of another host has its slots and counters in
 * host memory of each end's own process, pinned and mapped for its device: a sender's kernel
 * writes each step into its local slots, notes the step's size (ch_conn_t.sizes) and publishes
 * it; a proxy thread per rank forwards published steps, op headers, the receiver's releases
 * (credits), its header acknowledgements and errors over the communicator's transports
 * (chorus_conn_t: TCP or verbs between hosts), and the receiving proxy writes them into the
 * receiver's local slots and counters, where its kernel polls them. A rank's send to itself stays
 * local. Ranks of one host whose GPUs reach each other connect through device memory instead (the
 * receiver's slots and counters in its device block, mapped by the sender, as between processes
 * of one host; CHORUS_DEVICE_NET_DIRECT=0 sends them through the proxies and shared memory too).
 * The proxy reads no schedule: what to forward comes from the counters and size words the kernel
 * writes, so launches captured into CUDA graphs and replayed are forwarded alike.
 *
 * Sizes: the receiver's slot for step s is free once its kernel released step s - nslots, and the
 * sender's kernel publishes step s only after the forwarded release of that step came back, so a
 * receiving proxy writes what arrives at once, with no buffer of its own.
 *
 * Errors: each rank has its own error word. A rank whose word becomes set (its kernel found a
 * mismatched header, a timeout, a dead peer, an abort while its blocks ran) sends it to every
 * peer, whose proxy sets theirs, so every rank's waits end. The proxy is also the watchdog: a peer
 * whose transport failed (or, on this host, whose process ended) without having said goodbye,
 * while one of this rank's running blocks waits for it and nothing moved for DPN_DEAD_GRACE_MS,
 * sets CH_ERR_PEER naming it (the one lost first, when several are); running blocks with nothing
 * moving (block starts and ends, bytes forwarded either way) for CHORUS_TIMEOUT set
 * CH_ERR_TIMEOUT.
 *
 * Teardown: a proxy forwards what its kernel published, says goodbye, and closes a pair's
 * transports once the peer consumed everything and said its own goodbye (DPN_CLOSE_MS at most).
 */
#ifndef CHORUS_CUDA_DEVPATH_NET_H_
#define CHORUS_CUDA_DEVPATH_NET_H_

#include <stddef.h>
#include <stdint.h>

#include "device/ch_proto.h"
#include "device/ch_rt.h"
#include "nccl.h"

struct ncclComm;
typedef struct dp_net dp_net_t;

/* Collective over comm's ranks: all get NULL if any rank failed or passed local_ok 0. nch
 * channels (every pair connected on the first p2p_nch, else each rank to its ring successor) of
 * nslots slots of slot_bytes, LL slots of ll_bytes. */
dp_net_t *dp_net_setup(struct ncclComm *comm, const ch_rt_t *rt, int local_ok, int nch, int p2p_nch,
                       int nslots, size_t slot_bytes, size_t ll_bytes);
/* Forwards what this rank's kernel published, says goodbye to the peers, closes the
 * connections (the caller drained the launched work first), frees the memory. dp_net_stop does
 * all but the last: after work that did not finish, the memory must stay (a kernel may still
 * write it), but the proxy and the transports, which use the communicator, must go before it. */
void dp_net_free(dp_net_t *net);
void dp_net_stop(dp_net_t *net);
/* The error word, as the host and the device address it. */
uint32_t *dp_net_err(const dp_net_t *net, uint32_t **dev);
/* The rank found dead (the error word is then CH_ERR_PEER), or -1. */
int dp_net_dead_peer(const dp_net_t *net);
/* What a launch of this rank takes (as dp_ce_kernel_args). */
void dp_net_kernel_args(const dp_net_t *net, const ch_conn_t **conns, const int **ring,
                        uint64_t **op_seq, uint64_t **blocks, uint64_t **blocks_seq);
/* ncclCommAbort: call before the error word is set. The proxy tells the peers only when this
 * rank's blocks were running (their work may wait for them); else a peer waiting for this rank
 * finds it gone once its transports close. */
void dp_net_abort(dp_net_t *net);
/* A launch was queued: the proxy polls without sleeping for a while. */
void dp_net_kick(dp_net_t *net);
/* The ring edges of channel 0 between hosts; the peers connected through device memory
 * (tests). */
int dp_net_host_crossings(const dp_net_t *net);
int dp_net_direct_peers(const dp_net_t *net);

#endif
