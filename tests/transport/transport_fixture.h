// transport_fixture.h: a minimal communicator for transport tests, without ncclCommInitRank.
//
// Transport tests exercise src/transport below the core: each rank builds just enough of a
// struct ncclComm (bootstrap, every rank's locality record) for transport_select/connect to work.
// Also: a scoped environment setter (setenv + chorus_param_reset) and the byte pattern every
// transfer test writes and checks, which depends on (src, dst, message, offset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nccl.h" // outside extern "C": it may pull in the CUDA headers, which hold C++ templates

extern "C" {
#include "bootstrap.h"
#include "comm.h"
#include "log.h"
#include "param.h"
#include "transport.h"
}

namespace chorus_test {

// A fresh unique id (starts a bootstrap root thread in this process); call before launching ranks.
chorus_unique_id_t transport_make_id();

// Bootstrap + locality allgather. Returns ncclSuccess or the failing step's result (logged).
ncclResult_t transport_comm_init(const chorus_unique_id_t &id, int rank, int nranks,
                                 ncclComm **comm_p);
void transport_comm_free(ncclComm *comm);

// Set (or, with value == nullptr, unset) environment variables for the scope and re-parse the
// parameters; the old values come back on destruction. Use before launching ranks.
class ScopedEnv {
  public:
    ScopedEnv() = default;
    ScopedEnv(const char *name, const char *value) {
        set(name, value);
    }
    ~ScopedEnv();
    void set(const char *name, const char *value);
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv &operator=(const ScopedEnv &) = delete;

  private:
    struct Saved {
        std::string name;
        bool had;
        std::string value;
    };
    std::vector<Saved> saved_;
};

// Run the verbs transport on the software provider of tests/ibsoft (libchorus_softib.so): sets
// CHORUS_IB_LIBRARY and a short NCCL_IB_TIMEOUT (a peer that stopped answering fails a queue pair
// after 8 tries of 67 ms instead of 34 s, well inside the tests' CHORUS_TIMEOUT).
// With CHORUS_TEST_IB_HARDWARE=1 (perf/ib_check.sh on a machine with an RDMA port) it leaves
// CHORUS_IB_LIBRARY alone, so the same tests run on the real libibverbs.
void use_soft_verbs(ScopedEnv &env);
bool ib_hardware_run();
std::string soft_verbs_library();

// /dev/shm entries made by this transport ("chorus-shm-<pid>-...") that appeared since `before`
// and belong to this process or to a process that is gone (a real leak). Other processes' live
// segments (other tests running at the same time) are not counted.
std::vector<std::string> shm_leaks_since(const std::vector<std::string> &before);

// The test pattern: byte `offset` of message `msg` from rank src to rank dst.
uint64_t pattern_seed(int src, int dst, uint64_t msg);
void pattern_fill(void *buf, uint64_t seed, size_t offset, size_t bytes);
// Returns -1 when buf matches, else the index (from buf) of the first wrong byte.
long long pattern_check(const void *buf, uint64_t seed, size_t offset, size_t bytes);
uint8_t pattern_byte(uint64_t seed, size_t offset);

} // namespace chorus_test
