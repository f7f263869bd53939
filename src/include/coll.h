/*
 * coll.h: what the core needs from the collective engine (src/collectives).
 *
 * The engine owns the per-communicator queue of nonblocking ops and the optional progress thread.
 * The core creates it after topology and destroys it before the transports close.
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

/* Groups (src/core/group.c, owned by the collective engine).
 * ncclGroupStart/End nest per thread. Inside a group, collectives are queued and run at the
 * outermost ncclGroupEnd; communicator creation calls (ncclCommInitRank*, Split) inside a group are
 * deferred too and run concurrently (one thread each) at ncclGroupEnd, so one thread can create
 * several communicators, as NCCL allows. */
int group_depth(void); /* this thread's nesting depth; 0 outside a group */
/* Queue a job for the outermost ncclGroupEnd of this thread. fn runs on its own thread; its result
 * is folded into ncclGroupEnd's return. free_arg (may be NULL) releases arg afterwards. */
ncclResult_t group_add_job(ncclResult_t (*fn)(void *arg), void *arg, void (*free_arg)(void *arg));
