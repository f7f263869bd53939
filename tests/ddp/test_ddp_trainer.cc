// test_ddp_trainer.cc: smoke tests of the example trainer build/bin/ddp_mnist as a user runs it:
// its machine-readable result line, its error when the data set is missing, and a two-rank run
// under chorusrun. Short runs (--limit) on the real Fashion-MNIST files; skipped when Debian's
// dataset-fashion-mnist is not installed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>

#include "idx.h"

namespace {

// Run a shell command; return its exit status and its output (stdout and stderr).
int run(const std::string &cmd, std::string *out) {
    out->clear();
    FILE *f = popen((cmd + " 2>&1").c_str(), "r");
    if (!f) return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        out->append(buf, n);
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const std::string kBin = std::string(CHORUS_BINARY_DIR) + "/bin/";

bool have_data() {
    return access(IDX_DEFAULT_DIR "/train-images-idx3-ubyte.gz", R_OK) == 0;
}

TEST(DdpTrainer, MissingDataNamesTheDebianPackage) {
    std::string out;
    int rc = run(kBin + "ddp_mnist --no-comm --data /nonexistent/fmnist", &out);
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("dataset-fashion-mnist"), std::string::npos) << out;
}

TEST(DdpTrainer, OneRankPrintsTheResultLine) {
    if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    std::string out;
    int rc = run(kBin + "ddp_mnist --no-comm --epochs 1 --limit 2000 --batch 32", &out);
    ASSERT_EQ(rc, 0) << out;
    std::smatch m;
    std::regex re("result: ranks=1 epochs=1 test_acc=([0-9.]+) samples_per_s=([0-9]+) "
                  "comm_hidden=([0-9.]+)\n$");
    ASSERT_TRUE(std::regex_search(out, m, re)) << out;
    EXPECT_GT(std::stod(m[1]), 0.5) << "2000 samples of one epoch should beat chance easily";
}

TEST(DdpTrainer, TwoRanksUnderChorusrunShardedAndBf16) {
    if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    if (access((kBin + "chorusrun").c_str(), X_OK) != 0) GTEST_SKIP() << "chorusrun not built";
    for (std::string opt : {"", " --sharded --bf16-grads --accumulate 2"}) {
        std::string out;
        int rc =
            run(kBin + "chorusrun -n 2 " + kBin + "ddp_mnist --epochs 1 --limit 2000" + opt, &out);
        ASSERT_EQ(rc, 0) << out;
        std::smatch m;
        std::regex re("result: ranks=2 epochs=1 test_acc=([0-9.]+) samples_per_s=[0-9]+ "
                      "comm_hidden=([0-9.]+)");
        ASSERT_TRUE(std::regex_search(out, m, re)) << out;
        EXPECT_GT(std::stod(m[1]), 0.5) << opt;
        double hidden = std::stod(m[2]);
        EXPECT_GE(hidden, 0.0);
        EXPECT_LE(hidden, 1.0);
    }
}

} // namespace
