#!/usr/bin/env python3
"""Write the hwloc XML topologies the topology tests load (run from this folder; output is checked in).

2pkg_pci.xml: two packages, one NUMA node each, 4 cores each; under package 0 a PCI switch with GPU
0000:01:00.0 and NIC eth0 (mlx5_0), and another switch with GPU 0000:02:00.0; under package 1 a switch
with GPU 0000:41:00.0 and NIC eth1 (mlx5_1), and a switch with GPU 0000:42:00.0 alone.
"""
gp = [100]
def nid():
    gp[0] += 1
    return gp[0]

def cpuset(bits):
    return "0x%08x" % bits

def osdev(name, typ):
    return '<object type="OSDev" gp_index="%d" name="%s" osdev_type="%d"/>' % (nid(), name, typ)

def pcidev(busid, cls, vendor, dev, children=""):
    return ('<object type="PCIDev" gp_index="%d" pci_busid="%s" pci_type="%s [%s:%s] [%s:0000] 00" '
            'pci_link_speed="16.000000">%s</object>' % (nid(), busid, cls, vendor, dev, vendor, children))

def switch(busid, secondary, subordinate, children):
    return ('<object type="Bridge" gp_index="%d" bridge_type="1-1" depth="1" bridge_pci="0000:[%02x-%02x]" '
            'pci_busid="%s" pci_type="0604 [10b5:8747] [0000:0000] 00" pci_link_speed="16.000000">%s</object>'
            % (nid(), secondary, subordinate, busid, children))

def hostbridge(lo, hi, children):
    return ('<object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" bridge_pci="0000:[%02x-%02x]">%s</object>'
            % (nid(), lo, hi, children))

def package(idx, first_pu, io):
    cores = ""
    for c in range(4):
        pu = first_pu + c
        cores += ('<object type="Core" os_index="%d" cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s" gp_index="%d">'
                  '<object type="PU" os_index="%d" cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s" gp_index="%d"/></object>'
                  % (pu, cpuset(1 << pu), cpuset(1 << pu), cpuset(1 << idx), cpuset(1 << idx), nid(),
                     pu, cpuset(1 << pu), cpuset(1 << pu), cpuset(1 << idx), cpuset(1 << idx), nid()))
    mask = 0xf << first_pu
    numa = ('<object type="NUMANode" os_index="%d" cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s" gp_index="%d" local_memory="8589934592"/>'
            % (idx, cpuset(mask), cpuset(mask), cpuset(1 << idx), cpuset(1 << idx), nid()))
    return ('<object type="Package" os_index="%d" cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s" gp_index="%d">%s%s%s</object>'
            % (idx, cpuset(mask), cpuset(mask), cpuset(1 << idx), cpuset(1 << idx), nid(), numa, cores, io))

GPU, NET, RDMA, COPROC = 1, 2, 3, 5
io0 = hostbridge(0x00, 0x0f,
    switch("0000:00:01.0", 0x01, 0x01,
           pcidev("0000:01:00.0", "0302", "10de", "2330", osdev("cuda0", COPROC)) +
           pcidev("0000:01:01.0", "0200", "15b3", "101b", osdev("eth0", NET) + osdev("mlx5_0", RDMA))) +
    switch("0000:00:02.0", 0x02, 0x02,
           pcidev("0000:02:00.0", "0302", "10de", "2330", osdev("cuda1", COPROC))))
io1 = hostbridge(0x40, 0x4f,
    switch("0000:40:01.0", 0x41, 0x41,
           pcidev("0000:41:00.0", "0302", "10de", "2330", osdev("cuda2", COPROC)) +
           pcidev("0000:41:01.0", "0200", "15b3", "101b", osdev("eth1", NET) + osdev("mlx5_1", RDMA))) +
    switch("0000:40:02.0", 0x42, 0x42,
           pcidev("0000:42:00.0", "0302", "10de", "2330", osdev("cuda3", COPROC))))
body = package(0, 0, io0) + package(1, 4, io1)
xml = ('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n<topology version="2.0">\n'
       '<object type="Machine" os_index="0" cpuset="0x000000ff" complete_cpuset="0x000000ff" allowed_cpuset="0x000000ff" '
       'nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">%s</object>\n'
       '</topology>\n' % body)
open("2pkg_pci.xml", "w").write(xml)
