// test_coll_tuner.cc: the tuner's choices. NCCL_ALGO / CHORUS_ALGO read in NCCL's syntax
// (algo_filter.c), and the algorithm each op runs by size, rank count and transport, as the INFO
// line reports it (NCCL_DEBUG_SUBSYS=TUNING into a file per rank).
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "coll_util.h"
extern "C" { // internal headers are C without extern "C" guards
#include "coll_internal.h"
}
#include "launch.h"

namespace {

constexpr unsigned kRing = 1u << COLL_ALGO_RING, kLL = 1u << COLL_ALGO_LL,
                   kOneshot = 1u << COLL_ALGO_ONESHOT, kDirect = 1u << COLL_ALGO_DIRECT,
                   kTree = 1u << COLL_ALGO_TREE, kHier = 1u << COLL_ALGO_HIER;

coll_algo_filter_t parse(const char *spec, int coll) {
    coll_algo_filter_t f;
    coll_algo_filter_parse(spec, coll, &f);
    return f;
}

TEST(AlgoFilter, NcclSyntax) {
    coll_algo_filter_t f = parse(nullptr, COLL_ALLREDUCE);
    EXPECT_EQ(f.allow, COLL_ALLOW_ALL);
    EXPECT_EQ(f.set, 0);
    EXPECT_EQ(parse("", COLL_ALLREDUCE).set, 0);

    f = parse("Ring", COLL_ALLREDUCE);
    EXPECT_EQ(f.allow, kRing);
    EXPECT_EQ(f.set, 1);
    EXPECT_EQ(parse("ring,oneshot", COLL_ALLGATHER).allow, kRing | kOneshot);
    // ^ excludes the whole list.
    EXPECT_EQ(parse("^ll,direct", COLL_ALLREDUCE).allow, kRing | kOneshot | kTree | kHier);
    // Per-function sections replace the general list for that function only.
    const char *spec = "ring,oneshot;allreduce:^ll;broadcast:ring";
    EXPECT_EQ(parse(spec, COLL_ALLREDUCE).allow, kRing | kOneshot | kDirect | kTree | kHier);
    EXPECT_EQ(parse(spec, COLL_REDUCESCATTER).allow, kRing | kOneshot);
    EXPECT_EQ(parse(spec, COLL_BROADCAST).allow, kRing);
    // Only a function section: other functions are untouched.
    f = parse("allreduce:ll", COLL_ALLGATHER);
    EXPECT_EQ(f.allow, COLL_ALLOW_ALL);
    EXPECT_EQ(f.set, 0);
    EXPECT_EQ(parse("allreduce:ll", COLL_ALLREDUCE).allow, kLL);
    // The older Chorus form, ',' between function sections.
    EXPECT_EQ(parse("allreduce:ll,oneshot,broadcast:ring", COLL_ALLREDUCE).allow, kLL | kOneshot);
    EXPECT_EQ(parse("allreduce:ll,oneshot,broadcast:ring", COLL_BROADCAST).allow, kRing);
    // The tree is Chorus's too.
    f = parse("Tree", COLL_ALLREDUCE);
    EXPECT_EQ(f.foreign_only, 0);
    EXPECT_EQ(f.allow, kTree);
    EXPECT_EQ(parse("tree,ring", COLL_ALLREDUCE).allow, kRing | kTree);
    EXPECT_EQ(parse("^tree", COLL_ALLREDUCE).allow, COLL_ALLOW_ALL & ~kTree);
    // So is the hierarchical all-reduce.
    EXPECT_EQ(parse("HIER", COLL_ALLREDUCE).allow, kHier);
    EXPECT_EQ(parse("hier,tree", COLL_ALLREDUCE).allow, kTree | kHier);
    // NCCL algorithms Chorus lacks: accepted, and alone they leave the default choice.
    f = parse("nvls", COLL_ALLREDUCE);
    EXPECT_EQ(f.foreign_only, 1);
    EXPECT_EQ(f.allow, COLL_ALLOW_ALL);
    f = parse("pat,ring", COLL_ALLREDUCE);
    EXPECT_EQ(f.foreign_only, 0);
    EXPECT_EQ(f.allow, kRing);
    EXPECT_EQ(parse("NVLS,nvlstree,collnetdirect,collnetchain,pat", COLL_ALLREDUCE).foreign_only,
              1);
    // An unknown name is ignored (with a WARN); the known ones still count.
    EXPECT_EQ(parse("ring,bogus", COLL_ALLREDUCE).allow, kRing);
    // Spaces around names and sections.
    EXPECT_EQ(parse(" ring , ll ; allreduce : oneshot ", COLL_ALLREDUCE).allow, kOneshot);
    EXPECT_EQ(parse(" ring , ll ; allreduce : oneshot ", COLL_ALLGATHER).allow, kRing | kLL);
}

// The algorithm lines one rank logged: "<coll>: <bytes> bytes, ... -> algorithm <name> (<why>)".
std::vector<std::string> tuning_lines(const std::string &dir) {
    std::vector<std::string> out;
    DIR *d = opendir(dir.c_str());
    if (!d) return out;
    while (dirent *e = readdir(d)) {
        if (std::string(e->d_name).rfind("log.", 0) != 0) continue;
        std::ifstream in(dir + "/" + e->d_name);
        std::string l;
        while (std::getline(in, l))
            if (l.find("-> algorithm") != std::string::npos) out.push_back(l);
    }
    closedir(d);
    return out;
}

bool logged(const std::vector<std::string> &lines, const std::string &what, std::string *all) {
    std::ostringstream os;
    for (const std::string &l : lines) os << l << "\n";
    *all = os.str();
    for (const std::string &l : lines)
        if (l.find(what) != std::string::npos) return true;
    return false;
}

struct TunerRun {
    std::string algo; // NCCL_ALGO ("" unset)
    const char *transport;
    int nranks;
};

// Two all-reduces and an all-gather, 8 B and 4 MiB, forked ranks; the tuning lines of all ranks.
std::vector<std::string> run_and_log(const TunerRun &t) {
    char tmpl[] = "/tmp/chorus_tuner_XXXXXX";
    std::string dir = mkdtemp(tmpl);
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
    setenv("NCCL_DEBUG_FILE", (dir + "/log.%p").c_str(), 1);
    setenv("CHORUS_TRANSPORT", t.transport, 1);
    if (!t.algo.empty()) setenv("NCCL_ALGO", t.algo.c_str(), 1);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(t.nranks, [&](int rank, int n) -> int {
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        std::vector<float> a(1 << 20, 1.0f), b((size_t)n << 20);
        RANK_NCCL(ncclAllReduce(a.data(), a.data(), 2, ncclFloat32, ncclSum, comm, nullptr));
        RANK_NCCL(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat32, ncclSum, comm, nullptr));
        RANK_NCCL(ncclAllGather(a.data(), b.data(), 2, ncclFloat32, comm, nullptr));
        RANK_CHECK(a[0] == (float)n * n, "a[0] = %f", a[0]);
        RANK_NCCL(ncclCommDestroy(comm));
        return 0;
    });
    for (const char *v :
         {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "CHORUS_TRANSPORT", "NCCL_ALGO"})
        unsetenv(v);
    ncclResetDebugInit();
    EXPECT_EQ(res.failed, 0) << res.detail;
    auto lines = tuning_lines(dir);
    std::string cmd = "rm -rf '" + dir + "'";
    if (system(cmd.c_str()) != 0) ADD_FAILURE() << cmd;
    return lines;
}

// Defaults: over shared memory a small all-reduce and all-gather run one-shot and a 4 MiB
// all-reduce the ring; over TCP the small all-reduce runs recursive doubling (one-shot is for
// one host's shared memory only).
TEST(Tuner, DefaultChoiceBySizeAndTransport) {
    std::string all;
    auto shm = run_and_log({"", "shm", 3});
    EXPECT_TRUE(logged(shm, "allreduce: 8 bytes, 3 ranks, shm -> algorithm oneshot", &all)) << all;
    EXPECT_TRUE(logged(shm, "allreduce: 4194304 bytes, 3 ranks, shm -> algorithm ring", &all))
        << all;
    EXPECT_TRUE(logged(shm, "allgather: 8 bytes, 3 ranks, shm -> algorithm oneshot", &all)) << all;
    auto tcp = run_and_log({"", "tcp", 2});
    EXPECT_TRUE(logged(tcp, "allreduce: 8 bytes, 2 ranks, tcp -> algorithm ll", &all)) << all;
    EXPECT_TRUE(logged(tcp, "allreduce: 4194304 bytes, 2 ranks, tcp -> algorithm ring", &all))
        << all;
}

// NCCL_ALGO: one allowed algorithm runs at every size it can; an exclusion leaves the choice by
// size among the rest; a forced algorithm that cannot run the op falls back and says so.
TEST(Tuner, NcclAlgoRestrictsTheChoice) {
    std::string all;
    auto ring = run_and_log({"ring", "shm", 2});
    EXPECT_TRUE(logged(ring, "allreduce: 8 bytes, 2 ranks, shm -> algorithm ring (forced", &all))
        << all;
    EXPECT_TRUE(logged(ring, "allgather: 8 bytes, 2 ranks, shm -> algorithm ring (forced", &all))
        << all;
    auto excl = run_and_log({"allreduce:^oneshot", "shm", 2});
    EXPECT_TRUE(logged(excl, "allreduce: 8 bytes, 2 ranks, shm -> algorithm ll (the choice by size",
                       &all))
        << all;
    EXPECT_TRUE(logged(excl, "allgather: 8 bytes, 2 ranks, shm -> algorithm oneshot", &all)) << all;
    auto ll = run_and_log({"ll", "shm", 2});
    EXPECT_TRUE(logged(ll, "allreduce: 8 bytes, 2 ranks, shm -> algorithm ll (forced", &all))
        << all;
    EXPECT_TRUE(logged(ll, "allreduce: 4194304 bytes, 2 ranks, shm -> algorithm ring (the "
                           "algorithm NCCL_ALGO/CHORUS_ALGO forces cannot run",
                       &all))
        << all;
    auto nvls = run_and_log({"NVLS", "shm", 2});
    EXPECT_TRUE(logged(nvls, "allreduce: 8 bytes, 2 ranks, shm -> algorithm oneshot (NCCL_ALGO",
                       &all))
        << all;
    // The tree runs all-reduce at every size; the other collectives have no tree, so the
    // default runs them, with an INFO line saying so.
    auto tree = run_and_log({"Tree", "shm", 2});
    EXPECT_TRUE(logged(tree, "allreduce: 8 bytes, 2 ranks, shm -> algorithm tree (forced", &all))
        << all;
    EXPECT_TRUE(logged(tree, "allreduce: 4194304 bytes, 2 ranks, shm -> algorithm tree (forced",
                       &all))
        << all;
    EXPECT_TRUE(logged(tree, "allgather: 8 bytes, 2 ranks, shm -> algorithm oneshot (the "
                             "algorithm NCCL_ALGO/CHORUS_ALGO forces cannot run",
                       &all))
        << all;
}

} // namespace
