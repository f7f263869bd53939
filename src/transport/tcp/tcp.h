/*
 * tcp.h: private header of the TCP transport (tcp_transport_ops).
 *
 * A TCP connection is one-way. The receiver listens on an ephemeral port of its net_addr and puts
 * the address and a random connection id in its setup blob; the sender opens nsocks sockets to it.
 * On each, the receiver sends a challenge (a fresh nonce); the sender answers with a handshake
 * (its rank, the connection id, the socket index, its own nonce and a proof over all of them keyed
 * with the communicator's secret, auth.h); the receiver checks the proof before anything else and
 * acknowledges with its own proof, which the sender checks before it sends data. The secret
 * never crosses the wire; wrong handshakes are closed.
 *
 * Data path. Both ends keep nslots slots of slot_bytes (+ TCP_SLOT_ROOM) in local memory. The sender commits step s
 * into slot s % nslots; its chunk is cut into up to nsocks pieces (each >= SOCKET_MIN_SPLIT) that
 * go, each behind a small header (step, total, offset, len), on sockets (s + j) % nsocks. A socket
 * is driven by one thread at a time, whoever holds its try-lock: the caller inside the data-path
 * calls (a commit writes its pieces at once, a peek that finds nothing reads) or the socket's
 * helper thread, which carries what the kernel could not take at once and keeps data moving while
 * the caller is elsewhere; it naps while the caller polls the connection, so the two do not fight
 * over the socket and the CPU. The helpers are the process's, shared by all its connections
 * (tcp_progress.c): one per connection up to SOCKET_HELPERS, started when first needed; their
 * number does not grow with the peers. (Measured on 2 cores: helpers
 * that did all the I/O, with the caller only polling memory, reached about half of a plain TCP
 * stream; inline I/O reaches about all of it.) With SOCKET_NTHREADS=0 there are no helpers and data moves only inside the caller's calls.
 * A receiving end may run without helpers (SOCKET_RECV_NTHREADS=0): its caller reads when it
 * polls, and the kernel's receive buffer holds what arrives meanwhile (the default; measured in
 * tcp_setup.c). A receiving end with helpers has them running from connect to close (a receiver
 * has no commit to start them on); one without is on the process's list of such ends (below).
 * The receiver reads a header, waits until
 * slot step % nslots is released by the consumer (leaving the bytes in the kernel, so TCP flow
 * control holds the sender back), reads the payload straight into the slot and, when the last piece
 * of a step lands, publishes the step. The sender reuses a slot only once every piece of its
 * previous step was handed to the kernel.
 *
 * Direct chunks (TRANSPORT_CAP_DIRECT, from SOCKET_DIRECT_THRESHOLD bytes, only with helper
 * threads): send_commit_direct sends one piece straight from the user's buffer; the receiver
 * publishes the step when its header arrives (recv_peek gives data_p NULL) and leaves the payload
 * in the kernel until recv_copy reads it straight into the destination. One copy per side
 * instead of two. Files:
 *   tcp_socket.c   socket helpers: options, listen, connect, exact reads/writes with a deadline
 *   tcp_setup.c    can_connect, setup, connect (handshake, accept loop), close
 *   tcp_conn.c     the data-path ops (acquire/commit/drained, peek/release, progress), ops table
 *
 * Sharing (tcp_share.c). A connection of one socket to a peer that already has a connection of
 * one socket in the other direction (same communicator) takes that socket instead of opening one:
 * each direction carries one connection's chunks, so an all-to-all holds one socket per peer.
 *
 * Consumption. send_drained is done once the kernel has taken every piece; that is not yet
 * delivered. At finalize the collective engine asks (send_consumed): the sender writes one SYNC
 * header carrying its head S on socket 0, and the receiver's transport answers on the same socket,
 * in the other direction (behind a TCP_HDR_ACK header, between two pieces of the connection that
 * shares the socket, if one does), with the word the engine left on the receiving connection
 * (how many chunks that rank sent back the other way, 0 while it is not finalizing). It answers
 * once every step before S has been delivered to its slots, whether or not its application took
 * them: a helper thread reads and answers while the application is elsewhere (finalizing another
 * communicator that waits for this rank, say). That answer is final when the consumer had
 * released every step or the receiver is finalizing (word set). Otherwise a second, final answer
 * follows when either happens, and the sender waits for it at most TCP_FIN_GRACE_NS: long enough
 * for a peer that finalizes at about the same time to say how many chunks it sent (so that a
 * message it sent that no receive took is reported here, not lost), never as long as a peer whose
 * application is busy elsewhere would take. A receiving end without helpers
 * (SOCKET_RECV_NTHREADS=0, the default) is read by its application's calls, and also by any
 * thread of its process that waits in send_consumed (tcp_rx_idle): a rank finalizing one
 * communicator answers the SYNCs of its others. Otherwise (its application is busy outside
 * Chorus), or when more than nslots chunks wait unconsumed, the first answer comes only once
 * the receiver's application reads.
 *   tcp_worker.c   per-socket send/receive state machines, the list of ends without helpers
 *   tcp_progress.c the process's helper threads, serving every connection's sockets
 *   tcp_share.c    one socket for two connections between the same ranks, one each way
 */
#ifndef CHORUS_TRANSPORT_TCP_H_
#define CHORUS_TRANSPORT_TCP_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "bootstrap.h"
#include "nccl.h"
#include "transport.h"

#define TCP_MAX_SOCKS 64
#define TCP_MAX_THREADS 16
#define TCP_STAGE_BYTES 4096 /* receive staging for headers and small payloads, per socket */
#define TCP_PIECE_ALIGN 4096 /* piece boundaries inside a chunk */
/* Room past slot_bytes in every slot: a chunk may carry a full power-of-two payload of slot_bytes
 * plus the collectives' op header (conn->chunk_room), so a 1 MiB all-reduce of 2 ranks
 * is one loop of 512 KiB blocks instead of a full loop and a 128-byte one (one more round of
 * message latencies). 4096 keeps every slot page-aligned. */
#define TCP_SLOT_ROOM 4096
/* A helper leaves its sockets to the caller while the caller polled them this recently, and
 * naps this long before it looks again. */
#define TCP_CALLER_ACTIVE_NS 50000
#define TCP_HELPER_NAP_NS 100000
#ifndef TCP_CALLER_BACKOFF_MAX
#define TCP_CALLER_BACKOFF_MAX 64
#endif

#define TCP_BLOB_MAGIC 0x54435042u                /* "TCPB" */
#define TCP_HANDSHAKE_MAGIC 0x43484f5255535443ull /* "CHORUSTC" */
/* 2: the challenge-response; 3: its 256-bit key, two answers to SYNC; 4: the answers framed
 * behind a header (TCP_HDR_ACK), so that they can share a socket with chunks going the same way */
#define TCP_WIRE_VERSION 4u
#define TCP_AUTH_LABEL "chorus-tcp-v3"
#define TCP_ACK_MAGIC 0x4143484f52555321ull
#define TCP_HDR_DATA 0x44415441u   /* "DATA" */
#define TCP_HDR_CLOSE 0x434c4f53u  /* "CLOS": the sender closes cleanly */
#define TCP_HDR_DIRECT 0x44495243u /* "DIRC": a direct chunk, read into the user buffer */
#define TCP_HDR_SYNC 0x53594e43u   /* "SYNC": answer once every step before this one is released */
#define TCP_ACK_CONSUMED 0x41434b43u /* "ACKC": the receiver's answer to a SYNC */
#define TCP_HDR_ACK 0x41434b48u /* "ACKH": a tcp_consumed_t follows (len bytes) */
#define TCP_SHARE_MAX 4         /* sharing candidates offered in a setup blob */

/* What the receiver's setup() publishes. */
typedef struct {
    uint32_t magic;
    uint32_t is_send;
    chorus_sockaddr_t addr; /* receiver: where to connect */
    uint64_t conn_id;       /* receiver: must come back in every handshake */
    uint32_t nsocks;        /* sender: how many sockets it will open */
    uint32_t nslots;
    uint64_t slot_bytes;
    int32_t rank;
    /* Sockets this end could share with the new connection (tcp_share.c): the ids of its
     * connections of the other direction with the same peer that carry nothing the other way
     * yet. Both ends pick the smallest id they both offer. */
    uint32_t nshare;
    uint64_t share_ids[TCP_SHARE_MAX];
} tcp_blob_t;

/* First bytes the receiver writes on every socket it accepts. */
typedef struct {
    uint64_t magic;   /* TCP_HANDSHAKE_MAGIC */
    uint32_t version; /* TCP_WIRE_VERSION */
    uint32_t pad;
    uint8_t nonce[CHORUS_NONCE_BYTES];
} tcp_challenge_t;

/* The sender's answer: its claims, its nonce and its proof over both. */
typedef struct {
    uint64_t magic;   /* TCP_HANDSHAKE_MAGIC */
    uint32_t version; /* TCP_WIRE_VERSION */
    int32_t rank;
    uint64_t conn_id;
    uint32_t index;
    uint32_t nsocks;
    uint8_t nonce[CHORUS_NONCE_BYTES];
    uint8_t proof[CHORUS_PROOF_BYTES]; /* over every byte before it */
} tcp_handshake_t;
#define TCP_HANDSHAKE_CLAIMS (offsetof(tcp_handshake_t, proof))

/* The receiver's acknowledgement: its proof over the sender's handshake. */
typedef struct {
    uint64_t magic; /* TCP_ACK_MAGIC */
    uint8_t proof[CHORUS_PROOF_BYTES];
} tcp_ack_t;

/* Decoding what the peer sent at setup (pure; tcp_setup.c, fuzzed in tests/fuzz). A blob from the
 * other end of the connection: 0, or -1 with the reason in why. A handshake on an accepted
 * socket that was sent the challenge nonce: NULL when its proof is right (checked first) and it
 * is the expected one, else why it is refused (the caller still refuses a socket index that is
 * already taken). */
int tcp_blob_problem(const tcp_blob_t *b, int is_send, int peer, size_t slot_bytes, char *why,
                     size_t len);
const char *tcp_handshake_problem(const tcp_handshake_t *h, const chorus_key_t *secret,
                                  const uint8_t nonce[CHORUS_NONCE_BYTES], uint64_t conn_id,
                                  int peer, int nsocks);
/* The handshake's pieces, shared by both ends and the tests: a fresh challenge (-1: no
 * randomness); the sender's nonce and proof on a handshake whose claims are set (-1: no
 * randomness); the receiver's acknowledgement; 1 when an acknowledgement is right. */
int tcp_challenge_make(tcp_challenge_t *c);
int tcp_handshake_sign(tcp_handshake_t *h, const chorus_key_t *secret, const tcp_challenge_t *c);
void tcp_ack_make(const tcp_handshake_t *h, const chorus_key_t *secret,
                  const uint8_t nonce[CHORUS_NONCE_BYTES], tcp_ack_t *a);
int tcp_ack_ok(const tcp_ack_t *a, const tcp_handshake_t *h, const chorus_key_t *secret,
               const uint8_t nonce[CHORUS_NONCE_BYTES]);

/* Header in front of every piece. */
typedef struct {
    uint64_t step;
    uint32_t total;  /* bytes of the whole chunk */
    uint32_t offset; /* of this piece inside the chunk */
    uint32_t len;
    uint32_t kind; /* TCP_HDR_DATA, TCP_HDR_DIRECT or TCP_HDR_CLOSE */
} tcp_hdr_t;

/* The receiver's answer to a SYNC header (step S), written back on socket 0 once every step
 * before S was delivered: the one message that flows from receiver to sender (at most two of them:
 * a first one without TCP_ACK_FINAL, then the final one). */
#define TCP_ACK_FINAL 1u /* released >= S, or the receiver is finalizing (word != 0) */
/* How long a sender whose chunks were delivered but not consumed waits for the final answer. */
#define TCP_FIN_GRACE_NS 3000000000ull
typedef struct {
    uint32_t magic; /* TCP_ACK_CONSUMED */
    uint32_t flags; /* TCP_ACK_FINAL */
    uint64_t released; /* steps the consumer has released */
    uint64_t word;     /* the receiving chorus_conn_t's fin_word */
} tcp_consumed_t;

/* An answer as it travels: behind a header of kind TCP_HDR_ACK (len: sizeof(tcp_consumed_t)). */
typedef struct {
    tcp_hdr_t hdr;
    tcp_consumed_t a;
} tcp_ack_frame_t;

/* A socket shared by two connections between the same two ranks, one each way (tcp_share.c).
 * TCP is full duplex: each direction carries one connection's chunks, with its own flow
 * control, exactly as on a socket of its own. What else would go the other way, the answers to
 * the SYNC of the connection that sends here, travels framed (TCP_HDR_ACK): the receiving
 * connection queues its answers in `out`, and they go onto the socket between two pieces of the
 * sending connection (never inside one); the receiving connection's pass hands the answers it
 * reads to the sending connection (in[], nin). Locks, in this order: a socket's try-lock, then
 * out_mu (tx, out); ptr_mu (rx) is taken before any of them. */
#define TCP_SHARE_ACKS 2 /* a SYNC gets at most two answers */
typedef struct tcp_share {
    struct tcp_share *next; /* the process's list (tcp_share.c) */
    const void *owner;      /* the transport context of both connections */
    int peer;
    uint64_t id;            /* the first connection's id */
    int fd;
    int refs;               /* connections on it (list lock) */
    int closing;            /* one of them closed: no new partner */
    pthread_mutex_t out_mu, ptr_mu;
    struct tcp_conn *tx;    /* the connection sending on it (out_mu) */
    struct tcp_conn *rx;    /* the connection receiving on it (ptr_mu) */
    int out_pending;        /* out_done < out_len; read without out_mu as a hint */
    size_t out_len, out_done;
    char out[TCP_SHARE_ACKS * sizeof(tcp_ack_frame_t)];
    tcp_consumed_t in[TCP_SHARE_ACKS];
    int nin;       /* answers read for tx (released after in[] is written) */
    int had_rx;    /* a receiving connection used it: it reads tx's answers (ptr_mu) */
    int peer_gone; /* the peer closed the socket (EOF after its CLOSE, or a failure) */
} tcp_share_t;

/* Receive states. RX_DIRECT: a direct chunk's header was read and published; its payload waits in
 * the kernel for the caller's recv_copy, which reads it straight into the user buffer. */
enum { TCP_RX_HDR = 0, TCP_RX_SLOT, TCP_RX_DATA, TCP_RX_DIRECT, TCP_RX_DONE };

/* Result bits of one pass of a socket state machine. */
enum {
    TCP_SOCK_DID = 1,     /* moved bytes or finished a piece */
    TCP_SOCK_BLOCKED = 2, /* the kernel is full (send) or empty (recv): poll the fd */
    TCP_SOCK_IDLE = 4,    /* waiting for the caller: a commit (send) or a free slot (recv) */
    TCP_SOCK_CLOSED = 8,  /* the peer closed cleanly (recv) */
    TCP_SOCK_FAIL = 16,   /* the connection failed; the error is recorded on the connection */
    TCP_SOCK_BUSY = 32,   /* another thread drives the socket right now */
};

typedef struct {
    int fd;
    int index;
    int lock; /* taken by whoever drives the socket: its helper thread or the caller */
    /* sender state */
    uint64_t cursor; /* next step this socket looks at */
    int busy;        /* a piece is being written */
    tcp_hdr_t hdr;
    size_t hdr_done, data_done;
    const char *data;
    /* receiver state */
    int rstate;
    tcp_hdr_t rhdr;
    size_t rdata_got;
    uint64_t rlast_step;
    int rclosed; /* shared socket: the sender's CLOSE came; only answers may follow */
    size_t stage_pos, stage_len;
    char stage[TCP_STAGE_BYTES];
} __attribute__((aligned(64))) tcp_sock_t;

typedef struct tcp_conn {
    chorus_conn_t *conn;
    const chorus_transport_ctx_t *ctx;
    int is_send;
    int rank, peer;
    int nslots;
    size_t slot_bytes;
    size_t slot_cap; /* bytes a chunk may hold: slot_bytes + TCP_SLOT_ROOM; also the stride */
    char *slots;
    size_t min_split;
    char peer_str[80]; /* "10.0.0.2:4711" */
    char ifname[16];

    /* setup */
    int listen_fd;
    uint64_t conn_id;
    chorus_sockaddr_t listen_addr;
    chorus_sockaddr_t peer_addr;
    int nsocks;
    tcp_sock_t *socks;

    /* sender: head is written by the caller and read by the threads; sent is the caller's */
    uint64_t head, sent;
    uint32_t *slot_size, *slot_npieces, *slot_done;
    const char **slot_src; /* user buffer of a direct chunk, NULL for a chunk in the slot */
    /* receiver: released is written by the caller; the rest by the threads */
    uint64_t released;
    uint64_t *slot_ready; /* step + 1 once the step is complete */
    uint64_t *slot_recvd; /* bytes landed for the step in the slot */
    uint32_t *slot_rsize;
    uint8_t *slot_direct; /* the step in the slot is a direct chunk ... */
    int *slot_dsock;      /* ... waiting on this socket */
    int closed_socks;
    /* Consumption check (send_consumed). Receiver: sync_want is S + 1 once a SYNC for step S was
     * read (helper or caller); sync_state tells which answers were written (TCP_SYNC_*); one
     * thread at a time evaluates and writes them (sync_lock), and a thread that finds the lock
     * taken sets sync_again so the holder looks once more. Sender: how much of its SYNC and of
     * the current answer have passed, and when a first, not final, answer came. */
    uint64_t sync_want;
    int sync_state, sync_lock, sync_again;
    size_t sync_sent, ack_got;
    uint64_t ack_first_ns;
    tcp_hdr_t sync_hdr;
    tcp_ack_frame_t ack;
    int acks_taken; /* shared socket: answers taken from share->in */
    /* Sharing (tcp_share.c): the socket's other user, if any, and the ids this end offered. */
    tcp_share_t *share;
    uint32_t nshare;
    uint64_t share_ids[TCP_SHARE_MAX];

    /* A receiving end without helpers is listed process-wide (rx_prev/rx_next, rx_listed), so
     * that a thread of this process waiting in send_consumed answers its SYNCs (tcp_rx_idle). */
    struct tcp_conn *rx_prev, *rx_next;
    int rx_listed;
    int rx_pid; /* the process whose list it is on (a fork's child starts with none) */

    int nthreads; /* helper lanes: socket i is served by lane i % nthreads ... */
    uint8_t lane_helper[TCP_MAX_THREADS]; /* ... and lane l by the process's helper this */
    int pooled;   /* registered with the helpers (tcp_progress.c) ... */
    uint32_t pool_gen; /* ... in this generation of them (a fork starts a new one) */
    int stop;     /* closing: failures are not news any more */

    uint64_t caller_ns;              /* when the caller last drove the sockets (waiting for them) */
    int caller_backoff, caller_skip; /* polls without inline I/O after fruitless ones */
    int fail_claimed;                /* the first failure takes it, WARNs, then sets error */
    int error;                       /* ncclResult_t, first failure wins */
    int warned;
} tcp_conn_t;

static inline char *tcp_slot_ptr(const tcp_conn_t *tc, int slot) {
    return tc->slots + (size_t)slot * tc->slot_cap;
}

/* tcp_socket.c */
const char *tcp_addr_str(const chorus_sockaddr_t *a, char *buf, int len);
socklen_t tcp_addr_len(const chorus_sockaddr_t *a);
ncclResult_t tcp_socket_tune(int fd);
ncclResult_t tcp_socket_listen(const chorus_sockaddr_t *local, int backlog, int *fd_p,
                               chorus_sockaddr_t *bound_p);
/* Connect within the deadline, retrying refused attempts; the socket is nonblocking. */
ncclResult_t tcp_socket_connect(const chorus_sockaddr_t *addr, uint64_t deadline_ns,
                                volatile int *abort_flag, int *fd_p);
/* Write/read exactly len bytes on a nonblocking socket, polling until the deadline. */
ncclResult_t tcp_socket_write_all(int fd, const void *buf, size_t len, uint64_t deadline_ns,
                                  volatile int *abort_flag);
ncclResult_t tcp_socket_read_all(int fd, void *buf, size_t len, uint64_t deadline_ns,
                                 volatile int *abort_flag);
uint64_t tcp_random_u64(void);
void tcp_ifname_of(const chorus_sockaddr_t *addr, char *buf, int len);

/* tcp_worker.c */
/* Pieces a chunk of `bytes` is cut into, and the size of each but the last. */
uint32_t tcp_split(const tcp_conn_t *tc, size_t bytes, size_t *piece_p);
int tcp_sock_send_pass(tcp_conn_t *tc, tcp_sock_t *s);
int tcp_sock_recv_pass(tcp_conn_t *tc, tcp_sock_t *s);
/* Receiver: write the answers to a SYNC that are due (every step before it delivered; released
 * or finalizing for the final one). Called whenever one of those may have changed. */
enum { TCP_SYNC_NONE = 0, TCP_SYNC_DELIVERED = 1, TCP_SYNC_FINAL = 2 };
void tcp_sync_answer(tcp_conn_t *tc);
/* Read a published direct chunk from its socket into dst (blocking, with the deadline). */
ncclResult_t tcp_recv_direct(tcp_conn_t *tc, int slot, void *dst, size_t bytes);
/* One pass over a socket if nobody else drives it (TCP_SOCK_BUSY otherwise). */
int tcp_sock_try(tcp_conn_t *tc, tcp_sock_t *s);
/* One pass over every socket in the caller's thread; returns the OR of the results. */
int tcp_drive_all(tcp_conn_t *tc);
/* Hand the connection to the process's helper threads / take it back (no pass touches it once
 * this returns). */
ncclResult_t tcp_threads_start(tcp_conn_t *tc);
void tcp_threads_stop(tcp_conn_t *tc);
/* The process-wide list of receiving ends without helper threads. Nobody reads such an end
 * while its application is elsewhere, so a SYNC from a finalizing peer would wait there for the
 * application: two ranks that finalize two communicators in opposite orders would each wait for
 * the other until the deadline. A thread waiting in send_consumed therefore runs one receive pass
 * over every listed end (tcp_rx_idle), as a helper would: the chunks land in their slots and
 * the SYNC is answered, whichever communicator (or thread rank) the end belongs to. Close takes
 * an end off the list before it frees anything; a pass runs under the list's lock. */
void tcp_rx_list_add(tcp_conn_t *tc);
void tcp_rx_list_remove(tcp_conn_t *tc);
void tcp_rx_idle(void);

/* tcp_progress.c: the process's helper threads, shared by every connection. */
ncclResult_t tcp_pool_add(tcp_conn_t *tc);
void tcp_pool_remove(tcp_conn_t *tc);
/* A commit the kernel could not take at once (lane: socket index % nthreads; starts the lane's
 * helper if it has not started yet), or a release. */
void tcp_pool_wake(tcp_conn_t *tc, int lane);
void tcp_pool_wake_all(tcp_conn_t *tc);
/* Helper threads running now (tests). */
int tcp_pool_threads(void);
/* Most helper threads the process runs for connections of nlanes lanes (SOCKET_HELPERS, at least
 * nlanes). */
int tcp_pool_max_helpers(int nlanes);
/* Record the first failure of a connection; WARNs once. */
void tcp_conn_fail(tcp_conn_t *tc, ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* tcp_setup.c: the control-path ops (the data-path ops live in tcp_conn.c). */
ncclResult_t tcp_can_connect(const chorus_transport_ctx_t *ctx, const chorus_locality_t *self,
                             const chorus_locality_t *peer, int *ok_p);
ncclResult_t tcp_setup(chorus_conn_t *conn, void *blob, size_t *blob_bytes_p);
ncclResult_t tcp_connect(chorus_conn_t *conn, const void *peer_blob, size_t peer_blob_bytes);
void tcp_close(chorus_conn_t *conn);

/* tcp_share.c */
/* Setup: the ids this end offers for a new connection to peer (none when sharing is off or the
 * connection will have more than one socket). */
void tcp_share_offer(tcp_conn_t *tc);
/* Connect: the id both ends offered (smallest), or 0. */
uint64_t tcp_share_pick(const tcp_conn_t *tc, const tcp_blob_t *peer_blob);
/* Connect: take the shared socket of id as socket 0 (tc->nsocks == 1, sockets allocated). */
ncclResult_t tcp_share_attach(tcp_conn_t *tc, uint64_t id);
/* After a connection of one socket came up on its own socket: offer it for sharing. */
void tcp_share_register(tcp_conn_t *tc);
/* Close: leave the socket (a sender writes its CLOSE first); the last one closes it. */
void tcp_share_leave(tcp_conn_t *tc);
/* The receiver's answer: queued for the socket's sender and written when no piece is half out. */
void tcp_share_queue_ack(tcp_conn_t *rx, const tcp_ack_frame_t *f);
/* Write what is queued. Called by the socket's sender with its socket lock held (s: its socket
 * 0): TCP_SOCK_BLOCKED when bytes are still left, 0 when all are out. */
int tcp_share_flush_locked(tcp_conn_t *tx, tcp_sock_t *s);
/* Try to write what is queued from any thread (takes the sender's socket lock if it is free). */
void tcp_share_flush_try(tcp_share_t *sh);
/* The sender's wait for an answer: one pass of the receiving partner (it reads the answers). */
void tcp_share_drive_rx(tcp_share_t *sh);
/* Sockets of this process shared by two connections now (tests). */
int tcp_share_count(void);

/* Test hook: shut one socket of a connection down as if the network had cut it. */
ncclResult_t tcp_test_shutdown_socket(chorus_conn_t *conn, int index);

extern const chorus_transport_ops_t tcp_transport_ops;

#endif
