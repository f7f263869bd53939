/*
 * param.c: the only file that reads the environment.
 *
 * The table in param_table.h is expanded here into descriptors. chorus_param_init() parses every
 * parameter once (thread-safe), CHORUS_<NAME> first, then NCCL_<NAME> where NCCL has the knob, then
 * the default. INT values accept K/M/G suffixes (on non-negative numbers); a value that is not a
 * number, overflows 64 bits with its suffix, or lies outside the parameter's PARAM_RANGE fails init
 * and names the variable, the value and the valid range. A value the user set is never silently
 * replaced: running with another one than asked for would hide the mistake. Values are copied (and never freed), so neither a later setenv nor a
 * reset can pull a string from under a reader; chorus_param_reset (ncclResetDebugInit) makes the next access parse again. Parsing never
 * logs while it holds its lock, because logging reads NCCL_DEBUG & co. through this table.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "param.h"

enum { T_INT, T_STR };
#define T_TYPE_INT T_INT
#define T_TYPE_STR T_STR
#define T_DEF_INT(v) (int64_t)(v), NULL
#define T_DEF_STR(v) 0, (v)

typedef struct {
    const char *name;
    int type;
    int64_t def_i;
    const char *def_s;
    int nccl_alias;
    const char *help;
} param_desc_t;

static const param_desc_t g_desc[PARAM_COUNT] = {
#define PARAM(name, type, def, alias, help) {#name, T_TYPE_##type, T_DEF_##type(def), alias, help},
#include "param_table.h"
#undef PARAM
};

/* Valid range of each INT parameter (PARAM_RANGE rows); has_range 0 for STR parameters. */
typedef struct {
    int has_range;
    int64_t min, max;
} param_range_t;

static param_range_t g_range[PARAM_COUNT];
static pthread_once_t g_range_once = PTHREAD_ONCE_INIT;

static void range_init(void) {
#define PARAM(name, type, def, alias, help)
#define PARAM_RANGE(name, lo, hi) g_range[PARAM_##name] = (param_range_t){1, (lo), (hi)};
#include "param_table.h"
#undef PARAM_RANGE
#undef PARAM
}

int chorus_param_range(chorus_param_id_t id, int64_t *min_p, int64_t *max_p) {
    pthread_once(&g_range_once, range_init);
    if (!g_range[id].has_range) return 0;
    *min_p = g_range[id].min;
    *max_p = g_range[id].max;
    return 1;
}

static int64_t g_int[PARAM_COUNT];
static char *g_str[PARAM_COUNT]; /* copies: the environment may change after parsing */
static chorus_param_src_t g_src[PARAM_COUNT];
static int g_done;
/* Bumped at every parse: caches of choices made from parameters (the tuner's) compare it. */
static uint64_t g_generation;
static ncclResult_t g_res;
static char g_err[512]; /* why parsing failed, WARNed by every chorus_param_init that returns it */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* An integer with an optional K/M/G suffix (x 2^10, 2^20, 2^30) and an optional B. 0, or -1 with
 * *why set: not a number, out of 64 bits, or a suffix on a negative number. */
static int parse_int(const char *s, int64_t *out, const char **why) {
    char *end;
    while (isspace((unsigned char)*s)) s++;
    *why = "expected an integer, optionally with a K, M or G suffix";
    if (*s == '\0') return -1;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (end == s) return -1;
    if (errno == ERANGE) {
        *why = "does not fit 64 bits";
        return -1;
    }
    if (errno != 0) return -1;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    while (isspace((unsigned char)*end)) end++;
    if (*end != '\0') return -1;
    if (shift > 0) {
        if (v < 0) {
            *why = "a size suffix needs a non-negative number";
            return -1;
        }
        if (v > (INT64_MAX >> shift)) {
            *why = "does not fit 64 bits with its suffix";
            return -1;
        }
        v *= (long long)1 << shift;
    }
    *out = v;
    return 0;
}

/* "1..1024", or "-1..(no limit)". */
static const char *range_text(const param_range_t *r, char *buf, size_t len) {
    if (r->max == INT64_MAX)
        snprintf(buf, len, "%" PRId64 " or more", r->min);
    else
        snprintf(buf, len, "%" PRId64 "..%" PRId64, r->min, r->max);
    return buf;
}

/* Conditions between parameters, once each is in its own range. */
static void check_pairs(ncclResult_t *res) {
    const int64_t buffsize = g_int[PARAM_BUFFSIZE], nslots = g_int[PARAM_NSLOTS];
    if (*res == ncclSuccess && buffsize / nslots / 64 * 64 < 64) {
        snprintf(g_err, sizeof(g_err),
                 "NCCL_BUFFSIZE=%" PRId64 " with CHORUS_NSLOTS=%" PRId64 " leaves %" PRId64
                 " bytes per slot: the slots need 64 bytes each at least (BUFFSIZE >= 64 x "
                 "NSLOTS)",
                 buffsize, nslots, buffsize / nslots);
        *res = ncclInvalidArgument;
    }
}

/* Parse every parameter. Runs under g_lock and must not log: logging reads its own parameters
 * through this table (chorus_param_init logs after dropping the lock). */
static ncclResult_t parse_all(void) {
    char var[128];
    ncclResult_t res = ncclSuccess;
    g_err[0] = '\0';
    pthread_once(&g_range_once, range_init);
    for (int i = 0; i < PARAM_COUNT; i++) {
        const param_desc_t *d = &g_desc[i];
        const char *val = NULL;
        /* The previous copy is not freed: a thread may still hold the pointer it got before a
         * reset (ncclResetDebugInit). Each reset leaks a few short strings, which is harmless. */
        __atomic_store_n(&g_str[i], NULL, __ATOMIC_RELEASE);
        snprintf(var, sizeof(var), "CHORUS_%s", d->name);
        if ((val = getenv(var)) != NULL) {
            __atomic_store_n(&g_src[i], PARAM_SRC_ENV_CHORUS, __ATOMIC_RELAXED);
        } else if (d->nccl_alias) {
            snprintf(var, sizeof(var), "NCCL_%s", d->name);
            if ((val = getenv(var)) != NULL)
                __atomic_store_n(&g_src[i], PARAM_SRC_ENV_NCCL, __ATOMIC_RELAXED);
        }
        __atomic_store_n(&g_int[i], d->def_i, __ATOMIC_RELAXED);
        if (val == NULL) {
            __atomic_store_n(&g_src[i], PARAM_SRC_DEFAULT, __ATOMIC_RELAXED);
            __atomic_store_n(&g_str[i], d->def_s ? strdup(d->def_s) : NULL, __ATOMIC_RELEASE);
            continue;
        }
        if (d->type == T_INT) {
            const param_range_t *r = &g_range[i];
            char rbuf[64] = "";
            if (r->has_range) range_text(r, rbuf, sizeof(rbuf));
            const char *why;
            int64_t v;
            if (parse_int(val, &v, &why) != 0) {
                if (res == ncclSuccess)
                    snprintf(g_err, sizeof(g_err),
                             "invalid value '%s' for %s: %s%s%s (%.200s)", val, var, why,
                             r->has_range ? "; valid: " : "", rbuf, d->help);
                res = ncclInvalidArgument;
            } else if (r->has_range && (v < r->min || v > r->max)) {
                if (res == ncclSuccess)
                    snprintf(g_err, sizeof(g_err),
                             "%s=%s is out of range: valid values are %s (%.200s)", var, val,
                             rbuf, d->help);
                res = ncclInvalidArgument;
            } else {
                __atomic_store_n(&g_int[i], v, __ATOMIC_RELAXED);
            }
        } else {
            __atomic_store_n(&g_str[i], strdup(val), __ATOMIC_RELEASE);
        }
    }
    check_pairs(&res);
    return res;
}

ncclResult_t chorus_param_init(void) {
    int first = 0;
    pthread_mutex_lock(&g_lock);
    if (!g_done) {
        g_res = parse_all();
        __atomic_add_fetch(&g_generation, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&g_done, 1, __ATOMIC_RELEASE);
        first = 1;
    }
    ncclResult_t res = g_res;
    char err[sizeof(g_err)] = "";
    if (res != ncclSuccess) memcpy(err, g_err, sizeof(err)); /* a reset may parse again */
    pthread_mutex_unlock(&g_lock);
    if (first) {
        char buf[64];
        for (int i = 0; i < PARAM_COUNT; i++) {
            const chorus_param_src_t src = chorus_param_source((chorus_param_id_t)i);
            if (src == PARAM_SRC_DEFAULT) continue;
            INFO(SUB_ENV, "%s%s set by environment to %s",
                 src == PARAM_SRC_ENV_CHORUS ? "CHORUS_" : "NCCL_", g_desc[i].name,
                 chorus_param_value_text((chorus_param_id_t)i, buf, sizeof(buf)));
        }
    }
    /* Every caller that gets the error is told why: init fails naming the variable. */
    if (res != ncclSuccess) WARN("%s", err);
    return res;
}

void chorus_param_reset(void) {
    pthread_mutex_lock(&g_lock);
    __atomic_store_n(&g_done, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
}

static void ensure_init(void) {
    if (!__atomic_load_n(&g_done, __ATOMIC_ACQUIRE)) (void)chorus_param_init();
}

/* The values are atomic words: ncclResetDebugInit lets one thread parse them again while others
 * read them. */
int64_t chorus_param_int(chorus_param_id_t id) {
    ensure_init();
    return __atomic_load_n(&g_int[id], __ATOMIC_RELAXED);
}

uint64_t chorus_param_generation(void) {
    ensure_init();
    return __atomic_load_n(&g_generation, __ATOMIC_ACQUIRE);
}

const char *chorus_param_str(chorus_param_id_t id) {
    ensure_init();
    return __atomic_load_n(&g_str[id], __ATOMIC_ACQUIRE);
}

const char *chorus_param_name(chorus_param_id_t id) { return g_desc[id].name; }
const char *chorus_param_help(chorus_param_id_t id) { return g_desc[id].help; }
int chorus_param_has_nccl_alias(chorus_param_id_t id) { return g_desc[id].nccl_alias; }
int chorus_param_is_int(chorus_param_id_t id) { return g_desc[id].type == T_INT; }

const char *chorus_param_default_text(chorus_param_id_t id, char *buf, int len) {
    if (g_desc[id].type == T_INT)
        snprintf(buf, len, "%" PRId64, g_desc[id].def_i);
    else
        snprintf(buf, len, "%s", g_desc[id].def_s ? g_desc[id].def_s : "(unset)");
    return buf;
}

chorus_param_src_t chorus_param_source(chorus_param_id_t id) {
    ensure_init();
    return __atomic_load_n(&g_src[id], __ATOMIC_RELAXED);
}

const char *chorus_param_source_name(chorus_param_src_t src) {
    switch (src) {
    case PARAM_SRC_ENV_CHORUS: return "env CHORUS_";
    case PARAM_SRC_ENV_NCCL: return "env NCCL_";
    case PARAM_SRC_API: return "api";
    default: return "default";
    }
}

const char *chorus_param_value_text(chorus_param_id_t id, char *buf, int len) {
    const char *str = chorus_param_str(id);
    if (id == PARAM_JOB_SECRET && str != NULL)
        snprintf(buf, len, "(set, not shown)"); /* a secret stays out of logs and chorus_info */
    else if (g_desc[id].type == T_INT)
        snprintf(buf, len, "%" PRId64, chorus_param_int(id));
    else
        snprintf(buf, len, "%s", str ? str : "(unset)");
    return buf;
}

const char *chorus_env_foreign(const char *name) { return getenv(name); }
