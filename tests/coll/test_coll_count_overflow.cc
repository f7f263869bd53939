// test_coll_count_overflow.cc: counts whose byte size (count x element size, or count x nranks x
// element size where one buffer holds every rank's block) does not fit a size_t, or a buffer whose
// end runs past the address space. Every entry point (blocking, inside a group, the chorus*Async
// variants) returns ncclInvalidArgument with a WARN naming the call, and the communicator still
// runs a correct all-reduce afterwards.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "chorus.h"
#include "coll_util.h"
#include "launch.h"

using chorus_test::Launch;

namespace {

// One call of every entry point with a given count; the buffers are real (small) ones, so only the
// count is wrong.
struct Call {
    const char *name; // as the WARN spells it
    bool scaled;      // one buffer holds count x nranks elements
    std::function<ncclResult_t(size_t count, ncclComm_t comm, int rank, int n)> blocking;
    std::function<ncclResult_t(size_t count, ncclComm_t comm, int rank, int n, chorusRequest_t *)> async;
};

std::vector<Call> all_calls(float *a, float *b) {
    std::vector<Call> calls;
    calls.push_back({"AllReduce", false,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclAllReduce(a, b, c, ncclFloat32, ncclSum, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int, int, chorusRequest_t *r) {
                         return chorusAllReduceAsync(a, b, c, ncclFloat32, ncclSum, comm, r);
                     }});
    calls.push_back({"ReduceScatter", true,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclReduceScatter(a, b, c, ncclFloat32, ncclSum, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int, int, chorusRequest_t *r) {
                         return chorusReduceScatterAsync(a, b, c, ncclFloat32, ncclSum, comm, r);
                     }});
    calls.push_back({"AllGather", true,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclAllGather(a, b, c, ncclFloat32, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int, int, chorusRequest_t *r) {
                         return chorusAllGatherAsync(a, b, c, ncclFloat32, comm, r);
                     }});
    calls.push_back({"Broadcast", false,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclBroadcast(a, b, c, ncclFloat32, 0, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int, int, chorusRequest_t *r) {
                         return chorusBroadcastAsync(a, b, c, ncclFloat32, 0, comm, r);
                     }});
    calls.push_back({"Bcast", false,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclBcast(b, c, ncclFloat32, 0, comm, nullptr);
                     },
                     nullptr});
    calls.push_back({"Reduce", false,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclReduce(a, b, c, ncclFloat32, ncclSum, 0, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int, int, chorusRequest_t *r) {
                         return chorusReduceAsync(a, b, c, ncclFloat32, ncclSum, 0, comm, r);
                     }});
    calls.push_back({"AlltoAll", true,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclAlltoAll(a, b, c, ncclFloat32, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int, int, chorusRequest_t *r) {
                         return chorusAlltoAllAsync(a, b, c, ncclFloat32, comm, r);
                     }});
    calls.push_back({"Gather", true,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclGather(a, b, c, ncclFloat32, 0, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int, int, chorusRequest_t *r) {
                         return chorusGatherAsync(a, b, c, ncclFloat32, 0, comm, r);
                     }});
    calls.push_back({"Scatter", true,
                     [=](size_t c, ncclComm_t comm, int, int) {
                         return ncclScatter(a, b, c, ncclFloat32, 0, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int, int, chorusRequest_t *r) {
                         return chorusScatterAsync(a, b, c, ncclFloat32, 0, comm, r);
                     }});
    calls.push_back({"Send", false,
                     [=](size_t c, ncclComm_t comm, int rank, int n) {
                         return ncclSend(a, c, ncclFloat32, (rank + 1) % n, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int rank, int n, chorusRequest_t *r) {
                         return chorusSendAsync(a, c, ncclFloat32, (rank + 1) % n, comm, r);
                     }});
    calls.push_back({"Recv", false,
                     [=](size_t c, ncclComm_t comm, int rank, int n) {
                         return ncclRecv(b, c, ncclFloat32, (rank + n - 1) % n, comm, nullptr);
                     },
                     [=](size_t c, ncclComm_t comm, int rank, int n, chorusRequest_t *r) {
                         return chorusRecvAsync(b, c, ncclFloat32, (rank + n - 1) % n, comm, r);
                     }});
    return calls;
}

int check_overflows(int rank, int n, ncclComm_t comm) {
    std::vector<float> a(64, 1.0f), b(64 * n, 0.0f);
    std::vector<size_t> counts = {SIZE_MAX, (size_t)1 << 62 /* x 4 bytes wraps to 0 */,
                                  SIZE_MAX / 4 + 1 /* x 4 bytes wraps to 0 as well */};
    for (const Call &c : all_calls(a.data(), b.data())) {
        std::vector<size_t> cs = counts;
        // count x nranks overflows although count x 4 bytes alone would not, for n >= 2.
        if (c.scaled && n > 1) cs.push_back(SIZE_MAX / n + 1);
        for (size_t count : cs) {
            ncclResult_t r = c.blocking(count, comm, rank, n);
            RANK_CHECK(r == ncclInvalidArgument, "rank %d: nccl%s count %zu returned %s", rank,
                       c.name, count, ncclGetErrorString(r));
            // Inside a group: the call and ncclGroupEnd both report it.
            RANK_NCCL(ncclGroupStart());
            r = c.blocking(count, comm, rank, n);
            ncclResult_t r_end = ncclGroupEnd();
            RANK_CHECK(r == ncclInvalidArgument && r_end == ncclInvalidArgument,
                       "rank %d: grouped nccl%s count %zu returned %s, ncclGroupEnd %s", rank,
                       c.name, count, ncclGetErrorString(r), ncclGetErrorString(r_end));
            if (c.async) {
                chorusRequest_t req = nullptr;
                r = c.async(count, comm, rank, n, &req);
                RANK_CHECK(r == ncclInvalidArgument && req == nullptr,
                           "rank %d: chorus%sAsync count %zu returned %s", rank, c.name, count,
                           ncclGetErrorString(r));
            }
        }
    }
    return 0;
}

} // namespace

class CollCountOverflow : public ::testing::TestWithParam<std::tuple<int, Launch>> {};

TEST_P(CollCountOverflow, InvalidArgumentAndCommStillWorks) {
    const int n = std::get<0>(GetParam());
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(std::get<1>(GetParam()), n, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        if (check_overflows(rank, nr, comm) != 0) return 1;
        // The communicator still works and gives the right sum.
        std::vector<float> a(1000), b(1000, -1.0f);
        for (size_t i = 0; i < a.size(); i++) a[i] = (float)(rank + 1) * (float)i;
        RANK_NCCL(ncclAllReduce(a.data(), b.data(), a.size(), ncclFloat32, ncclSum, comm, nullptr));
        const float ranks_sum = (float)(nr * (nr + 1) / 2);
        for (size_t i = 0; i < b.size(); i++)
            RANK_CHECK(b[i] == ranks_sum * (float)i, "rank %d: b[%zu] = %f, expected %f", rank, i,
                       b[i], ranks_sum * (float)i);
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    }, 120);
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Coll, CollCountOverflow,
                         ::testing::Values(std::make_tuple(1, Launch::Threads),
                                           std::make_tuple(2, Launch::Threads),
                                           std::make_tuple(3, Launch::Threads),
                                           std::make_tuple(2, Launch::Forked)),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    chorus_test::launch_name(std::get<1>(info.param));
                         });

// The WARN names the call, the count and the datatype.
TEST(CollCountOverflow, WarnNamesCallCountAndType) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(1, [&](int rank, int nr) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
        std::vector<float> a(4), b(4);
        const size_t count = (size_t)1 << 62;
        RANK_CHECK(ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclSum, comm, nullptr) ==
                       ncclInvalidArgument, "2^62 floats accepted");
        std::string msg = ncclGetLastError(comm);
        RANK_CHECK(msg.find("ncclAllReduce") != std::string::npos &&
                       msg.find(std::to_string(count)) != std::string::npos &&
                       msg.find("float") != std::string::npos,
                   "message: %s", msg.c_str());
        // 2^63 bytes fit a size_t but no buffer can be that large.
        RANK_CHECK(ncclAllGather(a.data(), b.data(), SIZE_MAX / 2 + 1, ncclInt8, comm, nullptr) ==
                       ncclInvalidArgument, "2^63 bytes accepted");
        // A buffer whose end wraps the address space, with a count whose bytes fit.
        const size_t big = (size_t)1 << 40;
        char *near_top = (char *)(UINTPTR_MAX - 1024);
        RANK_CHECK(ncclAllReduce(near_top, near_top, big, ncclInt8, ncclSum, comm, nullptr) ==
                       ncclInvalidArgument, "wrapping buffer accepted");
        msg = ncclGetLastError(comm);
        RANK_CHECK(msg.find("address space") != std::string::npos, "message: %s", msg.c_str());
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    }, 60);
    EXPECT_TRUE(res.ok()) << res.detail;
}
