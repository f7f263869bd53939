/*
 * idx.c: IDX reader (see idx.h). A file is read whole: through zlib's gzread when the build found
 * zlib (which also reads uncompressed files transparently), otherwise by a "gzip -dc" subprocess
 * for .gz files. The IDX header is a magic (0, 0, type 0x08 = uint8, number of dimensions)
 * followed by one big-endian u32 per dimension.
 */
#include "idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if DDP_MNIST_HAVE_ZLIB
#include <zlib.h>
#endif

static int idx_exists(const char *path) {
    return access(path, R_OK) == 0;
}

/* Read a whole (possibly gzip-compressed) file; returns a malloc'd buffer or NULL. */
static uint8_t *idx_slurp(const char *path, size_t *len_p, char *err, size_t errlen) {
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        snprintf(err, errlen, "out of memory reading %s", path);
        return NULL;
    }
#if DDP_MNIST_HAVE_ZLIB
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        free(buf);
        return NULL;
    }
    for (;;) {
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        int got =
            gzread(gz, buf + len, (unsigned)(cap - len > (1u << 30) ? (1u << 30) : cap - len));
        if (got <= 0) {
            int zerr = 0;
            const char *msg = gzerror(gz, &zerr);
            if (got < 0 || zerr != Z_OK) {
                snprintf(err, errlen, "cannot decompress %s: %s", path, msg);
                gzclose(gz);
                free(buf);
                return NULL;
            }
            break;
        }
        len += (size_t)got;
    }
    gzclose(gz);
#else
    char cmd[4200];
    size_t pl = strlen(path);
    int gz = pl > 3 && strcmp(path + pl - 3, ".gz") == 0;
    FILE *f;
    if (gz) {
        if (strchr(path, '\'')) {
            snprintf(err, errlen, "path %s contains a quote", path);
            free(buf);
            return NULL;
        }
        snprintf(cmd, sizeof(cmd), "gzip -dc '%s'", path);
        f = popen(cmd, "r");
    } else {
        f = fopen(path, "rb");
    }
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        free(buf);
        return NULL;
    }
    for (;;) {
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        if (got == 0) break;
        len += got;
    }
    int st = gz ? pclose(f) : fclose(f);
    if (st != 0) {
        snprintf(err, errlen, "cannot read %s (gzip -dc exit status %d)", path, st);
        free(buf);
        return NULL;
    }
#endif
    *len_p = len;
    return buf;
}

const uint8_t *idx_parse(const uint8_t *blob, size_t len, int ndims, uint32_t *dims, char *err,
                         size_t errlen) {
    if (len < 4 || blob[0] != 0 || blob[1] != 0) {
        snprintf(err, errlen, "not an IDX file (bad magic)");
        return NULL;
    }
    if (blob[2] != 0x08) {
        snprintf(err, errlen, "IDX element type 0x%02x is not uint8 (0x08)", blob[2]);
        return NULL;
    }
    if (blob[3] != ndims) {
        snprintf(err, errlen, "IDX file has %d dimensions, expected %d", blob[3], ndims);
        return NULL;
    }
    if (len < 4 + 4 * (size_t)ndims) {
        snprintf(err, errlen, "IDX header truncated");
        return NULL;
    }
    size_t total = 1;
    for (int d = 0; d < ndims; d++) {
        const uint8_t *p = blob + 4 + 4 * d;
        dims[d] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        total *= dims[d];
    }
    if (len - 4 - 4 * (size_t)ndims < total) {
        snprintf(err, errlen, "IDX data truncated: %zu bytes for %zu elements",
                 len - 4 - 4 * (size_t)ndims, total);
        return NULL;
    }
    return blob + 4 + 4 * ndims;
}

/* "<dir>/<name>.gz", else "<dir>/<name>". */
static int idx_find(const char *dir, const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s.gz", dir, name);
    if (idx_exists(path)) return 0;
    snprintf(path, cap, "%s/%s", dir, name);
    if (idx_exists(path)) return 0;
    snprintf(path, cap, "%s/%s.gz", dir, name);
    return -1;
}

int idx_load(const char *dir, const char *prefix, idx_set_t *set, char *err, size_t errlen) {
    memset(set, 0, sizeof(*set));
    char ipath[4096], lpath[4096], name[256], perr[256];
    snprintf(name, sizeof(name), "%s-images-idx3-ubyte", prefix);
    int missing = idx_find(dir, name, ipath, sizeof(ipath));
    snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", prefix);
    missing |= idx_find(dir, name, lpath, sizeof(lpath));
    if (missing) {
        snprintf(err, errlen,
                 "Fashion-MNIST file %s not found: install the Debian package "
                 "dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or pass --data DIR "
                 "with the IDX files",
                 idx_exists(ipath) ? lpath : ipath);
        return -1;
    }
    size_t ilen = 0, llen = 0;
    uint8_t *iblob = idx_slurp(ipath, &ilen, err, errlen);
    if (!iblob) return -1;
    uint8_t *lblob = idx_slurp(lpath, &llen, err, errlen);
    if (!lblob) {
        free(iblob);
        return -1;
    }
    uint32_t idims[3], ldims[1];
    const uint8_t *pix = idx_parse(iblob, ilen, 3, idims, perr, sizeof(perr));
    const uint8_t *lab = pix ? idx_parse(lblob, llen, 1, ldims, perr, sizeof(perr)) : NULL;
    int rc = -1;
    if (!pix || !lab) {
        snprintf(err, errlen, "%s: %s", pix ? lpath : ipath, perr);
    } else if (idims[0] != ldims[0]) {
        snprintf(err, errlen, "%s has %u images but %s has %u labels", ipath, idims[0], lpath,
                 ldims[0]);
    } else {
        size_t n = idims[0], px = (size_t)idims[1] * idims[2];
        set->images = malloc(n * px * sizeof(float));
        set->labels = malloc(n ? n : 1);
        if (!set->images || !set->labels) {
            snprintf(err, errlen, "out of memory for %zu images", n);
            idx_free(set);
        } else {
            for (size_t i = 0; i < n * px; i++)
                set->images[i] = (float)pix[i] * (1.0f / 255.0f);
            for (size_t i = 0; i < n; i++) {
                set->labels[i] = lab[i];
                if (lab[i] > 9) {
                    snprintf(err, errlen, "%s: label %u of sample %zu is not 0..9", lpath, lab[i],
                             i);
                    idx_free(set);
                    break;
                }
            }
            if (set->images) {
                set->n = n;
                set->rows = (int)idims[1];
                set->cols = (int)idims[2];
                rc = 0;
            }
        }
    }
    free(iblob);
    free(lblob);
    return rc;
}

void idx_free(idx_set_t *set) {
    free(set->images);
    free(set->labels);
    memset(set, 0, sizeof(*set));
}
