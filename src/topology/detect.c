/*
 * detect.c: this rank's locality record (TEMPORARY minimal version by the lead; the topology
 * work replaces it with hwloc discovery: NUMA node, package, GPU and NICs).
 *
 * Host identity is hostname + boot id + the identity of /dev/shm, never the hostname alone: two
 * containers on one machine that do not share /dev/shm must not be treated as one host.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "locality.h"

static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

ncclResult_t topo_fill_locality(int rank, int cuda_dev, const chorus_sockaddr_t *bs_addr,
                                chorus_locality_t *loc) {
    memset(loc, 0, sizeof(*loc));
    loc->rank = rank;
    loc->cuda_dev = cuda_dev;
    loc->numa_node = -1;
    loc->package = -1;
    loc->pid = (int)getpid();
    gethostname(loc->hostname, sizeof(loc->hostname) - 1);

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
        if (loc->net_addr.sa.sa_family == AF_INET) loc->net_addr.sin.sin_port = 0;
        else loc->net_addr.sin6.sin6_port = 0;
    }
    return ncclSuccess;
}
