/*
 * ce_prog.h: copy-engine programs, for ranks that share a GPU between processes.
 *
 * A spinning kernel holds the GPU for a whole time slice, so processes sharing a GPU without MPS
 * cannot each run one. Instead each rank's channel becomes a program of stream operations that
 * the GPU front end and copy engines execute in order, with no kernel spinning:
 *   WAIT   addr value    wait until *addr >= value        (cuStreamWaitValue64, GEQ)
 *   WRITE  addr value    *addr = value, after all before   (cuStreamWriteValue64)
 *   COPY   dst src n     copy n bytes                      (cudaMemcpyAsync)
 *   REDUCE shape ...     one reduction kernel launch       (rk_dev_prepare/reduce/finish)
 * ch_ce_build turns a channel's schedule (ch_sched.h) into such a program over the SIMPLE slots of
 * ch_proto.h: a receive waits for the sender's head and writes the tail back, a send waits for a
 * free slot (tail) and writes the head once its data is in. Step counters persist across ops,
 * so the builder keeps the next step of every connection (ch_ce_env_t). ch_ce_run executes a
 * program through a ch_ce_ops_t: a CUDA one enqueues on the user's stream, the CPU one
 * (ch_ce_cpu_ops) runs it at once with the host reduction kernels, which is how the programs are
 * tested without a GPU.
 *
 * The op header is not exchanged here: stream operations cannot compare two headers. Waits in
 * the CPU interpreter poll the error word and its deadline like every other wait.
 */
#ifndef CHORUS_DEVICE_CE_PROG_H_
#define CHORUS_DEVICE_CE_PROG_H_

#include <stddef.h>
#include <stdint.h>

#include "ch_proto.h"
#include "reduce.h"
#include "ch_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CH_CE_WAIT = 0, CH_CE_WRITE, CH_CE_COPY, CH_CE_REDUCE };
/* REDUCE shapes (reduce.h): dst = pre(in); dst = pre(in) (+) acc; dst = post(in). */
enum { CH_CE_PREPARE = 0, CH_CE_COMBINE, CH_CE_FINISH };

typedef struct {
    int op;    /* CH_CE_* */
    int shape; /* REDUCE */
    uint64_t *addr;
    uint64_t value;
    void *dst;
    const void *in, *acc;
    size_t n; /* COPY: bytes; REDUCE: elements */
} ch_ce_op_t;

typedef struct ch_ce_prog {
    ch_ce_op_t *ops;
    size_t nops, cap;
} ch_ce_prog_t;

/* What the builder needs from the communicator for one rank and channel. */
typedef struct {
    const ch_conn_t *(*conn)(void *arg, int c, int src, int dst);
    void *arg;
    uint64_t *next_send; /* [peer]: steps already built on conn(c, rank, peer) */
    uint64_t *next_recv; /* [peer]: steps already built on conn(c, peer, rank) */
} ch_ce_env_t;

/* Append channel c's program of the op (plan p, buffers sendbuff/recvbuff, reduction rop) to
 * *prog. ncclSystemError when out of memory. */
ncclResult_t ch_ce_build(const ch_plan_t *p, int c, const void *sendbuff, void *recvbuff,
                         const chorus_redop_t *rop, const ch_ce_env_t *env, ch_ce_prog_t *prog);
void ch_ce_prog_free(ch_ce_prog_t *prog);

/* The executor of a program's operations. Each returns CH_OK or an error word value. */
typedef struct {
    uint32_t (*wait_geq)(void *ctx, uint64_t *addr, uint64_t value);
    uint32_t (*write)(void *ctx, uint64_t *addr, uint64_t value);
    uint32_t (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    uint32_t (*reduce)(void *ctx, int shape, void *dst, const void *in, const void *acc,
                       size_t count, const chorus_redop_t *rop);
} ch_ce_ops_t;

/* Run (or enqueue) every operation of prog in order; stops at the first error. */
uint32_t ch_ce_run(const ch_ce_prog_t *prog, const ch_ce_ops_t *ops, void *ctx,
                   const chorus_redop_t *rop);

/* The CPU interpreter: ctx is a ch_wait_t (error word and deadline of the waits). */
extern const ch_ce_ops_t ch_ce_cpu_ops;

#if CHORUS_HAVE_CUDA
/* The CUDA table (ce_cuda.c): ctx is a cudaStream_t; each operation is enqueued on it
 * (cuStreamWaitValue64 GEQ, cuStreamWriteValue64, cudaMemcpyAsync, rk_dev_*) and returns
 * CH_ERR_CUDA, with a WARN, when enqueueing fails. *ops_p is NULL, with ncclInvalidUsage, where
 * the driver has no 64-bit stream memory operations. */
ncclResult_t ch_ce_cuda_ops(const ch_ce_ops_t **ops_p);
/* ncclSuccess when device dev runs the programs: the driver has the stream memory operations
 * (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) and reaches registered host memory at its
 * host address (the ctrl words live there); else *why says what is missing. */
ncclResult_t ch_ce_cuda_check(int dev, const char **why);
#endif

#ifdef __cplusplus
}
#endif

#endif
