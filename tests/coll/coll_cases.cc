// coll_cases.cc: the case runner behind the sweeps. Each case fills this rank's input with the
// exact values of coll_util.cc, calls the collective (in place or not) and checks the output
// element by element against the reference computed here.
#include "coll_cases.h"

#include <cstdio>
#include <cstdlib>

namespace coll_test {

const char *coll_str(int c) {
    static const char *n[] = {"allreduce", "reducescatter", "allgather", "broadcast", "reduce",
                              "alltoall",  "gather",        "scatter",   "sendrecv"};
    return c >= 0 && c < C_NCOLLS ? n[c] : "?";
}

std::vector<Case> cross(const std::vector<int> &colls, const std::vector<ncclDataType_t> &types,
                        const std::vector<int> &ops, const std::vector<size_t> &counts) {
    std::vector<Case> out;
    for (int c : colls)
        for (ncclDataType_t t : types)
            for (size_t k = 0; k < ops.size(); k++) {
                bool reduces = c == C_ALLREDUCE || c == C_REDUCESCATTER || c == C_REDUCE;
                if (!reduces && k > 0) break;
                const bool has_inplace = c != C_ALLTOALL && c != C_SENDRECV;
                for (size_t n : counts)
                    for (int ip = 0; ip < (has_inplace ? 2 : 1); ip++)
                        out.push_back({c, t, ops[k], n, ip == 1});
            }
    return out;
}

static void set_or_unset(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

chorus_test::RunResult run_cases(chorus_test::Launch how, int nranks, const std::vector<Case> &cases,
                                 const Env &env, double timeout_s) {
    set_or_unset("CHORUS_ALGO", env.algo);
    set_or_unset("CHORUS_TRANSPORT", env.transport);
    ncclResetDebugInit();
    ncclUniqueId id = chorus_test::make_unique_id();
    auto res = chorus_test::run_ranks(
        how, nranks,
        [&](int rank, int n) -> int { return run_cases_on_new_comm(id, rank, n, cases); },
        timeout_s);
    unsetenv("CHORUS_ALGO");
    unsetenv("CHORUS_TRANSPORT");
    ncclResetDebugInit();
    return res;
}

static int fail_case(int rank, int n, const Case &c, const std::string &why) {
    fprintf(stderr, "rank %d/%d: %s %s %s count=%zu %s: %s\n", rank, n, coll_str(c.coll),
            dtype_str(c.dtype), op_str(c.op), c.count, c.inplace ? "in-place" : "out-of-place",
            why.c_str());
    return 1;
}

// Block q of out (n blocks of c.count elements) must hold rank q's input from element `offset` on.
static bool blocks_match(const Case &c, int n, const void *out, size_t offset, std::string *why) {
    const size_t es = dtype_size(c.dtype), bytes = c.count * es;
    std::vector<unsigned char> want(bytes + 1);
    for (int q = 0; q < n && bytes; q++) {
        fill_input(c.dtype, T_SUM, q, c.count, want.data(), offset);
        if (memcmp(want.data(), (const char *)out + (size_t)q * bytes, bytes) != 0) {
            *why = "block of rank " + std::to_string(q) + " differs";
            return false;
        }
    }
    return true;
}

int run_case(ncclComm_t comm, int rank, int n, const Case &c) {
    const size_t es = dtype_size(c.dtype);
    const size_t cnt = c.count;
    ncclRedOp_t op = ncclSum;
    bool reduces = c.coll == C_ALLREDUCE || c.coll == C_REDUCESCATTER || c.coll == C_REDUCE;
    if (reduces && make_op(comm, c.dtype, c.op, &op) != ncclSuccess)
        return fail_case(rank, n, c, "could not create the reduction op");
    size_t in_elems = cnt, out_elems = cnt;
    if (c.coll == C_REDUCESCATTER || c.coll == C_ALLTOALL || c.coll == C_SCATTER)
        in_elems = cnt * n;
    if (c.coll == C_ALLGATHER || c.coll == C_ALLTOALL || c.coll == C_GATHER) out_elems = cnt * n;
    std::vector<unsigned char> inbuf(in_elems * es + 64), outbuf(out_elems * es + 64);
    // Guard bytes after the output catch writes past the end.
    for (auto &b : outbuf) b = 0xa5;
    void *in = inbuf.data(), *out = outbuf.data();
    int root = (int)(cnt % n);
    ncclResult_t r = ncclSuccess;
    std::string why;
    switch (c.coll) {
    case C_ALLREDUCE:
        if (c.inplace) {
            fill_input(c.dtype, c.op, rank, cnt, out);
            in = out;
        } else {
            fill_input(c.dtype, c.op, rank, cnt, in);
        }
        r = ncclAllReduce(in, out, cnt, c.dtype, op, comm, nullptr);
        if (r == ncclSuccess && !check_reduced(c.dtype, c.op, n, cnt, out, 0, &why))
            return fail_case(rank, n, c, why);
        break;
    case C_REDUCESCATTER:
        if (c.inplace) {
            outbuf.assign(in_elems * es + 64, 0xa5);
            fill_input(c.dtype, c.op, rank, in_elems, outbuf.data());
            in = outbuf.data();
            out = outbuf.data() + (size_t)rank * cnt * es;
        } else {
            fill_input(c.dtype, c.op, rank, in_elems, in);
        }
        r = ncclReduceScatter(in, out, cnt, c.dtype, op, comm, nullptr);
        if (r == ncclSuccess && !check_reduced(c.dtype, c.op, n, cnt, out, (size_t)rank * cnt, &why))
            return fail_case(rank, n, c, why);
        break;
    case C_ALLGATHER:
        if (c.inplace) {
            in = outbuf.data() + (size_t)rank * cnt * es;
            fill_input(c.dtype, T_SUM, rank, cnt, in);
        } else {
            fill_input(c.dtype, T_SUM, rank, cnt, in);
        }
        r = ncclAllGather(in, out, cnt, c.dtype, comm, nullptr);
        if (r == ncclSuccess && !blocks_match(c, n, out, 0, &why)) return fail_case(rank, n, c, why);
        break;
    case C_BROADCAST:
        if (rank == root) fill_input(c.dtype, T_SUM, rank, cnt, c.inplace ? out : in);
        if (c.inplace) in = out;
        r = ncclBroadcast(in, out, cnt, c.dtype, root, comm, nullptr);
        if (r == ncclSuccess) {
            std::vector<unsigned char> want(cnt * es + 1);
            fill_input(c.dtype, T_SUM, root, cnt, want.data());
            if (cnt && memcmp(want.data(), out, cnt * es) != 0)
                return fail_case(rank, n, c, "output differs from the root's input");
        }
        break;
    case C_REDUCE:
        root = (int)((cnt + 1) % n);
        if (c.inplace) {
            fill_input(c.dtype, c.op, rank, cnt, out);
            in = out;
        } else {
            fill_input(c.dtype, c.op, rank, cnt, in);
        }
        r = ncclReduce(in, out, cnt, c.dtype, op, root, comm, nullptr);
        if (r == ncclSuccess && rank == root && !check_reduced(c.dtype, c.op, n, cnt, out, 0, &why))
            return fail_case(rank, n, c, why);
        break;
    case C_ALLTOALL:
        // Block b of rank r's input goes to rank b: it holds elements b*cnt.. of r's input.
        fill_input(c.dtype, T_SUM, rank, in_elems, in);
        r = ncclAlltoAll(in, out, cnt, c.dtype, comm, nullptr);
        if (r == ncclSuccess && !blocks_match(c, n, out, (size_t)rank * cnt, &why))
            return fail_case(rank, n, c, why);
        break;
    case C_GATHER:
        if (c.inplace && rank == root) in = (char *)out + (size_t)root * cnt * es;
        fill_input(c.dtype, T_SUM, rank, cnt, in);
        r = ncclGather(in, out, cnt, c.dtype, root, comm, nullptr);
        if (r == ncclSuccess && rank == root && !blocks_match(c, n, out, 0, &why))
            return fail_case(rank, n, c, why);
        break;
    case C_SCATTER:
        root = (int)((cnt + 1) % n);
        if (rank == root) fill_input(c.dtype, T_SUM, root, in_elems, in);
        if (c.inplace && rank == root) out = (char *)in + (size_t)root * cnt * es;
        r = ncclScatter(in, out, cnt, c.dtype, root, comm, nullptr);
        if (r == ncclSuccess) {
            std::vector<unsigned char> want(cnt * es + 1);
            fill_input(c.dtype, T_SUM, root, cnt, want.data(), (size_t)rank * cnt);
            if (cnt && memcmp(want.data(), out, cnt * es) != 0)
                return fail_case(rank, n, c, "block differs from the root's block for this rank");
        }
        break;
    case C_SENDRECV: {
        fill_input(c.dtype, T_SUM, rank, cnt, in);
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        ncclResult_t r1 = ncclGroupStart();
        ncclResult_t r2 = ncclSend(in, cnt, c.dtype, next, comm, nullptr);
        ncclResult_t r3 = ncclRecv(out, cnt, c.dtype, prev, comm, nullptr);
        r = ncclGroupEnd();
        if (r == ncclSuccess) r = r1 != ncclSuccess ? r1 : r2 != ncclSuccess ? r2 : r3;
        if (r == ncclSuccess) {
            std::vector<unsigned char> want(cnt * es + 1);
            fill_input(c.dtype, T_SUM, prev, cnt, want.data());
            if (cnt && memcmp(want.data(), out, cnt * es) != 0)
                return fail_case(rank, n, c, "received block differs from rank " +
                                                 std::to_string(prev) + "'s input");
        }
        break;
    }
    }
    if (r != ncclSuccess)
        return fail_case(rank, n, c, std::string("call failed: ") + ncclGetErrorString(r) + " (" +
                                         ncclGetLastError(comm) + ")");
    // Nothing written past the output.
    size_t used = (c.coll == C_REDUCESCATTER && c.inplace) ? in_elems * es : out_elems * es;
    for (size_t i = used; i < used + 64; i++)
        if (outbuf[i] != 0xa5) return fail_case(rank, n, c, "wrote past the end of the output");
    if (reduces && c.op == T_PREMUL) ncclRedOpDestroy(op, comm);
    return 0;
}

int run_cases_on_new_comm(const ncclUniqueId &id, int rank, int nranks,
                          const std::vector<Case> &cases) {
    ncclComm_t comm;
    RANK_NCCL(init_comm(&comm, nranks, id, rank));
    int failed = 0;
    for (const Case &c : cases) {
        if (run_case(comm, rank, nranks, c)) {
            failed = 1;
            break;
        }
    }
    RANK_NCCL(ncclCommDestroy(comm));
    return failed;
}

} // namespace coll_test
