// transport_transfer.h: drive point-to-point transfers over transport connections and check them.
//
// One rank function for every transfer test: it builds a test communicator, connects every edge
// of the plan that touches this rank (all ranks walk the edges in the same order, so the pairwise
// blocking connects cannot deadlock), then drives all its connections at once from one loop, the
// way the progress engine does: nonblocking calls, a waiter only when nothing moved. Every message
// is split into slot-sized chunks (or sent as one direct chunk when the connection offers single
// copy and the message reaches its threshold) and every received byte is checked against the
// pattern of (src, dst, message, offset).
//
// Failure injection: one rank can SIGKILL itself or close its connections cleanly after a number
// of messages; the survivors must then get ncclRemoteError that names it, before the deadline.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "launch.h"
#include "transport_fixture.h"

namespace chorus_test {

// The parameter of the tests that run over every host transport in both launch modes (ranks as
// threads, ranks as forked processes), its values, and its test names ("shm_threads", ...).
using TransportLaunch = std::tuple<std::string, Launch>;
inline auto transport_launch_values() {
    return ::testing::Combine(::testing::Values("shm", "ib", "tcp"),
                              ::testing::Values(Launch::Threads, Launch::Forked));
}
inline std::string transport_launch_name(const ::testing::TestParamInfo<TransportLaunch> &info) {
    return std::get<0>(info.param) + "_" + launch_name(std::get<1>(info.param));
}

struct TransferPlan {
    std::vector<std::pair<int, int>> edges; // (src, dst), in the order every rank connects them
    std::vector<size_t> sizes;              // messages sent on every edge, in order
    int channel = -1;                       // -1: point-to-point connections; else this channel
    bool use_direct = true;                 // send_commit_direct when the connection offers it
    bool copy_out = false;                  // receiver: recv_copy odd messages instead of reading
                                            // the slot in place
    std::string expect_desc;                // when set, every connection's desc must equal it
    std::string expect_desc_alt;            // ... or this one
    std::string expect_desc_prefix;         // when set, every connection's desc must start so
    // Failure injection.
    enum class Fail { None, Kill, Close };
    Fail fail = Fail::None;
    int fail_rank = -1;
    size_t fail_after = 0; // messages (sent + received) the failing rank completes first
};

// Edges of common shapes.
std::vector<std::pair<int, int>> ring_edges(int nranks);        // r -> r+1
std::vector<std::pair<int, int>> all_pair_edges(int nranks);    // every ordered pair
std::vector<std::pair<int, int>> both_ways_edges(int a, int b); // a -> b and b -> a

// The rank function: 0 on success (and, for survivors of an injected failure, when the expected
// ncclRemoteError naming the failed rank arrived), else 1 with a message on stderr.
int transfer_rank(const chorus_unique_id_t &id, int rank, int nranks, const TransferPlan &plan);

// Ping-pong: rank 0 sends each message to rank 1, which checks it and sends it back; rank 0
// checks the echo. `rounds` round trips per size. Exercises empty pipelines and wake-ups (every
// message waits for the previous one), where streaming tests keep the slots full.
int pingpong_rank(const chorus_unique_id_t &id, int rank, int nranks,
                  const std::vector<size_t> &sizes, int rounds);

} // namespace chorus_test
