// The table: 2^k shards, each an open-addressing index (key, slot, score) over a block-allocated row
// arena, guarded by one mutex, with its own append-only SSD log for evicted rows.
//
// Why shards with a mutex each: the static executor runs pulls and pushes of different ops on several
// threads in no fixed order.  A batch is first grouped by shard (counting sort) so that each shard lock is
// taken once per call, not once per key: locking per key would cost as much as the lookup itself.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "heterps/hash.h"
#include "heterps/table.h"
#include "io.h"

namespace heterps {

namespace {

constexpr int64_t kEmptyKey = INT64_MIN;  // reserved: rejected as an id

struct Entry {
  int64_t key;
  uint32_t slot;
  uint32_t score;  // LRU: clock of last touch; LFU: touch count (saturating)
};

// Record of the SSD log and of checkpoints: key, score, 4 bytes padding, then stride floats.
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

// key -> record number of the SSD log.  Open addressing (like the row index): std::unordered_map's node
// allocations and modulo hashing showed up as a fifth of the time of a promotion-heavy pull.
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

// Row storage of one shard: blocks that never move (so growth copies nothing).  Block sizes double from 64
// rows up to 256 KiB, then are 2 MiB, 2 MiB-aligned and advised as transparent huge pages: a lookup is a
// random access, and with 4 KiB pages most of them also miss the TLB (numpy's large arrays get huge pages
// the same way).  Slots are handed out in order, so untouched pages of the last block cost nothing
// except under huge pages, which are used only where a block is small next to the shard's budget.
class RowArena {
 public:
  static constexpr uint32_t kBaseShift = 6;  // first block: 64 rows
  static constexpr size_t kHuge = size_t(2) << 20;

  RowArena() = default;
  RowArena(const RowArena&) = delete;
  RowArena& operator=(const RowArena&) = delete;
  ~RowArena() { clear(); }

  void configure(uint32_t stride, bool allow_huge) {
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

  void ensure(uint32_t slot) {
    uint64_t s = slot;
    size_t b = s < geo_slots_ ? 63 - __builtin_clzll((s >> kBaseShift) + 1)
                              : geo_blocks_ + ((s - geo_slots_) >> big_shift_);
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

  uint64_t bytes() const { return bytes_; }

  void clear() {
    for (float* p : ptrs_) std::free(p);
    ptrs_.clear();
    bytes_ = 0;
  }

 private:
  std::vector<float*> ptrs_;
  uint32_t stride_ = 0, geo_blocks_ = 26, big_shift_ = 0;
  uint64_t geo_slots_ = UINT64_MAX, bytes_ = 0;
};

}  // namespace

struct SparseTable::Shard {
  std::mutex mu;
  HugeArray<Entry> entries;
  uint64_t mask = 0;
  uint64_t count = 0;  // resident rows
  RowArena arena;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;

  // SSD tier: append-only log; index key -> (record number, score kept in the record).
  int fd = -1;
  std::string file;
  KeyIndex ssd_index;
  uint64_t records_written = 0;  // records in the file, live or dead
  uint64_t no_spill_below = 0;   // after a failed spill, do not retry until count exceeds this
  bool spill_warned = false;

  uint64_t hits = 0, misses = 0, promotions = 0, evictions = 0, spill_errors = 0, compactions = 0;

  uint32_t stride = 0;

  // Reads of the log go through a read-only shared mapping (no syscall per promoted row); the mapping
  // reserves more than the file holds and is only ever read below records_written, which is inside the file.
  char* map = nullptr;
  size_t map_len = 0;
  std::vector<char> scratch;

  void unmap() {
    if (map != nullptr) ::munmap(map, map_len);
    map = nullptr;
    map_len = 0;
  }

  bool remap(uint64_t need) {
    unmap();
    size_t len = static_cast<size_t>(std::max<uint64_t>(need * 2, uint64_t(64) << 20));
    len = (len + 4095) & ~size_t(4095);
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    map = static_cast<char*>(p);
    map_len = len;
    return true;
  }

  // Record `recno` of the log: a pointer valid until the next remap or scratch use.
  const char* record(uint64_t recno, size_t rb) {
    uint64_t off = recno * rb;
    if (off + rb <= map_len || remap(off + rb)) return map + off;
    scratch.resize(rb);  // mmap refused (address space limits): fall back to pread
    std::string err;
    if (!io::pread_full(fd, scratch.data(), rb, off, &err))
      throw TableError("reading SSD tier '" + file + "' failed: " + err);
    return scratch.data();
  }

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

SparseTable::SparseTable(const TableConfig& config) : config_(config) {
  config_.validate();
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
    ssd_path_ = io::make_private_dir(config_.ssd_dir);
  }
  for (uint32_t s = 0; s < config_.shards; ++s) {
    auto sh = std::make_unique<Shard>();
    sh->stride = config_.stride();
    // Huge-page blocks only where one block is small next to the shard's budget (bounded overshoot).
    sh->arena.configure(config_.stride(), capacity_per_shard_ == 0 ||
                                              capacity_per_shard_ * config_.stride() * 4 >= 8 * RowArena::kHuge);
    sh->init_index(16);
    if (!ssd_path_.empty()) {
      sh->file = ssd_path_ + "/shard-" + std::to_string(s) + ".log";
      sh->fd = ::open(sh->file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (sh->fd < 0) throw TableError("cannot create SSD tier file '" + sh->file + "': " + std::strerror(errno));
    }
    shards_.push_back(std::move(sh));
  }
}

SparseTable::~SparseTable() {
  for (auto& sh : shards_) {
    sh->unmap();
    if (sh->fd >= 0) {
      ::close(sh->fd);
      ::unlink(sh->file.c_str());
    }
  }
  if (!ssd_path_.empty()) ::rmdir(ssd_path_.c_str());
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

namespace {

// Deterministic per-key init: a counter-based hash of (seed, key, column), so every process (and the
// Python model in the tests) computes the same row without coordination.
void init_row(const TableConfig& c, int64_t key, float* row) {
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

void apply_update(const TableConfig& c, float* row, const float* g) {
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

}  // namespace

// ---- per-shard operations (caller holds sh.mu) ------------------------------------------------------

namespace {

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
  SparseTable::Shard& sh;
  uint64_t capacity;  // 0 = unlimited
  uint32_t tick = 0;  // the current call's clock (LFU: rows touched by it are evicted last); 0 = none

  size_t record_bytes() const { return kRecordHeader + size_t(c.stride()) * 4; }

  // Returns the row of key, creating or promoting it; touches its score.
  float* get(int64_t key, uint32_t tick) { return get_h(key, key_hash(key), tick); }

  __attribute__((noinline)) float* get_h(int64_t key, uint64_t h, uint32_t tick) {
    int64_t i = sh.find_h(key, h);
    if (i >= 0) {
      ++sh.hits;
      touch(sh.entries[i], tick);
      return sh.row(sh.entries[i].slot);
    }
    ++sh.misses;
    uint32_t slot = sh.alloc_slot();
    float* r = sh.row(slot);
    uint32_t score = 0;
    int64_t it = sh.ssd_index.empty() ? -1 : sh.ssd_index.find(key);
    if (it >= 0) {
      const char* rec;
      try {
        rec = sh.record(sh.ssd_index.value_at(it), record_bytes());
      } catch (...) {
        sh.free_slots.push_back(slot);
        throw;
      }
      int64_t stored;
      std::memcpy(&stored, rec, 8);
      if (stored != key) {
        sh.free_slots.push_back(slot);
        throw TableError("SSD tier file '" + sh.file + "' is corrupted (record for " + std::to_string(key) +
                         " holds " + std::to_string(stored) + ")");
      }
      std::memcpy(&score, rec + 8, 4);
      std::memcpy(r, rec + kRecordHeader, size_t(c.stride()) * 4);
      sh.ssd_index.erase_at(static_cast<uint64_t>(it));
      ++sh.promotions;
    } else {
      init_row(c, key, r);
    }
    Entry e{key, slot, score};
    touch(e, tick);
    sh.insert_entry(key, slot, e.score);
    return r;
  }

  void touch(Entry& e, uint32_t tick) const {
    if (c.eviction == EvictPolicy::kLRU) {
      if (e.score != tick) e.score = tick;  // hot rows: skip dirtying a line that already holds the tick
    } else {
      e.score = lfu_touch(e.score, tick);
    }
  }

  // Insert or overwrite a full row (weights and optimizer state).
  void put(int64_t key, uint32_t score, const float* src) {
    int64_t i = sh.find(key);
    uint32_t slot;
    if (i >= 0) {
      slot = sh.entries[i].slot;
      sh.entries[i].score = score;
    } else {
      int64_t at = sh.ssd_index.empty() ? -1 : sh.ssd_index.find(key);
      if (at >= 0) sh.ssd_index.erase_at(static_cast<uint64_t>(at));  // the new row supersedes the spilled one
      slot = sh.alloc_slot();
      sh.insert_entry(key, slot, score);
    }
    std::memcpy(sh.row(slot), src, size_t(c.stride()) * 4);
    if (over_budget()) evict();
  }

  // Remove key's full row into dst (from memory or SSD), or write its initial row if absent.
  void take(int64_t key, float* dst) {
    int64_t i = sh.find(key);
    if (i >= 0) {
      std::memcpy(dst, sh.row(sh.entries[i].slot), size_t(c.stride()) * 4);
      sh.free_slots.push_back(sh.entries[i].slot);
      sh.erase_at(static_cast<uint64_t>(i));
      return;
    }
    int64_t at = sh.ssd_index.empty() ? -1 : sh.ssd_index.find(key);
    if (at >= 0) {
      std::memcpy(dst, sh.record(sh.ssd_index.value_at(at), record_bytes()) + kRecordHeader, size_t(c.stride()) * 4);
      sh.ssd_index.erase_at(static_cast<uint64_t>(at));
      ++sh.promotions;
      return;
    }
    init_row(c, key, dst);
  }

  bool over_budget() const { return capacity != 0 && sh.count > capacity && sh.count > sh.no_spill_below; }

  // Moves the coldest rows (lowest score) to the SSD log until the shard is 1/8 below its capacity, in
  // one write.  Evicting a batch at once amortises the O(shard) selection to O(8) per evicted row.
  void evict() {
    uint64_t target = capacity - std::max<uint64_t>(1, capacity / 8);
    if (sh.count <= target) return;
    uint64_t n = sh.count - target;
    // Candidates (score << 32 | entry index), gathered without a branch per entry (whether an entry is
    // empty is unpredictable; the scan was a third of the eviction's time with a push_back per entry).
    const uint64_t ne = sh.entries.size();
    const Entry* ent = sh.entries.data();
    std::vector<uint64_t> cand(ne + 1), spared;
    size_t nc = 0;
    if (c.eviction == EvictPolicy::kLRU) {
      for (uint64_t i = 0; i < ne; ++i) {
        cand[nc] = uint64_t(ent[i].score) << 32 | i;
        nc += ent[i].key != kEmptyKey;
      }
    } else {
      // LFU: rows used by this call go to `spared`, taken only as a last resort.
      spared.resize(ne + 1);
      size_t nsp = 0;
      const uint32_t t16 = tick & 0xFFFFu;
      for (uint64_t i = 0; i < ne; ++i) {
        const uint32_t sc = ent[i].score;
        const uint64_t v = uint64_t(sc >> 16) << 32 | i;
        const bool used = ent[i].key != kEmptyKey;
        const bool spare = tick != 0 && (sc & 0xFFFFu) == t16;
        cand[nc] = v;
        spared[nsp] = v;
        nc += used & !spare;
        nsp += used & spare;
      }
      spared.resize(nsp);
    }
    cand.resize(nc);
    if (cand.size() < n) cand.insert(cand.end(), spared.begin(), spared.end());
    std::nth_element(cand.begin(), cand.begin() + (n - 1), cand.end());
    cand.resize(n);
    std::vector<int64_t> keys(n);
    const size_t rb = record_bytes();
    std::vector<char> buf(n * rb, 0);
    for (uint64_t k = 0; k < n; ++k) {
      const Entry& e = sh.entries[cand[k] & 0xffffffffu];
      keys[k] = e.key;
      char* rec = buf.data() + k * rb;
      std::memcpy(rec, &e.key, 8);
      std::memcpy(rec + 8, &e.score, 4);
      std::memcpy(rec + kRecordHeader, sh.row(e.slot), size_t(c.stride()) * 4);
    }
    std::string err;
    if (!io::pwrite_full(sh.fd, buf.data(), buf.size(), sh.records_written * rb, &err)) {
      // Full disk: keep every row resident (over budget, but nothing is lost) and back off so that the
      // next attempt comes only after the shard has grown by another 1/8 of its capacity.
      ++sh.spill_errors;
      sh.no_spill_below = sh.count + std::max<uint64_t>(1, capacity / 8);
      if (!sh.spill_warned) {  // once per shard: every op path (Python, Paddle op, C++) sees it on stderr
        std::fprintf(stderr, "heterps sparse table: spilling rows to '%s' failed (%s); they stay in memory "
                     "over the budget (stats: spill_errors)\n", sh.file.c_str(), err.c_str());
        sh.spill_warned = true;
      }
      if (::ftruncate(sh.fd, off_t(sh.records_written * rb)) != 0) { /* best effort; index untouched */ }
      return;
    }
    sh.no_spill_below = 0;
    for (uint64_t k = 0; k < n; ++k) {
      int64_t i = sh.find(keys[k]);
      sh.free_slots.push_back(sh.entries[i].slot);
      sh.erase_at(static_cast<uint64_t>(i));
      sh.ssd_index.assign(keys[k], sh.records_written + k);
    }
    sh.records_written += n;
    sh.evictions += n;
    maybe_compact();
  }

  // The log only appends; once dead records (promoted or overwritten) outnumber live ones, rewrite the
  // live ones into a fresh file and rename it over the old one.  Amortised O(1) per eviction.
  void maybe_compact() {
    uint64_t live = sh.ssd_index.size();
    uint64_t dead = sh.records_written - live;
    if (dead < 4096 || dead <= live) return;
    const size_t rb = record_bytes();
    std::string tmp = sh.file + ".compact";
    int nfd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (nfd < 0) return;  // keep the old log; compaction is an optimisation
    std::vector<std::pair<uint64_t, int64_t>> order;
    order.reserve(live);
    for (uint64_t i = 0; i < sh.ssd_index.capacity(); ++i)
      if (sh.ssd_index.key_at(i) != kEmptyKey) order.emplace_back(sh.ssd_index.value_at(int64_t(i)), int64_t(i));
    std::sort(order.begin(), order.end());  // read the old file sequentially
    std::vector<char> buf;
    buf.reserve(std::min<size_t>(live, 4096) * rb);
    uint64_t written = 0;
    std::string err;
    bool ok = true;
    for (size_t k = 0; k < order.size() && ok; ++k) {
      const char* rec = sh.record(order[k].first, rb);
      buf.insert(buf.end(), rec, rec + rb);
      if (ok && (buf.size() >= 4096 * rb || k + 1 == order.size())) {
        ok = io::pwrite_full(nfd, buf.data(), buf.size(), written * rb, &err);
        written += buf.size() / rb;
        buf.clear();
      }
    }
    if (!ok || ::rename(tmp.c_str(), sh.file.c_str()) != 0) {
      ::close(nfd);
      ::unlink(tmp.c_str());
      ++sh.spill_errors;
      return;
    }
    sh.unmap();
    ::close(sh.fd);
    sh.fd = nfd;
    for (size_t k = 0; k < order.size(); ++k) sh.ssd_index.set_value_at(uint64_t(order[k].second), k);
    sh.records_written = order.size();
    ++sh.compactions;
  }
};

}  // namespace

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
      case 16: for (size_t i = 0; i < m; ++i) if (rows[i]) std::memcpy(o + i * 16, rows[i], 64); break;
      case 32: for (size_t i = 0; i < m; ++i) if (rows[i]) std::memcpy(o + i * 32, rows[i], 128); break;
      case 64: for (size_t i = 0; i < m; ++i) if (rows[i]) std::memcpy(o + i * 64, rows[i], 256); break;
      default:
        for (size_t i = 0; i < m; ++i)
          if (rows[i]) std::memcpy(o + i * d, rows[i], d * sizeof(float));
    }
    locks.clear();
  }
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
  const uint32_t tick = next_tick();
  for (uint32_t s = 0; s < ns; ++s) {
    if (uoff[s] == uoff[s + 1]) continue;
    Shard& sh = *shards_[s];
    std::lock_guard<std::mutex> lock(sh.mu);
    ShardOps ops{config_, sh, capacity_per_shard_, tick};
    for (size_t u = uoff[s]; u < uoff[s + 1]; ++u) {
      if (u + 8 < uoff[s + 1]) sh.prefetch(ukeys[u + 8]);
      float* r = ops.get(ukeys[u], tick);
      apply_update(config_, r, ugrads.data() + u * d);
      if (ops.over_budget()) ops.evict();
    }
  }
}

void SparseTable::peek(const int64_t* keys, size_t n, float* rows, uint8_t* found) {
  const size_t st = config_.stride();
  const size_t rb = kRecordHeader + st * 4;
  std::vector<char> rec(rb);
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
    std::memcpy(out, sh.record(sh.ssd_index.value_at(it), rb) + kRecordHeader, st * 4);
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
    t.bytes_on_ssd += sh.records_written * (kRecordHeader + size_t(config_.stride()) * 4);
    t.spill_errors += sh.spill_errors;
    t.compactions += sh.compactions;
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
    sh.records_written = 0;
    sh.no_spill_below = 0;
    if (sh.fd >= 0 && ::ftruncate(sh.fd, 0) != 0) { /* the log is rewritten from offset 0 anyway */ }
  }
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

void SparseTable::put_rows(const int64_t* keys, size_t n, const float* rows, const uint32_t* scores) {
  check_keys(keys, n);
  const uint32_t tick = next_tick();
  for (size_t i = 0; i < n; ++i) {
    Shard& sh = *shards_[shard_of(keys[i])];
    std::lock_guard<std::mutex> lock(sh.mu);
    ShardOps ops{config_, sh, capacity_per_shard_, tick};
    ops.put(keys[i], scores ? scores[i] : tick, rows + i * config_.stride());
  }
}

void SparseTable::take_rows(const int64_t* keys, size_t n, float* rows) {
  check_keys(keys, n);
  for (size_t i = 0; i < n; ++i) {
    Shard& sh = *shards_[shard_of(keys[i])];
    std::lock_guard<std::mutex> lock(sh.mu);
    ShardOps ops{config_, sh, capacity_per_shard_};
    ops.take(keys[i], rows + i * config_.stride());
  }
}

uint32_t SparseTable::shard_of(int64_t key) const {
  return shard_bits_ == 0 ? 0 : static_cast<uint32_t>(key_hash(key) >> (64 - shard_bits_));
}

// ---- checkpoints --------------------------------------------------------------------------------------
//
// File layout (little-endian): 64-byte header, row_count records of (key, score, pad, stride floats),
// 16-byte footer ("HPSTEND1", CRC-32 of every byte before the footer, 4 zero bytes).  The size is
// checked against row_count before anything else, so truncation is reported as such.

namespace {

constexpr char kMagic[8] = {'H', 'E', 'T', 'E', 'R', 'P', 'S', 'T'};
constexpr char kFooterMagic[8] = {'H', 'P', 'S', 'T', 'E', 'N', 'D', '1'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kFooterBytes = 16;

struct Header {
  char magic[8];
  uint32_t version, dim, stride, optimizer;
  uint64_t seed, row_count;
  uint32_t record_bytes, eviction;
  char reserved[16];
};
static_assert(sizeof(Header) == kHeaderBytes, "header layout");

class CheckpointWriter {
 public:
  CheckpointWriter(int fd, std::string name) : fd_(fd), name_(std::move(name)) { buf_.reserve(1 << 20); }
  void write(const void* p, size_t n) {
    crc_ = crc32_update(crc_, p, n);
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
    if (buf_.size() >= (1 << 20)) flush();
  }
  void write_raw(const void* p, size_t n) {  // footer: not part of the checksum
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  void flush() {
    std::string err;
    if (!buf_.empty() && !io::pwrite_full(fd_, buf_.data(), buf_.size(), off_, &err))
      throw TableError("writing '" + name_ + "' failed: " + err);
    off_ += buf_.size();
    buf_.clear();
  }
  uint32_t crc() const { return crc_; }

 private:
  int fd_;
  std::string name_;
  std::vector<char> buf_;
  uint64_t off_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace

void SparseTable::save(const std::string& path) {
  // Hold every shard lock for a consistent snapshot (pushes wait; a checkpoint is a rare event).
  std::vector<std::unique_lock<std::mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  uint64_t rows = 0;
  for (auto& sh : shards_) rows += sh->count + sh->ssd_index.size();
  const size_t st = config_.stride();
  const size_t rb = kRecordHeader + st * 4;

  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw TableError("saving table: cannot create '" + tmp + "': " + std::strerror(errno));
  try {
    CheckpointWriter w(fd, tmp);
    Header h{};
    std::memcpy(h.magic, kMagic, 8);
    h.version = kFormatVersion;
    h.dim = config_.dim;
    h.stride = config_.stride();
    h.optimizer = static_cast<uint32_t>(config_.optimizer);
    h.seed = config_.seed;
    h.row_count = rows;
    h.record_bytes = static_cast<uint32_t>(rb);
    h.eviction = static_cast<uint32_t>(config_.eviction);
    w.write(&h, sizeof h);
    std::vector<char> rec(rb, 0);
    for (auto& shp : shards_) {
      Shard& sh = *shp;
      for (const Entry& e : sh.entries) {
        if (e.key == kEmptyKey) continue;
        std::memset(rec.data(), 0, kRecordHeader);
        std::memcpy(rec.data(), &e.key, 8);
        std::memcpy(rec.data() + 8, &e.score, 4);
        std::memcpy(rec.data() + kRecordHeader, sh.row(e.slot), st * 4);
        w.write(rec.data(), rb);
      }
      for (uint64_t i = 0; i < sh.ssd_index.capacity(); ++i)
        if (sh.ssd_index.key_at(i) != kEmptyKey) w.write(sh.record(sh.ssd_index.value_at(int64_t(i)), rb), rb);
    }
    uint32_t crc = w.crc();
    char footer[kFooterBytes] = {0};
    std::memcpy(footer, kFooterMagic, 8);
    std::memcpy(footer + 8, &crc, 4);
    w.write_raw(footer, sizeof footer);
    w.flush();
    if (::fsync(fd) != 0) throw TableError("saving table: fsync of '" + tmp + "' failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());  // the previous checkpoint at `path`, if any, is untouched
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw TableError("saving table: closing '" + tmp + "' failed: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw TableError("saving table: renaming '" + tmp + "' to '" + path + "' failed: " + std::strerror(e));
  }
  io::fsync_parent_dir(path);
}

void SparseTable::load(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw TableError("loading table: cannot open '" + path + "': " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat stt;
  if (::fstat(fd, &stt) != 0) throw TableError("loading table: cannot stat '" + path + "'");
  const uint64_t size = static_cast<uint64_t>(stt.st_size);
  std::string err;
  Header h{};
  if (size < kHeaderBytes + kFooterBytes || !io::pread_full(fd, &h, sizeof h, 0, &err))
    throw TableError("loading table: '" + path + "' is truncated (" + std::to_string(size) + " bytes)");
  if (std::memcmp(h.magic, kMagic, 8) != 0)
    throw TableError("loading table: '" + path + "' is not a heterps sparse table checkpoint");
  if (h.version != kFormatVersion)
    throw TableError("loading table: '" + path + "' has format version " + std::to_string(h.version) +
                     ", this build reads version " + std::to_string(kFormatVersion));
  const size_t st = config_.stride();
  const size_t rb = kRecordHeader + st * 4;
  if (h.dim != config_.dim || h.stride != st || h.optimizer != static_cast<uint32_t>(config_.optimizer) ||
      h.record_bytes != rb) {
    throw TableError("loading table: '" + path + "' holds dim " + std::to_string(h.dim) + " optimizer #" +
                     std::to_string(h.optimizer) + ", the table has dim " + std::to_string(config_.dim) +
                     " optimizer #" + std::to_string(static_cast<uint32_t>(config_.optimizer)));
  }
  const uint64_t expected = kHeaderBytes + h.row_count * rb + kFooterBytes;
  if (h.row_count > (size / rb) + 1 || size != expected) {
    throw TableError("loading table: '" + path + "' is truncated or corrupted (size " + std::to_string(size) +
                     " bytes, header promises " + std::to_string(expected) + ")");
  }
  // Pass 1: verify the checksum before touching the table, so a bad file never replaces good rows.
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  for (uint64_t off = 0; off < size - kFooterBytes;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - kFooterBytes - off));
    if (!io::pread_full(fd, buf.data(), n, off, &err)) throw TableError("loading table: reading '" + path + "': " + err);
    crc = crc32_update(crc, buf.data(), n);
    off += n;
  }
  char footer[kFooterBytes];
  if (!io::pread_full(fd, footer, kFooterBytes, size - kFooterBytes, &err))
    throw TableError("loading table: reading '" + path + "': " + err);
  uint32_t stored_crc;
  std::memcpy(&stored_crc, footer + 8, 4);
  if (std::memcmp(footer, kFooterMagic, 8) != 0 || stored_crc != crc)
    throw TableError("loading table: '" + path + "' is corrupted (checksum mismatch)");
  // Pass 2: replace the contents.
  clear();
  std::vector<char> rec(rb);
  for (uint64_t r = 0; r < h.row_count; ++r) {
    if (!io::pread_full(fd, rec.data(), rb, kHeaderBytes + r * rb, &err))
      throw TableError("loading table: reading '" + path + "': " + err);
    int64_t key;
    uint32_t score;
    std::memcpy(&key, rec.data(), 8);
    std::memcpy(&score, rec.data() + 8, 4);
    if (key == kEmptyKey) throw TableError("loading table: '" + path + "' holds the reserved id INT64_MIN");
    Shard& sh = *shards_[shard_of(key)];
    std::lock_guard<std::mutex> lock(sh.mu);
    ShardOps ops{config_, sh, capacity_per_shard_};
    ops.put(key, score, reinterpret_cast<const float*>(rec.data() + kRecordHeader));
  }
  // The LRU clock continues past the loaded scores so new touches rank as newer.
  uint32_t max_score = 0;
  for (auto& sh : shards_) {
    std::lock_guard<std::mutex> lock(sh->mu);
    for (const Entry& e : sh->entries)
      if (e.key != kEmptyKey) max_score = std::max(max_score, e.score);
  }
  uint64_t c = __atomic_load_n(&clock_, __ATOMIC_RELAXED);
  if (c < max_score) __atomic_store_n(&clock_, uint64_t(max_score), __ATOMIC_RELAXED);
}

}  // namespace heterps
