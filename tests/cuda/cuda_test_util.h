// cuda_test_util.h: shared by the CUDA-path tests (test_cuda): GPU presence without initialising
// CUDA in this process (forked ranks cannot use CUDA once the parent has), skip macros, and exact
// conversions between doubles and every NCCL datatype for the host-computed references.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "nccl.h" // outside extern "C": it may pull in the CUDA headers

extern "C" {
#include "reduce.h"
}

namespace chorus_cuda_test {

// Number of GPUs, asked in a forked child so this process does not initialise CUDA; -1 when the
// child could not tell (no driver). Cached.
int gpu_count();
// Empty when GPU tests can run, else why not (printed by the skip).
std::string gpu_absent_reason();
// Whether the CUDA driver library is already loaded in this process (then forked children cannot
// use CUDA: run the forked test in a process of its own, as ctest does).
bool cuda_loaded_here();

// Exact conversions (the test values are chosen so that every dtype represents them exactly).
void put_value(ncclDataType_t t, void *base, size_t i, double v);
double get_value(ncclDataType_t t, const void *base, size_t i);
const char *dtype_label(ncclDataType_t t);

} // namespace chorus_cuda_test

#define SKIP_WITHOUT_GPU_PATH()                                                                    \
    do {                                                                                           \
        std::string why_ = chorus_cuda_test::gpu_absent_reason();                                  \
        if (!why_.empty())                                                                         \
            GTEST_SKIP() << "SKIPPED, NOT RUN: " << why_                                           \
                         << " (the CUDA path of Chorus needs a GPU; this test did not check it)"; \
    } while (0)

// Forked ranks cannot use CUDA once this process has initialised it (a gtest binary running
// several cases): skip, saying so. ctest runs each case in a process of its own.
#define SKIP_IF_FORK_CANNOT_USE_CUDA()                                                             \
    do {                                                                                           \
        if (chorus_cuda_test::cuda_loaded_here())                                                  \
            GTEST_SKIP() << "SKIPPED, NOT RUN: CUDA is already initialised in this test process, " \
                            "so forked ranks cannot use it; run this test alone (ctest runs each " \
                            "test in its own process)";                                            \
    } while (0)
