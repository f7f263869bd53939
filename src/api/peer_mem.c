/*
 * peer_mem.c: device memory that the other processes of the host map (design in peer_mem.h).
 */
#include "peer_mem.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "log.h"
#include "util.h"

#define PM_ZERO_CHUNK ((size_t)1 << 20)

static unsigned long g_opened[3], g_closed[3];

unsigned long peer_mem_opened(int kind) {
    return kind >= 0 && kind < 3 ? __atomic_load_n(&g_opened[kind], __ATOMIC_RELAXED) : 0;
}

unsigned long peer_mem_live(int kind) {
    return kind >= 0 && kind < 3 ? __atomic_load_n(&g_opened[kind], __ATOMIC_RELAXED) -
                                       __atomic_load_n(&g_closed[kind], __ATOMIC_RELAXED)
                                 : 0;
}

/* cuMem memory is not zeroed when made: write zeros through the runtime's setup copy. */
static ncclResult_t pm_zero(const ch_rt_t *rt, void *p, size_t bytes) {
    const size_t chunk = bytes < PM_ZERO_CHUNK ? bytes : PM_ZERO_CHUNK;
    void *z = calloc(1, chunk ? chunk : 1);
    if (z == NULL) {
        WARN("out of memory zeroing device memory");
        return ncclSystemError;
    }
    ncclResult_t res = ncclSuccess;
    for (size_t off = 0; off < bytes && res == ncclSuccess; off += chunk) {
        const size_t n = bytes - off < chunk ? bytes - off : chunk;
        res = rt->memcpy_h2d((char *)p + off, z, n);
    }
    free(z);
    return res;
}

ncclResult_t peer_mem_alloc(const ch_rt_t *rt, int dev, size_t bytes, peer_mem_own_t *own) {
    memset(own, 0, sizeof(*own));
    own->rt = rt;
    own->bytes = bytes;
    size_t gran = 0;
    if (rt->mem_granularity(dev, &gran) == ncclSuccess && bytes <= SIZE_MAX - gran) {
        const size_t mapped = CHORUS_ALIGN_UP(bytes ? bytes : 1, gran);
        ncclResult_t res = rt->mem_create(dev, mapped, &own->handle);
        if (res == ncclSuccess) {
            res = rt->mem_map(own->handle, mapped, gran, &own->ptr);
            if (res != ncclSuccess) {
                rt->mem_release(own->handle);
            } else if ((res = rt->mem_set_access(own->ptr, mapped, dev)) != ncclSuccess ||
                       (res = pm_zero(rt, own->ptr, mapped)) != ncclSuccess) {
                rt->mem_unmap(own->ptr, mapped);
                rt->mem_release(own->handle);
            }
        }
        if (res == ncclSuccess) {
            own->mapped = mapped;
            return ncclSuccess;
        }
        INFO(SUB_ALLOC,
             "%zu bytes of cuMem memory on device %d failed (%s runtime): a legacy IPC block "
             "instead",
             bytes, dev, rt->name);
        own->ptr = NULL;
        own->handle = 0;
    }
    return rt->ipc_alloc(&own->ptr, bytes, &own->ipc);
}

void peer_mem_free(peer_mem_own_t *own) {
    if (own == NULL || own->ptr == NULL) return;
    if (own->mapped) {
        own->rt->mem_unmap(own->ptr, own->mapped);
        own->rt->mem_release(own->handle);
    } else {
        own->rt->ipc_free(own->ptr, own->bytes);
    }
    own->ptr = NULL;
}

ncclResult_t peer_mem_describe(const ch_rt_t *rt, const void *p, size_t bytes,
                               const peer_mem_own_t *own, peer_mem_desc_t *d, int *fd) {
    memset(d, 0, sizeof(*d));
    *fd = -1;
    d->pid = (int32_t)getpid();
    d->ptr = (uint64_t)(uintptr_t)p;
    d->bytes = bytes;
    uint64_t h = 0;
    void *base = NULL;
    size_t mapped = 0;
    if (rt->mem_retain(p, &h, &base, &mapped) == ncclSuccess) {
        const size_t off = (size_t)((uintptr_t)p - (uintptr_t)base);
        ncclResult_t res = off + bytes <= mapped ? rt->mem_export_fd(h, fd) : ncclInvalidArgument;
        rt->mem_release(h);
        if (res != ncclSuccess) {
            WARN("%p (%zu bytes) is cuMem memory that cannot be exported as a file descriptor "
                 "(it was made without that handle type, or spans mappings)",
                 p, bytes);
            return res;
        }
        d->kind = PEER_MEM_CUMEM;
        d->offset = off;
        d->mapped = mapped;
        return ncclSuccess;
    }
    d->kind = PEER_MEM_IPC;
    if (own != NULL && !own->mapped && p == own->ptr) {
        d->ipc = own->ipc;
        return ncclSuccess;
    }
    size_t off = 0;
    if (rt->ipc_describe(p, bytes, &d->ipc, &off) != ncclSuccess) {
        d->kind = PEER_MEM_NONE;
        WARN("%p (%zu bytes) is neither cuMem memory nor inside one allocation with a legacy IPC "
             "handle",
             p, bytes);
        return ncclInvalidArgument;
    }
    d->offset = off;
    return ncclSuccess;
}

/* ---- legacy IPC blocks opened here, shared --------------------------------------------------- */

/* CUDA maps an allocation's IPC handle at most once per process at a time: every range of one
 * allocation opened here (several registrations in one buffer, several communicators, emulated
 * ranks of one process) shares one open, counted. The handle names its allocation uniquely
 * (ch_ipc_handle_t pad[0]), so a live entry never stands for a later allocation at its address. */
typedef struct pm_ipc_open {
    ch_ipc_handle_t h;
    const ch_rt_t *rt;
    void *base;
    unsigned long refs;
    struct pm_ipc_open *next;
} pm_ipc_open_t;
static pm_ipc_open_t *g_ipc_opens;
static pthread_mutex_t g_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t pm_ipc_get(const ch_rt_t *rt, const ch_ipc_handle_t *h, void **base) {
    pthread_mutex_lock(&g_ipc_lock);
    pm_ipc_open_t *o = g_ipc_opens;
    while (o && (o->rt != rt || memcmp(&o->h, h, sizeof(*h)) != 0))
        o = o->next;
    ncclResult_t res = ncclSuccess;
    if (o == NULL) {
        o = calloc(1, sizeof(*o));
        if (o == NULL) {
            WARN("out of memory opening a peer's device memory");
            res = ncclSystemError;
        } else if ((res = rt->ipc_open(h, &o->base)) != ncclSuccess) {
            free(o);
            o = NULL;
        } else {
            o->h = *h;
            o->rt = rt;
            o->next = g_ipc_opens;
            g_ipc_opens = o;
            __atomic_add_fetch(&g_opened[PEER_MEM_IPC], 1, __ATOMIC_RELAXED);
        }
    }
    if (o) {
        o->refs++;
        *base = o->base;
    }
    pthread_mutex_unlock(&g_ipc_lock);
    return res;
}

static void pm_ipc_put(void *base) {
    pm_ipc_open_t *gone = NULL;
    pthread_mutex_lock(&g_ipc_lock);
    for (pm_ipc_open_t **pp = &g_ipc_opens; *pp; pp = &(*pp)->next) {
        if ((*pp)->base != base) continue;
        if (--(*pp)->refs == 0) {
            gone = *pp;
            *pp = gone->next;
        }
        break;
    }
    pthread_mutex_unlock(&g_ipc_lock);
    if (gone == NULL) return;
    gone->rt->ipc_free(gone->base, (size_t)gone->h.bytes);
    __atomic_add_fetch(&g_closed[PEER_MEM_IPC], 1, __ATOMIC_RELAXED);
    free(gone);
}

int peer_mem_needs_map(const ch_rt_t *rt, int32_t owner_pid) {
    return owner_pid != (int32_t)getpid() || rt->emulated;
}

ncclResult_t peer_mem_open(const ch_rt_t *rt, int dev, const peer_mem_desc_t *d, int fd,
                           peer_mem_map_t *m) {
    memset(m, 0, sizeof(*m));
    m->rt = rt;
    if (!peer_mem_needs_map(rt, d->pid)) { /* a peer in this process: the owner's address */
        m->kind = PEER_MEM_NONE;
        m->ptr = (void *)(uintptr_t)d->ptr;
        return ncclSuccess;
    }
    if (d->kind == PEER_MEM_CUMEM) {
        ARGCHECK(fd >= 0, "no descriptor came with the cuMem memory of process %d", (int)d->pid);
        ARGCHECK(d->offset + d->bytes <= d->mapped,
                 "process %d described %llu bytes at offset %llu of a mapping of %llu", (int)d->pid,
                 (unsigned long long)d->bytes, (unsigned long long)d->offset,
                 (unsigned long long)d->mapped);
        CHECK(mem_alloc_import(rt, dev, fd, (size_t)d->mapped, &m->imp));
        m->kind = PEER_MEM_CUMEM;
        m->ptr = (char *)m->imp.ptr + d->offset;
        __atomic_add_fetch(&g_opened[PEER_MEM_CUMEM], 1, __ATOMIC_RELAXED);
    } else if (d->kind == PEER_MEM_IPC) {
        ARGCHECK(d->offset <= d->ipc.bytes && d->bytes <= d->ipc.bytes - d->offset,
                 "process %d described %llu bytes at offset %llu of an allocation of %llu",
                 (int)d->pid, (unsigned long long)d->bytes, (unsigned long long)d->offset,
                 (unsigned long long)d->ipc.bytes);
        CHECK(pm_ipc_get(rt, &d->ipc, &m->ipc_ptr));
        m->kind = PEER_MEM_IPC;
        m->ptr = (char *)m->ipc_ptr + d->offset;
    } else {
        WARN("process %d's memory has no description", (int)d->pid);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

void peer_mem_close(peer_mem_map_t *m) {
    if (m == NULL || m->ptr == NULL) return;
    if (m->kind == PEER_MEM_CUMEM) {
        mem_alloc_unimport(&m->imp);
        __atomic_add_fetch(&g_closed[PEER_MEM_CUMEM], 1, __ATOMIC_RELAXED);
    } else if (m->kind == PEER_MEM_IPC) {
        pm_ipc_put(m->ipc_ptr);
    }
    m->ptr = NULL;
}
