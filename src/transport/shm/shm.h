/*
 * shm.h: private to the shared-memory transport.
 *
 * One connection = one POSIX shared-memory segment, created by the receiver (so its pages sit on
 * the receiver's NUMA node) and mapped by the sender. The segment starts with a control area and
 * then holds nslots data slots of slot_bytes each:
 *
 *   [shm_ctrl_t: tail | head | setup words | slot headers[nslots]] [slot 0] [slot 1] ...
 *
 * tail (written by the sender only) counts committed steps, head (written by the receiver only)
 * counts released steps; each lives on its own cache line so the two ends do not false-share.
 * Step s uses slot s % nslots: the sender may fill it while s - head < nslots; the receiver may
 * read it once the slot header's seq is s + 1 (low 16 bits; tail is then past s too: liveness
 * checks read it). Writers publish with release stores, readers load with acquire. Chunks of at
 * most SHM_INLINE_BYTES travel inside the slot header, so a small message costs the receiver one
 * cache line transfer instead of three (tail, header, data). When the reverse connection exists
 * in the same rank, each slot header also carries how far this rank has released the peer's
 * chunks, which the peer takes as credit instead of reading head (shm_pair.c).
 *
 * A "direct" chunk (single copy) leaves the data in the sender's buffer and publishes its address
 * in the slot header; the receiver copies it with process_vm_readv (CMA), or with memcpy when both
 * ranks are threads of one process.
 *
 * Cooperative single copy (shm_coop.c): a direct chunk of at least two blocks is cut into blocks
 * (CHORUS_SHM_CMA_BLOCK bytes) that both ends claim from one counter in the control area
 * (shm_coop_t).
 * The receiver publishes the request (its destination, the source, the sizes) and pulls blocks
 * with process_vm_readv; the sender, while it polls this connection for credits or for the drain,
 * pushes blocks with process_vm_writev. Every byte is still copied once, but two cores copy.
 *
 * Liveness: each end holds an open-file-description lock on one byte of the segment (receiver byte
 * 0, sender byte 1). The kernel drops it when the process dies, whatever pid namespace it is in,
 * and even while it is a zombie, so a failed F_OFD_GETLK probe means the peer is gone. A clean
 * close also raises a "closed" word in the control area.
 */
#ifndef CHORUS_SHM_H_
#define CHORUS_SHM_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"
#include "waiter.h"

#define SHM_CTRL_MAGIC 0x43484f52534d3032ull /* "CHORSM02" */
#define SHM_CACHE_LINE 64
#define SHM_NAME_LEN 64
/* Bounds a receiver's blob must respect (connect.c allows at most 1024 slots). */
#define SHM_MAX_SLOTS 1024
#define SHM_MAX_SLOT_BYTES (1ull << 32)
#define SHM_LOCK_RECV_BYTE 0
#define SHM_LOCK_SEND_BYTE 1

/* Values of shm_ctrl_t.cma_state, written by the receiver during connect. */
enum { SHM_CMA_UNDECIDED = 0, SHM_CMA_OFF = 1, SHM_CMA_ON = 2, SHM_CMA_SAME_PROCESS = 3 };

/* Slot header flags. */
enum { SHM_SLOT_DIRECT = 1, SHM_SLOT_INLINE = 2 };

/* Payload bytes a slot header carries itself (SHM_SLOT_INLINE): 48 in the line the receiver
 * polls (SHM_INLINE_LINE1), 64 in each of the two lines after it. */
#define SHM_INLINE_BYTES 176
#define SHM_INLINE_LINE1 48

/* Three cache lines per slot. The shm sender fills them and then stores seq = step + 1
 * (release); the receiver polls seq, so a chunk of at most SHM_INLINE_BYTES, which the sender
 * copies into data[], reaches the receiver in the line it polls and the two after it (a 128-byte
 * all-reduce with its 40-byte op header fits), not in a slot page of its own. Three lines rather
 * than two also measured faster for chunks that fit two (the 2-rank all-reduce of 16 to 64 bytes,
 * 0.42-0.44 -> 0.29 us on the project's guest in its slow state, 0.16-0.17 -> 0.14 us in its fast
 * state, where two lines of data padded to three measured the same: the layout, not the size). Larger chunks stay in the
 * slot's data area and direct chunks publish src and dbytes. (cuda_ipc uses bytes and src with the
 * tail counter.) */
typedef struct {
    /* The low 16 bits of step + 1, stored last: a slot's previous content is from step -
     * nslots, and nslots <= 1024 (connect.c), so 16 bits tell them apart. */
    _Alignas(SHM_CACHE_LINE) _Atomic uint16_t seq;
    uint16_t flags; /* SHM_SLOT_* */
    uint32_t bytes; /* chunk bytes, except for direct chunks (dbytes) */
    uint64_t ack;   /* paired senders (shm_pair.c): how many chunks of the reverse connection
                     * this rank has released when it published this one */
    union {
        struct {
            uint64_t src;    /* direct chunks: address in the sender's address space */
            uint64_t dbytes; /* direct chunks: bytes (may exceed the slot) */
        };
        unsigned char data[SHM_INLINE_BYTES];
    };
} shm_slot_hdr_t;
#ifndef __cplusplus
_Static_assert(sizeof(shm_slot_hdr_t) == 3 * SHM_CACHE_LINE, "a slot header is three cache lines");
#endif

/* Values of shm_coop_t.helper, written by the sender at connect. */
enum { SHM_COOP_OFF = 0, SHM_COOP_ON = 1 };

/* One cooperative copy request (at most one per connection: the receiver's recv_copy). claim packs
 * (generation << 32) | next block to claim; the request fields are written before the release
 * store that opens a generation and read only between an acquire load of claim and the CAS that
 * claims a block, so a successful CAS proves they belonged to that generation. helped counts the
 * blocks the sender finished in the current generation (the receiver waits for it); redo names a
 * block the sender claimed but could not write, (generation << 32) | (block + 1). */
typedef struct {
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t claim;
    _Atomic uint64_t src;   /* address in the sender's address space */
    _Atomic uint64_t dst;   /* address in the receiver's address space */
    _Atomic uint64_t bytes; /* of the whole chunk */
    _Atomic uint64_t block; /* bytes per block (the last one may be shorter) */
    _Atomic uint32_t nblocks;
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t helped;
    _Atomic uint64_t redo;
    _Atomic uint64_t probe_addr; /* receiver: a word the sender's process_vm_writev probe writes */
    _Atomic uint32_t helper;     /* SHM_COOP_*: whether the sender helps on this connection */
} shm_coop_t;

typedef struct {
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t tail; /* sender: steps committed */
    _Alignas(SHM_CACHE_LINE) _Atomic uint64_t head; /* receiver: steps released */
    _Alignas(SHM_CACHE_LINE) uint64_t magic;
    uint32_t nslots;
    uint32_t recv_pid;
    uint64_t slot_bytes;
    uint64_t data_offset;         /* from the start of the segment to slot 0 */
    _Atomic uint32_t send_mapped; /* the sender has mapped (and unlinked) the segment */
    _Atomic uint32_t cma_state;   /* SHM_CMA_*: the receiver's probe result */
    _Atomic uint32_t send_closed;
    _Atomic uint32_t recv_closed;
    uint32_t pair_id;           /* random (the name's), nonzero: names this connection in ack_for */
    _Atomic uint32_t ack_for;   /* set by a paired sender: the pair_id of the reverse connection
                                 * whose progress its chunks' ack carries (shm_pair.c) */
    shm_coop_t coop;
    /* Doorbells (shm_wait_arm): an end that sleeps sets its sleeping word; the other end, after
     * it publishes (tail or head), sees it, bumps the sleeper's bell and wakes it (futex). One
     * line that the data path only reads while nobody sleeps. [SHM_BELL_RECV]: the receiver's,
     * rung by commits; [SHM_BELL_SEND]: the sender's, rung by releases. */
    _Alignas(SHM_CACHE_LINE) _Atomic uint32_t bell[2];
    _Atomic uint32_t sleeping[2];
    shm_slot_hdr_t slots[]; /* nslots */
} shm_ctrl_t;

enum { SHM_BELL_RECV = 0, SHM_BELL_SEND = 1 };

/* After publishing: wake the other end if it sleeps (a load of a line nobody writes meanwhile). */
static inline void shm_ring(shm_ctrl_t *c, int which) {
    if (__builtin_expect(atomic_load_explicit(&c->sleeping[which], memory_order_relaxed) != 0, 0)) {
        atomic_fetch_add_explicit(&c->bell[which], 1, memory_order_release);
        chorus_futex_wake((uint32_t *)&c->bell[which]);
    }
}

/* Setup blobs (must fit TRANSPORT_BLOB_BYTES). */
typedef struct {
    uint32_t pid;
    uint32_t pad;
    uint64_t pid_ns;
    uint64_t probe_addr;  /* address of a word the receiver reads to test CMA */
    uint64_t probe_value; /* what it must find there */
} shm_send_blob_t;

typedef struct {
    char name[SHM_NAME_LEN];
    uint32_t pid;
    uint32_t nslots;
    uint64_t slot_bytes;
    uint64_t map_bytes;
} shm_recv_blob_t;

typedef struct {
    int is_send;
    int fd;
    int locked; /* we hold our liveness lock, so the peer's can be probed */
    shm_ctrl_t *ctrl;
    char *data; /* slot 0 */
    size_t map_bytes;
    char name[SHM_NAME_LEN];
    int name_linked; /* receiver: the name may still exist in /dev/shm */
    uint64_t charged; /* receiver: bytes of the segment counted in the ctx's shm_bytes */
    int peer_pid;
    int peer_pid_ok;  /* peer_pid is valid in our pid namespace (kill(pid, 0) means something) */
    int same_process; /* both ends are threads of one process */
    int cma;          /* SHM_CMA_* for this connection */
    uint64_t cached;  /* sender: last head seen (or ack taken as credit, shm_pair.c) */
    struct shm_pair *pair; /* the reverse connection's end in this rank, when paired */
    int acq_inline;   /* sender: send_acquire handed out the slot header's line (small chunk) */
    /* Liveness: not-ready polls since the last clock read, and when to probe the peer next. */
    uint32_t idle_polls;
    uint64_t next_check_ns;
    int failed;                   /* sticky: the peer died or closed; every later call fails */
    volatile uint64_t probe_word; /* sender: read by the receiver's CMA probe */
    /* Cooperative copy (shm_coop.c). Receiver: coop_block is 0 when it never opens requests.
     * Sender: coop says it helps. */
    int coop;
    size_t coop_block;
    uint32_t coop_gen;                 /* receiver: generation of the last request */
    uint32_t coop_nblocks;             /* receiver: blocks of the open request */
    uint32_t coop_own;                 /* receiver: blocks of it that it claimed itself */
    uint32_t coop_claimed;             /* receiver: blocks claimed by anyone once it stopped */
    int coop_open;                     /* receiver: a request is open (finish not yet done) */
    volatile uint64_t coop_probe_word; /* receiver: written by the sender's writev probe */
    volatile int coop_busy;            /* sender: inside a block copy (tests watch it) */
    uint64_t coop_helped_blocks;       /* sender: blocks copied for the receiver (statistics) */
    uint64_t coop_own_blocks;          /* receiver: blocks it copied in cooperative requests */
    /* Sender, out of credit (shm_pair_stats): credits taken from acks, loads of head. Only the
     * thread driving this end writes them (no atomic read-modify-write: ranks that are threads
     * of one process would share a contended line); shm_pair_stats reads them. */
    _Atomic uint64_t stat_ack_credits, stat_head_loads;
} shm_conn_t;

/* A send end and the receive end of the reverse connection in one rank (shm_pair.c). */
typedef struct shm_pair {
    _Atomic uint64_t released; /* receive end: chunks released (its head) */
    _Atomic uint64_t peer_ack; /* receive end -> send end: the largest ack seen from the peer */
    uint32_t send_id;          /* the send end's segment pair_id (what the peer's ack_for must
                                * say before its acks count) */
    int verified;              /* receive end: the peer's ack_for named send_id */
    int refs;                  /* ends still registered (under the registry lock) */
} shm_pair_t;

extern const chorus_transport_ops_t shm_transport_ops;

/* shm_conn.c */
ncclResult_t shm_can_connect(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                             const chorus_locality_t *peer, int *ok_p);
ncclResult_t shm_setup(chorus_conn_t *conn, void *blob, size_t *blob_bytes_p);
ncclResult_t shm_connect(chorus_conn_t *conn, const void *peer_blob, size_t peer_blob_bytes);
void shm_close(chorus_conn_t *conn);

/* shm_pair.c */
/* After connect: pair this end with the reverse connection's end, if there is exactly one. */
void shm_pair_register(chorus_conn_t *conn, shm_conn_t *sc);
/* Before close. */
void shm_pair_unregister(shm_conn_t *sc);
/* Sender (paired), out of credit: take the peer's acks as credit. */
void shm_pair_credit(chorus_conn_t *conn, shm_conn_t *sc);
/* Out-of-credit events of this process's shm senders, open and closed: credits taken from acks,
 * and loads of the receiver's head counter (tests; counted only on those rare paths). */
void shm_pair_stats(uint64_t *ack_credits_p, uint64_t *head_loads_p);
void shm_pair_count_head_load(shm_conn_t *sc);
/* Receiver (paired), on every committed chunk: pass its ack on to our send end, once the peer's
 * ack_for said its acks are about that send end. Inline: it runs per chunk. */
static inline void shm_pair_take_ack(shm_conn_t *sc, const shm_slot_hdr_t *h) {
    shm_pair_t *p = sc->pair;
    if (__builtin_expect(!p->verified, 0)) {
        if (atomic_load_explicit(&sc->ctrl->ack_for, memory_order_acquire) != p->send_id) return;
        p->verified = 1;
    }
    uint64_t a = h->ack;
    if (a > atomic_load_explicit(&p->peer_ack, memory_order_relaxed))
        atomic_store_explicit(&p->peer_ack, a, memory_order_release);
}

/* shm_wire.c: what a peer published, checked before use (pure). NULL when usable, else why not.
 * The control header is checked against the blob once the segment is mapped. */
const char *shm_recv_blob_problem(const shm_recv_blob_t *rb);
const char *shm_ctrl_problem(const shm_ctrl_t *ctrl, const shm_recv_blob_t *rb);
const char *shm_send_blob_problem(const shm_send_blob_t *sb);

/* shm_segment.c */
size_t shm_ctrl_bytes(int nslots);
ncclResult_t shm_segment_create(shm_conn_t *sc, int nslots, size_t slot_bytes, int numa_node);
ncclResult_t shm_segment_attach(shm_conn_t *sc, const shm_recv_blob_t *rb);
void shm_segment_unlink(shm_conn_t *sc);
void shm_segment_destroy(shm_conn_t *sc);
/* 1 when the peer still holds its lock on the segment (it is alive and has not closed). */
int shm_segment_peer_alive(shm_conn_t *sc);

/* shm_cma.c */
/* Decide single-copy for this connection from the sender's blob (receiver side). */
ncclResult_t shm_cma_probe(chorus_conn_t *conn, shm_conn_t *sc, const shm_send_blob_t *sb);
/* Copy `bytes` from the sender's address `src` into dst (receiver side). */
ncclResult_t shm_cma_read(chorus_conn_t *conn, shm_conn_t *sc, void *dst, uint64_t src,
                          size_t bytes);
/* Copy `bytes` from our src into the receiver's address `dst` (sender side, process_vm_writev or
 * a plain copy in one process). Returns 0, or the errno of the failure (nothing logged). */
int shm_cma_write(shm_conn_t *sc, uint64_t dst, const void *src, size_t bytes);

/* shm_coop.c */
/* Receiver, at connect: publish the probe word and read the block size (0: never cooperate). */
void shm_coop_recv_init(shm_conn_t *sc);
/* Sender, at connect (after cma_state is known): probe process_vm_writev into the receiver and
 * publish whether it will help. */
void shm_coop_send_init(chorus_conn_t *conn, shm_conn_t *sc);
/* Whether a direct chunk of `bytes` goes through shm_coop_read. */
static inline int shm_coop_wanted(const shm_conn_t *sc, size_t bytes) {
    return sc->coop_block && bytes >= 2 * sc->coop_block &&
           atomic_load_explicit(&sc->ctrl->coop.helper, memory_order_relaxed) == SHM_COOP_ON;
}
/* Receiver: the whole cooperative copy of one direct chunk (open, claim and copy, wait for the
 * sender's blocks). Returns only when no block of it is still being written. */
ncclResult_t shm_coop_read(chorus_conn_t *conn, shm_conn_t *sc, void *dst, uint64_t src,
                           size_t bytes);
/* The same in three parts, for tests that drive both ends from one thread. max_blocks bounds the
 * blocks shm_coop_work claims (UINT32_MAX: all that are left). */
void shm_coop_open(shm_conn_t *sc, void *dst, uint64_t src, size_t bytes);
ncclResult_t shm_coop_work(chorus_conn_t *conn, shm_conn_t *sc, uint32_t max_blocks);
ncclResult_t shm_coop_finish(chorus_conn_t *conn, shm_conn_t *sc);
/* Sender: claim and copy blocks of the receiver's open request, at most max_blocks. Cheap (one
 * load) when there is nothing to do. */
ncclResult_t shm_coop_help(chorus_conn_t *conn, shm_conn_t *sc, uint32_t max_blocks);

/* shm_progress.c */
/* Called when a poll found nothing to do: rarely checks that the peer is still there. */
ncclResult_t shm_idle_check(chorus_conn_t *conn, shm_conn_t *sc);
/* WARN naming the peer (rank, host, pid) and mark the connection failed. */
ncclResult_t shm_peer_failed(chorus_conn_t *conn, shm_conn_t *sc, const char *why);

#endif
