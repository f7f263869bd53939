// test_config_channels.cc: config fields that reach the communicator's internals: maxCTAs caps the
// channel count (NCCL's CTAs are Chorus's channels) and collectives stay correct on fewer
// channels; commName is copied (the user's string may die after init); split inherits the
// parent's config when given none.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "launch.h"
#include "nccl.h"
extern "C" { // internal headers are C without extern "C" guards
#include "comm.h"
}

namespace {

TEST(ConfigChannels, MaxCTAsCapsChannels) {
    const char *old = getenv("CHORUS_MIN_NCHANNELS");
    std::string saved = old ? old : "";
    setenv("CHORUS_MIN_NCHANNELS", "4", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(3, [&](int rank, int n) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.maxCTAs = 2;
        char name[32];
        snprintf(name, sizeof(name), "capped-%d", rank);
        cfg.commName = name;
        ncclComm_t comm, sub;
        RANK_NCCL(ncclCommInitRankConfig(&comm, n, id, rank, &cfg));
        memset(name, 0, sizeof(name)); // the comm keeps its own copy
        RANK_CHECK(comm->nchannels >= 1 && comm->nchannels <= 2, "nchannels %d", comm->nchannels);
        RANK_CHECK(comm->config.commName && strncmp(comm->config.commName, "capped-", 7) == 0,
                   "commName not kept");
        RANK_CHECK(comm->config.blocking == 1 && comm->config.maxCTAs == 2, "resolved config");
        std::vector<int32_t> v(10001, rank + 1);
        RANK_NCCL(ncclAllReduce(v.data(), v.data(), v.size(), ncclInt32, ncclSum, comm, nullptr));
        RANK_CHECK(v[0] == 6 && v[10000] == 6, "sum %d", v[0]);
        // Split without a config inherits maxCTAs.
        RANK_NCCL(ncclCommSplit(comm, 0, rank, &sub, nullptr));
        RANK_CHECK(sub->config.maxCTAs == 2 && sub->nchannels <= 2, "split did not inherit");
        RANK_NCCL(ncclCommDestroy(sub));
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    if (old)
        setenv("CHORUS_MIN_NCHANNELS", saved.c_str(), 1);
    else
        unsetenv("CHORUS_MIN_NCHANNELS");
    ncclResetDebugInit();
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(ConfigChannels, DefaultsResolved) {
    ncclUniqueId id = chorus_test::make_unique_id();
    ncclComm_t comm;
    ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
    EXPECT_EQ(comm->config.blocking, 1);
    EXPECT_EQ(comm->config.minCTAs, 1);
    EXPECT_EQ(comm->config.maxCTAs, CHORUS_MAXCHANNELS);
    EXPECT_EQ(comm->config.splitShare, 0);
    EXPECT_EQ(comm->config.magic, 0xcafebeefu);
    EXPECT_EQ(comm->config.size, sizeof(ncclConfig_t));
    EXPECT_EQ(comm->cuda_dev >= -1, true);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

} // namespace
