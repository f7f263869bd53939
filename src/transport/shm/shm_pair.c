/*
 * shm_pair.c: credits that ride on the reverse connection.
 *
 * A sender learns that slots are free from the head counter its receiver stores; reading it is a
 * cache-line transfer from the receiver's core, so the sender reads it only when its cached
 * value says the ring is full (once per nslots steps). In a ping-pong (a small all-reduce between
 * two ranks) that read sits on the path of every nslots-th message.
 *
 * Two ranks that exchange messages both ways on the same channel have a connection in each
 * direction. The two ends that live in one rank, the send end A->B and the receive end B->A,
 * form a pair (shm_pair_t): every chunk A publishes to B carries, in its slot header line, how
 * many of B's chunks A has released (ack). When B peeks that chunk it hands the ack to its own
 * send end B->A, which takes it as credit before it reads A's head. The line is one B reads
 * anyway, so in a ping-pong the head is never read.
 *
 * Pairs form at connect time from a per-process registry keyed by (communicator, peer, channel),
 * only when the key has exactly one send end and one receive end. A paired send end A->B writes
 * into the A->B segment which connection its acks are about (ack_for = the B->A segment's
 * pair_id). B's receive end A->B passes acks on to its send end B->A only once it has seen,
 * in the A->B segment, that they are about B->A; so ranks that paired differently, or not at
 * all, fall back to the head counter, never to a wrong credit. An ack is a full 64-bit step
 * count, and one never exceeds what the receiver released, so an old one only gives less
 * credit.
 *
 * Ordering: the receive end stores `released` with release after it is done with a slot; the
 * send end loads it with acquire before its seq release store; the peer loads seq with acquire
 * before it reads ack and stores peer_ack with release; its send end loads peer_ack with acquire
 * before it writes the slot. Every link is a release/acquire pair, so the peer's writes into a
 * slot come after our reads of it.
 */
#include <pthread.h>
#include <stdlib.h>

#include "check.h"
#include "util.h"
#include "shm.h"

typedef struct shm_reg {
    const void *ctx; /* the owning communicator's transport context */
    int peer, channel, is_send;
    shm_conn_t *sc;
    struct shm_reg *next;
} shm_reg_t;

static pthread_mutex_t shm_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static shm_reg_t *shm_reg_head;

static int shm_reg_same_key(const shm_reg_t *r, const void *ctx, int peer, int channel) {
    return r->ctx == ctx && r->peer == peer && r->channel == channel;
}

void shm_pair_register(chorus_conn_t *conn, shm_conn_t *sc) {
    shm_reg_t *me = calloc(1, sizeof(*me));
    if (me == NULL) return; /* no pairing: the head counter still works */
    me->ctx = conn->ctx;
    me->peer = conn->peer;
    me->channel = conn->channel;
    me->is_send = conn->is_send;
    me->sc = sc;
    pthread_mutex_lock(&shm_reg_lock);
    shm_reg_t *other = NULL;
    int others = 0, twins = 0;
    for (shm_reg_t *r = shm_reg_head; r; r = r->next) {
        if (!shm_reg_same_key(r, conn->ctx, conn->peer, conn->channel)) continue;
        if (r->is_send == conn->is_send) {
            twins++;
        } else {
            other = r;
            others++;
        }
    }
    me->next = shm_reg_head;
    shm_reg_head = me;
    if (twins == 0 && others == 1 && other->sc->pair == NULL) {
        shm_pair_t *p = chorus_calloc_lines(sizeof(*p));
        if (p != NULL) {
            shm_conn_t *send = conn->is_send ? sc : other->sc;
            shm_conn_t *recv = conn->is_send ? other->sc : sc;
            p->refs = 2;
            p->send_id = send->ctrl->pair_id;
            send->pair = p;
            recv->pair = p;
            /* Tell the peer, in the segment we send on, which connection our acks are about. */
            atomic_store_explicit(&send->ctrl->ack_for, recv->ctrl->pair_id,
                                  memory_order_release);
        }
    }
    pthread_mutex_unlock(&shm_reg_lock);
}

/* The counters of closed connections (under the registry lock); open ones keep their own. */
static uint64_t shm_stat_closed_ack_credits, shm_stat_closed_head_loads;

static inline void shm_stat_bump(_Atomic uint64_t *c) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

void shm_pair_stats(uint64_t *ack_credits_p, uint64_t *head_loads_p) {
    pthread_mutex_lock(&shm_reg_lock);
    uint64_t a = shm_stat_closed_ack_credits, h = shm_stat_closed_head_loads;
    for (shm_reg_t *r = shm_reg_head; r; r = r->next) {
        a += atomic_load_explicit(&r->sc->stat_ack_credits, memory_order_relaxed);
        h += atomic_load_explicit(&r->sc->stat_head_loads, memory_order_relaxed);
    }
    pthread_mutex_unlock(&shm_reg_lock);
    *ack_credits_p = a;
    *head_loads_p = h;
}

void shm_pair_count_head_load(shm_conn_t *sc) {
    shm_stat_bump(&sc->stat_head_loads);
}

void shm_pair_credit(chorus_conn_t *conn, shm_conn_t *sc) {
    uint64_t a = atomic_load_explicit(&sc->pair->peer_ack, memory_order_acquire);
    if (a > sc->cached && a <= conn->step) {
        sc->cached = a;
        shm_stat_bump(&sc->stat_ack_credits);
    }
}


void shm_pair_unregister(shm_conn_t *sc) {
    pthread_mutex_lock(&shm_reg_lock);
    for (shm_reg_t **pp = &shm_reg_head; *pp; pp = &(*pp)->next) {
        if ((*pp)->sc != sc) continue;
        shm_stat_closed_ack_credits +=
            atomic_load_explicit(&sc->stat_ack_credits, memory_order_relaxed);
        shm_stat_closed_head_loads +=
            atomic_load_explicit(&sc->stat_head_loads, memory_order_relaxed);
        shm_reg_t *dead = *pp;
        *pp = dead->next;
        free(dead);
        break;
    }
    shm_pair_t *p = sc->pair;
    sc->pair = NULL;
    if (p && --p->refs == 0) free(p);
    pthread_mutex_unlock(&shm_reg_lock);
}
