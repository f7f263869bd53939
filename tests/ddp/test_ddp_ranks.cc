// test_ddp_ranks.cc: multi-rank tests of the DDP layer on real Chorus communicators.
//
// Every rank trains the example's MLP on a small synthetic data set (a global batch is the same
// samples however it is split over ranks) and compares against a reference it computes itself:
// one rank without a communicator, batch N*B. Comparing inside the rank lets the same test run
// with ranks as threads and as forked processes. Checked: N ranks x batch B give the same loss
// curve as 1 rank x batch N*B over 100 steps (1e-5 relative), with ranks initialised differently
// (the broadcast at Start must make them agree); sharded matches unsharded; gradient
// accumulation matches a larger batch; bf16 on the wire stays close; an unused parameter is named
// on every rank, or averaged as zero when opted in; replicas stay identical and a corrupted one
// is named; a checkpoint taken mid-run resumes to the same losses on every rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "chorus_ddp.h"
#include "launch.h"
#include "mlp.h"

using chorus_test::Launch;

namespace {

const int kDims[4] = {20, 32, 16, 5};
const int kSamples = 997;

// Sample i of the synthetic set: five Gaussian-ish clusters in 20 dimensions.
void sample(size_t i, float *x, uint8_t *y) {
    int c = (int)(i % 5);
    *y = (uint8_t)c;
    uint64_t h = i * 0x9e3779b97f4a7c15ull + 12345;
    for (int j = 0; j < kDims[0]; j++) {
        h ^= h >> 29;
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 32;
        float noise = (float)((h >> 40) & 0xffff) / 65536.0f - 0.5f;
        x[j] = std::sin((float)(c * 7 + j)) + 1.5f * noise;
    }
}

struct Spec {
    int batch = 8; // per rank per micro-batch
    int steps = 100;
    int accumulate = 1;
    int sharded = 0;
    ncclDataType_t wire = ncclFloat32;
    int views = 1;
    size_t first = 256, cap = 2048; // small buckets: several buckets, shards cut parameters
    bool seed_per_rank = false;     // initialise ranks differently (Start must broadcast rank 0's)
    int check_every = 0;
    int start_step = 0;
    const char *load = nullptr; // checkpoint to load before training
    const char *save = nullptr; // checkpoint to save after `save_after` steps
    int save_after = -1;
    // Gentle enough that rounding differences do not grow chaotically over 100 steps.
    float lr = 0.05f, momentum = 0.5f;
};

struct Out {
    std::vector<double> losses; // global mean loss per step
    std::vector<float> params;  // all parameters after training, registration order
    std::string err;
};

struct Ctx {
    chorusDdp_t ddp;
    int wid[3], bid[3];
};

int on_ready(void *arg, int l) {
    Ctx *c = static_cast<Ctx *>(arg);
    if (chorusDdpGradReady(c->ddp, c->wid[l]) != ncclSuccess) return 1;
    return chorusDdpGradReady(c->ddp, c->bid[l]) != ncclSuccess;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            out->err = std::string(#call) + " -> " + ncclGetErrorString(r_) + ": " +               \
                       chorusDdpGetLastError(nullptr);                                             \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

// Train per spec on this rank; comm NULL means one rank without communication.
int train(const Spec &s, ncclComm_t comm, int rank, int nranks, Out *out) {
    mlp_t m;
    uint64_t seed = 1 + (s.seed_per_rank ? 1000 * (uint64_t)rank : 0);
    if (mlp_init(&m, kDims, 3, s.batch, seed) != 0) return 1;
    chorusDdpConfig_t cfg = CHORUS_DDP_CONFIG_INITIALIZER;
    cfg.firstBucketBytes = s.first;
    cfg.bucketCapBytes = s.cap;
    cfg.gradAsBucketView = s.views;
    cfg.commDtype = s.wire;
    cfg.sharded = s.sharded;
    cfg.optStateSlots = 1;
    cfg.checkEvery = s.check_every;
    cfg.quiet = 1;
    Ctx c;
    int64_t step_buf = s.start_step;
    TRY(chorusDdpCreate(comm, &cfg, &c.ddp));
    for (int l = 0; l < 3; l++) {
        std::string w = "fc" + std::to_string(l + 1) + ".weight";
        std::string b = "fc" + std::to_string(l + 1) + ".bias";
        TRY(chorusDdpRegisterParam(c.ddp, w.c_str(), m.w[l], (size_t)kDims[l] * kDims[l + 1],
                                   ncclFloat32, s.views ? nullptr : m.gw[l], &c.wid[l]));
        TRY(chorusDdpRegisterParam(c.ddp, b.c_str(), m.b[l], (size_t)kDims[l + 1], ncclFloat32,
                                   s.views ? nullptr : m.gb[l], &c.bid[l]));
    }
    TRY(chorusDdpRegisterBuffer(c.ddp, "step", &step_buf, sizeof(step_buf)));
    TRY(chorusDdpStart(c.ddp));
    for (int l = 0; l < 3; l++) {
        TRY(chorusDdpGradPtr(c.ddp, c.wid[l], (void **)&m.gw[l]));
        TRY(chorusDdpGradPtr(c.ddp, c.bid[l], (void **)&m.gb[l]));
    }
    if (s.load) TRY(chorusDdpLoad(c.ddp, s.load));
    std::vector<float> x((size_t)s.batch * kDims[0]);
    std::vector<uint8_t> y(s.batch);
    size_t global = (size_t)s.batch * nranks * s.accumulate;
    for (int st = (int)step_buf; st < s.start_step + s.steps; st++) {
        double loss = 0;
        for (int a = 0; a < s.accumulate; a++) {
            for (int i = 0; i < s.batch; i++) {
                size_t idx =
                    (size_t)st * global + (size_t)a * s.batch * nranks + (size_t)rank * s.batch + i;
                sample(idx % kSamples, &x[(size_t)i * kDims[0]], &y[i]);
            }
            TRY(chorusDdpNoSync(c.ddp, a + 1 < s.accumulate));
            mlp_forward(&m, x.data(), s.batch);
            loss += mlp_loss(&m, y.data(), s.batch, 1.0f / s.accumulate, 1, nullptr) / s.accumulate;
            if (mlp_backward(&m, s.batch, a > 0, on_ready, &c) != 0) {
                out->err = std::string("GradReady: ") + chorusDdpGetLastError(c.ddp);
                return 1;
            }
            TRY(chorusDdpFinishGrads(c.ddp));
        }
        const chorusDdpPiece_t *pc;
        int np;
        TRY(chorusDdpGetPieces(c.ddp, &pc, &np));
        for (int i = 0; i < np; i++) {
            float *p = (float *)pc[i].param, *g = (float *)pc[i].grad, *v = (float *)pc[i].state[0];
            for (size_t e = 0; e < pc[i].count; e++) {
                v[e] = s.momentum * v[e] + g[e];
                p[e] -= s.lr * v[e];
            }
        }
        TRY(chorusDdpSyncParams(c.ddp));
        if (comm) {
            TRY(ncclAllReduce(&loss, &loss, 1, ncclFloat64, ncclSum, comm, nullptr));
            loss /= nranks;
        }
        out->losses.push_back(loss);
        step_buf = st + 1;
        if (s.save && st + 1 == s.save_after) TRY(chorusDdpSave(c.ddp, s.save));
    }
    int first_bad = -2;
    TRY(chorusDdpCheckReplicas(c.ddp, &first_bad));
    if (first_bad != -1) {
        out->err = "CheckReplicas reported " + std::to_string(first_bad);
        return 1;
    }
    for (int l = 0; l < 3; l++) {
        out->params.insert(out->params.end(), m.w[l], m.w[l] + kDims[l] * kDims[l + 1]);
        out->params.insert(out->params.end(), m.b[l], m.b[l] + kDims[l + 1]);
    }
    chorusDdpDestroy(c.ddp);
    mlp_free(&m);
    return 0;
}

// Relative difference of two loss curves / parameter vectors; index of the worst in *at.
template <typename T> double max_rel(const std::vector<T> &a, const std::vector<T> &b, size_t *at) {
    double worst = a.size() == b.size() ? 0 : 1e30;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        double d = std::fabs((double)a[i] - (double)b[i]) /
                   std::max(1e-3, std::max(std::fabs((double)a[i]), std::fabs((double)b[i])));
        if (d > worst) {
            worst = d;
            *at = i;
        }
    }
    return worst;
}

ncclComm_t make_comm(ncclUniqueId id, int rank, int nranks) {
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
    if (r != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclCommInitRank: %s %s\n", rank, ncclGetErrorString(r),
                ncclGetLastError(nullptr));
        return nullptr;
    }
    return comm;
}

// Run `dist` on nranks ranks and compare each rank's curve with `ref` on one rank, no comm.
void expect_same_curve(Launch how, int nranks, const Spec &dist, const Spec &ref, double tol) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(how, nranks, [&](int rank, int n) {
        Out mine, want;
        ncclComm_t comm = make_comm(id, rank, n);
        RANK_CHECK(comm != nullptr, "no communicator");
        int rc = train(dist, comm, rank, n, &mine);
        ncclCommDestroy(comm);
        RANK_CHECK(rc == 0, "distributed run failed: %s", mine.err.c_str());
        RANK_CHECK(train(ref, nullptr, 0, 1, &want) == 0, "reference failed: %s", want.err.c_str());
        size_t at = 0;
        double d = max_rel(mine.losses, want.losses, &at);
        if (getenv("DDP_TEST_VERBOSE") && rank == 0)
            for (size_t i = 0; i < mine.losses.size(); i += 10)
                fprintf(stderr, "step %zu: %.9g %.9g\n", i, mine.losses[i], want.losses[i]);
        RANK_CHECK(d <= tol, "loss curves differ: step %zu: %.9g vs reference %.9g (rel %.3g)", at,
                   mine.losses[at], want.losses[at], d);
        d = max_rel(mine.params, want.params, &at);
        RANK_CHECK(d <= 100 * tol, "final parameter %zu differs: %.9g vs %.9g (rel %.3g)", at,
                   (double)mine.params[at], (double)want.params[at], d);
        RANK_CHECK(want.losses.back() < 0.5 * want.losses.front(), "reference did not learn");
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

class DdpRanks : public ::testing::TestWithParam<Launch> {};

TEST_P(DdpRanks, NRanksBatchBEqualsOneRankBatchNB) {
    for (int n : {2, 3}) {
        Spec dist, ref;
        dist.seed_per_rank = true; // Start's broadcast must give every rank rank 0's weights
        ref.batch = dist.batch * n;
        expect_same_curve(GetParam(), n, dist, ref, 1e-5);
    }
}

TEST_P(DdpRanks, CopyModeMatchesToo) {
    Spec dist, ref;
    dist.views = 0;
    ref.batch = 16;
    expect_same_curve(GetParam(), 2, dist, ref, 1e-5);
}

TEST_P(DdpRanks, ShardedMatchesUnsharded) {
    for (int n : {2, 3}) {
        Spec dist, ref;
        dist.sharded = 1;
        dist.seed_per_rank = true;
        ref.batch = dist.batch * n;
        expect_same_curve(GetParam(), n, dist, ref, 1e-5);
    }
}

TEST_P(DdpRanks, AccumulationMatchesLargerBatch) {
    Spec dist, ref;
    dist.batch = 4;
    dist.accumulate = 2;
    ref.batch = 16;
    expect_same_curve(GetParam(), 2, dist, ref, 1e-5);
}

TEST_P(DdpRanks, Bf16WireStaysClose) {
    Spec dist, ref;
    dist.wire = ncclBfloat16;
    ref.batch = 16;
    ref.steps = dist.steps = 50;
    expect_same_curve(GetParam(), 2, dist, ref, 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Launchers, DdpRanks, ::testing::Values(Launch::Threads, Launch::Forked),
                         [](const ::testing::TestParamInfo<Launch> &i) {
                             return std::string(chorus_test::launch_name(i.param));
                         });

TEST(DdpRanksErrors, UnusedParameterIsNamedOnEveryRank) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(2, [&](int rank, int n) {
        ncclComm_t comm = make_comm(id, rank, n);
        RANK_CHECK(comm != nullptr, "no communicator");
        for (int mode : {CHORUS_DDP_UNUSED_ERROR, CHORUS_DDP_UNUSED_ZERO}) {
            chorusDdpConfig_t cfg = CHORUS_DDP_CONFIG_INITIALIZER;
            cfg.quiet = 1;
            cfg.unused = mode;
            chorusDdp_t ddp;
            float used[4] = {0}, gused[4] = {1, 1, 1, 1}, spare[3] = {0}, gspare[3] = {0};
            RANK_NCCL(chorusDdpCreate(comm, &cfg, &ddp));
            RANK_NCCL(
                chorusDdpRegisterParam(ddp, "head.weight", used, 4, ncclFloat32, gused, nullptr));
            RANK_NCCL(chorusDdpRegisterParam(ddp, "aux_head.bias", spare, 3, ncclFloat32, gspare,
                                             nullptr));
            RANK_NCCL(chorusDdpStart(ddp));
            for (int step = 0; step < 3; step++) {
                for (float &g : gused)
                    g = 1.0f;
                for (float &g : gspare)
                    g = 6.0f;
                RANK_NCCL(chorusDdpGradReady(ddp, 0));
                // Rank 0 uses the spare parameter from step 1 on; rank 1 never does.
                if (mode == CHORUS_DDP_UNUSED_ZERO && rank == 0 && step > 0)
                    RANK_NCCL(chorusDdpGradReady(ddp, 1));
                ncclResult_t r = chorusDdpFinishGrads(ddp);
                if (mode == CHORUS_DDP_UNUSED_ERROR) {
                    RANK_CHECK(r == ncclInvalidUsage, "expected ncclInvalidUsage, got %d", r);
                    std::string msg = chorusDdpGetLastError(ddp);
                    RANK_CHECK(msg.find("'aux_head.bias'") != std::string::npos, "message: %s",
                               msg.c_str());
                    RANK_CHECK(msg.find("'head.weight'") == std::string::npos,
                               "names the used parameter too: %s", msg.c_str());
                } else {
                    RANK_CHECK(r == ncclSuccess, "zero mode failed: %s",
                               chorusDdpGetLastError(ddp));
                    float want = step > 0 ? 3.0f : 0.0f; // (6 + 0) / 2
                    for (float g : gspare)
                        RANK_CHECK(g == want, "spare grad %g, want %g", g, want);
                    for (float g : gused)
                        RANK_CHECK(g == 1.0f, "used grad %g", g);
                }
            }
            chorusDdpDestroy(ddp);
        }
        ncclCommDestroy(comm);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(DdpRanksErrors, DivergedReplicaIsNamed) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(3, [&](int rank, int n) {
        ncclComm_t comm = make_comm(id, rank, n);
        RANK_CHECK(comm != nullptr, "no communicator");
        chorusDdpConfig_t cfg = CHORUS_DDP_CONFIG_INITIALIZER;
        cfg.quiet = 1;
        cfg.checkEvery = 1;
        chorusDdp_t ddp;
        std::vector<float> a(100, 1.0f + rank), b(50, 2.0f * rank), ga(100), gb(50);
        RANK_NCCL(chorusDdpCreate(comm, &cfg, &ddp));
        RANK_NCCL(chorusDdpRegisterParam(ddp, "enc.weight", a.data(), 100, ncclFloat32, ga.data(),
                                         nullptr));
        RANK_NCCL(chorusDdpRegisterParam(ddp, "dec.weight", b.data(), 50, ncclFloat32, gb.data(),
                                         nullptr));
        RANK_NCCL(chorusDdpStart(ddp));
        RANK_CHECK(a[7] == 1.0f && b[3] == 0.0f, "broadcast from rank 0 missing");
        int bad = -2;
        RANK_NCCL(chorusDdpCheckReplicas(ddp, &bad));
        RANK_CHECK(bad == -1, "identical replicas reported %d", bad);
        // Rank 2 corrupts one element of the second parameter.
        if (rank == 2) b[49] += 1e-6f;
        ncclResult_t r = chorusDdpCheckReplicas(ddp, &bad);
        RANK_CHECK(r == ncclInvalidUsage && bad == 1, "r=%d bad=%d", r, bad);
        std::string msg = chorusDdpGetLastError(ddp);
        RANK_CHECK(msg.find("'dec.weight'") != std::string::npos &&
                       msg.find("rank 2") != std::string::npos,
                   "message: %s", msg.c_str());
        // The periodic check in FinishGrads reports it too.
        RANK_NCCL(chorusDdpGradReady(ddp, 1));
        RANK_NCCL(chorusDdpGradReady(ddp, 0));
        r = chorusDdpFinishGrads(ddp);
        RANK_CHECK(r == ncclInvalidUsage, "FinishGrads with checkEvery=1 returned %d", r);
        chorusDdpDestroy(ddp);
        ncclCommDestroy(comm);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST(DdpRanksCheckpoint, ResumeGivesTheSameLossesOnEveryRank) {
    for (int sharded : {0, 1}) {
        std::string path = "/tmp/chorus_ddp_ranks_ckpt_" + std::to_string(getpid()) + "_" +
                           std::to_string(sharded);
        ncclUniqueId id = chorus_test::make_unique_id();
        auto res = chorus_test::run_threads(2, [&](int rank, int n) {
            ncclComm_t comm = make_comm(id, rank, n);
            RANK_CHECK(comm != nullptr, "no communicator");
            Spec full;
            full.sharded = sharded;
            full.steps = 30;
            full.save = path.c_str();
            full.save_after = 20;
            Out a, b;
            RANK_CHECK(train(full, comm, rank, n, &a) == 0, "first run: %s", a.err.c_str());
            Spec resume;
            resume.sharded = sharded;
            resume.seed_per_rank = true; // fresh, different weights: the load must replace them
            resume.start_step = 0;       // the step buffer in the checkpoint says 20
            resume.steps = 30;
            resume.load = path.c_str();
            RANK_CHECK(train(resume, comm, rank, n, &b) == 0, "resumed run: %s", b.err.c_str());
            ncclCommDestroy(comm);
            RANK_CHECK(b.losses.size() == 10, "resumed %zu steps, want 10", b.losses.size());
            for (int i = 0; i < 10; i++)
                RANK_CHECK(b.losses[i] == a.losses[20 + i], "step %d: %.9g vs %.9g", 20 + i,
                           b.losses[i], a.losses[20 + i]);
            RANK_CHECK(a.params == b.params, "final parameters differ");
            return 0;
        });
        EXPECT_TRUE(res.ok()) << "sharded=" << sharded << "\n" << res.detail;
        unlink(path.c_str());
    }
}

TEST(DdpRanksMemory, ShardingDividesGradientAndStateMemory) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(4, [&](int rank, int n) {
        ncclComm_t comm = make_comm(id, rank, n);
        RANK_CHECK(comm != nullptr, "no communicator");
        chorusDdpMemory_t mem[2];
        for (int sharded : {0, 1}) {
            chorusDdpConfig_t cfg = CHORUS_DDP_CONFIG_INITIALIZER;
            cfg.quiet = 1;
            cfg.sharded = sharded;
            cfg.optStateSlots = 2;
            cfg.gradAsBucketView = 1;
            std::vector<float> p(4000);
            chorusDdp_t ddp;
            RANK_NCCL(chorusDdpCreate(comm, &cfg, &ddp));
            RANK_NCCL(
                chorusDdpRegisterParam(ddp, "w", p.data(), 4000, ncclFloat32, nullptr, nullptr));
            RANK_NCCL(chorusDdpStart(ddp));
            RANK_NCCL(chorusDdpMemoryUsage(ddp, &mem[sharded]));
            chorusDdpDestroy(ddp);
        }
        RANK_CHECK(mem[0].gradBytes == 16000 && mem[1].gradBytes == 4000, "grads %zu / %zu",
                   mem[0].gradBytes, mem[1].gradBytes);
        RANK_CHECK(mem[0].optStateBytes == 32000 && mem[1].optStateBytes == 8000, "state %zu / %zu",
                   mem[0].optStateBytes, mem[1].optStateBytes);
        ncclCommDestroy(comm);
        return 0;
    });
    EXPECT_TRUE(res.ok()) << res.detail;
}

} // namespace
