// test_init_env.cc: chorusCommInitFromEnv with the variables of torchrun, mpirun and srun.
//
// Missing or malformed variables must give ncclInvalidArgument with a WARN naming them; complete
// sets must build a working communicator (forked ranks, since the environment is per process).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "chorus.h"
#include "bs_test_env.h"
#include "launch.h"
#include "nccl.h"

extern "C" {
#include "log.h"
#include "param.h"
}

namespace {

using chorus_test::free_port;

const char *kAllVars[] = {
    "RANK",          "WORLD_SIZE",           "LOCAL_RANK",           "MASTER_ADDR",
    "MASTER_PORT",   "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID",  "SLURM_NTASKS",         "SLURM_LOCALID",        "NCCL_COMM_ID",
    "CHORUS_COMM_ID", // and the job secret, which a launcher passes on with them
    "CHORUS_JOB_SECRET", "CHORUS_JOB_SECRET_FILE", "CHORUS_COMM_ID_INSECURE"};

// Clears every launcher variable for the test and restores them afterwards.
class InitFromEnv : public ::testing::Test {
  protected:
    std::vector<std::pair<std::string, std::string>> saved_;
    void SetUp() override {
        for (const char *v : kAllVars) {
            if (const char *o = getenv(v)) saved_.emplace_back(v, o);
            unsetenv(v);
        }
        chorus_param_reset();
    }
    void TearDown() override {
        for (const char *v : kAllVars)
            unsetenv(v);
        for (auto &p : saved_)
            setenv(p.first.c_str(), p.second.c_str(), 1);
        chorus_param_reset();
    }
    // Expect ncclInvalidArgument and a last-error text containing `needle`.
    void expect_invalid(const char *needle) {
        ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
        EXPECT_EQ(chorusCommInitFromEnv(&comm), ncclInvalidArgument);
        EXPECT_EQ(comm, nullptr);
        EXPECT_NE(strstr(chorus_log_last_error(), needle), nullptr)
            << "last error: " << chorus_log_last_error() << " (wanted " << needle << ")";
    }
};

// A listening TCP socket on 127.0.0.1:port, as torch's TCPStore holds MASTER_PORT; -1 on failure.
int listen_on(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 || listen(fd, 8) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

TEST_F(InitFromEnv, NullComm) {
    EXPECT_EQ(chorusCommInitFromEnv(nullptr), ncclInvalidArgument);
}

// Variable sets that chorusCommInitFromEnv must refuse with ncclInvalidArgument, and a piece of
// the WARN that must name the culprit.
struct BadEnv {
    const char *name;
    std::vector<std::pair<const char *, const char *>> vars;
    const char *needle;
};

const BadEnv kBadEnvs[] = {
    {"NothingSet", {}, "RANK"},
    {"RankWithoutSize", {{"RANK", "0"}}, "WORLD_SIZE"},
    {"SizeWithoutRank", {{"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK"},
    {"MalformedRank", {{"RANK", "one"}, {"WORLD_SIZE", "2"}}, "RANK='one'"},
    {"RankNotBelowSize", {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID=4"},
    {"ZeroSize", {{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE"},
    {"MissingMasterAddr", {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "29500"}},
     "MASTER_ADDR"},
    {"MissingMasterPort", {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}},
     "MASTER_PORT"},
    {"BadMasterPort",
     {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "99999"}},
     "MASTER_PORT"},
    {"BadCommId", {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"NCCL_COMM_ID", "nocolon"}},
     "NCCL_COMM_ID"},
    {"BadLocalRank",
     {{"RANK", "0"},
      {"WORLD_SIZE", "1"},
      {"LOCAL_RANK", "-1"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "29500"}},
     "LOCAL_RANK"},
};

class InitFromEnvBad : public InitFromEnv, public ::testing::WithParamInterface<BadEnv> {};

TEST_P(InitFromEnvBad, RefusedNamingTheVariable) {
    for (const auto &v : GetParam().vars)
        setenv(v.first, v.second, 1);
    chorus_param_reset(); // NCCL_COMM_ID is a parameter: parsed again with the new value
    expect_invalid(GetParam().needle);
}

INSTANTIATE_TEST_SUITE_P(InitFromEnv, InitFromEnvBad, ::testing::ValuesIn(kBadEnvs),
                         [](const ::testing::TestParamInfo<BadEnv> &i) { return i.param.name; });

// Each launcher's variable set builds a communicator of 3 forked ranks.
TEST_F(InitFromEnv, EachLauncherBuildsAComm) {
    struct Style {
        const char *rank, *size, *local;
    } styles[] = {{"RANK", "WORLD_SIZE", "LOCAL_RANK"},
                  {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
                  {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}};
    for (const Style &s : styles) {
        int p = free_port();
        std::string port = std::to_string(p);
        // Another program (torchrun's agent, torch's store) listens on MASTER_PORT meanwhile.
        int held = listen_on(p);
        ASSERT_GE(held, 0) << "cannot listen on " << p;
        auto res = chorus_test::run_forked(
            3,
            [&](int rank, int nranks) {
                setenv(s.rank, std::to_string(rank).c_str(), 1);
                setenv(s.size, std::to_string(nranks).c_str(), 1);
                setenv(s.local, std::to_string(rank).c_str(), 1);
                setenv("MASTER_ADDR", "127.0.0.1", 1);
                setenv("MASTER_PORT", port.c_str(), 1);
                setenv("CHORUS_JOB_SECRET", "init-env-test-secret", 1); // as the launcher passes
                chorus_param_reset();
                ncclComm_t comm = nullptr;
                RANK_NCCL(chorusCommInitFromEnv(&comm));
                int n = -1, me = -1;
                RANK_NCCL(ncclCommCount(comm, &n));
                RANK_NCCL(ncclCommUserRank(comm, &me));
                RANK_CHECK(n == nranks && me == rank, "rank %d of %d", me, n);
                RANK_NCCL(ncclCommDestroy(comm));
                return 0;
            },
            60);
        close(held);
        EXPECT_TRUE(res.ok()) << s.rank << ": " << res.detail;
    }
}

// A root address held by a program that is not Chorus fails within seconds, saying so, instead of
// waiting for CHORUS_TIMEOUT.
TEST_F(InitFromEnv, RootAddressHeldByAnotherProgramFailsFast) {
    int p = free_port();
    int held = listen_on(p);
    ASSERT_GE(held, 0) << "cannot listen on " << p;
    std::string id = "127.0.0.1:" + std::to_string(p);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("NCCL_COMM_ID", id.c_str(), 1);
    setenv("CHORUS_JOB_SECRET", "init-env-test-secret", 1);
    chorus_param_reset();
    ncclComm_t comm = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_NE(chorusCommInitFromEnv(&comm), ncclSuccess);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    close(held);
    EXPECT_EQ(comm, nullptr);
    EXPECT_LT(secs, 30.0) << "should fail within seconds, not at CHORUS_TIMEOUT";
    EXPECT_NE(strstr(chorus_log_last_error(), "held by another program"), nullptr)
        << "last error: " << chorus_log_last_error();
}

} // namespace
