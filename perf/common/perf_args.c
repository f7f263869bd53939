/*
 * perf_args.c: command-line flags of the perf binaries, with nccl-tests' names and defaults.
 *
 * Parsing is strict: a value that is not a number, is out of range, or has trailing junk is an
 * error naming the flag, never silently truncated (nccl-tests uses atoi-like parsing; a typo there
 * runs the wrong test). `-m` keeps its nccl-tests meaning (aggregated iterations) when numeric and
 * selects the buffer memory when it is `host` or `device` (also `--memory host|device`); `-M` (and
 * `--memory 0|1`, as nccl-tests spells it) asks for the memory-usage report. Whether a flag can
 * apply on this machine (CUDA graphs, several GPUs) is decided later by the runner, which knows
 * what the build and the machine have.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "perf.h"

void perf_args_default(perf_args_t *a) {
    memset(a, 0, sizeof(*a));
    a->nthreads = 1;
    a->ngpus = 1;
    a->min_bytes = 32u << 20;
    a->max_bytes = 32u << 20;
    a->step_bytes = 1u << 20;
    a->step_factor = 1;
    a->iters = 20;
    a->warmup = 1;
    a->agg = 1;
    a->run_cycles = 1;
    a->check = 1;
    a->op = ncclSum;
    a->dtype = ncclFloat32;
    a->root = 0;
    a->average = 1;
    a->memory = PERF_MEM_AUTO;
    a->walk = 1;
}

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

int perf_parse_size(const char *s, size_t *out_p) {
    char *end = NULL;
    double mult = 1.0;

    if (s == NULL || *s == '\0' || *s == '-' || *s == '+') return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || !(v >= 0.0)) return -1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024.0;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024.0 * 1024.0;
        end++;
        break;
    default:
        break;
    }
    /* Tolerate a unit after the multiplier: "64KB", "1MiB", "8B". */
    if ((end[0] == 'i' || end[0] == 'I') && mult > 1.0) end++;
    if (end[0] == 'b' || end[0] == 'B') end++;
    if (*end != '\0') return -1;
    v *= mult;
    if (v > 9.0e18) return -1;
    *out_p = (size_t)v;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out_p) {
    char *end = NULL;
    if (s == NULL || *s == '\0') return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) return -1;
    *out_p = v;
    return 0;
}

enum { OPT_MEMORY = 1000 };

static const struct option long_opts[] = {
    {"nthreads", required_argument, 0, 't'},
    {"ngpus", required_argument, 0, 'g'},
    {"minbytes", required_argument, 0, 'b'},
    {"maxbytes", required_argument, 0, 'e'},
    {"stepbytes", required_argument, 0, 'i'},
    {"stepfactor", required_argument, 0, 'f'},
    {"iters", required_argument, 0, 'n'},
    {"agg_iters", required_argument, 0, 'm'},
    {"warmup_iters", required_argument, 0, 'w'},
    {"run_cycles", required_argument, 0, 'N'},
    {"parallel_init", required_argument, 0, 'p'},
    {"check", required_argument, 0, 'c'},
    {"op", required_argument, 0, 'o'},
    {"datatype", required_argument, 0, 'd'},
    {"root", required_argument, 0, 'r'},
    {"blocking", required_argument, 0, 'z'},
    {"stream_null", required_argument, 0, 'y'},
    {"timeout", required_argument, 0, 'T'},
    {"cudagraph", required_argument, 0, 'G'},
    {"report_cputime", required_argument, 0, 'C'},
    {"average", required_argument, 0, 'a'},
    {"unalign", required_argument, 0, 'u'},
    {"output_file", required_argument, 0, 'J'},
    {"local_register", required_argument, 0, 'R'},
    {"memory_report", required_argument, 0, 'M'},
    {"memory", required_argument, 0, OPT_MEMORY},
    {"per_iter_timing", required_argument, 0, 'I'},
    {"per_iter_skip", required_argument, 0, 'K'},
    {"walk", required_argument, 0, 'W'},
    {"dirty", required_argument, 0, 'D'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};
static const char short_opts[] = ":t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:u:J:R:M:I:K:W:D:h";

static const char *flag_name(int c, char *buf, size_t len) {
    for (const struct option *o = long_opts; o->name; o++)
        if (o->val == c) {
            if (c < 256)
                snprintf(buf, len, "-%c (--%s)", c, o->name);
            else
                snprintf(buf, len, "--%s", o->name);
            return buf;
        }
    snprintf(buf, len, "-%c", c);
    return buf;
}

/* Integer flags: where the value goes and its range. */
static int *int_target(perf_args_t *a, int c, long *lo, long *hi) {
    *lo = 0;
    *hi = INT_MAX;
    switch (c) {
    case 't':
        *lo = 1;
        *hi = 1024;
        return &a->nthreads;
    case 'g':
        *lo = 1;
        *hi = 1024;
        return &a->ngpus;
    case 'n':
        *lo = 1;
        return &a->iters;
    case 'w':
        return &a->warmup;
    case 'N':
        return &a->run_cycles;
    case 'p':
        *hi = 1;
        return &a->parallel_init;
    case 'c':
        return &a->check;
    case 'r':
        *lo = -1;
        return &a->root;
    case 'z':
        *hi = 3;
        return &a->blocking;
    case 'y':
        *hi = 1;
        return &a->stream_null;
    case 'T':
        return &a->timeout;
    case 'G':
        return &a->cudagraph;
    case 'C':
        *hi = 1;
        return &a->report_cputime;
    case 'a':
        *hi = 3;
        return &a->average;
    case 'u':
        *hi = 1 << 20;
        return &a->unalign;
    case 'R':
        *hi = 2;
        return &a->local_register;
    case 'M':
        *hi = 1;
        return &a->mem_report;
    case 'I':
        *hi = 1;
        return &a->per_iter;
    case 'K':
        return &a->per_iter_skip;
    case 'W':
        *hi = 1;
        return &a->walk;
    case 'D':
        *hi = 1;
        return &a->dirty;
    default:
        return NULL;
    }
}

static int parse_memory(const char *s, perf_args_t *a) {
    if (strcasecmp(s, "host") == 0 || strcasecmp(s, "cpu") == 0)
        a->memory = PERF_MEM_HOST;
    else if (strcasecmp(s, "device") == 0 || strcasecmp(s, "gpu") == 0 ||
             strcasecmp(s, "cuda") == 0)
        a->memory = PERF_MEM_DEVICE;
    else
        return -1;
    return 0;
}

int perf_args_parse(int argc, char **argv, perf_args_t *a, char *err, size_t errlen) {
    char name[64];
    long v, lo, hi;
    int c;

    optind = 0; /* glibc: 0 re-initialises getopt completely */
    opterr = 0;
    while ((c = getopt_long(argc, argv, short_opts, long_opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            return 1;
        case ':':
            return fail(err, errlen, "option %s needs a value",
                        optopt ? flag_name(optopt, name, sizeof(name)) : argv[optind - 1]);
        case '?':
            if (optopt) return fail(err, errlen, "unknown option -%c", optopt);
            return fail(err, errlen, "unknown option %s", argv[optind - 1]);
        case 'b':
        case 'e':
        case 'i': {
            size_t sz;
            if (perf_parse_size(optarg, &sz) != 0)
                return fail(err, errlen, "invalid size '%s' for %s", optarg,
                            flag_name(c, name, sizeof(name)));
            if (c == 'b')
                a->min_bytes = sz;
            else if (c == 'e')
                a->max_bytes = sz;
            else
                a->step_bytes = sz;
            break;
        }
        case 'f':
            if (parse_int(optarg, 1, 1 << 20, &v) != 0)
                return fail(err, errlen, "invalid value '%s' for %s (an integer >= 1)", optarg,
                            flag_name(c, name, sizeof(name)));
            a->step_factor = (size_t)v;
            break;
        case 'm':
            if (parse_memory(optarg, a) == 0) break;
            if (parse_int(optarg, 1, 1 << 20, &v) != 0)
                return fail(err, errlen,
                            "invalid value '%s' for -m (agg iters >= 1, or host|device)", optarg);
            a->agg = (int)v;
            break;
        case OPT_MEMORY:
            if (parse_memory(optarg, a) == 0) break;
            if (parse_int(optarg, 0, 1, &v) != 0) /* nccl-tests: --memory <0|1> = -M */
                return fail(err, errlen, "invalid value '%s' for --memory (host|device, or 0|1)",
                            optarg);
            a->mem_report = (int)v;
            break;
        case 'o': {
            int op = perf_op_parse(optarg);
            if (op == -1)
                return fail(err, errlen,
                            "invalid op '%s' for -o (sum, prod, max, min, avg, mulsum, all)",
                            optarg);
            a->op = op == -2 ? -1 : op;
            break;
        }
        case 'd': {
            int dt = perf_dtype_parse(optarg);
            if (dt == -1)
                return fail(err, errlen,
                            "invalid datatype '%s' for -d (int8, uint8, int32, uint32, int64, "
                            "uint64, half, float, double, bfloat16, f8e4m3, f8e5m2, all)",
                            optarg);
            a->dtype = dt == -2 ? -1 : dt;
            break;
        }
        case 'J':
            if (optarg[0] == '\0') return fail(err, errlen, "-J (--output_file) needs a file name");
            a->json_path = optarg;
            break;
        default: {
            int *dst = int_target(a, c, &lo, &hi);
            if (dst == NULL) return fail(err, errlen, "unhandled option -%c", c);
            if (parse_int(optarg, lo, hi, &v) != 0)
                return fail(err, errlen, "invalid value '%s' for %s (an integer in [%ld, %ld])",
                            optarg, flag_name(c, name, sizeof(name)), lo, hi);
            *dst = (int)v;
            break;
        }
        }
    }
    if (optind < argc) return fail(err, errlen, "unexpected argument '%s'", argv[optind]);
    if (a->min_bytes > a->max_bytes)
        return fail(err, errlen, "minbytes (%zu) is larger than maxbytes (%zu)", a->min_bytes,
                    a->max_bytes);
    if (a->step_factor <= 1 && a->step_bytes == 0 && a->min_bytes < a->max_bytes)
        return fail(err, errlen, "stepbytes is 0 and stepfactor is 1: the sweep would not advance");
    if (a->per_iter_skip >= a->iters)
        return fail(err, errlen, "-K (%d) must be smaller than -n (%d)", a->per_iter_skip,
                    a->iters);
    return 0;
}

int perf_args_sizes(const perf_args_t *a, size_t *sizes, int max) {
    int n = 0;
    size_t size = a->min_bytes;
    while (n < max && size <= a->max_bytes) {
        sizes[n++] = size;
        size_t next = a->step_factor > 1 ? size * a->step_factor : size + a->step_bytes;
        if (a->step_factor > 1 && size == 0) next = 1;
        if (next <= size) break;
        size = next;
    }
    return n;
}

void perf_args_usage(FILE *f, const char *prog) {
    fprintf(f,
            "USAGE: %s\n"
            "  -t,--nthreads <n>        threads (ranks) per process (1)\n"
            "  -g,--ngpus <n>           GPUs (ranks) per thread (1; device memory only)\n"
            "  -b,--minbytes <size>     smallest size, K/M/G suffixes (32M)\n"
            "  -e,--maxbytes <size>     largest size (32M)\n"
            "  -i,--stepbytes <size>    additive step (1M)\n"
            "  -f,--stepfactor <n>      multiplicative step (off)\n"
            "  -n,--iters <n>           timed iterations (20)\n"
            "  -w,--warmup_iters <n>    warmup iterations per size (1)\n"
            "  -m,--agg_iters <n>       ops aggregated in one group per iteration (1);\n"
            "     -m host|device        also: buffer memory, as --memory\n"
            "  --memory host|device     buffer memory (device when a GPU is present);\n"
            "                           0|1 as nccl-tests: the same as -M\n"
            "  -N,--run_cycles <n>      repeat the sweep (1; 0 = forever)\n"
            "  -p,--parallel_init <0/1> each thread creates its own communicators (0)\n"
            "  -c,--check <n>           correctness-check iterations (1; 0 = off)\n"
            "  -o,--op <op>             sum|prod|max|min|avg|mulsum|all (sum)\n"
            "  -d,--datatype <type>     int8|uint8|int32|uint32|int64|uint64|half|float|double|\n"
            "                           bfloat16|f8e4m3|f8e5m2|all (float)\n"
            "  -r,--root <rank>         root of rooted collectives (0; -1 = every root)\n"
            "  -z,--blocking <0-3>      0 async, 1 sync+barrier per op, 2 sync per op,\n"
            "                           3 sync+barrier per iteration, barrier not timed (0)\n"
            "  -y,--stream_null <0/1>   use the NULL stream (0)\n"
            "  -T,--timeout <s>         abort when one test takes longer (0 = off)\n"
            "  -G,--cudagraph <n>       capture iterations in a CUDA graph, launch n times (0)\n"
            "  -C,--report_cputime <0/1> report the time to issue the ops (0)\n"
            "  -a,--average <0-3>       time across ranks: 0 rank 0, 1 mean, 2 min, 3 max (1)\n"
            "  -u,--unalign <n>         misalign buffers by n elements (0)\n"
            "  -J,--output_file <file>  write every row as JSON\n"
            "  -R,--local_register <0-2> 1 ncclCommRegister, 2 ncclCommWindowRegister (0)\n"
            "  -M,--memory_report <0/1> print buffer memory use (0)\n"
            "  -I,--per_iter_timing <0/1> add p50, p99, rank skew and busbw at p50 columns (0)\n"
            "  -K,--per_iter_skip <n>   iterations left out of -I statistics (0)\n"
            "  -W,--walk <0/1>          1: each call uses the next op-sized part of the buffers, as\n"
            "                           nccl-tests (caches cold); 0: every call the same buffers (1)\n"
            "  -D,--dirty <0/1>         1: rewrite each rank's input (a byte per cache line, same\n"
            "                           value) before every timed call, untimed (0)\n"
            "  -h,--help\n",
            prog);
}
