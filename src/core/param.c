/*
 * param.c: the only file that reads the environment.
 *
 * The table in param_table.h is expanded here into descriptors. chorus_param_init() parses every
 * parameter once (thread-safe), CHORUS_<NAME> first, then NCCL_<NAME> where NCCL has the knob, then
 * the default. INT values accept K/M/G suffixes; anything else that is not a number fails init and
 * names the variable. Values are copied (and never freed), so neither a later setenv nor a
 * reset can pull a string from under a reader; chorus_param_reset (ncclResetDebugInit) makes the next access parse again. Parsing never
 * logs while it holds its lock, because logging reads NCCL_DEBUG & co. through this table.
 */
#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
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

static int64_t g_int[PARAM_COUNT];
static char *g_str[PARAM_COUNT]; /* copies: the environment may change after parsing */
static chorus_param_src_t g_src[PARAM_COUNT];
static int g_done;
/* Bumped at every parse: caches of choices made from parameters (the tuner's) compare it. */
static uint64_t g_generation;
static ncclResult_t g_res;
static char g_err[512]; /* why parsing failed, WARNed by every chorus_param_init that returns it */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static int parse_int(const char *s, int64_t *out) {
    char *end;
    while (isspace((unsigned char)*s)) s++;
    if (*s == '\0') return -1;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno != 0 || end == s) return -1;
    long long mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1LL << 10; end++; break;
    case 'm': case 'M': mult = 1LL << 20; end++; break;
    case 'g': case 'G': mult = 1LL << 30; end++; break;
    default: break;
    }
    /* A value whose multiple does not fit is refused, not wrapped. */
    if (v > LLONG_MAX / mult || v < LLONG_MIN / mult) return -1;
    v *= mult;
    if (*end == 'B' || *end == 'b') end++;
    while (isspace((unsigned char)*end)) end++;
    if (*end != '\0') return -1;
    *out = v;
    return 0;
}

/* Parse every parameter. Runs under g_lock and must not log: logging reads its own parameters
 * through this table (chorus_param_init logs after dropping the lock). */
static ncclResult_t parse_all(void) {
    char var[128];
    ncclResult_t res = ncclSuccess;
    g_err[0] = '\0';
    for (int i = 0; i < PARAM_COUNT; i++) {
        const param_desc_t *d = &g_desc[i];
        const char *val = NULL;
        /* The previous copy is not freed: a thread may still hold the pointer it got before a
         * reset (ncclResetDebugInit). Each reset leaks a few short strings, which is harmless. */
        g_str[i] = NULL;
        snprintf(var, sizeof(var), "CHORUS_%s", d->name);
        if ((val = getenv(var)) != NULL) {
            g_src[i] = PARAM_SRC_ENV_CHORUS;
        } else if (d->nccl_alias) {
            snprintf(var, sizeof(var), "NCCL_%s", d->name);
            if ((val = getenv(var)) != NULL) g_src[i] = PARAM_SRC_ENV_NCCL;
        }
        g_int[i] = d->def_i;
        if (val == NULL) {
            g_src[i] = PARAM_SRC_DEFAULT;
            g_str[i] = d->def_s ? strdup(d->def_s) : NULL;
            continue;
        }
        if (d->type == T_INT) {
            if (parse_int(val, &g_int[i]) != 0) {
                if (res == ncclSuccess)
                    snprintf(g_err, sizeof(g_err),
                             "invalid value '%s' for %s: expected an integer (%s)", val, var,
                             d->help);
                g_int[i] = d->def_i;
                res = ncclInvalidArgument;
            }
        } else {
            g_str[i] = strdup(val);
        }
    }
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
    pthread_mutex_unlock(&g_lock);
    if (first) {
        char buf[64];
        for (int i = 0; i < PARAM_COUNT; i++) {
            if (g_src[i] == PARAM_SRC_DEFAULT) continue;
            INFO(SUB_ENV, "%s%s set by environment to %s",
                 g_src[i] == PARAM_SRC_ENV_CHORUS ? "CHORUS_" : "NCCL_", g_desc[i].name,
                 chorus_param_value_text((chorus_param_id_t)i, buf, sizeof(buf)));
        }
    }
    /* Every caller that gets the error is told why: init fails naming the variable. */
    if (res != ncclSuccess) WARN("%s", g_err);
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

int64_t chorus_param_int(chorus_param_id_t id) {
    ensure_init();
    return g_int[id];
}

uint64_t chorus_param_generation(void) {
    ensure_init();
    return __atomic_load_n(&g_generation, __ATOMIC_ACQUIRE);
}

const char *chorus_param_str(chorus_param_id_t id) {
    ensure_init();
    return g_str[id];
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
    return g_src[id];
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
    ensure_init();
    if (g_desc[id].type == T_INT)
        snprintf(buf, len, "%" PRId64, g_int[id]);
    else
        snprintf(buf, len, "%s", g_str[id] ? g_str[id] : "(unset)");
    return buf;
}

const char *chorus_env_foreign(const char *name) { return getenv(name); }
