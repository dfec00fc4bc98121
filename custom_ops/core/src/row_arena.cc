#include "row_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace heterps {

void RowArena::configure(uint32_t stride, bool allow_huge) {
  stride_ = stride;
  uint64_t rows_big = 1;
  while (rows_big * 2 * stride * 4 <= kHuge) rows_big *= 2;
  if (!allow_huge || rows_big < (uint64_t(1) << (kBaseShift + 1))) {
    geo_blocks_ = 26;  // doubling blocks only (enough for 2^32 slots)
    geo_slots_ = UINT64_MAX;
    return;
  }
  big_shift_ = 0;
  while ((uint64_t(1) << big_shift_) < rows_big) ++big_shift_;
  // Doubling blocks only up to 256 KiB, then 2 MiB blocks: most rows of a large shard sit on huge pages,
  // while a small shard (the common case in tests and small tables) never commits a whole huge page.
  uint32_t small_shift = kBaseShift;
  while ((uint64_t(2) << small_shift) * stride * 4 <= (size_t(256) << 10)) ++small_shift;
  geo_blocks_ = std::min(small_shift, big_shift_) - kBaseShift;
  geo_slots_ = ((uint64_t(1) << geo_blocks_) - 1) << kBaseShift;
}

void RowArena::ensure(uint32_t slot) {
  uint64_t s = slot;
  size_t b =
      s < geo_slots_ ? 63 - __builtin_clzll((s >> kBaseShift) + 1) : geo_blocks_ + ((s - geo_slots_) >> big_shift_);
  while (ptrs_.size() <= b) {
    size_t k = ptrs_.size();
    bool huge = k >= geo_blocks_;
    uint64_t rows = huge ? (uint64_t(1) << big_shift_) : (uint64_t(1) << (kBaseShift + k));
    size_t bytes = static_cast<size_t>(rows * stride_ * 4);
    void* p = nullptr;
    if (huge) {
      bytes = (bytes + kHuge - 1) & ~(kHuge - 1);
      p = std::aligned_alloc(kHuge, bytes);
      if (p != nullptr) ::madvise(p, bytes, MADV_HUGEPAGE);  // a hint; failure only costs speed
    } else {
      bytes = (bytes + 63) & ~size_t(63);
      p = std::aligned_alloc(64, bytes);  // a 64-byte row must not straddle two cache lines
    }
    if (p == nullptr) throw std::bad_alloc();
    ptrs_.push_back(static_cast<float*>(p));
    bytes_ += bytes;
  }
}

void RowArena::clear() {
  for (float* p : ptrs_) std::free(p);
  ptrs_.clear();
  bytes_ = 0;
}

}  // namespace heterps
