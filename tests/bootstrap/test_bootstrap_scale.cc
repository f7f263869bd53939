// test_bootstrap_scale.cc: the bootstrap root against many fake ranks (perf/bootstrap_fake.c) in
// a forked child whose RLIMIT_NOFILE is small: the root holds no socket per rank, so 1,024 ranks
// join under a limit of 256; with far fewer descriptors than connections it runs out, says so
// (naming the limit) and still completes.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "nccl.h"
#include "bootstrap_fake.h"
extern "C" {
#include "log.h"
#include "param.h"
}

namespace {

struct ChildReport {
    int ok;          // the child started a root and saw the parent finish
    int warned_fds;  // the child's last error names the descriptor limit
    char last_error[200];
};

// Fork a child limited to `limit` descriptors (soft and hard) that starts a root; run nranks fake
// ranks against it from here. Returns the fake ranks' result; *report gets the child's view.
int run_limited_root(int limit, int nranks, bs_fake_result_t *res, ChildReport *report) {
    int c2p[2], p2c[2];
    if (pipe(c2p) != 0 || pipe(p2c) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(c2p[0]);
        close(p2c[1]);
        struct rlimit rl = {(rlim_t)limit, (rlim_t)limit};
        ChildReport rep;
        memset(&rep, 0, sizeof(rep));
        chorus_unique_id_t id;
        memset(&id, 0, sizeof(id));
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || bootstrap_get_unique_id(&id) != ncclSuccess)
            _exit(2);
        if (write(c2p[1], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(3);
        char done;
        if (read(p2c[0], &done, 1) != 1) _exit(4);
        rep.ok = 1;
        const char *last = chorus_log_last_error();
        snprintf(rep.last_error, sizeof(rep.last_error), "%s", last ? last : "");
        rep.warned_fds = strstr(rep.last_error, "out of file descriptors") != nullptr &&
                         strstr(rep.last_error, "RLIMIT_NOFILE") != nullptr;
        if (write(c2p[1], &rep, sizeof(rep)) != (ssize_t)sizeof(rep)) _exit(5);
        _exit(0);
    }
    close(c2p[1]);
    close(p2c[0]);
    chorus_unique_id_t id;
    int rc = -1;
    memset(report, 0, sizeof(*report));
    if (read(c2p[0], &id, sizeof(id)) == (ssize_t)sizeof(id)) {
        rc = bs_fake_run(&id, nranks, res);
        // Give the root a moment to finish its last connection before the report.
        usleep(100 * 1000);
        char done = 1;
        if (write(p2c[1], &done, 1) != 1 ||
            read(c2p[0], report, sizeof(*report)) != (ssize_t)sizeof(*report))
            rc = -1;
    }
    close(c2p[0]);
    close(p2c[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = -1;
    return rc;
}

// 1,024 ranks join a root whose process may hold only 256 descriptors.
TEST(BootstrapScale, ThousandRanksUnderLimit256) {
    struct rlimit rl;
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max < (rlim_t)bs_fake_fds_needed(1024) + 64)
        GTEST_SKIP() << "the fake ranks need " << bs_fake_fds_needed(1024)
                     << " descriptors; the hard limit is " << rl.rlim_max;
    rl.rlim_cur = rl.rlim_max;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    bs_fake_result_t res;
    ChildReport rep;
    ASSERT_EQ(run_limited_root(256, 1024, &res, &rep), 0) << res.error;
    EXPECT_EQ(rep.ok, 1);
    EXPECT_EQ(rep.warned_fds, 0) << rep.last_error;
}

// With 20 descriptors the root runs out while ranks connect: it WARNs naming RLIMIT_NOFILE, lets
// the kernel queue the rest, and the rendezvous of 300 ranks still completes.
TEST(BootstrapScale, RootOutOfDescriptorsSaysSoAndCompletes) {
    struct rlimit rl;
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max < (rlim_t)bs_fake_fds_needed(300) + 64)
        GTEST_SKIP() << "the hard descriptor limit is " << rl.rlim_max;
    rl.rlim_cur = rl.rlim_max;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    bs_fake_result_t res;
    ChildReport rep;
    ASSERT_EQ(run_limited_root(20, 300, &res, &rep), 0) << res.error;
    EXPECT_EQ(rep.ok, 1);
    EXPECT_EQ(rep.warned_fds, 1) << "last error: " << rep.last_error;
}

} // namespace
