// test_chorusrun.cc: the chorusrun launcher (tools/chorusrun.c) and jobs it starts.
//
// Runs build/bin/chorusrun as a child process and checks what it prints and how it exits: the
// variables each rank gets, one line naming a failed rank (exit code or signal), --tag-output,
// forwarding of SIGTERM, two "nodes" on loopback, and the program bs_rank_main under it
// (bootstrap, communicator, host all-reduce). The two-host test runs
// tests/scripts/netns_two_hosts.sh and is skipped when network namespaces cannot be created.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bs_test_env.h"
#include "launch.h"

namespace {

using chorus_test::free_port;

const std::string kBin = std::string(CHORUS_BINARY_DIR) + "/bin/";
const std::string kRun = kBin + "chorusrun";
const std::string kProg = kBin + "bs_rank_main";
// Runs without a root address or job secret from the caller's environment.
const std::string kCleanEnv =
    "env -u NCCL_COMM_ID -u CHORUS_COMM_ID -u CHORUS_JOB_SECRET -u CHORUS_JOB_SECRET_FILE "
    "-u CHORUS_COMM_ID_INSECURE ";
const std::string kScript = std::string(CHORUS_SOURCE_DIR) + "/tests/scripts/netns_two_hosts.sh";

struct Cmd {
    int status = -1; // raw wait status
    std::string out;
    int exit_code() const {
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
};

Cmd run(const std::string &cmd) {
    Cmd c;
    FILE *f = popen((cmd + " 2>&1").c_str(), "r");
    if (!f) return c;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        c.out.append(buf, n);
    c.status = pclose(f);
    return c;
}

std::vector<std::string> lines(const std::string &s) {
    std::vector<std::string> v;
    std::istringstream in(s);
    std::string l;
    while (std::getline(in, l))
        if (!l.empty()) v.push_back(l);
    return v;
}

bool have(const std::string &path) {
    return access(path.c_str(), X_OK) == 0;
}

#define NEED_BINARIES()                                                                            \
    do {                                                                                           \
        if (!have(kRun)) GTEST_FAIL() << kRun << " was not built";                                 \
    } while (0)

TEST(ChorusRun, HelpAndBadArguments) {
    NEED_BINARIES();
    Cmd c = run(kRun + " -h");
    EXPECT_EQ(c.exit_code(), 0);
    EXPECT_NE(c.out.find("usage: chorusrun"), std::string::npos) << c.out;
    c = run(kRun + " true");
    EXPECT_NE(c.exit_code(), 0) << "-n is required";
    c = run(kRun + " -n 2");
    EXPECT_NE(c.exit_code(), 0) << "a program is required";
    c = run(kRun + " -n zero true");
    EXPECT_NE(c.exit_code(), 0);
    c = run(kRun + " -n 2 --nnodes 2 true");
    EXPECT_NE(c.exit_code(), 0) << "--master-addr is required with several nodes";
    EXPECT_NE(c.out.find("--master-addr"), std::string::npos) << c.out;
}

TEST(ChorusRun, SetsRankVariables) {
    NEED_BINARIES();
    Cmd c = run(kCleanEnv + kRun +
                " -n 3 sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR "
                "$MASTER_PORT $NCCL_COMM_ID'");
    ASSERT_EQ(c.exit_code(), 0) << c.out;
    auto v = lines(c.out);
    std::sort(v.begin(), v.end());
    ASSERT_EQ(v.size(), 3u) << c.out;
    for (int r = 0; r < 3; r++) {
        int rank, size, local, lsize, port, port2;
        char addr[64], id[80];
        ASSERT_EQ(sscanf(v[r].c_str(), "%d %d %d %d %63s %d %79s", &rank, &size, &local, &lsize,
                         addr, &port, id),
                  7)
            << v[r];
        EXPECT_EQ(rank, r);
        EXPECT_EQ(size, 3);
        EXPECT_EQ(local, r);
        EXPECT_EQ(lsize, 3);
        EXPECT_STREQ(addr, "127.0.0.1");
        EXPECT_GT(port, 0);
        ASSERT_EQ(sscanf(id, "127.0.0.1:%d", &port2), 1) << id;
        EXPECT_GT(port2, 0);
        EXPECT_NE(port2, port) << "Chorus's root must leave MASTER_PORT to torch's store";
        // Below the ephemeral range no other process's bind to port 0 or connect() is handed them.
        int low = 32768, high = 60999;
        if (FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
            if (fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
            fclose(f);
        }
        EXPECT_LT(port, low) << "MASTER_PORT is in the ephemeral range";
        EXPECT_LT(port2, low) << "the root port is in the ephemeral range";
    }
}

// The ranks of one launch share a random job secret, the next launch gets another one, and a secret
// the user set is passed on unchanged.
TEST(ChorusRun, RanksGetARandomJobSecret) {
    NEED_BINARIES();
    const std::string echo = " -n 2 sh -c 'echo \"[$CHORUS_JOB_SECRET]\"'";
    std::string secrets[2];
    for (int launch = 0; launch < 2; launch++) {
        Cmd c = run(kCleanEnv + kRun + echo);
        ASSERT_EQ(c.exit_code(), 0) << c.out;
        auto v = lines(c.out);
        ASSERT_EQ(v.size(), 2u) << c.out;
        EXPECT_EQ(v[0], v[1]) << "the ranks of one launch got different secrets";
        ASSERT_EQ(v[0].size(), 66u) << "64 hex digits in brackets: " << v[0];
        EXPECT_EQ(v[0].find_first_not_of("0123456789abcdef", 1), 65u) << v[0];
        secrets[launch] = v[0];
    }
    EXPECT_NE(secrets[0], secrets[1]) << "two launches got the same secret";
    Cmd c = run(kCleanEnv + "CHORUS_JOB_SECRET=mine " + kRun + echo);
    ASSERT_EQ(c.exit_code(), 0) << c.out;
    EXPECT_EQ(lines(c.out), std::vector<std::string>({"[mine]", "[mine]"})) << c.out;
    c = run(kCleanEnv + "CHORUS_JOB_SECRET_FILE=/some/file " + kRun + echo);
    ASSERT_EQ(c.exit_code(), 0) << c.out;
    EXPECT_EQ(lines(c.out), std::vector<std::string>({"[]", "[]"})) << "file given: none made";
}

// Ranks on other nodes cannot receive a secret made here: a multi-node launch needs one given.
TEST(ChorusRun, MultiNodeNeedsAJobSecret) {
    NEED_BINARIES();
    const std::string args =
        " -n 1 --nnodes 2 --node-rank 1 --master-addr 10.1.2.3 --master-port 1234 true";
    Cmd c = run(kCleanEnv + kRun + args);
    EXPECT_EQ(c.exit_code(), 2) << c.out;
    EXPECT_NE(c.out.find("CHORUS_JOB_SECRET"), std::string::npos) << c.out;
    EXPECT_NE(c.out.find("CHORUS_JOB_SECRET_FILE"), std::string::npos) << c.out;
    for (const char *given :
         {"CHORUS_JOB_SECRET=s ", "CHORUS_JOB_SECRET_FILE=/f ", "CHORUS_COMM_ID_INSECURE=1 "}) {
        c = run(kCleanEnv + given + kRun + args);
        EXPECT_EQ(c.exit_code(), 0) << given << ": " << c.out;
    }
}

TEST(ChorusRun, MultiNodeRanks) {
    NEED_BINARIES();
    Cmd c =
        run("env -u NCCL_COMM_ID -u CHORUS_COMM_ID CHORUS_JOB_SECRET=multi-node-secret " + kRun +
            " -n 2 --nnodes 3 --node-rank 1 --master-addr 10.1.2.3 --master-port 1234 sh -c "
            "'echo $RANK $WORLD_SIZE $LOCAL_RANK $NODE_RANK $MASTER_ADDR $MASTER_PORT "
            "$NCCL_COMM_ID'");
    ASSERT_EQ(c.exit_code(), 0) << c.out;
    auto v = lines(c.out);
    std::sort(v.begin(), v.end());
    ASSERT_EQ(v.size(), 2u) << c.out;
    EXPECT_EQ(v[0], "2 6 0 1 10.1.2.3 1234 10.1.2.3:1235");
    EXPECT_EQ(v[1], "3 6 1 1 10.1.2.3 1234 10.1.2.3:1235");
}

TEST(ChorusRun, FailedRankIsNamedWithExitCode) {
    NEED_BINARIES();
    // The other ranks would sleep for ever: chorusrun must stop them.
    Cmd c =
        run(kRun + " -n 4 --grace 1 sh -c 'if [ $RANK = 2 ]; then exit 3; fi; exec sleep 1000'");
    EXPECT_NE(c.exit_code(), 0);
    EXPECT_NE(c.exit_code(), -1) << "chorusrun itself must exit, not die";
    auto v = lines(c.out);
    int named = 0;
    for (auto &l : v)
        if (l.find("rank 2") != std::string::npos && l.find("exit 3") != std::string::npos) named++;
    EXPECT_EQ(named, 1) << c.out;
}

TEST(ChorusRun, KilledRankIsNamedWithSignal) {
    NEED_BINARIES();
    Cmd c = run(
        kRun + " -n 3 --grace 1 sh -c 'if [ $RANK = 1 ]; then kill -KILL $$; fi; exec sleep 1000'");
    EXPECT_NE(c.exit_code(), 0);
    EXPECT_NE(c.out.find("rank 1"), std::string::npos) << c.out;
    EXPECT_NE(c.out.find("signal SIGKILL"), std::string::npos) << c.out;
}

TEST(ChorusRun, RankIgnoringSigtermIsKilledAfterGrace) {
    NEED_BINARIES();
    Cmd c = run(kRun + " -n 2 --grace 1 sh -c 'if [ $RANK = 0 ]; then exit 5; fi; "
                       "trap \"\" TERM; while :; do sleep 0.2; done'");
    EXPECT_EQ(c.exit_code(), 5) << c.out;
}

// A stopped rank (SIGSTOP) still gets the SIGTERM when another rank fails (SIGCONT follows it).
TEST(ChorusRun, StoppedRankGetsSigterm) {
    NEED_BINARIES();
    Cmd c = run(kRun + " -n 2 --grace 30 sh -c 'if [ $RANK = 0 ]; then sleep 0.5; exit 4; fi; "
                       "trap \"echo term$RANK; exit 0\" TERM; kill -STOP $$; "
                       "while :; do sleep 0.1; done'");
    EXPECT_EQ(c.exit_code(), 4) << c.out;
    EXPECT_NE(c.out.find("term1"), std::string::npos) << c.out;
}

TEST(ChorusRun, AllZeroMeansZero) {
    NEED_BINARIES();
    EXPECT_EQ(run(kRun + " -n 5 true").exit_code(), 0);
    EXPECT_NE(run(kRun + " -n 2 /nonexistent/program").exit_code(), 0);
}

TEST(ChorusRun, BindAutoGivesEachRankItsOwnCpus) {
    NEED_BINARIES();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 2) GTEST_SKIP() << "one CPU";
    Cmd c = run(kRun + " -n 2 --bind auto sh -c 'grep Cpus_allowed_list /proc/self/status'");
    ASSERT_EQ(c.exit_code(), 0) << c.out;
    auto v = lines(c.out);
    ASSERT_EQ(v.size(), 2u) << c.out;
    EXPECT_NE(v[0], v[1]) << c.out;
    c = run(kRun + " -n 2 --bind bogus true");
    EXPECT_NE(c.exit_code(), 0);
}

// More ranks than CPUs: by default consecutive ranks share a CPU (ring neighbours on one core),
// every rank gets exactly one, and every CPU gets ranks.
TEST(ChorusRun, OversubscribedRanksShareCpusInContiguousBlocks) {
    NEED_BINARIES();
    cpu_set_t all;
    ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
    const int ncpu = CPU_COUNT(&all);
    if (ncpu < 2 || ncpu > 8) GTEST_SKIP() << ncpu << " CPUs";
    const int n = 2 * ncpu;
    Cmd c = run(kRun + " -n " + std::to_string(n) +
                " --tag-output sh -c 'grep Cpus_allowed_list /proc/self/status'");
    ASSERT_EQ(c.exit_code(), 0) << c.out;
    auto v = lines(c.out);
    ASSERT_EQ(v.size(), (size_t)n) << c.out;
    std::map<int, std::string> cpu_of;
    for (const std::string &l : v) {
        int r = -1;
        char list[64] = {0};
        ASSERT_EQ(sscanf(l.c_str(), "[%d] Cpus_allowed_list: %63s", &r, list), 2) << l;
        cpu_of[r] = list;
    }
    ASSERT_EQ(cpu_of.size(), (size_t)n) << c.out;
    std::set<std::string> distinct;
    for (int r = 0; r < n; r++) {
        EXPECT_EQ(cpu_of[r].find_first_of(",-"), std::string::npos)
            << "rank " << r << " may run on " << cpu_of[r] << ", not one CPU";
        distinct.insert(cpu_of[r]);
    }
    for (int r = 0; r < n; r += 2)
        EXPECT_EQ(cpu_of[r], cpu_of[r + 1]) << "ranks " << r << " and " << r + 1 << "\n" << c.out;
    EXPECT_EQ(distinct.size(), (size_t)ncpu) << c.out;
    // --bind none leaves them as they were.
    c = run(kRun + " -n " + std::to_string(n) +
            " --bind none sh -c 'grep Cpus_allowed_list /proc/self/status'");
    ASSERT_EQ(c.exit_code(), 0) << c.out;
    for (const std::string &l : lines(c.out))
        EXPECT_NE(l.find_first_of(",-"), std::string::npos) << "--bind none bound a rank: " << l;
}

TEST(ChorusRun, TagOutputPrefixesLines) {
    NEED_BINARIES();
    Cmd c = run(kRun + " -n 3 --tag-output sh -c 'echo out$RANK; echo err$RANK >&2; "
                       "printf \"two\\nlines$RANK\"'");
    ASSERT_EQ(c.exit_code(), 0) << c.out;
    auto v = lines(c.out);
    EXPECT_EQ(v.size(), 12u) << c.out;
    for (int r = 0; r < 3; r++) {
        std::string p = "[" + std::to_string(r) + "] ";
        for (const std::string &want :
             {p + "out" + std::to_string(r), p + "err" + std::to_string(r), p + "two",
              p + "lines" + std::to_string(r)})
            EXPECT_NE(std::find(v.begin(), v.end(), want), v.end()) << want << " in\n" << c.out;
    }
    for (auto &l : v)
        EXPECT_EQ(l[0], '[') << l;
}

TEST(ChorusRun, ForwardsSigterm) {
    NEED_BINARIES();
    int pfd[2];
    ASSERT_EQ(pipe(pfd), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        execl(kRun.c_str(), "chorusrun", "-n", "2", "--grace", "5", "sh", "-c",
              "trap 'echo term$RANK; exit 0' TERM; echo up$RANK; while :; do sleep 0.1; done",
              (char *)nullptr);
        _exit(127);
    }
    close(pfd[1]);
    std::string out;
    char buf[256];
    // wait until both ranks are up (their traps are installed)
    while (out.find("up0") == std::string::npos || out.find("up1") == std::string::npos) {
        ssize_t n = read(pfd[0], buf, sizeof(buf));
        if (n <= 0) break;
        out.append(buf, n);
    }
    kill(pid, SIGTERM);
    ssize_t n;
    while ((n = read(pfd[0], buf, sizeof(buf))) > 0)
        out.append(buf, n);
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFEXITED(st)) << out;
    EXPECT_EQ(WEXITSTATUS(st), 128 + SIGTERM) << out;
    EXPECT_NE(out.find("term0"), std::string::npos) << out;
    EXPECT_NE(out.find("term1"), std::string::npos) << out;
}

TEST(ChorusRun, BootstrapAndCommUnderChorusrun) {
    NEED_BINARIES();
    ASSERT_TRUE(have(kProg)) << kProg << " was not built";
    for (const char *mode : {"bootstrap", "comm", "env", "allreduce"}) {
        Cmd c = run(kCleanEnv + kRun + " -n 4 --tag-output " + kProg + " " + mode);
        EXPECT_EQ(c.exit_code(), 0) << mode << ":\n" << c.out;
        EXPECT_EQ(lines(c.out).size(), 4u) << mode << ":\n" << c.out;
    }
}

// Two chorusrun "nodes" on this host, sharing the master address on loopback.
TEST(ChorusRun, TwoNodesOnLoopback) {
    NEED_BINARIES();
    ASSERT_TRUE(have(kProg)) << kProg << " was not built";
    int port = free_port();
    ASSERT_NE(port, 0);
    // Both "nodes" get the same secret, as a multi-node launch must.
    std::string common = "env -u NCCL_COMM_ID -u CHORUS_COMM_ID -u CHORUS_JOB_SECRET_FILE "
                         "CHORUS_JOB_SECRET=two-nodes-secret " +
                         kRun + " -n 2 --nnodes 2 --master-addr 127.0.0.1 --master-port " +
                         std::to_string(port) + " --node-rank ";
    FILE *a = popen((common + "0 " + kProg + " 2>&1").c_str(), "r");
    FILE *b = popen((common + "1 " + kProg + " 2>&1").c_str(), "r");
    ASSERT_TRUE(a && b);
    std::string out[2];
    char buf[1024];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), b)) > 0)
        out[1].append(buf, n);
    while ((n = fread(buf, 1, sizeof(buf), a)) > 0)
        out[0].append(buf, n);
    int sb = pclose(b), sa = pclose(a);
    EXPECT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << out[0];
    EXPECT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << out[1];
    EXPECT_NE(out[0].find("rank 0 of 4"), std::string::npos) << out[0];
    EXPECT_NE(out[1].find("rank 3 of 4"), std::string::npos) << out[1];
}

// Two hosts as network namespaces (root only; skipped otherwise). With -N the master address is a
// host name that resolves to 127.0.1.1 on host0 itself and to the veth address on host1.
TEST(ChorusRun, TwoHostsNetns) {
    NEED_BINARIES();
    ASSERT_TRUE(have(kProg)) << kProg << " was not built";
    struct Case {
        const char *flags, *mode;
    } cases[] = {{"", "bootstrap"}, {"", "comm"},        {"", "env"},
                 {"", "allreduce"}, {"-N", "bootstrap"}, {"-N", "allreduce"}};
    for (const Case &k : cases) {
        Cmd c = run(kScript + " " + k.flags + " -b " + kBin + " -t 60 -- " + kProg + " " + k.mode);
        if (c.exit_code() == 77) GTEST_SKIP() << c.out;
        EXPECT_EQ(c.exit_code(), 0) << k.flags << " " << k.mode << ":\n" << c.out;
        auto v = lines(c.out);
        int ok = 0;
        for (auto &l : v)
            ok += l.find(" ok") != std::string::npos;
        EXPECT_EQ(ok, 4) << k.flags << " " << k.mode << ":\n" << c.out;
        if (std::string(k.mode) == "bootstrap")
            EXPECT_NE(c.out.find("hosts: chorus-host0 chorus-host0 chorus-host1 chorus-host1"),
                      std::string::npos)
                << c.out;
    }
}

} // namespace

// Every rank of a job is SIGKILLed while it sets up its shared-memory connections (a random 0-3
// ms into its first all-reduce, tests/faults/fault_rank.c): a receiver that created its segment
// before its sender mapped it leaves the name in /dev/shm. Once chorusrun has exited, no segment
// made by any of its ranks may remain.
TEST(ChorusRun, NoShmLeftAfterRanksKilledDuringConnect) {
    const std::string prog = kBin + "fault_rank";
    int left_total = 0, trials = 0;
    std::string left_names;
    for (int t = 0; t < 12; t++) {
        Cmd c = run("env CHORUS_TIMEOUT=20 FAULT_STAGE=killall FAULT_COUNT=262144 " + kRun +
                    " -n 4 --bind none " + prog);
        EXPECT_NE(c.exit_code(), 0) << c.out; // the ranks were killed
        std::set<int> pids;
        std::istringstream in(c.out);
        std::string line;
        while (std::getline(in, line)) {
            int r = 0, pid = 0;
            if (sscanf(line.c_str(), "START rank=%d pid=%d", &r, &pid) == 2) pids.insert(pid);
        }
        EXPECT_EQ(pids.size(), 4u) << c.out;
        trials++;
        for (const std::string &name : chorus_test::shm_leftovers()) {
            int pid = 0;
            if (sscanf(name.c_str(), "chorus-shm-%d-", &pid) == 1 && pids.count(pid)) {
                left_total++;
                left_names += " " + name;
                std::string path = "/dev/shm/" + name;
                unlink(path.c_str()); // do not leave it to the next trial or test
            }
        }
    }
    EXPECT_EQ(left_total, 0) << left_total << " segment(s) left after " << trials
                             << " jobs killed during connect:" << left_names;
}
