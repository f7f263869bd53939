// test_ddp_local.cc: single-process tests of the DDP layer and the example's model code.
//
// These need no communicator (chorusDdpCreate with comm = NULL runs one rank without traffic):
// the MLP backward against numerical differentiation, bucket assignment, gradient views, the
// unused-parameter error, NoSync, 16-bit wire rounding, the sampler's coverage, the IDX reader,
// and a checkpoint round trip. Expected values are computed independently here.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "chorus_ddp.h"
#include "idx.h"
#include "mlp.h"

namespace {

chorusDdpConfig_t quiet_config() {
    chorusDdpConfig_t c = CHORUS_DDP_CONFIG_INITIALIZER;
    c.quiet = 1;
    return c;
}

// ---- MLP: analytic gradients against central differences (in double on the loss) ----

// The loss, and the on/off pattern of every ReLU (a finite difference across a kink is not a
// derivative, so such elements are skipped).
double loss_of(mlp_t *m, const std::vector<float> &x, const std::vector<uint8_t> &y, int batch,
               std::vector<bool> *mask = nullptr) {
    mlp_forward(m, x.data(), batch);
    if (mask) {
        mask->clear();
        for (int l = 0; l + 1 < m->nlayers; l++)
            for (size_t e = 0; e < (size_t)batch * m->dims[l + 1]; e++)
                mask->push_back(m->act[l][e] > 0.0f);
    }
    return mlp_loss(m, y.data(), batch, 1.0f, 0, nullptr);
}

void gradient_check(int batch, int threads) {
    const int dims[4] = {9, 12, 7, 4};
    mlp_t m;
    ASSERT_EQ(mlp_init(&m, dims, 3, batch, 7), 0);
    m.threads = threads;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int l = 0; l < 3; l++)
        for (int j = 0; j < dims[l + 1]; j++)
            m.b[l][j] = 0.1f * nd(rng);
    std::vector<float> x((size_t)batch * dims[0]);
    std::vector<uint8_t> y(batch);
    for (auto &v : x)
        v = nd(rng);
    for (auto &v : y)
        v = (uint8_t)(rng() % dims[3]);
    loss_of(&m, x, y, batch);
    mlp_loss(&m, y.data(), batch, 1.0f, 1, nullptr);
    std::vector<int> order;
    ASSERT_EQ(mlp_backward(
                  &m, batch, 0,
                  [](void *ctx, int l) {
                      static_cast<std::vector<int> *>(ctx)->push_back(l);
                      return 0;
                  },
                  &order),
              0);
    EXPECT_EQ(order, (std::vector<int>{2, 1, 0})); // last layer first
    int checked = 0, kinks = 0;
    std::vector<bool> m0, mp, mm;
    loss_of(&m, x, y, batch, &m0);
    for (int l = 0; l < 3; l++) {
        size_t nw = (size_t)dims[l] * dims[l + 1];
        for (int which = 0; which < 2; which++) {
            float *p = which ? m.b[l] : m.w[l];
            float *g = which ? m.gb[l] : m.gw[l];
            size_t n = which ? (size_t)dims[l + 1] : nw;
            for (size_t i = 0; i < n; i++) {
                float saved = p[i];
                const float eps = 1e-3f;
                p[i] = saved + eps;
                double lp = loss_of(&m, x, y, batch, &mp);
                p[i] = saved - eps;
                double lm = loss_of(&m, x, y, batch, &mm);
                p[i] = saved;
                if (mp != m0 || mm != m0) {
                    kinks++;
                    continue;
                }
                double num = (lp - lm) / (2.0 * eps);
                EXPECT_NEAR(g[i], num, 1e-3 + 1e-2 * std::fabs(num))
                    << "layer " << l << (which ? " bias " : " weight ") << i;
                checked++;
            }
        }
    }
    EXPECT_GT(checked, 200);
    EXPECT_LT(kinks, checked / 5) << "too many elements skipped at ReLU kinks";
    mlp_free(&m);
}

TEST(DdpModel, GradientCheckMatchesFiniteDifferences) {
    gradient_check(5, 1);
}
TEST(DdpModel, GradientCheckBatchOfOne) {
    gradient_check(1, 1);
}
TEST(DdpModel, GradientCheckOddBatchTwoThreads) {
    gradient_check(11, 2);
}
TEST(DdpModel, GradientCheckOddBatchOneThread) {
    gradient_check(11, 1);
}

TEST(DdpModel, AccumulateAddsGradients) {
    const int dims[3] = {6, 5, 3};
    mlp_t m;
    ASSERT_EQ(mlp_init(&m, dims, 2, 4, 1), 0);
    std::vector<float> x(4 * 6);
    for (size_t i = 0; i < x.size(); i++)
        x[i] = std::sin((float)i);
    std::vector<uint8_t> y = {0, 1, 2, 1};
    mlp_forward(&m, x.data(), 4);
    mlp_loss(&m, y.data(), 4, 1.0f, 1, nullptr);
    mlp_backward(&m, 4, 0, nullptr, nullptr);
    std::vector<float> once(m.gw[0], m.gw[0] + 30);
    mlp_forward(&m, x.data(), 4);
    mlp_loss(&m, y.data(), 4, 1.0f, 1, nullptr);
    mlp_backward(&m, 4, 1, nullptr, nullptr);
    for (int i = 0; i < 30; i++)
        EXPECT_FLOAT_EQ(m.gw[0][i], 2 * once[i]);
    mlp_free(&m);
}

// ---- buckets ----

struct Net {
    std::vector<std::vector<float>> p, g;
    std::vector<int> id;
};

// Register params of the given element counts, first to last.
void register_all(chorusDdp_t ddp, Net &net, const std::vector<size_t> &counts, bool views) {
    net.p.resize(counts.size());
    net.g.resize(counts.size());
    net.id.resize(counts.size());
    for (size_t i = 0; i < counts.size(); i++) {
        net.p[i].assign(counts[i], 1.0f + (float)i);
        net.g[i].assign(counts[i], 0.0f);
        std::string name = "p" + std::to_string(i);
        ASSERT_EQ(chorusDdpRegisterParam(ddp, name.c_str(), net.p[i].data(), counts[i], ncclFloat32,
                                         views ? nullptr : net.g[i].data(), &net.id[i]),
                  ncclSuccess);
        EXPECT_EQ(net.id[i], (int)i);
    }
}

TEST(DdpBuckets, ReverseOrderFirstBucketSmallThenCap) {
    chorusDdpConfig_t c = quiet_config();
    c.firstBucketBytes = 100 * 4; // 100 floats
    c.bucketCapBytes = 1000 * 4;
    chorusDdp_t ddp;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    Net net;
    // Registered p0..p6; filled from p6 backwards.
    register_all(ddp, net, {500, 400, 2000, 300, 300, 60, 50}, false);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    // bucket 0: p6 (50) + p5 would make 110 > 100 -> p6 alone;
    // bucket 1: p5 60 + p4 300 + p3 300 = 660, + p2 2000 > 1000 -> close;
    // bucket 2: p2 alone (larger than the cap); bucket 3: p1 400 + p0 500 = 900.
    int expect[7] = {3, 3, 2, 1, 1, 1, 0};
    for (int i = 0; i < 7; i++) {
        int b = -1;
        ASSERT_EQ(chorusDdpBucketOf(ddp, i, &b), ncclSuccess);
        EXPECT_EQ(b, expect[i]) << "parameter " << i;
    }
    int nb = 0;
    ASSERT_EQ(chorusDdpBucketCount(ddp, &nb), ncclSuccess);
    EXPECT_EQ(nb, 4);
    chorusDdpDestroy(ddp);
}

TEST(DdpBuckets, GradViewsAreContiguousInsideTheBucket) {
    chorusDdpConfig_t c = quiet_config();
    c.gradAsBucketView = 1;
    chorusDdp_t ddp;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    Net net;
    register_all(ddp, net, {10, 20, 30}, true);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    float *g[3];
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(chorusDdpGradPtr(ddp, i, (void **)&g[i]), ncclSuccess);
    // One bucket, laid out in reverse registration order: p2, p1, p0.
    EXPECT_EQ(g[1], g[2] + 30);
    EXPECT_EQ(g[0], g[1] + 20);
    for (int i = 0; i < 3; i++)
        for (size_t e = 0; e < net.p[i].size(); e++)
            g[i][e] = (float)(i * 100 + e);
    for (int i = 2; i >= 0; i--)
        ASSERT_EQ(chorusDdpGradReady(ddp, i), ncclSuccess);
    ASSERT_EQ(chorusDdpFinishGrads(ddp), ncclSuccess);
    // One rank: the average is the value itself, in place.
    for (int i = 0; i < 3; i++)
        for (size_t e = 0; e < net.p[i].size(); e++)
            EXPECT_EQ(g[i][e], (float)(i * 100 + e));
    chorusDdpMemory_t mem;
    ASSERT_EQ(chorusDdpMemoryUsage(ddp, &mem), ncclSuccess);
    EXPECT_EQ(mem.paramBytes, 60u * 4);
    EXPECT_EQ(mem.gradBytes, 60u * 4);
    EXPECT_EQ(mem.commBytes, 0u); // the bucket is the gradients' own home
    chorusDdpDestroy(ddp);
}

TEST(DdpErrors, UnusedParameterIsNamed) {
    chorusDdpConfig_t c = quiet_config();
    chorusDdp_t ddp;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    Net net;
    register_all(ddp, net, {4, 4, 4}, false);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    ASSERT_EQ(chorusDdpGradReady(ddp, 2), ncclSuccess);
    ASSERT_EQ(chorusDdpGradReady(ddp, 0), ncclSuccess);
    EXPECT_EQ(chorusDdpFinishGrads(ddp), ncclInvalidUsage);
    std::string msg = chorusDdpGetLastError(ddp);
    EXPECT_NE(msg.find("'p1'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("'p0'"), std::string::npos) << msg;
    // Marking one twice is named too.
    ASSERT_EQ(chorusDdpGradReady(ddp, 1), ncclSuccess);
    EXPECT_EQ(chorusDdpGradReady(ddp, 1), ncclInvalidUsage);
    EXPECT_NE(std::string(chorusDdpGetLastError(ddp)).find("'p1'"), std::string::npos);
    chorusDdpDestroy(ddp);
}

TEST(DdpErrors, UnusedParameterAsZeroWhenOptedIn) {
    chorusDdpConfig_t c = quiet_config();
    c.unused = CHORUS_DDP_UNUSED_ZERO;
    chorusDdp_t ddp;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    Net net;
    register_all(ddp, net, {4, 4, 4}, false);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    net.g[1].assign(4, 5.0f); // stale values from an earlier step
    ASSERT_EQ(chorusDdpGradReady(ddp, 0), ncclSuccess);
    EXPECT_EQ(chorusDdpFinishGrads(ddp), ncclSuccess);
    for (float v : net.g[1])
        EXPECT_EQ(v, 0.0f);
    chorusDdpDestroy(ddp);
}

TEST(DdpErrors, BadArgumentsAreNamed) {
    chorusDdpConfig_t c = quiet_config();
    c.commDtype = ncclInt32;
    chorusDdp_t ddp = nullptr;
    EXPECT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclInvalidArgument);
    EXPECT_NE(std::string(chorusDdpGetLastError(nullptr)).find("commDtype"), std::string::npos);
    c = quiet_config();
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    float p[4], g[4];
    EXPECT_EQ(chorusDdpRegisterParam(ddp, "w", p, 4, ncclInt8, g, nullptr), ncclInvalidArgument);
    EXPECT_NE(std::string(chorusDdpGetLastError(ddp)).find("dtype"), std::string::npos);
    ASSERT_EQ(chorusDdpRegisterParam(ddp, "w", p, 4, ncclFloat32, g, nullptr), ncclSuccess);
    EXPECT_EQ(chorusDdpRegisterParam(ddp, "w", p, 4, ncclFloat32, g, nullptr), ncclInvalidArgument);
    EXPECT_NE(std::string(chorusDdpGetLastError(ddp)).find("already registered"),
              std::string::npos);
    EXPECT_EQ(chorusDdpGradReady(ddp, 0), ncclInvalidUsage); // before Start
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    EXPECT_EQ(chorusDdpGradReady(ddp, 7), ncclInvalidArgument);
    EXPECT_NE(std::string(chorusDdpGetLastError(ddp)).find("7"), std::string::npos);
    chorusDdpDestroy(ddp);
}

// count x element size must fit (it wrapped: SIZE_MAX / 4 + 1 floats are 0 bytes), and so must
// every buffer's end.
TEST(DdpErrors, CountOverflowIsNamed) {
    chorusDdpConfig_t c = quiet_config();
    chorusDdp_t ddp = nullptr;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    float p[4], g[4];
    EXPECT_EQ(chorusDdpRegisterParam(ddp, "w", p, SIZE_MAX / 4 + 1, ncclFloat32, g, nullptr),
              ncclInvalidArgument);
    EXPECT_NE(std::string(chorusDdpGetLastError(ddp)).find("count"), std::string::npos)
        << chorusDdpGetLastError(ddp);
    EXPECT_EQ(chorusDdpRegisterParam(ddp, "v", p, SIZE_MAX, ncclFloat64, g, nullptr),
              ncclInvalidArgument);
    EXPECT_EQ(chorusDdpRegisterBuffer(ddp, "b", p, SIZE_MAX), ncclInvalidArgument);
    EXPECT_EQ(chorusDdpRegisterBuffer(ddp, "b", (void *)(UINTPTR_MAX - 16), 64),
              ncclInvalidArgument);
    // The layer still works.
    ASSERT_EQ(chorusDdpRegisterParam(ddp, "w", p, 4, ncclFloat32, g, nullptr), ncclSuccess);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    chorusDdpDestroy(ddp);
}

TEST(DdpNoSync, AccumulatesWithoutCommunicating) {
    chorusDdpConfig_t c = quiet_config();
    chorusDdp_t ddp;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    Net net;
    register_all(ddp, net, {8}, false);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    ASSERT_EQ(chorusDdpNoSync(ddp, 1), ncclSuccess);
    for (int k = 0; k < 3; k++) {
        ASSERT_EQ(chorusDdpGradReady(ddp, 0), ncclSuccess);
        ASSERT_EQ(chorusDdpFinishGrads(ddp), ncclSuccess);
    }
    chorusDdpStats_t st;
    ASSERT_EQ(chorusDdpGetStats(ddp, &st, 0), ncclSuccess);
    EXPECT_EQ(st.buckets, 0);
    ASSERT_EQ(chorusDdpNoSync(ddp, 0), ncclSuccess);
    ASSERT_EQ(chorusDdpGradReady(ddp, 0), ncclSuccess);
    EXPECT_EQ(chorusDdpNoSync(ddp, 1), ncclInvalidUsage); // mid-step
    ASSERT_EQ(chorusDdpFinishGrads(ddp), ncclSuccess);
    ASSERT_EQ(chorusDdpGetStats(ddp, &st, 0), ncclSuccess);
    EXPECT_EQ(st.buckets, 1);
    chorusDdpDestroy(ddp);
}

// bf16: round to nearest even of the top 16 bits, computed independently.
float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lsb = (u >> 16) & 1;
    u = (u + 0x7fff + lsb) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

TEST(DdpWire, Bf16AndFp16RoundTripRoundsGradients) {
    for (ncclDataType_t wire : {ncclBfloat16, ncclFloat16}) {
        chorusDdpConfig_t c = quiet_config();
        c.commDtype = wire;
        chorusDdp_t ddp;
        ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
        Net net;
        register_all(ddp, net, {1000}, false);
        ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
        std::vector<float> orig(1000);
        for (int i = 0; i < 1000; i++)
            orig[i] = net.g[0][i] = std::sin(0.37f * i) * 3.0f + 1e-3f;
        ASSERT_EQ(chorusDdpGradReady(ddp, 0), ncclSuccess);
        ASSERT_EQ(chorusDdpFinishGrads(ddp), ncclSuccess);
        for (int i = 0; i < 1000; i++) {
            if (wire == ncclBfloat16) {
                EXPECT_EQ(net.g[0][i], bf16_round(orig[i])) << i;
            } else {
                // fp16 keeps 11 significant bits: error at most half an ulp (2^-11 relative).
                EXPECT_NEAR(net.g[0][i], orig[i], std::fabs(orig[i]) * (1.0 / 2048) + 1e-7) << i;
                EXPECT_NE(net.g[0][i], orig[i] + 1.0f);
            }
        }
        chorusDdpDestroy(ddp);
    }
}

// ---- sampler ----

TEST(DdpSampler, EverySampleOncePerEpochAcrossRanks) {
    for (int nranks : {1, 2, 3, 4}) {
        for (size_t n : {(size_t)12, (size_t)103}) {
            for (int drop : {0, 1}) {
                std::vector<int> uses(n, 0);
                size_t per = 0;
                std::vector<std::vector<size_t>> epoch0(nranks), epoch1(nranks);
                for (int r = 0; r < nranks; r++) {
                    chorusDdpSampler_t s;
                    ASSERT_EQ(chorusDdpSamplerCreate(n, nranks, r, 42, 1, drop, &s), ncclSuccess);
                    const size_t *idx;
                    size_t cnt;
                    ASSERT_EQ(chorusDdpSamplerSetEpoch(s, 0), ncclSuccess);
                    ASSERT_EQ(chorusDdpSamplerIndices(s, &idx, &cnt), ncclSuccess);
                    if (r == 0) per = cnt;
                    EXPECT_EQ(cnt, per) << "every rank gets the same count";
                    for (size_t k = 0; k < cnt; k++) {
                        ASSERT_LT(idx[k], n);
                        uses[idx[k]]++;
                    }
                    epoch0[r].assign(idx, idx + cnt);
                    ASSERT_EQ(chorusDdpSamplerSetEpoch(s, 1), ncclSuccess);
                    ASSERT_EQ(chorusDdpSamplerIndices(s, &idx, &cnt), ncclSuccess);
                    epoch1[r].assign(idx, idx + cnt);
                    ASSERT_EQ(chorusDdpSamplerSetEpoch(s, 0), ncclSuccess);
                    ASSERT_EQ(chorusDdpSamplerIndices(s, &idx, &cnt), ncclSuccess);
                    EXPECT_EQ(epoch0[r], std::vector<size_t>(idx, idx + cnt)) << "reproducible";
                    chorusDdpSamplerDestroy(s);
                }
                size_t rem = n % nranks;
                size_t twice = 0, never = 0;
                for (int u : uses) {
                    twice += u == 2;
                    never += u == 0;
                    EXPECT_LE(u, 2);
                }
                if (drop) {
                    EXPECT_EQ(twice, 0u);
                    EXPECT_EQ(never, rem);
                    EXPECT_EQ(per, n / nranks);
                } else {
                    EXPECT_EQ(never, 0u);
                    EXPECT_EQ(twice, rem ? nranks - rem : 0);
                    EXPECT_EQ(per, (n + nranks - 1) / nranks);
                }
                if (n > 50) EXPECT_NE(epoch0, epoch1) << "set_epoch must reshuffle";
            }
        }
    }
}

TEST(DdpSampler, NoShuffleIsRoundRobin) {
    chorusDdpSampler_t s;
    ASSERT_EQ(chorusDdpSamplerCreate(10, 3, 1, 0, 0, 0, &s), ncclSuccess);
    const size_t *idx;
    size_t cnt;
    ASSERT_EQ(chorusDdpSamplerIndices(s, &idx, &cnt), ncclSuccess);
    EXPECT_EQ(std::vector<size_t>(idx, idx + cnt), (std::vector<size_t>{1, 4, 7, 0}));
    chorusDdpSamplerDestroy(s);
    EXPECT_EQ(chorusDdpSamplerCreate(10, 3, 3, 0, 0, 0, &s), ncclInvalidArgument);
}

// ---- checkpoint (one rank) ----

TEST(DdpCheckpoint, RoundTripRestoresParamsStateAndBuffers) {
    std::string path = "/tmp/chorus_ddp_ckpt_" + std::to_string(getpid());
    chorusDdpConfig_t c = quiet_config();
    c.optStateSlots = 2;
    Net a;
    int64_t step = 17;
    chorusDdp_t ddp;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    register_all(ddp, a, {5, 7}, false);
    ASSERT_EQ(chorusDdpRegisterBuffer(ddp, "step", &step, sizeof(step)), ncclSuccess);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    const chorusDdpPiece_t *pc;
    int np;
    ASSERT_EQ(chorusDdpGetPieces(ddp, &pc, &np), ncclSuccess);
    ASSERT_EQ(np, 2);
    for (int i = 0; i < np; i++)
        for (size_t e = 0; e < pc[i].count; e++) {
            ((float *)pc[i].state[0])[e] = 0.5f * (float)e + (float)i;
            ((float *)pc[i].state[1])[e] = -1.0f * (float)e;
        }
    for (size_t e = 0; e < 7; e++)
        a.p[1][e] = 3.25f * (float)e;
    ASSERT_EQ(chorusDdpSave(ddp, path.c_str()), ncclSuccess);
    chorusDdpDestroy(ddp);

    Net b;
    int64_t step2 = 0;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    register_all(ddp, b, {5, 7}, false);
    ASSERT_EQ(chorusDdpRegisterBuffer(ddp, "step", &step2, sizeof(step2)), ncclSuccess);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    ASSERT_EQ(chorusDdpLoad(ddp, path.c_str()), ncclSuccess);
    EXPECT_EQ(step2, 17);
    EXPECT_EQ(a.p, b.p);
    ASSERT_EQ(chorusDdpGetPieces(ddp, &pc, &np), ncclSuccess);
    for (int i = 0; i < np; i++)
        for (size_t e = 0; e < pc[i].count; e++) {
            EXPECT_EQ(((float *)pc[i].state[0])[e], 0.5f * (float)e + (float)i);
            EXPECT_EQ(((float *)pc[i].state[1])[e], -1.0f * (float)e);
        }
    chorusDdpDestroy(ddp);

    // A registration that differs is named.
    Net d;
    ASSERT_EQ(chorusDdpCreate(nullptr, &c, &ddp), ncclSuccess);
    register_all(ddp, d, {5, 8}, false);
    ASSERT_EQ(chorusDdpRegisterBuffer(ddp, "step", &step2, sizeof(step2)), ncclSuccess);
    ASSERT_EQ(chorusDdpStart(ddp), ncclSuccess);
    EXPECT_EQ(chorusDdpLoad(ddp, path.c_str()), ncclInvalidUsage);
    EXPECT_NE(std::string(chorusDdpGetLastError(ddp)).find("'p1'"), std::string::npos)
        << chorusDdpGetLastError(ddp);
    EXPECT_EQ(chorusDdpLoad(ddp, "/nonexistent/dir/ckpt"), ncclSystemError);
    chorusDdpDestroy(ddp);
    unlink(path.c_str());
}

// ---- IDX ----

TEST(DdpIdx, ParsesHeaderAndRejectsBadFiles) {
    std::vector<uint8_t> blob = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3};
    for (int i = 0; i < 12; i++)
        blob.push_back((uint8_t)i);
    uint32_t dims[3];
    char err[256];
    const uint8_t *data = idx_parse(blob.data(), blob.size(), 3, dims, err, sizeof(err));
    ASSERT_NE(data, nullptr) << err;
    EXPECT_EQ(dims[0], 2u);
    EXPECT_EQ(dims[1], 2u);
    EXPECT_EQ(dims[2], 3u);
    EXPECT_EQ(data[11], 11);
    EXPECT_EQ(idx_parse(blob.data(), blob.size() - 1, 3, dims, err, sizeof(err)), nullptr);
    EXPECT_NE(std::string(err).find("truncated"), std::string::npos);
    blob[2] = 0x0d; // float elements
    EXPECT_EQ(idx_parse(blob.data(), blob.size(), 3, dims, err, sizeof(err)), nullptr);
    EXPECT_NE(std::string(err).find("uint8"), std::string::npos);
}

TEST(DdpIdx, MissingDataNamesThePackage) {
    idx_set_t s;
    char err[1024];
    EXPECT_EQ(idx_load("/nonexistent/fashion", "train", &s, err, sizeof(err)), -1);
    EXPECT_NE(std::string(err).find("dataset-fashion-mnist"), std::string::npos) << err;
}

TEST(DdpIdx, ReadsFashionMnistTestSetWhenInstalled) {
    if (access(IDX_DEFAULT_DIR "/t10k-images-idx3-ubyte.gz", R_OK) != 0)
        GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    idx_set_t s;
    char err[1024];
    ASSERT_EQ(idx_load(IDX_DEFAULT_DIR, "t10k", &s, err, sizeof(err)), 0) << err;
    EXPECT_EQ(s.n, 10000u);
    EXPECT_EQ(s.rows, 28);
    EXPECT_EQ(s.cols, 28);
    std::vector<int> per_class(10, 0);
    for (size_t i = 0; i < s.n; i++)
        per_class[s.labels[i]]++;
    for (int c = 0; c < 10; c++)
        EXPECT_EQ(per_class[c], 1000); // the test set is balanced
    float mx = 0;
    for (size_t i = 0; i < s.n * 784; i++)
        mx = s.images[i] > mx ? s.images[i] : mx;
    EXPECT_FLOAT_EQ(mx, 1.0f);
    idx_free(&s);
}

} // namespace
