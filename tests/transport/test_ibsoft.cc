// test_ibsoft.cc: the software verbs provider itself (tests/ibsoft), driven through the verbs API
// in one process: the attribute masks of each queue pair transition, RDMA WRITE WITH IMMEDIATE
// into a registered region, a receiver that is not ready, rkey/bounds/lkey checks, PSN checks,
// RNR retries running out, and the flush of an errored queue pair. The transport's suites rely on
// these rules; here each one is checked where it can fail alone.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport_fixture.h"

namespace chorus_test {
namespace {

struct Verbs {
    void *h = nullptr;
    struct ibv_device **(*get_device_list)(int *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*destroy_qp)(struct ibv_qp *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    bool load() {
        h = dlopen(soft_verbs_library().c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) return false;
        *(void **)&get_device_list = dlsym(h, "ibv_get_device_list");
        *(void **)&open_device = dlsym(h, "ibv_open_device");
        *(void **)&alloc_pd = dlsym(h, "ibv_alloc_pd");
        *(void **)&reg_mr = dlsym(h, "ibv_reg_mr");
        *(void **)&create_cq = dlsym(h, "ibv_create_cq");
        *(void **)&create_qp = dlsym(h, "ibv_create_qp");
        *(void **)&modify_qp = dlsym(h, "ibv_modify_qp");
        *(void **)&destroy_qp = dlsym(h, "ibv_destroy_qp");
        *(void **)&query_gid = dlsym(h, "ibv_query_gid");
        return get_device_list && open_device && alloc_pd && reg_mr && create_cq && create_qp &&
               modify_qp && destroy_qp && query_gid;
    }
};

const int kInit = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
const int kRtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
const int kRts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                 IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;

class IbSoft : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_TRUE(v.load()) << soft_verbs_library() << ": " << dlerror();
        int n = 0;
        struct ibv_device **l = v.get_device_list(&n);
        ASSERT_GE(n, 1);
        ctx = v.open_device(l[0]);
        free(l);
        pd = v.alloc_pd(ctx);
        cq = v.create_cq(ctx, 64, nullptr, nullptr, 0);
        ASSERT_TRUE(ctx && pd && cq);
        src.assign(1 << 16, 0);
        dst.assign(1 << 16, 0);
        smr = v.reg_mr(pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
        dmr = v.reg_mr(pd, dst.data(), dst.size(),
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        ASSERT_TRUE(smr && dmr);
    }
    struct ibv_qp *qp() {
        struct ibv_qp_init_attr a;
        memset(&a, 0, sizeof(a));
        a.send_cq = a.recv_cq = cq;
        a.qp_type = IBV_QPT_RC;
        a.cap.max_send_wr = 8;
        a.cap.max_recv_wr = 8;
        a.cap.max_send_sge = a.cap.max_recv_sge = 1;
        return v.create_qp(pd, &a);
    }
    int to_init(struct ibv_qp *q, int mask = kInit) {
        struct ibv_qp_attr at;
        memset(&at, 0, sizeof(at));
        at.qp_state = IBV_QPS_INIT;
        at.port_num = 1;
        at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
        return v.modify_qp(q, &at, mask);
    }
    int to_rtr(struct ibv_qp *q, uint32_t dest, uint32_t rq_psn, int mask = kRtr) {
        struct ibv_qp_attr at;
        memset(&at, 0, sizeof(at));
        at.qp_state = IBV_QPS_RTR;
        at.path_mtu = IBV_MTU_1024;
        at.dest_qp_num = dest;
        at.rq_psn = rq_psn;
        at.max_dest_rd_atomic = 1;
        at.min_rnr_timer = 12;
        at.ah_attr.port_num = 1;
        at.ah_attr.is_global = 1;
        at.ah_attr.grh.sgid_index = 3;
        v.query_gid(ctx, 1, 3, &at.ah_attr.grh.dgid);
        return v.modify_qp(q, &at, mask);
    }
    int to_rts(struct ibv_qp *q, uint32_t sq_psn, int rnr_retry = 7, int mask = kRts) {
        struct ibv_qp_attr at;
        memset(&at, 0, sizeof(at));
        at.qp_state = IBV_QPS_RTS;
        at.sq_psn = sq_psn;
        at.timeout = 10;
        at.retry_cnt = 2;
        at.rnr_retry = (uint8_t)rnr_retry;
        at.max_rd_atomic = 1;
        return v.modify_qp(q, &at, mask);
    }
    // a -> b, PSNs 100 (a's sends) as b expects unless told otherwise.
    void pair(struct ibv_qp **a, struct ibv_qp **b, uint32_t b_expects = 100, int rnr_retry = 7) {
        *a = qp();
        *b = qp();
        ASSERT_TRUE(*a && *b);
        ASSERT_EQ(to_init(*a), 0);
        ASSERT_EQ(to_init(*b), 0);
        ASSERT_EQ(to_rtr(*a, (*b)->qp_num, 200), 0);
        ASSERT_EQ(to_rtr(*b, (*a)->qp_num, b_expects), 0);
        ASSERT_EQ(to_rts(*a, 100, rnr_retry), 0);
        ASSERT_EQ(to_rts(*b, 200), 0);
    }
    int write(struct ibv_qp *q, uint64_t wr_id, size_t off, size_t len, bool imm,
              uint32_t rkey = 0, uint32_t lkey = 0) {
        struct ibv_sge sge = {(uint64_t)(uintptr_t)src.data(), (uint32_t)len,
                              lkey ? lkey : smr->lkey};
        struct ibv_send_wr wr, *bad;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = wr_id;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.imm_data = htonl((uint32_t)len);
        wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)dst.data() + off;
        wr.wr.rdma.rkey = rkey ? rkey : dmr->rkey;
        return ibv_post_send(q, &wr, &bad);
    }
    int recv(struct ibv_qp *q, uint64_t wr_id) {
        struct ibv_recv_wr wr, *bad;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = wr_id;
        return ibv_post_recv(q, &wr, &bad);
    }
    // Completions until n arrived or 2 s passed.
    std::vector<struct ibv_wc> poll(int n, double wait_s = 2.0) {
        std::vector<struct ibv_wc> out;
        auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
        while ((int)out.size() < n && std::chrono::steady_clock::now() < until) {
            struct ibv_wc wc[8];
            int k = ibv_poll_cq(cq, 8, wc);
            EXPECT_GE(k, 0);
            for (int i = 0; i < k; i++)
                out.push_back(wc[i]);
            if (k == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        return out;
    }
    Verbs v;
    struct ibv_context *ctx = nullptr;
    struct ibv_pd *pd = nullptr;
    struct ibv_cq *cq = nullptr;
    std::vector<uint8_t> src, dst;
    struct ibv_mr *smr = nullptr, *dmr = nullptr;
};

TEST_F(IbSoft, TransitionMasks) {
    struct ibv_qp *q = qp();
    ASSERT_NE(q, nullptr);
    EXPECT_NE(to_rtr(q, 5, 0), 0) << "RESET -> RTR skips INIT";
    EXPECT_NE(to_init(q, kInit & ~IBV_QP_ACCESS_FLAGS), 0) << "INIT without access flags";
    EXPECT_NE(to_init(q, kInit | IBV_QP_SQ_PSN), 0) << "INIT with an RTS attribute";
    ASSERT_EQ(to_init(q), 0);
    EXPECT_NE(to_rtr(q, q->qp_num, 0, kRtr & ~IBV_QP_MIN_RNR_TIMER), 0) << "RTR without RNR timer";
    EXPECT_NE(to_rtr(q, q->qp_num, 0, kRtr & ~IBV_QP_AV), 0) << "RTR without an address";
    EXPECT_NE(to_rts(q, 0), 0) << "INIT -> RTS skips RTR";
    ASSERT_EQ(to_rtr(q, q->qp_num, 0), 0);
    EXPECT_NE(to_rts(q, 0, 7, kRts & ~IBV_QP_SQ_PSN), 0) << "RTS without a send PSN";
    EXPECT_EQ(to_rts(q, 0), 0);
    EXPECT_EQ(v.destroy_qp(q), 0);
}

TEST_F(IbSoft, WriteWithImmWaitsForAReceive) {
    struct ibv_qp *a, *b;
    pair(&a, &b);
    for (size_t i = 0; i < 4096; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    ASSERT_EQ(write(a, 1, 512, 4096, true), 0);
    auto none = poll(1, 0.05);
    EXPECT_TRUE(none.empty()) << "no receive posted: neither end may complete";
    ASSERT_EQ(recv(b, 9), 0);
    auto wc = poll(2);
    ASSERT_EQ(wc.size(), 2u);
    for (auto &w : wc) {
        EXPECT_EQ(w.status, IBV_WC_SUCCESS);
        if (w.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            EXPECT_EQ(w.wr_id, 9u);
            EXPECT_EQ(ntohl(w.imm_data), 4096u);
            EXPECT_EQ(w.byte_len, 4096u);
        } else {
            EXPECT_EQ(w.opcode, IBV_WC_RDMA_WRITE);
            EXPECT_EQ(w.wr_id, 1u);
        }
    }
    EXPECT_EQ(memcmp(dst.data() + 512, src.data(), 4096), 0);
    EXPECT_EQ(dst[511], 0);
    EXPECT_EQ(dst[512 + 4096], 0);
    // A plain write needs no receive.
    ASSERT_EQ(write(a, 2, 0, 100, false), 0);
    wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

TEST_F(IbSoft, RemoteBoundsAndKeysThenFlush) {
    struct ibv_qp *a, *b;
    pair(&a, &b);
    ASSERT_EQ(write(a, 1, dst.size() - 10, 11, false), 0); // one byte past the region
    auto wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(a->state, IBV_QPS_ERR);
    ASSERT_EQ(write(a, 2, 0, 10, false), 0);
    wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    // A wrong rkey on a fresh pair, and the rkey of another region: the same error.
    pair(&a, &b);
    ASSERT_EQ(write(a, 3, 0, 10, false, dmr->rkey ^ 0x100), 0);
    wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    pair(&a, &b);
    ASSERT_EQ(write(a, 4, 0, 10, false, smr->rkey), 0);
    wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(IbSoft, LocalKeyChecked) {
    struct ibv_qp *a, *b;
    pair(&a, &b);
    ASSERT_EQ(write(a, 1, 0, 10, false, 0, smr->lkey ^ 0x100), 0);
    auto wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
    // Posting to a queue pair that is not ready to send is refused at once.
    struct ibv_qp *q = qp();
    ASSERT_EQ(to_init(q), 0);
    EXPECT_EQ(write(q, 2, 0, 10, false), EINVAL);
}

TEST_F(IbSoft, PsnMismatchExceedsRetries) {
    struct ibv_qp *a, *b;
    pair(&a, &b, 101);
    ASSERT_EQ(write(a, 1, 0, 10, false), 0);
    auto wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
}

TEST_F(IbSoft, RnrRetriesRunOut) {
    struct ibv_qp *a, *b;
    pair(&a, &b, 100, 1);
    ASSERT_EQ(write(a, 1, 0, 10, true), 0);
    auto wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
    // Receives posted to an errored queue pair come back flushed.
    ASSERT_EQ(recv(a, 5), 0);
    wc = poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc[0].wr_id, 5u);
}

} // namespace
} // namespace chorus_test
