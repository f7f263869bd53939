/*
 * shm_cma.c: single-copy transfers (Cross Memory Attach, process_vm_readv).
 *
 * A large chunk copied through the slots costs two copies (sender into the slot, receiver out of
 * it). With CMA the receiver reads the sender's buffer directly: one copy, done by the kernel.
 * Whether the kernel allows it depends on ptrace permission between the two processes (Yama,
 * containers without CAP_SYS_PTRACE, different user ids), so the receiver probes it at connect
 * time by reading a known word from the sender (the sender's blob gives its address and value).
 * The probe goes in the direction the data goes, because ptrace rules need not be symmetric.
 *
 * Ranks that are threads of one process share the address space: the "direct" read is then a
 * plain memcpy from the sender's pointer.
 *
 * The other direction (process_vm_writev, sender into the receiver's buffer) serves the
 * cooperative copy (shm_coop.c), where the sender copies part of a direct chunk itself.
 *
 * CHORUS_SHM_CMA: -1 probe and fall back to the slots quietly (INFO), 0 never, 1 required (a
 * failed probe fails the connection).
 */
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "check.h"
#include "host_copy.h"
#include "param.h"
#include "shm.h"

static const char *shm_peer_host(chorus_conn_t *conn) {
    return conn->ctx && conn->ctx->peers ? conn->ctx->peers[conn->peer].hostname : "?";
}

ncclResult_t shm_cma_probe(chorus_conn_t *conn, shm_conn_t *sc, const shm_send_blob_t *sb) {
    int64_t mode = chorus_param_int(PARAM_SHM_CMA);
    const chorus_locality_t *self = &conn->ctx->peers[conn->ctx->rank];
    int state = SHM_CMA_OFF;
    char why[160] = "";

    if (mode == 0) {
        snprintf(why, sizeof(why), "disabled by CHORUS_SHM_CMA=0");
    } else if (sb->pid == (uint32_t)getpid() && sb->pid_ns == self->pid_ns) {
        state = SHM_CMA_SAME_PROCESS;
    } else if (!self->pid_ns_ok || sb->pid_ns != self->pid_ns) {
        snprintf(why, sizeof(why), "rank %d is in another pid namespace", conn->peer);
    } else {
        uint64_t value = 0;
        struct iovec local = {&value, sizeof(value)};
        struct iovec remote = {(void *)(uintptr_t)sb->probe_addr, sizeof(value)};
        ssize_t n = process_vm_readv((pid_t)sb->pid, &local, 1, &remote, 1, 0);
        if (n == (ssize_t)sizeof(value) && value == sb->probe_value) {
            state = SHM_CMA_ON;
        } else if (n < 0) {
            snprintf(why, sizeof(why), "process_vm_readv from pid %u failed: %s", sb->pid,
                     strerror(errno));
        } else {
            snprintf(why, sizeof(why), "process_vm_readv from pid %u read wrong data", sb->pid);
        }
    }
    sc->cma = state;
    atomic_store_explicit(&sc->ctrl->cma_state, (uint32_t)state, memory_order_release);
    if (state == SHM_CMA_OFF && mode != 0) {
        if (mode == 1) {
            WARN("shm: single copy from rank %d (%s, pid %u) required by CHORUS_SHM_CMA=1 but "
                 "unavailable: %s",
                 conn->peer, shm_peer_host(conn), sb->pid, why);
            return ncclSystemError;
        }
        INFO(SUB_SHM | SUB_INIT, "shm: no single copy from rank %d: %s; copying through slots",
             conn->peer, why);
    }
    return ncclSuccess;
}

ncclResult_t shm_cma_read(chorus_conn_t *conn, shm_conn_t *sc, void *dst, uint64_t src,
                          size_t bytes) {
    if (sc->cma == SHM_CMA_SAME_PROCESS) {
        rk_copy(dst, (const void *)(uintptr_t)src, bytes); /* not glibc memcpy: see rk_copy */
        return ncclSuccess;
    }
    size_t done = 0;
    while (done < bytes) {
        struct iovec local = {(char *)dst + done, bytes - done};
        struct iovec remote = {(void *)(uintptr_t)(src + done), bytes - done};
        ssize_t n = process_vm_readv((pid_t)sc->peer_pid, &local, 1, &remote, 1, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == ESRCH)
            return shm_peer_failed(conn, sc, "died: it exited during a single-copy read");
        char why[128];
        snprintf(why, sizeof(why), "failed: single-copy read of %zu bytes at 0x%llx failed: %s",
                 bytes - done, (unsigned long long)(src + done),
                 n < 0 ? strerror(errno) : "no data");
        return shm_peer_failed(conn, sc, why);
    }
    return ncclSuccess;
}

int shm_cma_write(shm_conn_t *sc, uint64_t dst, const void *src, size_t bytes) {
    if (sc->cma == SHM_CMA_SAME_PROCESS) {
        rk_copy((void *)(uintptr_t)dst, src, bytes);
        return 0;
    }
    size_t done = 0;
    while (done < bytes) {
        struct iovec local = {(char *)src + done, bytes - done};
        struct iovec remote = {(void *)(uintptr_t)(dst + done), bytes - done};
        ssize_t n = process_vm_writev((pid_t)sc->peer_pid, &local, 1, &remote, 1, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return n < 0 ? errno : EIO;
    }
    return 0;
}
