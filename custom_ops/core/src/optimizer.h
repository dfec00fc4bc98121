// A row's initial value and the fused optimizer update, for the CPU core (the CUDA table has its kernels).
// Inline: push applies it once per unique id, and the call would cost as much as a dim-8 update.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "heterps/hash.h"
#include "heterps/table.h"

namespace heterps {

// Deterministic per-key init: a counter-based hash of (seed, key, column), so every process (and the
// Python model in the tests) computes the same row without coordination.  Writes stride() floats.
// apply_update: one optimizer step on a stored row (weights then state) with gradient g (dim floats).
inline void init_row(const TableConfig& c, int64_t key, float* row) {
  uint64_t base = mix64(c.seed ^ mix64(static_cast<uint64_t>(key)));
  for (uint32_t j = 0; j < c.dim; ++j) {
    uint64_t u = mix64(base + j);
    float unit = static_cast<float>(u >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    row[j] = (unit * 2.0f - 1.0f) * c.init_range;
  }
  float* st = row + c.dim;
  std::fill(st, st + c.state_dim(), 0.0f);
  if (c.optimizer == Optimizer::kAdam) {
    st[2 * c.dim] = 1.0f;      // beta1^t
    st[2 * c.dim + 1] = 1.0f;  // beta2^t
  }
}

// Whether n floats are all finite: an OR over the exponent bits (all ones = inf or NaN), without a branch
// per value so that it vectorizes; the per-value isfinite() loop cost push +44% instructions at dim 64.
inline bool all_finite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, x + j, 4);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

inline void apply_update(const TableConfig& c, float* row, const float* g) {
  const uint32_t d = c.dim;
  float* w = row;
  switch (c.optimizer) {
    case Optimizer::kSGD:
      for (uint32_t j = 0; j < d; ++j) w[j] -= c.lr * g[j];
      break;
    case Optimizer::kAdagrad: {
      float* acc = row + d;
      for (uint32_t j = 0; j < d; ++j) {
        acc[j] += g[j] * g[j];
        w[j] -= c.lr * g[j] / (std::sqrt(acc[j]) + c.epsilon);
      }
      break;
    }
    case Optimizer::kAdam: {
      float* m = row + d;
      float* v = row + 2 * d;
      float* pw = row + 3 * d;
      pw[0] *= c.beta1;
      pw[1] *= c.beta2;
      const float c1 = 1.0f - pw[0], c2 = 1.0f - pw[1];
      const float b1 = c.beta1, b2 = c.beta2, ob1 = 1.0f - c.beta1, ob2 = 1.0f - c.beta2;
      for (uint32_t j = 0; j < d; ++j) {
        m[j] = b1 * m[j] + ob1 * g[j];
        v[j] = b2 * v[j] + ob2 * g[j] * g[j];
        float mhat = m[j] / c1;
        float vhat = v[j] / c2;
        w[j] -= c.lr * mhat / (std::sqrt(vhat) + c.epsilon);
      }
      break;
    }
  }
}

}  // namespace heterps
