/*
 * slot_store.c: plain or streaming stores for the large chunks a sender writes into shm slots.
 *
 * Another core reads a slot right after the sender fills it. With plain stores, each line of the
 * slot first moves from the receiver's cache to the sender's (the receiver read that slot
 * nslots chunks ago), and then back. Between two cores that share a last-level cache, both
 * moves are cheap. Between cores that do not (two dies or sockets, or the vCPUs of a guest the
 * host has put on two dies), each move is a cross-die round trip, and the copy runs far below
 * memory bandwidth. Streaming stores send the lines to memory without taking them first, and the
 * receiver reads them from there.
 *
 * On the project's guest, a 2-rank 1 MiB all-reduce took:
 *   - in its "slow" state: 165 us with plain stores, 67 us with streaming stores;
 *   - in its "fast" state: 46 us with plain stores, 89 us with streaming stores.
 * The topology cannot tell the two apart: a guest sees one cache, and the host moves its vCPUs
 * while the program runs.
 *
 * So each send connection measures, in ticks per KiB. Every large chunk is timed in the mode in
 * use, and now and then a probe writes a chunk (or part of one) in the other mode. The estimate
 * per mode is the best sample of a window, so a preempted copy does not count. The connection
 * switches to streaming stores when plain ones measure more than 2x slower, and back to plain
 * below 1.2x. The gap between the two thresholds keeps it from flapping (a plain probe in
 * streaming mode once measured 1.31x across dies, where whole plain chunks measure 3-5x).
 *
 * The sender's own copy is what slows down between dies. Where the cores share a cache, the two
 * rates are close, and the receiver's reads from cache make plain stores the faster choice.
 *
 * That measurement cannot tell the two states apart (plain copies measured 2.0-2.5x slower than
 * streaming ones in both; the receiver's reads decide). So where a communicator has exactly two
 * ranks on the host, its ring and one-shot ops choose from whole ops' times
 * (src/collectives/store_choice.c) and set op_mode on their send connections while they run;
 * chunks written then follow it and are not sampled.
 *
 * CHORUS_SHM_SLOT_STREAM: -1 measure (the default), 0 always plain, 1 always streaming.
 */
#include <stdatomic.h>

#include "host_copy.h"
#include "log.h"
#include "param.h"
#include "slot_store.h"
#include "transport.h"
#include "util.h"
#include "waiter.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t slot_store_ticks(void) {
    return __rdtsc();
}
#else
static inline uint64_t slot_store_ticks(void) {
    return chorus_now_ns();
}
#endif

/* Plain mode: every SLOT_STORE_STREAM_PROBE_EVERY-th large chunk (and the 8th, for a first
 * estimate) is written whole with streaming stores. Streaming mode: every
 * SLOT_STORE_PLAIN_PROBE_EVERY-th chunk writes its first SLOT_STORE_PLAIN_PROBE_BYTES with plain
 * stores. A probe costs most where its mode is the slow one, so each stays rare. */
#define SLOT_STORE_STREAM_PROBE_EVERY 128u
#define SLOT_STORE_FIRST_PROBE 8u
#define SLOT_STORE_PLAIN_PROBE_EVERY 32u
#define SLOT_STORE_PLAIN_PROBE_BYTES ((size_t)32768)
#define SLOT_STORE_WINDOW 4u       /* samples per estimate of the mode in use */
#define SLOT_STORE_PROBE_WINDOW 2u /* of the other mode */
#define SLOT_STORE_TO_STREAM_NUM 2 /* plain / stream > 2 */
#define SLOT_STORE_TO_STREAM_DEN 1
#define SLOT_STORE_TO_PLAIN_NUM 6 /* plain / stream < 1.2 */
#define SLOT_STORE_TO_PLAIN_DEN 5

/* Totals for the tests, folded in from each connection's counters when it closes
 * (slot_store_fini): an atomic shared by every rank thread on each large chunk would move its
 * line between cores once per chunk. */
static struct {
    _Alignas(64) _Atomic uint64_t chunks;
    _Atomic uint64_t streamed;
} slot_store_stat;

void slot_store_init(slot_store_t *st, int ok) {
    *st = (slot_store_t){0};
    int64_t p = chorus_param_int(PARAM_SHM_SLOT_STREAM);
    st->ok = (uint8_t)(ok != 0);
    static _Atomic int warned;
    if (p != -1 && p != 0 && p != 1 && !atomic_exchange(&warned, 1))
        WARN("CHORUS_SHM_SLOT_STREAM=%lld is not -1 (measure), 0 (plain) or 1 (streaming); "
             "measuring",
             (long long)p);
    if (ok && (p == 0 || p == 1)) {
        st->forced = 1;
        st->mode = (uint8_t)p;
    }
    st->best[0] = st->best[1] = UINT64_MAX;
    st->op_mode = -1;
}

static inline void slot_store_write(int mode, void *dst, const void *src, size_t bytes) {
    if (mode == SLOT_STORE_STREAM)
        rk_copy_nt(dst, src, bytes);
    else
        rk_copy(dst, src, bytes);
}

/* Record one timed copy. An estimate is the best of a window of samples (the first sample stands
 * in until then); the mode changes only when a window of the mode in use completes, so the
 * decision rests on a full window of it and on the other mode's latest estimate. A preempted
 * probe only makes the other mode look slow, which keeps the mode as it is. */
static void slot_store_sample(chorus_conn_t *conn, slot_store_t *st, int mode, uint64_t ticks,
                              size_t bytes) {
    uint64_t per_kib = ticks * 1024 / bytes;
    if (per_kib == 0) per_kib = 1;
    if (per_kib < st->best[mode]) st->best[mode] = per_kib;
    if (st->est[mode] == 0) st->est[mode] = per_kib;
    if (++st->samples[mode] < (mode == st->mode ? SLOT_STORE_WINDOW : SLOT_STORE_PROBE_WINDOW))
        return;
    st->est[mode] = st->best[mode];
    st->best[mode] = UINT64_MAX;
    st->samples[mode] = 0;
    if (mode != st->mode) return;
    const uint64_t plain = st->est[SLOT_STORE_PLAIN], stream = st->est[SLOT_STORE_STREAM];
    if (plain == 0 || stream == 0) return;
    int want = st->mode;
    if (st->mode == SLOT_STORE_PLAIN &&
        plain * SLOT_STORE_TO_STREAM_DEN > stream * SLOT_STORE_TO_STREAM_NUM)
        want = SLOT_STORE_STREAM;
    else if (st->mode == SLOT_STORE_STREAM &&
             plain * SLOT_STORE_TO_PLAIN_DEN < stream * SLOT_STORE_TO_PLAIN_NUM)
        want = SLOT_STORE_PLAIN;
    if (want == st->mode) return;
    st->mode = (uint8_t)want;
    st->changes++;
    INFO(SUB_SHM,
         "rank %d -> %d (%s, channel %d): slot writes now %s (plain %llu, streaming %llu "
         "ticks/KiB)",
         conn->ctx ? conn->ctx->rank : -1, conn->peer, conn->desc, conn->channel,
         want == SLOT_STORE_STREAM ? "streaming" : "plain", (unsigned long long)plain,
         (unsigned long long)stream);
}

void slot_store_copy_large(chorus_conn_t *conn, void *dst, const void *src, size_t bytes) {
    slot_store_t *st = &conn->store;
    int mode = st->mode;
    const uint32_t k = ++st->chunks;
    if (st->forced || st->op_mode >= 0) {
        /* Forced, or the running op chose (store_choice.c): no probes, no samples. */
        mode = slot_store_mode(st);
        st->streamed += mode == SLOT_STORE_STREAM;
        slot_store_write(mode, dst, src, bytes);
        return;
    }
    size_t head = 0;
    uint64_t t0 = slot_store_ticks();
    if (mode == SLOT_STORE_PLAIN) {
        /* The probe: a whole chunk, since a short burst of streaming stores finishes before it
         * meets memory's pace and would look faster than streaming is. */
        if (k % SLOT_STORE_STREAM_PROBE_EVERY == 0 ||
            (k == SLOT_STORE_FIRST_PROBE && st->est[SLOT_STORE_STREAM] == 0))
            mode = SLOT_STORE_STREAM;
    } else if (k % SLOT_STORE_PLAIN_PROBE_EVERY == 0) {
        /* The probe: plain stores pay their cost line by line from the first one, so a part of
         * the chunk measures them. */
        head = CHORUS_MIN(SLOT_STORE_PLAIN_PROBE_BYTES, bytes / 2);
        rk_copy(dst, src, head);
        uint64_t t1 = slot_store_ticks();
        slot_store_sample(conn, st, SLOT_STORE_PLAIN, t1 - t0, head);
        t0 = t1;
    }
    st->streamed += mode == SLOT_STORE_STREAM;
    slot_store_write(mode, (char *)dst + head, (const char *)src + head, bytes - head);
    slot_store_sample(conn, st, mode, slot_store_ticks() - t0, bytes - head);
}

void slot_store_feed(chorus_conn_t *conn, int mode, uint64_t ticks, size_t bytes) {
    if (bytes > 0) slot_store_sample(conn, &conn->store, mode != 0, ticks, bytes);
}

void slot_store_fini(slot_store_t *st) {
    atomic_fetch_add_explicit(&slot_store_stat.chunks, st->chunks, memory_order_relaxed);
    atomic_fetch_add_explicit(&slot_store_stat.streamed, st->streamed, memory_order_relaxed);
    st->chunks = st->streamed = 0;
}

void slot_store_stats(uint64_t *chunks_p, uint64_t *streamed_p) {
    *chunks_p = atomic_load_explicit(&slot_store_stat.chunks, memory_order_relaxed);
    *streamed_p = atomic_load_explicit(&slot_store_stat.streamed, memory_order_relaxed);
}
