/*
 * slot_store.h: how a sender writes large chunks into a connection's slots (slot_store.c): the
 * sender-side measurement of plain against streaming stores. A transport whose slots another core
 * reads sets it up at connect (slot_store_init, shm) and folds its counts in at close
 * (slot_store_fini); the primitives of src/collectives write their chunks through
 * slot_store_copy. The per-connection state, slot_store_t, is a field of chorus_conn_t
 * (transport.h).
 */
#ifndef CHORUS_SLOT_STORE_H_
#define CHORUS_SLOT_STORE_H_

#include <stddef.h>
#include <stdint.h>

#include "host_copy.h"
#include "transport.h"

/* Chunks smaller than this are always written with plain stores. */
#define SLOT_STORE_MIN_BYTES ((size_t)32768)

enum { SLOT_STORE_PLAIN = 0, SLOT_STORE_STREAM = 1 };

/* At connect, sender side: ok says whether the slots qualify. */
void slot_store_init(slot_store_t *st, int ok);
void slot_store_copy_large(chorus_conn_t *conn, void *dst, const void *src, size_t bytes);
/* Copy bytes from src into the slot at dst: plain stores for small chunks and on connections
 * whose slots do not qualify, else as slot_store.c measured faster. */
static inline void slot_store_copy(chorus_conn_t *conn, void *dst, const void *src, size_t bytes) {
    if (__builtin_expect(!conn->store.ok || bytes < SLOT_STORE_MIN_BYTES, 1))
        rk_copy(dst, src, bytes);
    else
        slot_store_copy_large(conn, dst, src, bytes);
}
/* The mode large chunks are written in now: the running op's choice, else the connection's. */
static inline int slot_store_mode(const slot_store_t *st) {
    return st->op_mode >= 0 ? st->op_mode : st->mode;
}
/* Whether a chunk of `bytes` that a kernel writes into the slot (a reduce) should stream. */
static inline int slot_store_streams(const chorus_conn_t *conn, size_t bytes) {
    return bytes >= SLOT_STORE_MIN_BYTES && conn->store.ok &&
           slot_store_mode(&conn->store) == SLOT_STORE_STREAM;
}
/* One timed copy of `bytes` in `mode` that took `ticks`, as slot_store_copy records it (tests). */
void slot_store_feed(chorus_conn_t *conn, int mode, uint64_t ticks, size_t bytes);
/* At close: add the connection's counts to the totals below. */
void slot_store_fini(slot_store_t *st);
/* Totals over every closed connection so far (tests): large chunks, and those written
 * streaming. */
void slot_store_stats(uint64_t *chunks_p, uint64_t *streamed_p);

#endif
