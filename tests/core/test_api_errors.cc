// test_api_errors.cc: every invalid argument of the core API is ncclInvalidArgument with a WARN
// (the text ncclGetLastError returns names the argument), and nothing crashes; NULL, garbage and
// freed handles are told apart from live ones; a rank that never arrives makes init fail on the
// others within CHORUS_TIMEOUT, naming it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "launch.h"
#include "nccl.h"

namespace {

// The last WARN contains `what`.
::testing::AssertionResult warned(const char *what) {
    const char *e = ncclGetLastError(nullptr);
    if (e && strstr(e, what)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "last error '" << (e ? e : "(null)") << "' does not mention '" << what << "'";
}

// Set an environment variable for one test and re-read the parameters; restore afterwards.
class ScopedEnv {
  public:
    ScopedEnv(const char *name, const char *value) : name_(name) {
        const char *old = getenv(name);
        had_ = old != nullptr;
        if (had_) old_ = old;
        setenv(name, value, 1);
        ncclResetDebugInit();
    }
    ~ScopedEnv() {
        if (had_)
            setenv(name_.c_str(), old_.c_str(), 1);
        else
            unsetenv(name_.c_str());
        ncclResetDebugInit();
    }

  private:
    std::string name_, old_;
    bool had_ = false;
};

// A one-rank communicator shared by the tests of this suite.
class ApiErrors : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        ncclUniqueId id;
        ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
        ASSERT_EQ(ncclCommInitRank(&comm_, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
    }
    static void TearDownTestSuite() {
        EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess);
        comm_ = nullptr;
    }
    static ncclComm_t comm_;
};
ncclComm_t ApiErrors::comm_ = nullptr;

TEST_F(ApiErrors, InitArguments) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t c = nullptr;
    EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument);
    EXPECT_TRUE(warned("comm"));
    EXPECT_EQ(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument);
    EXPECT_TRUE(warned("nranks"));
    EXPECT_EQ(ncclCommInitRank(&c, -3, id, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument);
    EXPECT_TRUE(warned("rank 2"));
    EXPECT_EQ(ncclCommInitRank(&c, 2, id, -1), ncclInvalidArgument);
    ncclUniqueId junk;
    memset(&junk, 0x5a, sizeof(junk));
    EXPECT_EQ(ncclCommInitRank(&c, 1, junk, 0), ncclInvalidArgument);
    EXPECT_TRUE(warned("commId"));
    EXPECT_EQ(c, nullptr);
    EXPECT_EQ(ncclCommInitRankScalable(&c, 1, 0, 0, &id, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommInitRankScalable(&c, 1, 0, 1, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument);
    ncclComm_t cs[2];
    EXPECT_EQ(ncclCommInitAll(cs, 0, nullptr), ncclInvalidArgument);
    int bad[2] = {0, -1};
    EXPECT_EQ(ncclCommInitAll(cs, 2, bad), ncclInvalidArgument);
    EXPECT_TRUE(warned("devlist"));
}

TEST_F(ApiErrors, ConfigRejected) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t c = nullptr;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.magic = 0x12345678;
    EXPECT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument);
    EXPECT_TRUE(warned("NCCL_CONFIG_INITIALIZER"));
    struct {
        const char *field;
        void (*set)(ncclConfig_t *);
    } cases[] = {
        {"blocking", [](ncclConfig_t *c) { c->blocking = 2; }},
        {"minCTAs", [](ncclConfig_t *c) { c->minCTAs = 0; }},
        {"maxCTAs", [](ncclConfig_t *c) { c->maxCTAs = -4; }},
        {"minCTAs",
         [](ncclConfig_t *c) {
             c->minCTAs = 8;
             c->maxCTAs = 2;
         }},
        {"splitShare", [](ncclConfig_t *c) { c->splitShare = 3; }},
        {"cgaClusterSize", [](ncclConfig_t *c) { c->cgaClusterSize = -1; }},
        {"CTAPolicy", [](ncclConfig_t *c) { c->CTAPolicy = 0x40; }},
        {"nChannelsPerNetPeer", [](ncclConfig_t *c) { c->nChannelsPerNetPeer = 65; }},
        {"shrinkShare", [](ncclConfig_t *c) { c->shrinkShare = 9; }},
    };
    for (auto &k : cases) {
        ncclConfig_t b = NCCL_CONFIG_INITIALIZER;
        k.set(&b);
        EXPECT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &b), ncclInvalidArgument) << k.field;
        EXPECT_TRUE(warned(k.field));
    }
    EXPECT_EQ(c, nullptr);
}

// A config from an older, smaller header: only `size` bytes are read, and fields the caller's
// version did not have are ignored, whatever the bytes after them hold.
TEST_F(ApiErrors, OldConfigAccepted) {
    union {
        ncclConfig_t cfg;
        unsigned char raw[sizeof(ncclConfig_t)];
    } u;
    memset(u.raw, 0x7f, sizeof(u.raw)); // garbage everywhere; invalid for every int field
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    // NCCL 2.17's struct ended after netName.
    size_t old_size = offsetof(ncclConfig_t, netName) + sizeof(const char *);
    memcpy(u.raw, &init, old_size);
    u.cfg.size = old_size;
    u.cfg.version = NCCL_VERSION(2, 17, 1);
    u.cfg.blocking = 1;
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &u.cfg), ncclSuccess) << ncclGetLastError(c);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);

    // Version 2.13 had no `blocking`: an invalid value there is ignored (reset to the default).
    ncclConfig_t v13 = NCCL_CONFIG_INITIALIZER;
    v13.version = NCCL_VERSION(2, 13, 4);
    v13.blocking = 7;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ASSERT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &v13), ncclSuccess) << ncclGetLastError(c);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);

    // The same value with version 2.28 is rejected: the test above is not vacuous.
    v13.version = NCCL_VERSION(2, 28, 9);
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT_EQ(ncclCommInitRankConfig(&c, 1, id, 0, &v13), ncclInvalidArgument);
}

// NCCL_COMM_BLOCKING overrides the config, as in NCCL; a malformed value fails init naming it.
TEST_F(ApiErrors, CommBlockingEnvironment) {
    ncclUniqueId id;
    ncclComm_t c = nullptr;
    {
        ScopedEnv env("NCCL_COMM_BLOCKING", "0");
        ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
        ncclResult_t r = ncclCommInitRankConfig(&c, 1, id, 0, nullptr);
        ASSERT_TRUE(r == ncclInProgress || r == ncclSuccess) << r;
        ncclResult_t st = ncclInProgress;
        while (st == ncclInProgress)
            ASSERT_EQ(ncclCommGetAsyncError(c, &st), ncclSuccess);
        EXPECT_EQ(st, ncclSuccess);
        EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
    {
        ScopedEnv env("NCCL_COMM_BLOCKING", "maybe");
        ASSERT_EQ(ncclGetUniqueId(&id), ncclInvalidArgument);
        EXPECT_TRUE(warned("NCCL_COMM_BLOCKING"));
    }
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess); // restored
}

TEST_F(ApiErrors, Handles) {
    int x;
    ncclResult_t st;
    EXPECT_EQ(ncclCommCount(nullptr, &x), ncclInvalidArgument);
    EXPECT_EQ(ncclCommUserRank(nullptr, &x), ncclInvalidArgument);
    EXPECT_EQ(ncclCommCuDevice(nullptr, &x), ncclInvalidArgument);
    EXPECT_EQ(ncclCommGetAsyncError(nullptr, &st), ncclInvalidArgument);
    EXPECT_EQ(ncclCommCount(comm_, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommUserRank(comm_, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommCuDevice(comm_, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommGetAsyncError(comm_, nullptr), ncclInvalidArgument);
    // Garbage: a pointer to memory that is not a communicator, and an unmapped address.
    std::vector<char> junk(4096, 0x11);
    ncclComm_t fake = (ncclComm_t)junk.data();
    EXPECT_EQ(ncclCommCount(fake, &x), ncclInvalidArgument);
    EXPECT_TRUE(warned("not a communicator"));
    EXPECT_EQ(ncclCommCount((ncclComm_t)(uintptr_t)0x10, &x), ncclInvalidArgument);
    EXPECT_EQ(ncclCommDestroy(fake), ncclInvalidArgument);
    EXPECT_EQ(ncclCommAbort(fake), ncclInvalidArgument);
    EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess); // as NCCL
    // A destroyed comm.
    ncclUniqueId id;
    ncclComm_t c;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ASSERT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
    ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
    EXPECT_EQ(ncclCommCount(c, &x), ncclInvalidArgument);
    EXPECT_EQ(ncclCommDestroy(c), ncclInvalidArgument);
    // The live comm still works after all this.
    ASSERT_EQ(ncclCommCount(comm_, &x), ncclSuccess);
    EXPECT_EQ(x, 1);
}

// After ncclCommFinalize or ncclCommRevoke a comm takes no new work (ncclInvalidUsage, with a
// WARN saying why), but it can still be destroyed.
TEST_F(ApiErrors, FinalizedAndRevokedRejectWork) {
    float x[4] = {1, 2, 3, 4};
    for (int revoke = 0; revoke < 2; revoke++) {
        ncclUniqueId id;
        ncclComm_t c, nc;
        ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
        ASSERT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
        ASSERT_EQ(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c, nullptr), ncclSuccess);
        if (revoke) {
            ASSERT_EQ(ncclCommRevoke(c, 0), ncclSuccess);
            EXPECT_EQ(ncclCommRevoke(c, 0), ncclSuccess); // idempotent
        } else {
            ASSERT_EQ(ncclCommFinalize(c), ncclSuccess);
            EXPECT_EQ(ncclCommFinalize(c), ncclInvalidUsage);
        }
        EXPECT_EQ(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, c, nullptr), ncclInvalidUsage);
        EXPECT_TRUE(warned(revoke ? "revoked" : "finalized"));
        EXPECT_EQ(ncclCommSplit(c, 0, 0, &nc, nullptr), ncclInvalidUsage);
        EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
}

TEST_F(ApiErrors, SplitShrinkRevokeArguments) {
    ncclComm_t nc;
    EXPECT_EQ(ncclCommSplit(comm_, 0, 0, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommSplit(comm_, -5, 0, &nc, nullptr), ncclInvalidArgument);
    EXPECT_TRUE(warned("color"));
    EXPECT_EQ(ncclCommSplit(nullptr, 0, 0, &nc, nullptr), ncclInvalidArgument);
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    EXPECT_EQ(ncclCommSplit(comm_, 0, 0, &nc, &bad), ncclInvalidArgument);
    int self = 0, out = 3;
    EXPECT_EQ(ncclCommShrink(comm_, nullptr, 0, nullptr, nullptr, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommShrink(comm_, nullptr, 1, &nc, nullptr, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommShrink(comm_, &self, 1, &nc, nullptr, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommShrink(comm_, &out, -1, &nc, nullptr, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommShrink(comm_, nullptr, 0, &nc, nullptr, 0x10), ncclInvalidArgument);
    EXPECT_TRUE(warned("shrinkFlags"));
    EXPECT_EQ(ncclCommRevoke(comm_, 3), ncclInvalidArgument);
    EXPECT_EQ(ncclCommRevoke(nullptr, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommFinalize(nullptr), ncclInvalidArgument);
    // The comm is still usable: split it for real.
    ASSERT_EQ(ncclCommSplit(comm_, 3, 0, &nc, nullptr), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(nc), ncclSuccess);
}

TEST_F(ApiErrors, ShrinkDuplicateAndOutOfRange) {
    // Needs a comm with more than one rank to reach the list checks past "self".
    ncclComm_t comms[3];
    ASSERT_EQ(ncclCommInitAll(comms, 3, nullptr), ncclSuccess);
    ncclComm_t nc;
    int dup[2] = {2, 2}, range[1] = {3}, neg[1] = {-1};
    EXPECT_EQ(ncclCommShrink(comms[0], dup, 2, &nc, nullptr, 0), ncclInvalidArgument);
    EXPECT_TRUE(warned("twice"));
    EXPECT_EQ(ncclCommShrink(comms[0], range, 1, &nc, nullptr, 0), ncclInvalidArgument);
    EXPECT_TRUE(warned("out of range"));
    EXPECT_EQ(ncclCommShrink(comms[0], neg, 1, &nc, nullptr, 0), ncclInvalidArgument);
    for (auto c : comms)
        EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST_F(ApiErrors, RedOps) {
    ncclRedOp_t op;
    float s = 0.5f;
    EXPECT_EQ(ncclRedOpCreatePreMulSum(nullptr, &s, ncclFloat32, ncclScalarHostImmediate, comm_),
              ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat32, ncclScalarHostImmediate, comm_),
              ncclInvalidArgument);
    EXPECT_TRUE(warned("scalar"));
    EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, &s, (ncclDataType_t)12, ncclScalarHostImmediate, comm_),
              ncclInvalidArgument);
    EXPECT_TRUE(warned("datatype"));
    EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, (ncclScalarResidence_t)2, comm_),
              ncclInvalidArgument);
    EXPECT_TRUE(warned("residence"));
    EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, nullptr),
              ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(ncclSum, comm_), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy((ncclRedOp_t)(ncclNumOps + 40), comm_), ncclInvalidArgument);

    // Valid ops are >= ncclNumOps, distinct, and each can be destroyed exactly once.
    std::vector<ncclRedOp_t> ops;
    for (int i = 0; i < 8; i++) {
        ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, comm_),
                  ncclSuccess);
        EXPECT_GE((int)op, (int)ncclNumOps);
        for (auto o : ops)
            EXPECT_NE(o, op);
        ops.push_back(op);
    }
    for (auto o : ops)
        EXPECT_EQ(ncclRedOpDestroy(o, comm_), ncclSuccess);
    EXPECT_EQ(ncclRedOpDestroy(ops[0], comm_), ncclInvalidArgument);
    // The table is finite: creation eventually fails cleanly, and destroying frees slots.
    ops.clear();
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < 1000 && r == ncclSuccess; i++) {
        r = ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, comm_);
        if (r == ncclSuccess) ops.push_back(op);
    }
    EXPECT_EQ(r, ncclInvalidUsage);
    EXPECT_GE(ops.size(), 16u);
    for (auto o : ops)
        EXPECT_EQ(ncclRedOpDestroy(o, comm_), ncclSuccess);
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarDevice, comm_), ncclSuccess);
    EXPECT_EQ(ncclRedOpDestroy(op, comm_), ncclSuccess);
}

TEST_F(ApiErrors, MemoryAndRegistration) {
    void *p = nullptr;
    EXPECT_EQ(ncclMemAlloc(nullptr, 16), ncclInvalidArgument);
    EXPECT_EQ(ncclMemAlloc(&p, 0), ncclInvalidArgument);
    int local;
    EXPECT_EQ(ncclMemFree(&local), ncclInvalidArgument);
    EXPECT_TRUE(warned("ncclMemAlloc"));
    EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
    ASSERT_EQ(ncclMemAlloc(&p, 10000), ncclSuccess);
    ASSERT_NE(p, nullptr);
    int dev = -1;
    ASSERT_EQ(ncclCommCuDevice(comm_, &dev), ncclSuccess);
    if (dev < 0) { // host memory: page-aligned and writable
        EXPECT_EQ((uintptr_t)p % 4096, 0u);
        memset(p, 0xab, 10000);
    }
    void *h = nullptr;
    EXPECT_EQ(ncclCommRegister(comm_, nullptr, 16, &h), ncclInvalidArgument);
    EXPECT_EQ(ncclCommRegister(comm_, p, 0, &h), ncclInvalidArgument);
    EXPECT_EQ(ncclCommRegister(comm_, p, 16, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommRegister(nullptr, p, 16, &h), ncclInvalidArgument);
    ASSERT_EQ(ncclCommRegister(comm_, p, 10000, &h), ncclSuccess);
    EXPECT_NE(h, nullptr);
    EXPECT_EQ(ncclCommDeregister(comm_, &local), ncclInvalidArgument);
    EXPECT_EQ(ncclCommDeregister(comm_, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclCommDeregister(comm_, h), ncclSuccess);
    EXPECT_EQ(ncclCommDeregister(comm_, h), ncclInvalidArgument);
    ncclWindow_t w = nullptr;
    EXPECT_EQ(ncclCommWindowRegister(comm_, p, 4096, nullptr, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclCommWindowRegister(comm_, p, 4096, &w, 0x100), ncclInvalidArgument);
    EXPECT_TRUE(warned("winFlags"));
    ASSERT_EQ(ncclCommWindowRegister(comm_, p, 4096, &w, NCCL_WIN_COLL_SYMMETRIC), ncclSuccess);
    EXPECT_EQ(ncclCommDeregister(comm_, (void *)w), ncclInvalidArgument); // not a registration
    EXPECT_EQ(ncclCommWindowDeregister(comm_, w), ncclSuccess);
    EXPECT_EQ(ncclCommWindowDeregister(comm_, w), ncclInvalidArgument);
    EXPECT_EQ(ncclMemFree(p), ncclSuccess);
    EXPECT_EQ(ncclMemFree(p), ncclInvalidArgument);
}

// Ranks 0 and 1 of 3 arrive; rank 2 never does. Both fail within the deadline with an error
// naming rank 2, instead of hanging.
TEST(MissingRank, InitFailsNamingIt) {
    ScopedEnv env("CHORUS_TIMEOUT", "3");
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(
        2,
        [&](int rank, int) {
            ncclComm_t c = nullptr;
            ncclResult_t r = ncclCommInitRank(&c, 3, id, rank);
            RANK_CHECK(r != ncclSuccess && r != ncclInProgress, "init succeeded without rank 2");
            RANK_CHECK(c == nullptr, "failed blocking init left a handle");
            const char *e = ncclGetLastError(nullptr);
            RANK_CHECK(strstr(e, "2 of 3") != nullptr, "error does not name rank 2: %s", e);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(MissingRank, ForkedInitFailsNamingIt) {
    ScopedEnv env("CHORUS_TIMEOUT", "3");
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(
        3,
        [&](int rank, int) {
            if (rank == 1) return 0; // never arrives
            ncclComm_t c = nullptr;
            ncclResult_t r = ncclCommInitRank(&c, 3, id, rank);
            RANK_CHECK(r != ncclSuccess, "init succeeded without rank 1");
            const char *e = ncclGetLastError(nullptr);
            RANK_CHECK(strstr(e, "1 of 3") != nullptr, "error does not name rank 1: %s", e);
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// Two processes claim rank 0: one is told so (ncclInvalidArgument); nobody succeeds or hangs.
TEST(DuplicateRank, Rejected) {
    ScopedEnv env("CHORUS_TIMEOUT", "3");
    ncclUniqueId id = chorus_test::make_unique_id();
    std::atomic<int> invalid{0}, ok{0};
    auto res = chorus_test::run_threads(
        2,
        [&](int, int) {
            ncclComm_t c = nullptr;
            ncclResult_t r = ncclCommInitRank(&c, 2, id, 0);
            if (r == ncclInvalidArgument) invalid++;
            if (r == ncclSuccess) ok++;
            return 0;
        },
        60);
    EXPECT_TRUE(res.ok()) << res.detail;
    EXPECT_EQ(ok.load(), 0);
    EXPECT_GE(invalid.load(), 1);
}

// A nonblocking init whose peers never come: ncclInProgress first, then the error.
TEST(Nonblocking, MissingPeerReportedAsync) {
    ScopedEnv env("CHORUS_TIMEOUT", "2");
    ncclUniqueId id = chorus_test::make_unique_id();
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&c, 2, id, 0, &cfg);
    ASSERT_EQ(r, ncclInProgress);
    ASSERT_NE(c, nullptr);
    int n;
    EXPECT_EQ(ncclCommCount(c, &n), ncclSuccess); // queries work during init
    EXPECT_EQ(n, 2);
    ncclComm_t sub;
    EXPECT_EQ(ncclCommSplit(c, 0, 0, &sub, nullptr), ncclInvalidUsage); // not ready yet
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) {
        ASSERT_EQ(ncclCommGetAsyncError(c, &st), ncclSuccess);
        usleep(1000);
    }
    EXPECT_NE(st, ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Abort while a nonblocking init waits for a peer: returns promptly, no hang.
TEST(Nonblocking, AbortDuringInit) {
    ncclUniqueId id = chorus_test::make_unique_id();
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclCommInitRankConfig(&c, 2, id, 1, &cfg), ncclInProgress);
    usleep(100000);
    ncclResult_t st;
    ASSERT_EQ(ncclCommGetAsyncError(c, &st), ncclSuccess);
    EXPECT_EQ(st, ncclInProgress);
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
}

} // namespace
