/*
 * ch_rt_emu.c: the device runtime's emulator (see ch_rt.h and ch_rt_emu.h).
 *
 * Memory: each emulated device allocation is recorded in a registry (a mutex-guarded array,
 * searched by address range), and chorus_mem_kind asks the registry first. Streams: a queue of
 * items (launch, event record) run in order by the stream's thread. A launch runs channel 0 on the
 * stream's thread and channels 1..nch-1 on threads of their own, each as ch_cpu_block: what one
 * block of the kernel does, with the host reduction kernels. The waits of an emulated block have
 * the CHORUS_TIMEOUT deadline (a GPU block has none: there the host's drain writes the error word
 * once its own deadline passes). Copy-engine programs run on the stream's thread, one after the
 * other, with the host kernels; their waits end as a GPU's do (emu_ce_wait). Shared memory
 * between processes: a memfd that a peer opens through /proc/<pid>/fd/<fd> and maps.
 */
#include "ch_rt_emu.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ch_proto.h"
#include "ch_rt.h"
#include "cpu_exec.h"
#include "cuda_util.h"
#include "log.h"
#include "param.h"

/* ---- memory --------------------------------------------------------------------------------- */

typedef struct {
    uintptr_t base;
    size_t bytes;
} emu_alloc_t;

static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static emu_alloc_t *g_allocs;
static size_t g_nallocs, g_cap_allocs;
static int g_in_use;

int ch_emu_in_use(void) {
    return __atomic_load_n(&g_in_use, __ATOMIC_ACQUIRE);
}

int ch_emu_is_device(const void *p) {
    const uintptr_t u = (uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_nallocs && !found; i++)
        found = u >= g_allocs[i].base && u < g_allocs[i].base + g_allocs[i].bytes;
    pthread_mutex_unlock(&g_mem_lock);
    return found;
}

void *ch_emu_malloc(size_t bytes) {
    const size_t size = bytes ? (bytes + 255) / 256 * 256 : 256;
    void *p = aligned_alloc(256, size);
    if (p == NULL) return NULL;
    memset(p, 0, size);
    pthread_mutex_lock(&g_mem_lock);
    if (g_nallocs == g_cap_allocs) {
        size_t cap = g_cap_allocs ? 2 * g_cap_allocs : 64;
        emu_alloc_t *n = realloc(g_allocs, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&g_mem_lock);
            free(p);
            return NULL;
        }
        g_allocs = n;
        g_cap_allocs = cap;
    }
    g_allocs[g_nallocs].base = (uintptr_t)p;
    g_allocs[g_nallocs].bytes = size;
    g_nallocs++;
    pthread_mutex_unlock(&g_mem_lock);
    chorus_mem_kind_set_emu(ch_emu_is_device);
    __atomic_store_n(&g_in_use, 1, __ATOMIC_RELEASE);
    return p;
}

void ch_emu_free(void *p) {
    if (p == NULL) return;
    int found = 0;
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].base == (uintptr_t)p) {
            g_allocs[i] = g_allocs[--g_nallocs];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    if (found)
        free(p);
    else
        WARN("ch_emu_free: %p is not emulated device memory", p);
}

/* ---- streams -------------------------------------------------------------------------------- */

typedef struct emu_event {
    uint64_t recorded;  /* records queued (caller) */
    uint64_t completed; /* records run (the stream's thread) */
} emu_event_t;

enum { EMU_LAUNCH = 0, EMU_EVENT, EMU_CE };

typedef struct emu_item {
    int kind;
    ch_kernel_args_t args;
    ch_ce_prog_t *progs; /* EMU_CE: owned copies */
    int nprogs;
    chorus_redop_t rop;
    uint32_t *err;
    emu_event_t *ev;
    uint64_t ev_gen;
    struct emu_item *next;
} emu_item_t;

struct ch_emu_stream {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    emu_item_t *head, *tail;
    uint64_t queued, ran;
    unsigned long launches;
    int stop;
    pthread_t thread;
};

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
 * runs its next item, as the next kernel on a GPU stream starts after this one. */
static void emu_run_launch(const ch_kernel_args_t *a) {
    const int nch = a->plan.nch;
    const int64_t deadline = ch_host_now_ns() + emu_timeout_ns();
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
            for (int i = 0; i < it->nprogs; i++)
                ch_ce_prog_free(&it->progs[i]);
            free(it->progs);
        } else {
            uint64_t cur = __atomic_load_n(&it->ev->completed, __ATOMIC_RELAXED);
            if (it->ev_gen > cur)
                __atomic_store_n(&it->ev->completed, it->ev_gen, __ATOMIC_RELEASE);
        }
        pthread_mutex_lock(&s->lock);
        s->head = it->next;
        if (s->head == NULL) s->tail = NULL;
        if (it->kind != EMU_EVENT) s->launches++;
        s->ran++;
        free(it);
        pthread_cond_broadcast(&s->cond);
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
        free(it);
        WARN("device emulator: no default stream (out of memory or threads)");
        return ncclSystemError;
    }
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    s->queued++;
    pthread_cond_broadcast(&s->cond);
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
    while (s->ran < want) {
        if (pthread_cond_timedwait(&s->cond, &s->lock, &dl) != 0 && s->ran < want) {
            WARN("device emulator: stream %p did not finish its work within CHORUS_TIMEOUT",
                 (void *)s);
            res = ncclSystemError;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return res;
}

void ch_emu_stream_destroy(ch_emu_stream_t *s) {
    if (s == NULL) return;
    (void)ch_emu_stream_sync(s);
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
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
    return emu_push(stream, it);
}

static int emu_event_query(void *ev) {
    emu_event_t *e = (emu_event_t *)ev;
    return __atomic_load_n(&e->completed, __ATOMIC_ACQUIRE) >= e->recorded;
}

static void emu_event_destroy(void *ev) {
    free(ev);
}

/* Shared device memory: a memfd mapped here; a peer of this host opens /proc/<pid>/fd/<fd>. The
 * owner keeps the fd while the block lives (ipc_free closes it). */
typedef struct {
    void *p;
    int fd;
} emu_ipc_t;
static emu_ipc_t g_ipc[64];
static pthread_mutex_t g_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t emu_ipc_alloc(void **p, size_t bytes, ch_ipc_handle_t *h) {
    const size_t size = (bytes + 4095) / 4096 * 4096;
    int fd = memfd_create("chorus-devemu", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        WARN("device emulator: shared memory of %zu bytes: %s", bytes, strerror(errno));
        if (fd >= 0) close(fd);
        return ncclSystemError;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        WARN("device emulator: mmap of %zu shared bytes: %s", size, strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    pthread_mutex_lock(&g_ipc_lock);
    int slot = -1;
    for (int i = 0; i < 64 && slot < 0; i++)
        if (g_ipc[i].p == NULL) slot = i;
    if (slot >= 0) {
        g_ipc[slot].p = m;
        g_ipc[slot].fd = fd;
    }
    pthread_mutex_unlock(&g_ipc_lock);
    if (slot < 0) {
        WARN("device emulator: more than 64 shared blocks");
        munmap(m, size);
        close(fd);
        return ncclSystemError;
    }
    memset(h, 0, sizeof(*h));
    h->pid = getpid();
    h->fd = fd;
    h->bytes = size;
    *p = m;
    return ncclSuccess;
}

static ncclResult_t emu_ipc_open(const ch_ipc_handle_t *h, void **p) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%lld/fd/%lld", (long long)h->pid, (long long)h->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        WARN("device emulator: cannot open the shared block %s: %s", path, strerror(errno));
        return ncclSystemError;
    }
    void *m = mmap(NULL, (size_t)h->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        WARN("device emulator: mmap of the shared block %s: %s", path, strerror(errno));
        return ncclSystemError;
    }
    *p = m;
    return ncclSuccess;
}

static void emu_ipc_free(void *p, size_t bytes) {
    if (p == NULL) return;
    const size_t size = (bytes + 4095) / 4096 * 4096;
    pthread_mutex_lock(&g_ipc_lock);
    for (int i = 0; i < 64; i++) {
        if (g_ipc[i].p == p) {
            close(g_ipc[i].fd);
            g_ipc[i].p = NULL;
        }
    }
    pthread_mutex_unlock(&g_ipc_lock);
    munmap(p, size);
}

static ncclResult_t emu_host_register(void *p, size_t bytes) {
    (void)p;
    (void)bytes;
    return ncclSuccess; /* the emulator's "device" reaches all host memory */
}

static void emu_host_unregister(void *p) {
    (void)p;
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
    .ipc_alloc = emu_ipc_alloc,
    .ipc_open = emu_ipc_open,
    .ipc_free = emu_ipc_free,
    .host_register = emu_host_register,
    .host_unregister = emu_host_unregister,
    .ce_check = emu_ce_check,
    .ce_launch = emu_ce_launch,
};

const ch_rt_t *ch_rt_emu(void) {
    return &g_emu_rt;
}
