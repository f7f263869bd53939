// cuda_test_util.cc: see cuda_test_util.h.
#include "cuda_test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#if CHORUS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace chorus_cuda_test {

int gpu_count() {
    static int cached = -2;
    if (cached != -2) return cached;
#if CHORUS_HAVE_CUDA
    if (cuda_loaded_here()) {
        int n = 0;
        cached = cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
        return cached;
    }
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 100 ? 100 : n);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) cached = -1;
    else cached = WEXITSTATUS(status);
#else
    cached = 0;
#endif
    return cached;
}

std::string gpu_absent_reason() {
#if !CHORUS_HAVE_CUDA
    return "this build has no CUDA (CHORUS_HAVE_CUDA=0)";
#else
    int n = gpu_count();
    if (n < 0) return "could not probe for a GPU (the probe process failed)";
    if (n == 0) return "no CUDA GPU on this machine (cudaGetDeviceCount found none)";
    return "";
#endif
}

bool cuda_loaded_here() {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
        if (line.find("libcuda.so") != std::string::npos) return true;
    return false;
}

void put_value(ncclDataType_t t, void *base, size_t i, double v) {
    switch (t) {
    case ncclInt8: ((int8_t *)base)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)base)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)base)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)base)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)base)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)base)[i] = chorus_float_to_half((float)v); break;
    case ncclFloat32: ((float *)base)[i] = (float)v; break;
    case ncclFloat64: ((double *)base)[i] = v; break;
    case ncclBfloat16: ((uint16_t *)base)[i] = chorus_float_to_bf16((float)v); break;
    case ncclFloat8e4m3: ((uint8_t *)base)[i] = chorus_float_to_fp8e4m3((float)v); break;
    case ncclFloat8e5m2: ((uint8_t *)base)[i] = chorus_float_to_fp8e5m2((float)v); break;
    default: break;
    }
}

double get_value(ncclDataType_t t, const void *base, size_t i) {
    switch (t) {
    case ncclInt8: return ((const int8_t *)base)[i];
    case ncclUint8: return ((const uint8_t *)base)[i];
    case ncclInt32: return ((const int32_t *)base)[i];
    case ncclUint32: return ((const uint32_t *)base)[i];
    case ncclInt64: return (double)((const int64_t *)base)[i];
    case ncclUint64: return (double)((const uint64_t *)base)[i];
    case ncclFloat16: return chorus_half_to_float(((const uint16_t *)base)[i]);
    case ncclFloat32: return ((const float *)base)[i];
    case ncclFloat64: return ((const double *)base)[i];
    case ncclBfloat16: return chorus_bf16_to_float(((const uint16_t *)base)[i]);
    case ncclFloat8e4m3: return chorus_fp8e4m3_to_float(((const uint8_t *)base)[i]);
    case ncclFloat8e5m2: return chorus_fp8e5m2_to_float(((const uint8_t *)base)[i]);
    default: return 0;
    }
}

const char *dtype_label(ncclDataType_t t) { return chorus_dtype_name(t); }

} // namespace chorus_cuda_test
