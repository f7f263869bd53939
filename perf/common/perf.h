/*
 * perf.h: the shared harness of the nccl-tests-compatible perf binaries (all_reduce_perf & co).
 *
 * The harness is split in two libraries. perf_core (this header, pure logic, no communication)
 * holds argument parsing, per-collective buffer counts and bandwidth formulas, the exact-result
 * data generator and checker, table and JSON formatting, statistics and the launcher-environment
 * reader; the unit tests in tests/perf link it alone. perf_runner (perf_main) drives the NCCL API:
 * threads, communicators, buffers, timing loops; it links only libnccl.so.2 (+ cudart), so a perf
 * binary runs against NVIDIA's NCCL by changing LD_LIBRARY_PATH.
 *
 * Counts are in elements unless a name says bytes. Every function that can fail on user input
 * returns 0 on success and -1 with a message in err (errlen bytes) otherwise.
 */
#ifndef CHORUS_PERF_H_
#define CHORUS_PERF_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- collectives ---------------------------------------------------------------------------- */
typedef enum {
    PERF_ALL_REDUCE = 0,
    PERF_ALL_GATHER,
    PERF_REDUCE_SCATTER,
    PERF_BROADCAST,
    PERF_REDUCE,
    PERF_ALLTOALL,
    PERF_GATHER,
    PERF_SCATTER,
    PERF_SENDRECV,
    PERF_HYPERCUBE,
    PERF_NCOLLS
} perf_coll_t;

/* Buffer geometry of one test size (nccl-tests' getCollByteCount). The in-place variant uses the
 * receive buffer for both: send = recv + send_inplace_off*rank,
 * recv = recv + recv_inplace_off*rank. */
typedef struct {
    size_t sendcount, recvcount; /* elements in each buffer */
    size_t paramcount;           /* the count passed to the NCCL call (per-rank count) */
    size_t send_inplace_off, recv_inplace_off;
} perf_counts_t;

const char *perf_coll_prog(perf_coll_t coll); /* "all_reduce_perf" */
int perf_coll_has_op(perf_coll_t coll);       /* the redop column applies */
int perf_coll_has_root(perf_coll_t coll);     /* rooted: the root column and -r apply */
/* In-place alltoall and sendrecv are timed but not checked (as in nccl-tests: "N/A"). */
int perf_coll_checks_inplace(perf_coll_t coll);
void perf_coll_counts(perf_coll_t coll, size_t bytes, size_t eltsize, int nranks,
                      perf_counts_t *out_p);
/* algbw = bytes moved per rank / time; busbw = algbw * the collective's bus factor (GB = 1e9). */
double perf_coll_bus_factor(perf_coll_t coll, int nranks);
void perf_coll_bw(perf_coll_t coll, size_t paramcount, size_t eltsize, double sec, int nranks,
                  double *algbw_p, double *busbw_p);

/* ---- data types and ops --------------------------------------------------------------------- */
#define PERF_OP_MULSUM ((int)ncclNumOps) /* premulsum: an op made with ncclRedOpCreatePreMulSum */
#define PERF_NOPS 6

size_t perf_dtype_size(ncclDataType_t dt);
const char *perf_dtype_name(ncclDataType_t dt); /* nccl-tests spelling: "float", "bfloat16" */
int perf_dtype_parse(const char *s);            /* -1 unknown, -2 "all" */
int perf_dtype_is_float(ncclDataType_t dt);
const char *perf_op_name(int op); /* "sum" .. "avg", "mulsum" */
int perf_op_parse(const char *s); /* -1 unknown, -2 "all" */

/* Exact conversions between double and the element encodings (round to nearest even; values out
 * of range saturate for float8 e4m3 and become infinity for the others). */
double perf_elem_get(ncclDataType_t dt, const void *p);
void perf_elem_set(ncclDataType_t dt, void *p, double v);
uint16_t perf_float_to_half(double v);
double perf_half_to_float(uint16_t h);
uint16_t perf_float_to_bf16(double v);
double perf_bf16_to_float(uint16_t h);
uint8_t perf_float_to_fp8(double v, int e5m2);
double perf_fp8_to_float(uint8_t b, int e5m2);

/* ---- arguments ------------------------------------------------------------------------------ */
typedef enum { PERF_MEM_AUTO = 0, PERF_MEM_HOST, PERF_MEM_DEVICE } perf_mem_kind_t;

typedef struct {
    int nthreads, ngpus;
    size_t min_bytes, max_bytes, step_bytes, step_factor; /* step_factor 1: additive steps */
    int iters, warmup, agg;
    int run_cycles, parallel_init, check;
    int op;    /* an ncclRedOp_t, PERF_OP_MULSUM, or -1: all */
    int dtype; /* an ncclDataType_t or -1: all */
    int root;  /* -1: every root in turn */
    int blocking, stream_null, timeout, cudagraph, report_cputime, average;
    int unalign, local_register, mem_report, per_iter, per_iter_skip;
    int walk; /* 1: calls walk through the buffers (nccl-tests); 0: every call the same part */
    int dirty; /* 1: each rank rewrites its input before every timed call (perf_runner.c) */
    perf_mem_kind_t memory;
    const char *json_path; /* NULL: no JSON */
} perf_args_t;

void perf_args_default(perf_args_t *a);
/* Parse argv (getopt_long; resets getopt's state, so it may be called again). Returns 0, 1 when
 * -h was given (usage should be printed), -1 on a bad flag or value (message in err). */
int perf_args_parse(int argc, char **argv, perf_args_t *a, char *err, size_t errlen);
void perf_args_usage(FILE *f, const char *prog);
/* "8", "64K", "1.5M", "2G" (2^10 multiples); -1 on anything else. */
int perf_parse_size(const char *s, size_t *out_p);
/* The sizes of the sweep, in order; returns how many (at most max). */
int perf_args_sizes(const perf_args_t *a, size_t *sizes, int max);

/* ---- launcher environment ------------------------------------------------------------------- */
typedef struct {
    int proc, nprocs, local_rank;
    const char *source; /* "torchrun/chorusrun", "Open MPI", "Slurm", "none" */
    char master_addr[256];
    int master_port;   /* 0: unset */
    char comm_id[300]; /* NCCL_COMM_ID to set ("" when it is already set or not needed) */
} perf_env_t;

typedef const char *(*perf_getenv_fn)(const char *name);
/* Read RANK/WORLD_SIZE/LOCAL_RANK (torchrun, chorusrun), OMPI_COMM_WORLD_*, or SLURM_*; none set
 * means one process. With several processes and no NCCL_COMM_ID, comm_id is MASTER_ADDR:PORT
 * (missing master variables are an error). */
int perf_env_read(perf_getenv_fn get, perf_env_t *out_p, char *err, size_t errlen);

/* ---- reference data ------------------------------------------------------------------------- */
/* Inputs come from small per-rank tables, periodic in the element index with a prime period, and
 * are chosen per dtype/op so that every result is exact whatever the reduction order (see
 * perf_data.c). Only float ncclAvg allows a tolerance (NCCL pre-multiplies by 1/nranks). */
#define PERF_DATA_PERIOD 1021
typedef struct perf_data perf_data_t;

perf_data_t *perf_data_create(ncclDataType_t dt, int op, int nranks);
void perf_data_destroy(perf_data_t *d);
/* The PreMulSum scalar every rank uses (2), encoded as dt in *buf (8 bytes). */
void perf_data_mulsum_scalar(ncclDataType_t dt, void *buf);
/* Fill rank's input (sendcount elements at in) for coll with seed. */
void perf_data_fill(const perf_data_t *d, perf_coll_t coll, int rank, uint64_t seed, void *in,
                    const perf_counts_t *c);
/* Count the wrong elements of rank's output (recvcount elements at out); 0 where the rank has no
 * defined output (non-root of reduce/gather). */
int64_t perf_data_check(const perf_data_t *d, perf_coll_t coll, int rank, int root, uint64_t seed,
                        const void *out, const perf_counts_t *c);
/* Fill n bytes with a pattern that no generated value takes in practice. */
void perf_data_poison(void *p, size_t bytes);

/* ---- statistics ----------------------------------------------------------------------------- */
/* Sorts v in place. */
double perf_stat_median(double *v, int n);
double perf_stat_percentile(double *v, int n, int pct); /* nearest rank, as nccl-tests */
/* -a: 0 rank 0's value, 1 mean, 2 min, 3 max (v has one value per rank, rank order). */
double perf_stat_reduce(const double *v, int n, int average);
double perf_stat_skew(const double *v, int n); /* max - min */

/* ---- formatting ----------------------------------------------------------------------------- */
/* nccl-tests' adaptive number: width characters, 2 decimals, then 1, 0, then an exponent. */
void perf_float_str(double value, int width, char *out, size_t outlen);
/* The three table-header lines (with a trailing newline each). extra: the -I columns. */
int perf_fmt_table_header(char *buf, size_t len, int report_cputime, int extra);
int perf_fmt_row_prefix(char *buf, size_t len, size_t bytes, size_t count, const char *type,
                        const char *redop, int root);
/* wrong < 0: not checked ("N/A"). */
int perf_fmt_row_body(char *buf, size_t len, double time_us, double algbw, double busbw,
                      int64_t wrong);
int perf_fmt_row_extra(char *buf, size_t len, double p50_us, double p99_us, double skew_us,
                       double busbw_p50);
int perf_fmt_params_line(char *buf, size_t len, const perf_args_t *a);

/* JSON report: one object, rows appended as they come. */
typedef struct {
    double time_us, algbw, busbw;
    int64_t wrong;                                  /* < 0: not checked */
    double p50_us, p99_us, min_us, max_us, skew_us; /* NaN: not measured */
    double rank_time_min_us, rank_time_max_us;
} perf_result_t;

typedef struct {
    FILE *f;
    int nrows;
} perf_json_t;

int perf_json_open(perf_json_t *j, const char *path, const char *prog, int argc, char **argv,
                   const perf_args_t *a, int nranks, int nccl_version, const char *memory);
void perf_json_rank(perf_json_t *j, int rank, const char *host, int pid, const char *device);
void perf_json_ranks_done(perf_json_t *j);
void perf_json_row(perf_json_t *j, size_t bytes, size_t count, const char *type, const char *redop,
                   int root, const perf_result_t *oop, const perf_result_t *ip);
void perf_json_close(perf_json_t *j, int errors, double avg_busbw);
/* JSON string escaping into out (always NUL-terminated). */
void perf_json_escape(const char *in, char *out, size_t outlen);

/* ---- the runner (perf_runner.c; links libnccl) ---------------------------------------------- */
typedef ncclResult_t (*perf_run_fn)(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t comm,
                                    cudaStream_t stream);
int perf_main(int argc, char **argv, perf_coll_t coll, perf_run_fn run);
/* Copy within one rank's memory (host or device, as the run uses), ordered on stream. */
int perf_local_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream);

/* ---- resources (perf_resources.c) ------------------------------------------------------------ */
/* With CHORUS_PERF_RESOURCES=1: one line on stderr with this process's threads, descriptors and
 * /dev/shm bytes mapped and created, tagged with the phase ("init", "ops") and the rank. */
void perf_resources_report(const char *phase, int rank);

#ifdef __cplusplus
}
#endif
#endif
