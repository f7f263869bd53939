/*
 * detect.c: this rank's locality record, and where CPUs and PCI devices sit in a topology.
 *
 * Host identity is hostname + boot id + the identity of /dev/shm, never the hostname alone: two
 * containers on one machine that do not share /dev/shm must not be treated as one host.
 * The NUMA node and package come from the CPU binding of the calling thread (unknown, -1, when it
 * spans several); the PCI switch is the topmost PCI-to-PCI bridge above the rank's GPU (or above its
 * nearest NIC); NICs are hwloc's network and OpenFabrics OS devices, with the link speed from sysfs.
 * The machine's topology is loaded once per process and kept (hwloc loads take milliseconds).
 */
#include <ifaddrs.h>
#include <net/if.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "check.h"
#include "param.h"
#include "topo_internal.h"

static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Index of the single object of `type` whose cpuset intersects cpus, or -1. */
static int single_intersecting(hwloc_topology_t topo, hwloc_obj_type_t type,
                               hwloc_const_cpuset_t cpus) {
    int n = hwloc_get_nbobjs_by_type(topo, type);
    if (n == 1) return 0;
    if (cpus == NULL || hwloc_bitmap_iszero(cpus)) return -1;
    int found = -1;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(topo, type, i);
        if (o->cpuset && hwloc_bitmap_intersects(o->cpuset, cpus)) {
            if (found >= 0) return -1; /* spans several */
            found = i;
        }
    }
    return found;
}

/* The topmost PCI-to-PCI bridge above obj (a "switch"), or NULL when obj hangs off a host bridge. */
static hwloc_obj_t top_switch(hwloc_obj_t obj) {
    hwloc_obj_t sw = NULL;
    for (hwloc_obj_t o = obj ? obj->parent : NULL; o; o = o->parent) {
        if (o->type == HWLOC_OBJ_BRIDGE && o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI)
            sw = o;
        if (o->type != HWLOC_OBJ_BRIDGE && o->type != HWLOC_OBJ_PCI_DEVICE) break;
    }
    return sw;
}

static int nic_speed_mbps(hwloc_topology_t topo, const char *name) {
    if (!hwloc_topology_is_thissystem(topo)) return 0;
    char path[128];
    snprintf(path, sizeof(path), "/sys/class/net/%s/speed", name);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int speed = 0;
    if (fscanf(f, "%d", &speed) != 1 || speed < 0) speed = 0;
    fclose(f);
    return speed;
}

/* The smallest L2 cache among those of the CPUs in `cpus` (all of the machine's when the set is
 * empty): the cache a shared-memory ring's slots should fit (tuner.c). 0 when hwloc knows none. */
static uint32_t smallest_l2(hwloc_topology_t topo, hwloc_const_cpuset_t cpus) {
    uint64_t best = 0;
    int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_L2CACHE);
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L2CACHE, i);
        if (o->attr == NULL || o->attr->cache.size == 0) continue;
        if (cpus && !hwloc_bitmap_iszero(cpus) && o->cpuset &&
            !hwloc_bitmap_intersects(o->cpuset, cpus))
            continue;
        if (best == 0 || o->attr->cache.size < best) best = o->attr->cache.size;
    }
    return best > UINT32_MAX ? UINT32_MAX : (uint32_t)best;
}

ncclResult_t topo_place(hwloc_topology_t topo, hwloc_const_cpuset_t cpus, const char *gpu_bus_id,
                        topo_place_info_t *info) {
    memset(info, 0, sizeof(*info));
    info->package = single_intersecting(topo, HWLOC_OBJ_PACKAGE, cpus);
    info->l2_bytes = smallest_l2(topo, cpus);
    info->numa_node = single_intersecting(topo, HWLOC_OBJ_NUMANODE, cpus);
    info->pci_switch = -1;
    info->near_nic = -1;

    hwloc_obj_t gpu = NULL, gpu_sw = NULL;
    if (gpu_bus_id && gpu_bus_id[0]) {
        gpu = hwloc_get_pcidev_by_busidstring(topo, gpu_bus_id);
        gpu_sw = top_switch(gpu);
        if (gpu_sw) info->pci_switch = (int)gpu_sw->logical_index;
    }
    /* NICs: best first = under the GPU's switch, then close to our CPUs, then any. */
    int best_score = -1;
    for (hwloc_obj_t o = hwloc_get_next_osdev(topo, NULL); o; o = hwloc_get_next_osdev(topo, o)) {
        int kind;
        if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) kind = 0;
        else if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) kind = 1;
        else continue;
        if (info->nnics >= CHORUS_MAX_NICS) break;
        chorus_nic_t *nic = &info->nics[info->nnics];
        snprintf(nic->name, sizeof(nic->name), "%s", o->name ? o->name : "?");
        nic->kind = kind;
        nic->speed_mbps = kind == 0 ? nic_speed_mbps(topo, nic->name) : 0;
        hwloc_obj_t pci = o->parent && o->parent->type == HWLOC_OBJ_PCI_DEVICE ? o->parent : NULL;
        if (pci)
            snprintf(nic->pci_bus_id, sizeof(nic->pci_bus_id), "%04x:%02x:%02x.%01x",
                     pci->attr->pcidev.domain, pci->attr->pcidev.bus, pci->attr->pcidev.dev,
                     pci->attr->pcidev.func);
        int score = 0;
        hwloc_obj_t sw = top_switch(pci);
        if (gpu_sw && sw == gpu_sw) score = 3;
        else {
            hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
            if (anc && cpus && anc->cpuset && hwloc_bitmap_intersects(anc->cpuset, cpus) &&
                !hwloc_bitmap_isequal(anc->cpuset, hwloc_topology_get_topology_cpuset(topo)))
                score = 2;
            else score = 1;
        }
        if (score > best_score) {
            best_score = score;
            info->near_nic = info->nnics;
            if (!gpu_sw && sw) info->pci_switch = (int)sw->logical_index;
            else if (!gpu_sw) info->pci_switch = -1;
        }
        info->nnics++;
    }
    return ncclSuccess;
}

/* Name of the interface that carries `addr` (the address peers reach this rank by). */
static void ifname_of(const chorus_sockaddr_t *addr, char *name, size_t len) {
    struct ifaddrs *ifs = NULL;
    name[0] = '\0';
    if (getifaddrs(&ifs) != 0) return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != addr->sa.sa_family) continue;
        int same = addr->sa.sa_family == AF_INET
                       ? ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == addr->sin.sin_addr.s_addr
                       : memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, &addr->sin6.sin6_addr,
                                sizeof(struct in6_addr)) == 0;
        if (same) {
            snprintf(name, len, "%s", i->ifa_name);
            break;
        }
    }
    freeifaddrs(ifs);
}

static pthread_mutex_t g_topo_lock = PTHREAD_MUTEX_INITIALIZER;
static hwloc_topology_t g_topo;

/* The process-wide topology of this machine (or CHORUS_TOPO_FILE), loaded once. */
static ncclResult_t machine_topo(hwloc_topology_t *topo_p) {
    ncclResult_t res = ncclSuccess;
    pthread_mutex_lock(&g_topo_lock);
    if (g_topo == NULL) res = topo_system_load(NULL, &g_topo);
    *topo_p = g_topo;
    pthread_mutex_unlock(&g_topo_lock);
    return res;
}

/* CHORUS_CPU_BIND: none (default), auto (the CPUs near this rank's GPU, or its NUMA node),
 * or a hwloc list ("0-3") or per-local-rank lists separated by '|' ("0|1|2-3"). */
static void apply_cpu_bind(hwloc_topology_t topo, int local_index, const char *gpu_bus_id) {
    const char *mode = chorus_param_str(PARAM_CPU_BIND);
    if (mode == NULL || strcmp(mode, "none") == 0 || !hwloc_topology_is_thissystem(topo)) return;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (strcmp(mode, "auto") == 0) {
        hwloc_obj_t gpu = gpu_bus_id && gpu_bus_id[0]
                              ? hwloc_get_pcidev_by_busidstring(topo, gpu_bus_id) : NULL;
        hwloc_obj_t anc = gpu ? hwloc_get_non_io_ancestor_obj(topo, gpu) : NULL;
        if (anc == NULL) {
            int nn = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
            anc = nn > 0 ? hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, local_index % nn) : NULL;
        }
        if (anc && anc->cpuset) hwloc_bitmap_copy(set, anc->cpuset);
    } else {
        char buf[256];
        snprintf(buf, sizeof(buf), "%s", mode);
        int count = 1;
        for (char *p = buf; *p; p++) count += *p == '|';
        int want = local_index % count;
        char *save = NULL, *tok = strtok_r(buf, "|", &save);
        for (int i = 0; tok && i < want; i++) tok = strtok_r(NULL, "|", &save);
        if (tok == NULL || hwloc_bitmap_list_sscanf(set, tok) != 0) {
            WARN("CHORUS_CPU_BIND: cannot parse '%s' (auto, none, or CPU lists like 0-3|4-7)", mode);
            hwloc_bitmap_free(set);
            return;
        }
    }
    if (!hwloc_bitmap_iszero(set)) {
        if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_THREAD) == 0) {
            char txt[128];
            hwloc_bitmap_list_snprintf(txt, sizeof(txt), set);
            INFO(SUB_INIT, "bound to CPUs %s (CHORUS_CPU_BIND=%s)", txt, mode);
        } else {
            INFO(SUB_INIT, "CHORUS_CPU_BIND=%s: binding failed: %s", mode, strerror(errno));
        }
    }
    hwloc_bitmap_free(set);
}

/* CHORUS_TEST_HOSTS (testing only): entry `rank` of its comma-separated list replaces the host
 * name, and with it the host identity below. */
static void test_host_name(int rank, char *name, size_t len) {
    const char *list = chorus_param_str(PARAM_TEST_HOSTS);
    if (list == NULL || list[0] == 0 || rank < 0) return;
    const char *p = list;
    for (int i = 0; i < rank && p; i++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    if (p == NULL) return;
    const size_t n = strcspn(p, ",");
    if (n == 0) return;
    snprintf(name, len, "%.*s", (int)(n < len ? n : len - 1), p);
}

ncclResult_t topo_fill_locality(int rank, int cuda_dev, const chorus_sockaddr_t *bs_addr,
                                chorus_locality_t *loc) {
    memset(loc, 0, sizeof(*loc));
    loc->rank = rank;
    loc->cuda_dev = cuda_dev;
    loc->pid = (int)getpid();
    gethostname(loc->hostname, sizeof(loc->hostname) - 1);
    test_host_name(rank, loc->hostname, sizeof(loc->hostname));

    char boot_id[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot_id, sizeof(boot_id), f)) boot_id[0] = '\0';
        fclose(f);
    }
    struct stat st;
    if (stat("/dev/shm", &st) == 0) loc->shm_ns = ((uint64_t)st.st_dev << 32) ^ (uint64_t)st.st_ino;
    if (stat("/proc/self/ns/pid", &st) == 0) {
        loc->pid_ns = (uint64_t)st.st_ino;
        loc->pid_ns_ok = 1;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, loc->hostname, strlen(loc->hostname));
    h = fnv1a(h, boot_id, strlen(boot_id));
    h = fnv1a(h, &loc->shm_ns, sizeof(loc->shm_ns));
    loc->host_hash = h;
    if (bs_addr) {
        loc->net_addr = *bs_addr;
        if (loc->net_addr.sa.sa_family == AF_INET6) loc->net_addr.sin6.sin6_port = 0;
        else loc->net_addr.sin.sin_port = 0;
        ifname_of(&loc->net_addr, loc->net_ifname, sizeof(loc->net_ifname));
    }
#if CHORUS_HAVE_CUDA
    if (cuda_dev >= 0 &&
        cudaDeviceGetPCIBusId(loc->gpu_bus_id, sizeof(loc->gpu_bus_id), cuda_dev) != cudaSuccess)
        loc->gpu_bus_id[0] = '\0';
#endif

    hwloc_topology_t topo;
    CHECK(machine_topo(&topo));
    apply_cpu_bind(topo, rank, loc->gpu_bus_id);
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
    if (hwloc_get_cpubind(topo, cpus, HWLOC_CPUBIND_THREAD) != 0 &&
        hwloc_get_cpubind(topo, cpus, HWLOC_CPUBIND_PROCESS) != 0)
        hwloc_bitmap_zero(cpus);
    topo_place_info_t info;
    ncclResult_t res = topo_place(topo, cpus, loc->gpu_bus_id, &info);
    hwloc_bitmap_free(cpus);
    CHECK(res);
    loc->package = info.package;
    loc->numa_node = info.numa_node;
    loc->pci_switch = info.pci_switch;
    loc->near_nic = info.near_nic;
    loc->l2_bytes = info.l2_bytes;
    loc->nnics = info.nnics;
    memcpy(loc->nics, info.nics, sizeof(info.nics));
    return ncclSuccess;
}
