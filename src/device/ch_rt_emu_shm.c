/*
 * ch_rt_emu_shm.c: the device emulator's memory shared between processes (see ch_rt_emu_shm.h).
 *
 * A shared block is a memfd mapped by its owner; a peer of this host opens
 * /proc/<pid>/fd/<fd> and maps it. The emulator's "device" reaches all host memory, so host
 * registration has nothing to do.
 */
#include "ch_rt_emu_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
