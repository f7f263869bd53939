// test_symbols.cc: what libnccl.so.2 exports. Exactly the NCCL 2.28 API list and the functions
// NCCL 2.30 added, each as a weak nccl* symbol with a strong pnccl* alias, plus the chorus*
// extensions declared in the installed chorus headers, and nothing else (no internal helper leaks
// out); every name PyTorch 2.x binds (the recorded list) is among them.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "nccl.h"

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
                      "Send",
                      // NCCL 2.30
                      "CommGetUniqueId",
                      "CommGrow",
                      "CommMemStats",
                      "CommResume",
                      "CommSuspend",
                      "DevCommCreate",
                      "DevCommDestroy",
                      "GetLsaMultimemDevicePointer",
                      "GetPeerDevicePointer",
                      "PutSignal",
                      "Signal",
                      "WaitSignal",
                      "WinGetUserPtr"};

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

// The recorded list of nccl* functions PyTorch 2.x binds at load: every one is exported.
TEST(Symbols, TorchImports) {
    std::string lib = std::string(CHORUS_BINARY_DIR) + "/lib/libnccl.so.2";
    auto syms = exported(lib);
    ASSERT_FALSE(syms.empty()) << "nm found nothing in " << lib;
    std::ifstream f(std::string(CHORUS_SOURCE_DIR) + "/tests/core/torch_nccl_symbols.txt");
    ASSERT_TRUE(f.good()) << "tests/core/torch_nccl_symbols.txt is missing";
    std::string line;
    int n = 0;
    while (std::getline(f, line)) {
        if (line.empty() || line[0] == '#') continue;
        n++;
        EXPECT_TRUE(syms.count(line)) << line << " (torch imports it) is not exported";
    }
    EXPECT_GE(n, 50) << "the recorded list looks truncated";
}

// The NCCL 2.30 functions Chorus has no equivalent for answer ncclInvalidUsage with a WARN that
// names them; ncclWinGetUserPtr returns the registered pointer.
TEST(Symbols, Nccl230Functions) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
    uint64_t v = 0;
    void *p = nullptr;
    ncclComm_t nc = nullptr;
    struct Case {
        const char *name;
        ncclResult_t r;
    } cases[] = {
        {"ncclCommSuspend", ncclCommSuspend(comm, NCCL_SUSPEND_MEM)},
        {"ncclCommResume", ncclCommResume(comm)},
        {"ncclCommMemStats", ncclCommMemStats(comm, ncclStatGpuMemTotal, &v)},
        {"ncclCommGetUniqueId", ncclCommGetUniqueId(comm, &id)},
        {"ncclCommGrow", ncclCommGrow(comm, 2, &id, -1, &nc, nullptr)},
        {"ncclPutSignal", ncclPutSignal(&v, 1, ncclUint64, 0, nullptr, 0, 0, 0, 0, comm, nullptr)},
        {"ncclSignal", ncclSignal(0, 0, 0, 0, comm, nullptr)},
        {"ncclWaitSignal", ncclWaitSignal(0, nullptr, comm, nullptr)},
        {"ncclDevCommCreate", ncclDevCommCreate(comm, nullptr, nullptr)},
        {"ncclDevCommDestroy", ncclDevCommDestroy(comm, nullptr)},
        {"ncclGetLsaMultimemDevicePointer", ncclGetLsaMultimemDevicePointer(nullptr, 0, &p)},
        {"ncclGetPeerDevicePointer", ncclGetPeerDevicePointer(nullptr, 0, 0, &p)},
    };
    for (const Case &c : cases) {
        EXPECT_EQ(c.r, ncclInvalidUsage) << c.name;
    }
    // The WARN of the last call names it.
    EXPECT_NE(strstr(ncclGetLastError(comm), "ncclGetPeerDevicePointer"), nullptr)
        << ncclGetLastError(comm);
    EXPECT_EQ(nc, nullptr);
    EXPECT_EQ(p, nullptr);

    char buf[256];
    ncclWindow_t win = nullptr;
    ASSERT_EQ(ncclCommWindowRegister(comm, buf, sizeof(buf), &win, 0), ncclSuccess);
    void *user = nullptr;
    EXPECT_EQ(ncclWinGetUserPtr(comm, win, &user), ncclSuccess);
    EXPECT_EQ(user, static_cast<void *>(buf));
    EXPECT_EQ(ncclWinGetUserPtr(comm, reinterpret_cast<ncclWindow_t>(buf), &user),
              ncclInvalidArgument);
    EXPECT_EQ(ncclCommWindowDeregister(comm, win), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

} // namespace

// The library's thread-local block. A few variables are initial-exec (read on every call), which
// makes the whole block static TLS; a process that loads the library with dlopen after other
// libraries (Python's ctypes after torch) has only glibc's small static TLS reserve left, and a
// block of 1.5 KiB failed there with "cannot allocate memory in static TLS block". Keep it well
// below that: large per-thread buffers go on the heap.
TEST(Symbols, SmallStaticTlsBlock) {
    std::string lib = std::string(CHORUS_BINARY_DIR) + "/lib/libnccl.so.2";
    std::string cmd = "readelf -lW '" + lib + "' 2>/dev/null";
    FILE *p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char line[512];
    unsigned long memsz = 0;
    bool found = false;
    while (fgets(line, sizeof(line), p)) {
        char type[32];
        unsigned long off, va, pa, fsz, msz;
        if (sscanf(line, " %31s %lx %lx %lx %lx %lx", type, &off, &va, &pa, &fsz, &msz) == 6 &&
            strcmp(type, "TLS") == 0) {
            memsz = msz;
            found = true;
        }
    }
    int rc = pclose(p);
    if (rc != 0 && !found) GTEST_SKIP() << "readelf not available";
    ASSERT_TRUE(found) << "no TLS segment in " << lib;
    EXPECT_LE(memsz, 768ul) << "thread-local block of " << memsz << " bytes in " << lib;
}
