/*
 * ch_proto.h: the slot protocol between two ranks, written once for the host and the GPU.
 *
 * A connection carries one direction (sender -> receiver) of one channel. Its control block has
 * four counters, each on a line of its own and each written by one side only:
 *   head     steps the sender has published        (sender)
 *   tail     steps the receiver has consumed       (receiver)
 *   hdr_seq  op headers the sender has written     (sender; the header words share its line)
 *   hdr_ack  op headers the receiver has checked   (receiver)
 * Counters only grow and persist across ops (and, on the GPU, across launches): step s uses slot
 * s % nslots. The sender waits until head - tail < nslots (acquire on tail: the receiver's reads
 * of the slot are done), writes the slot and publishes head = s + 1 (release). The receiver waits
 * until head > s (acquire: the slot's bytes are visible), reads the slot and releases tail.
 *
 * Two payload formats share those counters:
 *  - SIMPLE: the slot holds the chunk's bytes; the counters say when they are there.
 *  - LL (low latency, small messages): the slot is a run of 16-byte lines, each two 8-byte words
 *    of {4 data bytes, 4 flag bytes}; the flag is (uint32_t)(s + 1). A word is written and read
 *    as one 64-bit access, so a reader that sees the flag sees the data with it: the receiver
 *    needs no head counter and no acquire, one round trip less than SIMPLE. The sender still
 *    waits on tail before it reuses a slot. A stale word from the slot's previous use carries
 *    the flag of step s - nslots, never s + 1.
 *
 * Every wait polls the error word (shared by all ranks of the communicator; 0 while running) in
 * each spin, and every CH_SPIN_CHECK spins calls the side's check: on the host
 * ch_host_spin_check (yields the CPU and turns the spin count into a deadline, setting
 * CH_ERR_TIMEOUT once it passes), on the GPU a short sleep: a kernel cannot read a
 * clock deadline cheaply, so the host ends its waits from outside by writing the word
 * (CH_ERR_ABORT for ncclCommAbort, CH_ERR_TIMEOUT once its own deadline passes).
 *
 * Op header: before the first chunk of an op, each connection the op uses carries the sender's
 * header (collective, dtype, op, count, root, seq). The receiver compares it with its own; a
 * mismatch sets the error word to CH_ERR_MISMATCH, which releases every rank's waits, and the
 * host reports ncclInvalidUsage. Each rank checks every connection it receives on, and in a ring
 * every edge carries a header (rooted chains included), so ranks that disagree meet on some edge.
 */
#ifndef CHORUS_DEVICE_CH_PROTO_H_
#define CHORUS_DEVICE_CH_PROTO_H_

#include "ch_hd.h"

/* Error word values. CH_ERR_CUDA: a CUDA call that enqueues a program's operation failed;
 * CH_ERR_PEER: a peer process ended while others still waited for it (ranks in processes: the
 * host's watchdog sets it). */
enum {
    CH_OK = 0,
    CH_ERR_ABORT = 1,
    CH_ERR_MISMATCH = 2,
    CH_ERR_TIMEOUT = 3,
    CH_ERR_CUDA = 4,
    CH_ERR_PEER = 5
};
enum { CH_PROTO_SIMPLE = 0, CH_PROTO_LL = 1 };

/* Spins between two calls of the side's check. */
#if defined(__CUDA_ARCH__)
#define CH_SPIN_CHECK 1024u
#else
#define CH_SPIN_CHECK 8u
#endif

typedef struct {
    uint64_t head, pad0[7];
    uint64_t tail, pad1[7];
    uint64_t hdr_seq, hdr[4], pad2[3];
    uint64_t hdr_ack, pad3[7];
} ch_ctrl_t;

/* One direction of one channel; plain pointers (host memory for the CPU executor, device or
 * mapped memory for a kernel). */
typedef struct {
    ch_ctrl_t *ctrl;
    char *buf;    /* SIMPLE: nslots slots of slot_bytes */
    uint64_t *ll; /* LL: nslots slots of ll_words 8-byte words */
    uint32_t nslots;
    uint32_t ll_words; /* even: 2 words a line, 8 data bytes a line */
    size_t slot_bytes;
    int32_t src, dst; /* the ranks at its ends (a wait notes whom it waits for) */
    /* NULL, or nslots words the sender fills with each step's size word before publishing it
     * (entry s % nslots): a host proxy that forwards the connection to another host reads there
     * how much of the slot step s carries, and in which format (CH_SIZE_LL). */
    uint64_t *sizes;
} ch_conn_t;

typedef struct {
    uint32_t coll, dtype, redop, root;
    uint64_t count, seq;
} ch_op_hdr_t;

typedef struct ch_wait {
    uint32_t *err; /* the communicator's error word */
    uint32_t spins;
    void *host; /* the host side's deadline state (ch_host_spin_check) */
    /* Memory a host watchdog reads, or NULL: the rank (+ 1) this block last spun waiting for,
     * stored when it changes (noted: the last value stored), so that a peer found dead is
     * blamed only by blocks that wait for it. */
    uint64_t *note;
    uint64_t noted;
} ch_wait_t;

#if !defined(__CUDA_ARCH__)
#ifdef __cplusplus
extern "C" {
#endif
/* Host side of the spin check: yields, and past the deadline sets CH_ERR_TIMEOUT. Returns the
 * error word's value (0: keep spinning). */
uint32_t ch_host_spin_check(ch_wait_t *w);
#ifdef __cplusplus
}
#endif
#endif

/* A wait for rank peer spins: note whom it waits for (see ch_wait_t.note). On the GPU thread 0
 * of the block alone (it runs the header exchange and the SIMPLE waits; the other threads' LL
 * waits would each cross the bus). */
CH_FN void ch_wait_note(ch_wait_t *w, int32_t peer) {
    const uint64_t v = (uint64_t)(uint32_t)peer + 1;
#if defined(__CUDA_ARCH__)
    if (threadIdx.x != 0) return;
#endif
    if (w->note == NULL || w->noted == v) return;
    w->noted = v;
    ch_st_relaxed(w->note, v);
}

CH_FN uint32_t ch_poll(ch_wait_t *w) {
    uint32_t e = ch_ld32_relaxed(w->err);
    if (e) return e;
    if (++w->spins < CH_SPIN_CHECK) return 0;
    w->spins = 0;
#if defined(__CUDA_ARCH__)
    __nanosleep(64);
    return 0;
#else
    return ch_host_spin_check(w);
#endif
}

/* ---- SIMPLE ------------------------------------------------------------------------------- */

/* Sender: wait until the slot of the next step is free; *step_p gets the step. */
CH_FN uint32_t ch_send_wait(const ch_conn_t *c, ch_wait_t *w, uint64_t *step_p) {
    const uint64_t s = ch_ld_relaxed(&c->ctrl->head); /* written by this side only */
    while (s - ch_ld_acquire(&c->ctrl->tail) >= c->nslots) {
        ch_wait_note(w, c->dst);
        uint32_t e = ch_poll(w);
        if (e) return e;
    }
    *step_p = s;
    return CH_OK;
}

CH_FN char *ch_slot(const ch_conn_t *c, uint64_t s) {
    return c->buf + (size_t)(s % c->nslots) * c->slot_bytes;
}

/* A step's size word (ch_conn_t.sizes): its payload bytes, with CH_SIZE_LL set for an LL step. */
#define CH_SIZE_LL (1ull << 63)

/* Sender: step s is in its slot; size: its size word (ch_conn_t.sizes). */
CH_FN void ch_send_publish(const ch_conn_t *c, uint64_t s, uint64_t size) {
    if (c->sizes != NULL) ch_st_relaxed(&c->sizes[s % c->nslots], size);
    ch_st_release(&c->ctrl->head, s + 1);
}

/* Receiver: wait until step *step_p (the next one) is published. */
CH_FN uint32_t ch_recv_wait(const ch_conn_t *c, ch_wait_t *w, uint64_t *step_p) {
    const uint64_t s = ch_ld_relaxed(&c->ctrl->tail); /* written by this side only */
    while (ch_ld_acquire(&c->ctrl->head) <= s) {
        ch_wait_note(w, c->src);
        uint32_t e = ch_poll(w);
        if (e) return e;
    }
    *step_p = s;
    return CH_OK;
}

/* Receiver: the slot of step s may be reused. */
CH_FN void ch_recv_release(const ch_conn_t *c, uint64_t s) {
    ch_st_release(&c->ctrl->tail, s + 1);
}

/* A load of peer-written data that no cache of this side may answer from a stale copy. */
CH_FN uint64_t ch_ld_volatile(const uint64_t *p) {
#if defined(__CUDA_ARCH__)
    return __ldcv((const unsigned long long *)p);
#else
    return *(const volatile uint64_t *)p;
#endif
}

/* ---- LL ----------------------------------------------------------------------------------- */

/* Bytes one LL slot carries. */
CH_FN size_t ch_ll_capacity(const ch_conn_t *c) {
    return (size_t)c->ll_words * 4;
}

CH_FN uint64_t *ch_ll_slot(const ch_conn_t *c, uint64_t s) {
    return c->ll + (size_t)(s % c->nslots) * c->ll_words;
}

CH_FN uint32_t ch_ll_flag(uint64_t s) {
    return (uint32_t)(s + 1);
}

/* Words a payload of `bytes` takes: an empty one still carries its flag in one word, or the
 * receiver would take a step the sender has not published. */
CH_FN size_t ch_ll_words_for(size_t bytes) {
    return bytes ? (bytes + 3) / 4 : 1;
}

/* Word i of a payload: bytes [4i, 4i + 4) of src (zero padded past `bytes`). */
CH_FN uint32_t ch_ll_piece(const unsigned char *src, size_t bytes, size_t i) {
    uint32_t d = 0;
    for (size_t b = 0; b < 4 && 4 * i + b < bytes; b++)
        d |= (uint32_t)src[4 * i + b] << (8 * b);
    return d;
}

/* Sender: write words [first, first + stride, ...) of the payload of step s (a GPU block
 * passes its thread index and size; the host 0 and 1), then ch_send_publish. */
CH_FN void ch_ll_store(const ch_conn_t *c, uint64_t s, const void *src, size_t bytes, size_t first,
                       size_t stride) {
    uint64_t *words = ch_ll_slot(c, s);
    const uint64_t flag = (uint64_t)ch_ll_flag(s) << 32;
    const size_t n = ch_ll_words_for(bytes);
    for (size_t i = first; i < n; i += stride)
        ch_st_relaxed(&words[i], flag | ch_ll_piece((const unsigned char *)src, bytes, i));
}

/* Receiver: read words [first, first + stride, ...) of step s into dst once each carries the
 * step's flag; then (all readers done) ch_recv_release. */
CH_FN uint32_t ch_ll_load(const ch_conn_t *c, uint64_t s, void *dst, size_t bytes, size_t first,
                          size_t stride, ch_wait_t *w) {
    const uint64_t *words = ch_ll_slot(c, s);
    const uint32_t flag = ch_ll_flag(s);
    const size_t n = ch_ll_words_for(bytes);
    unsigned char *out = (unsigned char *)dst;
    for (size_t i = first; i < n; i += stride) {
        uint64_t v;
        while ((uint32_t)((v = ch_ld_relaxed(&words[i])) >> 32) != flag) {
            ch_wait_note(w, c->src);
            uint32_t e = ch_poll(w);
            if (e) return e;
        }
        for (size_t b = 0; b < 4 && 4 * i + b < bytes; b++)
            out[4 * i + b] = (unsigned char)(v >> (8 * b));
    }
    return CH_OK;
}

/* Receiver of LL: the next step to read (its own counter). */
CH_FN uint64_t ch_ll_next(const ch_conn_t *c) {
    return ch_ld_relaxed(&c->ctrl->tail);
}

/* ---- op header ---------------------------------------------------------------------------- */

/* A header as four words (relaxed: the writer publishes them with a release store of its own,
 * the reader loads them after the matching acquire). */
CH_FN void ch_hdr_store(uint64_t *words, const ch_op_hdr_t *h) {
    ch_st_relaxed(&words[0], (uint64_t)h->coll | (uint64_t)h->dtype << 32);
    ch_st_relaxed(&words[1], (uint64_t)h->redop | (uint64_t)h->root << 32);
    ch_st_relaxed(&words[2], h->count);
    ch_st_relaxed(&words[3], h->seq);
}

CH_FN void ch_hdr_load(const uint64_t *words, ch_op_hdr_t *h) {
    const uint64_t w0 = ch_ld_relaxed(&words[0]), w1 = ch_ld_relaxed(&words[1]);
    h->coll = (uint32_t)w0;
    h->dtype = (uint32_t)(w0 >> 32);
    h->redop = (uint32_t)w1;
    h->root = (uint32_t)(w1 >> 32);
    h->count = ch_ld_relaxed(&words[2]);
    h->seq = ch_ld_relaxed(&words[3]);
}

CH_FN uint32_t ch_hdr_send(const ch_conn_t *c, const ch_op_hdr_t *h, ch_wait_t *w) {
    ch_ctrl_t *k = c->ctrl;
    const uint64_t s = ch_ld_relaxed(&k->hdr_seq);
    while (ch_ld_acquire(&k->hdr_ack) != s) { /* the previous header was read */
        ch_wait_note(w, c->dst);
        uint32_t e = ch_poll(w);
        if (e) return e;
    }
    ch_hdr_store(k->hdr, h);
    ch_st_release(&k->hdr_seq, s + 1);
    return CH_OK;
}

CH_FN uint32_t ch_hdr_recv(const ch_conn_t *c, ch_op_hdr_t *h, ch_wait_t *w) {
    ch_ctrl_t *k = c->ctrl;
    const uint64_t s = ch_ld_relaxed(&k->hdr_ack);
    while (ch_ld_acquire(&k->hdr_seq) <= s) {
        ch_wait_note(w, c->src);
        uint32_t e = ch_poll(w);
        if (e) return e;
    }
    ch_hdr_load(k->hdr, h);
    ch_st_release(&k->hdr_ack, s + 1);
    return CH_OK;
}

/* Whether a received header agrees with this rank's: every field equal, except that a
 * point-to-point header names its receiver in root (the receiver's own header names the
 * sender it expects: want_root). */
CH_FN int ch_hdr_agree(const ch_op_hdr_t *mine, const ch_op_hdr_t *peer, uint32_t want_root) {
    return mine->coll == peer->coll && mine->dtype == peer->dtype && mine->redop == peer->redop &&
           want_root == peer->root && mine->count == peer->count && mine->seq == peer->seq;
}

/* Receive a header and check it; a mismatch sets the error word. */
CH_FN uint32_t ch_hdr_check(const ch_conn_t *c, const ch_op_hdr_t *mine, uint32_t want_root,
                            ch_wait_t *w) {
    ch_op_hdr_t peer;
    uint32_t e = ch_hdr_recv(c, &peer, w);
    if (e) return e;
    if (!ch_hdr_agree(mine, &peer, want_root)) return ch_set_once32(w->err, CH_ERR_MISMATCH);
    return CH_OK;
}

#endif
