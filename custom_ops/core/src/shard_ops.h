// What a call does to one shard, its lock held: find, create, promote from SSD, overwrite, remove, evict.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heterps/table.h"
#include "shard.h"

namespace heterps {

using Shard = SparseTable::Shard;

// LFU score: touch count in the high 16 bits (saturating), low 16 bits of the clock of the last touch in
// the low bits, so that eviction can spare rows the current call is using: without that, a batch's newly
// created or promoted rows (count 1) were evicted by the same batch and thrashed through the SSD log.
inline uint32_t lfu_touch(uint32_t score, uint32_t tick) {
  uint32_t count = score >> 16;
  if (count < 0xFFFFu) ++count;
  return (count << 16) | (tick & 0xFFFFu);
}

struct ShardOps {
  const TableConfig& c;
  Shard& sh;
  uint64_t capacity;      // 0 = unlimited
  uint32_t tick = 0;      // the current call's clock (LFU: rows touched by it are evicted last); 0 = none
  uint64_t log_size = 0;  // the SSD log's size as this call last saw it (SsdLog::checked)

  size_t record_bytes() const { return kRecordHeader + size_t(c.stride()) * 4; }

  // The row of key, created or promoted if it is not resident; touches its score.
  float* get(int64_t key, uint32_t tick) { return get_h(key, key_hash(key), tick); }
  __attribute__((noinline)) float* get_h(int64_t key, uint64_t h, uint32_t tick);

  void touch(Entry& e, uint32_t tick) const {
    if (c.eviction == EvictPolicy::kLRU) {
      if (e.score != tick) e.score = tick;  // hot rows: skip dirtying a line that already holds the tick
    } else {
      e.score = lfu_touch(e.score, tick);
    }
  }

  // The checked SSD record of key, whose SSD index position is `at`.  A record that fails its check is
  // dropped from the SSD tier, listed in sh.lost, and thrown as a TableError naming file, offset and id.
  const char* spilled(int64_t key, int64_t at);

  // Insert or overwrite a full row (weights and optimizer state).
  void put(int64_t key, uint32_t score, const float* src);
  // Remove key's full row into dst (from memory or SSD), or write its initial row if absent.
  void take(int64_t key, float* dst);

  bool over_budget() const { return capacity != 0 && sh.count > capacity && sh.count > sh.no_spill_below; }

  // Moves the coldest rows to the SSD log until the shard is 1/8 below its capacity (eviction.cc).
  void evict();
  // Rewrites the log's live records once dead ones outnumber them (eviction.cc).
  void maybe_compact();
};

}  // namespace heterps
