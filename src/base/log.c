/*
 * log.c: NCCL-shaped log lines and the last-error text.
 *
 * `host:pid:tid [rank] NCCL INFO msg`. The level and subsystems come from NCCL_DEBUG and
 * NCCL_DEBUG_SUBSYS (through the parameter table), the destination from NCCL_DEBUG_FILE.
 * Every WARN is also kept in a process-wide buffer so that ncclGetLastError can return it.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "log.h"
#include "nccl.h"
#include "param.h"

int chorus_log_level = -1;
uint64_t chorus_log_subsys = SUB_INIT | SUB_ENV;

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *g_log_file;
static char g_host[64];
static char g_last_error[1024];
static __thread int t_rank = -1;

static const struct {
    const char *name;
    uint64_t bit;
} g_subsys[] = {{"INIT", SUB_INIT},   {"COLL", SUB_COLL},   {"P2P", SUB_P2P},
                {"SHM", SUB_SHM},     {"NET", SUB_NET},     {"GRAPH", SUB_GRAPH},
                {"TUNING", SUB_TUNING}, {"ENV", SUB_ENV},   {"ALLOC", SUB_ALLOC},
                {"CALL", SUB_CALL},   {"PROXY", SUB_PROXY}, {"BOOTSTRAP", SUB_BOOTSTRAP},
                {"REG", SUB_REG},     {"ALL", SUB_ALL}};

static uint64_t parse_subsys(const char *s) {
    uint64_t mask = 0;
    int invert = 0;
    char buf[256];
    if (s == NULL) return SUB_INIT | SUB_ENV;
    if (*s == '^') {
        invert = 1;
        s++;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        for (size_t i = 0; i < sizeof(g_subsys) / sizeof(g_subsys[0]); i++)
            if (strcasecmp(tok, g_subsys[i].name) == 0) mask |= g_subsys[i].bit;
    }
    return invert ? ~mask : mask;
}

static FILE *open_log_file(const char *pattern) {
    char name[512];
    int j = 0;
    for (const char *p = pattern; *p && j < (int)sizeof(name) - 32; p++) {
        if (p[0] == '%' && p[1] == 'h') {
            j += snprintf(name + j, sizeof(name) - j, "%s", g_host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            j += snprintf(name + j, sizeof(name) - j, "%d", (int)getpid());
            p++;
        } else {
            name[j++] = *p;
        }
    }
    name[j] = '\0';
    FILE *f = fopen(name, "w");
    if (f) setvbuf(f, NULL, _IOLBF, 0);
    return f ? f : stdout;
}

void chorus_log_init(void) {
    /* Parsing the parameters may log (a malformed value WARNs): that nested call must not come
     * back here, and it must not find g_log_lock held. So parse first, outside the lock. */
    static __thread int t_in_init;
    if (t_in_init) return;
    t_in_init = 1;
    ncclResult_t pres = chorus_param_init();
    pthread_mutex_lock(&g_log_lock);
    if (chorus_log_level >= 0) {
        pthread_mutex_unlock(&g_log_lock);
        t_in_init = 0;
        return;
    }
    gethostname(g_host, sizeof(g_host) - 1);
    char *dot = strchr(g_host, '.');
    if (dot) *dot = '\0';
    int level = LOG_NONE;
    const char *lv = chorus_param_str(PARAM_DEBUG);
    if (lv == NULL) level = LOG_NONE;
    else if (strcasecmp(lv, "VERSION") == 0) level = LOG_VERSION;
    else if (strcasecmp(lv, "WARN") == 0) level = LOG_WARN;
    else if (strcasecmp(lv, "INFO") == 0) level = LOG_INFO;
    else if (strcasecmp(lv, "ABORT") == 0) level = LOG_ABORT;
    else if (strcasecmp(lv, "TRACE") == 0) level = LOG_TRACE;
    /* A malformed parameter: make sure the WARN that init returns is seen. */
    if (pres != ncclSuccess && level < LOG_WARN) level = LOG_WARN;
    chorus_log_subsys = parse_subsys(chorus_param_str(PARAM_DEBUG_SUBSYS));
    const char *file = chorus_param_str(PARAM_DEBUG_FILE);
    g_log_file = (file && level > LOG_NONE) ? open_log_file(file) : stdout;
    __atomic_store_n(&chorus_log_level, level, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_log_lock);
    t_in_init = 0;
}

void chorus_log_reset(void) {
    pthread_mutex_lock(&g_log_lock);
    if (g_log_file && g_log_file != stdout) fclose(g_log_file);
    g_log_file = NULL;
    __atomic_store_n(&chorus_log_level, -1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_log_lock);
}

void chorus_log_set_rank(int rank) { t_rank = rank; }

void chorus_log(chorus_log_level_t level, uint64_t subsys, const char *file, int line,
                const char *fmt, ...) {
    if (chorus_log_level_now() < 0) chorus_log_init();
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level == LOG_WARN) {
        pthread_mutex_lock(&g_log_lock);
        snprintf(g_last_error, sizeof(g_last_error), "%s", msg);
        pthread_mutex_unlock(&g_log_lock);
    }
    if (chorus_log_level_now() < (int)level) return;
    if (level != LOG_WARN && !(chorus_log_subsys & subsys)) return;
    char head[160];
    int tid = (int)syscall(SYS_gettid);
    const char *tag = level == LOG_WARN ? "WARN" : level == LOG_TRACE ? "TRACE" : "INFO";
    if (t_rank >= 0)
        snprintf(head, sizeof(head), "%s:%d:%d [%d] NCCL %s", g_host, (int)getpid(), tid, t_rank, tag);
    else
        snprintf(head, sizeof(head), "%s:%d:%d NCCL %s", g_host, (int)getpid(), tid, tag);
    /* Under the lock: ncclResetDebugInit may close the file from another thread. */
    pthread_mutex_lock(&g_log_lock);
    FILE *out = g_log_file ? g_log_file : stdout;
    if (level == LOG_WARN)
        fprintf(out, "%s %s:%d %s\n", head, strrchr(file, '/') ? strrchr(file, '/') + 1 : file,
                line, msg); /* basenames are unique in the tree (STYLE.md) */
    else
        fprintf(out, "%s %s\n", head, msg);
    fflush(out);
    pthread_mutex_unlock(&g_log_lock);
}

/* The caller gets its own copy, taken under the lock: another thread's WARN may rewrite
 * g_last_error at any moment, and a pointer to it could be read half old, half new. The copy
 * stays valid until this thread's next call. It lives on the heap, one per thread (freed at the
 * thread's exit), not in thread-local storage: the library's TLS block is static (a few
 * variables are initial-exec for speed), and a process that loads it with dlopen (Python's
 * ctypes, after torch) has only a small static TLS reserve left for it. */
static pthread_key_t g_copy_key;
static pthread_once_t g_copy_once = PTHREAD_ONCE_INIT;
static int g_copy_key_ok;

static void last_error_key_make(void) { g_copy_key_ok = pthread_key_create(&g_copy_key, free) == 0; }

const char *chorus_log_last_error(void) {
    pthread_once(&g_copy_once, last_error_key_make);
    char *copy = g_copy_key_ok ? pthread_getspecific(g_copy_key) : NULL;
    if (copy == NULL) {
        copy = malloc(sizeof(g_last_error));
        if (copy == NULL || !g_copy_key_ok || pthread_setspecific(g_copy_key, copy) != 0) {
            free(copy);
            return "(no memory for the last error's text)";
        }
    }
    pthread_mutex_lock(&g_log_lock);
    memcpy(copy, g_last_error, sizeof(g_last_error));
    pthread_mutex_unlock(&g_log_lock);
    return copy;
}

static void chorus_log_version_line(void) {
    pthread_mutex_lock(&g_log_lock);
    FILE *out = g_log_file ? g_log_file : stdout;
    fprintf(out, "%s:%d NCCL VERSION Chorus %s (NCCL API %d.%d.%d) from %s\n", g_host, (int)getpid(),
            CHORUS_VERSION_STRING, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, chorus_library_path());
    fflush(out);
    pthread_mutex_unlock(&g_log_lock);
}

const char *chorus_library_path(void) {
    static char path[4096];
    Dl_info info;
    if (dladdr((void *)&chorus_library_path, &info) == 0 || info.dli_fname == NULL)
        return "(unknown)";
    if (realpath(info.dli_fname, path) == NULL) return info.dli_fname;
    return path;
}

void chorus_log_version_once(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (chorus_log_level < 0) chorus_log_init();
    if (chorus_log_level < LOG_VERSION) return;
    pthread_once(&once, chorus_log_version_line);
}
