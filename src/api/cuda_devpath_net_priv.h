/*
 * cuda_devpath_net_priv.h: the state of the kernel between hosts, shared by cuda_devpath_net.c
 * (setup, teardown) and cuda_devpath_net_proxy.c (the proxy thread). Not an interface outside
 * those two files.
 */
#ifndef CHORUS_CUDA_DEVPATH_NET_PRIV_H_
#define CHORUS_CUDA_DEVPATH_NET_PRIV_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_devpath_net.h"
#include "peer_mem.h"
#include "transport.h"

#define DPN_HDR_BYTES 4096 /* the mapped block's header: error word, blocks */
#define DPN_BLOCKS_OFF 128 /* [c][CH_BLK_WORDS] this rank's blocks (ch_kernel.h) */
#define DPN_MAX_CH ((DPN_HDR_BYTES - DPN_BLOCKS_OFF) / (CH_BLK_WORDS * 8))
/* A dead peer that a running block waits for fails the communicator once nothing moved for this
 * long (a peer that finished and left is no failure: its goodbye says so). */
#define DPN_DEAD_GRACE_MS 1000
#define DPN_WATCH_MS 20 /* watchdog rounds */

/* One end of a connection to or from a peer on this rank: the host's view of its slots and
 * counters (v), and what the proxy forwarded of it. */
typedef struct {
    ch_conn_t v;
    int c, peer, is_send;
    uint64_t next;     /* the next step to forward (send) or to arrive (receive) */
    size_t off;        /* the bytes of it forwarded (send) or arrived (receive) so far */
    uint64_t hdr_fwd;  /* send: headers forwarded; receive: header acknowledgements forwarded */
    uint64_t tail_fwd; /* receive: the release last forwarded */
} dpn_end_t;

/* What the proxy knows of a peer. */
typedef struct {
    chorus_conn_t tx, rx; /* transport connections to and from it */
    int same_host_pid;    /* its process id when it is another process of this host, else 0 */
    int bye_in;           /* it said goodbye (its failures after that are no error) */
    int bye_out;          /* this rank said goodbye to it */
    int drained;          /* ... and everything sent to it was consumed (teardown) */
    int err_out;          /* the error word was sent to it */
    int tx_lost, rx_lost; /* that transport end failed: nothing more goes there / comes from it */
    int gone;             /* its process ended (a peer of this host) */
    int64_t lost_at;      /* when the first of those was seen (ns; 0: not yet) */
    int nsend, nrecv;     /* ends: sends[0..nsend), recvs[0..nrecv) */
    dpn_end_t **sends, **recvs;
} dpn_peer_t;

struct dp_net {
    const ch_rt_t *rt;
    struct ncclComm *comm;
    int rank, nranks, nch, p2p_nch, nslots;
    size_t slot_bytes;
    uint32_t ll_words;
    /* One block of mapped host memory: the header (error word at 0, blocks at DPN_BLOCKS_OFF),
     * then the control block, size words, SIMPLE and LL slots of every end the proxy forwards
     * and of the rank's send to itself. */
    char *host;
    char *dev;
    size_t host_bytes;
    /* Ranks of one host whose kernels share device memory (CHORUS_DEVICE_NET_DIRECT): their
     * connections are the receiver's slots and counters in its device block, which the sender
     * maps, as between processes of one host; the proxy carries only errors and goodbyes for
     * them. direct[a * n + b]: a and b are so connected (the same on every rank). */
    uint8_t *direct;
    peer_mem_own_t own;   /* this rank's device block: its direct peers' connections into it */
    peer_mem_map_t *maps; /* [rank]: a direct peer's block as mapped here */
    int ndirect;          /* direct peers */
    ch_conn_t *conns;     /* [c][src][dst] the kernel's views (device addresses) */
    int *ring;            /* [c][pos] */
    ch_conn_t *dev_conns;
    int *dev_ring;
    uint64_t *op_seq, *blocks_seq; /* device memory: [c], [c][2] */
    dpn_end_t *ends;               /* this rank's ends to and from peers */
    int nends;
    dpn_end_t **by_send, **by_recv; /* [c][peer]: its end, or NULL */
    dpn_peer_t *peers;              /* [rank] */
    int dead_peer;                  /* rank + 1 (atomic) */
    uint64_t bytes_moved;           /* forwarded either way (the proxy's: watchdog progress) */
    /* The proxy thread. */
    pthread_t thread;
    int running;
    int stop;       /* leave at once (atomic) */
    int closing;    /* forward what was published, say goodbye, leave (atomic) */
    int kicked;     /* a launch was queued (atomic) */
    int user_abort; /* the error word's CH_ERR_ABORT is ncclCommAbort's (atomic) */
    /* The proxy's: it saw the error word set, and keeps it to itself (an abort of a rank with no
     * block running: a rank that finished and aborts as its way out fails nobody's work). */
    int err_seen, err_quiet;
    int sleeping; /* the proxy waits on cond (atomic) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
};

/* The proxy thread (cuda_devpath_net_proxy.c). */
void *dpn_proxy_main(void *arg);

/* Whether peer q failed this rank: a transport end or its process lost without its goodbye. */
static inline int dpn_peer_dead(const dpn_peer_t *p) {
    return (p->tx_lost || p->rx_lost || p->gone) && !p->bye_in;
}

static inline dpn_end_t **dpn_slot(const dp_net_t *net, dpn_end_t **tab, int c, int peer) {
    return &tab[(size_t)c * net->nranks + peer];
}

static inline uint32_t *dpn_err_host(const dp_net_t *net) {
    return (uint32_t *)net->host;
}

#endif
