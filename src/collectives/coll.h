/*
 * coll.h: what the communicator's lifecycle (src/api) needs from the collective engine.
 *
 * The engine owns the per-communicator queue of nonblocking ops and the optional progress thread.
 * The API layer builds the channels and creates the engine after the locality allgather, and
 * destroys the engine before the transports close.
 */
#ifndef CHORUS_COLL_H_
#define CHORUS_COLL_H_

#include <stdint.h>

#include "nccl.h"

struct ncclComm;

/* The channels (each one's ring, place and neighbours, channels.c) and the transport of the edge
 * to each peer, from the topology's rings; needs the locality records and the transport context.
 * coll_channels_free frees what it allocated, also after a failure. */
ncclResult_t coll_channels_build(struct ncclComm *comm);
void coll_channels_free(struct ncclComm *comm);

/* Connect every channel's ring connections not connected yet (send to next, receive from prev):
 * the first collective that needs them, or init with CHORUS_CONNECT=eager (coll_connect.c).
 * After a failed setup the rest still tell their peers; the first error is returned. */
ncclResult_t coll_connect_rings(struct ncclComm *comm);

ncclResult_t coll_engine_create(struct ncclComm *comm);
/* Complete (finalize=1) or drop (abort) outstanding ops, join the progress thread, free. */
ncclResult_t coll_engine_finalize(struct ncclComm *comm);
void coll_engine_destroy(struct ncclComm *comm);

/* A setup tag base + a * nranks + b, folded to an int without signed overflow (past about 28,000
 * ranks the sum leaves int's range). Setup messages travel between the two ranks of a connection
 * only, and transport_connect hashes the tag with the channel and role, so a fold that maps two
 * different pairs to one tag cannot mix their messages. */
static inline int coll_setup_tag(uint32_t base, int a, int nranks, int b) {
    return (int)(base + (uint32_t)a * (uint32_t)nranks + (uint32_t)b);
}

#endif
