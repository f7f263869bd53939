// perf_env_test.cc: the rank of this process from each launcher's variables, and the unique-id
// address (NCCL_COMM_ID) derived from MASTER_ADDR/MASTER_PORT (perf/common/perf_env.c).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "perf.h"

namespace {

std::map<std::string, std::string> g_env;

const char *fake_getenv(const char *name) {
    auto it = g_env.find(name);
    return it == g_env.end() ? nullptr : it->second.c_str();
}

int read(perf_env_t *e, std::string *err = nullptr) {
    char buf[512] = "";
    int rc = perf_env_read(fake_getenv, e, buf, sizeof(buf));
    if (err) *err = buf;
    return rc;
}

TEST(PerfEnv, NoLauncherIsOneProcess) {
    g_env = {};
    perf_env_t e;
    ASSERT_EQ(read(&e), 0);
    EXPECT_EQ(e.proc, 0);
    EXPECT_EQ(e.nprocs, 1);
    EXPECT_STREQ(e.comm_id, "");
}

TEST(PerfEnv, Torchrun) {
    g_env = {{"RANK", "3"},
             {"WORLD_SIZE", "4"},
             {"LOCAL_RANK", "1"},
             {"MASTER_ADDR", "10.0.0.7"},
             {"MASTER_PORT", "29500"}};
    perf_env_t e;
    ASSERT_EQ(read(&e), 0);
    EXPECT_EQ(e.proc, 3);
    EXPECT_EQ(e.nprocs, 4);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_STREQ(e.comm_id, "10.0.0.7:29500");
}

TEST(PerfEnv, ExistingCommIdWins) {
    g_env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"NCCL_COMM_ID", "h:1"}};
    perf_env_t e;
    ASSERT_EQ(read(&e), 0);
    EXPECT_STREQ(e.comm_id, ""); // nothing to set
}

TEST(PerfEnv, OpenMpiAndSlurm) {
    g_env = {{"OMPI_COMM_WORLD_RANK", "1"},
             {"OMPI_COMM_WORLD_SIZE", "2"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
             {"MASTER_ADDR", "fe80::1"},
             {"MASTER_PORT", "1234"}};
    perf_env_t e;
    ASSERT_EQ(read(&e), 0);
    EXPECT_EQ(e.proc, 1);
    EXPECT_STREQ(e.source, "Open MPI");
    EXPECT_STREQ(e.comm_id, "[fe80::1]:1234");

    g_env = {{"SLURM_PROCID", "5"},
             {"SLURM_NTASKS", "8"},
             {"SLURM_LOCALID", "1"},
             {"NCCL_COMM_ID", "node0:5000"}};
    ASSERT_EQ(read(&e), 0);
    EXPECT_EQ(e.proc, 5);
    EXPECT_EQ(e.nprocs, 8);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_STREQ(e.source, "Slurm");
}

TEST(PerfEnv, Errors) {
    std::string err;
    perf_env_t e;
    g_env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}};
    EXPECT_EQ(read(&e, &err), -1);
    EXPECT_NE(err.find("MASTER_ADDR"), std::string::npos) << err;
    g_env = {{"RANK", "x"}, {"WORLD_SIZE", "2"}};
    EXPECT_EQ(read(&e, &err), -1);
    EXPECT_NE(err.find("RANK"), std::string::npos) << err;
    g_env = {{"RANK", "2"}, {"WORLD_SIZE", "2"}};
    EXPECT_EQ(read(&e, &err), -1);
    g_env = {{"RANK", "1"}};
    EXPECT_EQ(read(&e, &err), -1);
    EXPECT_NE(err.find("WORLD_SIZE"), std::string::npos) << err;
    g_env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "99999"}};
    EXPECT_EQ(read(&e, &err), -1);
    EXPECT_NE(err.find("MASTER_PORT"), std::string::npos) << err;
}

} // namespace
