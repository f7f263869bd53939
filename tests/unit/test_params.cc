// test_params.cc: the parameter table (src/base/param.c): spellings, precedence, integer syntax,
// malformed values, reset, and the introspection that chorus_info and the README table use.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "nccl.h"
extern "C" { // internal headers are C without extern "C" guards
#include "param.h"
}

namespace {

// Sets variables for one test and restores the environment and the parsed table afterwards.
class ParamEnv : public ::testing::Test {
  protected:
    void set(const char *name, const char *value) {
        if (saved_.count(name) == 0) {
            const char *old = getenv(name);
            saved_[name] =
                old ? std::make_pair(true, std::string(old)) : std::make_pair(false, std::string());
        }
        setenv(name, value, 1);
        chorus_param_reset();
    }
    void unset(const char *name) {
        if (saved_.count(name) == 0) {
            const char *old = getenv(name);
            saved_[name] =
                old ? std::make_pair(true, std::string(old)) : std::make_pair(false, std::string());
        }
        unsetenv(name);
        chorus_param_reset();
    }
    void TearDown() override {
        for (auto &s : saved_) {
            if (s.second.first)
                setenv(s.first.c_str(), s.second.second.c_str(), 1);
            else
                unsetenv(s.first.c_str());
        }
        ncclResetDebugInit();
    }
    std::map<std::string, std::pair<bool, std::string>> saved_;
};

TEST_F(ParamEnv, DefaultsAndSources) {
    unset("CHORUS_NSLOTS");
    ASSERT_EQ(chorus_param_init(), ncclSuccess);
    EXPECT_EQ(chorus_param_int(PARAM_NSLOTS), 8);
    EXPECT_EQ(chorus_param_source(PARAM_NSLOTS), PARAM_SRC_DEFAULT);
    unset("CHORUS_CONNECT");
    EXPECT_STREQ(chorus_param_str(PARAM_CONNECT), "lazy");
    unset("CHORUS_COMM_ID");
    unset("NCCL_COMM_ID");
    EXPECT_EQ(chorus_param_str(PARAM_COMM_ID), nullptr);
}

TEST_F(ParamEnv, ChorusSpellingWinsOverNccl) {
    set("NCCL_BUFFSIZE", "1M");
    unset("CHORUS_BUFFSIZE");
    EXPECT_EQ(chorus_param_int(PARAM_BUFFSIZE), 1 << 20);
    EXPECT_EQ(chorus_param_source(PARAM_BUFFSIZE), PARAM_SRC_ENV_NCCL);
    set("CHORUS_BUFFSIZE", "65536");
    EXPECT_EQ(chorus_param_int(PARAM_BUFFSIZE), 65536);
    EXPECT_EQ(chorus_param_source(PARAM_BUFFSIZE), PARAM_SRC_ENV_CHORUS);
}

TEST_F(ParamEnv, NcclSpellingOnlyWhereNcclHasTheKnob) {
    // CHORUS_NSLOTS has no NCCL twin: NCCL_NSLOTS is ignored.
    ASSERT_FALSE(chorus_param_has_nccl_alias(PARAM_NSLOTS));
    unset("CHORUS_NSLOTS");
    set("NCCL_NSLOTS", "3");
    EXPECT_EQ(chorus_param_int(PARAM_NSLOTS), 8);
    EXPECT_EQ(chorus_param_source(PARAM_NSLOTS), PARAM_SRC_DEFAULT);
}

TEST_F(ParamEnv, IntegerSyntax) {
    struct {
        const char *text;
        int64_t value;
    } ok[] = {{"0", 0},     {"17", 17},   {" 42 ", 42},    {"-1", -1},        {"0x10", 16},
              {"4k", 4096}, {"2K", 2048}, {"3m", 3 << 20}, {"1G", 1LL << 30}, {"8KB", 8192}};
    // A parameter whose range holds every value above (-1..no limit).
    for (auto &c : ok) {
        set("CHORUS_SHM_CMA_THRESHOLD", c.text);
        ASSERT_EQ(chorus_param_init(), ncclSuccess) << c.text;
        EXPECT_EQ(chorus_param_int(PARAM_SHM_CMA_THRESHOLD), c.value) << c.text;
    }
}

// What a failed parse must say: the variable, the value as given, and (where named) the range.
static void expect_rejected(const char *var, const char *value, const char *range) {
    EXPECT_EQ(chorus_param_init(), ncclInvalidArgument) << var << "=" << value;
    const char *msg = ncclGetLastError(nullptr);
    EXPECT_NE(strstr(msg, var), nullptr) << msg;
    EXPECT_NE(strstr(msg, value), nullptr) << msg;
    if (range) EXPECT_NE(strstr(msg, range), nullptr) << msg;
}

TEST_F(ParamEnv, SuffixOverflowIsAnError) {
    // 17179869184 x 2^30 = 2^64: it wrapped to 0 before.
    set("CHORUS_TIMEOUT", "17179869184g");
    expect_rejected("CHORUS_TIMEOUT", "17179869184g", "64 bits");
    EXPECT_EQ(chorus_param_int(PARAM_TIMEOUT), 300) << "the default stays in place";
    // A negative size: -4194304 before.
    set("CHORUS_TIMEOUT", "-4m");
    expect_rejected("CHORUS_TIMEOUT", "-4m", "non-negative");
    // The largest value a suffix reaches, and one more.
    unset("CHORUS_TIMEOUT");
    set("CHORUS_SHM_CMA_THRESHOLD", "8589934591g");
    ASSERT_EQ(chorus_param_init(), ncclSuccess);
    EXPECT_EQ(chorus_param_int(PARAM_SHM_CMA_THRESHOLD), (int64_t)8589934591 << 30);
    set("CHORUS_SHM_CMA_THRESHOLD", "8589934592g");
    expect_rejected("CHORUS_SHM_CMA_THRESHOLD", "8589934592g", "64 bits");
    set("CHORUS_SHM_CMA_THRESHOLD", "9223372036854775807");
    ASSERT_EQ(chorus_param_init(), ncclSuccess);
    set("CHORUS_SHM_CMA_THRESHOLD", "9223372036854775808");
    expect_rejected("CHORUS_SHM_CMA_THRESHOLD", "9223372036854775808", "64 bits");
}

TEST_F(ParamEnv, TimeoutMustBePositive) {
    for (const char *bad : {"0", "-5", "-1"}) {
        set("CHORUS_TIMEOUT", bad);
        expect_rejected("CHORUS_TIMEOUT", bad, "1..31536000");
        EXPECT_EQ(chorus_param_int(PARAM_TIMEOUT), 300);
    }
    set("CHORUS_TIMEOUT", "1");
    ASSERT_EQ(chorus_param_init(), ncclSuccess);
    EXPECT_EQ(chorus_param_int(PARAM_TIMEOUT), 1);
}

TEST_F(ParamEnv, ChannelCountsOutOfRange) {
    for (const char *bad : {"0", "100000", "-1", "33"}) {
        set("NCCL_MAX_NCHANNELS", bad);
        expect_rejected("NCCL_MAX_NCHANNELS", bad, "1..32");
    }
    unset("NCCL_MAX_NCHANNELS");
    set("CHORUS_MIN_NCHANNELS", "0");
    expect_rejected("CHORUS_MIN_NCHANNELS", "0", "1..32");
}

// Slot geometry is checked when the parameters are read, so communicator init fails (before, the
// first collective did).
TEST_F(ParamEnv, SlotGeometryFailsInit) {
    unset("NCCL_BUFFSIZE");
    unset("CHORUS_BUFFSIZE");
    unset("CHORUS_NSLOTS");
    ASSERT_EQ(chorus_param_init(), ncclSuccess);
    // A one-rank communicator needs no bootstrap root.
    auto init_one = []() {
        ncclComm_t comm = nullptr;
        ncclResult_t r = ncclCommInitAll(&comm, 1, nullptr);
        if (r == ncclSuccess) ncclCommDestroy(comm);
        return r;
    };
    ASSERT_EQ(init_one(), ncclSuccess);
    struct Case {
        const char *var, *value, *says;
    } cases[] = {{"CHORUS_NSLOTS", "0", "1..1024"},
                 {"CHORUS_NSLOTS", "2000", "1..1024"},
                 {"NCCL_BUFFSIZE", "100", "4096..1073741824"},
                 {"NCCL_BUFFSIZE", "2g", "4096..1073741824"}};
    for (auto &c : cases) {
        set(c.var, c.value);
        expect_rejected(c.var, c.value, c.says);
        EXPECT_EQ(init_one(), ncclInvalidArgument) << c.var << "=" << c.value;
        unset(c.var);
    }
    // Each in range, but fewer than 64 bytes per slot.
    set("NCCL_BUFFSIZE", "4096");
    set("CHORUS_NSLOTS", "128");
    EXPECT_EQ(chorus_param_init(), ncclInvalidArgument);
    const char *msg = ncclGetLastError(nullptr);
    EXPECT_NE(strstr(msg, "NCCL_BUFFSIZE=4096"), nullptr) << msg;
    EXPECT_NE(strstr(msg, "CHORUS_NSLOTS=128"), nullptr) << msg;
    EXPECT_EQ(init_one(), ncclInvalidArgument);
    set("CHORUS_NSLOTS", "64");
    EXPECT_EQ(chorus_param_init(), ncclSuccess);
}

// Every INT parameter has a range, and the range's ends are exactly where values stop being
// accepted: min - 1 and max + 1 fail naming the variable, the value and the range; min and max
// are taken as given.
TEST_F(ParamEnv, RangeSweep) {
    int swept = 0;
    for (int i = 0; i < PARAM_COUNT; i++) {
        auto id = (chorus_param_id_t)i;
        int64_t lo = 0, hi = 0;
        if (!chorus_param_is_int(id)) {
            EXPECT_EQ(chorus_param_range(id, &lo, &hi), 0) << chorus_param_name(id);
            continue;
        }
        ASSERT_EQ(chorus_param_range(id, &lo, &hi), 1)
            << "CHORUS_" << chorus_param_name(id) << " has no PARAM_RANGE row in param_table.h";
        ASSERT_LE(lo, hi) << chorus_param_name(id);
        char buf[64];
        int64_t def = strtoll(chorus_param_default_text(id, buf, sizeof(buf)), nullptr, 10);
        EXPECT_TRUE(def >= lo && def <= hi) << chorus_param_name(id) << ": default " << def
                                            << " outside " << lo << ".." << hi;
        std::string var = std::string("CHORUS_") + chorus_param_name(id);
        // BUFFSIZE and NSLOTS are also checked as a pair; keep the other one at a value that
        // holds every end of this one's range.
        if (id == PARAM_BUFFSIZE) set("CHORUS_NSLOTS", "1");
        if (id == PARAM_NSLOTS) set("CHORUS_BUFFSIZE", "1g");
        for (int64_t v : {lo, hi}) {
            std::string text = std::to_string(v);
            set(var.c_str(), text.c_str());
            EXPECT_EQ(chorus_param_init(), ncclSuccess) << var << "=" << text << ": "
                                                        << ncclGetLastError(nullptr);
            EXPECT_EQ(chorus_param_int(id), v) << var;
        }
        std::string range = hi == INT64_MAX ? std::to_string(lo) + " or more"
                                            : std::to_string(lo) + ".." + std::to_string(hi);
        if (lo > INT64_MIN) {
            std::string text = std::to_string(lo - 1);
            set(var.c_str(), text.c_str());
            expect_rejected(var.c_str(), text.c_str(), range.c_str());
            EXPECT_EQ(chorus_param_int(id), def) << var << ": the default stays in place";
        }
        if (hi < INT64_MAX) {
            std::string text = std::to_string(hi + 1);
            set(var.c_str(), text.c_str());
            expect_rejected(var.c_str(), text.c_str(), range.c_str());
            EXPECT_EQ(chorus_param_int(id), def) << var;
        }
        unset(var.c_str());
        unset("CHORUS_NSLOTS");
        unset("CHORUS_BUFFSIZE");
        swept++;
    }
    EXPECT_GE(swept, 30);
}

TEST_F(ParamEnv, MalformedValueFailsNamingTheVariable) {
    for (const char *bad : {"", "abc", "12x", "1.5", "0x", "4 k"}) {
        set("CHORUS_TIMEOUT", bad);
        EXPECT_EQ(chorus_param_init(), ncclInvalidArgument) << "'" << bad << "'";
        EXPECT_NE(strstr(ncclGetLastError(nullptr), "CHORUS_TIMEOUT"), nullptr)
            << ncclGetLastError(nullptr);
        EXPECT_EQ(chorus_param_int(PARAM_TIMEOUT), 300) << "the default stays in place";
    }
    // The public API fails the same way.
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclInvalidArgument);
    set("CHORUS_TIMEOUT", "7");
    EXPECT_EQ(chorus_param_init(), ncclSuccess);
    EXPECT_EQ(chorus_param_int(PARAM_TIMEOUT), 7);
}

TEST_F(ParamEnv, StringsAreCopies) {
    set("CHORUS_TRANSPORT", "tcp");
    ASSERT_EQ(chorus_param_init(), ncclSuccess);
    const char *v = chorus_param_str(PARAM_TRANSPORT);
    ASSERT_NE(v, nullptr);
    setenv("CHORUS_TRANSPORT", "shm-with-a-much-longer-value", 1); // no reset: value unchanged
    EXPECT_STREQ(chorus_param_str(PARAM_TRANSPORT), "tcp");
    chorus_param_reset();
    EXPECT_STREQ(chorus_param_str(PARAM_TRANSPORT), "shm-with-a-much-longer-value");
}

TEST(ParamTable, Introspection) {
    std::set<std::string> names;
    char buf[256];
    for (int i = 0; i < PARAM_COUNT; i++) {
        auto id = (chorus_param_id_t)i;
        std::string n = chorus_param_name(id);
        EXPECT_FALSE(n.empty());
        EXPECT_TRUE(names.insert(n).second) << "duplicate parameter " << n;
        for (char c : n)
            EXPECT_TRUE((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_') << n;
        EXPECT_GT(strlen(chorus_param_help(id)), 5u) << n;
        EXPECT_NE(chorus_param_value_text(id, buf, sizeof(buf)), nullptr);
        EXPECT_NE(chorus_param_default_text(id, buf, sizeof(buf)), nullptr);
    }
    // The knobs the design names as NCCL aliases are aliases.
    for (auto id :
         {PARAM_DEBUG, PARAM_DEBUG_SUBSYS, PARAM_DEBUG_FILE, PARAM_SOCKET_IFNAME, PARAM_COMM_ID,
          PARAM_ALGO, PARAM_BUFFSIZE, PARAM_MIN_NCHANNELS, PARAM_MAX_NCHANNELS, PARAM_SHM_DISABLE,
          PARAM_P2P_DISABLE, PARAM_IB_DISABLE, PARAM_IB_HCA, PARAM_NET, PARAM_SOCKET_NTHREADS,
          PARAM_NSOCKS_PERTHREAD, PARAM_COMM_BLOCKING})
        EXPECT_TRUE(chorus_param_has_nccl_alias(id)) << chorus_param_name(id);
    EXPECT_FALSE(chorus_param_has_nccl_alias(PARAM_TIMEOUT));
    EXPECT_STREQ(chorus_param_default_text(PARAM_TIMEOUT, buf, sizeof(buf)), "300");
    EXPECT_STREQ(chorus_param_source_name(PARAM_SRC_DEFAULT), "default");
}

} // namespace
