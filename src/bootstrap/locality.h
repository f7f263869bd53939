/*
 * locality.h: what each rank tells the others about where it runs.
 *
 * One record per rank goes round in a single bootstrap allgather at init. Transports decide
 * can_connect from two records, topology builds rings from all of them.
 */
#ifndef CHORUS_LOCALITY_H_
#define CHORUS_LOCALITY_H_

#include <stdint.h>
#include "bootstrap.h"
#include "proc_state.h"

#define CHORUS_MAX_NICS 4

typedef struct {
    char name[16];       /* interface or device name, e.g. eth0, mlx5_0 */
    int kind;            /* 0 socket, 1 verbs */
    int speed_mbps;      /* from sysfs, 0 when unknown */
    char pci_bus_id[16]; /* empty when virtual */
} chorus_nic_t;

/* What the verbs transport (src/transport/ib) can use on this rank: filled by ib_fill_locality,
 * compared by its can_connect on both ends of a pair. */
typedef struct {
    uint8_t usable;     /* 1: an active RDMA port passed NCCL_IB_HCA and NCCL_IB_DISABLE */
    uint8_t link_layer; /* IBV_LINK_LAYER_INFINIBAND (1) or _ETHERNET (2) of the first such port */
    uint8_t gid_type;   /* 0 IB, 1 RoCE v1, 2 RoCE v2; 255 unknown */
    uint8_t ndevs;      /* usable ports */
    uint16_t lid;
    uint8_t gid[16];
    char dev[16]; /* device name of the first usable port */
} chorus_verbs_loc_t;

typedef struct {
    int rank;
    char hostname[64];
    uint64_t host_hash; /* hash of hostname + boot id + shm namespace: equal means "same host" */
    uint64_t shm_ns;    /* identity of /dev/shm (device and inode) */
    int pid;
    int pid_ns_ok;      /* 1 when the pid is meaningful to same-host peers (same pid namespace) */
    uint64_t pid_ns;    /* pid namespace inode */
    int numa_node;      /* of the CPU binding; -1 unknown */
    int package;        /* socket; -1 unknown */
    int pci_switch;     /* id of the PCI switch above the rank's GPU (or nearest NIC); -1 none */
    int near_nic;       /* index into nics[] of the NIC nearest this rank; -1 none */
    int cuda_dev;       /* -1 when the rank uses no GPU */
    char gpu_bus_id[16];
    int nnics;
    chorus_nic_t nics[CHORUS_MAX_NICS];
    uint32_t transports; /* bit per registry entry this rank can use */
    chorus_verbs_loc_t verbs;
    uint32_t l2_bytes;   /* smallest L2 cache among the rank's CPUs (hwloc); 0 unknown */
    chorus_sockaddr_t net_addr; /* address peers use for TCP data connections (IP, port 0) */
    char net_ifname[16];
} chorus_locality_t;

static inline int locality_same_host(const chorus_locality_t *a, const chorus_locality_t *b) {
    return a->host_hash == b->host_hash;
}

/* A rank of peers[0..nranks) (not me, not in this process) that runs on this host, in this pid
 * namespace, and is stopped (SIGSTOP, job control, a debugger), else the one such rank that has
 * exited, else -1; *state gets CHORUS_PROC_STOPPED or CHORUS_PROC_GONE. A stopped rank is alive
 * to every liveness probe yet moves nothing, and a rank that died is seen first by its neighbours
 * only: the ranks that time out or fail to connect name it rather than the neighbour they waited
 * on. Of several exited ranks none is named: ranks exit after the errors a failure caused, and
 * /proc cannot tell which went first. Reads /proc once per same-host peer: for error paths. */
static inline int locality_find_failed(const chorus_locality_t *peers, int nranks, int me,
                                       int *state) {
    const chorus_locality_t *self = &peers[me];
    if (!self->pid_ns_ok) return -1;
    int gone = -1, ngone = 0;
    for (int q = 0; q < nranks; q++) {
        const chorus_locality_t *p = &peers[q];
        if (q == me || p->pid == self->pid || !locality_same_host(self, p) || !p->pid_ns_ok ||
            p->pid_ns != self->pid_ns)
            continue;
        const int st = chorus_proc_state(p->pid);
        if (st == CHORUS_PROC_STOPPED) {
            *state = st;
            return q;
        }
        if (st == CHORUS_PROC_GONE && ngone++ == 0) gone = q;
    }
    if (ngone != 1) return -1;
    *state = CHORUS_PROC_GONE;
    return gone;
}

/* "is stopped (...)" or "has exited", for locality_find_failed's state. */
static inline const char *locality_failed_text(int state) {
    return state == CHORUS_PROC_STOPPED ? "is stopped (SIGSTOP, job control or a debugger)"
                                        : "has exited";
}

#endif
