/*
 * ch_rt_emu_shm.c: the device emulator's memory shared between processes (see ch_rt_emu_shm.h).
 *
 * A shared block is a memfd mapped by its owner; a peer of this host opens
 * /proc/<pid>/fd/<fd> and maps it. ipc_alloc's blocks are such memfds, and so is the memory of
 * ch_emu_malloc (dev_alloc), as a GPU's cudaMalloc memory has a legacy IPC handle: its block ends
 * at an inaccessible page, so that a write past it faults as the heap's redzones reported it
 * before. A process opens a block at most once at a time, as CUDA allows. The emulator's "device"
 * reaches all host memory, so host registration has nothing to do. The cuMem entries
 * (ncclMemAlloc's memory) are memfds too, with handles, mappings and descriptors of their own
 * (below).
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
 * owner keeps the fd while the block lives (ipc_free closes it). Every block the emulator makes
 * (ipc_alloc's and ch_emu_malloc's) gets a serial, so that a handle names one allocation even
 * once its descriptor number is reused. */
typedef struct {
    void *p;
    int fd;
    size_t bytes;
    uint64_t serial;
} emu_ipc_t;
static emu_ipc_t g_ipc[64];
static pthread_mutex_t g_ipc_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_serial;

/* The blocks of other processes (or of this one) opened here, by (pid, serial): as CUDA does, a
 * second open of one while the first is live fails. */
typedef struct emu_opened {
    int64_t pid;
    uint64_t serial;
    void *p;
    struct emu_opened *next;
} emu_opened_t;
static emu_opened_t *g_opened;

/* bytes rounded up to whole pages (what a memfd block and its mappings take). */
static size_t emu_pages(size_t bytes) {
    return (bytes + 4095) / 4096 * 4096;
}

static void *emu_map_fd(int fd, size_t bytes) {
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return m == MAP_FAILED ? NULL : m;
}

/* A memfd of bytes (a page multiple), or -1. */
static int emu_memfd(size_t bytes) {
    int fd = memfd_create("chorus-devemu", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        WARN("device emulator: shared memory of %zu bytes: %s", bytes, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

ncclResult_t ch_emu_ipc_alloc(void **p, size_t bytes, ch_ipc_handle_t *h) {
    const size_t size = emu_pages(bytes);
    const int fd = emu_memfd(size);
    if (fd < 0) return ncclSystemError;
    void *m = emu_map_fd(fd, size);
    if (m == NULL) {
        WARN("device emulator: mmap of %zu shared bytes: %s", size, strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    const uint64_t serial = __atomic_add_fetch(&g_serial, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_ipc_lock);
    int slot = -1;
    for (int i = 0; i < 64 && slot < 0; i++)
        if (g_ipc[i].p == NULL) slot = i;
    if (slot >= 0) {
        g_ipc[slot].p = m;
        g_ipc[slot].fd = fd;
        g_ipc[slot].bytes = size;
        g_ipc[slot].serial = serial;
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
    h->ptr = (uint64_t)(uintptr_t)m;
    h->pad[0] = serial;
    *p = m;
    return ncclSuccess;
}

void *ch_emu_block_alloc(size_t bytes, int *fd_p, uint64_t *serial_p) {
    const size_t file = emu_pages(bytes);
    const int fd = emu_memfd(file);
    if (fd < 0) return NULL;
    /* The file, then an inaccessible page: the block ends where the page starts. */
    char *r = mmap(NULL, file + 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED ||
        mmap(r, file, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        WARN("device emulator: mmap of a %zu-byte block: %s", bytes, strerror(errno));
        if (r != MAP_FAILED) munmap(r, file + 4096);
        close(fd);
        return NULL;
    }
    *fd_p = fd;
    *serial_p = __atomic_add_fetch(&g_serial, 1, __ATOMIC_RELAXED);
    return r + (file - bytes);
}

void ch_emu_block_free(void *p, size_t bytes, int fd) {
    const size_t file = emu_pages(bytes);
    munmap((char *)p - (file - bytes), file + 4096);
    close(fd);
}

ncclResult_t ch_emu_ipc_describe(const void *p, size_t bytes, ch_ipc_handle_t *h, size_t *offset) {
    uintptr_t base = 0;
    size_t size = 0;
    int fd = -1;
    uint64_t serial = 0;
    size_t data_off = 0;
    if (ch_emu_block_find(p, bytes, &base, &size, &fd, &serial)) {
        data_off = emu_pages(size) - size;
    } else {
        const uintptr_t u = (uintptr_t)p;
        pthread_mutex_lock(&g_ipc_lock);
        for (int i = 0; i < 64 && fd < 0; i++) {
            const uintptr_t b = (uintptr_t)g_ipc[i].p;
            if (b == 0 || u < b || u >= b + g_ipc[i].bytes || bytes > b + g_ipc[i].bytes - u)
                continue;
            base = b;
            size = g_ipc[i].bytes;
            fd = g_ipc[i].fd;
            serial = g_ipc[i].serial;
        }
        pthread_mutex_unlock(&g_ipc_lock);
    }
    if (fd < 0) return ncclInvalidArgument; /* not a memfd block of the emulator */
    memset(h, 0, sizeof(*h));
    h->pid = getpid();
    h->fd = fd;
    h->bytes = size + data_off;
    h->ptr = (uint64_t)base;
    h->pad[0] = serial;
    h->pad[1] = data_off;
    *offset = (size_t)((uintptr_t)p - base);
    return ncclSuccess;
}

ncclResult_t ch_emu_ipc_open(const ch_ipc_handle_t *h, void **p) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%lld/fd/%lld", (long long)h->pid, (long long)h->fd);
    emu_opened_t *rec = malloc(sizeof(*rec));
    if (rec == NULL) {
        WARN("device emulator: out of memory opening %s", path);
        return ncclSystemError;
    }
    rec->pid = h->pid;
    rec->serial = h->pad[0];
    pthread_mutex_lock(&g_ipc_lock);
    int twice = 0;
    for (const emu_opened_t *o = g_opened; o && !twice; o = o->next)
        twice = o->pid == rec->pid && o->serial == rec->serial;
    pthread_mutex_unlock(&g_ipc_lock);
    if (twice) {
        WARN("device emulator: block %llu of process %lld is already open here (CUDA refuses "
             "a second open of a handle)",
             (unsigned long long)rec->serial, (long long)rec->pid);
        free(rec);
        return ncclInvalidUsage;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        WARN("device emulator: cannot open the shared block %s: %s", path, strerror(errno));
        free(rec);
        return ncclSystemError;
    }
    char *m = emu_map_fd(fd, (size_t)h->bytes);
    close(fd);
    if (m == NULL) {
        WARN("device emulator: mmap of the shared block %s: %s", path, strerror(errno));
        free(rec);
        return ncclSystemError;
    }
    rec->p = m + h->pad[1]; /* where the allocation starts */
    pthread_mutex_lock(&g_ipc_lock);
    rec->next = g_opened;
    g_opened = rec;
    pthread_mutex_unlock(&g_ipc_lock);
    *p = rec->p;
    return ncclSuccess;
}

/* An own ipc_alloc block (page aligned) or an opened one (bytes: its handle's, the whole file;
 * the allocation starts in the file's first page). */
void ch_emu_ipc_free(void *p, size_t bytes) {
    if (p == NULL) return;
    const size_t size = emu_pages(bytes);
    emu_opened_t *rec = NULL;
    pthread_mutex_lock(&g_ipc_lock);
    for (int i = 0; i < 64; i++) {
        if (g_ipc[i].p == p) {
            close(g_ipc[i].fd);
            g_ipc[i].p = NULL;
        }
    }
    for (emu_opened_t **pp = &g_opened; *pp; pp = &(*pp)->next) {
        if ((*pp)->p == p) {
            rec = *pp;
            *pp = rec->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_ipc_lock);
    free(rec);
    munmap((void *)((uintptr_t)p & ~(uintptr_t)4095), size);
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
