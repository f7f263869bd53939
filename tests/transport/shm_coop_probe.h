// shm_coop_probe.h: C entry points into the shared-memory transport's cooperative single copy,
// for test_shm_coop.cc. The transport's private header uses C11 atomics, which C++ cannot
// include, so shm_coop_probe.c (C) holds everything that touches shm_conn_t and the control area.
//
// A "pair" is both ends of one connection inside this process without any rank or segment: a
// control area in ordinary memory, a receiver and a sender shm_conn_t pointing at it. One thread
// can then drive the protocol step by step (open, claim some blocks on either end, finish) and
// make the sender fail in chosen ways.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "nccl.h" // outside extern "C": it may pull in the CUDA headers, which hold C++ templates

#ifdef __cplusplus
extern "C" {
#endif

#include "transport.h"

typedef struct shm_coop_pair shm_coop_pair_t;

// cma values: 2 = process_vm_readv/writev (peer_pid is used), 3 = same process (plain copies).
shm_coop_pair_t *shm_coop_pair_new(size_t block, int recv_cma, int recv_peer_pid, int send_cma,
                                   int send_peer_pid);
void shm_coop_pair_free(shm_coop_pair_t *p);
// Receiver liveness for the wait: with pid_ok the receiver judges the sender by kill(pid, 0).
void shm_coop_pair_set_liveness(shm_coop_pair_t *p, int peer_pid, int pid_ok);
// Whether a direct chunk of `bytes` would be copied cooperatively.
int shm_coop_pair_wanted(shm_coop_pair_t *p, size_t bytes);
// The protocol steps; ncclResult_t values. open returns the number of blocks.
uint32_t shm_coop_pair_open(shm_coop_pair_t *p, void *dst, const void *src, size_t bytes);
int shm_coop_pair_work(shm_coop_pair_t *p, uint32_t max_blocks);
int shm_coop_pair_help(shm_coop_pair_t *p, uint32_t max_blocks);
int shm_coop_pair_finish(shm_coop_pair_t *p);
int shm_coop_pair_read(shm_coop_pair_t *p, void *dst, const void *src, size_t bytes);
// Claim the next block as the sender would, without copying or reporting it: a sender that
// stops in the middle of a block. Returns the block index, or -1 when none was left.
long shm_coop_pair_claim_only(shm_coop_pair_t *p);
uint64_t shm_coop_pair_sender_blocks(shm_coop_pair_t *p);   // blocks the sender copied
uint64_t shm_coop_pair_receiver_blocks(shm_coop_pair_t *p); // blocks the receiver copied
int shm_coop_pair_sender_helps(shm_coop_pair_t *p);         // still helping (no write failed)

// On a real shm connection (conn->ops is the shm transport's).
int shm_probe_coop_busy(const chorus_conn_t *conn);            // sender: inside a block copy
int shm_probe_coop_helps(const chorus_conn_t *conn);           // sender: helps on this connection
uint64_t shm_probe_sender_blocks(const chorus_conn_t *conn);   // sender: blocks it copied
uint64_t shm_probe_receiver_blocks(const chorus_conn_t *conn); // receiver: its cooperative blocks
// Receiver: a request is open and the sender has finished at least one block of it.
int shm_probe_helped_in_open_request(const chorus_conn_t *conn);

#ifdef __cplusplus
}
#endif
