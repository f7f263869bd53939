// perf_format_test.cc: the table and JSON output (perf/common/perf_format.c). The header lines are
// golden copies of nccl-tests 2.19's (NCCL_FACTS.md section 5.3); rows are checked against
// hand-formatted lines with nccl-tests' column widths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "perf.h"

namespace {

std::string fstr(double v, int w) {
    char buf[64];
    perf_float_str(v, w, buf, sizeof(buf));
    return buf;
}

TEST(PerfFormat, AdaptiveNumbers) {
    EXPECT_EQ(fstr(0.5, 6), "  0.50");
    EXPECT_EQ(fstr(123.456, 6), "123.46");
    EXPECT_EQ(fstr(1234.5, 6), "1234.5");
    EXPECT_EQ(fstr(12345.4, 6), " 12345");
    EXPECT_EQ(fstr(123456.0, 6), "123456");
    EXPECT_EQ(fstr(1234567.0, 6), " 1e+06");
    EXPECT_EQ(fstr(0.29, 7), "   0.29");
    EXPECT_EQ(fstr(95.69, 7), "  95.69");
    EXPECT_EQ(fstr(12345.678, 7), "12345.7");
    EXPECT_EQ(fstr(123456.7, 7), " 123457");
    EXPECT_EQ(fstr(12345678.0, 7), "1.2e+07");
    EXPECT_EQ(fstr(0.0, 6), "  0.00");
}

TEST(PerfFormat, HeaderIsNcclTests) {
    char buf[2048];
    perf_fmt_table_header(buf, sizeof(buf), 0, 0);
    const std::string golden =
        "#                                                              out-of-place"
        "                       in-place\n"
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        "     time   algbw   busbw  #wrong\n"
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
        "             (us)  (GB/s)  (GB/s)\n";
    EXPECT_EQ(std::string(buf), golden);
    perf_fmt_table_header(buf, sizeof(buf), 1, 0);
    EXPECT_NE(std::string(buf).find("  cputime   algbw"), std::string::npos);
}

TEST(PerfFormat, ExtraColumnsComeLast) {
    char plain[2048], extra[2048];
    perf_fmt_table_header(plain, sizeof(plain), 0, 0);
    perf_fmt_table_header(extra, sizeof(extra), 0, 1);
    // Each line of the extended header starts with the plain line: column positions are kept.
    std::istringstream p(plain), e(extra);
    std::string pl, el;
    int lines = 0;
    while (std::getline(p, pl) && std::getline(e, el)) {
        EXPECT_EQ(el.compare(0, pl.size(), pl), 0) << el;
        EXPECT_GT(el.size(), pl.size());
        lines++;
    }
    EXPECT_EQ(lines, 3);
    EXPECT_NE(std::string(extra).find("p50"), std::string::npos);
}

TEST(PerfFormat, Rows) {
    char a[256], b[256], c[256];
    perf_fmt_row_prefix(a, sizeof(a), 8, 2, "float", "sum", -1);
    perf_fmt_row_body(b, sizeof(b), 0.79, 0.01, 0.01, 0);
    perf_fmt_row_body(c, sizeof(c), 95.69, 5.48, 5.48, 3);
    EXPECT_EQ(std::string(a) + b + c,
              "           8             2     float     sum      -1     0.79    0.01    0.01"
              "       0    95.69    5.48    5.48       3");
    perf_fmt_row_prefix(a, sizeof(a), 33554432, 8388608, "bfloat16", "none", 0);
    perf_fmt_row_body(b, sizeof(b), 12345.678, 2.718, 1.359, -1);
    EXPECT_EQ(std::string(a) + b,
              "    33554432       8388608  bfloat16    none       0  12345.7    2.72    1.36"
              "    N/A");
    perf_fmt_row_extra(c, sizeof(c), 10.5, 20.25, 1.0, 3.5);
    EXPECT_EQ(std::string(c), "    10.50    20.25     1.00    3.50");
    perf_fmt_row_extra(c, sizeof(c), NAN, NAN, NAN, NAN);
    EXPECT_EQ(std::string(c), "        -        -        -       -");
}

TEST(PerfFormat, ParamsLine) {
    perf_args_t a;
    perf_args_default(&a);
    a.min_bytes = 8;
    a.max_bytes = 134217728;
    a.step_factor = 2;
    char buf[512];
    perf_fmt_params_line(buf, sizeof(buf), &a);
    EXPECT_EQ(std::string(buf),
              "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1 "
              "iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n");
    a.step_factor = 1;
    perf_fmt_params_line(buf, sizeof(buf), &a);
    EXPECT_NE(std::string(buf).find("step: 1048576(bytes)"), std::string::npos);
}

TEST(PerfFormat, JsonReport) {
    char path[] = "/tmp/perf_json_testXXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    perf_args_t a;
    perf_args_default(&a);
    char arg0[] = "all_reduce_perf", arg1[] = "-b", arg2[] = "8 \"q\"";
    char *argv[] = {arg0, arg1, arg2};
    perf_json_t j;
    ASSERT_EQ(perf_json_open(&j, path, "all_reduce_perf", 3, argv, &a, 2, 22809, "host"), 0);
    perf_json_rank(&j, 0, "vm", 11, "[host] cpu");
    perf_json_rank(&j, 1, "vm", 12, "[host] cpu");
    perf_json_ranks_done(&j);
    perf_result_t r1 = {1.5, 2.0, 2.0, 0, 1.25, 3.0, 1.0, 4.0, 0.5, 1.0, 1.5};
    perf_result_t r2 = {1.5, 2.0, 2.0, -1, NAN, NAN, NAN, NAN, 0.0, 1.5, 1.5};
    perf_json_row(&j, 8, 2, "float", "sum", -1, &r1, &r2);
    perf_json_row(&j, 32, 8, "float", "sum", -1, &r1, &r1);
    perf_json_close(&j, 0, 2.0);

    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    unlink(path);
    EXPECT_NE(s.find("\"program\": \"all_reduce_perf\""), std::string::npos);
    EXPECT_NE(s.find("\"8 \\\"q\\\"\""), std::string::npos) << s; // escaped argument
    EXPECT_NE(s.find("\"size\": 8, \"count\": 2"), std::string::npos);
    EXPECT_NE(s.find("\"size\": 32, \"count\": 8"), std::string::npos);
    EXPECT_NE(s.find("\"nwrong\": null"), std::string::npos);
    EXPECT_NE(s.find("\"p50_us\": 1.25"), std::string::npos);
    EXPECT_NE(s.find("\"p50_us\": null"), std::string::npos);
    EXPECT_NE(s.find("\"avg_busbw\": 2"), std::string::npos);
    EXPECT_EQ(s.find("nan"), std::string::npos);
    // Balanced structure, and commas only between elements.
    int depth = 0;
    for (char ch : s) {
        depth += (ch == '{' || ch == '[') - (ch == '}' || ch == ']');
        EXPECT_GE(depth, 0);
    }
    EXPECT_EQ(depth, 0);
    EXPECT_EQ(s.find(",\n  ]"), std::string::npos);
    EXPECT_EQ(s.find("[,"), std::string::npos);
}

TEST(PerfFormat, JsonEscape) {
    char out[64];
    perf_json_escape("a\"b\\c\nd\x01", out, sizeof(out));
    EXPECT_STREQ(out, "a\\\"b\\\\c\\nd\\u0001");
}

} // namespace
