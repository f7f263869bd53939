// perf_args_test.cc: the perf binaries' command line (perf/common/perf_args.c): nccl-tests'
// defaults, every flag in short and long form, size suffixes, and rejection of bad values.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "perf.h"

namespace {

struct Parsed {
    int rc;
    perf_args_t a;
    std::string err;
};

Parsed parse(std::vector<std::string> args) {
    args.insert(args.begin(), "all_reduce_perf");
    std::vector<char *> argv;
    for (auto &s : args)
        argv.push_back(&s[0]);
    argv.push_back(nullptr);
    Parsed p;
    char err[512] = "";
    perf_args_default(&p.a);
    p.rc = perf_args_parse((int)args.size(), argv.data(), &p.a, err, sizeof(err));
    p.err = err;
    // json_path points into args, which dies here: keep only whether it was set.
    if (p.a.json_path) p.a.json_path = "set";
    return p;
}

TEST(PerfArgs, DefaultsMatchNcclTests) {
    Parsed p = parse({});
    ASSERT_EQ(p.rc, 0) << p.err;
    EXPECT_EQ(p.a.nthreads, 1);
    EXPECT_EQ(p.a.ngpus, 1);
    EXPECT_EQ(p.a.min_bytes, 32u << 20);
    EXPECT_EQ(p.a.max_bytes, 32u << 20);
    EXPECT_EQ(p.a.step_bytes, 1u << 20);
    EXPECT_EQ(p.a.step_factor, 1u);
    EXPECT_EQ(p.a.iters, 20);
    EXPECT_EQ(p.a.warmup, 1);
    EXPECT_EQ(p.a.agg, 1);
    EXPECT_EQ(p.a.run_cycles, 1);
    EXPECT_EQ(p.a.check, 1);
    EXPECT_EQ(p.a.op, (int)ncclSum);
    EXPECT_EQ(p.a.dtype, (int)ncclFloat32);
    EXPECT_EQ(p.a.root, 0);
    EXPECT_EQ(p.a.average, 1);
    EXPECT_EQ(p.a.memory, PERF_MEM_AUTO);
    EXPECT_EQ(p.a.json_path, nullptr);
    EXPECT_EQ(p.a.walk, 1);
    EXPECT_EQ(p.a.dirty, 0);
}

TEST(PerfArgs, EveryShortFlag) {
    Parsed p =
        parse({"-t", "3",        "-g", "2",   "-b", "8",        "-e", "128M", "-i", "64K", "-f",
               "2",  "-n",       "7",  "-w",  "4",  "-m",       "5",  "-N",   "2",  "-p",  "1",
               "-c", "3",        "-o", "max", "-d", "bfloat16", "-r", "1",    "-z", "3",   "-y",
               "1",  "-T",       "30", "-G",  "4",  "-C",       "1",  "-a",   "3",  "-u",  "1",
               "-J", "out.json", "-R", "2",   "-M", "1",        "-I", "1",    "-K", "2",
               "-W", "0",        "-D", "1"});
    ASSERT_EQ(p.rc, 0) << p.err;
    EXPECT_EQ(p.a.nthreads, 3);
    EXPECT_EQ(p.a.ngpus, 2);
    EXPECT_EQ(p.a.min_bytes, 8u);
    EXPECT_EQ(p.a.max_bytes, 128u << 20);
    EXPECT_EQ(p.a.step_bytes, 64u << 10);
    EXPECT_EQ(p.a.step_factor, 2u);
    EXPECT_EQ(p.a.iters, 7);
    EXPECT_EQ(p.a.warmup, 4);
    EXPECT_EQ(p.a.agg, 5);
    EXPECT_EQ(p.a.run_cycles, 2);
    EXPECT_EQ(p.a.parallel_init, 1);
    EXPECT_EQ(p.a.check, 3);
    EXPECT_EQ(p.a.op, (int)ncclMax);
    EXPECT_EQ(p.a.dtype, (int)ncclBfloat16);
    EXPECT_EQ(p.a.root, 1);
    EXPECT_EQ(p.a.blocking, 3);
    EXPECT_EQ(p.a.stream_null, 1);
    EXPECT_EQ(p.a.timeout, 30);
    EXPECT_EQ(p.a.cudagraph, 4);
    EXPECT_EQ(p.a.report_cputime, 1);
    EXPECT_EQ(p.a.average, 3);
    EXPECT_EQ(p.a.unalign, 1);
    EXPECT_STREQ(p.a.json_path, "set");
    EXPECT_EQ(p.a.local_register, 2);
    EXPECT_EQ(p.a.mem_report, 1);
    EXPECT_EQ(p.a.per_iter, 1);
    EXPECT_EQ(p.a.per_iter_skip, 2);
    EXPECT_EQ(p.a.walk, 0);
    EXPECT_EQ(p.a.dirty, 1);
}

TEST(PerfArgs, LongFlags) {
    Parsed p = parse({"--nthreads",
                      "2",
                      "--minbytes",
                      "1K",
                      "--maxbytes",
                      "1G",
                      "--stepfactor",
                      "4",
                      "--iters",
                      "3",
                      "--warmup_iters",
                      "0",
                      "--agg_iters",
                      "2",
                      "--op",
                      "avg",
                      "--datatype",
                      "int64",
                      "--root=-1",
                      "--blocking",
                      "1",
                      "--average",
                      "0",
                      "--check",
                      "0",
                      "--memory",
                      "host",
                      "--output_file",
                      "x.json"});
    ASSERT_EQ(p.rc, 0) << p.err;
    EXPECT_EQ(p.a.nthreads, 2);
    EXPECT_EQ(p.a.min_bytes, 1024u);
    EXPECT_EQ(p.a.max_bytes, 1024u * 1024 * 1024);
    EXPECT_EQ(p.a.step_factor, 4u);
    EXPECT_EQ(p.a.iters, 3);
    EXPECT_EQ(p.a.warmup, 0);
    EXPECT_EQ(p.a.agg, 2);
    EXPECT_EQ(p.a.op, (int)ncclAvg);
    EXPECT_EQ(p.a.dtype, (int)ncclInt64);
    EXPECT_EQ(p.a.root, -1);
    EXPECT_EQ(p.a.blocking, 1);
    EXPECT_EQ(p.a.average, 0);
    EXPECT_EQ(p.a.check, 0);
    EXPECT_EQ(p.a.memory, PERF_MEM_HOST);
}

TEST(PerfArgs, MemoryFlagForms) {
    EXPECT_EQ(parse({"-m", "host"}).a.memory, PERF_MEM_HOST);
    EXPECT_EQ(parse({"-m", "device"}).a.memory, PERF_MEM_DEVICE);
    EXPECT_EQ(parse({"-m", "DEVICE"}).a.memory, PERF_MEM_DEVICE);
    Parsed agg = parse({"-m", "8"});
    EXPECT_EQ(agg.a.agg, 8);
    EXPECT_EQ(agg.a.memory, PERF_MEM_AUTO);
    Parsed rep = parse({"--memory", "1"}); // nccl-tests' spelling of -M
    EXPECT_EQ(rep.rc, 0);
    EXPECT_EQ(rep.a.mem_report, 1);
    EXPECT_EQ(parse({"--memory", "device"}).a.memory, PERF_MEM_DEVICE);
    EXPECT_EQ(parse({"-m", "gpu0"}).rc, -1);
    EXPECT_EQ(parse({"-m", "0"}).rc, -1);
    EXPECT_EQ(parse({"--memory", "2"}).rc, -1);
}

TEST(PerfArgs, AllLoops) {
    EXPECT_EQ(parse({"-o", "all"}).a.op, -1);
    EXPECT_EQ(parse({"-d", "all"}).a.dtype, -1);
    EXPECT_EQ(parse({"-o", "mulsum"}).a.op, PERF_OP_MULSUM);
    EXPECT_EQ(parse({"-o", "premulsum"}).a.op, PERF_OP_MULSUM);
    EXPECT_EQ(parse({"-d", "half"}).a.dtype, (int)ncclFloat16);
    EXPECT_EQ(parse({"-d", "f8e5m2"}).a.dtype, (int)ncclFloat8e5m2);
    EXPECT_EQ(parse({"-d", "char"}).a.dtype, (int)ncclInt8);
}

TEST(PerfArgs, Sizes) {
    size_t v = 0;
    EXPECT_EQ(perf_parse_size("8", &v), 0);
    EXPECT_EQ(v, 8u);
    EXPECT_EQ(perf_parse_size("64K", &v), 0);
    EXPECT_EQ(v, 65536u);
    EXPECT_EQ(perf_parse_size("64k", &v), 0);
    EXPECT_EQ(v, 65536u);
    EXPECT_EQ(perf_parse_size("256M", &v), 0);
    EXPECT_EQ(v, 256u << 20);
    EXPECT_EQ(perf_parse_size("2G", &v), 0);
    EXPECT_EQ(v, 2ull << 30);
    EXPECT_EQ(perf_parse_size("1.5M", &v), 0);
    EXPECT_EQ(v, 3u << 19);
    EXPECT_EQ(perf_parse_size("1MiB", &v), 0);
    EXPECT_EQ(v, 1u << 20);
    EXPECT_EQ(perf_parse_size("16B", &v), 0);
    EXPECT_EQ(v, 16u);
    EXPECT_EQ(perf_parse_size("0", &v), 0);
    EXPECT_EQ(v, 0u);
    for (const char *bad : {"", "-8", "+8", "8X", "M", "1MM", "abc", "8 K", "1e30"})
        EXPECT_EQ(perf_parse_size(bad, &v), -1) << bad;
}

TEST(PerfArgs, BadValuesAreErrorsNamingTheFlag) {
    struct Case {
        std::vector<std::string> args;
        const char *needle;
    } cases[] = {
        {{"-n", "abc"}, "-n"},
        {{"-n", "0"}, "-n"},
        {{"-n", "5x"}, "-n"},
        {{"-t", "0"}, "-t"},
        {{"-g", "-1"}, "-g"},
        {{"-b", "huge"}, "-b"},
        {{"-e", "12Q"}, "-e"},
        {{"-i", "x"}, "-i"},
        {{"-f", "0"}, "-f"},
        {{"-w", "-1"}, "-w"},
        {{"-c", "-2"}, "-c"},
        {{"-o", "xor"}, "-o"},
        {{"-d", "float128"}, "-d"},
        {{"-r", "-2"}, "-r"},
        {{"-z", "4"}, "-z"},
        {{"-y", "2"}, "-y"},
        {{"-a", "4"}, "-a"},
        {{"-p", "2"}, "-p"},
        {{"-C", "7"}, "-C"},
        {{"-R", "3"}, "-R"},
        {{"-M", "5"}, "-M"},
        {{"-I", "2"}, "-I"},
        {{"-T", "-5"}, "-T"},
        {{"-G", "x"}, "-G"},
        {{"-u", "-1"}, "-u"},
        {{"-N", "-1"}, "-N"},
        {{"-x"}, "-x"},
        {{"--bogus"}, "--bogus"},
        {{"-n"}, "-n"},
        {{"stray"}, "stray"},
        {{"-b", "2M", "-e", "1M"}, "minbytes"},
        {{"-b", "1M", "-e", "2M", "-i", "0"}, "stepbytes"},
        {{"-n", "5", "-K", "5"}, "-K"},
        {{"-W", "2"}, "-W"},
        {{"-D", "2"}, "-D"},
    };
    for (auto &c : cases) {
        Parsed p = parse(c.args);
        std::string joined;
        for (auto &s : c.args)
            joined += s + " ";
        EXPECT_EQ(p.rc, -1) << joined;
        EXPECT_NE(p.err.find(c.needle), std::string::npos) << joined << " -> " << p.err;
    }
}

TEST(PerfArgs, HelpAndReparse) {
    EXPECT_EQ(parse({"-h"}).rc, 1);
    EXPECT_EQ(parse({"--help"}).rc, 1);
    // getopt state is reset on each call: a second parse sees its own flags from the start.
    EXPECT_EQ(parse({"-n", "3"}).a.iters, 3);
    EXPECT_EQ(parse({"-n", "4"}).a.iters, 4);
}

TEST(PerfArgs, SweepSizes) {
    size_t sizes[64];
    Parsed p = parse({"-b", "8", "-e", "1M", "-f", "4"});
    int n = perf_args_sizes(&p.a, sizes, 64);
    ASSERT_EQ(n, 9);
    EXPECT_EQ(sizes[0], 8u);
    EXPECT_EQ(sizes[1], 32u);
    EXPECT_EQ(sizes[8], 524288u);
    p = parse({"-b", "1K", "-e", "4K", "-i", "1K"});
    n = perf_args_sizes(&p.a, sizes, 64);
    ASSERT_EQ(n, 4);
    EXPECT_EQ(sizes[3], 4096u);
    p = parse({"-b", "0", "-e", "4", "-f", "2"});
    n = perf_args_sizes(&p.a, sizes, 64);
    ASSERT_EQ(n, 4); // 0 1 2 4
    EXPECT_EQ(sizes[1], 1u);
    p = parse({});
    EXPECT_EQ(perf_args_sizes(&p.a, sizes, 64), 1);
    EXPECT_EQ(sizes[0], 32u << 20);
}

} // namespace
