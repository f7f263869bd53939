/*
 * group.h: ncclGroupStart/End (group.c).
 *
 * Groups nest per thread. Inside a group, collectives are queued and run at the outermost
 * ncclGroupEnd; communicator creation calls (ncclCommInitRank*, Split) inside a group are deferred
 * too and run concurrently (one thread each) at ncclGroupEnd, so one thread can create several
 * communicators, as NCCL allows.
 */
#ifndef CHORUS_GROUP_H_
#define CHORUS_GROUP_H_

#include "coll_api.h"
#include "coll_engine.h"
#include "nccl.h"

/* This thread's nesting depth; 0 outside a group. */
int group_depth(void);
/* Queue a job for the outermost ncclGroupEnd of this thread. fn runs on its own thread; its result
 * is folded into ncclGroupEnd's return. free_arg (may be NULL) releases arg afterwards. */
ncclResult_t group_add_job(ncclResult_t (*fn)(void *arg), void *arg, void (*free_arg)(void *arg));
/* Queue an op for the outermost ncclGroupEnd. */
ncclResult_t group_add_op(coll_op_t *op);
/* Whether op is queued in this thread's open group (not issued before the outermost End). */
int group_holds_op(const coll_op_t *op);
/* Record the error of a call made inside a group: ncclGroupEnd returns the first one. */
void group_note_error(ncclResult_t res);

/* A thread's device-buffer calls kept between ncclGroupStart and the outermost ncclGroupEnd (the
 * device paths keep their own list each, per thread). */
typedef struct {
    coll_args_t *args;
    int n, cap;
} group_kept_t;
/* Appends a copy of *a (the list grows as needed) and notes the result in the group:
 * ncclSystemError when out of memory. */
ncclResult_t group_keep(group_kept_t *k, const coll_args_t *a);

#endif
