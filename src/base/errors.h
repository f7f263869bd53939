/*
 * errors.h: the text of each result code, and the sticky "first error wins" slot.
 *
 * Every layer names failures with chorus_result_text (ncclGetErrorString returns the same text).
 * A communicator's asynchronous error is one such slot: whoever finds a failure while running an
 * op (the engine, a worker) records it with chorus_error_keep_first, and later failures leave the
 * first one in place.
 */
#ifndef CHORUS_ERRORS_H_
#define CHORUS_ERRORS_H_

#include "nccl.h"

/* A sentence for the user; never NULL (unknown codes have a text too). */
const char *chorus_result_text(ncclResult_t result);

/* Store res in *slot unless the slot already holds an error; success and ncclInProgress are not
 * errors and are ignored. */
static inline void chorus_error_keep_first(volatile int *slot, ncclResult_t res) {
    if (res == ncclSuccess || res == ncclInProgress) return;
    int expected = ncclSuccess;
    __atomic_compare_exchange_n(slot, &expected, (int)res, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

#endif
