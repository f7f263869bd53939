// test_params.cc: the parameter table (src/core/param.c): spellings, precedence, integer syntax,
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
    for (auto &c : ok) {
        set("CHORUS_SPIN", c.text);
        ASSERT_EQ(chorus_param_init(), ncclSuccess) << c.text;
        EXPECT_EQ(chorus_param_int(PARAM_SPIN), c.value) << c.text;
    }
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
