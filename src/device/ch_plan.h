/*
 * ch_plan.h: the plain description of one op that every schedule reads, and the step it yields.
 *
 * A schedule is a function of (plan, channel, step index within a loop, loop range) and nothing
 * else, so the host engine, the CPU executor and the GPU kernel can all run the same code. The
 * channel split and the loop sizes follow the host engine's ring planning (coll_ring.h): the op's
 * elements are cut into nch slices of equal size rounded up to 64 bytes (the last takes the
 * rest), each slice into loops of loop_elems elements; a loop takes loop_steps steps.
 */
#ifndef CHORUS_DEVICE_CH_PLAN_H_
#define CHORUS_DEVICE_CH_PLAN_H_

#include "ch_hd.h"

/* Collectives (the values of the op header's coll field). */
enum {
    CH_COLL_ALLREDUCE = 0,
    CH_COLL_REDUCESCATTER,
    CH_COLL_ALLGATHER,
    CH_COLL_BROADCAST,
    CH_COLL_REDUCE,
    CH_COLL_SENDRECV,
    CH_COLL_ALLTOALL,
    CH_COLL_COUNT
};

/* A CH_COLL_* for messages. */
CH_FN const char *ch_coll_name(uint32_t coll) {
    return coll == CH_COLL_ALLREDUCE       ? "all-reduce"
           : coll == CH_COLL_REDUCESCATTER ? "reduce-scatter"
           : coll == CH_COLL_ALLGATHER     ? "all-gather"
           : coll == CH_COLL_BROADCAST     ? "broadcast"
           : coll == CH_COLL_REDUCE        ? "reduce"
           : coll == CH_COLL_SENDRECV      ? "send/receive"
           : coll == CH_COLL_ALLTOALL      ? "all-to-all"
                                           : "?";
}

/* What one step does with its chunk. slot: the send connection's slot; recv: the received
 * chunk; in/dst: the op's buffers at the step's offsets; pre/post: the reduction's first
 * contribution and final step (reduce.h). */
enum {
    CH_K_SEND = 0,              /* slot = in */
    CH_K_SEND_COPY,             /* slot = in, dst = in */
    CH_K_PREP_SEND,             /* slot = pre(in) */
    CH_K_RECV,                  /* dst = recv */
    CH_K_RECV_REDUCE_SEND,      /* slot = pre(in) (+) recv */
    CH_K_RECV_REDUCE_COPY,      /* dst = post(pre(in) (+) recv) */
    CH_K_RECV_REDUCE_COPY_SEND, /* dst = post(pre(in) (+) recv), slot = dst */
    CH_K_RECV_COPY_SEND,        /* dst = recv, slot = recv */
    CH_K_SEND_RECV,             /* slot = in, dst = recv (two peers) */
    CH_K_COPY,                  /* dst = in (no peer) */
    CH_K_LOCAL_REDUCE,          /* dst = post(pre(in)) (no peer: a single rank) */
    CH_K_COUNT
};

#define CH_NONE ((size_t)-1)

typedef struct {
    int coll; /* CH_COLL_* */
    int nranks, rank;
    int root;           /* broadcast, reduce */
    int send_peer;      /* send/recv: the rank this one sends to (-1: none) */
    int recv_peer;      /* send/recv: the rank this one receives from (-1: none) */
    int nch;            /* channels the op uses (ch_plan_channels) */
    int inplace;        /* all-gather: sendbuff is this rank's block of recvbuff; broadcast:
                           sendbuff == recvbuff */
    size_t count;       /* elements per rank (all-gather, reduce-scatter, all-to-all: per block) */
    size_t esize;       /* element size */
    size_t chunk_elems; /* elements per chunk, a multiple of 64 bytes */
    const int *ring;    /* ring[c * nranks + pos]: the rank at position pos of channel c's ring */
} ch_plan_t;

typedef struct {
    int kind;       /* CH_K_* */
    int send_peer;  /* -1: no send */
    int recv_peer;  /* -1: no receive */
    size_t in_off;  /* element offset into sendbuff (CH_NONE: not read) */
    size_t out_off; /* element offset into recvbuff (CH_NONE: not written) */
    size_t count;   /* elements */
} ch_step_t;

/* Where a channel stands: the loop's first element and the step within the loop. */
typedef struct {
    size_t base;
    long k;
} ch_iter_t;

CH_FN size_t ch_min(size_t a, size_t b) {
    return a < b ? a : b;
}
CH_FN size_t ch_div_up(size_t a, size_t b) {
    return (a + b - 1) / b;
}
CH_FN size_t ch_align_up(size_t a, size_t b) {
    return ch_div_up(a, b) * b;
}
CH_FN long ch_mod(long a, long n) {
    return ((a % n) + n) % n;
}

/* Chunks a loop of the collective moves per channel (all-reduce: one per rank). */
CH_FN size_t ch_loop_chunks(int coll, int nranks) {
    return coll == CH_COLL_ALLREDUCE ? (size_t)nranks : 1;
}

/* Channels an op of `count` elements uses: one per full loop, 1 .. max_ch. */
CH_FN int ch_plan_channels(int coll, int nranks, size_t count, size_t chunk_elems, int max_ch) {
    size_t n = count / (chunk_elems * ch_loop_chunks(coll, nranks));
    if (n < 1) n = 1;
    if (n > (size_t)max_ch) n = (size_t)max_ch;
    return (int)n;
}

/* Elements per chunk for slots of `room` bytes: whole 64-byte lines, at least one. */
CH_FN size_t ch_plan_chunk_elems(size_t room, size_t esize) {
    size_t n = room / 64 * (64 / esize);
    return n ? n : 64 / esize;
}

/* Elements per chunk for an op of `count` elements: just enough that its loops fill max_ch
 * channels, in whole 64-byte lines, at least min_room bytes and at most room bytes (a slot), so
 * a mid-sized op is spread over every channel in smaller chunks instead of a few whole slots. */
CH_FN size_t ch_plan_fit_chunk(int coll, int nranks, size_t count, size_t esize, size_t room,
                               size_t min_room, int max_ch) {
    const size_t line = 64 / esize;
    const size_t loops = ch_loop_chunks(coll, nranks) * (size_t)max_ch;
    const size_t hi = ch_plan_chunk_elems(room, esize), lo = ch_plan_chunk_elems(min_room, esize);
    size_t want = (count + loops - 1) / loops;
    want = (want + line - 1) / line * line;
    if (want < lo) want = lo;
    if (want > hi) want = hi;
    return want;
}

/* Whether an op runs in place: all-gather's sendbuff is this rank's block of recvbuff, every
 * other collective's sendbuff is recvbuff. */
CH_FN int ch_plan_inplace(int coll, const void *sendbuff, const void *recvbuff, int rank,
                          size_t count, size_t esize) {
    if (coll == CH_COLL_ALLGATHER)
        return sendbuff == (const char *)recvbuff + (size_t)rank * count * esize;
    return sendbuff == recvbuff;
}

/* Channel c's slice [*beg, *end) of the op's elements. */
CH_FN void ch_chan_range(const ch_plan_t *p, int c, size_t *beg, size_t *end) {
    const size_t per = ch_align_up(ch_div_up(p->count, (size_t)p->nch), 64 / p->esize);
    *beg = ch_min(p->count, (size_t)c * per);
    *end = ch_min(p->count, (size_t)(c + 1) * per);
}

/* This rank's position on channel c's ring, and the rank at position pos. */
CH_FN long ch_ring_pos(const ch_plan_t *p, int c, int rank) {
    for (int i = 0; i < p->nranks; i++)
        if (p->ring[(size_t)c * p->nranks + i] == rank) return i;
    return -1;
}
CH_FN int ch_ring_rank(const ch_plan_t *p, int c, long pos) {
    return p->ring[(size_t)c * p->nranks + ch_mod(pos, p->nranks)];
}

/* The ring neighbours of this rank on channel c. */
CH_FN int ch_ring_next(const ch_plan_t *p, int c) {
    return ch_ring_rank(p, c, ch_ring_pos(p, c, p->rank) + 1);
}
CH_FN int ch_ring_prev(const ch_plan_t *p, int c) {
    return ch_ring_rank(p, c, ch_ring_pos(p, c, p->rank) - 1);
}

/* A step on channel c: the context every schedule function gets. */
typedef struct {
    int c;
    long pos;      /* this rank's ring position */
    long root_pos; /* rooted ops: the root's ring position (else -1) */
    long k;        /* step within the loop */
    size_t base;   /* the loop's first element */
    size_t len;    /* elements the loop covers */
} ch_at_t;

CH_FN void ch_step_init(ch_step_t *s) {
    s->kind = CH_K_COPY;
    s->send_peer = -1;
    s->recv_peer = -1;
    s->in_off = CH_NONE;
    s->out_off = CH_NONE;
    s->count = 0;
}

/* The step uses the ring's receive and/or send side (the host engine's RX/TX). */
enum { CH_RX = 1, CH_TX = 2 };

CH_FN void ch_ring_peers(const ch_plan_t *p, const ch_at_t *at, int uses, ch_step_t *s) {
    s->recv_peer = uses & CH_RX ? ch_ring_rank(p, at->c, at->pos - 1) : -1;
    s->send_peer = uses & CH_TX ? ch_ring_rank(p, at->c, at->pos + 1) : -1;
}

#endif
