/*
 * shm_coop.c: cooperative single copy: both ends of a connection copy one direct chunk.
 *
 * With single copy the receiver pulls a direct chunk out of the sender's buffer with
 * process_vm_readv while the sender, its chunk committed, has nothing to do but poll for credits
 * or for the drain. One kernel copy on one core reaches only about 60-75% of a user-space memcpy
 * (the kernel pins every 4 KiB page and copies without non-temporal stores), so a large chunk is
 * cut into blocks of CHORUS_SHM_CMA_BLOCK bytes and the sender copies some of them itself, with
 * process_vm_writev into the receiver's buffer, whenever it polls this connection (send_acquire
 * without credit, send_drained not yet done, progress). Each byte is still copied exactly once;
 * two cores share the work. Ranks that are threads of one process do the same with plain copies.
 *
 * Protocol (shm_coop_t in the control area, one request at a time per connection):
 *   receiver open   claim := (gen << 32) | CLOSED; release fence; write the request fields;
 *                   helped := 0; claim := gen << 32 (release).
 *   both claim      load claim (acquire), read the fields, acquire fence, CAS claim -> +1. The
 *                   receiver claims until none are left, so it never waits for a block that
 *                   nobody has claimed; the sender claims only while it is polling anyway.
 *   sender          copies its block, then helped += 1 (release). A block it cannot write is
 *                   named in redo (and it stops helping on this connection): the receiver copies
 *                   that block itself.
 *   receiver finish waits (deadline, abort flag, peer liveness) until helped equals the blocks
 *                   the sender claimed, then returns: no block of the chunk is still being
 *                   written, even when it returns an error.
 * The CLOSED store before the field writes, paired with the reader's acquire fence before its
 * CAS, makes a claim that succeeds prove that the fields it read belong to its generation (the
 * seqlock argument): a stale reader's CAS fails and it reads again.
 *
 * The sender decides at connect whether it helps: CHORUS_SHM_CMA_COOP=1 and a process_vm_writev
 * probe into the receiver works (ptrace rules need not be symmetric, so the probe goes in this
 * direction). The receiver opens requests only for chunks of at least two blocks and only while
 * the sender says it helps; otherwise recv_copy stays the plain single-reader copy.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "param.h"
#include "shm.h"
#include "waiter.h"

#define SHM_COOP_CLOSED 0xffffffffu
#define SHM_COOP_LIVENESS_NS 2000000ull /* 2 ms between peer probes while waiting */

static const char *shm_coop_host(chorus_conn_t *conn) {
    return conn->ctx && conn->ctx->peers ? conn->ctx->peers[conn->peer].hostname : "?";
}

void shm_coop_recv_init(shm_conn_t *sc) {
    sc->coop_block = 0;
    atomic_store_explicit(&sc->ctrl->coop.probe_addr, (uint64_t)(uintptr_t)&sc->coop_probe_word,
                          memory_order_relaxed);
    if (!chorus_param_int(PARAM_SHM_CMA_COOP)) return;
    int64_t block = chorus_param_int(PARAM_SHM_CMA_BLOCK);
    if (block < 4096) block = 4096;
    sc->coop_block = (size_t)block / 4096 * 4096; /* whole pages: no page pinned by both ends */
}

void shm_coop_send_init(chorus_conn_t *conn, shm_conn_t *sc) {
    shm_coop_t *co = &sc->ctrl->coop;
    sc->coop = 0;
    if (!chorus_param_int(PARAM_SHM_CMA_COOP)) return;
    if (sc->cma == SHM_CMA_ON) {
        uint64_t addr = atomic_load_explicit(&co->probe_addr, memory_order_relaxed);
        uint64_t value = 0x434f4f5050524f42ull ^ chorus_now_ns();
        int err = addr ? shm_cma_write(sc, addr, &value, sizeof(value)) : EINVAL;
        if (err) {
            INFO(SUB_SHM | SUB_INIT,
                 "shm: process_vm_writev into rank %d (%s, pid %d) failed: %s; it copies "
                 "single-copy chunks alone",
                 conn->peer, shm_coop_host(conn), sc->peer_pid, strerror(err));
            return;
        }
    } else if (sc->cma != SHM_CMA_SAME_PROCESS) {
        return;
    }
    sc->coop = 1;
    atomic_store_explicit(&co->helper, SHM_COOP_ON, memory_order_release);
}

void shm_coop_open(shm_conn_t *sc, void *dst, uint64_t src, size_t bytes) {
    shm_coop_t *co = &sc->ctrl->coop;
    uint32_t gen = ++sc->coop_gen;
    if (gen == 0) gen = ++sc->coop_gen;
    uint64_t genw = (uint64_t)gen << 32;
    size_t block = sc->coop_block;
    uint32_t nblocks = (uint32_t)((bytes + block - 1) / block);
    atomic_store_explicit(&co->claim, genw | SHM_COOP_CLOSED, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&co->src, src, memory_order_relaxed);
    atomic_store_explicit(&co->dst, (uint64_t)(uintptr_t)dst, memory_order_relaxed);
    atomic_store_explicit(&co->bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&co->block, block, memory_order_relaxed);
    atomic_store_explicit(&co->nblocks, nblocks, memory_order_relaxed);
    atomic_store_explicit(&co->helped, 0, memory_order_relaxed);
    atomic_store_explicit(&co->claim, genw, memory_order_release);
    sc->coop_nblocks = nblocks;
    sc->coop_own = 0;
    sc->coop_claimed = 0;
    sc->coop_open = 1;
}

/* Stop the sender from claiming more: the claim index jumps to the end. Returns how many blocks
 * had been claimed (by either end) before. */
static uint32_t shm_coop_stop(shm_conn_t *sc) {
    shm_coop_t *co = &sc->ctrl->coop;
    uint64_t genw = (uint64_t)sc->coop_gen << 32;
    uint64_t prev =
        atomic_exchange_explicit(&co->claim, genw | sc->coop_nblocks, memory_order_acq_rel);
    uint32_t claimed = (uint32_t)prev;
    return claimed < sc->coop_nblocks ? claimed : sc->coop_nblocks;
}

ncclResult_t shm_coop_work(chorus_conn_t *conn, shm_conn_t *sc, uint32_t max_blocks) {
    shm_coop_t *co = &sc->ctrl->coop;
    /* Our own request: the fields are ours, no fences needed. */
    char *dst = (char *)(uintptr_t)atomic_load_explicit(&co->dst, memory_order_relaxed);
    uint64_t src = atomic_load_explicit(&co->src, memory_order_relaxed);
    size_t bytes = atomic_load_explicit(&co->bytes, memory_order_relaxed);
    size_t block = sc->coop_block;
    uint32_t n = sc->coop_nblocks;
    uint64_t w = atomic_load_explicit(&co->claim, memory_order_relaxed);
    while (max_blocks > 0 && (uint32_t)w < n) {
        if (!atomic_compare_exchange_weak_explicit(&co->claim, &w, w + 1, memory_order_relaxed,
                                                   memory_order_relaxed))
            continue; /* w now holds the current value */
        uint32_t i = (uint32_t)w;
        size_t off = (size_t)i * block;
        size_t len = bytes - off < block ? bytes - off : block;
        sc->coop_own++;
        sc->coop_own_blocks++;
        max_blocks--;
        ncclResult_t res = shm_cma_read(conn, sc, dst + off, src + off, len);
        if (res != ncclSuccess) {
            sc->coop_claimed = shm_coop_stop(sc);
            return res;
        }
        w++; /* the likely next value; a failed CAS corrects it */
    }
    return ncclSuccess;
}

/* Wait until the sender finished every block it claimed. */
static ncclResult_t shm_coop_wait(chorus_conn_t *conn, shm_conn_t *sc, uint32_t expect) {
    shm_coop_t *co = &sc->ctrl->coop;
    for (int spin = 0; spin < 256; spin++)
        if (atomic_load_explicit(&co->helped, memory_order_acquire) >= expect) return ncclSuccess;
    chorus_waiter_t w;
    chorus_waiter_init(&w, conn->ctx ? conn->ctx->abort_flag : NULL);
    uint64_t next_check = chorus_now_ns() + SHM_COOP_LIVENESS_NS;
    while (atomic_load_explicit(&co->helped, memory_order_acquire) < expect) {
        uint64_t now = chorus_now_ns();
        if (now >= next_check) {
            next_check = now + SHM_COOP_LIVENESS_NS;
            int closed = atomic_load_explicit(&sc->ctrl->send_closed, memory_order_acquire);
            if ((closed || !shm_segment_peer_alive(sc)) &&
                atomic_load_explicit(&co->helped, memory_order_acquire) < expect)
                return shm_peer_failed(conn, sc,
                                       closed ? "closed the connection while copying its part of a "
                                                "single-copy chunk"
                                              : "died while copying its part of a single-copy "
                                                "chunk (process exited or was killed)");
        }
        ncclResult_t res = chorus_waiter_step(&w);
        if (res != ncclSuccess) {
            char why[160];
            snprintf(why, sizeof(why), "did not finish its part of a single-copy chunk (%s)",
                     res == ncclSystemError ? "CHORUS_TIMEOUT passed" : "aborted");
            shm_peer_failed(conn, sc, why);
            return res;
        }
    }
    return ncclSuccess;
}

ncclResult_t shm_coop_finish(chorus_conn_t *conn, shm_conn_t *sc) {
    if (!sc->coop_open) return ncclSuccess;
    ncclResult_t res = ncclSuccess;
    uint32_t claimed = sc->coop_claimed;
    if (claimed == 0) {
        /* Normal end: claim (and copy) whatever is left; then every block is claimed. */
        res = shm_coop_work(conn, sc, UINT32_MAX);
        claimed = res == ncclSuccess ? sc->coop_nblocks : sc->coop_claimed;
    }
    /* Even after an error, wait for the sender's blocks: it may be writing into dst, which the
     * caller may free once we return. */
    ncclResult_t wres = shm_coop_wait(conn, sc, claimed - sc->coop_own);
    sc->coop_open = 0;
    if (res != ncclSuccess) return res;
    if (wres != ncclSuccess) return wres;
    shm_coop_t *co = &sc->ctrl->coop;
    uint64_t redo = atomic_load_explicit(&co->redo, memory_order_relaxed);
    if ((uint32_t)(redo >> 32) == sc->coop_gen && (uint32_t)redo != 0) {
        /* The sender claimed this block but could not write it: copy it ourselves. */
        size_t block = sc->coop_block, i = (uint32_t)redo - 1;
        size_t bytes = atomic_load_explicit(&co->bytes, memory_order_relaxed);
        char *dst = (char *)(uintptr_t)atomic_load_explicit(&co->dst, memory_order_relaxed);
        uint64_t src = atomic_load_explicit(&co->src, memory_order_relaxed);
        size_t off = i * block;
        size_t len = bytes - off < block ? bytes - off : block;
        CHECK(shm_cma_read(conn, sc, dst + off, src + off, len));
    }
    return ncclSuccess;
}

ncclResult_t shm_coop_read(chorus_conn_t *conn, shm_conn_t *sc, void *dst, uint64_t src,
                           size_t bytes) {
    shm_coop_open(sc, dst, src, bytes);
    ncclResult_t res = shm_coop_work(conn, sc, UINT32_MAX);
    ncclResult_t fres = shm_coop_finish(conn, sc);
    return res != ncclSuccess ? res : fres;
}

ncclResult_t shm_coop_help(chorus_conn_t *conn, shm_conn_t *sc, uint32_t max_blocks) {
    if (!sc->coop) return ncclSuccess;
    shm_coop_t *co = &sc->ctrl->coop;
    uint64_t w = atomic_load_explicit(&co->claim, memory_order_acquire);
    while (max_blocks > 0) {
        uint32_t i = (uint32_t)w;
        if (i >= atomic_load_explicit(&co->nblocks, memory_order_relaxed)) return ncclSuccess;
        uint64_t src = atomic_load_explicit(&co->src, memory_order_relaxed);
        uint64_t dst = atomic_load_explicit(&co->dst, memory_order_relaxed);
        uint64_t bytes = atomic_load_explicit(&co->bytes, memory_order_relaxed);
        uint64_t block = atomic_load_explicit(&co->block, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (!atomic_compare_exchange_weak_explicit(&co->claim, &w, w + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* another generation or another claim: read the fields again */
        max_blocks--;
        uint64_t off = (uint64_t)i * block;
        size_t len = (size_t)(bytes - off < block ? bytes - off : block);
        sc->coop_busy = 1;
        int err = shm_cma_write(sc, dst + off, (const void *)(uintptr_t)(src + off), len);
        sc->coop_busy = 0;
        if (err) {
            atomic_store_explicit(&co->redo, (w & ~(uint64_t)SHM_COOP_CLOSED) | (i + 1),
                                  memory_order_relaxed);
        } else {
            sc->coop_helped_blocks++;
        }
        atomic_fetch_add_explicit(&co->helped, 1, memory_order_release);
        if (err) {
            /* The receiver copies the block itself; stop helping on this connection. */
            sc->coop = 0;
            if (err == ESRCH)
                return shm_peer_failed(conn, sc, "died: it exited during a single-copy write");
            INFO(SUB_SHM,
                 "shm: process_vm_writev of %zu bytes into rank %d (%s, pid %d) failed: "
                 "%s; no more cooperative copies on this connection",
                 len, conn->peer, shm_coop_host(conn), sc->peer_pid, strerror(err));
            return ncclSuccess;
        }
        w = atomic_load_explicit(&co->claim, memory_order_acquire);
    }
    return ncclSuccess;
}
