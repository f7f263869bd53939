/*
 * ddp_mnist: data-parallel training of an MLP (784-512-256-10, ReLU, softmax cross-entropy, SGD
 * with momentum) on Fashion-MNIST with Chorus and libchorus_ddp.
 *
 *     build/bin/ddp_mnist --epochs 3                       one rank, no launcher needed
 *     chorusrun -n 2 build/bin/ddp_mnist --epochs 3        two ranks (chorusCommInitFromEnv)
 *
 * Each rank trains on its DistributedSampler-style shard of the shuffled training set with batch
 * --batch per rank; backward marks each layer's gradients ready (last layer first) so bucket
 * all-reduces overlap the rest of backward; the optimizer updates the pieces the DDP layer hands
 * out (whole parameters, or this rank's shard with --sharded). Per epoch rank 0 prints the mean
 * training loss, test accuracy and samples/s, with a progress line every few seconds, and at the
 * end one machine-readable line:
 *     result: ranks=N epochs=E test_acc=A samples_per_s=S comm_hidden=H
 * where H is the fraction of gradient communication time hidden behind backward (1 - time blocked
 * in chorusDdpFinishGrads / time from the first bucket's start to the last one's completion).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "chorus_ddp.h"
#include "idx.h"
#include "mlp.h"
#include "nccl.h"

typedef struct {
    int epochs, batch, accumulate, threads, sharded, bf16, fp16, pin, no_comm, grad_copy;
    int check_every, split, no_poll;
    double lr, momentum, bucket_mb, first_bucket_mb;
    uint64_t seed;
    size_t limit;
    const char *data, *save, *load;
} opts_t;

static void usage(FILE *f) {
    fprintf(f,
            "usage: ddp_mnist [options]\n"
            "  --epochs E          training epochs (3)\n"
            "  --batch B           samples per rank per step (64)\n"
            "  --lr LR             learning rate (0.02); N ranks x batch B equals 1 rank x N*B\n"
            "  --momentum M        SGD momentum (0.9)\n"
            "  --seed S            seed for weights and shuffling (1)\n"
            "  --accumulate K      micro-batches per optimizer step (chorusDdpNoSync) (1)\n"
            "  --sharded           ZeRO-1/2: reduce-scatter gradients, shard optimizer state\n"
            "  --bf16-grads        bfloat16 gradients on the wire\n"
            "  --fp16-grads        float16 gradients on the wire\n"
            "  --threads T         compute threads per rank (1)\n"
            "  --pin               pin this rank to core LOCAL_RANK mod ncores\n"
            "  --bucket-mb X       bucket cap in MiB (25, or one fc1 slice with --split-fc1)\n"
            "  --first-bucket-mb X first bucket cap in MiB (1)\n"
            "  --grad-copy         keep gradients in the model's buffers (default: bucket views)\n"
            "  --split-fc1 K       register fc1.weight as K row slices, each marked ready as soon\n"
            "                      as backward finishes it, in buckets of one slice (implies\n"
            "                      --grad-copy) so that its all-reduce overlaps the rest (1)\n"
            "  --check-every N     verify replicas are identical every N steps (0 = never)\n"
            "  --limit N           use only the first N training samples\n"
            "  --data DIR          IDX files (default " IDX_DEFAULT_DIR ")\n"
            "  --save PATH         write a checkpoint after training\n"
            "  --load PATH         load a checkpoint before training\n"
            "  --no-poll           do not call chorusDdpPoll during backward (then only Chorus's\n"
            "                      progress thread moves started all-reduces forward)\n"
            "  --no-comm           run one rank without a communicator\n"
            "  -h, --help          this text\n");
}

static int parse_opts(int argc, char **argv, opts_t *o) {
    *o = (opts_t){.epochs = 3,
                  .batch = 64,
                  .accumulate = 1,
                  .threads = 1,
                  .lr = 0.02,
                  .momentum = 0.9,
                  .bucket_mb = 0,
                  .split = 1,
                  .first_bucket_mb = 1,
                  .seed = 1,
                  .data = IDX_DEFAULT_DIR};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                                                                    \
    do {                                                                                           \
        if (!v) {                                                                                  \
            fprintf(stderr, "ddp_mnist: %s needs a value\n", a);                                   \
            return -1;                                                                             \
        }                                                                                          \
        i++;                                                                                       \
    } while (0)
        if (!strcmp(a, "--epochs")) {
            NEEDV();
            o->epochs = atoi(v);
        } else if (!strcmp(a, "--batch")) {
            NEEDV();
            o->batch = atoi(v);
        } else if (!strcmp(a, "--lr")) {
            NEEDV();
            o->lr = atof(v);
        } else if (!strcmp(a, "--momentum")) {
            NEEDV();
            o->momentum = atof(v);
        } else if (!strcmp(a, "--seed")) {
            NEEDV();
            o->seed = strtoull(v, NULL, 0);
        } else if (!strcmp(a, "--accumulate")) {
            NEEDV();
            o->accumulate = atoi(v);
        } else if (!strcmp(a, "--threads")) {
            NEEDV();
            o->threads = atoi(v);
        } else if (!strcmp(a, "--bucket-mb")) {
            NEEDV();
            o->bucket_mb = atof(v);
        } else if (!strcmp(a, "--first-bucket-mb")) {
            NEEDV();
            o->first_bucket_mb = atof(v);
        } else if (!strcmp(a, "--split-fc1")) {
            NEEDV();
            o->split = atoi(v);
        } else if (!strcmp(a, "--check-every")) {
            NEEDV();
            o->check_every = atoi(v);
        } else if (!strcmp(a, "--limit")) {
            NEEDV();
            o->limit = strtoull(v, NULL, 0);
        } else if (!strcmp(a, "--data")) {
            NEEDV();
            o->data = v;
        } else if (!strcmp(a, "--save")) {
            NEEDV();
            o->save = v;
        } else if (!strcmp(a, "--load")) {
            NEEDV();
            o->load = v;
        } else if (!strcmp(a, "--sharded"))
            o->sharded = 1;
        else if (!strcmp(a, "--bf16-grads"))
            o->bf16 = 1;
        else if (!strcmp(a, "--fp16-grads"))
            o->fp16 = 1;
        else if (!strcmp(a, "--pin"))
            o->pin = 1;
        else if (!strcmp(a, "--no-comm"))
            o->no_comm = 1;
        else if (!strcmp(a, "--no-poll"))
            o->no_poll = 1;
        else if (!strcmp(a, "--grad-copy"))
            o->grad_copy = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else {
            fprintf(stderr, "ddp_mnist: unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
#undef NEEDV
    }
    if (o->epochs < 1 || o->batch < 1 || o->accumulate < 1 || o->threads < 1 || o->lr <= 0 ||
        o->bucket_mb < 0 || o->split < 1 || o->first_bucket_mb <= 0 || (o->bf16 && o->fp16)) {
        fprintf(stderr, "ddp_mnist: invalid option values (epochs, batch, accumulate, threads "
                        "must be >= 1, lr and bucket sizes > 0, at most one of --bf16-grads "
                        "--fp16-grads)\n");
        return -1;
    }
    return 0;
}

/* CPU time of this process (all its threads), for throughput per CPU-second on a shared box. */
static double cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define DDPCHECK(call)                                                                             \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "ddp_mnist: %s failed: %s (%s)\n", #call, ncclGetErrorString(r_),      \
                    chorusDdpGetLastError(NULL));                                                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define MAX_SPLIT 64

typedef struct {
    chorusDdp_t ddp;
    int wid[MLP_MAX_LAYERS], bid[MLP_MAX_LAYERS];
    int nslices;              /* fc1.weight registered as this many row slices */
    int slice_id[MAX_SPLIT];  /* their parameter ids */
    int slice_end[MAX_SPLIT]; /* first row after each slice */
    int marked;               /* slices already marked ready in this step */
    int failed;
} ready_ctx_t;

/* Called by backward as soon as layer l's gradients are final. */
static int on_layer_ready(void *arg, int layer) {
    ready_ctx_t *c = arg;
    if (c->failed) return 1;
    if (layer == 0 && c->nslices > 1) {
        for (; c->marked < c->nslices; c->marked++)
            if (chorusDdpGradReady(c->ddp, c->slice_id[c->marked]) != ncclSuccess) return 1;
        c->marked = 0;
    } else if (chorusDdpGradReady(c->ddp, c->wid[layer]) != ncclSuccess) {
        return 1;
    }
    if (chorusDdpGradReady(c->ddp, c->bid[layer]) != ncclSuccess) return 1;
    return 0;
}

/* Called as backward finishes blocks of weight-gradient rows: mark finished fc1 slices ready. */
static void on_rows_ready(void *arg, int layer, int rows) {
    ready_ctx_t *c = arg;
    if (layer == 0 && c->nslices > 1 && !c->failed) {
        while (c->marked < c->nslices && c->slice_end[c->marked] <= rows) {
            if (chorusDdpGradReady(c->ddp, c->slice_id[c->marked]) != ncclSuccess) c->failed = 1;
            c->marked++;
        }
    }
    (void)chorusDdpPoll(c->ddp);
}

/* Called between cache blocks of backward: drives the bucket collectives already started. */
static void on_poll(void *arg) {
    (void)chorusDdpPoll(((ready_ctx_t *)arg)->ddp);
}

/* Sum doubles over ranks (host buffers: the call returns when done). */
static int sum_over_ranks(ncclComm_t comm, double *v, int n) {
    if (!comm) return 0;
    if (ncclAllReduce(v, v, (size_t)n, ncclFloat64, ncclSum, comm, NULL) != ncclSuccess) {
        fprintf(stderr, "ddp_mnist: all-reduce of statistics failed: %s\n", ncclGetLastError(comm));
        return 1;
    }
    return 0;
}

static void sgd_step(chorusDdp_t ddp, float lr, float mu) {
    const chorusDdpPiece_t *pc;
    int np;
    if (chorusDdpGetPieces(ddp, &pc, &np) != ncclSuccess) return;
    for (int i = 0; i < np; i++) {
        float *p = pc[i].param, *g = pc[i].grad, *v = pc[i].state[0];
        for (size_t e = 0; e < pc[i].count; e++) {
            v[e] = mu * v[e] + g[e];
            p[e] -= lr * v[e];
        }
    }
}

static int init_comm(const opts_t *o, ncclComm_t *comm, int *rank, int *nranks) {
    *comm = NULL;
    *rank = 0;
    *nranks = 1;
    if (o->no_comm) return 0;
    if (getenv("WORLD_SIZE") || getenv("OMPI_COMM_WORLD_SIZE") || getenv("SLURM_NTASKS")) {
        ncclResult_t r = chorusCommInitFromEnv(comm);
        if (r != ncclSuccess) {
            fprintf(stderr, "ddp_mnist: chorusCommInitFromEnv failed: %s (%s)\n",
                    ncclGetErrorString(r), ncclGetLastError(NULL));
            return 1;
        }
    } else {
        ncclUniqueId id;
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r == ncclSuccess) r = ncclCommInitRank(comm, 1, id, 0);
        if (r != ncclSuccess) {
            fprintf(stderr,
                    "ddp_mnist: single-rank communicator failed: %s (%s); --no-comm runs "
                    "without one\n",
                    ncclGetErrorString(r), ncclGetLastError(NULL));
            return 1;
        }
    }
    if (ncclCommUserRank(*comm, rank) != ncclSuccess || ncclCommCount(*comm, nranks) != ncclSuccess)
        return 1;
    return 0;
}

static void pin_rank(int rank) {
    const char *lr = getenv("LOCAL_RANK");
    int local = lr ? atoi(lr) : rank;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)(local % ncpu), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        fprintf(stderr, "ddp_mnist: pinning to core %ld failed: %s\n", local % ncpu,
                strerror(errno));
}

int main(int argc, char **argv) {
    opts_t o;
    if (parse_opts(argc, argv, &o) != 0) return 2;
    ncclComm_t comm;
    int rank, nranks;
    if (init_comm(&o, &comm, &rank, &nranks) != 0) return 1;
    if (o.pin) pin_rank(rank);

    char err[1024];
    idx_set_t train, test;
    if (idx_load(o.data, "train", &train, err, sizeof(err)) != 0 ||
        idx_load(o.data, "t10k", &test, err, sizeof(err)) != 0) {
        fprintf(stderr, "ddp_mnist: rank %d: %s\n", rank, err);
        return 1;
    }
    if (o.limit && o.limit < train.n) train.n = o.limit;
    int in_dim = train.rows * train.cols;

    const int dims[4] = {in_dim, 512, 256, 10};
    mlp_t model;
    if (mlp_init(&model, dims, 3, o.batch, o.seed) != 0) {
        fprintf(stderr, "ddp_mnist: out of memory for the model\n");
        return 1;
    }
    model.threads = o.threads;

    if (o.split > MAX_SPLIT || o.split > dims[0]) {
        fprintf(stderr, "ddp_mnist: --split-fc1 %d is more than %d\n", o.split,
                MAX_SPLIT < dims[0] ? MAX_SPLIT : dims[0]);
        return 2;
    }
    if (o.split > 1) o.grad_copy = 1; /* slices of one gradient array cannot be bucket views */
    chorusDdpConfig_t cfg = CHORUS_DDP_CONFIG_INITIALIZER;
    /* Default cap: 25 MiB, or with --split-fc1 one slice (plus fc1.bias), so each slice's
     * all-reduce starts as soon as it is final. */
    size_t slice_bytes =
        ((size_t)dims[0] + (size_t)o.split - 1) / (size_t)o.split * (size_t)dims[1] * sizeof(float);
    cfg.bucketCapBytes = o.bucket_mb > 0 ? (size_t)(o.bucket_mb * 1048576.0)
                         : o.split > 1   ? slice_bytes + (size_t)dims[1] * sizeof(float)
                                         : (size_t)25 << 20;
    cfg.firstBucketBytes = (size_t)(o.first_bucket_mb * 1048576.0);
    cfg.gradAsBucketView = !o.grad_copy;
    cfg.commDtype = o.bf16 ? ncclBfloat16 : o.fp16 ? ncclFloat16 : ncclFloat32;
    cfg.sharded = o.sharded;
    cfg.optStateSlots = 1; /* momentum */
    cfg.checkEvery = o.check_every;
    chorusDdp_t ddp;
    DDPCHECK(chorusDdpCreate(comm, &cfg, &ddp));
    ready_ctx_t rc = {.ddp = ddp, .nslices = o.split};
    int64_t progress[2] = {0, 0}; /* epochs done, optimizer steps done */
    /* Buckets are filled in reverse registration order, and backward marks each layer's weight
     * then its bias ready, last layer first. Registering bias before weight makes the two orders
     * agree exactly, so no small bias ready at the very end holds back an earlier bucket. fc1's
     * slices are registered last row block first for the same reason: backward finishes them
     * first row block first. */
    for (int l = 0; l < model.nlayers; l++) {
        char name[64];
        size_t out = (size_t)dims[l + 1];
        snprintf(name, sizeof(name), "fc%d.bias", l + 1);
        DDPCHECK(chorusDdpRegisterParam(ddp, name, model.b[l], out, ncclFloat32,
                                        o.grad_copy ? model.gb[l] : NULL, &rc.bid[l]));
        if (l == 0 && rc.nslices > 1) {
            int rows = dims[0];
            for (int sl = rc.nslices - 1; sl >= 0; sl--) {
                int r0 = (int)((long)rows * sl / rc.nslices);
                int r1 = (int)((long)rows * (sl + 1) / rc.nslices);
                rc.slice_end[sl] = r1;
                snprintf(name, sizeof(name), "fc1.weight[%d:%d]", r0, r1);
                DDPCHECK(chorusDdpRegisterParam(ddp, name, model.w[0] + (size_t)r0 * out,
                                                (size_t)(r1 - r0) * out, ncclFloat32,
                                                model.gw[0] + (size_t)r0 * out, &rc.slice_id[sl]));
            }
            continue;
        }
        snprintf(name, sizeof(name), "fc%d.weight", l + 1);
        DDPCHECK(chorusDdpRegisterParam(ddp, name, model.w[l], (size_t)dims[l] * out, ncclFloat32,
                                        o.grad_copy ? model.gw[l] : NULL, &rc.wid[l]));
    }
    DDPCHECK(chorusDdpRegisterBuffer(ddp, "trainer.progress", progress, sizeof(progress)));
    DDPCHECK(chorusDdpStart(ddp));
    for (int l = 0; l < model.nlayers; l++) {
        if (!(l == 0 && rc.nslices > 1))
            DDPCHECK(chorusDdpGradPtr(ddp, rc.wid[l], (void **)&model.gw[l]));
        DDPCHECK(chorusDdpGradPtr(ddp, rc.bid[l], (void **)&model.gb[l]));
    }
    if (o.load) DDPCHECK(chorusDdpLoad(ddp, o.load));
    model.poll = o.no_poll ? NULL : on_poll;
    model.rows_ready = o.no_poll ? NULL : on_rows_ready;
    model.poll_ctx = &rc;

    chorusDdpSampler_t sampler;
    DDPCHECK(chorusDdpSamplerCreate(train.n, nranks, rank, o.seed, 1, 0, &sampler));
    float *xb = malloc((size_t)o.batch * in_dim * sizeof(float));
    uint8_t *yb = malloc((size_t)o.batch);
    if (!xb || !yb) return 1;

    if (rank == 0) {
        chorusDdpMemory_t mem;
        int nb = 0;
        DDPCHECK(chorusDdpMemoryUsage(ddp, &mem));
        DDPCHECK(chorusDdpBucketCount(ddp, &nb));
        printf("ddp_mnist: ranks=%d batch/rank=%d accumulate=%d params=%zu buckets=%d%s%s\n",
               nranks, o.batch, o.accumulate, mlp_param_count(&model), nb,
               o.sharded ? " sharded" : "",
               o.bf16   ? " bf16-grads"
               : o.fp16 ? " fp16-grads"
                        : "");
        printf("ddp_mnist: memory per rank: params %.2f MiB, grads %.2f MiB, optimizer state "
               "%.2f MiB, comm buffers %.2f MiB\n",
               mem.paramBytes / 1048576.0, mem.gradBytes / 1048576.0, mem.optStateBytes / 1048576.0,
               mem.commBytes / 1048576.0);
        fflush(stdout);
    }

    double total_train_s = 0, total_samples = 0, test_acc = 0, total_cpu = 0;
    chorusDdpStats_t all_stats = {0};
    for (int epoch = (int)progress[0]; epoch < o.epochs; epoch++) {
        DDPCHECK(chorusDdpSamplerSetEpoch(sampler, (uint64_t)epoch));
        const size_t *idx;
        size_t nidx;
        DDPCHECK(chorusDdpSamplerIndices(sampler, &idx, &nidx));
        size_t nmicro = (nidx + (size_t)o.batch - 1) / (size_t)o.batch;
        double loss_sum = 0, seen = 0, t0 = now_s(), last_print = t0, c0 = cpu_s();
        for (size_t mb = 0; mb < nmicro; mb += (size_t)o.accumulate) {
            size_t group = nmicro - mb < (size_t)o.accumulate ? nmicro - mb : (size_t)o.accumulate;
            for (size_t g = 0; g < group; g++) {
                size_t first = (mb + g) * (size_t)o.batch;
                int b = (int)(nidx - first < (size_t)o.batch ? nidx - first : (size_t)o.batch);
                for (int i = 0; i < b; i++) {
                    memcpy(xb + (size_t)i * in_dim, train.images + idx[first + i] * in_dim,
                           sizeof(float) * in_dim);
                    yb[i] = train.labels[idx[first + i]];
                }
                int last = g + 1 == group;
                DDPCHECK(chorusDdpNoSync(ddp, !last));
                mlp_forward(&model, xb, b);
                loss_sum += mlp_loss(&model, yb, b, 1.0f / (float)group, 1, NULL) * b;
                seen += b;
                if (mlp_backward(&model, b, g > 0, on_layer_ready, &rc) != 0) {
                    fprintf(stderr, "ddp_mnist: %s\n", chorusDdpGetLastError(ddp));
                    return 1;
                }
                DDPCHECK(chorusDdpFinishGrads(ddp));
            }
            sgd_step(ddp, (float)o.lr, (float)o.momentum);
            DDPCHECK(chorusDdpSyncParams(ddp));
            progress[1]++;
            double t = now_s();
            if (rank == 0 && t - last_print > 5.0) {
                printf("  epoch %d: %zu/%zu steps, loss %.4f, %.0f samples/s\n", epoch + 1,
                       (mb + group) / (size_t)o.accumulate, nmicro / (size_t)o.accumulate,
                       loss_sum / seen, seen * nranks / (t - t0));
                fflush(stdout);
                last_print = t;
            }
        }
        double train_s = now_s() - t0, train_cpu = cpu_s() - c0;
        progress[0] = epoch + 1;

        /* Test accuracy: each rank evaluates a contiguous slice of the test set. */
        size_t lo = test.n * (size_t)rank / (size_t)nranks;
        size_t hi = test.n * (size_t)(rank + 1) / (size_t)nranks;
        double tl = 0;
        size_t correct =
            mlp_evaluate(&model, test.images + lo * in_dim, test.labels + lo, hi - lo, &tl);
        double v[5] = {loss_sum, seen, (double)correct, tl * (double)(hi - lo), train_cpu};
        if (sum_over_ranks(comm, v, 5) != 0) return 1;
        total_cpu += v[4];
        test_acc = v[2] / (double)test.n;
        double sps = v[1] / train_s;
        total_train_s += train_s;
        total_samples += v[1];
        chorusDdpStats_t st;
        DDPCHECK(chorusDdpGetStats(ddp, &st, 1));
        all_stats.commSeconds += st.commSeconds;
        all_stats.blockedSeconds += st.blockedSeconds;
        all_stats.steps += st.steps;
        if (rank == 0) {
            printf("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.4f, %.0f samples/s "
                   "(%.1f s), comm %.3f s of which blocked %.3f s\n",
                   epoch + 1, v[0] / v[1], v[3] / (double)test.n, test_acc, sps, train_s,
                   st.commSeconds, st.blockedSeconds);
            fflush(stdout);
        }
    }
    if (o.save) DDPCHECK(chorusDdpSave(ddp, o.save));
    double hidden =
        all_stats.commSeconds > 0 ? 1.0 - all_stats.blockedSeconds / all_stats.commSeconds : 0.0;
    if (hidden < 0) hidden = 0;
    /* Average the overlap over ranks: each sees its own blocking. */
    double hv[1] = {hidden};
    if (sum_over_ranks(comm, hv, 1) != 0) return 1;
    hidden = hv[0] / nranks;
    if (rank == 0) {
        /* On a shared machine wall-clock speed depends on the neighbours; samples per CPU-second
         * (all threads of all ranks) shows the cost of communication without them. */
        printf("cpu: %.0f samples per cpu-second (%.1f cpu-s for %.0f samples)\n",
               total_cpu > 0 ? total_samples / total_cpu : 0, total_cpu, total_samples);
        printf("result: ranks=%d epochs=%d test_acc=%.4f samples_per_s=%.0f comm_hidden=%.3f\n",
               nranks, o.epochs, test_acc, total_train_s > 0 ? total_samples / total_train_s : 0,
               hidden);
        fflush(stdout);
    }
    chorusDdpSamplerDestroy(sampler);
    chorusDdpDestroy(ddp);
    if (comm) ncclCommDestroy(comm);
    mlp_free(&model);
    idx_free(&train);
    idx_free(&test);
    free(xb);
    free(yb);
    return 0;
}
