/*
 * oneccl_bench.cpp: Intel oneCCL's CPU collectives measured the way perf/compare/mpi_bench.c
 * measures MPI's (and the Chorus perf binaries theirs), for perf/compare/compare.py, which compiles
 * it against the venv that perf/compare/peers/install_oneccl.sh fills (not part of the build).
 *
 *   mpiexec -n N oneccl_bench <allreduce|allgather|reducescatter> MINBYTES MAXBYTES FACTOR ITERS
 *           WARMUP REPS [DIRTY [LOOP]]
 *
 * Same sizes, schedule, checks and output as mpi_bench.c: the size is the larger buffer in bytes
 * (float32); all-gather and reduce-scatter split it over ranks with a per-rank count rounded down
 * to 16 bytes, sizes whose per-rank count is 0 are skipped. Per size: one checked call (small
 * integer inputs, exact float sums), WARMUP untimed calls, then REPS repetitions of (oneCCL
 * barrier, ITERS timed calls, each waited for). A repetition yields the wall time per call and the
 * median of the per-call times, each averaged over ranks; rank 0 prints
 *   <size> <count> <mean_us> <rep> <median_us>
 * DIRTY=1 rewrites one byte per cache line of the input before every timed call, untimed; LOOP=1
 * times the ITERS calls together only. A wrong result makes the program exit 1.
 *
 * Start-up is oneCCL's documented one: rank 0 creates the main key-value store, its address
 * reaches the other ranks by MPI_Bcast, and every rank joins it and creates the communicator.
 * MPI (Intel MPI, which the oneCCL wheel ships) carries only that address and the timings, never
 * a measured byte. Which transport oneCCL's collectives use is its environment's choice
 * (CCL_ATL_TRANSPORT: mpi by default, or ofi with CCL_ATL_SHM=1 for libfabric shared memory).
 */
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "oneapi/ccl.hpp"

namespace {

enum Coll { ALLREDUCE, ALLGATHER, REDUCESCATTER };

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

float input_value(int r, size_t i) {
    return static_cast<float>((r + 1) + static_cast<int>(i % 13));
}

void run_once(Coll coll, const float *send, float *recv, size_t per, size_t count,
              const ccl::communicator &comm) {
    switch (coll) {
    case ALLREDUCE:
        ccl::allreduce(send, recv, count, ccl::datatype::float32, ccl::reduction::sum, comm).wait();
        break;
    case ALLGATHER:
        ccl::allgather(send, recv, per, ccl::datatype::float32, comm).wait();
        break;
    case REDUCESCATTER:
        ccl::reduce_scatter(send, recv, per, ccl::datatype::float32, ccl::reduction::sum, comm)
            .wait();
        break;
    }
}

long check(Coll coll, const float *recv, size_t per, size_t count, int me, int np) {
    long wrong = 0;
    size_t n =
        coll == ALLREDUCE ? count : (coll == ALLGATHER ? per * static_cast<size_t>(np) : per);
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        if (coll == ALLGATHER) {
            want = input_value(static_cast<int>(i / per), i % per);
        } else {
            size_t g = coll == REDUCESCATTER ? static_cast<size_t>(me) * per + i : i;
            for (int r = 0; r < np; r++)
                want += input_value(r, g);
        }
        if (recv[i] != want) wrong++;
    }
    return wrong;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench(int argc, char **argv, int me, int np) {
    if (argc < 8 || argc > 10) {
        if (me == 0)
            std::fprintf(stderr,
                         "usage: %s allreduce|allgather|reducescatter MIN MAX FACTOR ITERS "
                         "WARMUP REPS [DIRTY [LOOP]]\n",
                         argv[0]);
        return 2;
    }
    int c = std::strcmp(argv[1], "allreduce") == 0       ? ALLREDUCE
            : std::strcmp(argv[1], "allgather") == 0     ? ALLGATHER
            : std::strcmp(argv[1], "reducescatter") == 0 ? REDUCESCATTER
                                                         : -1;
    size_t minb = std::strtoull(argv[2], nullptr, 0), maxb = std::strtoull(argv[3], nullptr, 0);
    size_t factor = std::strtoull(argv[4], nullptr, 0);
    int iters = std::atoi(argv[5]), warmup = std::atoi(argv[6]), reps = std::atoi(argv[7]);
    bool dirty = argc >= 9 && std::atoi(argv[8]) != 0;
    bool loop = argc == 10 && std::atoi(argv[9]) != 0;
    if (c < 0 || factor < 2 || iters < 1 || warmup < 0 || reps < 1 || minb > maxb ||
        (dirty && loop)) {
        if (me == 0) std::fprintf(stderr, "oneccl_bench: bad arguments\n");
        return 2;
    }
    Coll coll = static_cast<Coll>(c);

    ccl::shared_ptr_class<ccl::kvs> kvs;
    ccl::kvs::address_type addr;
    if (me == 0) {
        kvs = ccl::create_main_kvs();
        addr = kvs->get_address();
    }
    MPI_Bcast(addr.data(), static_cast<int>(addr.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (me != 0) kvs = ccl::create_kvs(addr);
    ccl::communicator comm = ccl::create_communicator(np, me, kvs);

    size_t maxcount = maxb / sizeof(float) + 4;
    std::vector<float> send(maxcount), recv(maxcount);
    std::vector<double> times(static_cast<size_t>(iters));
    int failed = 0;
    for (size_t size = minb; size <= maxb; size = size ? size * factor : 1) {
        size_t count = size / sizeof(float);
        size_t per = count / static_cast<size_t>(np) / 4 * 4; /* 16-byte multiple, as nccl-tests */
        size_t nsend = coll == ALLGATHER ? per : (coll == ALLREDUCE ? count : per * np);
        size_t shown = coll == ALLREDUCE ? count : per * static_cast<size_t>(np);
        size_t param = coll == ALLREDUCE ? count : per;
        if (param == 0) continue;
        for (size_t i = 0; i < nsend; i++)
            send[i] = input_value(me, i);
        std::fill(recv.begin(), recv.end(), 0.0f);
        run_once(coll, send.data(), recv.data(), per, count, comm);
        long wrong = check(coll, recv.data(), per, count, me, np), allwrong = 0;
        MPI_Allreduce(&wrong, &allwrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (allwrong) {
            if (me == 0)
                std::fprintf(stderr, "oneccl_bench: %s size %zu: %ld wrong elements\n", argv[1],
                             size, allwrong);
            failed = 1;
        }
        for (int w = 0; w < warmup; w++)
            run_once(coll, send.data(), recv.data(), per, count, comm);
        for (int rep = 0; rep < reps; rep++) {
            ccl::barrier(comm).wait();
            double t0 = now_s(), prev = t0, own = 0;
            if (loop) {
                for (int it = 0; it < iters; it++)
                    run_once(coll, send.data(), recv.data(), per, count, comm);
                prev = now_s();
                std::fill(times.begin(), times.end(), (prev - t0) / iters);
            }
            for (int it = 0; it < iters && !loop; it++) {
                if (dirty) {
                    volatile char *p = reinterpret_cast<volatile char *>(send.data());
                    for (size_t off = 0; off < nsend * sizeof(float); off += 64)
                        p[off] = p[off];
                    prev = now_s();
                }
                run_once(coll, send.data(), recv.data(), per, count, comm);
                double t = now_s();
                times[static_cast<size_t>(it)] = t - prev;
                own += t - prev;
                prev = t;
            }
            double mine[2] = {(dirty ? own : prev - t0) / iters, median(times)};
            double sum[2] = {0, 0};
            MPI_Allreduce(mine, sum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            if (me == 0)
                std::printf("%zu %zu %.3f %d %.3f\n", shown * sizeof(float), param,
                            sum[0] / np * 1e6, rep, sum[1] / np * 1e6);
        }
        std::fflush(stdout);
    }
    return failed;
}

} // namespace

int main(int argc, char **argv) {
    ccl::init();
    MPI_Init(&argc, &argv);
    int me = 0, np = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (me == 0) {
        ccl::library_version v = ccl::get_library_version();
        std::printf("# oneccl-version %s\n", v.full);
    }
    int rc;
    try {
        rc = bench(argc, argv, me, np);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "oneccl_bench: rank %d: %s\n", me, e.what());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    MPI_Finalize();
    return rc;
}
