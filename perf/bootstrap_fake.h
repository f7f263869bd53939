/*
 * bootstrap_fake.h: N fake ranks against a real bootstrap root, driven by one epoll loop in the
 * calling thread. Each fake rank listens, connects to the root, sends a real rendezvous hello,
 * reads the root's answer; fake rank 0 then accepts the root's connection and reads the address
 * table (checked). Used by perf/bootstrap_scale and tests/bootstrap.
 */
#ifndef CHORUS_BOOTSTRAP_FAKE_H_
#define CHORUS_BOOTSTRAP_FAKE_H_

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "bootstrap.h"

typedef struct {
    double fanout_ms;  /* last hello written -> fake rank 0 had the whole table */
    double total_ms;   /* first connect -> last fake rank done */
    double root_bytes; /* everything the root sent */
    char error[160];       /* why it failed, when it did */
} bs_fake_result_t;

/* Descriptors the driver needs for nranks fake ranks (beyond what the process holds). */
int bs_fake_fds_needed(int nranks);
/* Run one rendezvous of nranks fake ranks against the root of *id. 0, or -1 with res->error. */
int bs_fake_run(const chorus_unique_id_t *id, int nranks, bs_fake_result_t *res);

#ifdef __cplusplus
}
#endif

#endif
