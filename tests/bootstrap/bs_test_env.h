// bs_test_env.h: C++ helpers the bootstrap test files share (outside extern "C", unlike
// bs_test_util.h): a scoped environment variable (scoped_env.h), a free root port, and the full
// exercise of a bootstrap handle.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "launch.h"
#include "scoped_env.h"

extern "C" {
#include "bootstrap.h"
#include "param.h"
}

namespace chorus_test {


// A free port below the ephemeral range (launch.h says why); a test failure when there is none.
inline int free_port() {
    int port = free_tcp_port();
    if (port == 0) ADD_FAILURE() << "no free TCP port below the ephemeral range";
    return port;
}

// The full exercise of one rank's bootstrap: accessors, allgather (twice, which must not mix),
// barriers, the address table, ring send/recv with a rank-dependent payload, all checked. A rank
// function's result: 0, or 1 with a message.
inline int exercise_bs(bootstrap_t *bs, int rank, int nranks) {
    RANK_CHECK(bootstrap_rank(bs) == rank && bootstrap_nranks(bs) == nranks, "accessors");
    for (int iter = 0; iter < 2; iter++) {
        std::vector<int> v(3 * nranks, -1);
        for (int k = 0; k < 3; k++)
            v[3 * rank + k] = 1000 * iter + 10 * rank + k;
        RANK_NCCL(bootstrap_allgather(bs, v.data(), 3 * sizeof(int)));
        for (int r = 0; r < nranks; r++)
            for (int k = 0; k < 3; k++)
                RANK_CHECK(v[3 * r + k] == 1000 * iter + 10 * r + k, "slot %d.%d = %d", r, k,
                           v[3 * r + k]);
    }
    RANK_NCCL(bootstrap_barrier(bs));
    RANK_NCCL(bootstrap_barrier(bs));
    // every address in the table has a port and is the one that rank listens on (each rank's
    // own, gathered through an allgather)
    std::vector<chorus_sockaddr_t> own(nranks);
    own[rank] = *bootstrap_addr(bs, rank);
    RANK_NCCL(bootstrap_allgather(bs, own.data(), sizeof(chorus_sockaddr_t)));
    for (int r = 0; r < nranks; r++) {
        const chorus_sockaddr_t *a = bootstrap_addr(bs, r);
        RANK_CHECK(a != nullptr && a->sin.sin_port != 0, "address of rank %d", r);
        RANK_CHECK(memcmp(a, &own[r], sizeof(*a)) == 0, "table entry of rank %d", r);
    }
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    std::vector<uint32_t> out(1000 + rank), in(1000 + prev);
    for (size_t i = 0; i < out.size(); i++)
        out[i] = (uint32_t)(rank * 7919 + i);
    RANK_NCCL(bootstrap_send(bs, next, 42, out.data(), out.size() * 4));
    RANK_NCCL(bootstrap_recv(bs, prev, 42, in.data(), in.size() * 4));
    for (size_t i = 0; i < in.size(); i++)
        RANK_CHECK(in[i] == (uint32_t)(prev * 7919 + i), "ring payload[%zu]", i);
    RANK_NCCL(bootstrap_barrier(bs));
    return 0;
}

} // namespace chorus_test
