/*
 * bootstrap.h: rendezvous and setup-time exchange over TCP.
 *
 * ncclUniqueId carries a random 256-bit key and the root's socket address (chorus_unique_id_t).
 * ncclGetUniqueId starts a root listener thread in the calling process; with NCCL_COMM_ID=host:port
 * the id is derived from that address and rank 0 runs the root inside bootstrap_init. Ranks connect
 * to the root, prove they know the secret (a challenge-response: it never crosses the wire), and
 * learn every rank's listen address (the root sends the table
 * to rank 0 only; the ranks relay and complete it). After that the root is no longer needed:
 * allgather, barrier and tagged point-to-point messages go directly between ranks.
 *
 * Every call has a deadline (CHORUS_TIMEOUT) and checks the abort flag given at init. A failure names
 * the peer rank and its address. Not thread-safe per handle: one communicator, one caller at a time.
 */
#ifndef CHORUS_BOOTSTRAP_H_
#define CHORUS_BOOTSTRAP_H_

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include "auth.h"
#include "nccl.h"

typedef union {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
} chorus_sockaddr_t;

/* What ncclUniqueId holds (must stay <= NCCL_UNIQUE_ID_BYTES: api/init.c asserts it). */
typedef struct {
    uint64_t magic;      /* CHORUS_ID_MAGIC: tells a Chorus id from garbage */
    chorus_key_t secret; /* the 256-bit key every connection proves it knows */
    chorus_sockaddr_t root;
    uint32_t flags; /* CHORUS_ID_FLAG_* */
} chorus_unique_id_t;
#define CHORUS_ID_MAGIC 0x43484f5255533032ull /* "CHORUS02": the 256-bit key */
/* The magic of ids made by Chorus versions with a 64-bit key, recognised only to say so. */
#define CHORUS_ID_MAGIC_V1 0x43484f5255533031ull /* "CHORUS01" */
/* The id was built from an address (NCCL_COMM_ID, MASTER_ADDR:MASTER_PORT): no root thread runs
 * yet; rank 0 listens on `root` inside bootstrap_init. The key is HMAC-SHA256 of the address under
 * the job secret (CHORUS_JOB_SECRET); only with CHORUS_COMM_ID_INSECURE=1 a hash of the address
 * text alone, which gives no secrecy. */
#define CHORUS_ID_FLAG_RANK0_ROOT 0x1u
/* With RANK0_ROOT: the address was given as a host name; rank 0 listens on every local address
 * (that port), since the name may resolve differently on rank 0's own host. */
#define CHORUS_ID_FLAG_BIND_ANY 0x2u
/* A child id as it crosses the parent's bootstrap (split, shrink): `secret` holds a public
 * random 32-byte salt, and the members derive the real key from it and their parent's key
 * (bootstrap_child_id_open), so the child's secret never crosses the wire either. Such an id
 * cannot be used before it is opened. */
#define CHORUS_ID_FLAG_CHILD 0x4u

typedef struct bootstrap bootstrap_t;

/* The most ranks a communicator may have. Per-rank tables are allocated before the rendezvous, so a
 * wrong nranks (INT_MAX) must fail at once rather than allocate and touch gigabytes. */
#define BOOTSTRAP_MAX_NRANKS (1 << 24)

/* Fill *id: NCCL_COMM_ID gives the root address (no thread started: rank 0 runs the root in
 * bootstrap_init); otherwise a random key (getrandom: no entropy source is ncclSystemError, never
 * a guessable key) and a root thread on a fresh port of a usable interface. */
ncclResult_t bootstrap_get_unique_id(chorus_unique_id_t *id);
/* A fresh id for a communicator derived from `parent` (split, shrink): its key derived from the
 * parent's and a random salt, a root thread
 * listening on the parent's own bootstrap IP (known reachable by its peers), ignoring
 * NCCL_COMM_ID, which belongs to the top-level communicator: several children made at the same
 * time from one fixed address would collide. Ids are single-use: the root serves one rendezvous
 * and exits; a second init with the same id fails at once ("refused"). */
/* *id is the usable id (for the caller); *wire_p (may be NULL) the same id sealed for the other
 * members: its key replaced by the salt it is derived from with the parent's key
 * (HMAC-SHA256), CHORUS_ID_FLAG_CHILD set. */
ncclResult_t bootstrap_child_unique_id(const bootstrap_t *parent, chorus_unique_id_t *id,
                                       chorus_unique_id_t *wire_p);
/* A member's side: turn a sealed child id received from the parent's bootstrap into the usable
 * one (an id without CHORUS_ID_FLAG_CHILD is left as it is). */
void bootstrap_child_id_open(const bootstrap_t *parent, chorus_unique_id_t *id);
/* Build the id for a fixed root address "host:port" / "[v6]:port" (hostnames resolved). Every rank
 * computes the same id from the same text and job secret; rank 0 runs the root in bootstrap_init.
 * `what` names where the text came from (e.g. "NCCL_COMM_ID") for the WARN when it is malformed
 * (ncclInvalidArgument). No job secret (CHORUS_JOB_SECRET, CHORUS_JOB_SECRET_FILE), an unusable
 * secret file, and no CHORUS_COMM_ID_INSECURE=1: ncclInvalidUsage with a WARN saying how to set
 * one. Starts nothing. */
ncclResult_t bootstrap_id_from_string(const char *hostport, const char *what,
                                      chorus_unique_id_t *id);
/* The key of a fixed-address id for the address text hostport: HMAC-SHA256 keyed with the job
 * secret's bytes over "chorus-job-key-v1" NUL hostport; with job_secret NULL (only under
 * CHORUS_COMM_ID_INSECURE=1) keyed with nothing over "chorus-comm-id-insecure-v1" NUL hostport.
 * Pure; every rank of a job computes the same key. */
void bootstrap_fixed_key(const char *job_secret, const char *hostport, chorus_key_t *key);

/* Why an id cannot be used (bad magic, a root address that is not IPv4/IPv6 or has no port,
 * unknown flags), or NULL when it can. Pure: ncclCommInitRank's id is checked with it. */
const char *bootstrap_id_problem(const chorus_unique_id_t *id);

/* Collective over all nranks: rendezvous through the root. abort_flag may be NULL. */
ncclResult_t bootstrap_init(const chorus_unique_id_t *id, int rank, int nranks,
                            volatile int *abort_flag, bootstrap_t **bs_p);
/* The same through several roots (ncclCommInitRankScalable): every rank passes the same nids
 * ids; rank r joins the root of ids[floor(r * nroots / nranks)], nroots = min(nids, nranks), so
 * each root takes about nranks / nroots hellos. Peer connections use ids[0]'s secret. */
ncclResult_t bootstrap_init_multi(const chorus_unique_id_t *ids, int nids, int rank, int nranks,
                                  volatile int *abort_flag, bootstrap_t **bs_p);

int bootstrap_rank(const bootstrap_t *bs);
int bootstrap_nranks(const bootstrap_t *bs);
/* The key peer connections prove they know (also the TCP transport's). */
const chorus_key_t *bootstrap_secret(const bootstrap_t *bs);
/* The address this rank's bootstrap listens on (its IP is the one peers reach it by). */
const chorus_sockaddr_t *bootstrap_addr(const bootstrap_t *bs, int rank);

/* data holds nranks slots of `size` bytes; this rank's slot is filled in, all others on return. */
ncclResult_t bootstrap_allgather(bootstrap_t *bs, void *data, size_t size);
ncclResult_t bootstrap_barrier(bootstrap_t *bs);
/* Tagged messages between two ranks; a recv matches (peer, tag) and the size must match.
 * Messages with the same (peer, tag) arrive in the order they were sent; others may be received in
 * any order (unexpected ones are buffered). A send never waits for the matching recv. peer may be
 * this rank. Tags from BOOTSTRAP_TAG_RESERVED_MIN to BOOTSTRAP_TAG_RESERVED_MIN + 63 are used
 * internally (allgather, barrier); all others are free. Thread-safe. */
#define BOOTSTRAP_TAG_RESERVED_MIN (-0x7fffff00)
ncclResult_t bootstrap_send(bootstrap_t *bs, int peer, int tag, const void *data, size_t size);
ncclResult_t bootstrap_recv(bootstrap_t *bs, int peer, int tag, void *data, size_t size);
/* 1 when this rank has a connection open to peer (a send then never waits to connect). */
int bootstrap_peer_connected(bootstrap_t *bs, int peer);
/* Close this rank's idle connection to peer, if open, so that it holds no descriptor at either
 * end; the next send to peer connects again. The peer queues every message sent before, in
 * order, and does not take the closed connection for the peer's death (a recv that waits for
 * this rank then probes whether it still listens). */
void bootstrap_release_peer(bootstrap_t *bs, int peer);
/* 1 when a message from peer with this tag is queued (a bootstrap_recv of it returns at once). */
int bootstrap_peek(bootstrap_t *bs, int peer, int tag);

/* Make blocked and future calls fail fast (called from ncclCommAbort / on fatal errors). */
void bootstrap_abort(bootstrap_t *bs);
void bootstrap_close(bootstrap_t *bs);

/* Helpers shared with the TCP transport: interface selection by NCCL_SOCKET_IFNAME rules. */
ncclResult_t chorus_find_interface(chorus_sockaddr_t *addr_p, char *ifname, int ifname_len);
const char *chorus_sockaddr_str(const chorus_sockaddr_t *a, char *buf, int len);

#endif
