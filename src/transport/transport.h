/*
 * transport.h: the transport interface. A transport creates one-way connections and moves chunks.
 *
 * A connection (chorus_conn_t) goes from one rank to one peer. It has a ring of `nslots` chunk slots
 * of `slot_bytes` each, in memory the receiver can read (shared memory, device memory exported by
 * CUDA IPC, a registered receive buffer for TCP/verbs), and credits that say which slots are full.
 * Both ends count steps; step s uses slot s % nslots.
 *
 *   sender:   send_acquire(bytes) -> write the chunk into the slot -> send_commit(bytes)
 *             (or, with TRANSPORT_CAP_DIRECT, send_commit_direct(src, bytes): the receiver reads src
 *              itself, single copy; src must stay valid until send_drained reports done)
 *   receiver: recv_peek -> read the chunk (data_p, or recv_copy for a direct chunk) -> recv_release
 *
 * All data-path calls are nonblocking: they report ready=0 instead of waiting, so the progress
 * engine can drive many connections from one thread. Reaching a transport costs one indirect call;
 * no data-path op is NULL (optional ones point at the shared stubs in registry.c); the ops off
 * the data path that say "NULL:" below may be.
 *
 * Setup: each end calls setup(), which fills a blob (<= TRANSPORT_BLOB_BYTES) that the core sends to
 * the other end through the bootstrap; then each end calls connect() with the peer's blob. Both
 * blob pointers are aligned for any type (max_align_t), so a transport may use them as its struct.
 */
#ifndef CHORUS_TRANSPORT_H_
#define CHORUS_TRANSPORT_H_

#include <stddef.h>
#include <stdint.h>
#include "locality.h"
#include "nccl.h"

#define TRANSPORT_ABI_VERSION 3
#define TRANSPORT_BLOB_BYTES 256

enum {
    TRANSPORT_CAP_HOST_MEM = 1 << 0,   /* slots in host memory */
    TRANSPORT_CAP_DEVICE_MEM = 1 << 1, /* slots in device memory */
    TRANSPORT_CAP_DIRECT = 1 << 2,     /* send_commit_direct/recv_copy: single copy */
    TRANSPORT_CAP_PROXY = 1 << 3,      /* needs progress() calls (or its own threads) to move data */
    TRANSPORT_CAP_INTER_HOST = 1 << 4, /* can connect ranks on different hosts */
    /* Each chunk crosses a kernel socket (high latency per message), and connect() keeps
     * chunk_room for the op header past a power-of-two payload: the tuner's socket-ring
     * choices (tuner.c) apply to rings made only of such edges. */
    TRANSPORT_CAP_SOCKET_RING = 1 << 5,
    /* A direct chunk may be released without recv_copy (the data stays in the sender's buffer,
     * nothing queues behind it): a failing receiver drops it without touching that buffer,
     * which the sender's caller may already have freed once the sender's own drain timed out. */
    TRANSPORT_CAP_DROP_DIRECT = 1 << 6,
};

typedef struct chorus_conn chorus_conn_t;
struct bootstrap;

/* What a transport sees of the communicator that owns its connections: filled once by the
 * communicator after the locality allgather, before any transport is selected or connected, and
 * valid until the communicator's connections are closed. */
/* Slots of a point-to-point connection when CHORUS_P2P_NSLOTS is -1: NSLOTS below
 * TRANSPORT_P2P_MIN_RANKS ranks, TRANSPORT_P2P_NSLOTS from there (connect.c). */
#define TRANSPORT_P2P_MIN_RANKS 9
#define TRANSPORT_P2P_NSLOTS 2

typedef struct chorus_transport_ctx {
    int rank, nranks;
    int cuda_dev;                   /* this rank's GPU, -1 for a host-only communicator */
    const chorus_locality_t *peers; /* nranks locality records; peers[rank] is this rank's */
    volatile int *abort_flag;       /* every wait checks it */
    struct bootstrap *bs;           /* setup blobs and the secret of the job */
    /* The first connection setup that failed on this rank: which peer, over which transport,
     * why (filled by transport_connect; the first op's error quotes it). Empty while none
     * failed. fail_cause: the rank whose failure started it (meaningful once the text is set). */
    char fail_text[512];
    int fail_cause;
    /* Bytes of the shared-memory segments this rank created and holds (shm transport, against
     * CHORUS_SHM_MAX_BYTES). */
    uint64_t shm_bytes;
} chorus_transport_ctx_t;

/* A send connection's choice of plain or streaming stores for large chunks written into its
 * slots (slot_store.h, slot_store.c). Zeroed with the connection: plain, not measuring; the
 * transport's connect() calls slot_store_init, which sets ok when the slots are host memory
 * another core reads (shm). */
typedef struct {
    uint8_t ok;
    uint8_t mode;    /* SLOT_STORE_*: how large chunks are written now */
    uint8_t forced;  /* CHORUS_SHM_SLOT_STREAM was 0 or 1 when the connection was made */
    int8_t op_mode;  /* -1, or SLOT_STORE_*: the mode the op running on this connection chose
                      * (ring and one-shot ops, src/collectives/store_choice.c); no measuring
                      * then */
    uint32_t chunks;   /* large chunks written */
    uint32_t streamed; /* ... of which with streaming stores */
    uint32_t changes;
    uint32_t samples[2];
    uint64_t best[2]; /* per mode: fewest ticks per KiB in the current window of samples */
    uint64_t est[2];  /* per mode: the last full window's best (0: none yet) */
} slot_store_t;

typedef struct chorus_transport_ops {
    const char *name;
    int abi_version;
    uint32_t caps;
    /* Whether this transport can carry data from `self` to `peer` (and back). */
    ncclResult_t (*can_connect)(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                                const chorus_locality_t *peer, int *ok_p);
    ncclResult_t (*setup)(chorus_conn_t *conn, void *blob, size_t *blob_bytes_p);
    ncclResult_t (*connect)(chorus_conn_t *conn, const void *peer_blob, size_t peer_blob_bytes);
    /* Sender side. bytes: the most the caller will write into the slot and commit (at most
     * slot_bytes + chunk_room); a transport may hand out smaller room for a small chunk (shm
     * gives a chunk that fits its inline limit the slot header's line, so the chunk crosses to
     * the receiver in the one line it polls). A later send_commit_direct ignores the slot. */
    ncclResult_t (*send_acquire)(chorus_conn_t *conn, size_t bytes, void **slot_p, int *ready_p);
    ncclResult_t (*send_commit)(chorus_conn_t *conn, size_t bytes);
    ncclResult_t (*send_commit_direct)(chorus_conn_t *conn, const void *src, size_t bytes);
    ncclResult_t (*send_drained)(chorus_conn_t *conn, int *done_p); /* all commits consumed */
    /* Receiver side. data_p is NULL for a direct chunk: use recv_copy. */
    ncclResult_t (*recv_peek)(chorus_conn_t *conn, const void **data_p, size_t *bytes_p, int *ready_p);
    ncclResult_t (*recv_copy)(chorus_conn_t *conn, void *dst, size_t bytes);
    ncclResult_t (*recv_release)(chorus_conn_t *conn);
    /* Both sides. */
    ncclResult_t (*progress)(chorus_conn_t *conn);
    void (*close)(chorus_conn_t *conn);
    /* Optional, sender side, for transports whose send_drained only says that the data left
     * this rank (TCP: it is in the kernel). done once the receiver has released every chunk
     * committed so far, or has closed the connection, or (TCP) has every chunk delivered to its
     * slots and neither consumed them nor started its finalize within a short grace, so that
     * a receiver whose application is busy elsewhere is not waited for. *word_p: the receiver's
     * fin_word when it answered (0 when it closed, had not set one, or the grace ended). NULL:
     * send_drained already means that. */
    ncclResult_t (*send_consumed)(chorus_conn_t *conn, int *done_p, uint64_t *word_p);
    /* Optional, both sides: a thread that found nothing to do sleeps on this end. wait_arm
     * returns a 32-bit word shared with the peer and, in *seen_p, the value it holds now, and
     * asks the peer to change the word and wake its sleepers (chorus_futex_wake) at its next
     * commit (to a receive end) or release (to a send end). The caller arms every end it may
     * wait on, issues a sequentially consistent fence, looks for work once more, and sleeps
     * (chorus_futex_waitv) only if it found none; then wait_disarm. The peer's check of the
     * request is not fenced against its publish (that would cost every chunk a fence), so
     * rarely a wake is missed: the caller's sleep is always bounded. NULL: the end cannot
     * wake a sleeper (TCP ends are waited for by polling). */
    uint32_t *(*wait_arm)(chorus_conn_t *conn, uint32_t *seen_p);
    void (*wait_disarm)(chorus_conn_t *conn);
} chorus_transport_ops_t;

struct chorus_conn {
    const chorus_transport_ops_t *ops;
    void *priv; /* transport state */
    const chorus_transport_ctx_t *ctx;
    int peer;
    int is_send;
    int channel; /* channel id, or -1 for a point-to-point connection */
    int nslots;
    size_t slot_bytes;
    uint64_t step;  /* next step this end will acquire (send) or peek (recv) */
    int connected;
    char desc[32]; /* for logs: "SHM", "SHM/CMA", "TCP/eth0" */
    /* Set by connect(). direct: 1 when send_commit_direct works on this connection (single copy
     * between these two ranks); when 0 use send_commit. A direct chunk may be larger than
     * slot_bytes; it still takes one step (one send_acquire'd slot). direct_threshold: the chunk
     * size from which the direct path pays off (CHORUS_SHM_CMA_THRESHOLD for shm). */
    int direct;
    size_t direct_threshold;
    /* Set by connect(): bytes a committed chunk may carry beyond slot_bytes (0 for most
     * transports). TCP keeps room for the collectives' op header past a full power-of-two
     * payload, so the tuner can give TCP rings power-of-two chunks (tuner.c). */
    size_t chunk_room;
    slot_store_t store; /* sender: plain or streaming stores into the slots */
    /* Receiver: the word this end hands back to a sender that asks whether its chunks were
     * consumed (send_consumed). The collective engine stores there, once it finalizes, one more
     * than the number of chunks this rank committed towards that peer; 0 until then. Atomic. */
    uint64_t fin_word;
};

/* registry.c */
/* The transports' part of this rank's locality record (the verbs record; all zero without a
 * usable RDMA port), after topo_fill_locality and before the records are exchanged. */
void transport_fill_locality(chorus_locality_t *loc);
int transport_count(void);
const chorus_transport_ops_t *transport_get(int index);
const chorus_transport_ops_t *transport_find(const char *name);
/* First registry entry whose can_connect accepts (self, peer), honouring CHORUS_TRANSPORT,
 * NCCL_SHM_DISABLE, NCCL_P2P_DISABLE, NCCL_IB_DISABLE. */
ncclResult_t transport_select(const chorus_transport_ctx_t *ctx, int peer,
                              const chorus_transport_ops_t **ops_p);
/* Set up both ends of a connection through the bootstrap. Called by the two ranks at the same
 * time (one with is_send=1, the other is_send=0); tag separates concurrent setups between the
 * same two ranks (any int; bootstrap tags 0x20000000..0x3fffffff are derived from it, the
 * channel and the direction). conn is overwritten (it must not hold an open connection); geometry comes from
 * NCCL_BUFFSIZE / CHORUS_NSLOTS (the receiver's values win). A failure on either end fails both,
 * with a WARN naming the peer. A rank never connects to itself. */
ncclResult_t transport_connect(chorus_transport_ctx_t *ctx, chorus_conn_t *conn, int peer,
                               int is_send, int channel, int tag);
/* Close one end (a sender first waits for send_drained). Leaves ops == NULL; closing twice is
 * harmless. On failure transport_connect also leaves ops == NULL. */
void transport_close(chorus_conn_t *conn);
/* Remove the shared-memory segment names in /dev/shm whose creator (a process of our pid
 * namespace) no longer exists; returns how many. chorusrun calls it after its ranks exit. */
int shm_sweep_orphans(void);

/* Buffers the user registered with ncclCommRegister (host memory): a transport may map them for
 * transfers without a copy (the verbs transport's registration cache, ib/ib_mr.c). Registering
 * the same range again counts; deregister returns ncclInvalidUsage, with a WARN, while a transfer
 * in flight uses the range (it stays registered then). */
ncclResult_t transport_buffer_register(void *base, size_t size);
ncclResult_t transport_buffer_deregister(void *base, size_t size);

/* Shared stubs for optional ops. */
ncclResult_t transport_stub_commit_direct(chorus_conn_t *conn, const void *src, size_t bytes);
ncclResult_t transport_stub_recv_copy(chorus_conn_t *conn, void *dst, size_t bytes);
ncclResult_t transport_stub_progress(chorus_conn_t *conn);

#endif
