/*
 * bs_internal.h: private to src/bootstrap. Socket helpers with deadlines, the wire format of the
 * rendezvous and of peer messages, the root server and the bootstrap handle itself.
 *
 * Every blocking helper takes a bs_deadline_t: an absolute CLOCK_MONOTONIC deadline plus two abort
 * flags (the caller's, given to bootstrap_init, and the handle's own, set by bootstrap_abort).
 * Waits poll() in slices of at most BS_POLL_SLICE_MS so that an abort is seen quickly. The helpers
 * return a bs_io_status_t and log nothing; the caller knows which rank and address it talked to and
 * WARNs.
 */
#ifndef CHORUS_BS_INTERNAL_H_
#define CHORUS_BS_INTERNAL_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "bootstrap.h"

#define BS_POLL_SLICE_MS 50
/* How long the root (and a rank's receiver) waits for a fresh connection to present its hello. */
#define BS_HELLO_TIMEOUT_S 10.0
/* Connections that have not yet said who they are; beyond this the oldest silent one is dropped
 * for each new one (silent connections must not keep real ranks out). */
#define BS_MAX_PENDING 256
/* Connections the root has in flight at once while it sends each rank its rendezvous result. */
#define BS_FANOUT_WINDOW 64
/* Reserved tags: allgather and barrier rounds. User tags should stay above this range. */
#define BS_TAG_ALLGATHER (BOOTSTRAP_TAG_RESERVED_MIN + 0)
#define BS_TAG_BARRIER (BOOTSTRAP_TAG_RESERVED_MIN + 1) /* + round, up to 32 rounds */
/* The root's message to a rank (on the root slot) and the rendezvous' address all-gather. */
#define BS_TAG_ROOT (BOOTSTRAP_TAG_RESERVED_MIN + 40)
#define BS_TAG_ADDR_DOWN (BOOTSTRAP_TAG_RESERVED_MIN + 41)
#define BS_TAG_ADDR_UP (BOOTSTRAP_TAG_RESERVED_MIN + 42)
#define BS_TAG_SCATTER (BOOTSTRAP_TAG_RESERVED_MIN + 43)
/* The last header on a connection its sender closes while idle (bootstrap_release_peer): the
 * receiver drops the connection without taking the peer for gone. */
#define BS_TAG_BYE (BOOTSTRAP_TAG_RESERVED_MIN + 44)

typedef struct {
    uint64_t deadline_ns;
    volatile int *abort_ext; /* may be NULL */
    volatile int *abort_int; /* may be NULL */
} bs_deadline_t;

typedef enum {
    BS_IO_OK = 0,
    BS_IO_CLOSED = -1,  /* the peer closed the connection (EOF, reset) */
    BS_IO_TIMEOUT = -2, /* the deadline passed */
    BS_IO_ABORT = -3,   /* an abort flag was set */
    BS_IO_ERROR = -4,   /* another system error; errno_p tells which */
    BS_IO_REFUSED = -5, /* connect: nobody listens there */
    BS_IO_AUTH = -6,    /* the other side did not prove it knows the secret */
    BS_IO_AUTH_REFUSED = -7, /* the other side refused our proof (another secret) */
    BS_IO_VERSION = -8, /* the other side speaks another wire version (another Chorus version) */
} bs_io_status_t;

void bs_deadline_init(bs_deadline_t *d, double seconds, volatile int *abort_ext,
                      volatile int *abort_int);
/* BS_IO_OK, BS_IO_ABORT or BS_IO_TIMEOUT. */
int bs_deadline_check(const bs_deadline_t *d);
/* Milliseconds to the next check: min(slice, time left), at least 0. */
int bs_deadline_slice_ms(const bs_deadline_t *d);
/* Text for a status (uses err for BS_IO_ERROR); for log messages. */
const char *bs_io_strerror(int status, int err, char *buf, int len);
/* Map a failed status to the result the API returns: abort and closed -> ncclRemoteError,
 * timeout and errors -> ncclSystemError. */
ncclResult_t bs_io_result(int status);

/* The part of the rendezvous result rank r relays (bootstrap.c, a binomial scatter over the
 * root's range [lo, hi) from rank lo, which gets the root's part of the table): r owns ranks
 * [r, *hi_p) and gets their addresses, and those of r-1 and *hi_p, from *parent_p (-1: from the
 * root). A range [a, b) of more than one rank splits at mid = a + (b - a + 1) / 2: mid gets
 * [mid, b), a keeps [a, mid). */
void bs_scatter_place(int lo, int hi, int rank, int *parent_p, int *hi_p);
/* Several roots (ncclCommInitRankScalable): rank r reports to root floor(r * nroots / nranks),
 * so root j serves ranks [ceil(j * nranks / nroots), ceil((j + 1) * nranks / nroots)); nroots is
 * at most nranks. A root also hears from the rank just before and the rank just after its range
 * (their ring neighbours' addresses are in its part of the table). */
int bs_root_of(int nranks, int nroots, int rank);
void bs_root_range(int nranks, int nroots, int root, int *lo_p, int *hi_p);

/* The rendezvous deadline for nranks: CHORUS_TIMEOUT (base_s) plus one second per 1,000 ranks
 * (rounded up), so that the root's O(nranks) work and the ranks' log2(nranks) address rounds
 * never eat into the time given to late ranks. */
int bs_timeout_for(int base_s, int nranks);
/* Raise RLIMIT_NOFILE's soft limit to the hard limit, once per process (INFO line). */
void bs_raise_nofile(void);
/* WARN that `who` ran out of file descriptors (err EMFILE or ENFILE), naming the limit. */
void bs_warn_fd_limit(const char *who, int err);

/* ---- sockets (bs_socket.c) ---------------------------------------------------------------- */
socklen_t bs_sockaddr_len(const chorus_sockaddr_t *a);
int bs_sockaddr_port(const chorus_sockaddr_t *a);
void bs_sockaddr_set_port(chorus_sockaddr_t *a, int port);
int bs_sockaddr_is_loopback(const chorus_sockaddr_t *a);
/* Parse "host:port", "[v6]:port" or "v6addr" with port; hostnames are resolved. WARNs naming
 * `what` (the variable it came from) when malformed. */
ncclResult_t bs_parse_hostport(const char *text, const char *what, chorus_sockaddr_t *addr_p);
/* Same; *is_name_p (may be NULL) tells whether the host was a name rather than a numeric address.
 */
ncclResult_t bs_parse_hostport_ex(const char *text, const char *what, chorus_sockaddr_t *addr_p,
                                  int *is_name_p);
/* Hostnames are resolved by getaddrinfo in a helper thread, waited for until CHORUS_TIMEOUT (a
 * resolver that never answers gives ncclSystemError naming the host and the time waited). Tests
 * replace getaddrinfo with their own function here (NULL: getaddrinfo again). */
struct addrinfo;
typedef int (*bs_getaddrinfo_fn)(const char *node, const char *service,
                                 const struct addrinfo *hints, struct addrinfo **res);
void bs_test_set_resolver(bs_getaddrinfo_fn fn);
/* The local address the kernel would use to reach `remote` (UDP connect, no packet sent). */
int bs_local_addr_towards(const chorus_sockaddr_t *remote, chorus_sockaddr_t *local_p);
/* Nonblocking, close-on-exec listening socket bound to *addr (port 0: ephemeral). The bound
 * address comes back in *bound_p. Returns 0 or -1 with errno. */
int bs_listen(const chorus_sockaddr_t *addr, int reuseaddr, int *fd_p, chorus_sockaddr_t *bound_p);
/* Accept one connection (nonblocking, close-on-exec). -1 with errno EAGAIN when none waits. */
int bs_accept(int listen_fd, chorus_sockaddr_t *from_p);
/* Connect with a deadline. retry_refused: keep trying while nobody listens yet (the root may
 * start later than its ranks). Returns a bs_io_status_t; *errno_p for BS_IO_ERROR. */
int bs_connect(const chorus_sockaddr_t *addr, int retry_refused, const bs_deadline_t *d, int *fd_p,
               int *errno_p);
/* Send/receive exactly len bytes on a nonblocking socket, waiting with poll. Never SIGPIPE. */
int bs_send_all(int fd, const void *buf, size_t len, const bs_deadline_t *d, int *errno_p);
int bs_recv_all(int fd, void *buf, size_t len, const bs_deadline_t *d, int *errno_p);
/* One nonblocking read: >0 bytes read, 0 when it would block, BS_IO_CLOSED or BS_IO_ERROR. */
long bs_read_some(int fd, void *buf, size_t len, int *errno_p);
/* One nonblocking write, MSG_NOSIGNAL: same conventions as bs_read_some. */
long bs_write_some(int fd, const void *buf, size_t len, int *errno_p);
void bs_close(int fd);

/* ---- wire format --------------------------------------------------------------------------- */
/* Every connection is authenticated by the challenge-response of auth.h, so the secret never
 * crosses the wire:
 *   acceptor -> connector   bs_challenge_t   {magic, version, nonce_s}
 *   connector -> acceptor   bs_hello_t       claims, nonce_c, proof_c over claims
 *   acceptor -> connector   bs_answer_t      {status, proof_s over claims (+ the root's reply)},
 *                           then for the root's rendezvous hello the bs_reply_t the proof covers
 * The acceptor checks proof_c before it looks at any claim; the connector checks proof_s before
 * it trusts the reply or sends any message. The key is the id's 256-bit key (chorus_key_t).
 * BS_HELLO_ROOT: a rank to the root (the rendezvous). BS_HELLO_PEER: a rank to a rank.
 * BS_HELLO_FROM_ROOT: the root to a rank's listen socket, once, with its one message (rank -1).
 * BS_HELLO_PEER_AGAIN: a rank to a rank whose earlier connection it released (BS_TAG_BYE): it
 * may arrive while that one is still being read, and then waits for it. */
enum { BS_HELLO_ROOT = 1, BS_HELLO_PEER = 2, BS_HELLO_FROM_ROOT = 3, BS_HELLO_PEER_AGAIN = 4 };
/* Bumped whenever the bytes on the wire change: 2 is the challenge-response, 3 its 256-bit key,
 * 4 the release of idle connections (BS_TAG_BYE, BS_HELLO_PEER_AGAIN).
 * BS_WIRE_MAGIC stays the same across versions, so that a peer of another version is recognised
 * (and named as such) rather than taken for a stranger. */
#define BS_WIRE_VERSION 4u
#define BS_WIRE_MAGIC 0x43484f5255533031ull /* "CHORUS01" */
#define BS_AUTH_LABEL "chorus-bootstrap-v3"

typedef struct {
    uint64_t magic; /* BS_WIRE_MAGIC */
    uint32_t version; /* BS_WIRE_VERSION */
    uint32_t pad;
    uint8_t nonce[CHORUS_NONCE_BYTES];
} bs_challenge_t;

typedef struct {
    uint64_t magic; /* BS_WIRE_MAGIC */
    uint32_t version; /* BS_WIRE_VERSION */
    uint32_t kind;    /* BS_HELLO_* */
    int32_t rank;     /* who is speaking */
    int32_t nranks;
    int32_t to_rank;        /* peer hello: the rank this connection is meant for; root hello
                               with nroots >= 2: the index of the root it is meant for */
    uint32_t nroots;        /* root hello: roots sharing the rendezvous (0 or 1: one) */
    chorus_sockaddr_t addr; /* root hello: the speaker's listen address */
    uint32_t pad;
    uint8_t nonce[CHORUS_NONCE_BYTES]; /* nonce_c */
    uint8_t proof[CHORUS_PROOF_BYTES]; /* proof_c over every byte before it */
} bs_hello_t;
/* The claims a proof covers: the hello up to its proof. */
#define BS_HELLO_CLAIMS (offsetof(bs_hello_t, proof))

enum { BS_ANSWER_OK = 0, BS_ANSWER_REFUSED = 1 };
typedef struct {
    uint32_t status; /* BS_ANSWER_REFUSED: the hello's proof failed (no proof follows) */
    uint32_t pad;
    uint8_t proof[CHORUS_PROOF_BYTES]; /* proof_s */
} bs_answer_t;

enum {
    BS_REPLY_OK = 0,       /* to a root's first rank lo: .nmissing chorus_sockaddr_t, those of
                              ranks lo-1 .. hi (mod nranks) of the root's range [lo, hi) */
    BS_REPLY_TIMEOUT = 1,  /* followed by min(nmissing, BS_MISSING_LISTED) int32 ranks */
    BS_REPLY_NRANKS = 2,   /* nranks differs from the first rank's; .nranks is the root's */
    BS_REPLY_DUP_RANK = 3, /* another connection already holds this rank */
    BS_REPLY_BAD_RANK = 4, /* rank outside [0, nranks) or nranks < 1 */
    BS_REPLY_JOINED = 5,   /* on the hello's connection: registered; the rest comes later */
};
/* A timeout message lists at most this many missing ranks (nmissing counts them all). */
#define BS_MISSING_LISTED 64

typedef struct {
    uint32_t status;
    int32_t nranks;
    int32_t nmissing;
    int32_t timeout_s;
} bs_reply_t;

typedef struct {
    int32_t tag;
    uint32_t pad;
    uint64_t size;
} bs_msg_hdr_t;

/* The largest tagged message a receiver accepts; a bigger header drops the connection. */
#define BS_MAX_MSG_BYTES (1ull << 30)
/* A message's buffer starts at this size (or its size) and doubles as its bytes arrive. */
#define BS_MSG_FIRST_ALLOC (64u << 10)

/* ---- decoding what arrives (bs_wire.c): pure functions ------------------------------------ */
/* A fresh challenge (random nonce); -1 when the kernel gives no randomness. */
int bs_challenge_make(bs_challenge_t *c);
/* 1 when a complete challenge is one of this version. */
int bs_challenge_ok(const bs_challenge_t *c);
/* The connector's side: fill h's nonce and proof for the challenge (h's claims set before). -1
 * when the kernel gives no randomness. */
int bs_hello_sign(bs_hello_t *h, const chorus_key_t *key, const bs_challenge_t *c);
/* The acceptor's side, on a complete hello: 1 when magic and version are ours and its proof is
 * right for key and this connection's nonce_s. Nothing else of the hello may be trusted before. */
int bs_hello_auth_ok(const bs_hello_t *h, const chorus_key_t *key,
                     const uint8_t nonce_s[CHORUS_NONCE_BYTES]);
/* The acceptor's answer to an authenticated hello, covering `reply` (may be NULL, 0 bytes). */
void bs_answer_make(const bs_hello_t *h, const chorus_key_t *key,
                    const uint8_t nonce_s[CHORUS_NONCE_BYTES],
                    const void *reply, size_t reply_len, bs_answer_t *a);
/* The connector checks it: 1 when status is OK and the proof is right. */
int bs_answer_ok(const bs_answer_t *a, const bs_hello_t *h, const chorus_key_t *key,
                 const uint8_t nonce_s[CHORUS_NONCE_BYTES], const void *reply, size_t reply_len);
/* The connector's whole handshake on a connected socket: read the challenge, send the hello
 * (claims in *h; nonce and proof filled here), read the answer and then reply_len bytes into
 * reply, and check the answer's proof over them. BS_IO_OK, an I/O status, BS_IO_AUTH (a wrong
 * or missing proof: the other side does not know the key), BS_IO_AUTH_REFUSED or BS_IO_VERSION
 * (a challenge of another wire version: *errno_p then holds that version). */
int bs_auth_connect(int fd, const chorus_key_t *key, bs_hello_t *h, void *reply, size_t reply_len,
                    const bs_deadline_t *d, int *errno_p);

/* A complete rendezvous hello at the root (already authenticated), given the nranks
 * the first rank fixed (0 before any): BS_REPLY_OK, BS_REPLY_BAD_RANK, BS_REPLY_NRANKS, or
 * BS_HELLO_NOT_ROOT (not a rendezvous hello: drop without a reply). */
#define BS_HELLO_NOT_ROOT (-1)
int bs_root_hello_verdict(const bs_hello_t *h, int root_nranks);
/* 1 when a complete peer hello (already authenticated) is for this rank of this
 * communicator and names a sender in range other than this rank (a rank's messages to itself never
 * cross a socket: a hello claiming to be it is forged). */
int bs_peer_hello_ok(const bs_hello_t *h, int rank, int nranks);
/* 1 when a complete hello (already authenticated) is the root's message to this rank. */
int bs_root_msg_hello_ok(const bs_hello_t *h, int rank, int nranks);
/* The root's reply as a rank of nranks reads it: 0 with *bytes_p = how many bytes follow it (the
 * neighbours' addresses, the list of missing ranks, or none), -1 when it cannot be for this rank. */
int bs_reply_follows(const bs_reply_t *rep, int nranks, size_t *bytes_p);
/* 1 when a tagged message header may be accepted (its size is at most BS_MAX_MSG_BYTES). */
int bs_msg_hdr_ok(const bs_msg_hdr_t *hdr);

/* WARN (the first few times per process, INFO after) that a connection from `from` to `who`
 * failed authentication. */
void bs_warn_auth_failed(const char *who, const chorus_sockaddr_t *from);

/* ---- root (bs_root.c) ---------------------------------------------------------------------- */
/* The hello counts of the roots of this process that completed a rendezvous since the last
 * call, oldest first (at most max; the 64 first are kept): for tests. */
int bs_root_stats_take(int *hellos, int max);
/* Wait (at most max_s, until *abort_flag) while a root of this process serving the id with this
 * secret sends its verdict (the table, or the missing ranks) to the ranks that joined. A rank
 * that fails in bootstrap calls it before it returns: its process may exit next, and that would
 * cut the verdict off from the other ranks. Returns 1 when such a root still sends. */
int bs_root_wait(const chorus_key_t *secret, double max_s, const volatile int *abort_flag);
/* Start a detached thread that serves one rendezvous on listen_fd (which it then owns). */
ncclResult_t bs_root_start(int listen_fd, const chorus_key_t *secret,
                           const chorus_sockaddr_t *addr);

/* ---- the handle (bootstrap.c, bs_peer.c) -------------------------------------------------- */
typedef struct bs_msg {
    struct bs_msg *next;
    int tag;
    size_t size;
    char *data;
} bs_msg_t;

/* An incoming connection on this rank's listen socket, as the receiver thread sees it. */
typedef struct {
    int fd;
    int authed; /* hello checked */
    int from;   /* peer rank once authed */
    uint64_t hello_deadline_ns;
    uint8_t nonce[CHORUS_NONCE_BYTES]; /* the challenge this connection got */
    chorus_sockaddr_t peer_addr;       /* where it came from (for messages) */
    size_t got; /* bytes of the current header / hello / payload */
    union {
        bs_hello_t hello;
        bs_msg_hdr_t hdr;
    } u;
    bs_msg_t *cur; /* message whose payload is being read, NULL while reading a header */
    size_t cap;    /* bytes allocated for cur's payload so far */
    /* Authed while an earlier connection from the same rank was still being read (its sender
     * released it and connected again): not read until that one ends, so that the rank's
     * messages are queued in the order they were sent. order: when it was authed. */
    int deferred;
    uint64_t order;
} bs_in_conn_t;

enum { BS_PEER_NONE = 0, BS_PEER_OPEN, BS_PEER_CLOSED, BS_PEER_FAILED };

struct bootstrap {
    int rank, nranks;
    chorus_key_t secret;      /* what peers present */
    chorus_key_t root_secret; /* what this rank's root presents (its id's) */
    volatile int *abort_ext;
    volatile int abort_int;
    chorus_sockaddr_t *addrs; /* [nranks + 1] listen addresses; [nranks]: the root's */
    int listen_fd;
    int wake_fd; /* eventfd: wakes the receiver thread on close/abort */

    pthread_t recv_thread;
    int recv_started;
    volatile int stop;

    pthread_mutex_t lock; /* protects queues, in_state and the connection list */
    pthread_cond_t cond;
    /* Per peer, and one more slot (index nranks) for the root's message during the rendezvous */
    bs_msg_t **q_head, **q_tail; /* [nranks + 1] unexpected messages per peer, FIFO */
    int *in_state;               /* [nranks + 1] BS_PEER_* of the incoming connection */
    int *in_errno;               /* [nranks + 1] errno when FAILED */
    bs_in_conn_t *conns;         /* receiver thread only */
    int nconns, conns_cap;
    uint64_t conns_authed;       /* receiver thread only: orders deferred connections */

    pthread_mutex_t send_lock; /* serialises senders; out_fd[] and released[] under it */
    int *out_fd;               /* [nranks] outgoing connection, -1 until first send */
    uint8_t *released;         /* [nranks] an earlier connection was released (BS_HELLO_PEER_AGAIN) */
};

/* Start / stop the receiver thread that accepts peers and drains their messages. */
ncclResult_t bs_peer_start(bootstrap_t *bs);
void bs_peer_stop(bootstrap_t *bs);
/* Wake the receiver thread and every waiting recv (after an abort flag was set). */
void bs_peer_wake(bootstrap_t *bs);
int bs_peer_aborted(const bootstrap_t *bs);
ncclResult_t bs_peer_send(bootstrap_t *bs, int peer, int tag, const void *data, size_t size);
ncclResult_t bs_peer_recv(bootstrap_t *bs, int peer, int tag, void *data, size_t size);
/* Wait until *dl for the first message with (peer, tag) and hand it over (*m_p, freed with
 * bs_msg_free). peer may be nranks: the root's slot (its one message during the rendezvous). */
ncclResult_t bs_peer_wait(bootstrap_t *bs, int peer, int tag, const bs_deadline_t *dl,
                          bs_msg_t **m_p);
/* The same for the first of npeers (1 or 2) (peer, tag) pairs to arrive; *which_p tells which. */
ncclResult_t bs_peer_wait_any(bootstrap_t *bs, int npeers, const int *peers, const int *tags,
                              const bs_deadline_t *dl, int *which_p, bs_msg_t **m_p);
void bs_msg_free(bs_msg_t *m);
void bs_deadline_for(bootstrap_t *bs, bs_deadline_t *d);
/* The receiver thread's step for one incoming connection, bs->conns[i]: read what is available
 * (hello, then message headers and payloads into the queues). -1 when it dropped the connection.
 * For the fuzz harness, which feeds it bytes through a socket pair. */
int bs_peer_conn_read(bootstrap_t *bs, int i);

#endif
