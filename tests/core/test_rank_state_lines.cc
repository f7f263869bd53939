// test_rank_state_lines.cc: the per-rank state that every op writes sits on cache lines of its
// own (chorus_calloc_lines, core.h). Ranks that are threads of one process (ncclCommInitAll)
// allocate their communicators, engines, counters and connections next to each other; when two
// ranks wrote one line, a 2-thread 8-byte all-reduce took twice as long as between processes.
// Timing is left to perf/ (all_reduce_perf -t 2 against chorusrun -n 2); this checks the layout:
// each of those blocks starts on a line, so no two ranks' blocks can share one.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "nccl.h"
extern "C" { // internal headers are C without extern "C" guards
#include "coll_internal.h"
#include "comm.h"
}

namespace {

bool on_line(const void *p) { return p != nullptr && (uintptr_t)p % 64 == 0; }

TEST(RankStateLines, InitAllRanksDoNotShareLines) {
    const int n = 3;
    std::vector<ncclComm_t> comms(n);
    ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
    // One all-reduce from one thread per rank connects the point-to-point pairs (lazily).
    std::vector<float> bufs(n * 2, 1.0f);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; r++)
        ASSERT_EQ(ncclAllReduce(&bufs[2 * r], &bufs[2 * r], 2, ncclFloat, ncclSum, comms[r],
                                nullptr),
                  ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < n; r++) EXPECT_EQ(bufs[2 * r], (float)n) << "rank " << r;
    for (int r = 0; r < n; r++) {
        ncclComm_t c = comms[r];
        EXPECT_TRUE(on_line(c)) << "rank " << r << ": communicator at " << (void *)c;
        ASSERT_NE(c->engine, nullptr);
        EXPECT_TRUE(on_line(c->engine)) << "rank " << r << ": engine at " << (void *)c->engine;
        EXPECT_TRUE(on_line(c->engine->p2p_send_issued))
            << "rank " << r << ": transfer counters at " << (void *)c->engine->p2p_send_issued;
        for (int p = 0; p < n; p++) {
            if (p == r) continue;
            ASSERT_NE(c->p2p_send[p], nullptr) << "rank " << r << " to " << p;
            ASSERT_NE(c->p2p_recv[p], nullptr) << "rank " << r << " from " << p;
            EXPECT_TRUE(on_line(c->p2p_send[p])) << "rank " << r << ": connection to " << p;
            EXPECT_TRUE(on_line(c->p2p_recv[p])) << "rank " << r << ": connection from " << p;
            EXPECT_TRUE(on_line(c->p2p_send[p]->priv))
                << "rank " << r << ": transport state of the connection to " << p << " ("
                << c->p2p_send[p]->desc << ")";
        }
    }
    for (int r = 0; r < n; r++) EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
}

} // namespace
