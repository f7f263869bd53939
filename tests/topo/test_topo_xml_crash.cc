// A topology file that makes hwloc's XML import crash (hwloc 2.9: an object without its
// complete_nodeset; found by tests/fuzz/fuzz_topo_xml) is refused with ncclInvalidArgument and a
// WARN naming it; the process survives.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "nccl.h"
extern "C" {
#include "log.h"
#include "topology/topo_internal.h"
}

TEST(TopoXml, FileThatCrashesHwlocIsRefused) {
    // The fuzz seed starts with two selector bytes; the XML follows them.
    std::string seed =
        std::string(CHORUS_SOURCE_DIR) + "/tests/fuzz/topo_xml/regress_hwloc_crash_no_complete_nodeset";
    FILE *in = fopen(seed.c_str(), "rb");
    ASSERT_NE(in, nullptr) << seed;
    std::string xml;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        xml.append(buf, n);
    fclose(in);
    ASSERT_GT(xml.size(), 2u);
    xml.erase(0, 2);
    char path[] = "/tmp/chorus_topo_crash_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, xml.data(), xml.size()), (ssize_t)xml.size());
    close(fd);
    hwloc_topology_t topo = nullptr;
    EXPECT_EQ(topo_system_load(path, &topo), ncclInvalidArgument);
    EXPECT_NE(strstr(chorus_log_last_error(), path), nullptr) << chorus_log_last_error();
    unlink(path);
}

// A valid file still loads (the check in a child process does not refuse good files).
TEST(TopoXml, ValidFileStillLoads) {
    std::string path = std::string(CHORUS_SOURCE_DIR) + "/tests/data/2pkg_pci.xml";
    hwloc_topology_t topo = nullptr;
    ASSERT_EQ(topo_system_load(path.c_str(), &topo), ncclSuccess);
    EXPECT_EQ(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE), 2);
    hwloc_topology_destroy(topo);
}
