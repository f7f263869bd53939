// test_last_error.cc: ncclGetLastError while other threads log WARNs (src/base/log.c). The text a
// caller gets must be one whole WARN, never a mix of two that were written while it read.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

#include <stdlib.h>
#include <unistd.h>

#include "nccl.h"
extern "C" { // internal headers are C without extern "C" guards
#include "log.h"
}

namespace {

// One WARN made of a single repeated letter, so that a torn text shows as two letters.
void warn_letter(char letter, size_t len) {
    std::string text(len, letter);
    chorus_log(LOG_WARN, SUB_INIT, __FILE__, __LINE__, "%s", text.c_str());
}

// The text is empty (no WARN yet) or len copies of one letter.
bool whole(const char *text, size_t len) {
    if (text == nullptr) return false;
    size_t n = strlen(text);
    if (n == 0) return true;
    if (n != len) return false;
    for (size_t i = 1; i < n; i++)
        if (text[i] != text[0]) return false;
    return true;
}

} // namespace

TEST(LastError, ConcurrentWarnsNeverTear) {
    const size_t kLen = 900; // most of the 1 KiB buffer: a long copy, easy to catch midway
    warn_letter('a', kLen);
    std::atomic<bool> stop{false};
    std::thread writer([&] {
        for (int i = 0; !stop.load(std::memory_order_relaxed) && i < 200000; i++)
            warn_letter(i & 1 ? 'b' : 'a', kLen);
        stop.store(true);
    });
    int torn = 0;
    std::string example;
    for (int reads = 0; !stop.load() || reads < 1000; reads++) {
        const char *t = ncclGetLastError(nullptr);
        // Judge a copy of what the caller got, as a caller would use it.
        std::string got = t ? t : "";
        if (!whole(got.c_str(), kLen)) {
            if (torn++ == 0) example = got.substr(0, 80);
            stop.store(true);
        }
        if (reads > 2000000) break;
    }
    stop.store(true);
    writer.join();
    EXPECT_EQ(torn, 0) << "a torn last-error text: " << example << "...";
}

// ncclResetDebugInit closes the debug file and the next line opens it again, while other threads
// go on logging: no line may be written to a closed FILE (a use-after-free the sanitizer stages
// see; without them it may crash).
TEST(LastError, ResetDebugInitWhileOtherThreadsLog) {
    char pattern[] = "/tmp/chorus-logtest-XXXXXX";
    int fd = mkstemp(pattern);
    ASSERT_GE(fd, 0);
    close(fd);
    ASSERT_EQ(setenv("NCCL_DEBUG", "WARN", 1), 0);
    ASSERT_EQ(setenv("NCCL_DEBUG_FILE", pattern, 1), 0);
    ncclResetDebugInit();
    std::atomic<bool> stop{false};
    std::thread writers[2];
    for (auto &w : writers)
        w = std::thread([&] {
            while (!stop.load(std::memory_order_relaxed)) warn_letter('c', 64);
        });
    for (int i = 0; i < 2000; i++) ncclResetDebugInit();
    stop.store(true);
    for (auto &w : writers) w.join();
    unsetenv("NCCL_DEBUG_FILE");
    unsetenv("NCCL_DEBUG");
    ncclResetDebugInit();
    unlink(pattern);
    const char *t = ncclGetLastError(nullptr);
    EXPECT_TRUE(whole(t, 64)) << t;
}
