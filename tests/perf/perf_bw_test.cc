// perf_bw_test.cc: buffer geometry and bandwidth arithmetic per collective
// (perf/common/perf_coll.c), checked against nccl-tests' formulas written out by hand.
#include <gtest/gtest.h>

#include "perf.h"

namespace {

TEST(PerfColl, Names) {
    EXPECT_STREQ(perf_coll_prog(PERF_ALL_REDUCE), "all_reduce_perf");
    EXPECT_STREQ(perf_coll_prog(PERF_HYPERCUBE), "hypercube_perf");
    EXPECT_TRUE(perf_coll_has_op(PERF_REDUCE_SCATTER));
    EXPECT_FALSE(perf_coll_has_op(PERF_ALL_GATHER));
    EXPECT_TRUE(perf_coll_has_root(PERF_SCATTER));
    EXPECT_FALSE(perf_coll_has_root(PERF_ALL_REDUCE));
    EXPECT_FALSE(perf_coll_checks_inplace(PERF_ALLTOALL));
    EXPECT_FALSE(perf_coll_checks_inplace(PERF_SENDRECV));
    EXPECT_TRUE(perf_coll_checks_inplace(PERF_ALL_GATHER));
}

TEST(PerfColl, CountsAllReduce) {
    perf_counts_t c;
    perf_coll_counts(PERF_ALL_REDUCE, 1 << 20, 4, 3, &c);
    EXPECT_EQ(c.sendcount, 262144u);
    EXPECT_EQ(c.recvcount, 262144u);
    EXPECT_EQ(c.paramcount, 262144u);
    EXPECT_EQ(c.send_inplace_off, 0u);
    EXPECT_EQ(c.recv_inplace_off, 0u);
}

TEST(PerfColl, CountsSplitCollectivesRoundTo16Bytes) {
    perf_counts_t c;
    // 1000 floats over 3 ranks: 333 per rank, rounded down to a multiple of 4 floats -> 332.
    perf_coll_counts(PERF_ALL_GATHER, 4000, 4, 3, &c);
    EXPECT_EQ(c.paramcount, 332u);
    EXPECT_EQ(c.sendcount, 332u);
    EXPECT_EQ(c.recvcount, 996u);
    EXPECT_EQ(c.send_inplace_off, 332u);
    EXPECT_EQ(c.recv_inplace_off, 0u);

    perf_coll_counts(PERF_REDUCE_SCATTER, 4000, 4, 3, &c);
    EXPECT_EQ(c.paramcount, 332u);
    EXPECT_EQ(c.sendcount, 996u);
    EXPECT_EQ(c.recvcount, 332u);
    EXPECT_EQ(c.send_inplace_off, 0u);
    EXPECT_EQ(c.recv_inplace_off, 332u);

    perf_coll_counts(PERF_ALLTOALL, 4000, 4, 3, &c);
    EXPECT_EQ(c.sendcount, 996u);
    EXPECT_EQ(c.recvcount, 996u);

    perf_coll_counts(PERF_SCATTER, 4000, 4, 3, &c);
    EXPECT_EQ(c.sendcount, 996u);
    EXPECT_EQ(c.recvcount, 332u);
    EXPECT_EQ(c.recv_inplace_off, 332u);

    perf_coll_counts(PERF_GATHER, 4000, 4, 3, &c);
    EXPECT_EQ(c.sendcount, 332u);
    EXPECT_EQ(c.recvcount, 996u);
    EXPECT_EQ(c.send_inplace_off, 332u);

    // int8: multiples of 16 elements; 8 bytes over 2 ranks is 0.
    perf_coll_counts(PERF_ALL_GATHER, 100, 1, 2, &c);
    EXPECT_EQ(c.paramcount, 48u);
    perf_coll_counts(PERF_ALL_GATHER, 8, 4, 2, &c);
    EXPECT_EQ(c.paramcount, 0u);
    // double: multiples of 2.
    perf_coll_counts(PERF_ALL_GATHER, 8 * 7, 8, 2, &c);
    EXPECT_EQ(c.paramcount, 2u);
}

TEST(PerfColl, CountsHypercube) {
    perf_counts_t c;
    perf_coll_counts(PERF_HYPERCUBE, 4000, 4, 4, &c); // 1000 elements, 4 per rank multiple
    EXPECT_EQ(c.paramcount, 248u);                    // 1000/16*4
    EXPECT_EQ(c.recvcount, 992u);
    EXPECT_EQ(c.send_inplace_off, 248u);
}

TEST(PerfColl, BusFactors) {
    EXPECT_DOUBLE_EQ(perf_coll_bus_factor(PERF_ALL_REDUCE, 4), 1.5);
    EXPECT_DOUBLE_EQ(perf_coll_bus_factor(PERF_ALL_REDUCE, 2), 1.0);
    EXPECT_DOUBLE_EQ(perf_coll_bus_factor(PERF_ALL_REDUCE, 1), 0.0);
    for (perf_coll_t c :
         {PERF_ALL_GATHER, PERF_REDUCE_SCATTER, PERF_ALLTOALL, PERF_GATHER, PERF_SCATTER})
        EXPECT_DOUBLE_EQ(perf_coll_bus_factor(c, 8), 7.0 / 8.0) << perf_coll_prog(c);
    for (perf_coll_t c : {PERF_BROADCAST, PERF_REDUCE, PERF_SENDRECV, PERF_HYPERCUBE})
        EXPECT_DOUBLE_EQ(perf_coll_bus_factor(c, 8), 1.0) << perf_coll_prog(c);
}

TEST(PerfColl, Bandwidth) {
    double alg, bus;
    // all-reduce of 1e6 floats in 1 ms over 4 ranks: 4 GB/s algbw, busbw x 1.5.
    perf_coll_bw(PERF_ALL_REDUCE, 1000000, 4, 1e-3, 4, &alg, &bus);
    EXPECT_DOUBLE_EQ(alg, 4.0);
    EXPECT_DOUBLE_EQ(bus, 6.0);
    // all-gather: per-rank count 250000 floats, n=4: 1e6 bytes*4 / 1ms = 4 GB/s; busbw 3.
    perf_coll_bw(PERF_ALL_GATHER, 250000, 4, 1e-3, 4, &alg, &bus);
    EXPECT_DOUBLE_EQ(alg, 4.0);
    EXPECT_DOUBLE_EQ(bus, 3.0);
    perf_coll_bw(PERF_REDUCE_SCATTER, 250000, 4, 1e-3, 4, &alg, &bus);
    EXPECT_DOUBLE_EQ(bus, 3.0);
    perf_coll_bw(PERF_BROADCAST, 1000000, 4, 2e-3, 4, &alg, &bus);
    EXPECT_DOUBLE_EQ(alg, 2.0);
    EXPECT_DOUBLE_EQ(bus, 2.0);
    perf_coll_bw(PERF_SENDRECV, 500000, 8, 1e-3, 2, &alg, &bus);
    EXPECT_DOUBLE_EQ(bus, 4.0);
    // hypercube: count*ts*(n-1).
    perf_coll_bw(PERF_HYPERCUBE, 1000000, 1, 1e-3, 4, &alg, &bus);
    EXPECT_DOUBLE_EQ(alg, 3.0);
    EXPECT_DOUBLE_EQ(bus, 3.0);
    perf_coll_bw(PERF_ALL_REDUCE, 100, 4, 0.0, 2, &alg, &bus); // no time: no division by zero
    EXPECT_EQ(alg, 0.0);
}

TEST(PerfStats, MedianPercentileReduce) {
    double v[] = {5, 1, 4, 2, 3};
    EXPECT_DOUBLE_EQ(perf_stat_median(v, 5), 3.0);
    double w[] = {4, 1, 3, 2};
    EXPECT_DOUBLE_EQ(perf_stat_median(w, 4), 2.5);
    double p[100];
    for (int i = 0; i < 100; i++)
        p[i] = 100 - i; // 1..100
    EXPECT_DOUBLE_EQ(perf_stat_percentile(p, 100, 99), 99.0);
    EXPECT_DOUBLE_EQ(perf_stat_percentile(p, 100, 50), 50.0);
    double q[] = {7, 9};
    EXPECT_DOUBLE_EQ(perf_stat_percentile(q, 2, 99), 9.0);
    double r[] = {2, 8, 5};
    EXPECT_DOUBLE_EQ(perf_stat_reduce(r, 3, 0), 2.0);
    EXPECT_DOUBLE_EQ(perf_stat_reduce(r, 3, 1), 5.0);
    EXPECT_DOUBLE_EQ(perf_stat_reduce(r, 3, 2), 2.0);
    EXPECT_DOUBLE_EQ(perf_stat_reduce(r, 3, 3), 8.0);
    EXPECT_DOUBLE_EQ(perf_stat_skew(r, 3), 6.0);
}

} // namespace
