/*
 * dump.c: show what topology discovery found (chorus_info --topo) and write it as hwloc XML
 * (chorus_info --topo-dump FILE), so a user can load the same file elsewhere with CHORUS_TOPO_FILE.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "param.h"
#include "topo.h"
#include "topo_internal.h"

ncclResult_t topo_print(FILE *out) {
    hwloc_topology_t topo;
    CHECK(topo_system_load(NULL, &topo));
    fprintf(out, "topology source: %s\n", topo_system_source());
    fprintf(out, "packages: %d  NUMA nodes: %d  cores: %d  PUs: %d\n",
            hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE),
            hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE),
            hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE),
            hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
    int nn = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nn; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i);
        char cpus[128];
        hwloc_bitmap_list_snprintf(cpus, sizeof(cpus), o->cpuset);
        fprintf(out, "  NUMA %d: CPUs %s, %llu MiB\n", i, cpus,
                (unsigned long long)(o->attr->numanode.local_memory >> 20));
    }
    for (hwloc_obj_t o = hwloc_get_next_osdev(topo, NULL); o; o = hwloc_get_next_osdev(topo, o)) {
        const char *kind = NULL;
        switch (o->attr->osdev.type) {
        case HWLOC_OBJ_OSDEV_NETWORK: kind = "NIC"; break;
        case HWLOC_OBJ_OSDEV_OPENFABRICS: kind = "RDMA"; break;
        case HWLOC_OBJ_OSDEV_GPU: kind = "GPU"; break;
        case HWLOC_OBJ_OSDEV_COPROC: kind = "GPU"; break;
        default: break;
        }
        if (!kind) continue;
        hwloc_obj_t pci = o->parent && o->parent->type == HWLOC_OBJ_PCI_DEVICE ? o->parent : NULL;
        if (pci)
            fprintf(out, "  %s %s at PCI %04x:%02x:%02x.%x\n", kind, o->name, pci->attr->pcidev.domain,
                    pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func);
        else
            fprintf(out, "  %s %s\n", kind, o->name);
    }
    hwloc_topology_destroy(topo);

    chorus_locality_t loc;
    CHECK(topo_fill_locality(0, -1, NULL, &loc));
    fprintf(out, "this process: host %s (identity %016llx), pid %d, package %d, NUMA node %d, "
            "PCI switch %d\n", loc.hostname, (unsigned long long)loc.host_hash, loc.pid, loc.package,
            loc.numa_node, loc.pci_switch);
    for (int i = 0; i < loc.nnics; i++)
        fprintf(out, "  NIC %s%s: %s, %d Mb/s%s%s\n", loc.nics[i].name,
                i == loc.near_nic ? " (nearest)" : "", loc.nics[i].kind ? "verbs" : "socket",
                loc.nics[i].speed_mbps, loc.nics[i].pci_bus_id[0] ? ", PCI " : "",
                loc.nics[i].pci_bus_id);
    return ncclSuccess;
}

ncclResult_t topo_dump_xml(const char *path) {
    hwloc_topology_t topo;
    CHECK(topo_system_load(NULL, &topo));
    int rc = hwloc_topology_export_xml(topo, path, 0);
    hwloc_topology_destroy(topo);
    if (rc != 0) {
        WARN("cannot write topology XML to %s: %s", path, strerror(errno));
        return ncclSystemError;
    }
    return ncclSuccess;
}
