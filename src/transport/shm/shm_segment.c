/*
 * shm_segment.c: the shared-memory segment behind one connection.
 *
 * The receiver creates it: shm_open with O_EXCL and mode 0600 under a name that holds "chorus",
 * its pid and 64 random bits, sizes it, binds the range to its NUMA node (MPOL_PREFERRED through
 * the mbind syscall, so no libnuma is needed) and touches every page itself, so the pages are
 * first-touched on its node even where mbind is not available. The sender maps the same name and
 * unlinks it right away; the receiver unlinks it again at connect and at close (ENOENT is fine),
 * so once both ends have mapped it nothing is left in /dev/shm even if both then crash.
 *
 * A process killed between the receiver's setup and the sender's mapping leaves the name behind;
 * the next process to create a segment removes names whose creator (same pid namespace, pid in
 * the name) no longer exists, and so does chorusrun once its ranks have exited. That window (the
 * receiver's shm_open in setup to the sender's shm_unlink just after its mmap) spans the exchange
 * of the setup messages; a segment whose creator is gone is unusable anyway.
 *
 * Each end keeps the fd open and holds an open-file-description write lock on its own byte (see
 * shm.h): shm_segment_peer_alive() asks the kernel whether the peer's lock still exists.
 *
 * Two ranks of one process (thread ranks) share one mapping of their segment: the sender finds
 * the receiver's mapping in a process-wide table instead of mapping the pages a second time. The
 * counters then have one address, which is what ThreadSanitizer needs to see the ordering they
 * carry, and a process with many thread ranks maps each segment once. The fds, and with them the
 * liveness locks, stay per end.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "util.h"
#include "shm.h"

#ifndef MPOL_PREFERRED
#define MPOL_PREFERRED 1
#endif

size_t shm_ctrl_bytes(int nslots) {
    size_t bytes = sizeof(shm_ctrl_t) + (size_t)nslots * sizeof(shm_slot_hdr_t);
    return CHORUS_ALIGN_UP(bytes, (size_t)4096);
}

static ncclResult_t shm_lock_byte(shm_conn_t *sc, int byte) {
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = byte;
    fl.l_len = 1;
    if (fcntl(sc->fd, F_OFD_SETLK, &fl) == 0) {
        sc->locked = 1;
    } else {
        /* Not fatal: liveness then falls back to kill(pid, 0) (see shm_segment_peer_alive). */
        INFO(SUB_SHM, "shm: cannot lock %s: %s; peer liveness uses the pid", sc->name,
             strerror(errno));
    }
    return ncclSuccess;
}

/* Our pid namespace (inode of /proc/self/ns/pid), 0 when unknown. Part of every segment name, so
 * that the janitor below only judges segments whose pid means something here. */
static uint64_t shm_pid_ns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Returns the random bits in the name: they also give the segment its pair_id (shm_pair.c). */
static uint64_t shm_make_name(char *name, size_t len) {
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd)) {
        /* Entropy pool not ready (early boot): O_EXCL still guarantees uniqueness. */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rnd = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)name;
    }
    snprintf(name, len, "/chorus-shm-%d-%016llx-n%llx", (int)getpid(), (unsigned long long)rnd,
             (unsigned long long)shm_pid_ns());
    return rnd;
}

/* A segment has a name only between the receiver's setup and the sender's mapping; a process
 * killed inside that window leaves the name behind. Remove such names: made in our pid namespace
 * by a process that no longer exists. Live processes' segments and other namespaces' are never
 * touched. Runs once per process before its first segment (shm_janitor), and in chorusrun once
 * its ranks are gone, so a job killed whole during connection setup leaves nothing behind. */
int shm_sweep_orphans(void) {
    int removed = 0;
    uint64_t ns = shm_pid_ns();
    if (ns == 0) return 0;
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid = 0;
        unsigned long long rnd = 0, seg_ns = 0;
        if (sscanf(e->d_name, "chorus-shm-%d-%16llx-n%llx", &pid, &rnd, &seg_ns) != 3) continue;
        if (seg_ns != ns || pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) continue;
        char path[sizeof(e->d_name) + 1];
        snprintf(path, sizeof(path), "/%s", e->d_name);
        if (shm_unlink(path) == 0) {
            removed++;
            INFO(SUB_SHM | SUB_INIT, "shm: removed %s, left by pid %d which no longer exists", path,
                 pid);
        }
    }
    closedir(d);
    return removed;
}

static void shm_janitor(void) {
    static int done;
    if (__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL)) return;
    (void)shm_sweep_orphans();
}

static void shm_bind_numa(void *addr, size_t bytes, int numa_node) {
    if (numa_node < 0 || numa_node >= 64) return;
    unsigned long mask = 1ul << numa_node;
    if (syscall(SYS_mbind, addr, bytes, MPOL_PREFERRED, &mask, 64ul, 0u) != 0) {
        INFO(SUB_SHM, "shm: mbind to NUMA node %d failed (%s); relying on first touch", numa_node,
             strerror(errno));
    }
}

/* The process's mappings of its own segments (see the top of this file). */
typedef struct shm_mapping {
    struct shm_mapping *next;
    char name[sizeof(((shm_conn_t *)0)->name)];
    void *base;
    size_t bytes;
    int refs;
} shm_mapping_t;

static pthread_mutex_t g_maps_lock = PTHREAD_MUTEX_INITIALIZER;
static shm_mapping_t *g_maps;

/* Remembers a mapping this process made; on failure (no memory) the segment just is not shared. */
static void shm_mapping_add(const char *name, void *base, size_t bytes) {
    shm_mapping_t *m = calloc(1, sizeof(*m));
    if (!m) return;
    snprintf(m->name, sizeof(m->name), "%s", name);
    m->base = base;
    m->bytes = bytes;
    m->refs = 1;
    pthread_mutex_lock(&g_maps_lock);
    m->next = g_maps;
    g_maps = m;
    pthread_mutex_unlock(&g_maps_lock);
}

/* This process's mapping of `name` with a reference taken, or NULL. */
static void *shm_mapping_get(const char *name, size_t bytes) {
    void *base = NULL;
    pthread_mutex_lock(&g_maps_lock);
    for (shm_mapping_t *m = g_maps; m; m = m->next) {
        if (strcmp(m->name, name) == 0 && m->bytes == bytes) {
            m->refs++;
            base = m->base;
            break;
        }
    }
    pthread_mutex_unlock(&g_maps_lock);
    return base;
}

/* Drops one reference to the mapping at base; unmaps it with the last one (or at once when the
 * table does not know it). */
static void shm_mapping_put(void *base, size_t bytes) {
    int unmap = 1;
    pthread_mutex_lock(&g_maps_lock);
    for (shm_mapping_t **pp = &g_maps; *pp; pp = &(*pp)->next) {
        shm_mapping_t *m = *pp;
        if (m->base != base) continue;
        if (--m->refs > 0) {
            unmap = 0;
        } else {
            *pp = m->next;
            free(m);
        }
        break;
    }
    pthread_mutex_unlock(&g_maps_lock);
    if (unmap) munmap(base, bytes);
}

ncclResult_t shm_segment_create(shm_conn_t *sc, int nslots, size_t slot_bytes, int numa_node) {
    size_t ctrl_bytes = shm_ctrl_bytes(nslots);
    size_t map_bytes = ctrl_bytes + (size_t)nslots * slot_bytes;
    int fd = -1;
    uint64_t rnd = 0;
    shm_janitor();
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        rnd = shm_make_name(sc->name, sizeof(sc->name));
        fd = shm_open(sc->name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        WARN("shm_open %s failed: %s", sc->name, strerror(errno));
        return ncclSystemError;
    }
    sc->fd = fd;
    sc->name_linked = 1;
    /* ftruncate on tmpfs does not reserve pages; posix_fallocate does, so a /dev/shm that is too
     * small (containers) fails here with a clear message instead of SIGBUS in the data path. */
    int err = posix_fallocate(fd, 0, (off_t)map_bytes);
    if (err != 0) {
        WARN("cannot extend %s to %zu bytes: %s (is /dev/shm too small?)", sc->name, map_bytes,
             strerror(err));
        goto err_unlink;
    }
    void *p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        WARN("mmap of %s (%zu bytes) failed: %s", sc->name, map_bytes, strerror(errno));
        goto err_unlink;
    }
    sc->map_bytes = map_bytes;
    sc->ctrl = (shm_ctrl_t *)p;
    sc->data = (char *)p + ctrl_bytes;
    shm_mapping_add(sc->name, p, map_bytes);
    shm_bind_numa(p, map_bytes, numa_node);
    /* First touch by the receiver: pages land on its node and the data path takes no faults. */
    memset(p, 0, map_bytes);
    shm_ctrl_t *c = sc->ctrl;
    c->magic = SHM_CTRL_MAGIC;
    c->nslots = (uint32_t)nslots;
    c->slot_bytes = slot_bytes;
    c->data_offset = ctrl_bytes;
    c->recv_pid = (uint32_t)getpid();
    uint32_t id = (uint32_t)(rnd ^ (rnd >> 32));
    c->pair_id = id ? id : 1;
    atomic_store_explicit(&c->tail, 0, memory_order_relaxed);
    atomic_store_explicit(&c->head, 0, memory_order_relaxed);
    atomic_store_explicit(&c->cma_state, SHM_CMA_UNDECIDED, memory_order_release);
    CHECK(shm_lock_byte(sc, SHM_LOCK_RECV_BYTE));
    return ncclSuccess;

err_unlink:
    shm_unlink(sc->name);
    sc->name_linked = 0;
    close(fd);
    sc->fd = -1;
    return ncclSystemError;
}

ncclResult_t shm_segment_attach(shm_conn_t *sc, const shm_recv_blob_t *rb) {
    memcpy(sc->name, rb->name, sizeof(sc->name));
    sc->name[sizeof(sc->name) - 1] = '\0';
    int fd = shm_open(sc->name, O_RDWR, 0600);
    if (fd < 0) {
        WARN("shm_open %s (created by pid %u) failed: %s", sc->name, rb->pid, strerror(errno));
        return ncclSystemError;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < rb->map_bytes) {
        WARN("shm segment %s is %lld bytes, expected %llu", sc->name, (long long)st.st_size,
             (unsigned long long)rb->map_bytes);
        close(fd);
        return ncclSystemError;
    }
    void *p = rb->pid == (uint32_t)getpid() ? shm_mapping_get(sc->name, rb->map_bytes) : NULL;
    if (!p) p = mmap(NULL, rb->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        WARN("mmap of %s (%llu bytes) failed: %s", sc->name, (unsigned long long)rb->map_bytes,
             strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    /* Both ends have it mapped now: the name is no longer needed. */
    if (shm_unlink(sc->name) != 0 && errno != ENOENT)
        INFO(SUB_SHM, "shm_unlink %s: %s", sc->name, strerror(errno));
    sc->fd = fd;
    sc->map_bytes = rb->map_bytes;
    sc->ctrl = (shm_ctrl_t *)p;
    const char *why = shm_ctrl_problem(sc->ctrl, rb);
    if (why) {
        WARN("shm segment %s has a bad control header: %s", sc->name, why);
        shm_segment_destroy(sc);
        return ncclSystemError;
    }
    sc->data = (char *)p + sc->ctrl->data_offset;
    CHECK(shm_lock_byte(sc, SHM_LOCK_SEND_BYTE));
    atomic_store_explicit(&sc->ctrl->send_mapped, 1, memory_order_release);
    return ncclSuccess;
}

void shm_segment_unlink(shm_conn_t *sc) {
    if (!sc->name_linked) return;
    if (shm_unlink(sc->name) != 0 && errno != ENOENT)
        INFO(SUB_SHM, "shm_unlink %s: %s", sc->name, strerror(errno));
    sc->name_linked = 0;
}

void shm_segment_destroy(shm_conn_t *sc) {
    shm_segment_unlink(sc);
    if (sc->ctrl) shm_mapping_put(sc->ctrl, sc->map_bytes);
    sc->ctrl = NULL;
    sc->data = NULL;
    /* Closing the fd drops our lock: the peer's next liveness probe sees us gone. */
    if (sc->fd >= 0) close(sc->fd);
    sc->fd = -1;
}

int shm_segment_peer_alive(shm_conn_t *sc) {
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = sc->is_send ? SHM_LOCK_RECV_BYTE : SHM_LOCK_SEND_BYTE;
    fl.l_len = 1;
    /* The receiver can only trust the sender's lock once the sender says it has mapped (and
     * locked) the segment: its connect may still be on the way. */
    int peer_locked =
        sc->is_send || atomic_load_explicit(&sc->ctrl->send_mapped, memory_order_acquire);
    if (sc->locked && peer_locked && fcntl(sc->fd, F_OFD_GETLK, &fl) == 0)
        return fl.l_type != F_UNLCK;
    /* No OFD locks here (or not yet): fall back to the pid, meaningful in the same pid namespace
     * only (shm_cma_probe's namespace check decides peer_pid_ok). */
    if (sc->peer_pid_ok && kill(sc->peer_pid, 0) != 0 && errno == ESRCH) return 0;
    return 1;
}
