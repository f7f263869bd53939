// launch.h: run a function as N ranks, either as threads of this process or as forked processes.
//
// A rank function returns 0 on success and non-zero on failure; it must not use gtest macros
// (a forked child reports only through its exit status). Use RANK_CHECK to fail with a message.
// The parent waits against a deadline and kills stragglers, so a hung rank fails the test instead
// of hanging ctest.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "nccl.h"

namespace chorus_test {

enum class Launch { Threads, Forked };
inline const char *launch_name(Launch l) { return l == Launch::Threads ? "threads" : "forked"; }

using RankFn = std::function<int(int rank, int nranks)>;

struct RunResult {
    int failed = 0;         // ranks that returned non-zero, crashed, or were killed
    bool timed_out = false; // the deadline passed and stragglers were killed
    std::string detail;     // one line per failed rank: "rank 2: exit 1", "rank 3: signal 9"
    bool ok() const { return failed == 0 && !timed_out; }
};

// Run fn(rank, nranks) on nranks ranks; wait at most timeout_s seconds.
RunResult run_ranks(Launch how, int nranks, const RankFn &fn, double timeout_s = 120);
RunResult run_threads(int nranks, const RankFn &fn, double timeout_s = 120);
RunResult run_forked(int nranks, const RankFn &fn, double timeout_s = 120);

// Seconds on the monotonic clock (for the deadlines tests check).
double now_s();

// A unique id made in the parent before launching (so forked children share it).
ncclUniqueId make_unique_id();

// Files in /dev/shm whose names contain "chorus" (leak checks).
std::vector<std::string> shm_leftovers();

// A free TCP port for a fixed root address, taken below the kernel's ephemeral range (0 if none
// was found). A port from that range (what bind to port 0 returns) can be taken at any moment as
// the local port of an outgoing connection of a test running beside this one (ctest -j2): rank 0
// then cannot bind it (EADDRINUSE until CHORUS_TIMEOUT), or a rank knocking before the root
// listens connects to itself.
int free_tcp_port();

} // namespace chorus_test

#define RANK_CHECK(cond, ...)                                                                     \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "%s:%d: rank check failed: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

#define RANK_NCCL(call)                                                                           \
    do {                                                                                          \
        ncclResult_t r_ = (call);                                                                 \
        if (r_ != ncclSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,                  \
                    ncclGetErrorString(r_), ncclGetLastError(NULL));                              \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)
