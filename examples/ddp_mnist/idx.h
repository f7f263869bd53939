/*
 * idx.h: reader for the IDX files of MNIST and Fashion-MNIST (gzip-compressed or plain), as
 * shipped by Debian's dataset-fashion-mnist package in /usr/share/datasets/fashion-mnist.
 */
#ifndef DDP_MNIST_IDX_H_
#define DDP_MNIST_IDX_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IDX_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

typedef struct {
    size_t n;        /* samples */
    int rows, cols;  /* image size */
    float *images;   /* n x rows*cols, pixel / 255 */
    uint8_t *labels; /* n */
} idx_set_t;

/* Load "<dir>/<prefix>-images-idx3-ubyte[.gz]" and "<dir>/<prefix>-labels-idx1-ubyte[.gz]"
 * (prefix "train" or "t10k"). On failure returns -1 and writes a message naming the file and what
 * is wrong (and the Debian package, when the files are missing) into err. */
int idx_load(const char *dir, const char *prefix, idx_set_t *set, char *err, size_t errlen);
void idx_free(idx_set_t *set);

/* Parse an in-memory IDX blob: dims of a uint8 tensor with ndims dimensions. Returns a pointer to
 * the data or NULL (err filled). Exposed for tests. */
const uint8_t *idx_parse(const uint8_t *blob, size_t len, int ndims, uint32_t *dims, char *err,
                         size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
