/*
 * cuda_devpath_ce_priv.h: the state of the copy-engine programs between processes, shared by
 * cuda_devpath_ce.c (connections, setup, the watchdog, slot programs) and cuda_devpath_zc.c
 * (registered buffers read zero-copy). Not an interface outside those two files.
 */
#ifndef CHORUS_CUDA_DEVPATH_CE_PRIV_H_
#define CHORUS_CUDA_DEVPATH_CE_PRIV_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_devpath_ce.h"
#include "device/ch_proto.h"
#include "device/ch_rt.h"
#include "fd_chan.h"
#include "peer_mem.h"

#define CE_HDR_BYTES 4096        /* the host block's header: the error word, the dead peer's rank */
#define CE_RELEASED (1ull << 62) /* past every step a wait can ask for */
#define CE_DEAD_OFF 64           /* rank 0's header: the dead peer's word (rank + 1) */
#define CE_LEFT_OFF 72           /* this rank's header: 1 once it left the communicator cleanly */
#define CE_BLOCKS_OFF 128        /* kernel: [c][CH_BLK_WORDS] this rank's blocks (ch_kernel.h) */
#define CE_HDRS_OFF 1024         /* programs: this rank's collectives' op headers (ce_hdr_ent_t) */
#define CE_NHDRS 64              /* ... the last CE_NHDRS of them, entry seq % CE_NHDRS */
#define CE_MAX_CH ((CE_HDRS_OFF - CE_BLOCKS_OFF) / (CH_BLK_WORDS * 8))

/* One collective's op header as a rank published it: w as ch_hdr_store writes a header (w[3], the
 * seq, is the entry's own); tag = seq + 1 once w holds that op's header (0 while rewritten). */
typedef struct {
    uint64_t tag, w[4];
} ce_hdr_ent_t;

/* A peer's registration mapped here. */
typedef struct {
    uint64_t gen;
    peer_mem_map_t map;
} ce_zc_import_t;

struct dp_ce {
    const ch_rt_t *rt;
    int nranks, rank, nch, nslots;
    size_t slot_bytes, dev_bytes, host_bytes;
    /* The collective kernel runs over these connections (1), else copy-engine programs (0). The
     * kernel's control blocks and LL slots live in the receiver's device block too, and only the
     * connections it uses exist: every pair on the first p2p_nch channels, then each rank to
     * itself and to its ring successor. */
    int kernel, p2p_nch;
    uint32_t ll_words;
    size_t nused;          /* kernel: connections in each rank's device block */
    ch_conn_t *dev_conns;  /* kernel: conns, in device memory */
    int *dev_ring;         /* kernel: ring, in device memory */
    uint64_t *op_seq;      /* kernel: [c] this rank's collectives on channel c (device memory) */
    uint64_t *blocks_seq;  /* kernel: [c][2] its blocks' starts and ends (device memory) */
    uint64_t hdr_pub;      /* programs: collectives whose header this rank published (lock) */
    uint64_t *hdr_checked; /* programs: [rank] the next collective to compare with that rank's
                              (the watchdog's) */
    char *waits_for;       /* kernel: [rank] a running block last spun for it (the watchdog's) */
    void **dev;           /* [rank]: every rank's device block, mapped here (own included) */
    peer_mem_own_t own;   /* this rank's device block */
    peer_mem_map_t *maps; /* [rank]: the peers' device blocks as mapped here */
    fd_chan_t *chan;      /* descriptors of cuMem device blocks come over it */
    char **host;          /* [rank]: every rank's host block, mapped here */
    int *host_fd;         /* [rank]: the memfd (own) or this rank's open of a peer's */
    char *registered;     /* [rank]: host[rank] is registered with the runtime */
    int *pids;            /* [rank] (messages) */
    ch_conn_t *conns;     /* [c][src][dst] */
    int *ring;            /* [c][pos] */
    pthread_mutex_t lock; /* next_send/next_recv */
    uint64_t *next_send;  /* [c][peer]: steps built on conn(c, rank, peer) */
    uint64_t *next_recv;  /* [c][peer]: steps built on conn(c, peer, rank) */
    pthread_t watch;
    int watching;
    pthread_mutex_t stop_lock;
    pthread_cond_t stop_cond;
    int stop;
    /* Zero-copy ops (cuda_devpath_zc.c). */
    int cuda_dev;
    volatile int *abort_flag;
    size_t zc_off;           /* of the zero-copy area in every host block */
    fd_chan_addr_t *addrs;   /* [rank]: the descriptor channels */
    pthread_mutex_t zc_lock; /* what follows */
    uint64_t zc_seq;         /* eligible ops announced */
    uint64_t zc_launched;    /* the seq of the last op launched zero-copy */
    uint64_t reg_gen;        /* generations handed to registrations */
    /* [rank][slot]: peers' registrations mapped here, under zc_imp_lock (taken inside zc_lock
     * or alone: the watchdog closes imports while an op waits for peers under zc_lock). */
    ce_zc_import_t *imports;
    pthread_mutex_t zc_imp_lock;
    unsigned long zc_ops;    /* ops launched zero-copy */
    unsigned zc_rounds;      /* watchdog rounds (housekeeping every few) */
};

/* Zero-copy (cuda_devpath_zc.c): the bytes of the area each host block ends with; setup and
 * teardown of this rank's part; the watchdog's round (drain the descriptor channel, drop what
 * deregistrations made stale), its view of what this rank waits for from rank q (as
 * ce_owed_by), and its release of those waits. */
size_t ce_zc_area_bytes(void);
ncclResult_t ce_zc_init(dp_ce_t *ce);
void ce_zc_free(dp_ce_t *ce);
void ce_zc_watch(dp_ce_t *ce);
int ce_zc_owed_by(dp_ce_t *ce, int q, uint64_t *sum_p);
void ce_zc_release(dp_ce_t *ce);
/* The op zero-copy (*taken 1) when every rank can (see cuda_devpath_ce.h); else *taken 0 and the
 * caller builds the slot programs. An error leaves the communicator failed. */
ncclResult_t ce_zc_launch(dp_ce_t *ce, const ch_plan_t *p, const void *sendbuff, void *recvbuff,
                          const chorus_redop_t *rop, void *stream, int immediate, int *taken);
/* 0 when rank q's process has ended (cuda_devpath_ce.c). */
int ce_peer_alive(const dp_ce_t *ce, int q);

#endif
