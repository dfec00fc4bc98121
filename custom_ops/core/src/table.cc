// The table: 2^k shards (shard.h), each an open-addressing index over a block-allocated row arena
// (row_arena.h), guarded by one mutex, with its own append-only SSD log for evicted rows (ssd_log.h,
// eviction.cc).  This file: construction, push and the small operations; pull.cc is the hot path;
// checkpoint.cc saves and loads.
//
// Why shards with a mutex each: the static executor runs pulls and pushes of different ops on several
// threads in no fixed order.  A batch is first grouped by shard (counting sort) so that each shard lock is
// taken once per call, not once per key: locking per key would cost as much as the lookup itself.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "heterps/hash.h"
#include "heterps/table.h"
#include "io.h"
#include "optimizer.h"
#include "shard_ops.h"
#include "task_pool.h"

namespace heterps {

namespace {
// Spill directories of the tables alive in this process.  The table registry is never destroyed (ops may
// run during interpreter exit), so without this the spill logs of every table not closed would outlive a
// normal exit.  At exit their files are unlinked: the open descriptors keep working for anything that
// still runs, and the disk space goes with the process.
std::mutex g_spill_mu;
std::set<std::string>& spill_dirs() {
  static auto* s = new std::set<std::string>();  // never destroyed, like the registry
  return *s;
}

void remove_spill_dirs_at_exit() {
  std::unique_lock<std::mutex> lock(g_spill_mu, std::try_to_lock);
  if (!lock.owns_lock()) return;  // a thread is creating or closing a table: the next table reclaims these
  for (const std::string& dir : spill_dirs()) io::remove_dir_files(dir);
}
}  // namespace

void SparseTable::track_spill_dir(const std::string& dir, bool add) {
  std::lock_guard<std::mutex> lock(g_spill_mu);
  static bool registered = (std::atexit(remove_spill_dirs_at_exit), true);
  (void)registered;
  if (add)
    spill_dirs().insert(dir);
  else
    spill_dirs().erase(dir);
}

SparseTable::SparseTable(const TableConfig& config) : config_(config) {
  config_.validate();
  pool_ = std::make_unique<TaskPool>(config_.host_threads != 0 ? config_.host_threads : usable_cpus());
  if (config_.memory_budget_bytes > 0 && config_.ssd_dir.empty())
    throw TableError("table config: memory_budget_bytes needs ssd_dir (where cold rows go)");
  shard_bits_ = 0;
  while ((1u << shard_bits_) < config_.shards) ++shard_bits_;
  if (config_.memory_budget_bytes > 0) {
    // The largest per-shard row cap whose rows (cap + 1: a shard briefly holds one row over its cap
    // before evicting) and index (a power of two of 16-byte entries, at most 70% full) fit the shard's
    // share of the budget.  The SSD tier's own index is reported apart (bytes_ssd_index).
    const uint64_t share = config_.memory_budget_bytes / config_.shards;
    const uint64_t row_bytes = uint64_t(config_.stride()) * 4;
    auto cost = [&](uint64_t r) {
      uint64_t entries = 16;
      while (entries * 7 < (r + 2) * 10) entries <<= 1;
      return (r + 1) * row_bytes + entries * sizeof(Entry);
    };
    uint64_t r = share / config_.row_cost_bytes() + 1;
    while (r > 1 && cost(r) > share) --r;
    capacity_per_shard_ = std::max<uint64_t>(1, r);
    ssd_path_ = io::make_private_dir(config_.ssd_dir, &ssd_lock_fd_);
    track_spill_dir(ssd_path_, true);
  }
  for (uint32_t s = 0; s < config_.shards; ++s) {
    auto sh = std::make_unique<Shard>();
    sh->stride = config_.stride();
    // Huge-page blocks only where one block is small next to the shard's budget (bounded overshoot).
    sh->arena.configure(config_.stride(),
                        capacity_per_shard_ == 0 || capacity_per_shard_ * config_.stride() * 4 >= 8 * RowArena::kHuge);
    sh->init_index(16);
    if (!ssd_path_.empty()) sh->log.create(ssd_path_ + "/shard-" + std::to_string(s) + ".log");
    shards_.push_back(std::move(sh));
  }
}

SparseTable::~SparseTable() {
  for (auto& sh : shards_) sh->log.remove();
  if (!ssd_path_.empty()) {
    track_spill_dir(ssd_path_, false);
    ::rmdir(ssd_path_.c_str());
    ::close(ssd_lock_fd_);
  }
}

uint32_t SparseTable::next_tick() {
  // One tick per call, not per key: LRU needs only batch granularity, and a shared counter bumped per
  // key would be a contention point between threads.
  uint64_t t = __atomic_add_fetch(&clock_, 1, __ATOMIC_RELAXED);
  return static_cast<uint32_t>(std::min<uint64_t>(t, UINT32_MAX));
}

void SparseTable::check_keys(const int64_t* keys, size_t n) const {
  for (size_t i = 0; i < n; ++i) {
    if (keys[i] == kEmptyKey) {
      throw TableError("id at position " + std::to_string(i) + " is INT64_MIN, which is reserved");
    }
  }
}

void SparseTable::group_by_shard(const int64_t* keys, size_t n, std::vector<uint32_t>& order,
                                 std::vector<uint32_t>& offsets) const {
  const uint32_t ns = config_.shards;
  const uint32_t shift = 64 - shard_bits_;
  offsets.assign(ns + 1, 0);
  order.resize(n);
  if (ns == 1) {
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
    offsets[1] = static_cast<uint32_t>(n);
    return;
  }
  // Shard from the top hash bits, slot from the low bits: the two stay independent.
  for (size_t i = 0; i < n; ++i) ++offsets[(key_hash(keys[i]) >> shift) + 1];
  for (uint32_t s = 0; s < ns; ++s) offsets[s + 1] += offsets[s];
  std::vector<uint32_t> pos(offsets.begin(), offsets.end() - 1);
  for (size_t i = 0; i < n; ++i) order[pos[key_hash(keys[i]) >> shift]++] = static_cast<uint32_t>(i);
}

void SparseTable::push(const int64_t* keys, size_t n, const float* grads) {
  if (n == 0) return;
  check_keys(keys, n);
  const size_t d = config_.dim;
  for (size_t i = 0; i < n * d; ++i) {
    if (!std::isfinite(grads[i])) {
      throw TableError("gradient for id " + std::to_string(keys[i / d]) + " (position " + std::to_string(i / d) +
                       ", column " + std::to_string(i % d) + ") is not finite; the batch was not applied");
    }
  }
  std::vector<uint32_t> order, offsets;
  group_by_shard(keys, n, order, offsets);
  const uint32_t ns = config_.shards;
  // Sum the gradients of repeated keys per shard, outside any lock, for the whole batch first: the batch
  // must be checked completely (summed values can overflow to inf) before any row changes.
  std::vector<int64_t> ukeys;
  std::vector<float> ugrads;
  std::vector<size_t> uoff(ns + 1, 0);
  ukeys.reserve(n);
  ugrads.reserve(n * d);
  std::vector<int64_t> dkey;
  std::vector<uint32_t> didx;
  for (uint32_t s = 0; s < ns; ++s) {
    uoff[s] = ukeys.size();
    uint32_t b = offsets[s], e = offsets[s + 1];
    if (b == e) continue;
    uint64_t cap = 16;
    while (cap < uint64_t(e - b) * 2) cap <<= 1;
    dkey.assign(cap, kEmptyKey);
    didx.resize(cap);
    for (uint32_t k = b; k < e; ++k) {
      uint32_t p = order[k];
      int64_t key = keys[p];
      uint64_t i = key_hash(key) & (cap - 1);
      while (dkey[i] != kEmptyKey && dkey[i] != key) i = (i + 1) & (cap - 1);
      const float* g = grads + size_t(p) * d;
      if (dkey[i] == kEmptyKey) {
        dkey[i] = key;
        didx[i] = static_cast<uint32_t>(ukeys.size() - uoff[s]);
        ukeys.push_back(key);
        ugrads.insert(ugrads.end(), g, g + d);
      } else {
        float* acc = ugrads.data() + (uoff[s] + didx[i]) * d;
        for (size_t j = 0; j < d; ++j) acc[j] += g[j];
      }
    }
  }
  uoff[ns] = ukeys.size();
  for (size_t i = 0; i < ugrads.size(); ++i) {
    if (!std::isfinite(ugrads[i])) {
      throw TableError("summed gradient for id " + std::to_string(ukeys[i / d]) +
                       " is not finite (the sum overflows); the batch was not applied");
    }
  }
  if (config_.grad_clip > 0) {
    const float lim = config_.grad_clip;
    for (float& g : ugrads) g = clip_gradient(g, lim);
  }
  // All or nothing: under the locks of every shard the batch touches (ascending, as pull and save take
  // them), each row is updated in place with its previous value kept aside.  An update whose weights or
  // optimizer state would not be finite (finite gradients can still overflow a row: 3e38 pushed twenty
  // times made SGD weights -inf, and Adam's second moment inf for good), or a spilled row that fails its
  // check, puts every row of the batch back and rejects it.  Eviction waits until the batch is known good:
  // it could otherwise move an updated row to SSD before the batch is known good.
  const uint32_t tick = next_tick();
  const size_t st = config_.stride();
  std::vector<std::unique_lock<std::mutex>> locks;
  for (uint32_t s = 0; s < ns; ++s)
    if (uoff[s] != uoff[s + 1]) locks.emplace_back(shards_[s]->mu);
  std::vector<float*> rows(ukeys.size());
  // Not zero-filled (a vector's memset of it was 7% of a push-heavy run): only rows[0, applied) are read.
  std::unique_ptr<float[]> before(new float[ukeys.size() * st]);
  size_t applied = 0;
  auto put_back = [&] {
    for (size_t u = 0; u < applied; ++u) std::memcpy(rows[u], before.get() + u * st, st * 4);
  };
  for (uint32_t s = 0; s < ns; ++s) {
    if (uoff[s] == uoff[s + 1]) continue;
    Shard& sh = *shards_[s];
    ShardOps ops{config_, sh, capacity_per_shard_, tick};
    for (size_t u = uoff[s]; u < uoff[s + 1]; ++u) {
      if (u + 8 < uoff[s + 1]) sh.prefetch(ukeys[u + 8]);
      float* r;
      try {
        r = ops.get(ukeys[u], tick);
      } catch (...) {
        put_back();
        throw;
      }
      rows[u] = r;
      std::memcpy(before.get() + u * st, r, st * 4);
      ++applied;
      apply_update(config_, r, ugrads.data() + u * d);
      if (__builtin_expect(!all_finite(r, st), 0)) {
        size_t j = 0;
        while (std::isfinite(r[j])) ++j;
        put_back();
        throw TableError("updating id " + std::to_string(ukeys[u]) + " would make its " +
                         (j < d ? "weight" : "optimizer state") + " (column " + std::to_string(j < d ? j : j - d) +
                         ") not finite; the batch was not applied (a smaller lr, or grad_clip in the table config)");
      }
    }
  }
  for (uint32_t s = 0; s < ns; ++s) {
    if (uoff[s] == uoff[s + 1]) continue;
    ShardOps ops{config_, *shards_[s], capacity_per_shard_, tick};
    if (ops.over_budget()) ops.evict();
  }
}

void SparseTable::peek(const int64_t* keys, size_t n, float* rows, uint8_t* found) {
  const size_t st = config_.stride();
  for (size_t i = 0; i < n; ++i) {
    Shard& sh = *shards_[shard_of(keys[i])];
    std::lock_guard<std::mutex> lock(sh.mu);
    float* out = rows + i * st;
    found[i] = 0;
    std::fill(out, out + st, 0.0f);
    if (keys[i] == kEmptyKey) continue;
    int64_t e = sh.find(keys[i]);
    if (e >= 0) {
      std::memcpy(out, sh.row(sh.entries[e].slot), st * 4);
      found[i] = 1;
      continue;
    }
    int64_t it = sh.ssd_index.find(keys[i]);
    if (it < 0) continue;
    ShardOps ops{config_, sh, capacity_per_shard_};
    std::memcpy(out, ops.spilled(keys[i], it) + kRecordHeader, st * 4);
    found[i] = 2;
  }
}

TableStats SparseTable::stats() const {
  TableStats t;
  for (auto& shp : shards_) {
    Shard& sh = *shp;
    std::lock_guard<std::mutex> lock(sh.mu);
    t.rows_in_memory += sh.count;
    t.rows_on_ssd += sh.ssd_index.size();
    t.hits += sh.hits;
    t.misses += sh.misses;
    t.ssd_promotions += sh.promotions;
    t.evictions += sh.evictions;
    t.bytes_in_memory += sh.bytes_in_memory();
    t.bytes_ssd_index += sh.ssd_index.capacity() * 16;
    t.bytes_on_ssd += sh.log.records_written * (kRecordHeader + size_t(config_.stride()) * 4);
    t.spill_errors += sh.spill_errors;
    t.compactions += sh.compactions;
    t.rows_lost += sh.lost.size();
  }
  t.memory_budget_bytes = config_.memory_budget_bytes;
  t.capacity_rows = capacity_per_shard_ * config_.shards;
  return t;
}

uint64_t SparseTable::size() const {
  uint64_t n = 0;
  for (auto& shp : shards_) {
    std::lock_guard<std::mutex> lock(shp->mu);
    n += shp->count + shp->ssd_index.size();
  }
  return n;
}

void SparseTable::clear() {
  for (auto& shp : shards_) {
    Shard& sh = *shp;
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.init_index(16);
    sh.count = 0;
    sh.arena.clear();
    sh.free_slots.clear();
    sh.next_slot = 0;
    sh.ssd_index.reset(16);
    sh.log.reset();
    sh.no_spill_below = 0;
    sh.lost.clear();  // the table's contents are replaced: nothing of it is missing any more
  }
}

std::vector<std::pair<int64_t, std::string>> SparseTable::lost() const {
  std::vector<std::pair<int64_t, std::string>> all;
  for (auto& shp : shards_) {
    std::lock_guard<std::mutex> lock(shp->mu);
    all.insert(all.end(), shp->lost.begin(), shp->lost.end());
  }
  return all;
}

uint64_t SparseTable::forget_lost() {
  uint64_t n = 0;
  for (auto& shp : shards_) {
    std::lock_guard<std::mutex> lock(shp->mu);
    n += shp->lost.size();
    shp->lost.clear();
  }
  return n;
}

void SparseTable::assign(const int64_t* keys, size_t n, const float* weights) {
  if (n == 0) return;
  check_keys(keys, n);
  const size_t d = config_.dim;
  for (size_t i = 0; i < n * d; ++i) {
    if (!std::isfinite(weights[i])) {
      throw TableError("row for id " + std::to_string(keys[i / d]) + " (position " + std::to_string(i / d) +
                       ", column " + std::to_string(i % d) + ") is not finite; nothing was assigned");
    }
  }
  const uint32_t tick = next_tick();
  for (size_t i = 0; i < n; ++i) {
    Shard& sh = *shards_[shard_of(keys[i])];
    std::lock_guard<std::mutex> lock(sh.mu);
    ShardOps ops{config_, sh, capacity_per_shard_, tick};
    float* r = ops.get(keys[i], tick);  // existing, promoted, or new with its initial optimizer state
    std::memcpy(r, weights + i * d, d * 4);
    if (ops.over_budget()) ops.evict();
  }
}

struct SparseTable::ShardGroups {
  std::vector<uint32_t> order, offsets;  // group_by_shard's: shard s's keys are order[offsets[s], offsets[s + 1])
  std::vector<uint32_t> touched;         // shards with keys, ascending
  std::vector<std::unique_lock<std::mutex>> locks;
};

void SparseTable::lock_groups(const int64_t* keys, size_t n, ShardGroups& g) {
  if (n > UINT32_MAX) throw TableError("a batch of " + std::to_string(n) + " rows is more than 2^32 - 1; split it");
  group_by_shard(keys, n, g.order, g.offsets);
  for (uint32_t s = 0; s < config_.shards; ++s)
    if (g.offsets[s] != g.offsets[s + 1]) g.touched.push_back(s);
  g.locks.reserve(g.touched.size());
  for (uint32_t s : g.touched) g.locks.emplace_back(shards_[s]->mu);
}

namespace {
// The error of the smallest batch position among the shards' groups (the one the keys taken one at a
// time in the batch's order would have met first), so that which error a call throws does not depend on
// the thread count.
struct GroupFault {
  size_t position = SIZE_MAX;
  std::string what;
  void note(size_t p, const char* why) {
    if (p < position) position = p, what = why;
  }
};

// How far ahead in a shard's group take_rows and put_rows prefetch the index line of a key (as push does).
constexpr uint32_t kAhead = 8;

inline void prefetch_row(const float* r, size_t stride, bool write) {
  for (size_t l = 0; l < stride; l += 16) write ? __builtin_prefetch(r + l, 1) : __builtin_prefetch(r + l, 0);
}

void throw_first(const std::vector<GroupFault>& faults) {
  const GroupFault* first = nullptr;
  for (const GroupFault& f : faults)
    if (f.position != SIZE_MAX && (first == nullptr || f.position < first->position)) first = &f;
  if (first != nullptr) throw TableError(first->what);
}
}  // namespace

// The host tier's side of the GPU table's evictions (and of anything else that hands rows back): the shards'
// groups in parallel under the locks lock_groups took, each in the batch's order.  A TableError of one row
// (a bad spilled record of another id, met by compaction after the row is in) does not stop the group: every
// row is put, and the first error is thrown at the end.
void SparseTable::put_rows(const int64_t* keys, size_t n, const float* rows, const uint32_t* scores) {
  if (n == 0) return;
  check_keys(keys, n);
  const uint32_t tick = next_tick();
  const size_t st = config_.stride();
  ShardGroups g;
  lock_groups(keys, n, g);
  std::vector<GroupFault> faults(g.touched.size());
  pool_->run(g.touched.size(), [&](size_t j) {
    const uint32_t s = g.touched[j];
    Shard& sh = *shards_[s];
    ShardOps ops{config_, sh, capacity_per_shard_, tick};
    const uint32_t e = g.offsets[s + 1];
    for (uint32_t k = g.offsets[s]; k < e; ++k) {
      const uint32_t p = g.order[k];
      if (k + kAhead < e) {  // the index line (a stale one is harmless) and the row to copy in
        const uint32_t q = g.order[k + kAhead];
        sh.prefetch(keys[q]);
        prefetch_row(rows + size_t(q) * st, st, false);
      }
      try {
        ops.put(keys[p], scores ? scores[p] : tick, rows + size_t(p) * st);
      } catch (const TableError& e) {
        faults[j].note(p, e.what());
      }
    }
  });
  throw_first(faults);
}

// The host tier's side of the GPU table's promotions.  All or nothing: first every spilled record the batch
// will read is checked (in parallel, nothing removed), then, if all are good, the rows are taken; both under
// the locks lock_groups took, so nothing can change a checked record in between.
void SparseTable::take_rows(const int64_t* keys, size_t n, float* rows) {
  if (n == 0) return;
  check_keys(keys, n);
  const size_t st = config_.stride();
  ShardGroups g;
  lock_groups(keys, n, g);
  std::vector<GroupFault> faults(g.touched.size());
  bool spilled_rows = false;
  for (uint32_t s : g.touched) spilled_rows |= !shards_[s]->ssd_index.empty();
  if (spilled_rows)
    pool_->run(g.touched.size(), [&](size_t j) {
      const uint32_t s = g.touched[j];
      Shard& sh = *shards_[s];
      if (sh.ssd_index.empty()) return;
      ShardOps ops{config_, sh, capacity_per_shard_};
      for (uint32_t k = g.offsets[s]; k < g.offsets[s + 1]; ++k) {
        const uint32_t p = g.order[k];
        // A key is resident or spilled, never both (put and promotion drop the other copy).
        const int64_t at = sh.ssd_index.find(keys[p]);
        if (at < 0) continue;
        try {
          ops.spilled(keys[p], at);  // a bad record leaves the SSD tier and is listed as lost (as for pull)
        } catch (const TableError& e) {
          faults[j].note(p, e.what());
        }
      }
    });
  throw_first(faults);
  pool_->run(g.touched.size(), [&](size_t j) {
    const uint32_t s = g.touched[j];
    Shard& sh = *shards_[s];
    ShardOps ops{config_, sh, capacity_per_shard_};
    const uint32_t e = g.offsets[s + 1];
    for (uint32_t k = g.offsets[s]; k < e; ++k) {
      const uint32_t p = g.order[k];
      // Two steps ahead, as pull does: the index line of the key 2 * kAhead on; the stored row (found through
      // the line prefetched kAhead keys ago: a read-only probe, and slots never move) and the output row of
      // the key kAhead on.
      if (k + 2 * kAhead < e) sh.prefetch(keys[g.order[k + 2 * kAhead]]);
      if (k + kAhead < e) {
        const uint32_t q = g.order[k + kAhead];
        const int64_t at = sh.find(keys[q]);
        if (at >= 0) prefetch_row(sh.row(sh.entries[at].slot), st, false);
        prefetch_row(rows + size_t(q) * st, st, true);
      }
      ops.take(keys[p], rows + size_t(p) * st);
    }
  });
}

uint32_t SparseTable::shard_of(int64_t key) const {
  return shard_bits_ == 0 ? 0 : static_cast<uint32_t>(key_hash(key) >> (64 - shard_bits_));
}

}  // namespace heterps
