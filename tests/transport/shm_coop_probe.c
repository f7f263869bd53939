/*
 * shm_coop_probe.c: see shm_coop_probe.h. Test-only glue; it reaches into the shm transport's
 * private header on purpose, to drive and observe the cooperative copy.
 */
#include "shm_coop_probe.h"

#include <stdlib.h>
#include <string.h>

#include "../../src/transport/shm/shm.h"

struct shm_coop_pair {
    shm_ctrl_t *ctrl;
    size_t ctrl_bytes;
    shm_conn_t recv, send;
    chorus_conn_t rconn, sconn;
};

shm_coop_pair_t *shm_coop_pair_new(size_t block, int recv_cma, int recv_peer_pid, int send_cma,
                                   int send_peer_pid) {
    shm_coop_pair_t *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->ctrl_bytes = shm_ctrl_bytes(1);
    p->ctrl = aligned_alloc(4096, p->ctrl_bytes);
    if (!p->ctrl) {
        free(p);
        return NULL;
    }
    memset(p->ctrl, 0, p->ctrl_bytes);
    p->ctrl->nslots = 1;
    p->recv.fd = p->send.fd = -1;
    p->recv.ctrl = p->send.ctrl = p->ctrl;
    p->send.is_send = 1;
    p->recv.cma = recv_cma;
    p->recv.peer_pid = recv_peer_pid;
    p->send.cma = send_cma;
    p->send.peer_pid = send_peer_pid;
    p->recv.coop_block = block;
    p->send.coop = 1;
    atomic_store(&p->ctrl->coop.helper, SHM_COOP_ON);
    p->rconn.priv = &p->recv;
    p->rconn.peer = 0;
    p->rconn.channel = -1;
    p->sconn.priv = &p->send;
    p->sconn.peer = 1;
    p->sconn.is_send = 1;
    p->sconn.channel = -1;
    return p;
}

void shm_coop_pair_free(shm_coop_pair_t *p) {
    if (!p) return;
    free(p->ctrl);
    free(p);
}

void shm_coop_pair_set_liveness(shm_coop_pair_t *p, int peer_pid, int pid_ok) {
    p->recv.peer_pid = peer_pid;
    p->recv.peer_pid_ok = pid_ok;
}

int shm_coop_pair_wanted(shm_coop_pair_t *p, size_t bytes) {
    return shm_coop_wanted(&p->recv, bytes);
}

uint32_t shm_coop_pair_open(shm_coop_pair_t *p, void *dst, const void *src, size_t bytes) {
    shm_coop_open(&p->recv, dst, (uint64_t)(uintptr_t)src, bytes);
    return p->recv.coop_nblocks;
}

int shm_coop_pair_work(shm_coop_pair_t *p, uint32_t max_blocks) {
    return (int)shm_coop_work(&p->rconn, &p->recv, max_blocks);
}

int shm_coop_pair_help(shm_coop_pair_t *p, uint32_t max_blocks) {
    return (int)shm_coop_help(&p->sconn, &p->send, max_blocks);
}

int shm_coop_pair_finish(shm_coop_pair_t *p) {
    return (int)shm_coop_finish(&p->rconn, &p->recv);
}

int shm_coop_pair_read(shm_coop_pair_t *p, void *dst, const void *src, size_t bytes) {
    return (int)shm_coop_read(&p->rconn, &p->recv, dst, (uint64_t)(uintptr_t)src, bytes);
}

long shm_coop_pair_claim_only(shm_coop_pair_t *p) {
    shm_coop_t *co = &p->ctrl->coop;
    uint64_t w = atomic_load(&co->claim);
    while ((uint32_t)w < atomic_load(&co->nblocks))
        if (atomic_compare_exchange_weak(&co->claim, &w, w + 1)) return (long)(uint32_t)w;
    return -1;
}

uint64_t shm_coop_pair_sender_blocks(shm_coop_pair_t *p) {
    return p->send.coop_helped_blocks;
}

uint64_t shm_coop_pair_receiver_blocks(shm_coop_pair_t *p) {
    return p->recv.coop_own_blocks;
}

int shm_coop_pair_sender_helps(shm_coop_pair_t *p) {
    return p->send.coop;
}

static const shm_conn_t *shm_probe_sc(const chorus_conn_t *conn) {
    return conn && conn->ops && strcmp(conn->ops->name, "shm") == 0 ? conn->priv : NULL;
}

int shm_probe_coop_busy(const chorus_conn_t *conn) {
    const shm_conn_t *sc = shm_probe_sc(conn);
    return sc ? sc->coop_busy : 0;
}

int shm_probe_coop_helps(const chorus_conn_t *conn) {
    const shm_conn_t *sc = shm_probe_sc(conn);
    return sc ? sc->coop : 0;
}

uint64_t shm_probe_sender_blocks(const chorus_conn_t *conn) {
    const shm_conn_t *sc = shm_probe_sc(conn);
    return sc ? sc->coop_helped_blocks : 0;
}

uint64_t shm_probe_receiver_blocks(const chorus_conn_t *conn) {
    const shm_conn_t *sc = shm_probe_sc(conn);
    return sc ? sc->coop_own_blocks : 0;
}

int shm_probe_helped_in_open_request(const chorus_conn_t *conn) {
    const shm_conn_t *sc = shm_probe_sc(conn);
    if (!sc || !sc->ctrl) return 0;
    shm_ctrl_t *c = sc->ctrl;
    return sc->coop_open && atomic_load_explicit(&c->coop.helped, memory_order_acquire) > 0;
}
