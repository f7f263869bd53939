// test_last_error.cc: ncclGetLastError while other threads log WARNs (src/base/log.c). The text a
// caller gets must be one whole WARN, never a mix of two that were written while it read.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

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
