/*
 * ch_rt_emu.c: the device runtime's emulator (see ch_rt.h and ch_rt_emu.h).
 *
 * Memory: each emulated device allocation is recorded in a registry (ch_rt_emu_mem.c), and
 * chorus_mem_kind asks the registry first. Streams: a queue of
 * items (launch, event record) run in order by the stream's thread. A launch runs channel 0 on the
 * stream's thread and channels 1..nch-1 on threads of their own, each as ch_cpu_block: what one
 * block of the kernel does, with the host reduction kernels. The waits of an emulated block have
 * the CHORUS_TIMEOUT deadline (a GPU block has none: there the host's drain writes the error word
 * once its own deadline passes). Copy-engine programs run on the stream's thread, one after the
 * other, with the host kernels; their waits end as a GPU's do (emu_ce_wait). Shared memory
 * between processes: ch_rt_emu_shm.c.
 *
 * Capture: a capturing stream appends launches to a list of its own instead of its queue; ending
 * the capture hands the list over as a graph; an executable graph is a copy of it, and launching
 * one queues a copy of its launches on a stream under one lock, so they run in order and nothing
 * else queued on that stream runs between them. A launch's arguments are values (the plan,
 * buffer addresses, the connections, the op counters), so every copy runs the same op; what
 * changes from run to run lives in the emulated device memory the launch points to.
 */
#include "ch_rt_emu.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ch_proto.h"
#include "ch_rt.h"
#include "ch_rt_emu_shm.h"
#include "cpu_exec.h"
#include "cuda_util.h"
#include "log.h"
#include "param.h"

/* ---- streams -------------------------------------------------------------------------------- */

typedef struct emu_event {
    uint64_t recorded;  /* records queued (caller) */
    uint64_t completed; /* records run (the stream's thread) */
} emu_event_t;

enum { EMU_LAUNCH = 0, EMU_EVENT, EMU_CE, EMU_BUSY };

typedef struct emu_item {
    int kind;
    ch_kernel_args_t args;
    ch_ce_prog_t *progs; /* EMU_CE: owned copies */
    int nprogs;
    chorus_redop_t rop;
    uint32_t *err;
    emu_event_t *ev;
    uint64_t ev_gen;
    int busy_ms; /* EMU_BUSY */
    struct emu_item *next;
} emu_item_t;

struct ch_emu_stream {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    emu_item_t *head, *tail;
    uint64_t queued, ran;
    unsigned long launches;
    int stop;
    /* Threads in ch_emu_stream_sync: the stream's thread wakes them after each item only when
     * there are any, and a push wakes the stream's thread only when its queue was empty (it
     * waits for nothing else), so queuing costs no wake-up while the thread is busy. */
    int sync_waiters;
    pthread_t thread;
    /* Capture: while capturing, launches go to the list cap_head..cap_tail instead of the
     * queue; cap_broken: something that cannot be captured was queued (capture_end fails). */
    int capturing, cap_broken;
    emu_item_t *cap_head, *cap_tail;
};

/* A recorded graph, and its executable form: the launches, in order. */
typedef struct {
    emu_item_t *head;
} emu_graph_t;

static void emu_item_free(emu_item_t *it) {
    if (it == NULL) return;
    if (it->kind == EMU_CE) {
        for (int i = 0; i < it->nprogs; i++)
            ch_ce_prog_free(&it->progs[i]);
        free(it->progs);
    }
    free(it);
}

static void emu_list_free(emu_item_t *it) {
    while (it) {
        emu_item_t *next = it->next;
        emu_item_free(it);
        it = next;
    }
}

/* The streams created, so that a stream handle can be told apart from a CUDA stream. */
static pthread_mutex_t g_streams_lock = PTHREAD_MUTEX_INITIALIZER;
static ch_emu_stream_t **g_streams;
static size_t g_nstreams, g_cap_streams;

static int emu_streams_add(ch_emu_stream_t *s) {
    int ok = 1;
    pthread_mutex_lock(&g_streams_lock);
    if (g_nstreams == g_cap_streams) {
        const size_t cap = g_cap_streams ? 2 * g_cap_streams : 16;
        ch_emu_stream_t **n = realloc(g_streams, cap * sizeof(*n));
        if (n) {
            g_streams = n;
            g_cap_streams = cap;
        } else {
            ok = 0;
        }
    }
    if (ok) g_streams[g_nstreams++] = s;
    pthread_mutex_unlock(&g_streams_lock);
    return ok;
}

static void emu_streams_remove(ch_emu_stream_t *s) {
    pthread_mutex_lock(&g_streams_lock);
    for (size_t i = 0; i < g_nstreams; i++) {
        if (g_streams[i] == s) {
            g_streams[i] = g_streams[--g_nstreams];
            break;
        }
    }
    pthread_mutex_unlock(&g_streams_lock);
}

int ch_emu_stream_capture_status(const void *stream, int *capturing) {
    if (stream == NULL) return 0;
    int found = 0;
    pthread_mutex_lock(&g_streams_lock);
    for (size_t i = 0; i < g_nstreams && !found; i++)
        found = g_streams[i] == (const ch_emu_stream_t *)stream;
    pthread_mutex_unlock(&g_streams_lock);
    if (!found) return 0;
    ch_emu_stream_t *s = (ch_emu_stream_t *)stream;
    pthread_mutex_lock(&s->lock);
    *capturing = s->capturing;
    pthread_mutex_unlock(&s->lock);
    return 1;
}

static int64_t emu_timeout_ns(void) {
    return chorus_param_int(PARAM_TIMEOUT) * (int64_t)1000000000;
}

typedef struct {
    const ch_kernel_args_t *a;
    int c;
    int64_t deadline;
    pthread_t tid;
} emu_block_t;

static void *emu_block_main(void *arg) {
    emu_block_t *b = (emu_block_t *)arg;
    (void)ch_cpu_block(b->a, b->c, b->deadline);
    return NULL;
}

/* One launch: a thread per channel (channel 0 on the stream's thread), joined before the stream
 * runs its next item, as the next kernel on a GPU stream starts after this one. Its waits end at
 * CHORUS_TIMEOUT; a launch whose blocks a host watchdog watches (a->blocks: the communicators'
 * launches) is released by that watchdog as on a GPU, so it gets twice that, a safety net. */
static void emu_run_launch(const ch_kernel_args_t *a) {
    const int nch = a->plan.nch;
    const int64_t deadline = ch_host_now_ns() + (a->blocks ? 2 : 1) * emu_timeout_ns();
    emu_block_t *blk = calloc((size_t)nch, sizeof(*blk));
    char *started = calloc((size_t)nch, 1);
    if (blk == NULL || started == NULL) {
        ch_set_once32(a->err, CH_ERR_ABORT);
        free(blk);
        free(started);
        return;
    }
    for (int c = 1; c < nch; c++) {
        blk[c].a = a;
        blk[c].c = c;
        blk[c].deadline = deadline;
        if (pthread_create(&blk[c].tid, NULL, emu_block_main, &blk[c]) == 0)
            started[c] = 1;
        else
            ch_set_once32(a->err, CH_ERR_ABORT);
    }
    (void)ch_cpu_block(a, 0, deadline);
    for (int c = 1; c < nch; c++)
        if (started[c]) pthread_join(blk[c].tid, NULL);
    free(blk);
    free(started);
}

/* Copy-engine programs run as a GPU's front end runs them: a wait ends only when its value comes
 * (the error word does not end it: on an error the host writes the awaited words), with twice
 * CHORUS_TIMEOUT from the start of the item as the emulator's safety net (the host's own
 * deadline, CHORUS_TIMEOUT without progress, comes first). */
typedef struct {
    uint32_t *err;
    int64_t deadline;
} emu_ce_ctx_t;

static uint32_t emu_ce_wait(void *ctx, uint64_t *addr, uint64_t value) {
    const emu_ce_ctx_t *c = (const emu_ce_ctx_t *)ctx;
    for (unsigned spins = 0; ch_ld_acquire(addr) < value; spins++) {
        if (spins % 64 != 63) continue;
        if (ch_host_now_ns() > c->deadline) {
            WARN("device emulator: a copy-engine wait (%llu) passed twice CHORUS_TIMEOUT",
                 (unsigned long long)value);
            return ch_set_once32(c->err, CH_ERR_TIMEOUT);
        }
        sched_yield();
    }
    return CH_OK;
}

static uint32_t emu_ce_write(void *ctx, uint64_t *addr, uint64_t value) {
    (void)ctx;
    return ch_ce_cpu_ops.write(NULL, addr, value);
}

static uint32_t emu_ce_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    return ch_ce_cpu_ops.copy(NULL, dst, src, bytes);
}

static uint32_t emu_ce_reduce(void *ctx, int shape, void *dst, const void *in, const void *acc,
                              size_t count, const chorus_redop_t *rop) {
    (void)ctx;
    return ch_ce_cpu_ops.reduce(NULL, shape, dst, in, acc, count, rop);
}

static const ch_ce_ops_t emu_ce_ops = {
    .wait_geq = emu_ce_wait,
    .write = emu_ce_write,
    .copy = emu_ce_copy,
    .reduce = emu_ce_reduce,
};

static void *emu_stream_main(void *arg) {
    ch_emu_stream_t *s = (ch_emu_stream_t *)arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cond, &s->lock);
        if (s->head == NULL) break;
        emu_item_t *it = s->head;
        pthread_mutex_unlock(&s->lock);
        if (it->kind == EMU_LAUNCH) {
            emu_run_launch(&it->args);
        } else if (it->kind == EMU_CE) {
            emu_ce_ctx_t ctx = {it->err, ch_host_now_ns() + 2 * emu_timeout_ns()};
            for (int i = 0; i < it->nprogs; i++)
                if (ch_ce_run(&it->progs[i], &emu_ce_ops, &ctx, &it->rop) != CH_OK) break;
        } else if (it->kind == EMU_BUSY) {
            struct timespec ts = {it->busy_ms / 1000, (long)(it->busy_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        } else {
            uint64_t cur = __atomic_load_n(&it->ev->completed, __ATOMIC_RELAXED);
            if (it->ev_gen > cur)
                __atomic_store_n(&it->ev->completed, it->ev_gen, __ATOMIC_RELEASE);
        }
        pthread_mutex_lock(&s->lock);
        s->head = it->next;
        if (s->head == NULL) s->tail = NULL;
        if (it->kind != EMU_EVENT && it->kind != EMU_BUSY) s->launches++;
        s->ran++;
        emu_item_free(it);
        if (s->sync_waiters) pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

ch_emu_stream_t *ch_emu_stream_create(void) {
    ch_emu_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL) return NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    if (pthread_create(&s->thread, NULL, emu_stream_main, s) != 0) {
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->cond);
        free(s);
        return NULL;
    }
    if (!emu_streams_add(s)) {
        ch_emu_stream_destroy(s);
        return NULL;
    }
    return s;
}

static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;
static ch_emu_stream_t *g_default;

static void emu_default_create(void) {
    g_default = ch_emu_stream_create();
}

static ch_emu_stream_t *emu_stream(void *stream) {
    if (stream) return (ch_emu_stream_t *)stream;
    pthread_once(&g_default_once, emu_default_create);
    return g_default;
}

static ncclResult_t emu_push(void *stream, emu_item_t *it) {
    ch_emu_stream_t *s = emu_stream(stream);
    if (s == NULL) {
        emu_item_free(it);
        WARN("device emulator: no default stream (out of memory or threads)");
        return ncclSystemError;
    }
    pthread_mutex_lock(&s->lock);
    if (s->capturing) {
        /* Recorded, not run. Only launches can be: an event or a copy-engine program would
         * need the host to see its progress, which a replay does not give it. */
        const int kind = it->kind;
        if (kind == EMU_LAUNCH) {
            if (s->cap_tail)
                s->cap_tail->next = it;
            else
                s->cap_head = it;
            s->cap_tail = it;
        } else {
            s->cap_broken = 1;
        }
        pthread_mutex_unlock(&s->lock);
        if (kind == EMU_LAUNCH) return ncclSuccess;
        emu_item_free(it);
        WARN("device emulator: %s queued on a capturing stream cannot be captured",
             kind == EMU_CE     ? "a copy-engine program"
             : kind == EMU_BUSY ? "a busy item"
                                : "an event record");
        return ncclInvalidUsage;
    }
    const int was_empty = s->head == NULL;
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    s->queued++;
    if (was_empty) pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return ncclSuccess;
}

ncclResult_t ch_emu_stream_sync(ch_emu_stream_t *stream) {
    ch_emu_stream_t *s = emu_stream(stream);
    if (s == NULL) return ncclSuccess;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    /* Past the deadline of the launches it waits for (each ends by CHORUS_TIMEOUT). */
    dl.tv_sec += 2 * (time_t)chorus_param_int(PARAM_TIMEOUT) + 5;
    ncclResult_t res = ncclSuccess;
    pthread_mutex_lock(&s->lock);
    const uint64_t want = s->queued;
    s->sync_waiters++;
    while (s->ran < want) {
        if (pthread_cond_timedwait(&s->cond, &s->lock, &dl) != 0 && s->ran < want) {
            WARN("device emulator: stream %p did not finish its work within CHORUS_TIMEOUT",
                 (void *)s);
            res = ncclSystemError;
            break;
        }
    }
    s->sync_waiters--;
    pthread_mutex_unlock(&s->lock);
    return res;
}

void ch_emu_stream_destroy(ch_emu_stream_t *s) {
    if (s == NULL) return;
    emu_streams_remove(s);
    (void)ch_emu_stream_sync(s);
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    emu_list_free(s->cap_head);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
}

unsigned long ch_emu_stream_launches(ch_emu_stream_t *stream) {
    ch_emu_stream_t *s = emu_stream(stream);
    if (s == NULL) return 0;
    pthread_mutex_lock(&s->lock);
    unsigned long n = s->launches;
    pthread_mutex_unlock(&s->lock);
    return n;
}

/* ---- the runtime table ---------------------------------------------------------------------- */

static ncclResult_t emu_dev_alloc(void **p, size_t bytes) {
    *p = ch_emu_malloc(bytes);
    if (*p == NULL) {
        WARN("device emulator: out of memory for %zu bytes", bytes);
        return ncclSystemError;
    }
    return ncclSuccess;
}

static ncclResult_t emu_host_mapped_alloc(void **host, void **dev, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (p == NULL) {
        WARN("device emulator: out of memory for %zu bytes", bytes);
        return ncclSystemError;
    }
    *host = p;
    if (dev) *dev = p;
    return ncclSuccess;
}

static ncclResult_t emu_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
    return ncclSuccess;
}

static ncclResult_t emu_launch(const ch_kernel_args_t *a, void *stream) {
    if ((a->proto != CH_PROTO_SIMPLE && a->proto != CH_PROTO_LL) || a->ll_bytes % 8 ||
        a->plan.nch < 1 || a->plan.esize != chorus_dtype_size(a->redop.dtype) ||
        (a->proto == CH_PROTO_LL && a->plan.chunk_elems * a->plan.esize > a->ll_bytes))
        return ncclInvalidArgument;
    emu_item_t *it = calloc(1, sizeof(*it));
    if (it == NULL) return ncclSystemError;
    it->kind = EMU_LAUNCH;
    it->args = *a;
    return emu_push(stream, it);
}

static ncclResult_t emu_event_create(void **ev) {
    emu_event_t *e = calloc(1, sizeof(*e));
    if (e == NULL) return ncclSystemError;
    *ev = e;
    return ncclSuccess;
}

static ncclResult_t emu_event_record(void *ev, void *stream) {
    emu_event_t *e = (emu_event_t *)ev;
    emu_item_t *it = calloc(1, sizeof(*it));
    if (it == NULL) return ncclSystemError;
    it->kind = EMU_EVENT;
    it->ev = e;
    it->ev_gen = ++e->recorded; /* records of one event come from one thread at a time */
    ncclResult_t res = emu_push(stream, it);
    if (res != ncclSuccess) e->recorded--; /* not queued: nothing to wait for */
    return res;
}

ncclResult_t ch_emu_stream_busy(ch_emu_stream_t *s, int ms) {
    emu_item_t *it = calloc(1, sizeof(*it));
    if (it == NULL) return ncclSystemError;
    it->kind = EMU_BUSY;
    it->busy_ms = ms;
    return emu_push(s, it);
}

static int emu_event_query(void *ev) {
    emu_event_t *e = (emu_event_t *)ev;
    return __atomic_load_n(&e->completed, __ATOMIC_ACQUIRE) >= e->recorded;
}

static void emu_event_destroy(void *ev) {
    free(ev);
}

/* ---- capture and graphs ---- */

static ncclResult_t emu_capture_begin(void *stream) {
    if (stream == NULL) {
        WARN("device emulator: the default stream cannot be captured");
        return ncclInvalidUsage;
    }
    ch_emu_stream_t *s = (ch_emu_stream_t *)stream;
    ncclResult_t res = ncclSuccess;
    pthread_mutex_lock(&s->lock);
    if (s->capturing) {
        res = ncclInvalidUsage;
    } else {
        s->capturing = 1;
        s->cap_broken = 0;
    }
    pthread_mutex_unlock(&s->lock);
    if (res != ncclSuccess) WARN("device emulator: stream %p is already capturing", stream);
    return res;
}

static ncclResult_t emu_capture_end(void *stream, void **graph) {
    *graph = NULL;
    if (stream == NULL) return ncclInvalidUsage;
    ch_emu_stream_t *s = (ch_emu_stream_t *)stream;
    pthread_mutex_lock(&s->lock);
    const int was = s->capturing, broken = s->cap_broken;
    emu_item_t *head = s->cap_head;
    s->capturing = s->cap_broken = 0;
    s->cap_head = s->cap_tail = NULL;
    pthread_mutex_unlock(&s->lock);
    if (!was || broken) {
        emu_list_free(head);
        WARN("device emulator: stream %p %s", stream,
             !was ? "was not capturing" : "queued work that cannot be captured: no graph");
        return ncclInvalidUsage;
    }
    emu_graph_t *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        emu_list_free(head);
        return ncclSystemError;
    }
    g->head = head;
    *graph = g;
    return ncclSuccess;
}

static __thread unsigned long emu_capture_queries;

unsigned long ch_emu_capture_queries(void) {
    return emu_capture_queries;
}

static ncclResult_t emu_stream_capturing(void *stream, int *capturing) {
    emu_capture_queries++;
    *capturing = 0;
    if (stream == NULL) return ncclSuccess; /* the default stream never captures */
    ch_emu_stream_t *s = (ch_emu_stream_t *)stream;
    pthread_mutex_lock(&s->lock);
    *capturing = s->capturing;
    pthread_mutex_unlock(&s->lock);
    return ncclSuccess;
}

/* A copy of a graph's launches (the list from head, and its tail); NULL when out of memory. */
static emu_item_t *emu_list_copy(const emu_item_t *head, emu_item_t **tail, size_t *n) {
    emu_item_t *first = NULL, *last = NULL;
    *n = 0;
    for (const emu_item_t *it = head; it; it = it->next) {
        emu_item_t *c = malloc(sizeof(*c));
        if (c == NULL) {
            emu_list_free(first);
            return NULL;
        }
        *c = *it;
        c->next = NULL;
        if (last)
            last->next = c;
        else
            first = c;
        last = c;
        (*n)++;
    }
    *tail = last;
    return first;
}

static ncclResult_t emu_graph_instantiate(void **exec, void *graph) {
    *exec = NULL;
    const emu_graph_t *g = (const emu_graph_t *)graph;
    emu_graph_t *x = calloc(1, sizeof(*x));
    emu_item_t *tail;
    size_t n;
    if (x == NULL) return ncclSystemError;
    x->head = emu_list_copy(g->head, &tail, &n);
    if (g->head && x->head == NULL) {
        free(x);
        return ncclSystemError;
    }
    *exec = x;
    return ncclSuccess;
}

static ncclResult_t emu_graph_launch(void *exec, void *stream) {
    const emu_graph_t *x = (const emu_graph_t *)exec;
    emu_item_t *tail = NULL;
    size_t n = 0;
    emu_item_t *head = emu_list_copy(x->head, &tail, &n);
    if (x->head && head == NULL) {
        WARN("device emulator: out of memory launching a graph");
        return ncclSystemError;
    }
    if (head == NULL) return ncclSuccess; /* an empty graph */
    ch_emu_stream_t *s = emu_stream(stream);
    if (s == NULL) {
        emu_list_free(head);
        return ncclSystemError;
    }
    pthread_mutex_lock(&s->lock);
    const int capturing = s->capturing;
    if (!capturing) {
        const int was_empty = s->head == NULL;
        if (s->tail)
            s->tail->next = head;
        else
            s->head = head;
        s->tail = tail;
        s->queued += n;
        if (was_empty) pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    if (capturing) {
        emu_list_free(head);
        WARN("device emulator: a graph launched on a capturing stream (not emulated)");
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

static void emu_graph_destroy(void *graph) {
    emu_graph_t *g = (emu_graph_t *)graph;
    if (g == NULL) return;
    emu_list_free(g->head);
    free(g);
}

static int g_peer_reach_off; /* ch_emu_set_peer_reach(0) */

void ch_emu_set_peer_reach(int reach) {
    __atomic_store_n(&g_peer_reach_off, !reach, __ATOMIC_RELEASE);
}

static ncclResult_t emu_peer_reach(int dev, const char *bus, const char **why) {
    (void)dev;
    (void)bus;
    if (!__atomic_load_n(&g_peer_reach_off, __ATOMIC_ACQUIRE)) return ncclSuccess;
    *why = "peer access turned off (device emulator)";
    return ncclInvalidUsage;
}

static ncclResult_t emu_ce_check(int dev, const char **why) {
    (void)dev;
    (void)why;
    return ncclSuccess;
}

static ncclResult_t emu_ce_launch(const ch_ce_prog_t *progs, int nprogs, const chorus_redop_t *rop,
                                  uint32_t *err, void *stream) {
    emu_item_t *it = calloc(1, sizeof(*it));
    ch_ce_prog_t *copy = calloc((size_t)(nprogs > 0 ? nprogs : 1), sizeof(*copy));
    if (it == NULL || copy == NULL) goto oom;
    for (int i = 0; i < nprogs; i++) {
        copy[i].nops = copy[i].cap = progs[i].nops;
        if (progs[i].nops == 0) continue;
        copy[i].ops = malloc(progs[i].nops * sizeof(ch_ce_op_t));
        if (copy[i].ops == NULL) goto oom;
        memcpy(copy[i].ops, progs[i].ops, progs[i].nops * sizeof(ch_ce_op_t));
    }
    it->kind = EMU_CE;
    it->progs = copy;
    it->nprogs = nprogs;
    it->rop = *rop;
    it->err = err;
    return emu_push(stream, it);
oom:
    if (copy)
        for (int i = 0; i < nprogs; i++)
            free(copy[i].ops);
    free(copy);
    free(it);
    WARN("device emulator: out of memory queuing copy-engine programs");
    return ncclSystemError;
}

static const ch_rt_t g_emu_rt = {
    .name = "emulator",
    .emulated = 1,
    .dev_alloc = emu_dev_alloc,
    .dev_free = ch_emu_free,
    .host_mapped_alloc = emu_host_mapped_alloc,
    .host_mapped_free = free,
    .memcpy_h2d = emu_memcpy_h2d,
    .launch = emu_launch,
    .event_create = emu_event_create,
    .event_record = emu_event_record,
    .event_query = emu_event_query,
    .event_destroy = emu_event_destroy,
    .ipc_alloc = ch_emu_ipc_alloc,
    .ipc_open = ch_emu_ipc_open,
    .ipc_free = ch_emu_ipc_free,
    .ipc_describe = ch_emu_ipc_describe,
    .host_register = ch_emu_host_register,
    .host_unregister = ch_emu_host_unregister,
    .peer_reach = emu_peer_reach,
    .ce_check = emu_ce_check,
    .ce_launch = emu_ce_launch,
    .capture_begin = emu_capture_begin,
    .capture_end = emu_capture_end,
    .stream_capturing = emu_stream_capturing,
    .graph_instantiate = emu_graph_instantiate,
    .graph_launch = emu_graph_launch,
    .graph_destroy = emu_graph_destroy,
    .graph_exec_destroy = emu_graph_destroy,
    .mem_granularity = ch_emu_mem_granularity,
    .mem_create = ch_emu_mem_create,
    .mem_map = ch_emu_mem_map,
    .mem_set_access = ch_emu_mem_set_access,
    .mem_unmap = ch_emu_mem_unmap,
    .mem_export_fd = ch_emu_mem_export_fd,
    .mem_import_fd = ch_emu_mem_import_fd,
    .mem_release = ch_emu_mem_release,
    .mem_retain = ch_emu_mem_retain,
};

const ch_rt_t *ch_rt_emu(void) {
    return &g_emu_rt;
}
