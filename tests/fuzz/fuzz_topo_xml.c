/*
 * fuzz_topo_xml: a topology file as CHORUS_TOPO_FILE names it: loaded with topo_system_load (the
 * hwloc XML check, then hwloc's XML import), then read by topo_place as every rank does at init
 * (package, NUMA node, PCI switch and NICs near a set of CPUs and a GPU's bus id). Checks: a file
 * is either loaded or refused with ncclInvalidArgument/ncclSystemError; what topo_place reports
 * stays inside its fixed arrays.
 *
 * Input: [cpu set selector][gpu bus id selector][XML...]
 */
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "topology/topo_internal.h"

/* hwloc 2.x (a system library, not ours) leaks objects on some malformed XML it rejects. */
const char *__lsan_default_suppressions(void) {
    return "leak:libhwloc.so\n";
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    setenv("CHORUS_DEBUG_FILE", "/dev/null", 1); /* refused files WARN */
    setenv("HWLOC_XML_VERBOSE", "0", 1);
    /* hwloc loads its components at the first hwloc_topology_init and unloads them when the last
     * topology is destroyed: one topology kept for the whole run spares a dlopen per input. */
    static hwloc_topology_t keep;
    hwloc_topology_init(&keep);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input_t in = {data, size};
    uint8_t cpu_sel = fuzz_u8(&in);
    uint8_t gpu_sel = fuzz_u8(&in);
    int fd = memfd_create("fuzz_topo", MFD_CLOEXEC);
    FUZZ_ASSERT(fd >= 0);
    FUZZ_ASSERT(write(fd, in.p, in.left) == (ssize_t)in.left);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    hwloc_topology_t topo = NULL;
    ncclResult_t res = topo_system_load(path, &topo);
    close(fd);
    FUZZ_ASSERT(res == ncclSuccess || res == ncclInvalidArgument || res == ncclSystemError);
    if (res != ncclSuccess) return 0;

    hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
    if (cpu_sel & 1)
        hwloc_bitmap_copy(cpus, hwloc_topology_get_topology_cpuset(topo));
    else
        hwloc_bitmap_set(cpus, cpu_sel >> 1);
    static const char *const bus_ids[] = {"", "0000:00:00.0", "0000:01:00.0", "0000:3b:00.0",
                                          "zzzz"};
    const char *bus = bus_ids[gpu_sel % (sizeof(bus_ids) / sizeof(bus_ids[0]))];
    topo_place_info_t info;
    memset(&info, 0xa5, sizeof(info));
    if (topo_place(topo, cpus, bus, &info) == ncclSuccess) {
        FUZZ_ASSERT(info.nnics >= 0 && info.nnics <= CHORUS_MAX_NICS);
        FUZZ_ASSERT(info.near_nic >= -1 && info.near_nic < (info.nnics > 0 ? info.nnics : 1));
    }
    hwloc_bitmap_free(cpus);
    hwloc_topology_destroy(topo);
    return 0;
}
