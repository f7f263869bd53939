/*
 * tcp_rank_main.c: one rank of a TCP transport job across "hosts", for
 * tests/scripts/netns_two_hosts.sh (two network namespaces joined by a veth pair, each with its
 * own hostname and /dev/shm). Reads RANK and WORLD_SIZE as chorusrun sets them, and the
 * rendezvous from NCCL_COMM_ID.
 *
 * Every rank builds a minimal communicator (bootstrap + locality allgather), then connects a ring
 * (send to rank+1, receive from rank-1) through the ordinary transport choice, with nothing forced:
 * a peer on the other host must get TCP (shared memory cannot reach it), a peer on the same host
 * whatever the registry prefers. Messages of 1 B to 16 MiB go round, every byte checked. Prints
 * one line per rank naming both edges' transports; exit 0 on success, 1 on any failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"
#include "log.h"
#include "param.h"
#include "transport.h"
#include "waiter.h"
#include "topo.h"

static int g_rank = -1;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "tcp_rank_main: rank %d: ", g_rank);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, " (%s)\n", chorus_log_last_error());                                       \
        return 1;                                                                                  \
    } while (0)

static uint8_t pat(int src, size_t msg, size_t off) {
    uint64_t x = (uint64_t)src * 0x9e3779b97f4a7c15ull + msg * 0xbf58476d1ce4e5b9ull + off;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    return (uint8_t)(x >> 32);
}

int main(void) {
    const char *rs = getenv("RANK"), *ns = getenv("WORLD_SIZE");
    if (!rs || !ns) {
        fprintf(stderr, "tcp_rank_main: RANK and WORLD_SIZE must be set (run under chorusrun)\n");
        return 1;
    }
    int rank = atoi(rs), nranks = atoi(ns);
    g_rank = rank;
    chorus_log_set_rank(rank);
    if (chorus_param_init() != ncclSuccess) FAIL("bad parameters");
    chorus_unique_id_t id;
    if (bootstrap_get_unique_id(&id) != ncclSuccess) FAIL("bootstrap_get_unique_id failed");
    struct ncclComm *comm = calloc(1, sizeof(*comm));
    comm->rank = rank;
    comm->nranks = nranks;
    comm->cuda_dev = -1;
    comm->peers = calloc((size_t)nranks, sizeof(chorus_locality_t));
    if (bootstrap_init(&id, rank, nranks, &comm->bs_abort_flag, &comm->bs) != ncclSuccess)
        FAIL("bootstrap_init failed");
    if (topo_fill_locality(rank, -1, bootstrap_addr(comm->bs, rank), &comm->peers[rank]) !=
            ncclSuccess ||
        bootstrap_allgather(comm->bs, comm->peers, sizeof(chorus_locality_t)) != ncclSuccess)
        FAIL("locality exchange failed");
    comm_fill_transport_ctx(comm);
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    chorus_conn_t sc, rc;
    for (int step = 0; step < 2; step++) {
        ncclResult_t r = ((rank & 1) == 0) == (step == 0)
                             ? transport_connect(&comm->tctx, &sc, next, 1, -1, 300 + rank)
                             : transport_connect(&comm->tctx, &rc, prev, 0, -1, 300 + prev);
        if (r != ncclSuccess) FAIL("transport_connect failed: %s", ncclGetErrorString(r));
    }
    for (int e = 0; e < 2; e++) {
        int peer = e == 0 ? next : prev;
        const chorus_conn_t *c = e == 0 ? &sc : &rc;
        int remote = !locality_same_host(&comm->peers[rank], &comm->peers[peer]);
        if (remote && strcmp(c->ops->name, "tcp") != 0)
            FAIL("rank %d is on another host (%s) but got transport %s", peer,
                 comm->peers[peer].hostname, c->ops->name);
    }

    size_t sizes[] = {1, 4097, 300001, 16u << 20};
    size_t nmsg = sizeof(sizes) / sizeof(sizes[0]);
    size_t smsg = 0, soff = 0, rmsg = 0, roff = 0;
    chorus_waiter_t w;
    chorus_waiter_init(&w, NULL);
    for (;;) {
        int moved = 0;
        void *slot;
        const void *data;
        size_t bytes;
        int ready;
        if (smsg < nmsg) {
            if (sc.ops->send_acquire(&sc, sc.slot_bytes, &slot, &ready) != ncclSuccess)
                FAIL("send_acquire");
            if (ready) {
                size_t n = sizes[smsg] - soff < sc.slot_bytes ? sizes[smsg] - soff : sc.slot_bytes;
                for (size_t i = 0; i < n; i++)
                    ((uint8_t *)slot)[i] = pat(rank, smsg, soff + i);
                if (sc.ops->send_commit(&sc, n) != ncclSuccess) FAIL("send_commit");
                soff += n;
                if (soff == sizes[smsg]) smsg++, soff = 0;
                moved = 1;
            }
        }
        if (rmsg < nmsg) {
            if (rc.ops->recv_peek(&rc, &data, &bytes, &ready) != ncclSuccess) FAIL("recv_peek");
            if (ready) {
                size_t n = sizes[rmsg] - roff < rc.slot_bytes ? sizes[rmsg] - roff : rc.slot_bytes;
                if (bytes != n) FAIL("chunk of %zu bytes, expected %zu", bytes, n);
                for (size_t i = 0; i < n; i++)
                    if (((const uint8_t *)data)[i] != pat(prev, rmsg, roff + i))
                        FAIL("message %zu from rank %d: wrong byte at %zu", rmsg, prev, roff + i);
                if (rc.ops->recv_release(&rc) != ncclSuccess) FAIL("recv_release");
                roff += n;
                if (roff == sizes[rmsg]) rmsg++, roff = 0;
                moved = 1;
            }
        }
        int drained = 0;
        if (smsg == nmsg && sc.ops->send_drained(&sc, &drained) != ncclSuccess) FAIL("drained");
        if (drained && rmsg == nmsg) break;
        if (moved) {
            chorus_waiter_progress(&w);
        } else if (chorus_waiter_step(&w) != ncclSuccess) {
            FAIL("transfer timed out");
        }
    }
    printf("tcp_rank_main: rank %d on %s ok: to rank %d on %s via %s, from rank %d on %s via %s\n",
           rank, comm->peers[rank].hostname, next, comm->peers[next].hostname, sc.desc, prev,
           comm->peers[prev].hostname, rc.desc);
    if (bootstrap_barrier(comm->bs) != ncclSuccess) FAIL("barrier failed");
    transport_close(&sc);
    transport_close(&rc);
    if (bootstrap_barrier(comm->bs) != ncclSuccess) FAIL("barrier failed");
    bootstrap_close(comm->bs);
    return 0;
}
