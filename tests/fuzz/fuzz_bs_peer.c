/*
 * fuzz_bs_peer: the bytes another process sends on a connection to a rank's bootstrap listen
 * socket after its challenge (nonce FUZZ_NONCE), as the receiver thread reads them: a peer hello
 * (its proof checked first, then sender and recipient) or the root's (queued on the root's slot,
 * nranks), then tagged messages {tag, size} + payload, among them the allgather and barrier
 * rounds. The input goes through a socket pair into the real receiver step (bs_peer_conn_read),
 * then every queued message is taken with bs_peer_recv, once with its own size and once with a
 * wrong one, as allgather/barrier/a user recv would. Checks: nothing is queued without a valid
 * hello; a queued message has exactly the bytes that were sent; a size mismatch is an error.
 *
 * Input: [nranks-1 (mod 8) + 1][my rank][flags][stream...]. The secret is fuzz_key(); flags bit 1
 * (2) makes the harness sign the hello at the start of the stream with it, so that what follows
 * authentication is reached (random bytes never carry a right proof). The seed corpus holds
 * valid hellos and messages.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bs_internal.h"
#include "fuzz_common.h"

static const uint8_t fuzz_nonce[CHORUS_NONCE_BYTES] = "fuzz-peer-nonce";

static bootstrap_t *make_bs(int rank, int nranks) {
    bootstrap_t *bs = calloc(1, sizeof(*bs));
    FUZZ_ASSERT(bs != NULL);
    bs->rank = rank;
    bs->nranks = nranks;
    bs->secret = fuzz_key();
    bs->root_secret = fuzz_key(); /* one root: its message carries the job's secret */
    bs->listen_fd = -1;
    bs->wake_fd = -1;
    pthread_mutex_init(&bs->lock, NULL);
    pthread_mutex_init(&bs->send_lock, NULL);
    pthread_cond_init(&bs->cond, NULL);
    /* One slot more than ranks, as bs_alloc: the root's message during the rendezvous. */
    bs->addrs = calloc(nranks + 1, sizeof(*bs->addrs));
    bs->q_head = calloc(nranks + 1, sizeof(*bs->q_head));
    bs->q_tail = calloc(nranks + 1, sizeof(*bs->q_tail));
    bs->in_state = calloc(nranks + 1, sizeof(int));
    bs->in_errno = calloc(nranks + 1, sizeof(int));
    bs->out_fd = malloc(sizeof(int) * nranks);
    FUZZ_ASSERT(bs->addrs && bs->q_head && bs->q_tail && bs->in_state && bs->in_errno && bs->out_fd);
    for (int i = 0; i < nranks; i++)
        bs->out_fd[i] = -1;
    return bs;
}

static void free_bs(bootstrap_t *bs) {
    for (int i = 0; i <= bs->nranks; i++) {
        for (bs_msg_t *m = bs->q_head[i], *next; m; m = next) {
            next = m->next;
            free(m->data);
            free(m);
        }
    }
    for (int i = 0; i < bs->nconns; i++)
        close(bs->conns[i].fd);
    free(bs->conns);
    free(bs->addrs);
    free(bs->q_head);
    free(bs->q_tail);
    free(bs->in_state);
    free(bs->in_errno);
    free(bs->out_fd);
    pthread_mutex_destroy(&bs->lock);
    pthread_mutex_destroy(&bs->send_lock);
    pthread_cond_destroy(&bs->cond);
    free(bs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536) return 0; /* stays inside one socket buffer */
    fuzz_input_t in = {data, size};
    int nranks = fuzz_u8(&in) % 8 + 1;
    int rank = fuzz_u8(&in) % nranks;
    uint8_t flags = fuzz_u8(&in);
    bootstrap_t *bs = make_bs(rank, nranks);

    int sv[2];
    FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    int sndbuf = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    uint8_t *stream = malloc(in.left + 1);
    FUZZ_ASSERT(stream != NULL);
    memcpy(stream, in.p, in.left);
    if ((flags & 2) && in.left >= sizeof(bs_hello_t)) {
        bs_hello_t h;
        memcpy(&h, stream, sizeof(h));
        chorus_key_t key = fuzz_key();
        chorus_auth_proof(key.b, sizeof(key.b), BS_AUTH_LABEL, CHORUS_AUTH_CLIENT, h.nonce, fuzz_nonce,
                          &h, BS_HELLO_CLAIMS, NULL, 0, h.proof);
        memcpy(stream, &h, sizeof(h));
    }
    size_t off = 0;
    while (off < in.left) {
        ssize_t n = write(sv[1], stream + off, in.left - off);
        if (n <= 0) break; /* the buffer is full: the rest is cut off, as by a slow peer */
        off += (size_t)n;
    }
    shutdown(sv[1], SHUT_WR); /* the peer has said all it will say */

    bs->conns = calloc(1, sizeof(*bs->conns));
    FUZZ_ASSERT(bs->conns != NULL);
    bs->conns_cap = 1;
    bs->nconns = 1;
    bs->conns[0].fd = sv[0];
    bs->conns[0].from = -1;
    memcpy(bs->conns[0].nonce, fuzz_nonce, sizeof(fuzz_nonce));
    /* The receiver thread's loop for this connection: until it is dropped (EOF at the latest). */
    int rounds = 0;
    while (bs->nconns > 0 && bs_peer_conn_read(bs, 0) == 0) {
        FUZZ_ASSERT(++rounds < 1000000);
    }
    FUZZ_ASSERT(bs->nconns == 0);

    int senders = 0;
    for (int p = 0; p <= nranks; p++) { /* p == nranks: the root's slot */
        if (bs->in_state[p] != BS_PEER_NONE) senders++;
        /* Only a peer that passed the hello may have queued anything, never this rank itself.
         * Random bytes never carry a right proof, so without the harness's signature nothing is
         * queued. A peer that said BYE is back to BS_PEER_NONE with its messages still queued
         * (a released link: they stay for the receives to come). */
        if (!(flags & 2)) FUZZ_ASSERT(bs->q_head[p] == NULL && bs->in_state[p] == BS_PEER_NONE);
        FUZZ_ASSERT(p != rank || (bs->in_state[p] == BS_PEER_NONE && bs->q_head[p] == NULL));
        while (bs->q_head[p] != NULL) {
            const bs_msg_t *m = bs->q_head[p];
            size_t got = m->size;
            FUZZ_ASSERT(got <= BS_MAX_MSG_BYTES && got <= size);
            size_t want = got + ((flags & 1) ? 1 : 0);
            void *buf = malloc(want + 1);
            FUZZ_ASSERT(buf != NULL);
            ncclResult_t res = bs_peer_recv(bs, p, m->tag, buf, want); /* frees m */
            FUZZ_ASSERT((res == ncclSuccess) == (want == got));
            free(buf);
        }
    }
    FUZZ_ASSERT(senders <= 1);
    close(sv[1]);
    free(stream);
    free_bs(bs);
    return 0;
}
