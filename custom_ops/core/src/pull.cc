// pull(): the hot path.  See the comment at the top of SparseTable::pull for its three stages.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "heterps/hash.h"
#include "heterps/table.h"
#include "shard_ops.h"

namespace heterps {

namespace {

// The index line holding a hash's home entry, and the next line when the home entry is the last of its
// line (4 entries a line; the probe then continues there whenever the home entry holds another key).
// Prefetches never fault, so a stale base pointer (the unlocked hint copy) only costs a useless line.
inline void prefetch_home(const Entry* base, uint64_t mask, uint64_t h) {
  __builtin_prefetch(base + (h & mask));
  __builtin_prefetch(base + ((h + 1) & mask));
}

}  // namespace

void SparseTable::pull(const int64_t* keys, size_t n, float* out) {
  if (n == 0) return;
  check_keys(keys, n);
  const uint32_t tick = next_tick();
  const size_t d = config_.dim;
  const uint32_t ns = config_.shards;
  // Chunks of 2048 ids.  Stage 1 hashes the chunk and groups it by shard (counting sort: one lock
  // acquisition per shard per chunk); stage 2 locates and prefetches every row, prefetching the index line
  // of the id kAhead places ahead (through the shards' hint copies, so across group boundaries too);
  // stage 3 copies in batch order.  Prefetching all 2048 index lines in stage 1 (the previous design)
  // overran what the core can keep in flight: perf put half of pull's time on the probe's first load.
  constexpr size_t kChunk = 2048;
  constexpr size_t kAhead = 16;  // index prefetch distance (ids, in shard-group order)
  std::vector<uint64_t> hs(std::min(n, kChunk));
  std::vector<uint32_t> order(hs.size()), cnt(ns + 1), pos(ns);
  std::vector<const float*> rows(hs.size());
  std::vector<const Entry*> hint_e(ns);
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(ns);
  std::vector<uint32_t> missing;
  std::vector<uint64_t> hint_m(ns);
  const uint32_t shard_shift = shard_bits_ == 0 ? 0 : 64 - shard_bits_;
  const uint32_t shard_mask = ns - 1;  // shards == 1: shift 0, mask 0
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t m = std::min(kChunk, n - base);
    const int64_t* k = keys + base;
    float* o = out + base * d;
    std::fill(cnt.begin(), cnt.end(), 0u);
    for (uint32_t s = 0; s < ns; ++s) {  // prefetch addresses only: a stale copy is harmless
      hint_e[s] = shards_[s]->hint_entries.load(std::memory_order_relaxed);
      hint_m[s] = shards_[s]->hint_mask.load(std::memory_order_relaxed);
    }
    for (size_t i = 0; i < m; ++i) {
      uint64_t h = key_hash(k[i]);
      hs[i] = h;
      uint32_t s = static_cast<uint32_t>(h >> shard_shift) & shard_mask;
      ++cnt[s + 1];
    }
    for (uint32_t s = 0; s < ns; ++s) {
      cnt[s + 1] += cnt[s];
      pos[s] = cnt[s];
    }
    for (size_t i = 0; i < m; ++i) {
      uint32_t s = static_cast<uint32_t>(hs[i] >> shard_shift) & shard_mask;
      order[pos[s]++] = static_cast<uint32_t>(i);
    }
    for (size_t j = 0; j < std::min(m, kAhead); ++j) {
      const uint64_t h = hs[order[j]];
      const uint32_t s = static_cast<uint32_t>(h >> shard_shift) & shard_mask;
      prefetch_home(hint_e[s], hint_m[s], h);
    }
    // Stage 2: under the locks of every shard the chunk touches (taken in ascending order, as save() does,
    // so no deadlock), locate each row and prefetch it.  Stage 3: copy in the batch's order, so the writes
    // into `out` are sequential.  Keeping the locks until the copy is what makes the located rows stable.
    for (uint32_t s = 0; s < ns; ++s) {
      const uint32_t b = cnt[s], e = cnt[s + 1];
      if (b == e) continue;
      Shard& sh = *shards_[s];
      locks.emplace_back(sh.mu);
      ShardOps ops{config_, sh, capacity_per_shard_, tick};
      const bool lru = config_.eviction == EvictPolicy::kLRU;
      uint64_t hits = 0;
      for (uint32_t j = b; j < e; ++j) {
        if (j + kAhead < m) {
          const uint64_t h = hs[order[j + kAhead]];
          const uint32_t ps = static_cast<uint32_t>(h >> shard_shift) & shard_mask;
          prefetch_home(hint_e[ps], hint_m[ps], h);
        }
        const uint32_t i = order[j];
        const float* r;
        // Hit path inline; creation, promotion and eviction out of line.
        int64_t at = sh.find_h(k[i], hs[i]);
        if (__builtin_expect(at >= 0, 1)) {
          Entry& en = sh.entries[at];
          if (lru) {
            if (en.score != tick) en.score = tick;
          } else {
            en.score = lfu_touch(en.score, tick);
          }
          r = sh.row(en.slot);
          ++hits;
        } else {
          // Not resident: deferred until the group's hits are located, with the SSD index line
          // prefetched meanwhile (a promotion costs several dependent misses).
          rows[i] = nullptr;
          missing.push_back(j);
          if (!sh.ssd_index.empty()) sh.ssd_index.prefetch(hs[i]);
          continue;
        }
        rows[i] = r;
        if (d == 8) {
          // Dim 8 (32-byte rows): prefetch into L2 only (prefetcht1); stage 3 moves the row into L1
          // just ahead of its copy.  With uniform ids the prefetcht0 of the row competed with the index
          // probes for the L1's miss slots: +18-20% pull rate at dim 8 with uniform ids (paired A/B),
          // Zipf ids within noise (-5..+1%).  At dims 16 and 64 prefetcht1 alone cost Zipf pulls 10-20%
          // for little gain with uniform ids, so they keep prefetcht0 (not re-measured with the stage-3
          // prefetch).
          __builtin_prefetch(r, 0, 2);
        } else {
          for (size_t l = 0; l < d; l += 16) __builtin_prefetch(r + l);  // every line of the weights
        }
      }
      sh.hits += hits;
      for (uint32_t j : missing) {
        const uint32_t i = order[j];
        const float* r = ops.get_h(k[i], hs[i], tick);  // creates, promotes, or finds a repeated id
        rows[i] = r;
        for (size_t l = 0; l < d; l += 16) __builtin_prefetch(r + l);
        if (__builtin_expect(ops.over_budget(), 0)) {
          // Eviction may free (and reuse) the slots of rows of this shard located so far: copy them now.
          for (uint32_t jj = b; jj < e; ++jj) {
            const uint32_t ii = order[jj];
            if (rows[ii] != nullptr) std::memcpy(o + size_t(ii) * d, rows[ii], d * sizeof(float));
            rows[ii] = nullptr;
          }
          ops.evict();
        }
      }
      missing.clear();
    }
    // Fixed-size copies for the common dims compile to a few vector moves instead of a memcpy call.
    switch (d) {
      case 8:
        // Stage 2 left these rows in L2 (prefetcht1, above): bring them into L1 16 rows ahead of the copy.
        for (size_t i = 0; i < m; ++i) {
          if (i + 16 < m && rows[i + 16]) __builtin_prefetch(rows[i + 16]);
          if (rows[i]) std::memcpy(o + i * 8, rows[i], 32);
        }
        break;
      case 16:
        for (size_t i = 0; i < m; ++i)
          if (rows[i]) std::memcpy(o + i * 16, rows[i], 64);
        break;
      case 32:
        for (size_t i = 0; i < m; ++i)
          if (rows[i]) std::memcpy(o + i * 32, rows[i], 128);
        break;
      case 64:
        for (size_t i = 0; i < m; ++i)
          if (rows[i]) std::memcpy(o + i * 64, rows[i], 256);
        break;
      default:
        for (size_t i = 0; i < m; ++i)
          if (rows[i]) std::memcpy(o + i * d, rows[i], d * sizeof(float));
    }
    locks.clear();
  }
}

}  // namespace heterps
