/*
 * ib.h: private header of the RDMA-verbs transport (ib_transport_ops).
 *
 * libibverbs is never linked: ib_loader.c opens it with dlopen at first use and takes every
 * function it calls through dlsym, so a machine without it runs everything else (and can_connect
 * says no). The data-path calls ibv_post_send, ibv_post_recv and ibv_poll_cq are inline functions
 * of <infiniband/verbs.h> that jump through the device context's own table, so they need no
 * symbol. Files:
 *   ib_loader.c   dlopen/dlsym of libibverbs
 *   ib_device.c   device enumeration (NCCL_IB_HCA filter, active ports, GID choice), opened once
 *                 per process; this rank's verbs record in the locality record; one thread per
 *                 device context that reads its async events (port error, device fatal)
 *   ib_conn.c     the ops table; can_connect, setup, connect and close: RC queue pairs per
 *                 connection, the setup blob, geometry and queue pair count agreed by both ends
 *   ib_data.c     the data path: RDMA write with immediate, credits, keepalive, direct chunks
 *                 read by the receiver from the sender's registered buffer
 *   ib_mr.c       the registration cache of user buffers (ncclCommRegister) for direct chunks
 *
 * Data path (NCCL_IB_QPS_PER_CONNECTION = q RC queue pairs per connection, one completion queue).
 * The receiver's slots are registered for remote write and their address and rkey go to the
 * sender in the setup blob; the sender registers its slots and an 8-byte credit word that the
 * receiver may write. Step s goes from the sender's slot s % nslots into the receiver's slot
 * s % nslots as RDMA WRITE WITH IMMEDIATE, the immediate carrying the step's byte count; the
 * receiver keeps nslots receive requests posted on every queue pair. NCCL_IB_SPLIT_DATA_ON_QPS
 * picks how the steps use the queue pairs (both ends must ask for split, else round-robin):
 *   round-robin (0)  step s is one write on queue pair s % q. An RC queue pair completes in
 *                    order, so the j-th arrival on queue pair k is step j * q + k.
 *   split (1)        step s is q writes, one per queue pair: queue pair k carries part k of the
 *                    step (ib_split_part: 128-byte multiples, the last part shorter, parts past
 *                    the end empty), so the j-th arrival on every queue pair is step j, and the
 *                    step is there once all q parts are (a count per slot).
 * A step is ready once every earlier one arrived (a flag per slot). After recv_release the
 * receiver RDMA-writes its released count into the sender's credit word, always on queue pair 0
 * (so a later count never lands before an earlier one): the sender may run at most nslots steps
 * ahead of it, and reuses its own slot once the step's writes completed, and those of every
 * earlier step.
 */
#ifndef CHORUS_TRANSPORT_IB_H_
#define CHORUS_TRANSPORT_IB_H_

#include <infiniband/verbs.h>
#include <stdint.h>

#include "nccl.h"
#include "transport.h"

#define IB_MAX_DEVS 16

typedef struct {
    struct ibv_device **(*get_device_list)(int *num_devices);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *device);
    struct ibv_context *(*open_device)(struct ibv_device *device);
    int (*close_device)(struct ibv_context *context);
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    const char *(*wc_status_str)(enum ibv_wc_status status);
    /* optional (NULL when the library lacks them) */
    int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
    void (*ack_async_event)(struct ibv_async_event *event);
    int (*query_gid_ex)(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                        struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
} ib_symbols_t;

/* Most queue pairs per connection (PARAM_RANGE of NCCL_IB_QPS_PER_CONNECTION): the setup blob
 * carries every queue pair number in TRANSPORT_BLOB_BYTES. */
#define IB_MAX_QPS 32

/* The setup blob each end publishes (ib_conn.c). Every queue pair starts at the same PSN. */
#define IB_BLOB_MAGIC 0x49424c42u /* "IBLB" */
typedef struct {
    uint32_t magic;
    uint32_t is_send;
    uint32_t nqps, psn;
    uint32_t qpn[IB_MAX_QPS];
    uint16_t lid;
    uint8_t link_layer, mtu;
    uint8_t split; /* asks for split steps (NCCL_IB_SPLIT_DATA_ON_QPS) */
    uint8_t pad[3];
    union ibv_gid gid;
    uint64_t addr; /* receiver: slots; sender: credit word */
    uint32_t rkey;
    uint32_t nslots;
    uint64_t slot_bytes;
} ib_blob_t;

/* A direct chunk's slot holds this descriptor instead of the data (ib_data.c): the sender's
 * registered buffer, which the receiver reads with one RDMA READ straight into its own. The
 * write that carries it has IB_IMM_DIRECT set in its immediate. */
#define IB_DIRECT_MAGIC 0x49424443u /* "IBDC" */
#define IB_IMM_DIRECT 0x80000000u
typedef struct {
    uint32_t magic;
    uint32_t rkey;
    uint64_t addr;
    uint64_t bytes;
} ib_direct_desc_t;

typedef struct {
    char name[64];
    int port;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_port_attr port_attr;
    int link_layer; /* IBV_LINK_LAYER_INFINIBAND or IBV_LINK_LAYER_ETHERNET */
    int gid_index;
    int gid_type; /* IBV_GID_TYPE_IB, _ROCE_V1 or _ROCE_V2; -1 unknown */
    union ibv_gid gid;
    int max_qp_wr;
    int fatal; /* async event that made the port unusable (IBV_EVENT_*), 0 none; atomic */
} ib_device_t;

/* ib_loader.c: NULL when libibverbs cannot be loaded (logged once at INFO). */
const ib_symbols_t *ib_symbols(void);

/* ib_device.c: usable devices (active port, matching NCCL_IB_HCA), opened on first call in each
 * process (a forked child scans again: contexts do not cross fork). */
int ib_device_count(void);
ib_device_t *ib_device_get(int index);
/* What made the device's port unusable (an async event's name), or NULL while it is fine. */
const char *ib_device_fatal(const ib_device_t *d);
/* Index of the device a connection on `channel` uses (see ib_device.c), -1 without devices. */
int ib_pick_device(const chorus_locality_t *self, int channel);
/* The GID index of a RoCE port chosen as NCCL does (NCCL_IB_GID_INDEX, NCCL_IB_ROCE_VERSION_NUM,
 * NCCL_IB_ADDR_FAMILY); sets d->gid and d->gid_type. */
int ib_choose_gid(const ib_symbols_t *ibv, ib_device_t *d);
/* NCCL_IB_HCA syntax: "[^][=]name[:port],..." -> whether (name, port) is selected. */
int ib_hca_match(const char *filter, const char *name, int port);

/* ib_mr.c: ranges registered by ncclCommRegister and their memory regions (one per protection
 * domain, made at first use). */
typedef struct ib_reg ib_reg_t;
typedef struct {
    uint64_t hits;          /* direct chunks that found their range's memory region */
    uint64_t regs;          /* ibv_reg_mr calls for user ranges (first use per domain) */
    uint64_t deregs;        /* ibv_dereg_mr calls for user ranges */
    uint64_t reg_failures;  /* of regs: failed (those ranges go through the slots) */
    uint64_t unregistered;  /* direct chunks outside every registered range (through the slots) */
    uint64_t temp_regs;     /* chunks larger than a slot outside them, registered for one use */
    uint64_t zcopy_chunks;  /* chunk ends (sender or receiver) done without a copy */
    uint64_t zcopy_bytes;
} ib_mr_stats_t;
/* This rank's verbs record for its locality record (transport_fill_locality). */
void ib_fill_locality(chorus_verbs_loc_t *v);
ncclResult_t ib_mr_register(void *base, size_t size);
/* ncclInvalidUsage (with a WARN) while a direct chunk in flight uses the range. */
ncclResult_t ib_mr_deregister(void *base, size_t size);
/* The memory region covering [ptr, ptr + len) on pd: *mr_p NULL when the range is not registered
 * or cannot be (use the slots); ncclInvalidUsage when it was registered and then freed. A region
 * handed out counts as in flight until ib_mr_release. */
ncclResult_t ib_mr_acquire(struct ibv_pd *pd, const void *ptr, size_t len, struct ibv_mr **mr_p,
                           ib_reg_t **reg_p);
/* A registration of [ptr, ptr + len) for one chunk (*mr_p NULL when ibv_reg_mr fails); released
 * (and deregistered) by ib_mr_release. */
ncclResult_t ib_mr_acquire_temp(struct ibv_pd *pd, const void *ptr, size_t len,
                                struct ibv_mr **mr_p, ib_reg_t **reg_p);
void ib_mr_release(ib_reg_t *reg, size_t zcopy_bytes);
void ib_mr_stats(ib_mr_stats_t *s);

/* A connection's state (ib_conn.c sets it up, ib_data.c moves the data). */
#define IB_WR_DATA 1 /* wr_id: the kind in the low byte, the queue pair's index above it */
#define IB_WR_CREDIT 2
#define IB_WR_READ 3
#define IB_WR_PING 4
#define IB_WR_ID(kind, k) ((uint64_t)(kind) | ((uint64_t)(k) << 8))
#define IB_MAX_CREDIT_WRITES 4
typedef struct {
    ib_device_t *dev;
    struct ibv_cq *cq;
    struct ibv_qp *qp[IB_MAX_QPS];
    int nqps;       /* created; after connect: in use (the smaller count of the two ends) */
    int split;      /* setup: asked for; after connect: each step is split over the queue pairs */
    uint64_t *qp_done; /* per queue pair: completed data writes (sender) or arrivals (receiver) */
    uint8_t *ready; /* per slot: its step completed (sender) or arrived (receiver) */
    uint8_t *parts; /* per slot, split: the step's writes that completed or arrived so far */
    char *slots;
    struct ibv_mr *slots_mr;
    uint64_t *word; /* sender: credit word (remote-written); receiver: released value to send */
    struct ibv_mr *word_mr;
    uint32_t psn;
    uint64_t remote_addr;
    uint32_t remote_rkey;
    int nslots;
    size_t slot_bytes;
    int sq_room; /* steps in flight at once (the data writes one send queue holds) */
    /* sender */
    uint64_t head, sent;
    /* receiver */
    uint64_t arrived, released, credit_posted;
    uint64_t credit_ns; /* when the last credit write went */
    int credit_writes; /* outstanding */
    uint32_t *rsize; /* per slot: bytes of the step (receiver), of the direct chunk (sender) */
    /* direct chunks */
    ib_reg_t **dref;      /* sender: per slot, the registration its direct chunk in flight uses */
    uint64_t dacked;      /* sender: steps below this released their registrations */
    uint64_t last_direct; /* sender: 1 + the last direct step (0: none) */
    uint8_t *rdirect;     /* receiver: per slot, the step is a direct chunk's descriptor */
    int reading;          /* receiver: RDMA READs outstanding (split: one per part) */
    int pings;            /* sender: keepalive writes outstanding (0 or 1) */
    uint64_t ping_ns;     /* sender: when it began waiting, or pinged last (0: not waiting) */
    int error;
} ib_conn_t;

/* Part k of a split step of len bytes over q queue pairs: bytes [*off_p, *off_p + *len_p). Parts
 * are ceil(len / q) rounded up to 128 bytes; the last non-empty one is shorter, later ones are
 * empty (offset len, length 0). */
void ib_split_part(size_t len, int q, int k, size_t *off_p, size_t *len_p);

/* ib_data.c: the data-path operations of ib_transport_ops, and one receive request on queue pair
 * k (connect posts nslots of them on each). */
ncclResult_t ib_post_recv(chorus_conn_t *conn, ib_conn_t *ic, int k);
ncclResult_t ib_send_acquire(chorus_conn_t *conn, size_t bytes, void **slot_p, int *ready_p);
ncclResult_t ib_send_commit(chorus_conn_t *conn, size_t bytes);
ncclResult_t ib_send_commit_direct(chorus_conn_t *conn, const void *src, size_t bytes);
ncclResult_t ib_send_drained(chorus_conn_t *conn, int *done_p);
ncclResult_t ib_recv_peek(chorus_conn_t *conn, const void **data_p, size_t *bytes_p, int *ready_p);
ncclResult_t ib_recv_copy(chorus_conn_t *conn, void *dst, size_t bytes);
ncclResult_t ib_recv_release(chorus_conn_t *conn);
ncclResult_t ib_progress(chorus_conn_t *conn);

extern const chorus_transport_ops_t ib_transport_ops;

#endif
