/*
 * bootstrap_fake.h: N fake ranks against a real bootstrap root, driven by one epoll loop in the
 * calling thread. Each fake rank listens, connects to the root, sends a real rendezvous hello,
 * reads the root's answer; the first fake rank of each root's range then accepts that root's
 * connection and reads its part of the address table (checked). Several roots: as
 * bootstrap_init_multi. Used by perf/bootstrap_scale and tests/bootstrap.
 */
#ifndef CHORUS_BOOTSTRAP_FAKE_H_
#define CHORUS_BOOTSTRAP_FAKE_H_

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "bootstrap.h"

typedef struct {
    double fanout_ms;  /* last hello written -> every root's first rank had its part */
    double total_ms;   /* first connect -> last fake rank done */
    double root_bytes; /* everything the root sent */
    char error[160];       /* why it failed, when it did */
} bs_fake_result_t;

/* Descriptors the driver needs for nranks fake ranks (beyond what the process holds). */
int bs_fake_fds_needed(int nranks);
/* Run one rendezvous of nranks fake ranks against the root of *id. 0, or -1 with res->error. */
int bs_fake_run(const chorus_unique_id_t *id, int nranks, bs_fake_result_t *res);
/* The same against the roots of nids ids, split as bootstrap_init_multi splits ranks. */
int bs_fake_run_multi(const chorus_unique_id_t *ids, int nids, int nranks, bs_fake_result_t *res);

#ifdef __cplusplus
}
#endif

#endif
