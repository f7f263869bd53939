/*
 * comm_impl.h: private to src/api. How the lifecycle files (init.c, split.c, destroy.c) share
 * the communicator's construction and teardown.
 *
 * A communicator is allocated and registered first (so the handle is valid at once, as a
 * nonblocking init needs), then comm_init_run performs the collective part: bootstrap, locality
 * allgather, topology, optional eager connect, collective engine. comm_init_launch chooses where
 * that runs: in the caller (blocking), on a thread (config.blocking = 0), or as a group job when
 * called between ncclGroupStart and ncclGroupEnd.
 */
#ifndef CHORUS_COMM_IMPL_H_
#define CHORUS_COMM_IMPL_H_

#include "bootstrap.h"
#include "comm.h"

/* Allocate and register a communicator in the "init in progress" state. *cfg is already
 * resolved (comm_config_parse). */
ncclResult_t comm_alloc(int rank, int nranks, int cuda_dev, const ncclConfig_t *cfg,
                        struct ncclComm **comm_p);
/* Release everything the comm holds and free it. Never blocks on peers. */
void comm_free(struct ncclComm *comm);

/* Make the comm: bootstrap through id, exchange locality, topology, connect, engine. */
ncclResult_t comm_init_run(struct ncclComm *comm, const ncclUniqueId *id);

/* Run comm_init_run for a freshly allocated comm, blocking, nonblocking or deferred to the
 * group. On return *comm_p is the handle to give the user (NULL when a blocking init failed; the
 * comm was then freed). Returns ncclSuccess, ncclInProgress (nonblocking) or the error. */
ncclResult_t comm_init_launch(struct ncclComm *comm, const ncclUniqueId *id, const char *api,
                              ncclComm_t *comm_p);

/* Join a nonblocking init thread if one runs (after abort flags were set when aborting). */
void comm_join_init(struct ncclComm *comm);

/* Registry of live handles: comm_check looks a pointer up here before touching it. */
void comm_registry_add(struct ncclComm *comm);
void comm_registry_remove(struct ncclComm *comm);

/* FNV-1a, for the comm id hash printed at init. */
uint64_t comm_hash_bytes(const void *data, size_t len);

/* Bootstrap tags used by the core (the transports use others; see init.c). */
#define CORE_TAG_SPLIT 0x53500000 /* + split sequence number (low 16 bits) */

#endif
