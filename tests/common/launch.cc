// launch.cc: thread and fork launchers for multi-rank tests (see launch.h).
#include "launch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

namespace chorus_test {

double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

RunResult run_threads(int nranks, const RankFn &fn, double timeout_s) {
    RunResult res;
    std::vector<std::thread> threads;
    std::vector<int> rc(nranks, -1);
    std::atomic<int> done{0};
    for (int r = 0; r < nranks; r++) {
        threads.emplace_back([&, r] {
            rc[r] = fn(r, nranks);
            done++;
        });
    }
    double deadline = now_s() + timeout_s;
    while (done.load() < nranks && now_s() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (done.load() < nranks) {
        // A thread cannot be killed safely; report and abort the process so ctest sees a failure
        // instead of a hang.
        fprintf(stderr, "run_threads: %d of %d ranks still running after %.0f s; aborting\n",
                nranks - done.load(), nranks, timeout_s);
        fflush(stderr);
        _exit(124);
    }
    for (auto &t : threads) t.join();
    for (int r = 0; r < nranks; r++) {
        if (rc[r] != 0) {
            res.failed++;
            res.detail += "rank " + std::to_string(r) + ": returned " + std::to_string(rc[r]) + "\n";
        }
    }
    return res;
}

// gcc 12's AddressSanitizer does not take its allocator's locks around fork(): a child forked
// while another thread of the parent (the bootstrap root that ncclGetUniqueId started, setting
// itself up or serving the ranks forked before) holds one inherits it locked and hangs at its
// first allocation. In ASan builds the ranks therefore wait at a gate until all of them are
// forked, so that no rank talks to the root while the parent forks, and each fork waits (at most
// a second) until every other thread of the parent sleeps in the kernel, out of the allocator.
#if defined(__SANITIZE_ADDRESS__)
static const bool kForkGate = true;
#else
static const bool kForkGate = false;
#endif

static void wait_other_threads_asleep() {
    double until = now_s() + 1.0;
    const long self = (long)gettid();
    for (;;) {
        bool busy = false;
        if (DIR *d = opendir("/proc/self/task")) {
            while (dirent *e = readdir(d)) {
                long tid = atol(e->d_name);
                if (tid <= 0 || tid == self) continue;
                char path[64], buf[512];
                snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
                FILE *f = fopen(path, "r");
                if (!f) continue;
                size_t n = fread(buf, 1, sizeof(buf) - 1, f);
                fclose(f);
                buf[n] = '\0';
                const char *close_paren = strrchr(buf, ')'); // "tid (name) S ..."
                if (close_paren && close_paren[1] == ' ' && close_paren[2] == 'R') busy = true;
            }
            closedir(d);
        }
        if (!busy || now_s() > until) return;
        usleep(1000);
    }
}

extern "C" void __gcov_dump(void) __attribute__((weak));

RunResult run_forked(int nranks, const RankFn &fn, double timeout_s) {
    RunResult res;
    fflush(stdout);
    fflush(stderr);
    int gate[2] = {-1, -1};
    if (kForkGate && pipe(gate) != 0) gate[0] = gate[1] = -1;
    std::vector<pid_t> pids(nranks, -1);
    for (int r = 0; r < nranks; r++) {
        if (kForkGate) wait_other_threads_asleep();
        pid_t pid = fork();
        if (pid == 0) {
            if (gate[0] >= 0) {
                // Opens when the parent closes its write end (every child closes its own).
                close(gate[1]);
                char c;
                while (read(gate[0], &c, 1) < 0 && errno == EINTR) {
                }
                close(gate[0]);
            }
            int rc = fn(r, nranks);
            fflush(stdout);
            fflush(stderr);
            // A coverage build (--coverage) writes the rank's counts here: _exit skips the exit
            // handlers that would. Elsewhere the symbol is absent and nothing happens.
            if (__gcov_dump) __gcov_dump();
            _exit(rc == 0 ? 0 : (rc & 0xff ? rc & 0xff : 1));
        }
        if (pid < 0) {
            res.failed++;
            res.detail += "fork failed for rank " + std::to_string(r) + "\n";
            continue;
        }
        pids[r] = pid;
    }
    if (gate[0] >= 0) {
        close(gate[1]);
        close(gate[0]);
    }
    double deadline = now_s() + timeout_s;
    int left = 0;
    for (pid_t p : pids) left += p > 0;
    std::vector<int> status(nranks, 0);
    std::vector<bool> reaped(nranks, false);
    while (left > 0) {
        for (int r = 0; r < nranks; r++) {
            if (pids[r] <= 0 || reaped[r]) continue;
            int st;
            if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
                reaped[r] = true;
                status[r] = st;
                left--;
            }
        }
        if (left == 0) break;
        if (now_s() > deadline) {
            res.timed_out = true;
            for (int r = 0; r < nranks; r++) {
                if (pids[r] > 0 && !reaped[r]) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], &status[r], 0);
                    reaped[r] = true;
                    res.detail += "rank " + std::to_string(r) + ": killed after deadline\n";
                    res.failed++;
                }
            }
            break;
        }
        usleep(2000);
    }
    for (int r = 0; r < nranks; r++) {
        if (pids[r] <= 0 || !reaped[r]) continue;
        int st = status[r];
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        if (res.timed_out && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) continue; // counted above
        res.failed++;
        if (WIFEXITED(st))
            res.detail += "rank " + std::to_string(r) + ": exit " + std::to_string(WEXITSTATUS(st)) + "\n";
        else if (WIFSIGNALED(st))
            res.detail += "rank " + std::to_string(r) + ": signal " + std::to_string(WTERMSIG(st)) + "\n";
    }
    return res;
}

RunResult run_ranks(Launch how, int nranks, const RankFn &fn, double timeout_s) {
    return how == Launch::Threads ? run_threads(nranks, fn, timeout_s)
                                  : run_forked(nranks, fn, timeout_s);
}

ncclUniqueId make_unique_id() {
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fprintf(stderr, "ncclGetUniqueId failed: %d\n", (int)r);
    return id;
}

std::vector<std::string> shm_leftovers() {
    std::vector<std::string> out;
    DIR *d = opendir("/dev/shm");
    if (!d) return out;
    while (dirent *e = readdir(d)) {
        if (strstr(e->d_name, "chorus")) out.push_back(e->d_name);
    }
    closedir(d);
    return out;
}

int free_tcp_port() {
    int lo = 32768, hi = 60999;
    if (FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
        fclose(f);
    }
    int base = 10000, top = lo - 1;
    if (top - base < 1000) base = hi + 1, top = 65535; // a range set low: look above it
    std::mt19937 rng(std::random_device{}() ^ (unsigned)getpid());
    for (int attempt = 0; attempt < 1000 && top > base; attempt++) {
        int port = base + (int)(rng() % (unsigned)(top - base + 1));
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons((uint16_t)port);
        bool ok = fd >= 0 && bind(fd, (sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0) close(fd);
        if (ok) return port;
    }
    return 0;
}

} // namespace chorus_test
