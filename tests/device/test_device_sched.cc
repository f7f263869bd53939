// test_device_sched.cc: the schedules of src/device move the same chunks in the same order as
// the host engine's ring and chain algorithms.
//
// The binary carries a copy of src/collectives/ring_common.c built with CHORUS_RING_TRACE=1
// (extra.cmake), whose coll_ring_trace below records every step the host engine runs: channel,
// primitive, peers, input and output offsets, count. Thread ranks then run every ring
// collective through the real library (ring algorithm only, small slots so ops take several
// loops, two channels), and each rank's recorded steps per op and channel must equal what
// ch_sched_next yields for the plan built from the same op (its channel count, chunk size and
// ring order as the host planned them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "coll_engine.h"
#include "coll_ring.h"
#include "comm.h"
#include "device/ch_sched.h"
#include "launch.h"

namespace {

struct OpInfo {
    ch_plan_t plan;
    std::vector<int> ring;
    std::vector<std::vector<ch_step_t>> steps; // per channel
};

std::mutex g_mu;
std::map<std::pair<int, uint64_t>, OpInfo> g_ops; // (rank, op seq) -> what the host ran

int ch_kind_of(int prim) {
    switch (prim) {
    case PRIM_SEND:
        return CH_K_SEND;
    case PRIM_SEND_COPY:
        return CH_K_SEND_COPY;
    case PRIM_PREP_SEND:
        return CH_K_PREP_SEND;
    case PRIM_RECV:
        return CH_K_RECV;
    case PRIM_RECV_REDUCE_SEND:
        return CH_K_RECV_REDUCE_SEND;
    case PRIM_RECV_REDUCE_COPY:
        return CH_K_RECV_REDUCE_COPY;
    case PRIM_RECV_REDUCE_COPY_SEND:
        return CH_K_RECV_REDUCE_COPY_SEND;
    case PRIM_RECV_COPY_SEND:
        return CH_K_RECV_COPY_SEND;
    default:
        return -1 - prim; /* a primitive the device schedules do not use */
    }
}

} // namespace

extern "C" void coll_ring_trace(const coll_op_t *op, const coll_ring_at_t *at,
                                const coll_chunk_t *cc, int uses) {
    const struct ncclComm *comm = op->comm;
    const size_t es = op->esize;
    ch_step_t s;
    ch_step_init(&s);
    s.kind = ch_kind_of(cc->kind);
    s.send_peer = uses & COLL_RING_TX ? comm->channels[at->c].next : -1;
    s.recv_peer = uses & COLL_RING_RX ? comm->channels[at->c].prev : -1;
    if (cc->in) s.in_off = (size_t)((const char *)cc->in - (const char *)op->sendbuff) / es;
    if (cc->dst) s.out_off = (size_t)((const char *)cc->dst - (const char *)op->recvbuff) / es;
    s.count = cc->count;
    std::lock_guard<std::mutex> lk(g_mu);
    OpInfo &oi = g_ops[{comm->rank, op->seq}];
    if (oi.ring.empty()) {
        const int n = comm->nranks;
        ch_plan_t &p = oi.plan;
        memset(&p, 0, sizeof(p));
        p.coll = (int)op->coll;
        p.nranks = n;
        p.rank = comm->rank;
        p.root = op->root;
        p.send_peer = p.recv_peer = -1;
        p.nch = op->nch;
        p.count = op->count;
        p.esize = es;
        p.chunk_elems = op->chunk_elems;
        const char *mine = (const char *)op->recvbuff + (size_t)comm->rank * op->count * es;
        p.inplace =
            op->coll == COLL_ALLGATHER ? op->sendbuff == mine : op->sendbuff == op->recvbuff;
        for (int c = 0; c < op->nch; c++)
            for (int i = 0; i < n; i++)
                oi.ring.push_back(comm->channels[c].ring[i]);
        oi.steps.resize(op->nch);
    }
    oi.steps.at(at->c).push_back(s);
}

namespace {

static_assert((int)COLL_ALLREDUCE == CH_COLL_ALLREDUCE && (int)COLL_REDUCE == CH_COLL_REDUCE &&
                  (int)COLL_ALLGATHER == CH_COLL_ALLGATHER,
              "the device collectives number the ring collectives as the engine does");

std::string step_text(const ch_step_t &s) {
    auto off = [](size_t o) { return o == CH_NONE ? std::string("-") : std::to_string(o); };
    return "{kind " + std::to_string(s.kind) + " send " + std::to_string(s.send_peer) + " recv " +
           std::to_string(s.recv_peer) + " in " + off(s.in_off) + " out " + off(s.out_off) +
           " count " + std::to_string(s.count) + "}";
}

bool same_step(const ch_step_t &a, const ch_step_t &b) {
    return a.kind == b.kind && a.send_peer == b.send_peer && a.recv_peer == b.recv_peer &&
           a.in_off == b.in_off && a.out_off == b.out_off && a.count == b.count;
}

const int kColls[] = {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_ALLGATHER, COLL_BROADCAST,
                      COLL_REDUCE};

ncclResult_t call_coll(int coll, const void *in, void *out, size_t count, ncclDataType_t t,
                       int root, ncclComm_t comm) {
    switch (coll) {
    case COLL_ALLREDUCE:
        return ncclAllReduce(in, out, count, t, ncclSum, comm, nullptr);
    case COLL_REDUCESCATTER:
        return ncclReduceScatter(in, out, count, t, ncclSum, comm, nullptr);
    case COLL_ALLGATHER:
        return ncclAllGather(in, out, count, t, comm, nullptr);
    case COLL_BROADCAST:
        return ncclBroadcast(in, out, count, t, root, comm, nullptr);
    default:
        return ncclReduce(in, out, count, t, ncclSum, root, comm, nullptr);
    }
}

struct Env {
    const char *name, *value;
};
// Ring only, no one-shot/direct/LL algorithms, no streaming; 4 KiB slots so ops of a few KiB
// take several loops; two channels.
const Env kEnv[] = {{"CHORUS_ALGO", "ring"},
                    {"CHORUS_TRANSPORT", "shm"},
                    {"CHORUS_DIRECT_THRESHOLD", "0"},
                    {"CHORUS_ONESHOT_THRESHOLD", "0"},
                    {"CHORUS_STREAM_THRESHOLD", "0"},
                    {"NCCL_BUFFSIZE", "16384"},
                    {"NCCL_NSLOTS", "4"},
                    {"CHORUS_SHM_RING_CHUNK", "0"},
                    {"CHORUS_MIN_NCHANNELS", "2"},
                    {"CHORUS_MAX_NCHANNELS", "2"}};

class DeviceSched : public ::testing::TestWithParam<int> {
  protected:
    void SetUp() override {
        for (const Env &e : kEnv)
            setenv(e.name, e.value, 1);
        ncclResetDebugInit();
        std::lock_guard<std::mutex> lk(g_mu);
        g_ops.clear();
    }
    void TearDown() override {
        for (const Env &e : kEnv)
            unsetenv(e.name);
        ncclResetDebugInit();
    }
};

TEST_P(DeviceSched, RingSchedulesMatchHostEngine) {
    const int n = GetParam();
    const ncclDataType_t types[] = {ncclInt8, ncclFloat32, ncclFloat64};
    // Each rank runs the same list of ops; the sizes are chosen per dtype from the slot size.
    struct Op {
        int coll;
        ncclDataType_t t;
        size_t count;
        bool inplace;
        int root;
    };
    std::vector<Op> ops;
    for (ncclDataType_t t : types) {
        const size_t es = t == ncclInt8 ? 1 : t == ncclFloat32 ? 4 : 8;
        const size_t chunk = 4096 / es;
        for (int coll : kColls)
            for (size_t count : {(size_t)0, (size_t)1, (size_t)37, chunk + 13, 3 * chunk * n + 5})
                for (bool inplace : {false, true})
                    ops.push_back({coll, t, count, inplace, (int)(count % n)});
    }
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(
        n,
        [&](int rank, int nr) -> int {
            ncclComm_t comm;
            RANK_NCCL(ncclCommInitRank(&comm, nr, id, rank));
            for (const Op &o : ops) {
                const size_t es = o.t == ncclInt8 ? 1 : o.t == ncclFloat32 ? 4 : 8;
                const size_t big = o.count * nr + 1;
                std::vector<char> in(big * es, 1), out(big * es, 0);
                const void *sb = in.data();
                void *rb = out.data();
                if (o.inplace) {
                    if (o.coll == COLL_ALLGATHER)
                        sb = out.data() + (size_t)rank * o.count * es;
                    else if (o.coll == COLL_REDUCESCATTER) {
                        sb = out.data();
                        rb = out.data() + (size_t)rank * o.count * es;
                    } else
                        sb = out.data();
                }
                RANK_NCCL(call_coll(o.coll, sb, rb, o.count, o.t, o.root, comm));
            }
            RANK_NCCL(ncclCommDestroy(comm));
            return 0;
        },
        240);
    ASSERT_TRUE(res.ok()) << res.detail;

    // Every op of more than one rank and at least one element ran through coll_ring_drive.
    size_t traced_ops = 0;
    for (const Op &o : ops)
        traced_ops += n > 1 && o.count > 0;
    std::lock_guard<std::mutex> lk(g_mu);
    EXPECT_EQ(g_ops.size(), traced_ops * n);
    size_t steps = 0;
    for (auto &kv : g_ops) {
        OpInfo &oi = kv.second;
        oi.plan.ring = oi.ring.data();
        for (int c = 0; c < oi.plan.nch; c++) {
            SCOPED_TRACE("rank " + std::to_string(kv.first.first) + " op " +
                         std::to_string(kv.first.second) + " coll " + std::to_string(oi.plan.coll) +
                         " count " + std::to_string(oi.plan.count) + " esize " +
                         std::to_string(oi.plan.esize) + " channel " + std::to_string(c));
            std::vector<ch_step_t> mine;
            ch_iter_t it;
            ch_step_t s;
            ch_sched_begin(&oi.plan, c, &it);
            while (ch_sched_next(&oi.plan, c, &it, &s))
                mine.push_back(s);
            const std::vector<ch_step_t> &host = oi.steps[c];
            ASSERT_EQ(mine.size(), host.size());
            for (size_t i = 0; i < host.size(); i++)
                ASSERT_TRUE(same_step(mine[i], host[i]))
                    << "step " << i << ": device " << step_text(mine[i]) << " host "
                    << step_text(host[i]);
            steps += host.size();
        }
    }
    if (n == 1) {
        EXPECT_EQ(steps, 0u);
        return;
    }
    // The sweep covered what it is for: ops on both channels, and channels of several loops.
    int max_nch = 0;
    size_t max_loops = 0;
    for (auto &kv : g_ops) {
        max_nch = std::max(max_nch, kv.second.plan.nch);
        for (auto &st : kv.second.steps)
            max_loops = std::max(max_loops, st.size() / (size_t)ch_loop_steps(&kv.second.plan));
    }
    EXPECT_EQ(max_nch, 2);
    EXPECT_GE(max_loops, 2u);
    printf("n=%d: %zu ops x ranks, %zu steps compared, up to %zu loops a channel\n", n,
           g_ops.size(), steps, max_loops);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceSched, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return "n" + std::to_string(i.param);
                         });

// A single rank: the host engine runs ring collectives locally without coll_ring_drive; the
// device schedule gives one local step per channel (none for an in-place copy).
TEST(DeviceSchedFixed, SingleRankIsOneLocalStep) {
    const int ring0[] = {0, 0};
    for (int coll : kColls)
        for (int inplace : {0, 1}) {
            ch_plan_t p;
            memset(&p, 0, sizeof(p));
            p.coll = coll;
            p.nranks = 1;
            p.nch = 1;
            p.inplace = inplace;
            p.count = 1000;
            p.esize = 4;
            p.chunk_elems = 64;
            p.ring = ring0;
            ch_iter_t it;
            ch_step_t s;
            ch_sched_begin(&p, 0, &it);
            int nsteps = 0;
            while (ch_sched_next(&p, 0, &it, &s)) {
                nsteps++;
                EXPECT_EQ(s.count, 1000u);
                EXPECT_EQ(s.send_peer, -1);
                EXPECT_EQ(s.recv_peer, -1);
            }
            const bool copy = coll == COLL_ALLGATHER || coll == COLL_BROADCAST;
            EXPECT_EQ(nsteps, copy && inplace ? 0 : 1) << "coll " << coll;
        }
}

} // namespace
