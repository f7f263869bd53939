// transport_transfer.cc: see transport_transfer.h.
#include "transport_transfer.h"

#include "launch.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>

extern "C" {
#include "waiter.h"
}

namespace chorus_test {

std::vector<std::pair<int, int>> ring_edges(int nranks) {
    std::vector<std::pair<int, int>> e;
    for (int r = 0; r < nranks; r++)
        e.emplace_back(r, (r + 1) % nranks);
    return e;
}

std::vector<std::pair<int, int>> all_pair_edges(int nranks) {
    std::vector<std::pair<int, int>> e;
    for (int a = 0; a < nranks; a++)
        for (int b = 0; b < nranks; b++)
            if (a != b) e.emplace_back(a, b);
    return e;
}

std::vector<std::pair<int, int>> both_ways_edges(int a, int b) {
    return {{a, b}, {b, a}};
}

namespace {

struct Link {
    chorus_conn_t conn;
    bool open = false;
    int peer = -1;
    bool is_send = false;
    size_t msg = 0;        // message in progress
    size_t off = 0;        // bytes of it done
    bool draining = false; // sender: a direct chunk is out; its buffer must stay until drained
    bool finished = false;
    std::vector<uint8_t> buf;
};

struct Rank {
    int rank;
    const TransferPlan &plan;
    std::vector<std::unique_ptr<Link>> links;
    size_t completed = 0; // messages sent or received, for failure injection
    std::string error;
};

bool fail(Rank &r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool fail(Rank &r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    r.error = buf;
    return false;
}

// One nonblocking step of a sender. Returns false on error (res_p says which).
bool send_step(Rank &r, Link &l, bool *progress, ncclResult_t *res_p) {
    chorus_conn_t *c = &l.conn;
    const auto &sizes = r.plan.sizes;
    int done = 0;
    if (l.draining || l.msg == sizes.size()) {
        if (l.finished) return true;
        *res_p = c->ops->send_drained(c, &done);
        if (*res_p != ncclSuccess) return fail(r, "send_drained to rank %d -> %d", l.peer, *res_p);
        if (!done) return true;
        *progress = true;
        if (l.draining) {
            l.draining = false;
            l.msg++;
            r.completed++;
            l.off = 0;
        }
        if (l.msg == sizes.size()) l.finished = true;
        return true;
    }
    size_t m = sizes[l.msg];
    uint64_t seed = pattern_seed(r.rank, l.peer, l.msg);
    void *slot = nullptr;
    int ready = 0;
    size_t n = std::min(c->slot_bytes, m - l.off);
    // Even messages announce their exact size (shm writes a small one straight into the slot
    // header), odd ones the whole slot (shm copies a small one into the header at commit).
    *res_p = c->ops->send_acquire(c, (l.msg & 1) ? c->slot_bytes : n, &slot, &ready);
    if (*res_p != ncclSuccess) return fail(r, "send_acquire to rank %d -> %d", l.peer, *res_p);
    if (!ready) return true;
    *progress = true;
    if (r.plan.use_direct && c->direct && l.off == 0 && m >= c->direct_threshold) {
        if (l.buf.size() < m) l.buf.resize(m);
        pattern_fill(l.buf.data(), seed, 0, m);
        *res_p = c->ops->send_commit_direct(c, l.buf.data(), m);
        if (*res_p != ncclSuccess) return fail(r, "send_commit_direct -> %d", *res_p);
        l.draining = true;
        return true;
    }
    pattern_fill(slot, seed, l.off, n);
    *res_p = c->ops->send_commit(c, n);
    if (*res_p != ncclSuccess) return fail(r, "send_commit -> %d", *res_p);
    l.off += n;
    if (l.off == m) {
        l.msg++;
        l.off = 0;
        r.completed++;
    }
    return true;
}

bool recv_step(Rank &r, Link &l, bool *progress, ncclResult_t *res_p) {
    chorus_conn_t *c = &l.conn;
    const auto &sizes = r.plan.sizes;
    if (l.msg == sizes.size()) {
        l.finished = true;
        return true;
    }
    const void *data = nullptr;
    size_t bytes = 0;
    int ready = 0;
    *res_p = c->ops->recv_peek(c, &data, &bytes, &ready);
    if (*res_p != ncclSuccess) return fail(r, "recv_peek from rank %d -> %d", l.peer, *res_p);
    if (!ready) return true;
    *progress = true;
    size_t m = sizes[l.msg];
    uint64_t seed = pattern_seed(l.peer, r.rank, l.msg);
    if (bytes == 0 || bytes > m - l.off) {
        *res_p = ncclInternalError;
        return fail(r, "from rank %d message %zu (%zu bytes) offset %zu: chunk of %zu bytes",
                    l.peer, l.msg, m, l.off, bytes);
    }
    long long bad;
    if (data && !(r.plan.copy_out && (l.msg & 1))) {
        bad = pattern_check(data, seed, l.off, bytes);
    } else {
        if (l.buf.size() < bytes) l.buf.resize(bytes);
        *res_p = c->ops->recv_copy(c, l.buf.data(), bytes);
        if (*res_p != ncclSuccess) return fail(r, "recv_copy from rank %d -> %d", l.peer, *res_p);
        bad = pattern_check(l.buf.data(), seed, l.off, bytes);
    }
    if (bad >= 0) {
        *res_p = ncclInternalError;
        return fail(r, "wrong byte from rank %d: message %zu (%zu bytes), offset %llu, %s chunk",
                    l.peer, l.msg, m, (unsigned long long)(l.off + bad), data ? "slot" : "direct");
    }
    *res_p = c->ops->recv_release(c);
    if (*res_p != ncclSuccess) return fail(r, "recv_release -> %d", *res_p);
    l.off += bytes;
    if (l.off == m) {
        l.off = 0;
        l.msg++;
        r.completed++;
        if (l.msg == sizes.size()) l.finished = true;
    }
    return true;
}

void close_all(Rank &r) {
    for (auto &l : r.links)
        if (l->open) {
            transport_close(&l->conn);
            l->open = false;
        }
}

} // namespace

int transfer_rank(const chorus_unique_id_t &id, int rank, int nranks, const TransferPlan &plan) {
    ncclComm *comm = nullptr;
    if (transport_comm_init(id, rank, nranks, &comm) != ncclSuccess) return 1;
    Rank r{rank, plan, {}, 0, {}};
    bool injected = plan.fail != TransferPlan::Fail::None;
    bool victim = injected && rank == plan.fail_rank;
    bool touches_victim = false;
    int rc = 0;
    ncclResult_t res = ncclSuccess;

    // Connect in the global edge order.
    for (size_t e = 0; e < plan.edges.size(); e++) {
        int src = plan.edges[e].first, dst = plan.edges[e].second;
        if (src != rank && dst != rank) continue;
        auto l = std::make_unique<Link>();
        l->is_send = src == rank;
        l->peer = l->is_send ? dst : src;
        if (l->peer == plan.fail_rank) touches_victim = true;
        res = transport_connect(&comm->tctx, &l->conn, l->peer, l->is_send ? 1 : 0, plan.channel,
                                plan.channel >= 0 ? (int)e : (int)e);
        if (res != ncclSuccess) {
            fprintf(stderr, "rank %d: transport_connect %d -> %d failed: %d (%s)\n", rank, src, dst,
                    (int)res, chorus_log_last_error());
            rc = 1;
            goto out;
        }
        l->open = true;
        const char *desc = l->conn.desc;
        if (!plan.expect_desc.empty() && plan.expect_desc != desc && plan.expect_desc_alt != desc) {
            fprintf(stderr, "rank %d: connection %d -> %d is '%s', expected '%s'%s%s\n", rank, src,
                    dst, desc, plan.expect_desc.c_str(), plan.expect_desc_alt.empty() ? "" : " or ",
                    plan.expect_desc_alt.c_str());
            rc = 1;
            goto out;
        }
        if (!plan.expect_desc_prefix.empty() &&
            std::string(desc).compare(0, plan.expect_desc_prefix.size(), plan.expect_desc_prefix)) {
            fprintf(stderr, "rank %d: connection %d -> %d is '%s', expected '%s...'\n", rank, src,
                    dst, desc, plan.expect_desc_prefix.c_str());
            rc = 1;
            goto out;
        }
        r.links.push_back(std::move(l));
    }

    // Once every rank has connected, no segment this rank created may still have a name: a crash
    // from here on must leave nothing in /dev/shm.
    if (!injected) {
        if (bootstrap_barrier(comm->bs) != ncclSuccess) {
            fprintf(stderr, "rank %d: barrier after connect failed: %s\n", rank,
                    chorus_log_last_error());
            rc = 1;
            goto out;
        }
        std::string mine = "chorus-shm-" + std::to_string(getpid()) + "-";
        for (const auto &f : shm_leftovers()) {
            if (f.compare(0, mine.size(), mine) == 0) {
                fprintf(stderr, "rank %d: /dev/shm/%s still exists after connect\n", rank,
                        f.c_str());
                rc = 1;
            }
        }
        if (rc) goto out;
    }

    {
        chorus_waiter_t w;
        chorus_waiter_init(&w, &comm->abort_flag);
        for (;;) {
            if (victim && r.completed >= plan.fail_after) {
                if (plan.fail == TransferPlan::Fail::Kill) raise(SIGKILL);
                close_all(r); // a clean exit in the middle of the transfer
                goto out;
            }
            bool progress = false, all_done = true, ok = true;
            for (auto &l : r.links) {
                ok = l->is_send ? send_step(r, *l, &progress, &res)
                                : recv_step(r, *l, &progress, &res);
                if (!ok) break;
                all_done = all_done && l->finished;
            }
            if (!ok) break;
            if (all_done) break;
            if (progress) {
                chorus_waiter_progress(&w);
                continue;
            }
            ncclResult_t wr = chorus_waiter_step(&w);
            if (wr != ncclSuccess) {
                res = wr;
                r.error = wr == ncclSystemError ? "deadline passed with transfers outstanding"
                                                : "aborted";
                break;
            }
        }
    }

    if (injected && !victim && touches_victim) {
        // A survivor of the failure: it must have seen ncclRemoteError naming the failed rank.
        char needle[32];
        snprintf(needle, sizeof(needle), "rank %d", plan.fail_rank);
        const char *last = chorus_log_last_error();
        if (res != ncclRemoteError) {
            fprintf(stderr, "rank %d: expected ncclRemoteError after rank %d failed, got %d (%s)\n",
                    rank, plan.fail_rank, (int)res, r.error.c_str());
            rc = 1;
        } else if (!last || !strstr(last, needle)) {
            fprintf(stderr, "rank %d: the error does not name %s: '%s'\n", rank, needle,
                    last ? last : "");
            rc = 1;
        }
    } else if (res != ncclSuccess) {
        fprintf(stderr, "rank %d: transfer failed: %s (result %d; last error: %s)\n", rank,
                r.error.c_str(), (int)res, chorus_log_last_error());
        rc = 1;
    } else if (victim) {
        fprintf(stderr, "rank %d: was to fail after %zu messages but finished first\n", rank,
                plan.fail_after);
        rc = 1;
    }

out:
    close_all(r);
    if (!injected && rc == 0 && bootstrap_barrier(comm->bs) != ncclSuccess) {
        fprintf(stderr, "rank %d: final barrier failed (another rank failed?): %s\n", rank,
                chorus_log_last_error());
        rc = 1;
    }
    transport_comm_free(comm);
    return rc;
}

namespace {

// Blocking helpers for the ping-pong: whole messages, chunk by chunk, progress calls and the
// waiter while nothing moves.
ncclResult_t wait_idle(chorus_conn_t *c, chorus_waiter_t *w) {
    ncclResult_t r = c->ops->progress(c);
    if (r != ncclSuccess) return r;
    return chorus_waiter_step(w);
}

ncclResult_t blocking_send(ncclComm *comm, chorus_conn_t *c, const uint8_t *src, size_t bytes) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    size_t off = 0;
    while (off < bytes) {
        void *slot;
        int ready;
        size_t n = std::min(c->slot_bytes, bytes - off);
        ncclResult_t r = c->ops->send_acquire(c, n, &slot, &ready);
        if (r != ncclSuccess) return r;
        if (!ready) {
            if ((r = wait_idle(c, &w)) != ncclSuccess) return r;
            continue;
        }
        chorus_waiter_progress(&w);
        memcpy(slot, src + off, n);
        if ((r = c->ops->send_commit(c, n)) != ncclSuccess) return r;
        off += n;
    }
    return ncclSuccess;
}

ncclResult_t blocking_recv(ncclComm *comm, chorus_conn_t *c, uint8_t *dst, size_t bytes) {
    chorus_waiter_t w;
    chorus_waiter_init(&w, &comm->abort_flag);
    size_t off = 0;
    while (off < bytes) {
        const void *data;
        size_t n;
        int ready;
        ncclResult_t r = c->ops->recv_peek(c, &data, &n, &ready);
        if (r != ncclSuccess) return r;
        if (!ready) {
            if ((r = wait_idle(c, &w)) != ncclSuccess) return r;
            continue;
        }
        chorus_waiter_progress(&w);
        if (n > bytes - off) return ncclInternalError;
        if (data)
            memcpy(dst + off, data, n);
        else if ((r = c->ops->recv_copy(c, dst + off, n)) != ncclSuccess)
            return r;
        if ((r = c->ops->recv_release(c)) != ncclSuccess) return r;
        off += n;
    }
    return ncclSuccess;
}

} // namespace

int pingpong_rank(const chorus_unique_id_t &id, int rank, int nranks,
                  const std::vector<size_t> &sizes, int rounds) {
    ncclComm *comm = nullptr;
    if (transport_comm_init(id, rank, nranks, &comm) != ncclSuccess) return 1;
    int rc = 0, peer = 1 - rank;
    chorus_conn_t out, in;
    bool out_open = false, in_open = false;
    size_t maxb = *std::max_element(sizes.begin(), sizes.end());
    std::vector<uint8_t> sbuf(maxb), rbuf(maxb);
    // 0 -> 1 first, then 1 -> 0, on both ranks.
    ncclResult_t r =
        transport_connect(&comm->tctx, rank == 0 ? &out : &in, peer, rank == 0, -1, 100);
    if (r == ncclSuccess) {
        (rank == 0 ? out_open : in_open) = true;
        r = transport_connect(&comm->tctx, rank == 0 ? &in : &out, peer, rank == 1, -1, 101);
        if (r == ncclSuccess) (rank == 0 ? in_open : out_open) = true;
    }
    if (r != ncclSuccess) {
        fprintf(stderr, "rank %d: connect failed: %d (%s)\n", rank, (int)r,
                chorus_log_last_error());
        rc = 1;
    }
    for (size_t si = 0; rc == 0 && si < sizes.size(); si++) {
        size_t bytes = sizes[si];
        for (int i = 0; rc == 0 && i < rounds; i++) {
            uint64_t seed = pattern_seed(0, 1, si * 1000 + (size_t)i);
            if (rank == 0) {
                pattern_fill(sbuf.data(), seed, 0, bytes);
                r = blocking_send(comm, &out, sbuf.data(), bytes);
                if (r == ncclSuccess) r = blocking_recv(comm, &in, rbuf.data(), bytes);
            } else {
                r = blocking_recv(comm, &in, rbuf.data(), bytes);
                if (r == ncclSuccess) r = blocking_send(comm, &out, rbuf.data(), bytes);
            }
            long long bad = r == ncclSuccess ? pattern_check(rbuf.data(), seed, 0, bytes) : -1;
            if (r != ncclSuccess || bad >= 0) {
                fprintf(stderr, "rank %d: ping-pong of %zu bytes, round %d: %s (result %d, %s)\n",
                        rank, bytes, i, r != ncclSuccess ? "failed" : "wrong data", (int)r,
                        chorus_log_last_error());
                rc = 1;
            }
        }
    }
    if (out_open) {
        // The echo must be consumed before the connection goes away.
        chorus_waiter_t w;
        chorus_waiter_init(&w, &comm->abort_flag);
        int done = 0;
        while (rc == 0 && !done) {
            if (out.ops->send_drained(&out, &done) != ncclSuccess)
                rc = 1;
            else if (!done && wait_idle(&out, &w) != ncclSuccess)
                rc = 1;
        }
    }
    if (rc == 0 && bootstrap_barrier(comm->bs) != ncclSuccess) rc = 1;
    if (out_open) transport_close(&out);
    if (in_open) transport_close(&in);
    transport_comm_free(comm);
    return rc;
}

} // namespace chorus_test
