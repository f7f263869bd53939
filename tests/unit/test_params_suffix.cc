// Size suffixes on integer parameters: a value whose K/M/G multiple does not fit in 64 bits is
// refused with ncclInvalidArgument, never wrapped (17179869184g was 0). Found by
// tests/fuzz/fuzz_param (UndefinedBehaviorSanitizer: shift of a negative or too large value).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "nccl.h"
extern "C" {
#include "log.h"
#include "param.h"
}

namespace {

ncclResult_t parse_with(const char *value, int64_t *out) {
    setenv("CHORUS_NSOCKS_PERTHREAD", value, 1);
    chorus_param_reset();
    ncclResult_t res = chorus_param_init();
    *out = chorus_param_int(PARAM_NSOCKS_PERTHREAD);
    unsetenv("CHORUS_NSOCKS_PERTHREAD");
    chorus_param_reset();
    chorus_param_init();
    return res;
}

} // namespace

TEST(ParamSuffix, OverflowingMultipleIsRefused) {
    const char *bad[] = {"17179869184g", "9223372036854775807k", "8796093022208M",
                         "-8796093022209m", "-9223372036854775807K"};
    for (const char *v : bad) {
        int64_t got = 0;
        EXPECT_EQ(parse_with(v, &got), ncclInvalidArgument) << v << " parsed as " << got;
        EXPECT_NE(strstr(chorus_log_last_error(), "CHORUS_NSOCKS_PERTHREAD"), nullptr)
            << chorus_log_last_error();
    }
}
