/*
 * ch_direct.h: the direct mode of the collective kernel, written once for the host and the GPU:
 * ranks that are threads of one process on one device address each other's buffers, so each
 * rank does one share of the op, reading every input it needs and writing every output it
 * produces once, with no slots (the host engine's direct.c, as a kernel):
 *   all-reduce      rank r folds slice r of all n inputs in rank order (one rounding, as
 *                   rk_reduce_n), applies post() and writes slice r of all n outputs;
 *   reduce-scatter  rank r folds block r of all n inputs into its own output;
 *   all-gather      rank r copies its input into block r of all n outputs (each input byte read
 *                   once: pulling every peer's input into its own output reads each n - 1 times);
 *   broadcast       rank r copies slice r of the root's buffer into slice r of all n outputs.
 * Slices are count / n elements rounded up to 64 bytes; a rank's share is cut the same way into
 * one part per block (channel) of its launch.
 *
 * Synchronisation lives in a table in device memory, one entry per (channel, rank), written by
 * that rank's block of that channel only:
 *   ready  the op (seq) the entry describes: the header words, the rank's sendbuff and recvbuff
 *          and its reduction's scalar, stored before ready (release)
 *   done   the op whose part this block finished (release, after every thread's stores)
 * Block c of rank r: takes seq from its counter (device memory, so a graph replay counts too),
 * writes its entry and ready = seq; waits until every peer's ready reaches seq (acquire) and
 * checks every peer's header against its own before touching any buffer (ranks that disagree all
 * see a mismatch: any two that differ differ from every third or from each other); moves its
 * part; publishes done = seq; and waits until every peer's done reaches seq, so when its launch
 * ends nobody reads its input or writes its output any more. One entry a rank is enough: a rank
 * starts op seq + 1 only after every peer published done = seq, and a peer reads entries only
 * before that, so no entry is rewritten while someone still reads it.
 *
 * Waits use the slot protocol's ch_poll (error word each spin; host: deadline and yield; GPU:
 * short sleeps, the host's drain ends it by writing the error word). While waiting for ready a
 * block also watches the slot connections into it on its channel: an unread op header there
 * means a peer is in a slot op (a ring collective, a send) where this rank runs a direct op, a
 * mismatch (a peer cannot legitimately be past this op before this rank published done).
 */
#ifndef CHORUS_DEVICE_CH_DIRECT_H_
#define CHORUS_DEVICE_CH_DIRECT_H_

#include "ch_plan.h"
#include "ch_proto.h"

#define CH_DIR_MAX_RANKS 64

typedef struct {
    uint64_t ready;
    uint64_t hdr[4]; /* ch_hdr_store's words */
    uint64_t send, recv;
    uint64_t scalar; /* the rank's scalar, in the executor's form (GPU: the kernel's C value) */
    uint64_t done, pad[7];
} ch_dir_ent_t;

/* Whether the direct mode has this collective. */
CH_FN int ch_dir_coll(int coll) {
    return coll == CH_COLL_ALLREDUCE || coll == CH_COLL_REDUCESCATTER ||
           coll == CH_COLL_ALLGATHER || coll == CH_COLL_BROADCAST;
}

/* Rank r's share [*beg, *end) in its own element coordinates (all-reduce and broadcast: offsets
 * into the buffers; reduce-scatter and all-gather: offsets into a block). */
CH_FN void ch_dir_share(const ch_plan_t *p, int r, size_t *beg, size_t *end) {
    if (p->coll == CH_COLL_ALLREDUCE || p->coll == CH_COLL_BROADCAST) {
        const size_t per = ch_align_up(ch_div_up(p->count, (size_t)p->nranks), 64 / p->esize);
        *beg = ch_min(p->count, (size_t)r * per);
        *end = ch_min(p->count, *beg + per);
    } else {
        *beg = 0;
        *end = p->count;
    }
}

/* Block c's part [*beg, *end) of this rank's share. */
CH_FN void ch_dir_part(const ch_plan_t *p, int c, size_t *beg, size_t *end) {
    size_t b, e;
    ch_dir_share(p, p->rank, &b, &e);
    const size_t len = e - b;
    const size_t per = ch_align_up(ch_div_up(len, (size_t)p->nch), 64 / p->esize);
    *beg = b + ch_min(len, (size_t)c * per);
    *end = b + ch_min(len, (size_t)(c + 1) * per);
}

/* The sources (src[i], whose reduction scalar is rank srank[i]'s) and destinations of the
 * elements from `off` of this rank's share, as byte addresses, given every rank's buffers. */
typedef struct {
    int nsrc, ndst;
    const char *src[CH_DIR_MAX_RANKS];
    char *dst[CH_DIR_MAX_RANKS];
    int srank[CH_DIR_MAX_RANKS];
} ch_dir_ptrs_t;

CH_FN void ch_dir_ptrs(const ch_plan_t *p, const uint64_t *sends, const uint64_t *recvs, size_t off,
                       ch_dir_ptrs_t *d) {
    const int n = p->nranks, r = p->rank;
    const size_t es = p->esize, blk = (size_t)r * p->count * es, o = off * es;
    d->nsrc = d->ndst = 0;
    switch (p->coll) {
    case CH_COLL_ALLREDUCE:
    case CH_COLL_REDUCESCATTER: {
        const size_t in = p->coll == CH_COLL_ALLREDUCE ? o : blk + o;
        for (int q = 0; q < n; q++) {
            d->srank[d->nsrc] = q;
            d->src[d->nsrc++] = (const char *)(uintptr_t)sends[q] + in;
        }
        if (p->coll == CH_COLL_REDUCESCATTER) {
            d->dst[d->ndst++] = (char *)(uintptr_t)recvs[r] + o;
            return;
        }
        for (int q = 0; q < n; q++)
            d->dst[d->ndst++] = (char *)(uintptr_t)recvs[q] + o;
        return;
    }
    default: { /* all-gather, broadcast: one source; a destination that is it stays as it is */
        const int from = p->coll == CH_COLL_ALLGATHER ? r : p->root;
        const size_t out = p->coll == CH_COLL_ALLGATHER ? blk + o : o;
        d->srank[0] = from;
        d->src[0] = (const char *)(uintptr_t)sends[from] + o;
        d->nsrc = 1;
        for (int q = 0; q < n; q++) {
            char *dst = (char *)(uintptr_t)recvs[q] + out;
            if (dst != d->src[0]) d->dst[d->ndst++] = dst;
        }
        return;
    }
    }
}

/* Rank r's entry of op h.seq, then ready = seq (release: a peer that sees ready sees the rest). */
CH_FN void ch_dir_publish(ch_dir_ent_t *e, const ch_op_hdr_t *h, const void *send, const void *recv,
                          uint64_t scalar) {
    ch_hdr_store(e->hdr, h);
    ch_st_relaxed(&e->send, (uint64_t)(uintptr_t)send);
    ch_st_relaxed(&e->recv, (uint64_t)(uintptr_t)recv);
    ch_st_relaxed(&e->scalar, scalar);
    ch_st_release(&e->ready, h->seq);
}

/* An op header a slot connection carries to this rank and it has not read: the sender runs a
 * slot op. conn: the [src][dst] views of the channel (NULL: none), or ones without a control
 * block. */
CH_FN int ch_dir_slot_hdr_waiting(const ch_conn_t *conns, int n, int q, int r) {
    if (conns == 0) return 0;
    const ch_conn_t *k = &conns[(size_t)q * n + r];
    if (k->ctrl == 0) return 0;
    return ch_ld_acquire(&k->ctrl->hdr_seq) > ch_ld_relaxed(&k->ctrl->hdr_ack);
}

/* Wait until every peer's entry describes op h->seq, then check every header; sends, recvs and
 * scalars get every rank's. ents: the channel's [n] entries. CH_ERR_MISMATCH (set in the error
 * word) when some rank called another op. */
CH_FN uint32_t ch_dir_wait_ready(ch_dir_ent_t *ents, int n, int r, const ch_op_hdr_t *h,
                                 const ch_conn_t *conns, ch_wait_t *w, uint64_t *sends,
                                 uint64_t *recvs, uint64_t *scalars) {
    for (int q = 0; q < n; q++) {
        if (q == r) continue;
        while (ch_ld_acquire(&ents[q].ready) < h->seq) {
            if (ch_dir_slot_hdr_waiting(conns, n, q, r))
                return ch_set_once32(w->err, CH_ERR_MISMATCH);
            ch_wait_note(w, q);
            uint32_t e = ch_poll(w);
            if (e) return e;
        }
    }
    for (int q = 0; q < n; q++) {
        ch_dir_ent_t *e = &ents[q];
        ch_op_hdr_t peer;
        ch_hdr_load(e->hdr, &peer);
        if (!ch_hdr_agree(h, &peer, h->root)) return ch_set_once32(w->err, CH_ERR_MISMATCH);
        sends[q] = ch_ld_relaxed(&e->send);
        recvs[q] = ch_ld_relaxed(&e->recv);
        scalars[q] = ch_ld_relaxed(&e->scalar);
    }
    return CH_OK;
}

/* This block's part is done (release: its stores into the peers' outputs come first), then wait
 * until every peer's is. */
CH_FN uint32_t ch_dir_finish(ch_dir_ent_t *ents, int n, int r, uint64_t seq, ch_wait_t *w) {
    ch_st_release(&ents[r].done, seq);
    for (int q = 0; q < n; q++) {
        while (ch_ld_acquire(&ents[q].done) < seq) {
            ch_wait_note(w, q);
            uint32_t e = ch_poll(w);
            if (e) return e;
        }
    }
    return CH_OK;
}

#endif
