// test_device_memalloc.cc: ncclMemAlloc / ncclMemFree on the device runtime's emulator
// (CHORUS_DEVICE_EMU=1), where the allocation is made through the runtime's cuMem entries (ch_rt.h
// mem_*: a memfd mapped and made accessible, exportable as a file descriptor) as on a GPU.
//
// Sizes 0 (refused), 1, odd and large: each rounded up to the granularity, emulated device memory
// from its first to its last byte, gone after ncclMemFree. A pointer ncclMemAlloc did not hand out
// (a stack variable, ch_emu_malloc memory, an interior pointer, a freed one) is refused with
// ncclInvalidArgument. A runtime without cuMem gives plain device memory, which is described by
// its allocation's legacy IPC handle (no descriptor) as cudaMalloc's; host memory is described
// by nothing; no device at all gives host memory. A mapping is not device memory until access is
// granted. The memory carries a 2-rank device-path all-reduce between thread ranks (the kernel) and
// between forked ranks (copy-engine programs); and a file descriptor exported by one process and
// sent over a Unix socket maps the same bytes in another, both ways.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/ch_rt.h"
#include "device/ch_rt_emu.h"
#include "launch.h"
#include "mem_alloc.h"
#include "nccl.h"
#include "peer_mem.h"
#include "scoped_env.h"
extern "C" {
#include "cuda_util.h"
#include "fd_chan.h"
#include "param.h"
}

namespace {

using chorus_test::ScopedEnv;

const size_t kGran = (size_t)2 << 20; // the emulator's granularity

class MemAlloc : public ::testing::Test {
  protected:
    void SetUp() override {
        setenv("CHORUS_DEVICE_EMU", "1", 1);
        chorus_param_reset();
    }
    void TearDown() override {
        ch_emu_set_cumem(1);
        unsetenv("CHORUS_DEVICE_EMU");
        chorus_param_reset();
    }
};

// Sizes 1, odd and large: exportable emulated device memory over the whole rounded mapping, which
// keeps what is written to it, and which ncclMemFree unmaps. Size 0 is refused.
TEST_F(MemAlloc, SizesEmulator) {
    void *p = nullptr;
    EXPECT_EQ(ncclMemAlloc(&p, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclMemAlloc(nullptr, 8), ncclInvalidArgument);
    for (size_t size : {(size_t)1, (size_t)4097, 3 * kGran + 5, ((size_t)256 << 20) + 1}) {
        SCOPED_TRACE("size " + std::to_string(size));
        ASSERT_EQ(ncclMemAlloc(&p, size), ncclSuccess);
        ASSERT_NE(p, nullptr);
        mem_alloc_info_t info;
        ASSERT_EQ(mem_alloc_find(p, &info), 1);
        EXPECT_EQ(info.kind, MEM_ALLOC_CUMEM);
        EXPECT_EQ(info.base, p);
        EXPECT_EQ(info.size, size);
        EXPECT_EQ(info.mapped % kGran, 0u);
        EXPECT_GE(info.mapped, size);
        EXPECT_LT(info.mapped - size, kGran);
        EXPECT_EQ(info.rt, ch_rt_emu());
        unsigned char *c = (unsigned char *)p;
        EXPECT_TRUE(ch_emu_is_device(c));
        EXPECT_TRUE(ch_emu_is_device(c + info.mapped - 1));
        EXPECT_EQ(chorus_mem_kind(c + size - 1), CHORUS_MEM_DEVICE);
        c[0] = 0x5a;
        c[size - 1] = 0xc3;
        c[size / 2] = 0x77;
        EXPECT_EQ(c[0], size == 1 ? 0x77 : 0x5a);
        EXPECT_EQ(c[size - 1], size == 1 ? 0x77 : 0xc3);
        ASSERT_EQ(ncclMemFree(p), ncclSuccess);
        EXPECT_FALSE(ch_emu_is_device(c));
        EXPECT_EQ(mem_alloc_find(p, &info), 0);
    }
}

// Pointers ncclMemAlloc did not hand out are refused and leave the allocation alone.
TEST_F(MemAlloc, FreeOfForeignPointers) {
    int local = 0;
    EXPECT_EQ(ncclMemFree(&local), ncclInvalidArgument);
    void *emu = ch_emu_malloc(4096);
    ASSERT_NE(emu, nullptr);
    EXPECT_EQ(ncclMemFree(emu), ncclInvalidArgument);
    EXPECT_TRUE(ch_emu_is_device(emu)); // untouched
    ch_emu_free(emu);
    void *p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, 1000), ncclSuccess);
    EXPECT_EQ(ncclMemFree((char *)p + 8), ncclInvalidArgument); // interior pointer
    EXPECT_TRUE(ch_emu_is_device(p));
    EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
    EXPECT_EQ(ncclMemFree(p), ncclSuccess);
    EXPECT_EQ(ncclMemFree(p), ncclInvalidArgument); // already freed
}

// A runtime without cuMem: plain device memory (the cudaMalloc fallback), not exportable, freed
// with the runtime's own free.
TEST_F(MemAlloc, FallbackWithoutCuMem) {
    ch_emu_set_cumem(0);
    void *p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, 12345), ncclSuccess);
    mem_alloc_info_t info;
    ASSERT_EQ(mem_alloc_find(p, &info), 1);
    EXPECT_EQ(info.kind, MEM_ALLOC_DEVICE);
    EXPECT_TRUE(ch_emu_is_device(p));
    EXPECT_TRUE(ch_emu_is_device((char *)p + 12344));
    int fd = -1;
    size_t off = 0, mapped = 0;
    EXPECT_EQ(mem_alloc_export_fd(p, &fd, &off, &mapped), ncclInvalidArgument);
    EXPECT_EQ(fd, -1);
    ASSERT_EQ(ncclMemFree(p), ncclSuccess);
    EXPECT_FALSE(ch_emu_is_device(p));
}

// No device (no GPU, no emulator): page-aligned host memory.
TEST_F(MemAlloc, HostWithoutDevice) {
    if (chorus_cuda_available())
        GTEST_SKIP() << "a GPU is current: ncclMemAlloc gives device memory";
    setenv("CHORUS_DEVICE_EMU", "0", 1);
    chorus_param_reset();
    void *p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, 5000), ncclSuccess);
    mem_alloc_info_t info;
    ASSERT_EQ(mem_alloc_find(p, &info), 1);
    EXPECT_EQ(info.kind, MEM_ALLOC_HOST);
    EXPECT_EQ((uintptr_t)p % 4096, 0u);
    EXPECT_FALSE(ch_emu_is_device(p));
    memset(p, 0xab, 5000);
    EXPECT_EQ(ncclMemFree(p), ncclSuccess);
}

// The runtime's entries one by one: a mapping is not device memory until access is granted; the
// exported fd maps the same physical memory at a second address in this process too.
TEST_F(MemAlloc, RuntimeEntriesEmulator) {
    const ch_rt_t *rt = ch_rt_emu();
    size_t gran = 0;
    ASSERT_EQ(rt->mem_granularity(0, &gran), ncclSuccess);
    ASSERT_EQ(gran, kGran);
    uint64_t h = 0;
    ASSERT_EQ(rt->mem_create(0, gran, &h), ncclSuccess);
    void *p = nullptr;
    ASSERT_EQ(rt->mem_map(h, gran, gran, &p), ncclSuccess);
    EXPECT_FALSE(ch_emu_is_device(p));
    ASSERT_EQ(rt->mem_set_access(p, gran, 0), ncclSuccess);
    EXPECT_TRUE(ch_emu_is_device(p));
    memset(p, 0x3c, 100);
    int fd = -1;
    ASSERT_EQ(rt->mem_export_fd(h, &fd), ncclSuccess);
    mem_import_t im{};
    ASSERT_EQ(mem_alloc_import(rt, 0, fd, gran, &im), ncclSuccess);
    close(fd); // the import holds its own reference
    ASSERT_NE(im.ptr, p);
    EXPECT_EQ(((unsigned char *)im.ptr)[99], 0x3c);
    ((unsigned char *)im.ptr)[100] = 0x11;
    EXPECT_EQ(((unsigned char *)p)[100], 0x11);
    EXPECT_EQ(mem_alloc_import(rt, 0, fd, gran + 1, &im), ncclInvalidArgument);
    mem_alloc_unimport(&im);
    EXPECT_EQ(im.ptr, nullptr);
    rt->mem_unmap(p, gran);
    EXPECT_FALSE(ch_emu_is_device(p));
    rt->mem_release(h);
}

// Input element i of rank r.
float input(int r, size_t i) {
    return (float)((r + 1) * 3 + (int)(i % 1009));
}

// One rank: an all-reduce on ncclMemAlloc buffers, out of place and in place, at an LL-sized and a
// SIMPLE-sized count; each call launches once on the rank's stream (the device path took it).
int allreduce_rank(int r, int n, ncclUniqueId id) {
    ch_emu_stream_t *st = ch_emu_stream_create();
    RANK_CHECK(st != nullptr, "no emulated stream");
    ncclComm_t comm;
    RANK_NCCL(ncclCommInitRank(&comm, n, id, r));
    int bad = 0;
    for (size_t count : {(size_t)1001, (size_t)40003}) {
        float *in = nullptr, *out = nullptr;
        RANK_NCCL(ncclMemAlloc((void **)&in, count * sizeof(float)));
        RANK_NCCL(ncclMemAlloc((void **)&out, count * sizeof(float)));
        for (int inplace = 0; inplace < 2 && !bad; inplace++) {
            float *dst = inplace ? in : out;
            for (size_t i = 0; i < count; i++) {
                in[i] = input(r, i);
                out[i] = -1;
            }
            const unsigned long before = ch_emu_stream_launches(st);
            RANK_NCCL(ncclAllReduce(in, dst, count, ncclFloat32, ncclSum, comm, (cudaStream_t)st));
            RANK_NCCL(ch_emu_stream_sync(st));
            RANK_CHECK(ch_emu_stream_launches(st) == before + 1, "%lu launches, want 1",
                       ch_emu_stream_launches(st) - before);
            for (size_t i = 0; i < count; i++) {
                float want = 0;
                for (int q = 0; q < n; q++)
                    want += input(q, i);
                if (dst[i] != want && bad++ < 3)
                    fprintf(stderr, "rank %d count %zu inplace %d: element %zu is %g, want %g\n", r,
                            count, inplace, i, (double)dst[i], (double)want);
            }
        }
        RANK_NCCL(ncclMemFree(in));
        RANK_NCCL(ncclMemFree(out));
    }
    RANK_NCCL(ncclCommDestroy(comm));
    ch_emu_stream_destroy(st);
    return bad ? 1 : 0;
}

TEST_F(MemAlloc, AllReduceThreads) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_threads(2, [&](int r, int n) { return allreduce_rank(r, n, id); });
    EXPECT_TRUE(res.ok()) << res.detail;
}

TEST_F(MemAlloc, AllReduceForked) {
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_forked(2, [&](int r, int n) { return allreduce_rank(r, n, id); });
    EXPECT_TRUE(res.ok()) << res.detail;
}

// The sizes a sender passes along with the descriptor.
struct ExportMsg {
    size_t offset, mapped, size;
};

int send_fd(int sock, int fd, const ExportMsg &m) {
    struct iovec iov = {(void *)&m, sizeof(m)};
    char ctl[CMSG_SPACE(sizeof(int))];
    memset(ctl, 0, sizeof(ctl));
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof(ctl);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &msg, 0) == (ssize_t)sizeof(m) ? 0 : -1;
}

int recv_fd(int sock, ExportMsg *m) {
    struct iovec iov = {(void *)m, sizeof(*m)};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof(ctl);
    if (recvmsg(sock, &msg, 0) != (ssize_t)sizeof(*m)) return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

unsigned char pattern(size_t i, int round) {
    return (unsigned char)(i * 131 + 7 + round * 29);
}

// Two forked processes: the first allocates (after the fork, so nothing is inherited) and fills
// the memory, exports it and sends the descriptor over a Unix socket; the second maps it, finds the
// bytes, writes its own over them and answers; the first then finds those.
TEST_F(MemAlloc, ExportImportForked) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    const size_t size = 3 * kGran + 123;
    auto res = chorus_test::run_forked(2, [&](int r, int) -> int {
        const int sock = sv[r];
        close(sv[1 - r]);
        struct timeval tv = {60, 0};
        RANK_CHECK(setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0, "timeout");
        char ack = 0;
        if (r == 0) {
            unsigned char *p = nullptr;
            RANK_NCCL(ncclMemAlloc((void **)&p, size));
            for (size_t i = 0; i < size; i++)
                p[i] = pattern(i, 0);
            int fd = -1;
            ExportMsg m{};
            // An interior address: the offset says where it lies in the allocation.
            RANK_NCCL(mem_alloc_export_fd(p + 4096, &fd, &m.offset, &m.mapped));
            RANK_CHECK(m.offset == 4096 && m.mapped == 4 * kGran, "offset %zu mapped %zu", m.offset,
                       m.mapped);
            m.size = size;
            RANK_CHECK(send_fd(sock, fd, m) == 0, "sendmsg");
            close(fd);
            RANK_CHECK(read(sock, &ack, 1) == 1 && ack == 'w', "no answer from the importer");
            size_t wrong = 0;
            for (size_t i = 0; i < size; i++)
                wrong += p[i] != pattern(i, 1);
            RANK_CHECK(wrong == 0, "%zu bytes are not what the importer wrote", wrong);
            RANK_NCCL(ncclMemFree(p));
            return 0;
        }
        ExportMsg m{};
        const int fd = recv_fd(sock, &m);
        RANK_CHECK(fd >= 0, "no descriptor received");
        mem_import_t im{};
        RANK_NCCL(mem_alloc_import(ch_rt_emu(), 0, fd, m.mapped, &im));
        close(fd);
        unsigned char *p = (unsigned char *)im.ptr;
        RANK_CHECK(ch_emu_is_device(p + m.mapped - 1), "the import is not device memory");
        size_t wrong = 0;
        for (size_t i = 0; i < m.size; i++)
            wrong += p[i] != pattern(i, 0);
        RANK_CHECK(wrong == 0, "%zu bytes differ from the exporter's", wrong);
        for (size_t i = 0; i < m.size; i++)
            p[i] = pattern(i, 1);
        mem_alloc_unimport(&im);
        ack = 'w';
        RANK_CHECK(write(sock, &ack, 1) == 1, "write");
        return 0;
    });
    close(sv[0]);
    close(sv[1]);
    EXPECT_TRUE(res.ok()) << res.detail;
}

// What each rank publishes (through an all-gather of host memory): its descriptor channel and,
// on rank 0, the description of the shared buffer.
struct Published {
    fd_chan_addr_t chan;
    peer_mem_desc_t desc;
};

// One ncclMemAlloc buffer of rank 0 used by n processes: rank 0 describes it from an interior
// address (the runtime tells that it is cuMem memory) and passes its descriptor over the
// descriptor channel to every peer, which maps it (peer_mem_open) and finds rank 0's bytes. Every
// rank then writes its slice through its mapping, and an all-gather on the device path (copy-
// engine programs) reads each rank's slice of the shared buffer as that rank's input: every rank
// gets every slice, checked against the values written. Memory that is not cuMem (a plain device
// allocation) is described by its allocation's legacy IPC handle and the range's offset, with no
// descriptor to pass; host memory is not described.
int shared_buffer_rank(int rank, int n, const ncclUniqueId &id, size_t count) {
    const size_t lead = 4096; // the buffer used starts inside the allocation
    const size_t bytes = lead + (size_t)n * count * sizeof(float) + 8;
    ch_emu_stream_t *st = ch_emu_stream_create();
    RANK_CHECK(st != nullptr, "no emulated stream");
    ncclComm_t comm;
    RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
    unsigned char *alloc = nullptr;
    int fd = -1;
    Published mine{}, *all = new Published[(size_t)n];
    fd_chan_t *ch = nullptr;
    RANK_NCCL(fd_chan_open(rank, &ch, &mine.chan));
    if (rank == 0) {
        ch_emu_set_cumem(0);
        void *plain = nullptr;
        RANK_NCCL(ncclMemAlloc(&plain, 4096));
        peer_mem_desc_t d;
        int pfd = -1;
        RANK_NCCL(peer_mem_describe(ch_rt_emu(), (char *)plain + 256, 1024, nullptr, &d, &pfd));
        RANK_CHECK(d.kind == PEER_MEM_IPC && d.offset == 256 && d.ipc.ptr == (uintptr_t)plain &&
                       pfd < 0,
                   "plain device memory: kind %u offset %llu base 0x%llx fd %d\n", d.kind,
                   (unsigned long long)d.offset, (unsigned long long)d.ipc.ptr, pfd);
        RANK_NCCL(ncclMemFree(plain));
        std::vector<char> host(4096);
        RANK_CHECK(peer_mem_describe(ch_rt_emu(), host.data(), 4096, nullptr, &d, &pfd) ==
                           ncclInvalidArgument &&
                       pfd < 0,
                   "host memory was described\n");
        ch_emu_set_cumem(1);
        RANK_NCCL(ncclMemAlloc((void **)&alloc, bytes));
        for (size_t i = 0; i < bytes; i++)
            alloc[i] = pattern(i, 0);
        RANK_NCCL(
            peer_mem_describe(ch_rt_emu(), alloc + lead, bytes - lead, nullptr, &mine.desc, &fd));
        RANK_CHECK(mine.desc.kind == PEER_MEM_CUMEM && mine.desc.offset == lead &&
                       mine.desc.mapped == kGran,
                   "described as kind %u offset %llu mapped %llu", mine.desc.kind,
                   (unsigned long long)mine.desc.offset, (unsigned long long)mine.desc.mapped);
    }
    RANK_NCCL(ncclAllGather(&mine, all, sizeof(Published), ncclUint8, comm, nullptr));
    fd_chan_addr_t *addrs = new fd_chan_addr_t[(size_t)n];
    for (int q = 0; q < n; q++)
        addrs[q] = all[q].chan;
    std::vector<fd_chan_msg_t> out;
    fd_chan_msg_t in{};
    in.peer = 0;
    in.tag = 7;
    if (rank == 0)
        for (int q = 1; q < n; q++) {
            fd_chan_msg_t m{};
            m.peer = q;
            m.tag = 7;
            m.fd = fd;
            out.push_back(m);
        }
    RANK_NCCL(fd_chan_exchange(ch, addrs, n, out.data(), (int)out.size(), &in, rank == 0 ? 0 : 1,
                               60, nullptr));
    // Under the emulator rank 0 maps its own buffer a second time too, from its own descriptor.
    peer_mem_map_t map{};
    const unsigned long before = peer_mem_opened(PEER_MEM_CUMEM);
    RANK_NCCL(peer_mem_open(ch_rt_emu(), 0, &all[0].desc, rank == 0 ? fd : in.fd, &map));
    if (fd >= 0) close(fd);
    if (in.fd >= 0) close(in.fd);
    RANK_CHECK(peer_mem_opened(PEER_MEM_CUMEM) - before == 1u,
               "rank %d: the buffer was not imported as cuMem memory", rank);
    unsigned char *shared = (unsigned char *)map.ptr;
    RANK_CHECK(ch_emu_is_device(shared), "the mapping is not device memory");
    size_t wrong = 0;
    for (size_t i = 0; i < bytes - lead; i++)
        wrong += shared[i] != pattern(i + lead, 0);
    RANK_CHECK(wrong == 0, "rank %d: %zu bytes differ from rank 0's", rank, wrong);
    // Everyone has read rank 0's bytes before anyone writes its slice.
    RANK_NCCL(ncclAllGather(&mine, all, sizeof(Published), ncclUint8, comm, nullptr));
    float *slices = (float *)shared;
    for (size_t i = 0; i < count; i++)
        slices[(size_t)rank * count + i] = (float)(rank * 100000 + (int)i);
    float *recv = (float *)ch_emu_malloc((size_t)n * count * sizeof(float));
    RANK_NCCL(ncclAllGather(slices + (size_t)rank * count, recv, count, ncclFloat32, comm,
                            (cudaStream_t)st));
    RANK_NCCL(ch_emu_stream_sync(st));
    RANK_CHECK(ch_emu_stream_launches(st) == 1, "the all-gather did not take the device path");
    wrong = 0;
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
            wrong += recv[(size_t)q * count + i] != (float)(q * 100000 + (int)i);
    RANK_CHECK(wrong == 0, "rank %d: %zu elements of the all-gather are wrong", rank, wrong);
    ch_emu_free(recv);
    // Everyone is done with the buffer before rank 0 frees it.
    RANK_NCCL(ncclAllGather(&mine, all, sizeof(Published), ncclUint8, comm, nullptr));
    peer_mem_close(&map);
    if (rank == 0) RANK_NCCL(ncclMemFree(alloc));
    fd_chan_close(ch);
    delete[] addrs;
    delete[] all;
    RANK_NCCL(ncclCommDestroy(comm));
    ch_emu_stream_destroy(st);
    return 0;
}

class MemAllocShared : public MemAlloc, public ::testing::WithParamInterface<int> {};

TEST_P(MemAllocShared, BufferAcrossProcessesForked) {
    for (size_t count : {(size_t)1, (size_t)1001, (size_t)40003}) {
        SCOPED_TRACE("count " + std::to_string(count));
        ncclUniqueId id = chorus_test::make_unique_id();
        auto res = chorus_test::run_forked(
            GetParam(), [&](int r, int n) { return shared_buffer_rank(r, n, id, count); }, 120);
        EXPECT_TRUE(res.ok()) << res.detail;
    }
}

INSTANTIATE_TEST_SUITE_P(Ranks, MemAllocShared, ::testing::Values(2, 3, 5),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return "n" + std::to_string(i.param);
                         });

} // namespace
