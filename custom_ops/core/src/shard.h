// One shard of the table: an open-addressing index (key -> slot, score) over a RowArena, its SSD log and the
// log's KeyIndex, under one mutex.  The lookups used on every pull are inline here.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "heterps/hash.h"
#include "heterps/table.h"
#include "key_index.h"
#include "layout.h"
#include "row_arena.h"
#include "ssd_log.h"

namespace heterps {

struct SparseTable::Shard {
  std::mutex mu;
  HugeArray<Entry> entries;
  uint64_t mask = 0;
  uint64_t count = 0;  // resident rows
  RowArena arena;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;

  // SSD tier: the append-only log, and key -> (record number; the score is kept in the record).
  SsdLog log;
  KeyIndex ssd_index;
  uint64_t no_spill_below = 0;  // after a failed spill, do not retry until count exceeds this
  bool spill_warned = false;
  // Ids whose spilled record failed its check (ShardOps::spilled), with what was wrong: dropped from the
  // SSD tier, listed until forget_lost(); save() refuses while any are listed.
  std::vector<std::pair<int64_t, std::string>> lost;

  uint64_t hits = 0, misses = 0, promotions = 0, evictions = 0, spill_errors = 0, compactions = 0;

  uint32_t stride = 0;

  float* row(uint32_t slot) { return arena.row(slot); }

  // Copies of (entries.data(), mask) readable without the lock, only ever used as prefetch addresses: a
  // stale pointer just prefetches a useless line (prefetches never fault).
  std::atomic<const Entry*> hint_entries{nullptr};
  std::atomic<uint64_t> hint_mask{0};

  void init_index(uint64_t cap) {
    entries.assign(cap, Entry{kEmptyKey, 0, 0});
    mask = cap - 1;
    hint_entries.store(entries.data(), std::memory_order_relaxed);
    hint_mask.store(mask, std::memory_order_relaxed);
  }

  void prefetch_hint(uint64_t h) const {
    const Entry* e = hint_entries.load(std::memory_order_relaxed);
    __builtin_prefetch(e + (h & hint_mask.load(std::memory_order_relaxed)));
  }

  int64_t find(int64_t key) const { return find_h(key, key_hash(key)); }

  int64_t find_h(int64_t key, uint64_t h) const {
    uint64_t i = h & mask;
    while (true) {
      const Entry& e = entries[i];
      if (e.key == key) return static_cast<int64_t>(i);
      if (e.key == kEmptyKey) return -1;
      i = (i + 1) & mask;
    }
  }

  void prefetch(int64_t key) const { __builtin_prefetch(&entries[key_hash(key) & mask]); }

  uint64_t insert_entry(int64_t key, uint32_t slot, uint32_t score) {
    // At most 70% full: hits still take ~2 probes, mostly in one cache line, and the index stays small
    // (at 50% a power-of-two row count, as in the benchmark, doubles it to 4 entries per row).
    if ((count + 1) * 10 > entries.size() * 7) grow();
    uint64_t i = key_hash(key) & mask;
    while (entries[i].key != kEmptyKey) i = (i + 1) & mask;
    entries[i] = Entry{key, slot, score};
    ++count;
    return i;
  }

  void grow() {
    HugeArray<Entry> old;
    old.swap(entries);
    init_index(old.size() * 2);
    for (const Entry& e : old) {
      if (e.key == kEmptyKey) continue;
      uint64_t i = key_hash(e.key) & mask;
      while (entries[i].key != kEmptyKey) i = (i + 1) & mask;
      entries[i] = e;
    }
  }

  // Backward-shift deletion keeps linear probing tombstone-free.
  void erase_at(uint64_t i) {
    uint64_t j = i;
    while (true) {
      j = (j + 1) & mask;
      if (entries[j].key == kEmptyKey) break;
      uint64_t home = key_hash(entries[j].key) & mask;
      // entry j may move to the hole i unless its home lies cyclically in (i, j]
      bool stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        entries[i] = entries[j];
        i = j;
      }
    }
    entries[i].key = kEmptyKey;
    --count;
  }

  uint32_t alloc_slot() {
    if (!free_slots.empty()) {
      uint32_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    arena.ensure(next_slot);
    return next_slot++;
  }

  // Resident rows (high-water mark of slots handed out: freed slots are reused) and the row index.
  uint64_t bytes_in_memory() const { return entries.size() * sizeof(Entry) + uint64_t(next_slot) * stride * 4; }
};

}  // namespace heterps
