// Row storage of one shard: blocks that never move (so growth copies nothing).  Block sizes double from 64
// rows up to 256 KiB, then are 2 MiB, 2 MiB-aligned and advised as transparent huge pages: a lookup is a
// random access, and with 4 KiB pages most of them also miss the TLB (numpy's large arrays get huge pages
// the same way).  Slots are handed out in order, so untouched pages of the last block cost nothing
// except under huge pages, which are used only where a block is small next to the shard's budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace heterps {

class RowArena {
 public:
  static constexpr uint32_t kBaseShift = 6;  // first block: 64 rows
  static constexpr size_t kHuge = size_t(2) << 20;

  RowArena() = default;
  RowArena(const RowArena&) = delete;
  RowArena& operator=(const RowArena&) = delete;
  ~RowArena() { clear(); }

  void configure(uint32_t stride, bool allow_huge);

  // On the hot path of every lookup: inline.
  float* row(uint32_t slot) const {
    uint64_t s = slot;
    if (s < geo_slots_) {
      uint64_t q = (s >> kBaseShift) + 1;
      uint32_t b = 63 - static_cast<uint32_t>(__builtin_clzll(q));
      return ptrs_[b] + (s - (((uint64_t(1) << b) - 1) << kBaseShift)) * stride_;
    }
    uint64_t t = s - geo_slots_;
    return ptrs_[geo_blocks_ + (t >> big_shift_)] + (t & ((uint64_t(1) << big_shift_) - 1)) * stride_;
  }

  // Make sure the block holding `slot` exists.
  void ensure(uint32_t slot);
  uint64_t bytes() const { return bytes_; }
  void clear();

 private:
  std::vector<float*> ptrs_;
  uint32_t stride_ = 0, geo_blocks_ = 26, big_shift_ = 0;
  uint64_t geo_slots_ = UINT64_MAX, bytes_ = 0;
};

}  // namespace heterps
