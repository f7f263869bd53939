// coll_runs.h: whole runs that the algorithm tests (test_coll_tree.cc, test_coll_hier.cc) share:
// a rank killed in the middle of all-reduces, a group of many all-reduces, and the bitwise
// comparison of every rank's result. The caller sets the environment (CHORUS_ALGO, hosts,
// transport, CHORUS_TIMEOUT) first.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "launch.h"

namespace coll_test {

// What run_with_a_death saw.
struct DeathRun {
    chorus_test::RunResult res;
    int named = 0; // survivors whose error named the dead rank
};

// n forked ranks run blocking float32 sum all-reduces of count elements until one fails; rank
// `victim` kills itself (SIGKILL) before its all-reduce number kill_at. Every survivor must fail
// with ncclRemoteError or ncclSystemError and a message naming a peer: the dead rank, or another
// rank that relayed the failure; those naming the dead rank are counted.
DeathRun run_with_a_death(int n, int victim, int kill_at, size_t count, double timeout_s = 90);

// What every such run must show: no deadline passed, and the victim alone failed, killed.
void expect_only_the_victim_died(const DeathRun &d, int victim);

// n thread ranks run one group of in-place int32 sum all-reduces, op o of sizes[o] elements, and
// check every element of every op against the sum.
chorus_test::RunResult run_group_of_allreduces(int n, const std::vector<size_t> &sizes);

// outs[r]: rank r's float32 all-reduce (sum) of order_sensitive_value inputs over outs.size()
// ranks. Every stride-th element is close to the exact sum, and every rank has rank 0's bits.
void expect_sum_and_same_bits(const std::vector<std::vector<float>> &outs, size_t stride,
                              const std::string &what);

} // namespace coll_test
