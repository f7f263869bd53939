// test_symbols.cc: what libnccl.so.2 exports. Exactly the NCCL 2.28 API list, each as a
// weak nccl* symbol with a strong pnccl* alias, plus the chorus* extensions declared in the
// installed chorus headers, and nothing else (no internal helper leaks out).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

const char *kApi[] = {"AllGather",
                      "AllReduce",
                      "AlltoAll",
                      "Bcast",
                      "Broadcast",
                      "CommAbort",
                      "CommCount",
                      "CommCuDevice",
                      "CommDeregister",
                      "CommDestroy",
                      "CommFinalize",
                      "CommGetAsyncError",
                      "CommInitAll",
                      "CommInitRank",
                      "CommInitRankConfig",
                      "CommInitRankScalable",
                      "CommRegister",
                      "CommRevoke",
                      "CommShrink",
                      "CommSplit",
                      "CommUserRank",
                      "CommWindowDeregister",
                      "CommWindowRegister",
                      "Gather",
                      "GetErrorString",
                      "GetLastError",
                      "GetUniqueId",
                      "GetVersion",
                      "GroupEnd",
                      "GroupSimulateEnd",
                      "GroupStart",
                      "MemAlloc",
                      "MemFree",
                      "Recv",
                      "RedOpCreatePreMulSum",
                      "RedOpDestroy",
                      "Reduce",
                      "ReduceScatter",
                      "ResetDebugInit",
                      "Scatter",
                      "Send"};

// name -> nm type letter, for the defined dynamic symbols of a library.
std::map<std::string, char> exported(const std::string &lib) {
    std::map<std::string, char> out;
    std::string cmd = "nm -D --defined-only '" + lib + "' 2>/dev/null";
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) return out;
    char line[512];
    while (fgets(line, sizeof(line), p)) {
        std::istringstream ss(line);
        std::string addr, type, name;
        if (!(ss >> addr >> type >> name)) continue;
        auto at = name.find('@'); // strip symbol versions, if any
        if (at != std::string::npos) name = name.substr(0, at);
        out[name] = type[0];
    }
    pclose(p);
    return out;
}

// chorus* functions declared in a header.
std::set<std::string> declared(const std::string &path) {
    std::set<std::string> out;
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    std::regex re("\\b(chorus[A-Z][A-Za-z0-9_]*)\\s*\\(");
    for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
        out.insert((*it)[1]);
    return out;
}

TEST(Symbols, ExactlyTheApi) {
    std::string lib = std::string(CHORUS_BINARY_DIR) + "/lib/libnccl.so.2";
    auto syms = exported(lib);
    ASSERT_FALSE(syms.empty()) << "nm found nothing in " << lib;

    std::set<std::string> chorus_required =
        declared(std::string(CHORUS_SOURCE_DIR) + "/include/chorus.h");
    ASSERT_FALSE(chorus_required.empty());
    std::set<std::string> chorus_allowed = chorus_required;
    for (const char *h : {"/include/chorus_ddp.h"}) {
        auto more = declared(std::string(CHORUS_SOURCE_DIR) + h);
        chorus_allowed.insert(more.begin(), more.end());
    }

    std::set<std::string> expected;
    for (const char *f : kApi) {
        std::string n = std::string("nccl") + f, p = std::string("pnccl") + f;
        expected.insert(n);
        expected.insert(p);
        auto a = syms.find(n), b = syms.find(p);
        EXPECT_TRUE(a != syms.end()) << n << " is not exported";
        EXPECT_TRUE(b != syms.end()) << p << " is not exported";
        if (a != syms.end()) EXPECT_EQ(a->second, 'W') << n << " should be weak";
        if (b != syms.end()) EXPECT_EQ(b->second, 'T') << p << " should be strong";
    }
    for (const auto &c : chorus_required)
        EXPECT_TRUE(syms.count(c)) << c << " (include/chorus.h) is not exported";
    for (const auto &s : syms) {
        const std::string &name = s.first;
        bool ok = expected.count(name) || chorus_allowed.count(name);
        EXPECT_TRUE(ok) << "unexpected export: " << name << " (" << s.second << ")";
    }
}

} // namespace
