/*
 * ch_kernel.h: the collective kernel of the device path (ch_kernel.cu).
 *
 * One launch runs one op of one rank: grid = the op's channels, one block per channel; each
 * block exchanges the op headers on its channel's connections and walks the channel's schedule
 * (ch_sched.h) over the slot protocol (ch_proto.h), its threads copying and reducing each chunk
 * together with the device reduction traits, so a chunk gets the host kernels' bits. Everything
 * the kernel reads lives in memory the GPU can reach: the ring table, the connection views and
 * their slots and counters, the error word.
 */
#ifndef CHORUS_DEVICE_CH_KERNEL_H_
#define CHORUS_DEVICE_CH_KERNEL_H_

#include "ch_direct.h"
#include "ch_plan.h"
#include "ch_proto.h"
#include "nccl.h"
#include "reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    ch_plan_t plan; /* plan.ring: device-visible */
    const void *sendbuff;
    void *recvbuff;
    const ch_conn_t *conns; /* device-visible [c][src][dst] connection views */
    uint32_t *err;          /* the communicator's error word */
    ch_op_hdr_t hdr;        /* this rank's header of the op */
    uint64_t *op_seq;       /* device memory: [c] this rank's collectives on channel c so far
                               (the header's seq; ch_block_hdr), or NULL: hdr.seq as given */
    chorus_redop_t redop;
    int proto;            /* CH_PROTO_SIMPLE or CH_PROTO_LL */
    uint32_t ll_bytes;    /* LL payload per slot (a multiple of 8, at most CH_KERNEL_LL_MAX) */
    int vec;              /* 1: SIMPLE chunks move in 16-byte accesses where every pointer allows */
    ch_dir_ent_t *dir;    /* device memory: the direct mode's [c][rank] entries (ch_direct.h), or
                             NULL: the op runs over the slots */
    uint64_t *dir_seq;    /* device memory: [c] this rank's direct ops on channel c so far */
    uint64_t *blocks;     /* memory the host reads (mapped), or NULL: [c][CH_BLK_WORDS] the starts
                             and the ends of this rank's blocks of channel c, and the rank (+ 1) the
                             last of them spun waiting for, written by those blocks alone (a host
                             watchdog sees there which blocks run, whether they progress, and whom
                             they wait for; replays of a captured launch count too) */
    uint64_t *blocks_seq; /* device memory: [c][2] the same counts, which the blocks read (a
                             read of mapped host memory would cross the bus on every launch) */
} ch_kernel_args_t;

#define CH_BLK_WORDS 3 /* blocks[c]: starts, ends, the peer waited for (ch_wait_t.note) */

/* Where block c notes whom it waits for (ch_wait_t.note), or NULL. */
CH_FN uint64_t *ch_block_note(const ch_kernel_args_t *a, int c) {
    return a->blocks ? &a->blocks[CH_BLK_WORDS * (size_t)c + 2] : NULL;
}

/* For a host watchdog: blocks[c] of one channel (b), its end read before its start, so that no
 * end is seen without its start; *sum_p gathers both, to see them move. 1 while a block of the
 * channel runs (started, not ended). */
CH_FN int ch_block_running(const uint64_t *b, uint64_t *sum_p) {
    const uint64_t ended = ch_ld_acquire(&b[1]);
    const uint64_t started = ch_ld_acquire(&b[0]);
    *sum_p += started + ended;
    return ended < started;
}

/* Block c of a launch starts, or has ended (every return after its start): count it in
 * [c][0] or [c][1] (one thread of the block; the block of channel c is the words' one writer,
 * launches on a stream running one after the other). The start is stored relaxed (nothing of the
 * block's is ordered by it), the end with release, after the block's work. */
CH_FN void ch_block_began(const ch_kernel_args_t *a, int c) {
    if (a->blocks == NULL) return;
    const uint64_t v = a->blocks_seq[2 * (size_t)c] + 1;
    a->blocks_seq[2 * (size_t)c] = v;
    ch_st_relaxed(&a->blocks[CH_BLK_WORDS * (size_t)c], v);
}

CH_FN void ch_block_ended(const ch_kernel_args_t *a, int c) {
    if (a->blocks == NULL) return;
    const uint64_t v = a->blocks_seq[2 * (size_t)c + 1] + 1;
    a->blocks_seq[2 * (size_t)c + 1] = v;
    ch_st_release(&a->blocks[CH_BLK_WORDS * (size_t)c + 1], v);
}

/* The header block c of a launch sends and checks: the launch's header, whose seq comes from
 * the channel's op counter when the launch has them (op_seq), read and advanced here by the one
 * block of this rank that runs channel c. The counter lives in device memory, so a launch replayed
 * from a CUDA graph carries the next number each time, as a launch made anew does. Send/receive
 * keeps the launch's seq: pairs between different peers need not line up. */
CH_FN ch_op_hdr_t ch_block_hdr(const ch_kernel_args_t *a, int c) {
    ch_op_hdr_t h = a->hdr;
    if (a->op_seq != NULL && h.coll != CH_COLL_SENDRECV) {
        h.seq = a->op_seq[c];
        a->op_seq[c] = h.seq + 1;
    }
    return h;
}

/* The header block c of a direct launch publishes: the launch's, with the next direct op number
 * of the channel's counter (from 1: a zeroed entry describes no op). */
CH_FN ch_op_hdr_t ch_dir_block_hdr(const ch_kernel_args_t *a, int c) {
    ch_op_hdr_t h = a->hdr;
    h.seq = a->dir_seq[c] + 1;
    a->dir_seq[c] = h.seq;
    return h;
}

#define CH_KERNEL_THREADS 256
#define CH_KERNEL_LL_MAX 16384

#if CHORUS_HAVE_CUDA
/* Launch the op on `stream` (a cudaStream_t). ncclInvalidArgument for a dtype, op or protocol
 * the kernel does not have; ncclUnhandledCudaError (with a WARN) when the launch fails. */
ncclResult_t ch_kernel_launch(const ch_kernel_args_t *args, void *stream);
#endif

#ifdef __cplusplus
}
#endif

#endif
