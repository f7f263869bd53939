// cuda_copy_bw.cu: the GPU's copy bandwidth, the yardstick of perf/gpu_check.sh.
//
// Prints one line per measurement, "key=value" (GB/s, GB = 1e9 bytes, bytes = the size of one
// copy, so a device-to-device copy of N bytes moves N bytes in and N bytes out of HBM):
//   d2d_GBps   cudaMemcpyAsync device -> device on one GPU (the limit when ranks share a GPU)
//   h2d_GBps   pinned host -> device, d2h_GBps device -> pinned host (the staging path's limit)
// Each is the best of 5 timed batches of 10 copies of 256 MiB (or -s bytes), timed with events.
// usage: cuda_copy_bw [-d device] [-s bytes]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "cuda_copy_bw: %s failed: %s\n", #x, cudaGetErrorString(e_));          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double best_gbps(void *dst, const void *src, size_t bytes, cudaStream_t s) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s)); // warm up
    CK(cudaStreamSynchronize(s));
    double best = 0;
    const int iters = 10;
    for (int rep = 0; rep < 5; rep++) {
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < iters; i++) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        double gbps = (double)bytes * iters / (ms * 1e-3) / 1e9;
        if (gbps > best) best = gbps;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return best;
}

int main(int argc, char **argv) {
    int dev = 0;
    size_t bytes = 256u << 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-d") == 0) dev = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-s") == 0) bytes = strtoull(argv[i + 1], nullptr, 0);
        else {
            fprintf(stderr, "usage: %s [-d device] [-s bytes]\n", argv[0]);
            return 2;
        }
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "cuda_copy_bw: no CUDA GPU\n");
        return 1;
    }
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    void *d0, *d1, *h;
    CK(cudaMalloc(&d0, bytes));
    CK(cudaMalloc(&d1, bytes));
    CK(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
    CK(cudaMemset(d0, 1, bytes));
    memset(h, 2, bytes);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("gpu=%s\n", prop.name);
    printf("bytes=%zu\n", bytes);
    printf("d2d_GBps=%.1f\n", best_gbps(d1, d0, bytes, s));
    printf("h2d_GBps=%.1f\n", best_gbps(d0, h, bytes, s));
    printf("d2h_GBps=%.1f\n", best_gbps(h, d0, bytes, s));
    CK(cudaFree(d0));
    CK(cudaFree(d1));
    CK(cudaFreeHost(h));
    return 0;
}
