/*
 * mlp.c: forward and backward of a ReLU MLP with softmax cross-entropy (see mlp.h).
 *
 * The three matrix products are written as cache-blocked loops: a block of weight rows (about
 * 64 KiB) stays in L2 while every sample of the batch streams through it, and four samples are
 * handled at once so that each weight row loaded is used four times. Inner loops run over
 * contiguous rows with 8-wide GCC vector types; on x86-64 each kernel is also compiled for
 * AVX2+FMA and picked at load time (target_clones), so one binary is fast on new machines and
 * still runs on old ones. Results do not depend on the thread count: threads split independent
 * output rows.
 */
#include "mlp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLP_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define MLP_CLONES
#endif

typedef float v8f __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v8f v8_load(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline __attribute__((always_inline)) void v8_store(float *p, v8f v) {
    memcpy(p, &v, sizeof(v));
}

static inline __attribute__((always_inline)) float v8_sum(v8f v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

static uint64_t mlp_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int mlp_init(mlp_t *m, const int *dims, int nlayers, int max_batch, uint64_t seed) {
    memset(m, 0, sizeof(*m));
    if (nlayers < 1 || nlayers > MLP_MAX_LAYERS || max_batch < 1) return -1;
    m->nlayers = nlayers;
    m->max_batch = max_batch;
    m->threads = 1;
    size_t grads = 0, widest = 0;
    for (int l = 0; l <= nlayers; l++) {
        if (dims[l] < 1) return -1;
        m->dims[l] = dims[l];
        if ((size_t)dims[l] > widest) widest = (size_t)dims[l];
    }
    for (int l = 0; l < nlayers; l++)
        grads += (size_t)dims[l] * dims[l + 1] + dims[l + 1];
    m->own_grads = calloc(grads, sizeof(float));
    if (!m->own_grads) return -1;
    float *g = m->own_grads;
    uint64_t st = seed * 0x2545f4914f6cdd1dull + 1;
    for (int l = 0; l < nlayers; l++) {
        size_t in = (size_t)dims[l], out = (size_t)dims[l + 1];
        m->w[l] = calloc(in * out, sizeof(float));
        m->b[l] = calloc(out, sizeof(float));
        m->act[l] = calloc((size_t)max_batch * out, sizeof(float));
        if (!m->w[l] || !m->b[l] || !m->act[l]) {
            mlp_free(m);
            return -1;
        }
        m->gw[l] = g;
        g += in * out;
        m->gb[l] = g;
        g += out;
        /* He-uniform: U(-a, a) with a = sqrt(6 / fan_in) keeps ReLU activations at unit scale. */
        float a = sqrtf(6.0f / (float)in);
        for (size_t i = 0; i < in * out; i++) {
            double u = (double)(mlp_rng(&st) >> 11) * (1.0 / 9007199254740992.0);
            m->w[l][i] = (float)((2.0 * u - 1.0) * a);
        }
    }
    for (int k = 0; k < 2; k++) {
        m->dbuf[k] = calloc((size_t)max_batch * widest, sizeof(float));
        if (!m->dbuf[k]) {
            mlp_free(m);
            return -1;
        }
    }
    return 0;
}

void mlp_free(mlp_t *m) {
    for (int l = 0; l < MLP_MAX_LAYERS; l++) {
        free(m->w[l]);
        free(m->b[l]);
        free(m->act[l]);
    }
    free(m->dbuf[0]);
    free(m->dbuf[1]);
    free(m->own_grads);
    memset(m, 0, sizeof(*m));
}

size_t mlp_param_count(const mlp_t *m) {
    size_t n = 0;
    for (int l = 0; l < m->nlayers; l++)
        n += (size_t)m->dims[l] * m->dims[l + 1] + m->dims[l + 1];
    return n;
}

/* y[r][0..n) += sum_k x[r][k] * w[k][0..n) for four rows r at once, k in [k0, k1). */
static inline __attribute__((always_inline)) void
mlp_axpy4(float *const y[4], const float *const x[4], const float *w, int n, int k0, int k1) {
    for (int k = k0; k < k1; k++) {
        float a0 = x[0][k], a1 = x[1][k], a2 = x[2][k], a3 = x[3][k];
        if (a0 == 0.0f && a1 == 0.0f && a2 == 0.0f && a3 == 0.0f) continue; /* ReLU zeros */
        const float *wr = w + (size_t)k * n;
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            v8f wv = v8_load(wr + j);
            v8_store(y[0] + j, v8_load(y[0] + j) + a0 * wv);
            v8_store(y[1] + j, v8_load(y[1] + j) + a1 * wv);
            v8_store(y[2] + j, v8_load(y[2] + j) + a2 * wv);
            v8_store(y[3] + j, v8_load(y[3] + j) + a3 * wv);
        }
        for (; j < n; j++) {
            y[0][j] += a0 * wr[j];
            y[1][j] += a1 * wr[j];
            y[2][j] += a2 * wr[j];
            y[3][j] += a3 * wr[j];
        }
    }
}

static inline int mlp_kblock(int n) {
    int kb = (64 * 1024) / (int)(sizeof(float) * (size_t)(n > 0 ? n : 1));
    return kb < 8 ? 8 : kb;
}

/* Rows [r0, r1) of Y = X W + b, optional ReLU; X: batch x k, W: k x n. The k blocks are the
 * outer loop so each block of W is read once from memory for all rows. */
MLP_CLONES static void mlp_fwd_rows(const float *x, const float *w, const float *bias, float *y,
                                    int r0, int r1, int k, int n, int relu) {
    int kb = mlp_kblock(n);
    for (int i = r0; i < r1; i++)
        memcpy(y + (size_t)i * n, bias, sizeof(float) * n);
    int full = r0 + (r1 - r0) / 4 * 4;
    for (int k0 = 0; k0 < k; k0 += kb) {
        int k1 = k0 + kb < k ? k0 + kb : k;
        for (int i = r0; i < full; i += 4) {
            float *yr[4];
            const float *xr[4];
            for (int r = 0; r < 4; r++) {
                yr[r] = y + (size_t)(i + r) * n;
                xr[r] = x + (size_t)(i + r) * k;
            }
            mlp_axpy4(yr, xr, w, n, k0, k1);
        }
    }
    for (int i = full; i < r1; i++) { /* fewer than four rows left: one at a time */
        float *yr = y + (size_t)i * n;
        const float *xr = x + (size_t)i * k;
        for (int kk = 0; kk < k; kk++) {
            float a = xr[kk];
            if (a == 0.0f) continue;
            const float *wr = w + (size_t)kk * n;
            for (int j = 0; j < n; j++)
                yr[j] += a * wr[j];
        }
    }
    if (relu)
        for (size_t e = (size_t)r0 * n; e < (size_t)r1 * n; e++)
            y[e] = y[e] > 0.0f ? y[e] : 0.0f;
}

/* Threads split the batch into contiguous row ranges (multiples of four rows). */
static void mlp_gemm_fwd(const float *x, const float *w, const float *bias, float *y, int batch,
                         int k, int n, int relu, int threads) {
    int per = ((batch + threads - 1) / threads + 3) / 4 * 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int t = 0; t < threads; t++) {
        int r0 = t * per, r1 = r0 + per < batch ? r0 + per : batch;
        if (r0 < r1) mlp_fwd_rows(x, w, bias, y, r0, r1, k, n, relu);
    }
}

/* Rows [k0, k1) of dW (+)= X^T dY; X: batch x k, dY: batch x n. */
MLP_CLONES static void mlp_wgrad_block(const float *x, const float *dy, float *dw, int batch, int k,
                                       int n, int k0, int k1, int accumulate) {
    if (!accumulate) memset(dw + (size_t)k0 * n, 0, sizeof(float) * (size_t)(k1 - k0) * n);
    int i = 0;
    for (; i + 4 <= batch; i += 4) {
        const float *d0 = dy + (size_t)i * n, *d1 = d0 + n, *d2 = d1 + n, *d3 = d2 + n;
        const float *x0 = x + (size_t)i * k, *x1 = x0 + k, *x2 = x1 + k, *x3 = x2 + k;
        for (int kk = k0; kk < k1; kk++) {
            float a0 = x0[kk], a1 = x1[kk], a2 = x2[kk], a3 = x3[kk];
            if (a0 == 0.0f && a1 == 0.0f && a2 == 0.0f && a3 == 0.0f) continue;
            float *g = dw + (size_t)kk * n;
            int j = 0;
            for (; j + 8 <= n; j += 8) {
                v8f s = v8_load(g + j);
                s += a0 * v8_load(d0 + j) + a1 * v8_load(d1 + j);
                s += a2 * v8_load(d2 + j) + a3 * v8_load(d3 + j);
                v8_store(g + j, s);
            }
            for (; j < n; j++)
                g[j] += (a0 * d0[j] + a1 * d1[j]) + (a2 * d2[j] + a3 * d3[j]);
        }
    }
    for (; i < batch; i++) {
        const float *d0 = dy + (size_t)i * n, *x0 = x + (size_t)i * k;
        for (int kk = k0; kk < k1; kk++) {
            float a0 = x0[kk];
            if (a0 == 0.0f) continue;
            float *g = dw + (size_t)kk * n;
            for (int j = 0; j < n; j++)
                g[j] += a0 * d0[j];
        }
    }
}

/* dW (+)= X^T dY, db (+)= column sums of dY. Threads split k into cache-sized blocks. */
static void mlp_gemm_wgrad(const mlp_t *m, int layer, const float *x, const float *dy, float *dw,
                           float *db, int batch, int k, int n, int accumulate) {
    int kb = mlp_kblock(n), threads = m->threads;
    int nblocks = (k + kb - 1) / kb;
    if (threads == 1) {
        for (int bi = 0; bi < nblocks; bi++) {
            int k0 = bi * kb, k1 = k0 + kb < k ? k0 + kb : k;
            mlp_wgrad_block(x, dy, dw, batch, k, n, k0, k1, accumulate);
            if (m->rows_ready)
                m->rows_ready(m->poll_ctx, layer, k1);
            else if (m->poll)
                m->poll(m->poll_ctx);
        }
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int bi = 0; bi < nblocks; bi++) {
            int k0 = bi * kb, k1 = k0 + kb < k ? k0 + kb : k;
            mlp_wgrad_block(x, dy, dw, batch, k, n, k0, k1, accumulate);
        }
    }
    if (!accumulate) memset(db, 0, sizeof(float) * n);
    for (int i = 0; i < batch; i++)
        for (int j = 0; j < n; j++)
            db[j] += dy[(size_t)i * n + j];
}

/* Columns [k0, k1) of dX = dY W^T, masked by the ReLU of the layer below (act: its output). A
 * block of W stays in cache while every row uses it. */
MLP_CLONES static void mlp_dgrad_block(const float *dy, const float *w, const float *act, float *dx,
                                       int batch, int k, int n, int k0, int k1) {
    for (int i = 0; i < batch; i++) {
        const float *d = dy + (size_t)i * n;
        float *o = dx + (size_t)i * k;
        const float *a = act + (size_t)i * k;
        for (int kk = k0; kk < k1; kk++) {
            if (a[kk] <= 0.0f) { /* ReLU was off: no gradient flows */
                o[kk] = 0.0f;
                continue;
            }
            const float *wr = w + (size_t)kk * n;
            v8f s = {0, 0, 0, 0, 0, 0, 0, 0};
            int j = 0;
            for (; j + 8 <= n; j += 8)
                s += v8_load(d + j) * v8_load(wr + j);
            float t = v8_sum(s);
            for (; j < n; j++)
                t += d[j] * wr[j];
            o[kk] = t;
        }
    }
}

static void mlp_gemm_dgrad(const mlp_t *m, const float *dy, const float *w, const float *act,
                           float *dx, int batch, int k, int n) {
    int kb = mlp_kblock(n), threads = m->threads;
    int nblocks = (k + kb - 1) / kb;
    if (threads == 1) {
        for (int bi = 0; bi < nblocks; bi++) {
            int k0 = bi * kb, k1 = k0 + kb < k ? k0 + kb : k;
            mlp_dgrad_block(dy, w, act, dx, batch, k, n, k0, k1);
            if (m->poll) m->poll(m->poll_ctx);
        }
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int bi = 0; bi < nblocks; bi++) {
            int k0 = bi * kb, k1 = k0 + kb < k ? k0 + kb : k;
            mlp_dgrad_block(dy, w, act, dx, batch, k, n, k0, k1);
        }
    }
}

void mlp_forward(mlp_t *m, const float *x, int batch) {
    m->input = x;
    const float *in = x;
    for (int l = 0; l < m->nlayers; l++) {
        mlp_gemm_fwd(in, m->w[l], m->b[l], m->act[l], batch, m->dims[l], m->dims[l + 1],
                     l < m->nlayers - 1, m->threads);
        in = m->act[l];
    }
}

double mlp_loss(mlp_t *m, const uint8_t *labels, int batch, float scale, int want_grad,
                int *correct_p) {
    int c = m->dims[m->nlayers];
    const float *z = m->act[m->nlayers - 1];
    float *dz = m->dbuf[0];
    double loss = 0;
    int correct = 0;
    for (int i = 0; i < batch; i++) {
        const float *zi = z + (size_t)i * c;
        float mx = zi[0];
        int arg = 0;
        for (int j = 1; j < c; j++)
            if (zi[j] > mx) {
                mx = zi[j];
                arg = j;
            }
        correct += arg == labels[i];
        double sum = 0;
        for (int j = 0; j < c; j++)
            sum += exp((double)(zi[j] - mx));
        double logsum = log(sum);
        loss += logsum - (double)(zi[labels[i]] - mx);
        if (want_grad) {
            float *di = dz + (size_t)i * c;
            for (int j = 0; j < c; j++) {
                double p = exp((double)(zi[j] - mx) - logsum);
                di[j] = (float)((p - (j == labels[i] ? 1.0 : 0.0)) * (double)scale / batch);
            }
        }
    }
    if (correct_p) *correct_p = correct;
    return loss / batch;
}

int mlp_backward(mlp_t *m, int batch, int accumulate, mlp_ready_fn ready, void *ctx) {
    int cur = 0; /* dbuf[cur] holds the gradient w.r.t. the output of layer l */
    for (int l = m->nlayers - 1; l >= 0; l--) {
        const float *in = l > 0 ? m->act[l - 1] : m->input;
        int k = m->dims[l], n = m->dims[l + 1];
        /* Weight gradient first, so that GradReady fires as early as possible; the input
         * gradient computed afterwards reads w[l], which communication never touches. */
        mlp_gemm_wgrad(m, l, in, m->dbuf[cur], m->gw[l], m->gb[l], batch, k, n, accumulate);
        if (ready) {
            int rc = ready(ctx, l);
            if (rc != 0) return rc;
        }
        if (l > 0) {
            mlp_gemm_dgrad(m, m->dbuf[cur], m->w[l], m->act[l - 1], m->dbuf[1 - cur], batch, k, n);
            if (m->threads > 1 && m->poll) m->poll(m->poll_ctx);
            cur = 1 - cur;
        }
    }
    return 0;
}

size_t mlp_evaluate(mlp_t *m, const float *x, const uint8_t *labels, size_t n, double *loss_p) {
    size_t correct = 0;
    double loss = 0;
    for (size_t i = 0; i < n; i += (size_t)m->max_batch) {
        int b = (int)(n - i < (size_t)m->max_batch ? n - i : (size_t)m->max_batch);
        int c = 0;
        mlp_forward(m, x + i * (size_t)m->dims[0], b);
        loss += mlp_loss(m, labels + i, b, 1.0f, 0, &c) * b;
        correct += (size_t)c;
    }
    if (loss_p) *loss_p = n ? loss / (double)n : 0;
    return correct;
}
