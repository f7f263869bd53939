/*
 * perf_format.c: the text table (nccl-tests' layout) and the JSON report.
 *
 * The table is printed with the same column widths and number formatting as nccl-tests 2.19, so
 * scripts that parse its output by whitespace-separated column position keep working; the columns
 * that Chorus adds (-I: median and 99th-percentile iteration time, the spread of per-rank times,
 * busbw at the median) go after nccl-tests' last column. The JSON report holds every row with all
 * statistics, for plots; it is written as rows arrive, so an interrupted run leaves the rows
 * measured so far.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "perf.h"

void perf_float_str(double value, int width, char *out, size_t outlen) {
    /* Digits before the decimal point decide how many decimals fit in the width. */
    int digits = 0;
    double bound = 1.0;
    while (value >= bound && digits < 40) {
        digits++;
        bound *= 10.0;
    }
    if (digits < width - 2)
        snprintf(out, outlen, "%*.2f", width, value);
    else if (digits < width - 1)
        snprintf(out, outlen, "%*.1f", width, value);
    else if (digits < width + 1)
        snprintf(out, outlen, "%*.0f", width, value);
    else if (width >= 7)
        snprintf(out, outlen, "%*.1e", width, value);
    else
        snprintf(out, outlen, "%*.0e", width, value);
}

/* snprintf that appends at *pos and never overruns. */
#define APPEND(buf, len, pos, ...)                                                                 \
    do {                                                                                           \
        if ((size_t)(pos) < (len)) {                                                               \
            int n_ = snprintf((buf) + (pos), (len) - (size_t)(pos), __VA_ARGS__);                  \
            if (n_ > 0) (pos) += n_;                                                               \
        }                                                                                          \
    } while (0)

static const char extra_fmt[] = "  %7s  %7s  %7s  %6s";

int perf_fmt_table_header(char *buf, size_t len, int report_cputime, int extra) {
    const char *t = report_cputime ? "cputime" : "time";
    int pos = 0;
    APPEND(buf, len, pos,
           "# %10s  %12s  %8s  %6s  %6s           out-of-place"
           "                       in-place",
           "", "", "", "", "");
    if (extra)
        APPEND(buf, len, pos,
               "                    out-of-place per-iteration"
               "         in-place per-iteration");
    APPEND(buf, len, pos, "\n");
    APPEND(buf, len, pos, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s",
           "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw",
           "busbw", "#wrong");
    if (extra) {
        APPEND(buf, len, pos, extra_fmt, "p50", "p99", "skew", "busbw");
        APPEND(buf, len, pos, extra_fmt, "p50", "p99", "skew", "busbw");
    }
    APPEND(buf, len, pos, "\n");
    APPEND(buf, len, pos, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
    if (extra) {
        APPEND(buf, len, pos, "  %6s", "");
        APPEND(buf, len, pos, extra_fmt, "(us)", "(us)", "(us)", "@p50");
        APPEND(buf, len, pos, extra_fmt, "(us)", "(us)", "(us)", "@p50");
    }
    APPEND(buf, len, pos, "\n");
    return pos;
}

int perf_fmt_row_prefix(char *buf, size_t len, size_t bytes, size_t count, const char *type,
                        const char *redop, int root) {
    int pos = 0;
    APPEND(buf, len, pos, "%12zu  %12zu  %8s  %6s  %6d", bytes, count, type, redop, root);
    return pos;
}

int perf_fmt_row_body(char *buf, size_t len, double time_us, double algbw, double busbw,
                      int64_t wrong) {
    char ts[32], as[32], bs[32];
    int pos = 0;
    perf_float_str(time_us, 7, ts, sizeof(ts));
    perf_float_str(algbw, 6, as, sizeof(as));
    perf_float_str(busbw, 6, bs, sizeof(bs));
    if (wrong >= 0)
        APPEND(buf, len, pos, "  %7s  %6s  %6s  %6g", ts, as, bs, (double)wrong);
    else
        APPEND(buf, len, pos, "  %7s  %6s  %6s    N/A", ts, as, bs);
    return pos;
}

int perf_fmt_row_extra(char *buf, size_t len, double p50_us, double p99_us, double skew_us,
                       double busbw_p50) {
    char a[32], b[32], c[32], d[32];
    int pos = 0;
    if (isnan(p50_us)) {
        APPEND(buf, len, pos, extra_fmt, "-", "-", "-", "-");
        return pos;
    }
    perf_float_str(p50_us, 7, a, sizeof(a));
    perf_float_str(p99_us, 7, b, sizeof(b));
    perf_float_str(skew_us, 7, c, sizeof(c));
    perf_float_str(busbw_p50, 6, d, sizeof(d));
    APPEND(buf, len, pos, extra_fmt, a, b, c, d);
    return pos;
}

int perf_fmt_params_line(char *buf, size_t len, const perf_args_t *a) {
    int pos = 0;
    APPEND(buf, len, pos,
           "# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
           "iters: %d agg iters: %d validation: %d graph: %d unalign: %d\n",
           a->nthreads, a->ngpus, a->min_bytes, a->max_bytes,
           a->step_factor > 1 ? a->step_factor : a->step_bytes,
           a->step_factor > 1 ? "factor" : "bytes", a->warmup, a->iters, a->agg, a->check,
           a->cudagraph, a->unalign);
    return pos;
}

/* ---- JSON ----------------------------------------------------------------------------------- */
void perf_json_escape(const char *in, char *out, size_t outlen) {
    size_t o = 0;
    if (outlen == 0) return;
    for (; in && *in && o + 7 < outlen; in++) {
        unsigned char ch = (unsigned char)*in;
        if (ch == '"' || ch == '\\') {
            out[o++] = '\\';
            out[o++] = (char)ch;
        } else if (ch == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else if (ch == '\t') {
            out[o++] = '\\';
            out[o++] = 't';
        } else if (ch < 0x20) {
            o += (size_t)snprintf(out + o, outlen - o, "\\u%04x", ch);
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o] = '\0';
}

static void json_str(FILE *f, const char *s) {
    char buf[2048];
    perf_json_escape(s ? s : "", buf, sizeof(buf));
    fprintf(f, "\"%s\"", buf);
}

static void json_num(FILE *f, double v) {
    if (isnan(v) || isinf(v))
        fputs("null", f);
    else
        fprintf(f, "%.9g", v);
}

int perf_json_open(perf_json_t *j, const char *path, const char *prog, int argc, char **argv,
                   const perf_args_t *a, int nranks, int nccl_version, const char *memory) {
    char when[64];
    time_t now = time(NULL);
    struct tm tm;
    j->nrows = 0;
    j->f = fopen(path, "w");
    if (j->f == NULL) return -1;
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime_r(&now, &tm));
    fprintf(j->f, "{\n  \"format\": \"chorus-perf\",\n  \"version\": 1,\n  \"program\": ");
    json_str(j->f, prog);
    fprintf(j->f, ",\n  \"start_time\": ");
    json_str(j->f, when);
    fprintf(j->f, ",\n  \"args\": [");
    for (int i = 0; i < argc; i++) {
        if (i) fputs(", ", j->f);
        json_str(j->f, argv[i]);
    }
    fprintf(j->f, "],\n  \"nccl_version\": %d,\n  \"nranks\": %d,\n  \"memory\": ", nccl_version,
            nranks);
    json_str(j->f, memory);
    fprintf(j->f,
            ",\n  \"config\": {\"nthreads\": %d, \"ngpus\": %d, \"minbytes\": %zu, "
            "\"maxbytes\": %zu, \"stepbytes\": %zu, \"stepfactor\": %zu, \"iters\": %d, "
            "\"warmup_iters\": %d, \"agg_iters\": %d, \"check\": %d, \"blocking\": %d, "
            "\"average\": %d, \"cudagraph\": %d, \"report_cputime\": %d, \"unalign\": %d, "
            "\"per_iter_skip\": %d, \"walk\": %d, \"dirty\": %d},\n  \"ranks\": [",
            a->nthreads, a->ngpus, a->min_bytes, a->max_bytes, a->step_bytes, a->step_factor,
            a->iters, a->warmup, a->agg, a->check, a->blocking, a->average, a->cudagraph,
            a->report_cputime, a->unalign, a->per_iter_skip, a->walk, a->dirty);
    fflush(j->f);
    return 0;
}

void perf_json_rank(perf_json_t *j, int rank, const char *host, int pid, const char *device) {
    if (j->f == NULL) return;
    fprintf(j->f, "%s\n    {\"rank\": %d, \"pid\": %d, \"host\": ", rank ? "," : "", rank, pid);
    json_str(j->f, host);
    fprintf(j->f, ", \"device\": ");
    json_str(j->f, device);
    fputs("}", j->f);
}

void perf_json_ranks_done(perf_json_t *j) {
    if (j->f == NULL) return;
    fprintf(j->f, "\n  ],\n  \"results\": [");
    fflush(j->f);
}

static void json_result(FILE *f, const char *key, const perf_result_t *r) {
    fprintf(f, "\"%s\": ", key);
    if (r == NULL) {
        fputs("null", f);
        return;
    }
    fputs("{\"time_us\": ", f);
    json_num(f, r->time_us);
    fputs(", \"algbw\": ", f);
    json_num(f, r->algbw);
    fputs(", \"busbw\": ", f);
    json_num(f, r->busbw);
    fputs(", \"nwrong\": ", f);
    if (r->wrong < 0)
        fputs("null", f);
    else
        fprintf(f, "%lld", (long long)r->wrong);
    const char *keys[] = {"p50_us",  "p99_us",           "min_us",          "max_us",
                          "skew_us", "rank_time_min_us", "rank_time_max_us"};
    double vals[] = {r->p50_us,  r->p99_us,           r->min_us,          r->max_us,
                     r->skew_us, r->rank_time_min_us, r->rank_time_max_us};
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        fprintf(f, ", \"%s\": ", keys[i]);
        json_num(f, vals[i]);
    }
    fputs("}", f);
}

void perf_json_row(perf_json_t *j, size_t bytes, size_t count, const char *type, const char *redop,
                   int root, const perf_result_t *oop, const perf_result_t *ip) {
    if (j->f == NULL) return;
    fprintf(j->f, "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": ", j->nrows ? "," : "", bytes,
            count);
    json_str(j->f, type);
    fputs(", \"redop\": ", j->f);
    json_str(j->f, redop);
    fprintf(j->f, ", \"root\": %d, ", root);
    json_result(j->f, "out_of_place", oop);
    fputs(", ", j->f);
    json_result(j->f, "in_place", ip);
    fputs("}", j->f);
    fflush(j->f);
    j->nrows++;
}

void perf_json_close(perf_json_t *j, int errors, double avg_busbw) {
    if (j->f == NULL) return;
    fprintf(j->f, "\n  ],\n  \"errors\": %d,\n  \"avg_busbw\": ", errors);
    json_num(j->f, avg_busbw);
    fputs("\n}\n", j->f);
    fclose(j->f);
    j->f = NULL;
}
