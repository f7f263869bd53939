/*
 * connect.c: set up and tear down one connection between two ranks, whatever the transport.
 *
 * Both ranks call transport_connect at the same time, one as sender and one as receiver. Each
 * picks the transport (transport_select), fills its setup blob (ops->setup) and sends it to the
 * other through the bootstrap, then hands the peer's blob to ops->connect. The message also
 * carries the transport name and a status, so a pair that disagrees on the transport or whose
 * other end failed its setup gets an error naming the peer at once instead of a timeout.
 *
 * A rank whose setup of one connection failed (its peer died, say) cannot make the others, and
 * the peers of those would wait for it until CHORUS_TIMEOUT. So once a setup failed, every later
 * transport_connect of the same connect pass only sends its peer a message with a failure status
 * and the rank that started the failure (the cause), and returns: the peer then fails at once and
 * passes the same cause on, so every rank errors quickly and names the rank that failed first.
 *
 * A peer may also fail after its message for our connection said it was fine (on another of its
 * connections), and then close: our exchange fails with "connection closed". So a rank's first
 * failure also sends the cause to every other rank on a tag of its own, and a rank whose exchange
 * with a peer failed looks for that note from the peer (already queued if the peer closed after
 * sending it) to name the rank that failed first.
 *
 * Bootstrap tags are derived from (channel, role of the message's author, caller's tag), so two
 * connections between the same ranks (both directions of a ring, several channels, p2p) do not
 * match each other's messages. The sender sends first and the receiver receives first, which
 * cannot deadlock whether or not bootstrap_send buffers.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "errors.h"
#include "param.h"
#include "transport.h"
#include "waiter.h"

#define SETUP_MSG_MAGIC 0x43535550u /* "CSUP" */
#define SETUP_TAG_BASE 0x20000000   /* 0x20000000..0x3fffffff */
#define SETUP_TAG_CAUSE 0x1fffffc0  /* a rank's first setup failure: the rank that started it */

typedef struct {
    uint32_t magic;
    int32_t status; /* ncclResult_t of the author's setup: non-zero means "give up" */
    int32_t channel, tag, author_is_send; /* which setup this is (checked by the reader) */
    int32_t cause_rank; /* with a failure status: the rank whose failure started it, else -1 */
    uint32_t bytes;
    char transport[20];
    /* Aligned for any type: transports read and write their blob as a struct (transport.h).
     * After the 44 bytes above it would otherwise sit at offset 44, misaligned for 8-byte
     * fields. */
    _Alignas(max_align_t) unsigned char blob[TRANSPORT_BLOB_BYTES];
} transport_setup_msg_t;

/* Bootstrap tag of a setup message: a 28-bit hash of (channel, caller's tag) plus the author's
 * role, in a range of its own. Callers' tags are arbitrary ints (base + channel * nranks + rank),
 * so they are hashed rather than truncated; every message also carries (channel, tag, role), so
 * the unlikely collision of two setups in flight between the same two ranks is an error, never a
 * silent mix-up. */
static int transport_setup_tag(int channel, int author_is_send, int tag) {
    uint64_t x = ((uint64_t)(uint32_t)tag << 8) ^ (uint64_t)(uint8_t)(channel + 1);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return SETUP_TAG_BASE | (author_is_send << 28) | (int)(x & 0x0fffffff);
}

static ncclResult_t transport_geometry(const chorus_transport_ctx_t *ctx, chorus_conn_t *conn) {
    int64_t nslots = chorus_param_int(PARAM_NSLOTS);
    int64_t buffsize = chorus_param_int(PARAM_BUFFSIZE);
    if (nslots < 1 || nslots > 1024) {
        WARN("CHORUS_NSLOTS=%lld is out of range (1..1024)", (long long)nslots);
        return ncclInvalidUsage;
    }
    int64_t slot = buffsize / nslots / 64 * 64;
    if (slot < 64) {
        WARN("NCCL_BUFFSIZE=%lld is too small for %lld slots", (long long)buffsize,
             (long long)nslots);
        return ncclInvalidUsage;
    }
    /* Point-to-point connections (send/recv, all-to-all, the collectives' partners outside the
     * rings) keep the full slot, which the collectives size their chunks by, but fewer of them
     * from TRANSPORT_P2P_MIN_RANKS ranks on: a rank has up to n - 1 of them per direction, and a
     * recursive-doubling or all-to-all partner moves one chunk at a time. Both ends compute the
     * same from the same parameters. */
    if (conn->channel < 0) {
        int64_t p2p = chorus_param_int(PARAM_P2P_NSLOTS);
        if (p2p < 0) p2p = ctx->nranks >= TRANSPORT_P2P_MIN_RANKS ? TRANSPORT_P2P_NSLOTS : nslots;
        if (p2p >= 1 && p2p < nslots) nslots = p2p;
    }
    conn->nslots = (int)nslots;
    conn->slot_bytes = (size_t)slot;
    return ncclSuccess;
}

static void transport_log_connected(chorus_transport_ctx_t *ctx, chorus_conn_t *conn) {
    int src = conn->is_send ? ctx->rank : conn->peer;
    int dst = conn->is_send ? conn->peer : ctx->rank;
    if (conn->channel < 0) {
        INFO(SUB_INIT | SUB_P2P, "P2P %d -> %d%s via %s", src, dst,
             conn->is_send ? "" : " [receive]", conn->desc);
        return;
    }
    char sdev[16], ddev[16];
    int sd = ctx->peers[src].cuda_dev, dd = ctx->peers[dst].cuda_dev;
    if (sd >= 0)
        snprintf(sdev, sizeof(sdev), "%d", sd);
    else
        snprintf(sdev, sizeof(sdev), "cpu");
    if (dd >= 0)
        snprintf(ddev, sizeof(ddev), "%d", dd);
    else
        snprintf(ddev, sizeof(ddev), "cpu");
    INFO(SUB_INIT, "Channel %02d : %d[%s] -> %d[%s]%s via %s", conn->channel, src, sdev, dst, ddev,
         conn->is_send ? "" : " [receive]", conn->desc);
}

/* Remember the first failed setup of this rank, naming the peer, its host and the transport:
 * the op that needed the connection reports it (coll_api.c), and its WARN is the user's last
 * error. */
static void transport_note_failure(chorus_transport_ctx_t *ctx, const chorus_conn_t *conn,
                                   const chorus_transport_ops_t *ops, ncclResult_t res,
                                   int cause, int unanswered) {
    if (ctx->fail_text[0]) return;
    char where[32] = "", why[320] = "";
    if (conn->channel >= 0) snprintf(where, sizeof(where), " (ring channel %d)", conn->channel);
    /* A rank of this host that is stopped (alive to every probe, answering nothing) or has
     * exited: whatever this setup waited on, it is the likely cause, and the note to the peers
     * names it. */
    int state = 0;
    int failed = cause == ctx->rank ? -1
                                    : locality_find_failed(ctx->peers, ctx->nranks, ctx->rank,
                                                           &state);
    /* An exited rank is the cause only where nothing better is known: a peer that never answered
     * was alive then (it may have exited after its own error since), and a peer's note names the
     * rank that failed first. */
    if (failed >= 0 && state == CHORUS_PROC_GONE && (unanswered || cause != conn->peer))
        failed = -1;
    if (failed >= 0) {
        cause = failed;
        snprintf(why, sizeof(why), "; rank %d (%s, pid %d) %s", failed,
                 ctx->peers[failed].hostname, ctx->peers[failed].pid, locality_failed_text(state));
    } else if (cause != conn->peer && cause >= 0 && cause < ctx->nranks)
        snprintf(why, sizeof(why), "; the failure started at rank %d (%s)", cause,
                 ctx->peers[cause].hostname);
    else if (unanswered && conn->channel < 0)
        /* The usual cause: both ranks of a pair send first, each outside a group. */
        snprintf(why, sizeof(why),
                 "; rank %d never answered: it is not in the matching ncclRecv/ncclSend (two "
                 "ranks that each ncclSend to the other first wait for each other: group the "
                 "pair's send and recv)",
                 conn->peer);
    else if (unanswered)
        snprintf(why, sizeof(why),
                 "; rank %d never answered: it is not in the same collective",
                 conn->peer);
    snprintf(ctx->fail_text, sizeof(ctx->fail_text),
             "setting up the connection %s rank %d (%s) via %s%s failed (%s)%s",
             conn->is_send ? "to" : "from", conn->peer, ctx->peers[conn->peer].hostname,
             ops ? ops->name : "(no transport chosen)", where, chorus_result_text(res), why);
    ctx->fail_cause = cause;
    /* Best effort, no answer awaited. Only ranks we have sent to can have an exchange with us
     * that fails when we close; and a send on an open connection never waits to connect (to a
     * stopped or unreachable rank, connecting would wait for CHORUS_TIMEOUT). */
    /* A failure of our own went out as the status of this setup's message, and its WARN must
     * stay the last error (a failed send WARNs too). */
    if (cause == ctx->rank) return;
    int32_t note = cause;
    for (int r = 0; r < ctx->nranks; r++)
        if (r != ctx->rank && r != cause && bootstrap_peer_connected(ctx->bs, r))
            (void)bootstrap_send(ctx->bs, r, SETUP_TAG_CAUSE, &note, sizeof(note));
}

/* How long a failed setup looks for the peer's note on who failed first. */
#define SETUP_CAUSE_WAIT_NS 200000000ull

/* Our setup with peer failed (its exchange or its connect): did the peer say which rank failed
 * first? A peer that failed elsewhere sends its note before it closes anything, so the note is
 * queued, or on its way, by the time its closing fails us; a peer that is itself the cause sends
 * none. So look for a short while only, without ever waiting on the peer. */
static int transport_peer_cause(chorus_transport_ctx_t *ctx, int peer) {
    const uint64_t until = chorus_now_ns() + SETUP_CAUSE_WAIT_NS;
    while (!bootstrap_peek(ctx->bs, peer, SETUP_TAG_CAUSE)) {
        if (chorus_now_ns() > until) return peer;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    int32_t note = -1;
    if (bootstrap_recv(ctx->bs, peer, SETUP_TAG_CAUSE, &note, sizeof(note)) != ncclSuccess)
        return peer;
    return note >= 0 && note < ctx->nranks && note != ctx->rank ? note : peer;
}

/* An earlier setup of this rank failed: only tell the peer (see the file comment). Sending to a
 * dead peer fails at once; nothing here waits for an answer. */
static ncclResult_t transport_pass_failure(chorus_transport_ctx_t *ctx, chorus_conn_t *conn,
                                           int tag, transport_setup_msg_t *mine) {
    mine->status = (int32_t)ncclRemoteError;
    mine->cause_rank = ctx->fail_cause;
    if (conn->peer != ctx->fail_cause)
        (void)bootstrap_send(ctx->bs, conn->peer,
                             transport_setup_tag(conn->channel, conn->is_send, tag), mine,
                             sizeof(*mine));
    return ncclRemoteError;
}

/* Exchange setup messages: sender sends first, receiver receives first. */
static ncclResult_t transport_exchange(chorus_transport_ctx_t *ctx, chorus_conn_t *conn, int tag,
                                       const transport_setup_msg_t *mine,
                                       transport_setup_msg_t *theirs) {
    int my_tag = transport_setup_tag(conn->channel, conn->is_send, tag);
    int peer_tag = transport_setup_tag(conn->channel, !conn->is_send, tag);
    if (conn->is_send) {
        CHECK(bootstrap_send(ctx->bs, conn->peer, my_tag, mine, sizeof(*mine)));
        CHECK(bootstrap_recv(ctx->bs, conn->peer, peer_tag, theirs, sizeof(*theirs)));
    } else {
        CHECK(bootstrap_recv(ctx->bs, conn->peer, peer_tag, theirs, sizeof(*theirs)));
        CHECK(bootstrap_send(ctx->bs, conn->peer, my_tag, mine, sizeof(*mine)));
    }
    return ncclSuccess;
}

ncclResult_t transport_connect(chorus_transport_ctx_t *ctx, chorus_conn_t *conn, int peer,
                               int is_send, int channel, int tag) {
    memset(conn, 0, sizeof(*conn));
    conn->ctx = ctx;
    conn->peer = peer;
    conn->is_send = is_send ? 1 : 0;
    conn->channel = channel;
    if (peer == ctx->rank || peer < 0 || peer >= ctx->nranks) {
        WARN("transport_connect: rank %d cannot connect to rank %d (%d ranks; a rank copies to "
             "itself without a transport)",
             ctx->rank, peer, ctx->nranks);
        return ncclInternalError;
    }
    ncclResult_t res = ncclSuccess;
    transport_setup_msg_t mine, theirs;
    memset(&mine, 0, sizeof(mine));
    memset(&theirs, 0, sizeof(theirs));
    mine.magic = SETUP_MSG_MAGIC;
    mine.channel = channel;
    mine.tag = tag;
    mine.author_is_send = conn->is_send;
    mine.cause_rank = -1;
    if (ctx->fail_text[0]) return transport_pass_failure(ctx, conn, tag, &mine);

    /* A local failure is still sent to the peer (as a status) so that it does not wait for us. */
    const chorus_transport_ops_t *ops = NULL;
    res = transport_geometry(ctx, conn);
    if (res == ncclSuccess) res = transport_select(ctx, peer, &ops);
    if (res == ncclSuccess) {
        conn->ops = ops;
        snprintf(mine.transport, sizeof(mine.transport), "%s", ops->name);
        size_t bytes = sizeof(mine.blob);
        res = ops->setup(conn, mine.blob, &bytes);
        if (res == ncclSuccess && bytes > sizeof(mine.blob)) {
            WARN("transport %s: setup blob of %zu bytes exceeds %d", ops->name, bytes,
                 TRANSPORT_BLOB_BYTES);
            res = ncclInternalError;
        }
        mine.bytes = (uint32_t)bytes;
    }
    mine.status = (int32_t)res;
    if (res != ncclSuccess) mine.cause_rank = ctx->rank;
    int cause = res != ncclSuccess ? ctx->rank : peer; /* who failed, if this setup fails */
    ncclResult_t xres = ncclSuccess;
    CHECK_GOTO(transport_exchange(ctx, conn, tag, &mine, &theirs), xres, err_exchange);
    if (res != ncclSuccess) goto err_close;
    if (theirs.magic != SETUP_MSG_MAGIC) {
        WARN("transport setup message from rank %d is corrupt", peer);
        res = ncclInternalError;
        goto err_close;
    }
    if (theirs.channel != channel || theirs.tag != tag || theirs.author_is_send == conn->is_send) {
        WARN("transport setup with rank %d: got the message of another setup (channel %d tag %d, "
             "expected channel %d tag %d): two setups in flight share a bootstrap tag",
             peer, theirs.channel, theirs.tag, channel, tag);
        res = ncclInternalError;
        goto err_close;
    }
    if (theirs.status != ncclSuccess) {
        if (theirs.cause_rank >= 0 && theirs.cause_rank < ctx->nranks) cause = theirs.cause_rank;
        if (cause != peer)
            WARN("rank %d (%s) gave up setting up its end of the connection %s rank %d: rank %d "
                 "(%s) failed first",
                 peer, ctx->peers[peer].hostname, is_send ? "from" : "to", ctx->rank, cause,
                 ctx->peers[cause].hostname);
        else
            WARN("rank %d (%s) failed to set up its end of the connection %s rank %d (error %d)",
                 peer, ctx->peers[peer].hostname, is_send ? "from" : "to", ctx->rank,
                 (int)theirs.status);
        res = ncclRemoteError;
        goto err_close;
    }
    theirs.transport[sizeof(theirs.transport) - 1] = '\0';
    if (strcmp(theirs.transport, ops->name) != 0) {
        WARN("rank %d chose transport %s to reach rank %d, but rank %d chose %s", ctx->rank,
             ops->name, peer, peer, theirs.transport);
        res = ncclSystemError;
        goto err_close;
    }
    if (theirs.bytes > sizeof(theirs.blob)) {
        WARN("transport setup message from rank %d has a bad blob size %u", peer, theirs.bytes);
        res = ncclInternalError;
        goto err_close;
    }
    CHECK_GOTO(ops->connect(conn, theirs.blob, theirs.bytes), res, err_close);
    __atomic_store_n(&conn->connected, 1, __ATOMIC_RELEASE); /* engine_drain_sends may look */
    transport_log_connected(ctx, conn);
    return ncclSuccess;

err_exchange:
    if (res == ncclSuccess) res = xres;
err_close:
    /* Ours or a peer's failure named in its message: the cause is known. Else ask the peer. */
    if (cause == peer && mine.status == ncclSuccess && theirs.status == ncclSuccess &&
        !ctx->fail_text[0])
        cause = transport_peer_cause(ctx, peer);
    /* The exchange ran out of time (ncclSystemError; a closed peer gives ncclRemoteError) with
     * nothing from the peer: it is alive but elsewhere. */
    int unanswered = xres == ncclSystemError && theirs.magic == 0 &&
                     !(ctx->abort_flag && __atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE));
    transport_note_failure(ctx, conn, ops, res, cause, unanswered);
    if (conn->ops) conn->ops->close(conn);
    /* Leave the connection visibly unconnected: callers test ops == NULL to connect again. */
    conn->ops = NULL;
    conn->priv = NULL;
    conn->connected = 0;
    return res;
}

void transport_close(chorus_conn_t *conn) {
    if (!conn) return;
    if (conn->ops) conn->ops->close(conn);
    conn->ops = NULL;
    conn->priv = NULL;
    conn->connected = 0;
}
