// Shared layout of the table core's internals: the reserved empty key, an index entry, the on-disk record
// header, and a fixed-size array that asks for huge pages.  Internal to custom_ops/core (not installed).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace heterps {

constexpr int64_t kEmptyKey = INT64_MIN;  // reserved: rejected as an id

struct Entry {
  int64_t key;
  uint32_t slot;
  uint32_t score;  // LRU: clock of last touch; LFU: touch count (saturating)
};

// Record of the SSD log and of checkpoints: key, score, 4 bytes (the SSD log: the record's CRC-32, see
// ssd_log.h; checkpoints: zero, the file has its own checksum), then stride floats.
constexpr size_t kRecordHeader = 16;

// A fixed-size array that asks for transparent huge pages once it spans 2 MiB (the row index of a large
// shard is probed at random, like the rows).
template <class T>
class HugeArray {
 public:
  HugeArray() = default;
  HugeArray(const HugeArray&) = delete;
  HugeArray& operator=(const HugeArray&) = delete;
  ~HugeArray() { std::free(p_); }
  void assign(size_t n, const T& v) {
    std::free(p_);
    p_ = nullptr;
    n_ = 0;
    size_t bytes = n * sizeof(T);
    constexpr size_t kHuge = size_t(2) << 20;
    if (bytes >= kHuge) {
      bytes = (bytes + kHuge - 1) & ~(kHuge - 1);
      p_ = static_cast<T*>(std::aligned_alloc(kHuge, bytes));
      if (p_ != nullptr) ::madvise(p_, bytes, MADV_HUGEPAGE);
    } else {
      p_ = static_cast<T*>(std::malloc(std::max<size_t>(bytes, sizeof(T))));
    }
    if (p_ == nullptr) throw std::bad_alloc();
    n_ = n;
    std::fill(p_, p_ + n, v);
  }
  void swap(HugeArray& o) {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }
  size_t size() const { return n_; }
  T* data() { return p_; }
  const T* data() const { return p_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace heterps
