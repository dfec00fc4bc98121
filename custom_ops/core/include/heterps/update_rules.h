// The optimizers' update rules, once, for the CPU core (custom_ops/core/src/optimizer.h) and the CUDA table
// (custom_ops/cuda/gpu_table.cu): the same functions compile for both, so SGD, Adagrad and Adam cannot drift
// between host and device.  Plain C++ (no Paddle, no CUDA headers): HETERPS_HD is empty for a host compiler.
//
// Bit-identical on both sides: every rule is written as one order of float operations, the CPU build does
// not contract them into FMAs (x86-64 without -mfma), and the CUDA table is compiled with --fmad=false;
// square root and division are IEEE-rounded on both (nvcc's defaults without --use_fast_math).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define HETERPS_HD __host__ __device__
#else
#define HETERPS_HD
#endif

namespace heterps {

enum class Optimizer : uint32_t { kSGD = 0, kAdagrad = 1, kAdam = 2 };

// A stored row is dim weights, then the optimizer's state (TableConfig::state_dim()):
//   SGD      none
//   Adagrad  acc[dim]                  (sum of squared gradients per column)
//   Adam     m[dim], v[dim], p1, p2    (moments per column; beta1^t, beta2^t for the row)

HETERPS_HD inline float rule_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

// grad_clip > 0: a summed gradient value is clipped to [-lim, lim] before the update.
HETERPS_HD inline float clip_gradient(float g, float lim) {
  const float lo = -lim < g ? g : -lim;  // std::max(-lim, g)
  return lo < lim ? lo : lim;            // std::min(lim, lo)
}

HETERPS_HD inline void sgd_column(float& w, float g, float lr) {
  w = w - lr * g;
}

HETERPS_HD inline void adagrad_column(float& w, float& acc, float g, float lr, float eps) {
  acc = acc + g * g;
  w = w - lr * g / (rule_sqrt(acc) + eps);
}

// Adam: once per row before its columns, the row's powers advance (p1 *= beta1, p2 *= beta2) and give the
// bias corrections c1 = 1 - p1, c2 = 1 - p2 that every column of this step uses.
HETERPS_HD inline void adam_powers(float& p1, float& p2, float beta1, float beta2, float& c1, float& c2) {
  p1 = p1 * beta1;
  p2 = p2 * beta2;
  c1 = 1.0f - p1;
  c2 = 1.0f - p2;
}

HETERPS_HD inline void adam_column(float& w, float& m, float& v, float g, float lr, float beta1, float beta2, float c1,
                                   float c2, float eps) {
  m = beta1 * m + (1.0f - beta1) * g;
  v = beta2 * v + (1.0f - beta2) * g * g;
  const float mhat = m / c1;
  const float vhat = v / c2;
  w = w - lr * mhat / (rule_sqrt(vhat) + eps);
}

}  // namespace heterps
