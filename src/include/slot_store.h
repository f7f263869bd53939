/*
 * slot_store.h: how a sender writes large chunks into a connection's slots (slot_store.c).
 */
#ifndef CHORUS_SLOT_STORE_H_
#define CHORUS_SLOT_STORE_H_

#include <stddef.h>
#include <stdint.h>

/* Chunks smaller than this are always written with plain stores. */
#define SLOT_STORE_MIN_BYTES ((size_t)32768)

enum { SLOT_STORE_PLAIN = 0, SLOT_STORE_STREAM = 1 };

/* Per send connection. Zeroed with the connection; the transport sets `ok` at connect when its
 * slots are host memory another core reads (shm). The rest is slot_store.c's. */
typedef struct {
    uint8_t ok;
    uint8_t mode;   /* SLOT_STORE_*: how large chunks are written now */
    uint8_t forced; /* CHORUS_SHM_SLOT_STREAM was 0 or 1 when the connection was made */
    uint8_t pad;
    uint32_t chunks; /* large chunks written */
    uint32_t changes;
    uint32_t samples[2];
    uint64_t best[2]; /* per mode: fewest ticks per KiB in the current window of samples */
    uint64_t est[2];  /* per mode: the last full window's best (0: none yet) */
} slot_store_t;

struct chorus_conn;
/* At connect, sender side: ok says whether the slots qualify. */
void slot_store_init(slot_store_t *st, int ok);
/* Copy bytes from src into the slot at dst, plainly or with streaming stores (see slot_store.c). */
void slot_store_copy(struct chorus_conn *conn, void *dst, const void *src, size_t bytes);
/* Whether a chunk of `bytes` that a kernel writes into the slot (a reduce) should stream. */
static inline int slot_store_streams(const slot_store_t *st, size_t bytes) {
    return st->mode == SLOT_STORE_STREAM && bytes >= SLOT_STORE_MIN_BYTES;
}
/* One timed copy of `bytes` in `mode` that took `ticks`, as slot_store_copy records it (tests). */
void slot_store_feed(struct chorus_conn *conn, int mode, uint64_t ticks, size_t bytes);
/* Totals over every connection so far (tests and INFO): large chunks, streamed ones, changes. */
void slot_store_stats(uint64_t *chunks_p, uint64_t *streamed_p, uint64_t *changes_p);

#endif
