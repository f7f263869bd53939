// test_abi.cc: Chorus's include/nccl.h against NCCL 2.28's ABI.
//
// The numbers below were read from the nccl.h that ships with the CUDA toolkit on the project's
// machine (NCCL 2.28.9, /usr/local/cuda/include/nccl.h) with a small offsetof/sizeof probe, and
// are hard-coded here so that the test means the same on a machine without the toolkit. A second
// check, tests/core/abi_consumer, compiles a program against the toolkit's own header when it is
// present and runs it on libnccl.so.2.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <type_traits>

#include "nccl.h"

TEST(Abi, VersionMacros) {
    EXPECT_EQ(NCCL_MAJOR, 2);
    EXPECT_EQ(NCCL_MINOR, 28);
    EXPECT_EQ(NCCL_PATCH, 9);
    EXPECT_EQ(NCCL_VERSION_CODE, 22809);
    EXPECT_EQ(NCCL_VERSION(2, 28, 9), 22809);
    EXPECT_EQ(NCCL_VERSION(2, 8, 4), 2804); // the old scheme, up to 2.8
    EXPECT_EQ(NCCL_VERSION(2, 9, 6), 20906);
    int v = 0;
    ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
    EXPECT_EQ(v, 22809);
    EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
}

TEST(Abi, ResultCodes) {
    EXPECT_EQ(ncclSuccess, 0);
    EXPECT_EQ(ncclUnhandledCudaError, 1);
    EXPECT_EQ(ncclSystemError, 2);
    EXPECT_EQ(ncclInternalError, 3);
    EXPECT_EQ(ncclInvalidArgument, 4);
    EXPECT_EQ(ncclInvalidUsage, 5);
    EXPECT_EQ(ncclRemoteError, 6);
    EXPECT_EQ(ncclInProgress, 7);
    EXPECT_EQ(ncclNumResults, 8);
    EXPECT_EQ(sizeof(ncclResult_t), 4u);
}

TEST(Abi, DataTypes) {
    EXPECT_EQ(ncclInt8, 0);
    EXPECT_EQ(ncclChar, 0);
    EXPECT_EQ(ncclUint8, 1);
    EXPECT_EQ(ncclInt32, 2);
    EXPECT_EQ(ncclInt, 2);
    EXPECT_EQ(ncclUint32, 3);
    EXPECT_EQ(ncclInt64, 4);
    EXPECT_EQ(ncclUint64, 5);
    EXPECT_EQ(ncclFloat16, 6);
    EXPECT_EQ(ncclHalf, 6);
    EXPECT_EQ(ncclFloat32, 7);
    EXPECT_EQ(ncclFloat, 7);
    EXPECT_EQ(ncclFloat64, 8);
    EXPECT_EQ(ncclDouble, 8);
    EXPECT_EQ(ncclBfloat16, 9);
    EXPECT_EQ(ncclFloat8e4m3, 10);
    EXPECT_EQ(ncclFloat8e5m2, 11);
    EXPECT_EQ(ncclNumTypes, 12);
    EXPECT_EQ(sizeof(ncclDataType_t), 4u);
}

TEST(Abi, RedOps) {
    EXPECT_EQ(ncclSum, 0);
    EXPECT_EQ(ncclProd, 1);
    EXPECT_EQ(ncclMax, 2);
    EXPECT_EQ(ncclMin, 3);
    EXPECT_EQ(ncclAvg, 4);
    EXPECT_EQ(ncclNumOps, 5);
    EXPECT_EQ((long long)ncclMaxRedOp, 0x7fffffffLL);
    EXPECT_EQ(sizeof(ncclRedOp_t), sizeof(int));
    EXPECT_EQ(ncclScalarDevice, 0);
    EXPECT_EQ(ncclScalarHostImmediate, 1);
}

TEST(Abi, UniqueIdAndHandles) {
    EXPECT_EQ(NCCL_UNIQUE_ID_BYTES, 128);
    EXPECT_EQ(sizeof(ncclUniqueId), 128u);
    EXPECT_EQ(sizeof(ncclComm_t), sizeof(void *));
    EXPECT_EQ(sizeof(ncclWindow_t), sizeof(void *));
    EXPECT_EQ(sizeof(cudaStream_t), sizeof(void *));
}

TEST(Abi, Macros) {
    EXPECT_EQ(NCCL_CONFIG_UNDEF_INT, INT_MIN);
    EXPECT_EQ(NCCL_SPLIT_NOCOLOR, -1);
    EXPECT_EQ(NCCL_UNDEF_FLOAT, -1.0f);
    EXPECT_EQ(NCCL_WIN_DEFAULT, 0x00);
    EXPECT_EQ(NCCL_WIN_COLL_SYMMETRIC, 0x01);
    EXPECT_EQ(NCCL_WIN_REQUIRED_ALIGNMENT, 4096);
    EXPECT_EQ(NCCL_CTA_POLICY_DEFAULT, 0x00);
    EXPECT_EQ(NCCL_CTA_POLICY_EFFICIENCY, 0x01);
    EXPECT_EQ(NCCL_CTA_POLICY_ZERO, 0x02);
    EXPECT_EQ(NCCL_SHRINK_DEFAULT, 0x00);
    EXPECT_EQ(NCCL_SHRINK_ABORT, 0x01);
    EXPECT_EQ(NCCL_REVOKE_DEFAULT, 0x00);
}

// sizeof/offsetof of ncclConfig_v22800 on x86-64, from the NCCL 2.28.9 header.
TEST(Abi, ConfigLayout) {
    EXPECT_EQ(sizeof(ncclConfig_t), 80u);
    EXPECT_EQ(offsetof(ncclConfig_t, size), 0u);
    EXPECT_EQ(offsetof(ncclConfig_t, magic), 8u);
    EXPECT_EQ(offsetof(ncclConfig_t, version), 12u);
    EXPECT_EQ(offsetof(ncclConfig_t, blocking), 16u);
    EXPECT_EQ(offsetof(ncclConfig_t, cgaClusterSize), 20u);
    EXPECT_EQ(offsetof(ncclConfig_t, minCTAs), 24u);
    EXPECT_EQ(offsetof(ncclConfig_t, maxCTAs), 28u);
    EXPECT_EQ(offsetof(ncclConfig_t, netName), 32u);
    EXPECT_EQ(offsetof(ncclConfig_t, splitShare), 40u);
    EXPECT_EQ(offsetof(ncclConfig_t, trafficClass), 44u);
    EXPECT_EQ(offsetof(ncclConfig_t, commName), 48u);
    EXPECT_EQ(offsetof(ncclConfig_t, collnetEnable), 56u);
    EXPECT_EQ(offsetof(ncclConfig_t, CTAPolicy), 60u);
    EXPECT_EQ(offsetof(ncclConfig_t, shrinkShare), 64u);
    EXPECT_EQ(offsetof(ncclConfig_t, nvlsCTAs), 68u);
    EXPECT_EQ(offsetof(ncclConfig_t, nChannelsPerNetPeer), 72u);
    EXPECT_EQ(offsetof(ncclConfig_t, nvlinkCentricSched), 76u);
}

TEST(Abi, ConfigInitializer) {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    EXPECT_EQ(c.size, sizeof(ncclConfig_t));
    EXPECT_EQ(c.magic, 0xcafebeefu);
    EXPECT_EQ(c.version, 22809u);
    EXPECT_EQ(c.blocking, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.cgaClusterSize, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.minCTAs, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.maxCTAs, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.netName, nullptr);
    EXPECT_EQ(c.splitShare, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.trafficClass, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.commName, nullptr);
    EXPECT_EQ(c.collnetEnable, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.CTAPolicy, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.shrinkShare, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.nvlsCTAs, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.nChannelsPerNetPeer, NCCL_CONFIG_UNDEF_INT);
    EXPECT_EQ(c.nvlinkCentricSched, NCCL_CONFIG_UNDEF_INT);
}

TEST(Abi, SimInfo) {
    EXPECT_EQ(sizeof(ncclSimInfo_t), 24u);
    EXPECT_EQ(offsetof(ncclSimInfo_t, estimatedTime), 16u);
    ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
    EXPECT_EQ(s.size, sizeof(ncclSimInfo_t));
    EXPECT_EQ(s.magic, 0x74685283u);
    EXPECT_EQ(s.version, 22809u);
    EXPECT_EQ(s.estimatedTime, -1.0f);
}

TEST(Abi, ErrorStrings) {
    for (int r = 0; r < ncclNumResults; r++) {
        const char *s = ncclGetErrorString((ncclResult_t)r);
        ASSERT_NE(s, nullptr);
        EXPECT_GT(strlen(s), 3u) << r;
    }
    EXPECT_STRNE(ncclGetErrorString(ncclInvalidArgument), ncclGetErrorString(ncclInvalidUsage));
    EXPECT_STREQ(ncclGetErrorString((ncclResult_t)99), "unknown result code");
    EXPECT_NE(ncclGetLastError(nullptr), nullptr); // NULL comm is allowed
}

// Every pnccl* profiling alias exists and is the same function as its nccl* name.
TEST(Abi, ProfilingAliases) {
    EXPECT_EQ((void *)&pncclGetVersion, (void *)&ncclGetVersion);
    EXPECT_EQ((void *)&pncclCommInitRank, (void *)&ncclCommInitRank);
    EXPECT_EQ((void *)&pncclCommDestroy, (void *)&ncclCommDestroy);
    EXPECT_EQ((void *)&pncclGetErrorString, (void *)&ncclGetErrorString);
    EXPECT_EQ((void *)&pncclMemAlloc, (void *)&ncclMemAlloc);
}

// The same facts from the toolkit's own nccl.h: tests/core/abi_consumer is compiled against it
// (when the toolkit is there) and prints them; they must equal what Chorus's header says.
static std::string abi_layout_line() {
#define OFF(f) (int)offsetof(ncclConfig_t, f)
    char buf[512];
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    snprintf(buf, sizeof(buf),
             "config %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d init %u %u %d uid %d "
             "sim %d %d enums %d %d %d %d %d %d %d %d version %d",
             (int)sizeof(ncclConfig_t), OFF(size), OFF(magic), OFF(version), OFF(blocking),
             OFF(cgaClusterSize), OFF(minCTAs), OFF(maxCTAs), OFF(netName), OFF(splitShare),
             OFF(trafficClass), OFF(commName), OFF(collnetEnable), OFF(CTAPolicy), OFF(shrinkShare),
             OFF(nvlsCTAs), OFF(nChannelsPerNetPeer), OFF(nvlinkCentricSched), c.magic, c.version,
             c.blocking, (int)sizeof(ncclUniqueId), (int)sizeof(ncclSimInfo_t),
             (int)offsetof(ncclSimInfo_t, estimatedTime), (int)ncclNumResults, (int)ncclInProgress,
             (int)ncclNumTypes, (int)ncclBfloat16, (int)ncclFloat8e5m2, (int)ncclNumOps,
             (int)ncclAvg, (int)ncclScalarHostImmediate, NCCL_VERSION_CODE);
#undef OFF
    return buf;
}

TEST(Abi, SameAsToolkitHeader) {
    std::string exe = std::string(CHORUS_BINARY_DIR) + "/tests/abi_consumer";
    if (access(exe.c_str(), X_OK) != 0)
        GTEST_SKIP() << "no toolkit nccl.h at configure time (" << exe << " not built)";
    FILE *p = popen((exe + " --layout").c_str(), "r");
    ASSERT_NE(p, nullptr);
    char line[512] = "";
    ASSERT_NE(fgets(line, sizeof(line), p), nullptr);
    pclose(p);
    std::string theirs(line);
    while (!theirs.empty() && theirs.back() == '\n')
        theirs.pop_back();
    EXPECT_EQ(theirs, abi_layout_line());
}
