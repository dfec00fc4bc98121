// key -> record number of a shard's SSD log.  Open addressing (like the row index): std::unordered_map's
// node allocations and modulo hashing showed up as a fifth of the time of a promotion-heavy pull.
#pragma once

#include <cstdint>
#include <vector>

#include "heterps/hash.h"
#include "layout.h"

namespace heterps {

class KeyIndex {
 public:
  KeyIndex() { reset(16); }
  void reset(uint64_t cap) {
    keys_.assign(cap, kEmptyKey);
    vals_.assign(cap, 0);
    mask_ = cap - 1;
    count_ = 0;
  }
  uint64_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  uint64_t capacity() const { return keys_.size(); }
  int64_t find(int64_t key) const {
    uint64_t i = key_hash(key) & mask_;
    while (true) {
      if (keys_[i] == key) return static_cast<int64_t>(i);
      if (keys_[i] == kEmptyKey) return -1;
      i = (i + 1) & mask_;
    }
  }
  uint64_t value_at(int64_t i) const { return vals_[i]; }
  void prefetch(uint64_t h) const {
    __builtin_prefetch(keys_.data() + (h & mask_));
    __builtin_prefetch(vals_.data() + (h & mask_));
  }
  int64_t key_at(uint64_t i) const { return keys_[i]; }
  void set_value_at(uint64_t i, uint64_t v) { vals_[i] = v; }
  void assign(int64_t key, uint64_t v) {
    if ((count_ + 1) * 2 > keys_.size()) grow();
    uint64_t i = key_hash(key) & mask_;
    while (keys_[i] != kEmptyKey && keys_[i] != key) i = (i + 1) & mask_;
    if (keys_[i] == kEmptyKey) ++count_;
    keys_[i] = key;
    vals_[i] = v;
  }
  // Backward-shift deletion keeps linear probing tombstone-free.
  void erase_at(uint64_t i) {
    uint64_t j = i;
    while (true) {
      j = (j + 1) & mask_;
      if (keys_[j] == kEmptyKey) break;
      uint64_t home = key_hash(keys_[j]) & mask_;
      bool stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        keys_[i] = keys_[j];
        vals_[i] = vals_[j];
        i = j;
      }
    }
    keys_[i] = kEmptyKey;
    --count_;
  }

 private:
  void grow() {
    std::vector<int64_t> ok;
    std::vector<uint64_t> ov;
    ok.swap(keys_);
    ov.swap(vals_);
    reset(ok.size() * 2);
    for (size_t i = 0; i < ok.size(); ++i)
      if (ok[i] != kEmptyKey) assign(ok[i], ov[i]);
  }
  std::vector<int64_t> keys_;
  std::vector<uint64_t> vals_;
  uint64_t mask_ = 0, count_ = 0;
};

}  // namespace heterps
