/*
 * cpu_direct.c: one block of the kernel's direct mode (ch_direct.h) run by a CPU thread, with the
 * host reduction kernels: the same entries, waits and header checks a GPU block takes, so the
 * CPU executor and the device emulator check the protocol's memory orders (under TSan too).
 *
 * The part is moved in pieces of one bounce buffer: the n sources are folded into it (rk_reduce_n:
 * every rank's pre() in rank order, rounded once; rank by rank where the ranks' PreMulSum
 * scalars differ), post() applied, and the piece copied to every destination. Each piece is read
 * in full before it is written, so in place is safe: this rank's part of every buffer is touched
 * by this block alone.
 */
#include <string.h>

#include "ch_direct.h"
#include "cpu_exec.h"
#include "reduce.h"

#define DIR_BOUNCE 4096

static int dir_reduces(int coll) {
    return coll == CH_COLL_ALLREDUCE || coll == CH_COLL_REDUCESCATTER;
}

/* Elements [0, m) from the sources into every destination. mixed: the ranks' PreMulSum scalars
 * differ. */
static void dir_piece(const ch_kernel_args_t *a, const ch_dir_ptrs_t *d, const uint64_t *scalars,
                      int mixed, size_t m, unsigned char *bounce) {
    const size_t bytes = m * a->plan.esize;
    if (!dir_reduces(a->plan.coll)) {
        for (int i = 0; i < d->ndst; i++)
            rk_copy(d->dst[i], d->src[0], bytes);
        return;
    }
    const chorus_redop_t *rop = &a->redop;
    if (!mixed) {
        chorus_redop_t op = *rop;
        op.scalar.u = scalars[d->srank[0]];
        rk_reduce_n(bounce, (const void *const *)d->src, d->nsrc, m, &op);
    } else {
        for (int i = 0; i < d->nsrc; i++) {
            chorus_redop_t op = *rop;
            op.scalar.u = scalars[d->srank[i]];
            if (i == 0)
                rk_prepare(bounce, d->src[0], m, &op);
            else
                rk_reduce(bounce, d->src[i], bounce, m, &op);
        }
    }
    if (rop->kind == RK_SUMDIV) rk_finish(bounce, bounce, m, rop);
    for (int i = 0; i < d->ndst; i++)
        rk_copy(d->dst[i], bounce, bytes);
}

uint32_t ch_cpu_direct_block(const ch_kernel_args_t *a, int c, ch_wait_t *w) {
    const ch_plan_t *p = &a->plan;
    const int n = p->nranks, r = p->rank;
    if (n > CH_DIR_MAX_RANKS) return ch_set_once32(a->err, CH_ERR_ABORT);
    ch_dir_ent_t *ents = a->dir + (size_t)c * n;
    const ch_op_hdr_t h = ch_dir_block_hdr(a, c);
    uint64_t sends[CH_DIR_MAX_RANKS], recvs[CH_DIR_MAX_RANKS], scalars[CH_DIR_MAX_RANKS];
    ch_dir_publish(&ents[r], &h, a->sendbuff, a->recvbuff, a->redop.scalar.u);
    const ch_conn_t *conns = a->conns ? a->conns + (size_t)c * n * n : NULL;
    uint32_t e = ch_dir_wait_ready(ents, n, r, &h, conns, w, sends, recvs, scalars);
    if (e) return e;
    size_t beg, end;
    ch_dir_part(p, c, &beg, &end);
    _Alignas(64) unsigned char bounce[DIR_BOUNCE];
    const size_t piece = DIR_BOUNCE / p->esize;
    int mixed = 0;
    for (int q = 1; q < n && a->redop.kind == RK_PREMULSUM; q++)
        mixed |= scalars[q] != scalars[0];
    for (size_t off = beg; off < end; off += piece) {
        ch_dir_ptrs_t d;
        ch_dir_ptrs(p, sends, recvs, off, &d);
        dir_piece(a, &d, scalars, mixed, ch_min(piece, end - off), bounce);
    }
    return ch_dir_finish(ents, n, r, h.seq, w);
}
