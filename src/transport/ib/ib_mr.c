/*
 * ib_mr.c: the registration cache of user buffers for the verbs transport's zero-copy path.
 *
 * ncclCommRegister hands a range to transport_buffer_register, which records it here (counted:
 * several communicators may register the same range). Nothing is registered with the NIC yet:
 * the first direct chunk inside the range on a protection domain registers the whole range there
 * (one ibv_reg_mr, local write + remote read), and every later chunk inside it finds that memory
 * region (a hit). A chunk outside every registered range is not registered at all: the transport
 * copies it through its slots, as it does below CHORUS_IB_ZCOPY_THRESHOLD or when ibv_reg_mr
 * fails (which is remembered per range and domain, so a failing range costs one call). A direct
 * chunk larger than a slot outside registered memory (possible through the transport interface,
 * not from the collectives, whose chunks fit a slot) is registered for that chunk alone
 * (ib_mr_acquire_temp) and deregistered once the receiver has read it.
 *
 * ncclCommDeregister (transport_buffer_deregister) drops the range and deregisters its memory
 * regions, unless a direct chunk that uses it is still in flight: then it is refused with
 * ncclInvalidUsage and a WARN, and the range stays usable (the caller may try again once its
 * operations completed). A range whose memory was unmapped without ncclCommDeregister (freed)
 * is caught when a chunk next uses it (msync reports the hole): the chunk fails with a WARN that
 * says so. A range freed and mapped again at the same address cannot be told apart from the
 * original; on RDMA hardware its memory region would still pin the old pages, which is why
 * ncclCommDeregister must come before the free (as in NCCL).
 *
 * Memory regions belong to the process that made them: a forked child ignores its parent's and
 * registers again. Counters (ib_mr_stats) let the tests and perf/ib_check.sh see hits, NIC
 * registrations and bytes that went without a copy.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ib.h"
#include "log.h"

typedef struct {
    struct ibv_pd *pd;
    struct ibv_mr *mr; /* NULL: ibv_reg_mr failed on this domain */
    int pid;           /* the process that registered it */
} ib_reg_mr_t;

struct ib_reg {
    uintptr_t base;
    size_t size;
    int nregs;    /* ncclCommRegister calls for exactly this range */
    int inflight; /* direct chunks using it now */
    int temp;     /* one chunk's registration (ib_mr_acquire_temp), not in the cache */
    uint64_t chunks, nic_regs; /* direct chunk ends that used it; its ibv_reg_mr calls */
    ib_reg_mr_t mrs[IB_MAX_DEVS];
    int nmrs;
    struct ib_reg *next;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static ib_reg_t *g_regs;
static ib_mr_stats_t g_stats;

static void ib_reg_drop_mrs(ib_reg_t *r) {
    const ib_symbols_t *ibv = ib_symbols();
    for (int i = 0; i < r->nmrs; i++)
        if (r->mrs[i].mr && r->mrs[i].pid == (int)getpid() && ibv) {
            ibv->dereg_mr(r->mrs[i].mr);
            if (!r->temp) g_stats.deregs++;
        }
    r->nmrs = 0;
}

ncclResult_t ib_mr_register(void *base, size_t size) {
    if (base == NULL || size == 0) return ncclSuccess;
    pthread_mutex_lock(&g_lock);
    for (ib_reg_t *r = g_regs; r; r = r->next) {
        if (r->base == (uintptr_t)base && r->size == size) {
            r->nregs++;
            pthread_mutex_unlock(&g_lock);
            return ncclSuccess;
        }
    }
    ib_reg_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        pthread_mutex_unlock(&g_lock);
        WARN("ib: out of memory for a buffer registration");
        return ncclSystemError;
    }
    r->base = (uintptr_t)base;
    r->size = size;
    r->nregs = 1;
    r->next = g_regs;
    g_regs = r;
    pthread_mutex_unlock(&g_lock);
    return ncclSuccess;
}

ncclResult_t ib_mr_deregister(void *base, size_t size) {
    if (base == NULL || size == 0) return ncclSuccess;
    pthread_mutex_lock(&g_lock);
    for (ib_reg_t **pp = &g_regs; *pp; pp = &(*pp)->next) {
        ib_reg_t *r = *pp;
        if (r->base != (uintptr_t)base || r->size != size) continue;
        if (r->nregs == 1 && r->inflight > 0) {
            int n = r->inflight;
            pthread_mutex_unlock(&g_lock);
            WARN("ncclCommDeregister: %zu bytes at %p are in use by %d transfer%s in flight over "
                 "RDMA: deregister after the operations completed",
                 size, base, n, n == 1 ? "" : "s");
            return ncclInvalidUsage;
        }
        if (--r->nregs == 0) {
            *pp = r->next;
            INFO(SUB_NET | SUB_REG, "ib: deregistered %zu bytes at %p: %llu direct chunk ends "
                 "used it, %llu NIC registration%s", size, base, (unsigned long long)r->chunks,
                 (unsigned long long)r->nic_regs, r->nic_regs == 1 ? "" : "s");
            ib_reg_drop_mrs(r);
            free(r);
        }
        pthread_mutex_unlock(&g_lock);
        return ncclSuccess;
    }
    pthread_mutex_unlock(&g_lock);
    return ncclSuccess; /* registered while no verbs transport could be loaded: nothing here */
}

/* Whether [p, p + len) is mapped (msync fails with ENOMEM on a hole). */
static int ib_range_mapped(uintptr_t p, size_t len) {
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = p & ~((uintptr_t)pg - 1);
    return msync((void *)lo, (p + len) - lo, MS_ASYNC) == 0 || errno != ENOMEM;
}

ncclResult_t ib_mr_acquire(struct ibv_pd *pd, const void *ptr, size_t len, struct ibv_mr **mr_p,
                           ib_reg_t **reg_p) {
    *mr_p = NULL;
    *reg_p = NULL;
    uintptr_t lo = (uintptr_t)ptr;
    pthread_mutex_lock(&g_lock);
    ib_reg_t *r = g_regs;
    for (; r; r = r->next)
        if (lo >= r->base && len <= r->size && lo - r->base <= r->size - len) break;
    if (r == NULL) {
        g_stats.unregistered++;
        pthread_mutex_unlock(&g_lock);
        return ncclSuccess;
    }
    if (!ib_range_mapped(lo, len)) {
        uintptr_t base = r->base;
        size_t size = r->size;
        pthread_mutex_unlock(&g_lock);
        WARN("ib: %zu bytes at %p lie in a buffer registered with ncclCommRegister (%zu bytes at "
             "%p) that was freed without ncclCommDeregister",
             len, ptr, size, (void *)base);
        return ncclInvalidUsage;
    }
    int me = (int)getpid();
    ib_reg_mr_t *m = NULL;
    for (int i = 0; i < r->nmrs; i++)
        if (r->mrs[i].pd == pd && r->mrs[i].pid == me) m = &r->mrs[i];
    if (m == NULL) {
        /* Slots of a parent process (fork) are reused: their regions are not ours to free. */
        int slot = -1;
        for (int i = 0; i < r->nmrs && slot < 0; i++)
            if (r->mrs[i].pid != me) slot = i;
        if (slot < 0 && r->nmrs < IB_MAX_DEVS) slot = r->nmrs++;
        if (slot < 0) {
            pthread_mutex_unlock(&g_lock);
            return ncclSuccess;
        }
        m = &r->mrs[slot];
        m->pd = pd;
        m->pid = me;
        m->mr = ib_symbols()->reg_mr(pd, (void *)r->base, r->size,
                                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
        g_stats.regs++;
        r->nic_regs++;
        if (m->mr == NULL) {
            g_stats.reg_failures++;
            INFO(SUB_NET | SUB_REG, "ib: cannot register %zu bytes at %p: those go through the "
                 "slots", r->size, (void *)r->base);
        }
    } else if (m->mr) {
        g_stats.hits++;
    }
    if (m->mr) {
        r->inflight++;
        *mr_p = m->mr;
        *reg_p = r;
    }
    pthread_mutex_unlock(&g_lock);
    return ncclSuccess;
}

ncclResult_t ib_mr_acquire_temp(struct ibv_pd *pd, const void *ptr, size_t len,
                                struct ibv_mr **mr_p, ib_reg_t **reg_p) {
    *mr_p = NULL;
    *reg_p = NULL;
    ib_reg_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return ncclSystemError;
    r->base = (uintptr_t)ptr;
    r->size = len;
    r->temp = 1;
    r->inflight = 1;
    r->nmrs = 1;
    r->mrs[0].pd = pd;
    r->mrs[0].pid = (int)getpid();
    r->mrs[0].mr = ib_symbols()->reg_mr(pd, (void *)ptr, len,
                                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    pthread_mutex_lock(&g_lock);
    g_stats.temp_regs++;
    if (r->mrs[0].mr == NULL) g_stats.reg_failures++;
    pthread_mutex_unlock(&g_lock);
    if (r->mrs[0].mr == NULL) {
        free(r);
        return ncclSuccess;
    }
    *mr_p = r->mrs[0].mr;
    *reg_p = r;
    return ncclSuccess;
}

void ib_mr_release(ib_reg_t *reg, size_t zcopy_bytes) {
    if (reg == NULL) return;
    if (reg->temp) {
        ib_reg_drop_mrs(reg); /* counts under no lock: only this connection knows it */
        free(reg);
        return;
    }
    pthread_mutex_lock(&g_lock);
    reg->inflight--;
    if (zcopy_bytes) {
        reg->chunks++;
        g_stats.zcopy_chunks++;
        g_stats.zcopy_bytes += zcopy_bytes;
    }
    pthread_mutex_unlock(&g_lock);
}

ncclResult_t transport_buffer_register(void *base, size_t size) {
    return ib_mr_register(base, size);
}

ncclResult_t transport_buffer_deregister(void *base, size_t size) {
    return ib_mr_deregister(base, size);
}

void ib_mr_stats(ib_mr_stats_t *s) {
    pthread_mutex_lock(&g_lock);
    *s = g_stats;
    pthread_mutex_unlock(&g_lock);
}
