// The table benchmarks' checks (table_bench.cu, tier_bench.cu): a failed CUDA call or table call ends the run with
// exit status 2, naming the call's error and where.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "gpu_table.h"

#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                                 \
    }                                                                                               \
  } while (0)
#define CKT(x)                                                                                         \
  do {                                                                                                 \
    if ((x) != 0) {                                                                                    \
      std::fprintf(stderr, "table error: %s (%s:%d)\n", heterps_gpu_last_error(), __FILE__, __LINE__); \
      std::exit(2);                                                                                    \
    }                                                                                                  \
  } while (0)
