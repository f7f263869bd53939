/*
 * ch_rt_emu_shm.c: the device emulator's memory shared between processes (see ch_rt_emu_shm.h).
 *
 * A shared block is a memfd mapped by its owner; a peer of this host opens
 * /proc/<pid>/fd/<fd> and maps it. The emulator's "device" reaches all host memory, so host
 * registration has nothing to do. The cuMem entries (ncclMemAlloc's memory) are memfds too, with
 * handles, mappings and descriptors of their own (below).
 */
#include "ch_rt_emu_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ch_rt_emu.h"
#include "log.h"

/* Shared device memory: a memfd mapped here; a peer of this host opens /proc/<pid>/fd/<fd>. The
 * owner keeps the fd while the block lives (ipc_free closes it). */
typedef struct {
    void *p;
    int fd;
} emu_ipc_t;
static emu_ipc_t g_ipc[64];
static pthread_mutex_t g_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

ncclResult_t ch_emu_ipc_alloc(void **p, size_t bytes, ch_ipc_handle_t *h) {
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

ncclResult_t ch_emu_ipc_open(const ch_ipc_handle_t *h, void **p) {
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

void ch_emu_ipc_free(void *p, size_t bytes) {
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

ncclResult_t ch_emu_host_register(void *p, size_t bytes) {
    (void)p;
    (void)bytes;
    return ncclSuccess; /* the emulator's "device" reaches all host memory */
}

void ch_emu_host_unregister(void *p) {
    (void)p;
}

/* ---- cuMem-style allocations ---------------------------------------------------------------- */

/* A handle is a memfd of its own (create makes one, import dups the peer's), like the physical
 * memory behind a CUmemGenericAllocationHandle: it lives while a handle or a mapping holds it. A
 * mapping starts inaccessible (PROT_NONE) and becomes emulated device memory (the registry of
 * ch_rt_emu.c) once mem_set_access grants read and write, as on a GPU, where memory mapped without
 * cuMemSetAccess faults. The granularity is a GPU's usual 2 MiB: a memfd's pages exist only once
 * written, so small allocations cost no more. */
typedef struct {
    int fd;
    size_t bytes;
} emu_cumem_t;

static int g_cumem_off; /* ch_emu_set_cumem(0): the runtime behaves as a device without cuMem */

/* The live mappings, so that mem_retain can tell the memory behind an address (as the driver's
 * cuMemRetainAllocationHandle does): each keeps a descriptor of its memory of its own. */
typedef struct emu_map {
    uintptr_t base;
    size_t bytes;
    int fd;
    struct emu_map *next;
} emu_map_t;
static emu_map_t *g_maps;
static pthread_mutex_t g_maps_lock = PTHREAD_MUTEX_INITIALIZER;

void ch_emu_set_cumem(int supported) {
    __atomic_store_n(&g_cumem_off, !supported, __ATOMIC_RELEASE);
}

ncclResult_t ch_emu_mem_granularity(int dev, size_t *gran) {
    (void)dev;
    if (__atomic_load_n(&g_cumem_off, __ATOMIC_ACQUIRE)) return ncclInvalidUsage;
    *gran = (size_t)2 << 20;
    return ncclSuccess;
}

static ncclResult_t emu_cumem_wrap(int fd, size_t bytes, uint64_t *handle) {
    emu_cumem_t *m = malloc(sizeof(*m));
    if (m == NULL) {
        WARN("device emulator: out of memory for a memory handle");
        close(fd);
        return ncclSystemError;
    }
    m->fd = fd;
    m->bytes = bytes;
    *handle = (uint64_t)(uintptr_t)m;
    return ncclSuccess;
}

ncclResult_t ch_emu_mem_create(int dev, size_t bytes, uint64_t *handle) {
    (void)dev;
    int fd = memfd_create("chorus-devemu-cumem", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        WARN("device emulator: memory of %zu bytes: %s", bytes, strerror(errno));
        if (fd >= 0) close(fd);
        return ncclSystemError;
    }
    return emu_cumem_wrap(fd, bytes, handle);
}

ncclResult_t ch_emu_mem_map(uint64_t handle, size_t bytes, size_t align, void **p) {
    (void)align; /* mmap's page alignment: the emulator needs no more */
    const emu_cumem_t *m = (const emu_cumem_t *)(uintptr_t)handle;
    if (m == NULL || bytes > m->bytes) {
        WARN("device emulator: mapping %zu bytes of a handle of %zu", bytes, m ? m->bytes : 0);
        return ncclInvalidArgument;
    }
    emu_map_t *rec = malloc(sizeof(*rec));
    const int fd = rec ? fcntl(m->fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (fd < 0) {
        WARN("device emulator: recording a mapping: %s", rec ? strerror(errno) : "out of memory");
        free(rec);
        return ncclSystemError;
    }
    void *a = mmap(NULL, bytes, PROT_NONE, MAP_SHARED, m->fd, 0);
    if (a == MAP_FAILED) {
        WARN("device emulator: mmap of %zu bytes: %s", bytes, strerror(errno));
        close(fd);
        free(rec);
        return ncclSystemError;
    }
    rec->base = (uintptr_t)a;
    rec->bytes = bytes;
    rec->fd = fd;
    pthread_mutex_lock(&g_maps_lock);
    rec->next = g_maps;
    g_maps = rec;
    pthread_mutex_unlock(&g_maps_lock);
    *p = a;
    return ncclSuccess;
}

ncclResult_t ch_emu_mem_set_access(void *p, size_t bytes, int dev) {
    (void)dev;
    if (mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0) {
        WARN("device emulator: granting access to %p (%zu bytes): %s", p, bytes, strerror(errno));
        return ncclInvalidArgument;
    }
    return ch_emu_track(p, bytes, 1) ? ncclSuccess : ncclSystemError;
}

void ch_emu_mem_unmap(void *p, size_t bytes) {
    if (p == NULL) return;
    ch_emu_untrack(p);
    emu_map_t *rec = NULL;
    pthread_mutex_lock(&g_maps_lock);
    for (emu_map_t **pp = &g_maps; *pp; pp = &(*pp)->next) {
        if ((*pp)->base == (uintptr_t)p) {
            rec = *pp;
            *pp = rec->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_maps_lock);
    if (rec) {
        close(rec->fd);
        free(rec);
    }
    if (munmap(p, bytes) != 0)
        WARN("device emulator: munmap of %p (%zu bytes): %s", p, bytes, strerror(errno));
}

ncclResult_t ch_emu_mem_export_fd(uint64_t handle, int *fd) {
    const emu_cumem_t *m = (const emu_cumem_t *)(uintptr_t)handle;
    int f = m ? fcntl(m->fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (f < 0) {
        WARN("device emulator: exporting a memory handle: %s", m ? strerror(errno) : "no handle");
        return m ? ncclSystemError : ncclInvalidArgument;
    }
    *fd = f;
    return ncclSuccess;
}

ncclResult_t ch_emu_mem_import_fd(int fd, uint64_t *handle) {
    struct stat st;
    errno = 0;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        WARN("device emulator: importing memory from fd %d: %s", fd,
             errno ? strerror(errno) : "empty");
        return ncclInvalidArgument;
    }
    int f = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (f < 0) {
        WARN("device emulator: importing memory from fd %d: %s", fd, strerror(errno));
        return ncclSystemError;
    }
    return emu_cumem_wrap(f, (size_t)st.st_size, handle);
}

void ch_emu_mem_release(uint64_t handle) {
    emu_cumem_t *m = (emu_cumem_t *)(uintptr_t)handle;
    if (m == NULL) return;
    close(m->fd);
    free(m);
}

ncclResult_t ch_emu_mem_retain(const void *p, uint64_t *handle, void **base, size_t *bytes) {
    const uintptr_t u = (uintptr_t)p;
    int fd = -1;
    uintptr_t b = 0;
    size_t n = 0;
    pthread_mutex_lock(&g_maps_lock);
    for (const emu_map_t *m = g_maps; m; m = m->next) {
        if (u >= m->base && u < m->base + m->bytes) {
            fd = fcntl(m->fd, F_DUPFD_CLOEXEC, 0);
            b = m->base;
            n = m->bytes;
            break;
        }
    }
    pthread_mutex_unlock(&g_maps_lock);
    if (n == 0) return ncclInvalidArgument; /* not a mapping of the cuMem entries */
    if (fd < 0) {
        WARN("device emulator: retaining the memory at %p: %s", p, strerror(errno));
        return ncclSystemError;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        WARN("device emulator: retaining the memory at %p: %s", p, strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    const ncclResult_t res = emu_cumem_wrap(fd, (size_t)st.st_size, handle);
    if (res != ncclSuccess) return res;
    *base = (void *)b;
    *bytes = n;
    return ncclSuccess;
}
