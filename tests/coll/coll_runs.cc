// coll_runs.cc: the shared runs of coll_runs.h.
#include "coll_runs.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "coll_util.h"
#include "nccl.h"

namespace coll_test {

DeathRun run_with_a_death(int n, int victim, int kill_at, size_t count, double timeout_s) {
    DeathRun d;
    // Survivors that name the dead rank write a byte each: forked ranks report through files.
    char named_path[] = "/tmp/chorus-coll-death-XXXXXX";
    int named_fd = mkstemp(named_path);
    if (named_fd < 0) {
        ADD_FAILURE() << "mkstemp: " << strerror(errno);
        d.res.failed = n;
        return d;
    }
    const std::string victim_name = "rank " + std::to_string(victim) + " ";
    ncclUniqueId id = chorus_test::make_unique_id();
    d.res = chorus_test::run_forked(
        n,
        [&](int rank, int nr) -> int {
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            std::vector<float> a(count, 1.0f), b(count);
            for (int it = 0; it < 10000000; it++) {
                if (rank == victim && it == kill_at) kill(getpid(), SIGKILL);
                ncclResult_t r = ncclAllReduce(a.data(), b.data(), a.size(), ncclFloat32, ncclSum,
                                               comm, nullptr);
                if (r != ncclSuccess) {
                    const char *msg = ncclGetLastError(comm);
                    RANK_CHECK(r == ncclRemoteError || r == ncclSystemError, "rank %d: %s", rank,
                               ncclGetErrorString(r));
                    bool names_victim = strstr(msg, victim_name.c_str()) != nullptr;
                    bool names_other = false;
                    for (int k = 0; k < nr; k++) {
                        std::string other = "rank " + std::to_string(k) + " (";
                        if (k != rank && k != victim && strstr(msg, other.c_str()))
                            names_other = true;
                    }
                    RANK_CHECK(names_victim || names_other, "rank %d: message names no peer: %s",
                               rank, msg);
                    if (names_victim && write(named_fd, "x", 1) != 1) return 1;
                    ncclCommAbort(comm);
                    return 0;
                }
            }
            fprintf(stderr, "rank %d: never saw an error\n", rank);
            return 1;
        },
        timeout_s);
    d.named = (int)lseek(named_fd, 0, SEEK_END);
    close(named_fd);
    unlink(named_path);
    return d;
}

void expect_only_the_victim_died(const DeathRun &d, int victim) {
    EXPECT_FALSE(d.res.timed_out) << d.res.detail;
    EXPECT_EQ(d.res.failed, 1) << d.res.detail;
    EXPECT_NE(d.res.detail.find("rank " + std::to_string(victim) + ": signal 9"),
              std::string::npos)
        << d.res.detail;
}

chorus_test::RunResult run_group_of_allreduces(int n, const std::vector<size_t> &sizes) {
    const int nops = (int)sizes.size();
    ncclUniqueId id = chorus_test::make_unique_id();
    return chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<std::vector<int32_t>> bufs(nops);
        for (int o = 0; o < nops; o++) {
            bufs[o].resize(sizes[o]);
            for (size_t i = 0; i < bufs[o].size(); i++)
                bufs[o][i] = (int32_t)(rank * 1000 + o * 100 + (int)(i % 7919));
        }
        RANK_NCCL(ncclGroupStart());
        for (int o = 0; o < nops; o++)
            RANK_NCCL(ncclAllReduce(bufs[o].data(), bufs[o].data(), bufs[o].size(), ncclInt32,
                                    ncclSum, comm, nullptr));
        RANK_NCCL(ncclGroupEnd());
        for (int o = 0; o < nops; o++)
            for (size_t i = 0; i < bufs[o].size(); i++) {
                int32_t want = 0;
                for (int q = 0; q < nr; q++)
                    want += (int32_t)(q * 1000 + o * 100 + (int)(i % 7919));
                RANK_CHECK(bufs[o][i] == want, "rank %d op %d element %zu: %d, want %d", rank, o, i,
                           bufs[o][i], want);
            }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
}

void expect_sum_and_same_bits(const std::vector<std::vector<float>> &outs, size_t stride,
                              const std::string &what) {
    const int n = (int)outs.size();
    ASSERT_GT(n, 0);
    const size_t count = outs[0].size();
    // Close to the exact sum (the order differs from a plain loop) ...
    for (size_t i = 0; i < count; i += stride) {
        double want = 0, mag = 0;
        for (int r = 0; r < n; r++) {
            want += order_sensitive_value(r, i);
            mag += std::fabs(order_sensitive_value(r, i));
        }
        ASSERT_NEAR(outs[0][i], want, 1e-6 * mag + 1e-30) << "element " << i << what;
    }
    // ... and the same bits on every rank.
    for (int r = 1; r < n; r++) {
        ASSERT_EQ(outs[r].size(), count) << "rank " << r << what;
        EXPECT_EQ(std::memcmp(outs[0].data(), outs[r].data(), count * sizeof(float)), 0)
            << "rank " << r << " differs from rank 0" << what;
    }
}

} // namespace coll_test
