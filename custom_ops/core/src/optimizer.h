// A row's initial value and the fused optimizer update over a row, for the CPU core (the per-column rules are
// heterps/update_rules.h, which the CUDA table's kernels call too).
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

// The rules themselves are heterps/update_rules.h, shared with the CUDA table; here they run over a row with
// the switch outside the column loops.  The constants are copied to locals first: the row's stores could
// alias the config as far as the compiler knows, and reloading them cost ~2 instructions a column.
inline void apply_update(const TableConfig& c, float* row, const float* g) {
  const uint32_t d = c.dim;
  const float lr = c.lr, eps = c.epsilon;
  float* w = row;
  switch (c.optimizer) {
    case Optimizer::kSGD:
      for (uint32_t j = 0; j < d; ++j) sgd_column(w[j], g[j], lr);
      break;
    case Optimizer::kAdagrad: {
      float* acc = row + d;
      for (uint32_t j = 0; j < d; ++j) adagrad_column(w[j], acc[j], g[j], lr, eps);
      break;
    }
    case Optimizer::kAdam: {
      float* m = row + d;
      float* v = row + 2 * d;
      float* pw = row + 3 * d;
      float c1, c2;
      adam_powers(pw[0], pw[1], c.beta1, c.beta2, c1, c2);
      const float b1 = c.beta1, b2 = c.beta2;
      for (uint32_t j = 0; j < d; ++j) adam_column(w[j], m[j], v[j], g[j], lr, b1, b2, c1, c2, eps);
      break;
    }
  }
}

}  // namespace heterps
