/*
 * fd_chan.h: passing file descriptors between the processes of one host (fd_chan.c).
 *
 * Each process of a communicator that needs it opens a channel: a Unix-domain datagram socket in
 * the abstract namespace, named by its pid and random bytes, with a random 16-byte key. The
 * address and key go to the peers through the bootstrap (which is authenticated), so only members
 * can address a message that the channel accepts: a datagram without the receiver's key is
 * dropped (its descriptor closed). A message carries one descriptor (SCM_RIGHTS), the sender's
 * rank, a tag and four words of the caller's.
 *
 * fd_chan_exchange sends and receives a set of messages at once, without blocking on either side:
 * a peer whose queue is full is retried while this side keeps receiving, so two ranks sending to
 * each other never deadlock. It ends by the deadline (CHORUS_TIMEOUT unless given), at an abort,
 * or when a peer it still needs has no socket any more (its process ended), with an error naming
 * that rank. A message that arrives before the exchange that wants it waits in the channel (a
 * bounded queue, which fd_chan_poll fills from another thread and fd_chan_drop_if prunes). The
 * calls are thread-safe.
 *
 * Abstract socket names belong to a network namespace: ranks of one host in different network
 * namespaces cannot reach each other, and the exchange reports the peer's socket as gone.
 */
#ifndef CHORUS_BOOTSTRAP_FD_CHAN_H_
#define CHORUS_BOOTSTRAP_FD_CHAN_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a channel listens (what the peers need, through the bootstrap): 64 bytes. */
typedef struct {
    char name[40]; /* the abstract name, without its leading NUL; "" for no channel */
    uint8_t key[16];
    int32_t pid; /* the owner's pid (messages) */
    int32_t rank;
} fd_chan_addr_t;

typedef struct fd_chan fd_chan_t;

/* One message: sent to, or received from, rank `peer`. */
typedef struct {
    int peer;
    uint32_t tag;
    uint64_t info[4];
    int fd; /* sent: the caller's (it stays open); received: a new descriptor the caller closes,
               -1 until it came */
} fd_chan_msg_t;

/* Open this rank's channel; *addr is what the peers need. */
ncclResult_t fd_chan_open(int rank, fd_chan_t **ch, fd_chan_addr_t *addr);
/* Close the socket; descriptors of messages never taken are closed. */
void fd_chan_close(fd_chan_t *ch);
/* Send out[0..nout) (each to addrs[out[i].peer]) and receive one message into each of in[0..nin)
 * (matched by peer and tag). timeout_s <= 0: CHORUS_TIMEOUT. Errors: ncclRemoteError when a peer
 * still needed has no socket (its process ended), ncclSystemError past the deadline, at an abort
 * (abort_flag, may be NULL) or when the socket fails; each names the rank. On an error the
 * descriptors received so far stay in `in` (fd >= 0) for the caller to close. */
ncclResult_t fd_chan_exchange(fd_chan_t *ch, const fd_chan_addr_t *addrs, int nranks,
                              const fd_chan_msg_t *out, int nout, fd_chan_msg_t *in, int nin,
                              double timeout_s, volatile int *abort_flag);

/* Take the datagrams waiting on the socket into the queue (a thread beside the exchanges keeps the
 * socket from filling, so that senders need not wait for this rank's next exchange). Returns at
 * once while an exchange runs. */
void fd_chan_poll(fd_chan_t *ch);
/* Close and forget the queued messages stale(arg, m) says no exchange will want. Returns at once
 * while an exchange runs. */
void fd_chan_drop_if(fd_chan_t *ch, int (*stale)(void *arg, const fd_chan_msg_t *m), void *arg);

#ifdef __cplusplus
}
#endif

#endif
