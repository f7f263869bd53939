/*
 * mlp.h: a small fully connected network (e.g. 784-512-256-10) with ReLU between layers and a
 * softmax cross-entropy loss, with hand-written forward and backward passes in float32, for the
 * DDP example trainer and its tests.
 *
 * Weights of layer l are stored input-major (w[l][k * out + j]), so both forward and the weight
 * gradient stream through contiguous rows. Backward runs from the last layer to the first and
 * calls a callback as soon as a layer's weight and bias gradients are final, which is where a DDP
 * trainer calls chorusDdpGradReady.
 */
#ifndef DDP_MNIST_MLP_H_
#define DDP_MNIST_MLP_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLP_MAX_LAYERS 4

typedef struct {
    int nlayers;
    int dims[MLP_MAX_LAYERS + 1];
    int max_batch;
    int threads;             /* compute threads (OpenMP when built with it) */
    void (*poll)(void *ctx); /* optional: called between cache blocks of backward's products
                                (with one thread), e.g. to drive communication */
    /* optional, one thread: rows [0, rows) of gw[layer] are final; called (instead of poll) as
     * the weight gradient is computed block by block */
    void (*rows_ready)(void *ctx, int layer, int rows);
    void *poll_ctx;
    float *w[MLP_MAX_LAYERS];  /* dims[l] x dims[l+1] */
    float *b[MLP_MAX_LAYERS];  /* dims[l+1] */
    float *gw[MLP_MAX_LAYERS]; /* gradients; mlp_init allocates them, a trainer may repoint them
                                  (e.g. into DDP buckets) */
    float *gb[MLP_MAX_LAYERS];
    float *own_grads;           /* what mlp_init allocated for gw/gb */
    const float *input;         /* the last forward's input (not owned) */
    float *act[MLP_MAX_LAYERS]; /* act[l]: output of layer l (after ReLU, except the logits) */
    float *dbuf[2];             /* backward scratch: gradient w.r.t. activations */
} mlp_t;

/* Allocate a network with nlayers layers, dims[0..nlayers], for batches up to max_batch, with
 * He-uniform weights and zero biases from seed. Returns 0 or -1 (out of memory, bad sizes). */
int mlp_init(mlp_t *m, const int *dims, int nlayers, int max_batch, uint64_t seed);
void mlp_free(mlp_t *m);
size_t mlp_param_count(const mlp_t *m);

/* Forward pass over x (batch x dims[0]); the logits end in m->act[nlayers-1]. */
void mlp_forward(mlp_t *m, const float *x, int batch);

/* Softmax cross-entropy of the last forward against labels; returns the mean loss over the batch
 * and (if correct_p) the number of correct argmax predictions. With want_grad, leaves the gradient
 * of scale * mean loss w.r.t. the logits in the backward scratch for mlp_backward. */
double mlp_loss(mlp_t *m, const uint8_t *labels, int batch, float scale, int want_grad,
                int *correct_p);

/* Backward pass for the last forward/loss. accumulate = 1 adds to the gradient buffers instead of
 * overwriting them. ready(ctx, l) is called as soon as gw[l] and gb[l] are final, l from
 * nlayers-1 down to 0 (ready may be NULL). */
typedef int (*mlp_ready_fn)(void *ctx, int layer);
int mlp_backward(mlp_t *m, int batch, int accumulate, mlp_ready_fn ready, void *ctx);

/* Count correct predictions over n samples (x: n x dims[0]) in batches of up to max_batch. */
size_t mlp_evaluate(mlp_t *m, const float *x, const uint8_t *labels, size_t n, double *loss_p);

#ifdef __cplusplus
}
#endif
#endif
