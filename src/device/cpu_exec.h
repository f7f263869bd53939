/*
 * cpu_exec.h: the device protocol and schedules run by CPU threads (private to the library and
 * its tests).
 *
 * A world stands in for a communicator on GPUs: nranks ranks, each with max_ch channels (a GPU
 * block each), connected all to all by ch_conn_t connections in ordinary host memory, and one
 * error word. ch_cpu_run runs one op: a thread per rank and channel takes the op's header
 * exchange and then its channel's steps (ch_sched.h), moving chunks through the slots with the host
 * reduction kernels (reduce.h) - the same code paths, step for step, that a GPU block takes with
 * the device kernels, so races, memory orders, wraparound and error paths are checked here.
 */
#ifndef CHORUS_DEVICE_CPU_EXEC_H_
#define CHORUS_DEVICE_CPU_EXEC_H_

#include <stddef.h>
#include <stdint.h>

#include "ch_kernel.h"
#include "nccl.h"
#include "reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One rank's part of an op. */
typedef struct {
    int coll; /* CH_COLL_* */
    ncclDataType_t dtype;
    chorus_redop_t redop; /* reducing collectives */
    size_t count;         /* as ncclAllReduce etc. take it (reduce-scatter: recvcount,
                             all-gather: sendcount, all-to-all: elements per peer) */
    int root;
    int send_peer, recv_peer; /* CH_COLL_SENDRECV (-1: none) */
    const void *sendbuff;
    void *recvbuff;
    int skip; /* this rank does not call the op (tests of waits that cannot end) */
} ch_cpu_op_t;

typedef struct ch_cpu_world ch_cpu_world_t;
#define CH_CPU_MAX_RANKS 64

/* nranks: 1 .. CH_CPU_MAX_RANKS; nslots slots per connection, SIMPLE slots of slot_bytes (a
 * multiple of 64), LL slots carrying ll_bytes (a multiple of 8, at least 64). timeout_ms: how long
 * a wait may spin before the op fails with CH_ERR_TIMEOUT. NULL on bad arguments or no memory. */
ch_cpu_world_t *ch_cpu_world_create(int nranks, int max_ch, int nslots, size_t slot_bytes,
                                    size_t ll_bytes, int64_t timeout_ms);
void ch_cpu_world_destroy(ch_cpu_world_t *w);

/* ch_cpu_run's proto for copy-engine programs (ce_prog.h): each thread builds its channel's
 * program from the schedule and interprets it (no op header exchange). */
#define CH_CPU_CE 2
/* ch_cpu_run's proto for the kernel's direct mode (ch_direct.h; all-reduce, reduce-scatter,
 * all-gather, broadcast): a thread per rank and channel runs ch_cpu_direct_block on the world's
 * entries; every channel takes part, whatever the op's size. */
#define CH_CPU_DIRECT 3

/* Run ops[0..nranks-1] (one per rank) with protocol proto (CH_PROTO_SIMPLE, CH_PROTO_LL,
 * CH_CPU_CE or CH_CPU_DIRECT) and wait for every thread. results[r]: CH_OK, or the error rank r's
 * threads met; a rank that finished while another failed gets the error word too, as every rank
 * of a failed communicator does. The error word stays set: a failed world runs nothing more. */
void ch_cpu_run(ch_cpu_world_t *w, const ch_cpu_op_t *ops, int proto, uint32_t *results);

/* Sets the error word to CH_ERR_ABORT (from any thread): every spinning wait returns. */
void ch_cpu_abort(ch_cpu_world_t *w);
uint32_t ch_cpu_error(const ch_cpu_world_t *w);

/* The rank at position pos of channel c's ring in a world (channels alternate direction). */
int ch_cpu_ring_rank(int nranks, int c, int pos);

/* One block of the collective kernel (ch_kernel.h) run by the calling thread: channel c's header
 * exchange and steps, with the host reduction kernels, exactly as cpu_exec's threads run them.
 * deadline_ns (CLOCK_MONOTONIC, ch_host_now_ns; 0: none) turns a wait that lasts into
 * CH_ERR_TIMEOUT in the error word. Returns CH_OK or the error the block met. The device
 * runtime's emulator (ch_rt_emu.c) runs a launch as one such call per channel. */
uint32_t ch_cpu_block(const ch_kernel_args_t *a, int c, int64_t deadline_ns);
int64_t ch_host_now_ns(void);
/* The direct mode's block (a->dir set; cpu_direct.c), which ch_cpu_block runs for such args. */
uint32_t ch_cpu_direct_block(const ch_kernel_args_t *a, int c, ch_wait_t *w);

/* This rank's header of an op (the fields a peer must agree on; see ch_proto.h). */
void ch_op_hdr_make(ch_op_hdr_t *h, int coll, ncclDataType_t dtype, int redop_kind, size_t count,
                    int root, uint64_t seq);

/* What the host reports for an error word value. */
ncclResult_t ch_error_result(uint32_t err);

#ifdef __cplusplus
}
#endif

#endif
