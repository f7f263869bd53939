/*
 * coll.h: what the communicator's lifecycle (src/api) needs from the collective engine.
 *
 * The engine owns the per-communicator queue of nonblocking ops and the optional progress thread.
 * The API layer creates it after topology and destroys it before the transports close.
 */
#ifndef CHORUS_COLL_H_
#define CHORUS_COLL_H_

#include "nccl.h"

struct ncclComm;

ncclResult_t coll_engine_create(struct ncclComm *comm);
/* Complete (finalize=1) or drop (abort) outstanding ops, join the progress thread, free. */
ncclResult_t coll_engine_finalize(struct ncclComm *comm);
void coll_engine_destroy(struct ncclComm *comm);

#endif
