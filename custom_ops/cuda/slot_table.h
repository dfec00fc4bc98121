// The CUDA table's open-addressing layout as code that compiles for the host and the device: gpu_table.cu's
// kernels and the host model (table_model.h, tested against the CPU core on any machine) call these same
// functions, so what the model checks is what the kernels do.  No CUDA headers: under nvcc the functions are
// __host__ __device__, under a host compiler plain inline functions.
//
// Layout: 2^k slots, linear probing from a key's home (key_hash(key) & mask), a key's metadata (key, score,
// a push's occurrence count, LFU's "seen" tick) and its row at its slot.  No tombstones: every slot is a
// key or empty, and every key sits after an unbroken run of occupied slots from its home, so a lookup stops
// at the first empty slot.
//
// Eviction in place (deletion by backward shift, Knuth's Algorithm R generalised to many holes at once):
// the victims' rows are copied out and their slots marked (count = kVictim); the first victim of each cluster
// (a maximal run of occupied slots) leads that cluster's removal; the leader walks the cluster once, turning
// victims into holes and moving each later entry back into the earliest hole its probe sequence passes
// (the earliest hole at or after its home), so the cluster ends as if the victims had never been inserted.
// The work is the clusters that hold victims, not the table: at the table's load (at most half its slots) a
// cluster is a few slots long.
#pragma once

#include <cstdint>

#include "heterps/hash.h"

namespace heterps_slots {

constexpr int64_t kEmpty = INT64_MIN;
// The count word of a slot whose row an eviction has copied out and whose entry is being removed.  A push's
// counts never reach it (occurrences < 2^31 in the high half).
constexpr unsigned long long kVictim = ~0ull;
// Holes a leader tracks at once; victims beyond them in one run of its cluster wait for the next pass.
constexpr int kMaxHoles = 16;

struct Slots {  // a table's metadata arrays (its rows are moved by the caller)
  int64_t* keys;
  uint32_t* scores;
  unsigned long long* count;
  uint32_t* seen;
  uint64_t mask;
};

HETERPS_HOST_DEVICE inline uint64_t home_of(int64_t key, uint64_t mask) {
  return heterps::key_hash(key) & mask;
}

// The slot holding key, or -1.
HETERPS_HOST_DEVICE inline int64_t probe_find(const int64_t* keys, uint64_t mask, int64_t key) {
  uint64_t h = home_of(key, mask);
  while (true) {
    const int64_t k = keys[h];
    if (k == key) return static_cast<int64_t>(h);
    if (k == kEmpty) return -1;
    h = (h + 1) & mask;
  }
}

// The slot a key absent from the table takes (a batch's insert: distinct keys, so another thread's claim of
// the same key, which the device allows for, does not happen there): the first empty one from its home.
HETERPS_HOST_DEVICE inline uint64_t claim_slot(int64_t* keys, uint64_t mask, int64_t key) {
  uint64_t h = home_of(key, mask);
  while (true) {
#if defined(__CUDA_ARCH__)
    const unsigned long long prev =
        atomicCAS(reinterpret_cast<unsigned long long*>(keys + h), static_cast<unsigned long long>(kEmpty),
                  static_cast<unsigned long long>(key));
    if (prev == static_cast<unsigned long long>(kEmpty) || prev == static_cast<unsigned long long>(key)) return h;
#else
    if (keys[h] == kEmpty || keys[h] == key) {
      keys[h] = key;
      return h;
    }
#endif
    h = (h + 1) & mask;
  }
}

// The eviction's choice among live rows by score: every row scoring below `nth` (the want-th lowest score), and of
// the rows scoring exactly `nth` (a tie: LRU's scores are batch ticks, so a tie is a whole batch's rows) those whose
// key's high hash bits fall under tie_cut (of 2^32; the select sets it so that about the wanted number do).  The
// choice among a tie must not follow the slots: taking a tie's first rows in slot order (or in the order a kernel's
// threads arrive, which follows the slots) empties the low slots and leaves the survivors crowded in the high ones,
// step after step, until clusters of 10^5 slots form (custom_ops/bench/tier_sim.cc: the Zipf 0.8 cliff).  The high
// bits are independent of the home (its low bits), so a hashed choice thins every part of the table alike.
HETERPS_HOST_DEVICE inline bool evictable(int64_t key, uint32_t score, uint32_t nth, uint64_t tie_cut) {
  return score < nth || (score == nth && (heterps::key_hash(key) >> 32) < tie_cut);
}

// tie_cut for taking at least `need` of `ties` rows that score exactly the threshold (0 < need <= ties).  The
// count a cut takes is binomial around its mean, so the cut aims 4 standard deviations and 64 rows above need: an
// eviction takes a few more rows than it needs (0.6% at need = 500k) rather than leave the table over its budget.
inline uint64_t tie_cut_for(uint64_t need, uint64_t ties) {
  uint64_t root = 1;
  while (root * root < need) ++root;
  const uint64_t aim = need + 4 * root + 64;
  if (ties == 0 || aim >= ties) return 1ull << 32;
  return ((aim << 32) + ties - 1) / ties;
}

// Whether the victim at slot v is the first victim of its cluster; if so *start is the cluster's first slot.
// Read-only (the marks of every victim are set before any leader is chosen).
HETERPS_HOST_DEVICE inline bool leads_cluster(const Slots& s, uint64_t v, uint64_t* start) {
  uint64_t j = v;
  while (true) {
    const uint64_t p = (j - 1) & s.mask;
    if (s.keys[p] == kEmpty) {
      *start = j;
      return true;
    }
    if (s.count[p] == kVictim) return false;
    j = p;
  }
}

struct Move {
  uint64_t from, to;
};

// A leader's removal of its cluster's victims, one live entry moved at a time: next() moves the metadata of
// the next entry that has to move and returns its slots, and the caller then copies its row (on the device
// the tile's lanes do, each lane its own units of every row, so a row written into a slot that a later move
// reads from is read by the lane that wrote it).  A victim's row is not copied: it is already out.
class ClusterShift {
 public:
  HETERPS_HOST_DEVICE ClusterShift(const Slots& s, uint64_t start) : s_(s), start_(start) {}

  HETERPS_HOST_DEVICE bool next(Move* m) {
    while (true) {
      const uint64_t pos = (start_ + off_) & s_.mask;
      const int64_t key = s_.keys[pos];
      if ((len_ != kUnknown && off_ == len_) || (len_ == kUnknown && key == kEmpty)) {
        // A pass ends at the cluster's end (the first pass finds it: behind the cursor every hole is already
        // empty, ahead of it nothing has moved yet).
        if (len_ == kUnknown) len_ = off_;
        ++passes_;
        if (deferred_ == 0) return false;
        off_ = 0;
        holes_ = 0;
        deferred_ = 0;
        continue;
      }
      if (key == kEmpty) {  // a later pass: a hole left by the earlier one splits the cluster
        holes_ = 0;
        ++off_;
        continue;
      }
      const bool victim = s_.count[pos] == kVictim;
      if (victim && holes_ < kMaxHoles) {
        s_.keys[pos] = kEmpty;
        s_.count[pos] = 0;
        hole_[holes_++] = off_++;
        ++removed_;
        continue;
      }
      if (victim) ++deferred_;  // too many holes: this victim moves like an entry and waits for the next pass
      const uint64_t home = (home_of(key, s_.mask) - start_) & s_.mask;  // its home's offset, <= off_
      int h = 0;
      while (h < holes_ && hole_[h] < home) ++h;
      if (h == holes_) {  // no hole on its probe sequence: it stays
        ++off_;
        continue;
      }
      const uint64_t to = (start_ + hole_[h]) & s_.mask;
      for (int k = h + 1; k < holes_; ++k) hole_[k - 1] = hole_[k];
      hole_[holes_ - 1] = off_;  // the slot it leaves, behind every other hole
      s_.keys[to] = key;
      s_.scores[to] = s_.scores[pos];
      s_.count[to] = s_.count[pos];
      s_.seen[to] = s_.seen[pos];
      s_.keys[pos] = kEmpty;
      s_.count[pos] = 0;
      ++off_;
      if (victim) continue;
      ++moved_;
      m->from = pos;
      m->to = to;
      return true;
    }
  }

  HETERPS_HOST_DEVICE uint32_t moved() const { return moved_; }      // live entries moved
  HETERPS_HOST_DEVICE uint32_t removed() const { return removed_; }  // victims removed
  HETERPS_HOST_DEVICE uint32_t passes() const { return passes_; }
  HETERPS_HOST_DEVICE uint64_t length() const { return len_; }  // the cluster's slots (after the first pass)

 private:
  static constexpr uint64_t kUnknown = ~0ull;
  Slots s_;
  uint64_t start_;
  uint64_t off_ = 0, len_ = kUnknown;
  uint64_t hole_[kMaxHoles];  // offsets from start_, ascending
  int holes_ = 0;
  uint32_t deferred_ = 0, moved_ = 0, removed_ = 0, passes_ = 0;
};

}  // namespace heterps_slots
