// test_coll_oneshot.cc: what the one-shot all-reduce (src/collectives/allreduce_oneshot.c)
// promises beyond a correct sum, which the sweep (test_coll_sweep.cc, algorithm "oneshot")
// checks against the reference:
//   - every rank ends with bitwise identical results (the fold runs in rank order on every
//     rank), on inputs whose float sum depends on the order of the additions;
//   - several one-shot ops in flight at once (a group, in place; async ops queued behind a running
//     one) each keep their own input copy;
//   - a rank that dies while its peers wait in small all-reduces gives each survivor an error
//     naming the op and the dead rank, before the deadline.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "chorus.h"
#include "coll_util.h"
#include "launch.h"
#include "nccl.h"

using chorus_test::Launch;

namespace {

void oneshot_env(const char *algo) {
    setenv("CHORUS_ALGO", algo, 1);
    ncclResetDebugInit();
}

void oneshot_env_clear() {
    unsetenv("CHORUS_ALGO");
    unsetenv("CHORUS_TIMEOUT");
    ncclResetDebugInit();
}

} // namespace

class CollOneshotIdentical : public ::testing::TestWithParam<int> {};
TEST_P(CollOneshotIdentical, SameBitsOnEveryRank) {
    const int n = GetParam();
    const size_t count = 1027;
    oneshot_env("oneshot");
    ncclUniqueId id = chorus_test::make_unique_id();
    // [rank][inplace] outputs, written by the rank threads, compared here.
    std::vector<std::vector<std::vector<float>>> outs(n, std::vector<std::vector<float>>(2));
    auto res = chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (int inplace = 0; inplace < 2; inplace++) {
            std::vector<float> in(count), out(count, -1.0f);
            for (size_t i = 0; i < count; i++) in[i] = coll_test::order_sensitive_value(rank, i);
            float *src = inplace ? out.data() : in.data();
            if (inplace) out = in;
            RANK_NCCL(ncclAllReduce(src, out.data(), count, ncclFloat32, ncclSum, comm, nullptr));
            outs[rank][inplace] = out;
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    oneshot_env_clear();
    ASSERT_TRUE(res.ok()) << res.detail;
    for (int inplace = 0; inplace < 2; inplace++) {
        // The reference: the fold in rank order, acc = p0, then acc = p_k + acc.
        for (size_t i = 0; i < count; i++) {
            float acc = coll_test::order_sensitive_value(0, i);
            for (int k = 1; k < n; k++) acc = coll_test::order_sensitive_value(k, i) + acc;
            ASSERT_EQ(std::memcmp(&acc, &outs[0][inplace][i], sizeof(float)), 0)
                << "element " << i << (inplace ? " in place" : " out of place") << ": " << acc
                << " vs " << outs[0][inplace][i];
        }
        for (int r = 1; r < n; r++)
            EXPECT_EQ(std::memcmp(outs[0][inplace].data(), outs[r][inplace].data(),
                                  count * sizeof(float)),
                      0)
                << "rank " << r << " differs from rank 0" << (inplace ? " (in place)" : "");
    }
}
INSTANTIATE_TEST_SUITE_P(Coll, CollOneshotIdentical, ::testing::Values(2, 3, 4, 5, 7, 8));

// Several in-place one-shot all-reduces in one group: all are queued before any runs, so only
// the first may use the engine's shared input copy.
TEST(CollOneshot, GroupInPlace) {
    const int n = 3, nops = 4;
    const size_t count = 333;
    oneshot_env("oneshot");
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<std::vector<int32_t>> bufs(nops, std::vector<int32_t>(count));
        for (int o = 0; o < nops; o++)
            for (size_t i = 0; i < count; i++) bufs[o][i] = (int32_t)(rank * 1000 + o * 100 + i);
        RANK_NCCL(ncclGroupStart());
        for (int o = 0; o < nops; o++)
            RANK_NCCL(ncclAllReduce(bufs[o].data(), bufs[o].data(), count, ncclInt32, ncclSum,
                                    comm, nullptr));
        RANK_NCCL(ncclGroupEnd());
        for (int o = 0; o < nops; o++)
            for (size_t i = 0; i < count; i++) {
                int32_t want = 0;
                for (int q = 0; q < nr; q++) want += (int32_t)(q * 1000 + o * 100 + i);
                RANK_CHECK(bufs[o][i] == want, "rank %d op %d element %zu: %d, want %d", rank, o,
                           i, bufs[o][i], want);
            }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    oneshot_env_clear();
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Async in-place one-shot all-reduces of growing sizes, issued back to back while the first is
// still waiting for a slow rank 0: the later ops are queued behind a running head op that folds
// from the engine's input copy, so queuing them must not move that copy (a regression: growing it
// at enqueue freed the buffer under the running op, and replicas in the DDP layer diverged).
class CollOneshotAsync : public ::testing::TestWithParam<int> {};
TEST_P(CollOneshotAsync, GrowingInPlaceBehindARunningOp) {
    const int n = GetParam(), nops = 8, rounds = 30;
    oneshot_env("oneshot");
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (int r = 0; r < rounds; r++) {
            std::vector<std::vector<int32_t>> bufs(nops);
            for (int o = 0; o < nops; o++) {
                bufs[o].resize((size_t)4 << o); // 16 B .. 2 KiB
                for (size_t i = 0; i < bufs[o].size(); i++)
                    bufs[o][i] = (int32_t)(rank * 1000003 + r * 10007 + o * 101 + (int)i);
            }
            if (rank == 0) usleep(2000); // the others' first op waits for rank 0
            std::vector<chorusRequest_t> reqs;
            int first_done = 0;
            for (int o = 0; o < nops; o++) {
                chorusRequest_t req;
                RANK_NCCL(chorusAllReduceAsync(bufs[o].data(), bufs[o].data(), bufs[o].size(),
                                               ncclInt32, ncclSum, comm, &req));
                // Drive the first op once, so it is running (its input copied, its sends out)
                // before the larger ones are queued behind it.
                if (o == 0) RANK_NCCL(chorusTest(req, &first_done));
                if (o > 0 || !first_done) reqs.push_back(req);
            }
            // Allocations after the enqueues reuse whatever memory was freed meanwhile.
            std::vector<std::vector<int32_t>> noise(nops, std::vector<int32_t>(1024, -1));
            RANK_NCCL(chorusWaitAll((int)reqs.size(), reqs.data()));
            for (int o = 0; o < nops; o++)
                for (size_t i = 0; i < bufs[o].size(); i++) {
                    int32_t want = 0;
                    for (int q = 0; q < nr; q++)
                        want += (int32_t)(q * 1000003 + r * 10007 + o * 101 + (int)i);
                    RANK_CHECK(bufs[o][i] == want, "rank %d round %d op %d element %zu: %d, want %d",
                               rank, r, o, i, bufs[o][i], want);
                }
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    oneshot_env_clear();
    EXPECT_TRUE(res.ok()) << res.detail;
}
INSTANTIATE_TEST_SUITE_P(Coll, CollOneshotAsync, ::testing::Values(2, 3));

// Forked ranks: the same checks as the sweep at a rank count it does not fork (5), in place and
// out of place, with the tuner's own choice (one-shot at this size).
TEST(CollOneshot, FiveRanksForked) {
    const int n = 5;
    const size_t count = 700;
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        for (int it = 0; it < 20; it++) {
            std::vector<double> in(count), out(count, 0.0);
            for (size_t i = 0; i < count; i++) in[i] = rank + it * 0.5 + (double)i;
            const bool inplace = it % 2;
            if (inplace) out = in;
            RANK_NCCL(ncclAllReduce(inplace ? out.data() : in.data(), out.data(), count,
                                    ncclFloat64, ncclMax, comm, nullptr));
            for (size_t i = 0; i < count; i++)
                RANK_CHECK(out[i] == (nr - 1) + it * 0.5 + (double)i,
                           "rank %d iteration %d element %zu: %g", rank, it, i, out[i]);
        }
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// A rank dies while the others are inside small (one-shot) all-reduces: each survivor gets an
// error that names the op and the dead rank, well before the deadline.
TEST(CollOneshot, PeerDeathNamesRank) {
    const int n = 4, victim = 2;
    oneshot_env("oneshot");
    setenv("CHORUS_TIMEOUT", "20", 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<float> a(64, 1.0f), b(64);
        for (int it = 0; it < 10000000; it++) {
            if (rank == victim && it == 50) kill(getpid(), SIGKILL);
            ncclResult_t r = ncclAllReduce(a.data(), b.data(), 64, ncclFloat32, ncclSum, comm,
                                           nullptr);
            if (r != ncclSuccess) {
                const char *msg = ncclGetLastError(comm);
                RANK_CHECK(r == ncclRemoteError || r == ncclSystemError, "rank %d: %s", rank,
                           ncclGetErrorString(r));
                RANK_CHECK(strstr(msg, "allreduce") != nullptr, "rank %d: message lacks the op: %s",
                           rank, msg);
                RANK_CHECK(strstr(msg, "rank 2") != nullptr,
                           "rank %d: message lacks the dead rank: %s", rank, msg);
                ncclCommAbort(comm);
                return 0;
            }
        }
        fprintf(stderr, "rank %d: never saw an error\n", rank);
        return 1;
    }, 90);
    oneshot_env_clear();
    EXPECT_FALSE(res.timed_out) << res.detail;
    EXPECT_EQ(res.failed, 1) << res.detail;
    EXPECT_NE(res.detail.find("rank 2: signal 9"), std::string::npos) << res.detail;
}
