// test_device_zerocopy_plain.cc: registered buffers of plain device memory (the emulator's
// dev_alloc, as cudaMalloc's memory on a GPU) read zero-copy by the copy-engine programs
// (src/api/cuda_devpath_zc.c), 2, 3 and 5 ranks as forked processes and as threads.
//
// Such memory travels as a legacy IPC handle of its allocation plus the range's offset
// (ch_rt_t ipc_describe), and a peer process maps each allocation once however many
// registrations lie in it (peer_mem.c; CUDA refuses a second open of one handle in a process,
// and so does the emulator). Every rank allocates one block holding two registrations and an
// output block: all-reduce from the first, all-gather and broadcast from the second, every op
// checked and counted as zero-copy, and the legacy IPC opens counted (one per peer allocation: a
// forked rank opens its n - 1 peers' blocks; thread ranks share their process's n opens).
// Deregistration: every rank frees its block, registers a range at an offset of a new one, is
// read zero-copy again, and the peers drop the old block's open.
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "device/ch_plan.h"
#include "device/ch_rt_emu.h"
#include "launch.h"
#include "nccl.h"
#include "peer_mem.h"
#include "zc_util.h"
extern "C" {
#include "param.h"
}

namespace {

using chorus_test::Launch;
using zctest::barrier;
using zctest::run;
using zctest::Z;

const size_t kMaxCount = 40003;

// The legacy IPC opens this process holds beyond live0 once they reach want (the peers' watchdogs
// close the imports of a deregistered block within a few rounds), or what they are after 10 s.
unsigned long wait_live(unsigned long live0, unsigned long want) {
    const double t0 = chorus_test::now_s();
    unsigned long live = 0;
    while ((live = peer_mem_live(PEER_MEM_IPC) - live0) != want && chorus_test::now_s() - t0 < 10)
        usleep(1000);
    return live;
}

int ops(Z &k, char *in1, char *in2, char *out) {
    for (size_t count : {(size_t)1, (size_t)1001, kMaxCount}) {
        if (run(k, CH_COLL_ALLREDUCE, ncclFloat32, ncclSum, count, 0, false, true, in1, out) ||
            run(k, CH_COLL_ALLGATHER, ncclInt32, ncclSum, count, 0, false, true, in2, out) ||
            run(k, CH_COLL_BROADCAST, ncclFloat32, ncclSum, count, (int)(count % k.n), false, true,
                in2, out))
            return 1;
    }
    return 0;
}

class ZeroCopyPlain : public zctest::ZcSuite {};

TEST_P(ZeroCopyPlain, DevAllocBuffers) {
    const int n = std::get<0>(GetParam());
    const Launch how = std::get<1>(GetParam());
    ncclUniqueId id = chorus_test::make_unique_id();
    const unsigned long opened0 = peer_mem_opened(PEER_MEM_IPC);
    const unsigned long live0 = peer_mem_live(PEER_MEM_IPC);
    // One open per peer allocation: a process's own, or its ranks' shared ones.
    const unsigned long per_block = how == Launch::Forked ? (unsigned long)n - 1 : (unsigned long)n;
    auto res = chorus_test::run_ranks(
        how, n,
        [&](int rank, int nr) -> int {
            Z k;
            k.r = rank;
            k.n = nr;
            k.st = ch_emu_stream_create();
            RANK_CHECK(k.st != nullptr, "no stream\n");
            RANK_NCCL(ncclCommInitRank(&k.comm, nr, id, rank));
            k.cap = (kMaxCount * nr * 8 + 255) / 256 * 256;
            char *block = (char *)ch_emu_malloc(2 * k.cap);
            k.rbuf = (char *)ch_emu_malloc(k.cap);
            RANK_CHECK(block && k.rbuf, "no device memory\n");
            void *h1, *h2;
            RANK_NCCL(ncclCommRegister(k.comm, block, k.cap, &h1));
            RANK_NCCL(ncclCommRegister(k.comm, block + k.cap, k.cap, &h2));
            RANK_NCCL(ncclCommRegister(k.comm, k.rbuf, k.cap, &k.rh));
            if (ops(k, block, block + k.cap, k.rbuf) || barrier(k)) return 1;
            unsigned long opened = peer_mem_opened(PEER_MEM_IPC) - opened0;
            RANK_CHECK(opened == per_block, "rank %d: %lu legacy IPC opens, want %lu\n", rank,
                       opened, per_block);
            if (barrier(k)) return 1; // no rank deregisters while another counts
            RANK_NCCL(ncclCommDeregister(k.comm, h1));
            RANK_NCCL(ncclCommDeregister(k.comm, h2));
            // A deregistration returns once no peer maps the memory (CUDA leaves freeing memory
            // another process has open undefined): after every rank's, no import is left.
            if (barrier(k)) return 1;
            const unsigned long left = peer_mem_live(PEER_MEM_IPC) - live0;
            RANK_CHECK(left == 0, "rank %d: %lu legacy IPC opens still live after every rank "
                       "deregistered\n", rank, left);
            ch_emu_free(block);
            block = (char *)ch_emu_malloc(2 * k.cap);
            RANK_CHECK(block != nullptr, "no device memory\n");
            RANK_NCCL(ncclCommRegister(k.comm, block + 512, k.cap, &h1));
            if (run(k, CH_COLL_ALLREDUCE, ncclInt32, ncclSum, 1001, 0, false, true, block + 512,
                    k.rbuf))
                return 1;
            const unsigned long live = wait_live(live0, per_block);
            opened = peer_mem_opened(PEER_MEM_IPC) - opened0;
            RANK_CHECK(live == per_block && opened == 2 * per_block,
                       "rank %d after the deregistration: %lu legacy IPC opens live, %lu made, "
                       "want %lu and %lu\n",
                       rank, live, opened, per_block, 2 * per_block);
            if (barrier(k)) return 1; // no rank deregisters while another counts
            RANK_NCCL(ncclCommDeregister(k.comm, h1));
            RANK_NCCL(ncclCommDeregister(k.comm, k.rh));
            RANK_NCCL(ncclCommDestroy(k.comm));
            ch_emu_free(block);
            ch_emu_free(k.rbuf);
            ch_emu_stream_destroy(k.st);
            return 0;
        },
        240);
    EXPECT_TRUE(res.ok()) << res.detail;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroCopyPlain,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values(Launch::Forked, Launch::Threads)),
                         zctest::param_name);

} // namespace
