// transport_fixture.cc: see transport_fixture.h.
#include "transport_fixture.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "launch.h"
extern "C" {
#include "topo.h"
}

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace chorus_test {

chorus_unique_id_t transport_make_id() {
    chorus_unique_id_t id;
    memset(&id, 0, sizeof(id));
    ncclResult_t r = bootstrap_get_unique_id(&id);
    if (r != ncclSuccess) fprintf(stderr, "bootstrap_get_unique_id failed: %d\n", (int)r);
    return id;
}

ncclResult_t transport_comm_init(const chorus_unique_id_t &id, int rank, int nranks,
                                 ncclComm **comm_p) {
    *comm_p = nullptr;
    chorus_log_set_rank(rank);
    ncclResult_t r = chorus_param_init();
    if (r != ncclSuccess) return r;
    auto *comm = static_cast<ncclComm *>(calloc(1, sizeof(ncclComm)));
    if (!comm) return ncclSystemError;
    comm->magic = CHORUS_COMM_MAGIC;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->cuda_dev = -1;
    gethostname(comm->host, sizeof(comm->host) - 1);
    pthread_mutex_init(&comm->lock, nullptr);
    comm->peers = static_cast<chorus_locality_t *>(calloc(nranks, sizeof(chorus_locality_t)));
    if (!comm->peers) {
        transport_comm_free(comm);
        return ncclSystemError;
    }
    r = bootstrap_init(&id, rank, nranks, &comm->bs_abort_flag, &comm->bs);
    if (r == ncclSuccess)
        r = topo_fill_locality(rank, -1, bootstrap_addr(comm->bs, rank), &comm->peers[rank]);
    if (r == ncclSuccess) transport_fill_locality(&comm->peers[rank]);
    if (r == ncclSuccess) r = bootstrap_allgather(comm->bs, comm->peers, sizeof(chorus_locality_t));
    comm_fill_transport_ctx(comm);
    if (r != ncclSuccess) {
        fprintf(stderr, "rank %d: transport test comm init failed: %s\n", rank,
                chorus_log_last_error());
        transport_comm_free(comm);
        return r;
    }
    *comm_p = comm;
    return ncclSuccess;
}

void transport_comm_free(ncclComm *comm) {
    if (!comm) return;
    if (comm->bs) bootstrap_close(comm->bs);
    free(comm->peers);
    pthread_mutex_destroy(&comm->lock);
    free(comm);
}

std::vector<std::string> shm_leaks_since(const std::vector<std::string> &before) {
    std::vector<std::string> leaks;
    const std::string prefix = "chorus-shm-";
    for (const auto &f : shm_leftovers()) {
        if (std::find(before.begin(), before.end(), f) != before.end()) continue;
        if (f.compare(0, prefix.size(), prefix) != 0) continue;
        int pid = atoi(f.c_str() + prefix.size());
        bool gone = pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
        if (pid == (int)getpid() || gone) leaks.push_back(f);
    }
    return leaks;
}

void ScopedEnv::set(const char *name, const char *value) {
    const char *old = getenv(name);
    saved_.push_back(Saved{name, old != nullptr, old ? old : ""});
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    chorus_param_reset();
    chorus_log_reset();
}

ScopedEnv::~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
        if (it->had)
            setenv(it->name.c_str(), it->value.c_str(), 1);
        else
            unsetenv(it->name.c_str());
    }
    chorus_param_reset();
    chorus_log_reset();
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    x ^= x >> 33;
    return x;
}

uint64_t pattern_seed(int src, int dst, uint64_t msg) {
    return mix64(((uint64_t)(uint32_t)src << 40) ^ ((uint64_t)(uint32_t)dst << 20) ^ msg ^
                 0x5eed5eed5eedull);
}

// Byte o is byte (o % 8) of mix64(seed + o / 8): cheap to make a word at a time, and every byte
// depends on the seed and on its offset, so shifted, swapped or stale data is caught.
uint8_t pattern_byte(uint64_t seed, size_t offset) {
    return (uint8_t)(mix64(seed + offset / 8) >> ((offset % 8) * 8));
}

void pattern_fill(void *buf, uint64_t seed, size_t offset, size_t bytes) {
    auto *p = static_cast<uint8_t *>(buf);
    size_t i = 0;
    while (i < bytes && (offset + i) % 8 != 0) {
        p[i] = pattern_byte(seed, offset + i);
        i++;
    }
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w = mix64(seed + (offset + i) / 8);
        memcpy(p + i, &w, 8); // little-endian: byte k of w is offset+i+k
    }
    for (; i < bytes; i++)
        p[i] = pattern_byte(seed, offset + i);
}

long long pattern_check(const void *buf, uint64_t seed, size_t offset, size_t bytes) {
    const auto *p = static_cast<const uint8_t *>(buf);
    uint8_t tmp[4096];
    for (size_t done = 0; done < bytes; done += sizeof(tmp)) {
        size_t n = bytes - done < sizeof(tmp) ? bytes - done : sizeof(tmp);
        pattern_fill(tmp, seed, offset + done, n);
        if (memcmp(tmp, p + done, n) != 0) {
            for (size_t k = 0; k < n; k++)
                if (tmp[k] != p[done + k]) return (long long)(done + k);
        }
    }
    return -1;
}

std::string soft_verbs_library() {
    return std::string(CHORUS_BINARY_DIR) + "/lib/libchorus_softib.so";
}

bool ib_hardware_run() {
    const char *v = getenv("CHORUS_TEST_IB_HARDWARE");
    return v && v[0] == '1';
}

void use_soft_verbs(ScopedEnv &env) {
    if (!ib_hardware_run()) env.set("CHORUS_IB_LIBRARY", soft_verbs_library().c_str());
    env.set("NCCL_IB_TIMEOUT", "14");
}

} // namespace chorus_test
