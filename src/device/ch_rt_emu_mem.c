/*
 * ch_rt_emu_mem.c: the emulator's device memory (see ch_rt_emu.h): each emulated device
 * allocation is recorded in a registry (a mutex-guarded array, searched by address range), which
 * chorus_mem_kind asks first; ch_emu_malloc's blocks are memfds of their own (ch_rt_emu_shm.c),
 * so that other processes can map them as they map a GPU allocation through its IPC handle.
 */
#include "ch_rt_emu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ch_rt_emu_shm.h"
#include "cuda_util.h"
#include "log.h"

/* ---- memory --------------------------------------------------------------------------------- */

typedef struct {
    uintptr_t base;
    size_t bytes;
    int mapped; /* a mapping of the cuMem entries (ch_rt_emu_shm.c), not ch_emu_malloc's */
    int fd;     /* ch_emu_malloc's memfd (ch_emu_block_alloc), -1 for heap memory */
    uint64_t serial;
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

static int emu_track(void *p, size_t bytes, int mapped, int fd, uint64_t serial) {
    pthread_mutex_lock(&g_mem_lock);
    if (g_nallocs == g_cap_allocs) {
        size_t cap = g_cap_allocs ? 2 * g_cap_allocs : 64;
        emu_alloc_t *n = realloc(g_allocs, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&g_mem_lock);
            WARN("device emulator: out of memory recording device memory");
            return 0;
        }
        g_allocs = n;
        g_cap_allocs = cap;
    }
    g_allocs[g_nallocs].base = (uintptr_t)p;
    g_allocs[g_nallocs].bytes = bytes;
    g_allocs[g_nallocs].mapped = mapped;
    g_allocs[g_nallocs].fd = fd;
    g_allocs[g_nallocs].serial = serial;
    g_nallocs++;
    pthread_mutex_unlock(&g_mem_lock);
    chorus_mem_kind_set_emu(ch_emu_is_device);
    __atomic_store_n(&g_in_use, 1, __ATOMIC_RELEASE);
    return 1;
}

int ch_emu_track(void *p, size_t bytes, int mapped) {
    return emu_track(p, bytes, mapped, -1, 0);
}

/* Drop the record that starts at p and was made as `mapped` says; 1 when there was one (*rec_p:
 * what it was). */
static int emu_untrack(const void *p, int mapped, emu_alloc_t *rec_p) {
    int found = 0;
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].base == (uintptr_t)p && g_allocs[i].mapped == mapped) {
            *rec_p = g_allocs[i];
            g_allocs[i] = g_allocs[--g_nallocs];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    return found;
}

void ch_emu_untrack(void *p) {
    emu_alloc_t rec;
    (void)emu_untrack(p, 1, &rec);
}

int ch_emu_block_find(const void *p, size_t bytes, uintptr_t *base, size_t *size, int *fd,
                      uint64_t *serial) {
    const uintptr_t u = (uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_nallocs && !found; i++) {
        const emu_alloc_t *a = &g_allocs[i];
        if (a->mapped || a->fd < 0 || u < a->base || u >= a->base + a->bytes ||
            bytes > a->base + a->bytes - u)
            continue;
        *base = a->base;
        *size = a->bytes;
        *fd = a->fd;
        *serial = a->serial;
        found = 1;
    }
    pthread_mutex_unlock(&g_mem_lock);
    return found;
}

/* A memfd block (ch_rt_emu_shm.c), which other processes can map as a GPU's cudaMalloc memory
 * is mapped through its IPC handle; heap memory where no memfd can be made. */
void *ch_emu_malloc(size_t bytes) {
    const size_t size = bytes ? (bytes + 255) / 256 * 256 : 256;
    int fd = -1;
    uint64_t serial = 0;
    void *p = ch_emu_block_alloc(size, &fd, &serial);
    if (p == NULL && (p = aligned_alloc(256, size)) != NULL) memset(p, 0, size);
    if (p == NULL) return NULL;
    if (!emu_track(p, size, 0, fd, serial)) {
        if (fd >= 0)
            ch_emu_block_free(p, size, fd);
        else
            free(p);
        return NULL;
    }
    return p;
}

void ch_emu_free(void *p) {
    if (p == NULL) return;
    emu_alloc_t rec;
    if (!emu_untrack(p, 0, &rec))
        WARN("ch_emu_free: %p is not emulated device memory of ch_emu_malloc", p);
    else if (rec.fd >= 0)
        ch_emu_block_free(p, rec.bytes, rec.fd);
    else
        free(p);
}
