// A host model of the CUDA table (gpu_table.cu): the same slots, probing, scores, tier policy and eviction, in
// plain C++ on one thread, so that the device table's design can be checked and measured on any machine.
// The layout code is slot_table.h, which the kernels call too; this file mirrors the kernels' control flow
// (find and touch, the misses made distinct, the eviction threshold, victims, insert, the fused push) with
// the host tier a CPU core table of the same config (heterps::SparseTable::take_rows / put_rows), as the
// device table's is.  Where the device runs many threads in an order it does not fix (which of a tie's
// victims are taken, the order of a repeated id's gradients), the model takes slot order and batch order.
//
// Without a host tier (host == nullptr) the model keeps no rows: the tier policy and the layout alone, for
// simulating the benchmark's id streams at full size (custom_ops/bench/tier_sim.cc).
#pragma once

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "heterps/table.h"
#include "heterps/update_rules.h"
#include "slot_table.h"

namespace heterps_model {

// The calling thread's CPU seconds: what the model's steps cost, without the time a loaded machine gives to others.
inline double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

using heterps_slots::kEmpty;
using heterps_slots::kVictim;

enum class Evict { kInPlace, kRehash };  // kRehash: the table before in-place eviction (a full rebuild)
// How a tie at the threshold is cut: kHashed, by the keys' high hash bits (slot_table.h's evictable, what the
// kernels do); kSlotOrder, the tie's rows in slot order up to the victims' cap (the table before: the cliff).
enum class Ties { kHashed, kSlotOrder };

// Which live rows an eviction takes (besides the batch's own, never taken, and at most the victims' cap).
struct Choice {
  uint32_t nth = 0;
  uint64_t cut = 0;
  Ties ties = Ties::kHashed;
  bool none = true;  // growth: no victim
  bool victim(int64_t key, uint32_t score) const {
    if (none) return false;
    if (ties == Ties::kSlotOrder) return score <= nth;
    return heterps_slots::evictable(key, score, nth, cut);
  }
};

// What one eviction cost, for the benchmark and the simulation.
struct EvictionCost {
  uint64_t victims = 0, moved = 0, leaders = 0, passes = 0, cluster_slots = 0, max_cluster = 0;
  uint64_t slots_scanned = 0;       // the mark's scan of keys and scores (the threshold's histograms read as much)
  uint64_t rows_rehashed = 0;       // kRehash: every row kept is copied into the new table
  double mark_s = 0, remove_s = 0;  // the thread's CPU seconds (thread_seconds)
};

class TableModel {
 public:
  // max_rows: the device budget in rows (gpu_table.cu: budget / (2 x a slot's bytes)); 0 = unlimited.
  TableModel(const heterps::TableConfig& c, std::shared_ptr<heterps::SparseTable> host, uint64_t max_rows,
             Evict mode = Evict::kInPlace, Ties ties = Ties::kHashed)
      : c_(c), host_(std::move(host)), max_rows_(max_rows), mode_(mode), ties_(ties) {
    hstride_ = host_ ? c.stride() : 0;
    dstride_ = (hstride_ + 3) & ~3u;
    uint64_t cap = 1024;
    if (max_rows_)
      while (cap < 2 * max_rows_) cap <<= 1;
    alloc(cap);
  }

  uint64_t count() const { return count_; }
  uint64_t capacity() const { return cap_; }
  uint64_t evicted() const { return evicted_; }
  uint64_t promoted() const { return promoted_; }
  const EvictionCost& last_eviction() const { return last_; }
  uint32_t tick() const { return tick_; }

  // pull: rows of keys into out (n * dim; null in a model without rows).  Returns the batch's misses.
  uint64_t pull(const int64_t* keys, size_t n, float* out) {
    const uint32_t tick = ++tick_;
    std::vector<uint32_t> miss;
    for (size_t i = 0; i < n; ++i) {  // find_kernel with update_scores
      const int64_t s = heterps_slots::probe_find(keys_.data(), mask_, keys[i]);
      if (s >= 0) {
        if (out) std::memcpy(out + i * c_.dim, row(s), c_.dim * 4);
        touch(s, tick);
      } else {
        miss.push_back(static_cast<uint32_t>(i));
      }
    }
    if (miss.empty()) return 0;
    bring_in(keys, miss, tick);
    if (out)
      for (uint32_t p : miss) {  // fill_kernel
        const int64_t s = heterps_slots::probe_find(keys_.data(), mask_, keys[p]);
        std::memcpy(out + size_t(p) * c_.dim, row(s), c_.dim * 4);
      }
    return miss.size();
  }

  // push: the fused update once per unique id, as push_prepare / push_resolve / push_apply do.
  void push(const int64_t* keys, size_t n, const float* grads) {
    const uint32_t tick = ++tick_;
    for (size_t u = 0; grads && u < n * c_.dim; ++u)
      if (!std::isfinite(grads[u])) throw heterps::TableError("a gradient is not finite; the batch was not applied");
    std::vector<int64_t> slot_of(n);
    std::vector<uint32_t> miss;
    for (size_t i = 0; i < n; ++i) {  // push_prepare_kernel
      const int64_t s = heterps_slots::probe_find(keys_.data(), mask_, keys[i]);
      slot_of[i] = s;
      if (s >= 0) {
        count_word_[s] += 1ull << 32;
        touch(s, tick);
      } else {
        miss.push_back(static_cast<uint32_t>(i));
      }
    }
    if (!miss.empty()) {
      const bool moved = bring_in(keys, miss, tick);
      // rows may have moved (an eviction): every id's slot again; the misses' occurrences counted now
      if (moved)
        for (size_t i = 0; i < n; ++i) slot_of[i] = heterps_slots::probe_find(keys_.data(), mask_, keys[i]);
      for (uint32_t p : miss) {
        slot_of[p] = heterps_slots::probe_find(keys_.data(), mask_, keys[p]);
        count_word_[slot_of[p]] += 1ull << 32;
      }
    }
    if (!host_) {  // no rows: only the counts to clear
      for (size_t i = 0; i < n; ++i) count_word_[slot_of[i]] = 0;
      return;
    }
    // push_apply_kernel: the gradients of a repeated id summed (batch order here, arrival order there), then
    // one update from heterps/update_rules.h.
    for (size_t i = 0; i < n; ++i) {
      const int64_t s = slot_of[i];
      float* acc = accum_.data() + uint64_t(s) * c_.dim;
      const uint32_t occurrences = static_cast<uint32_t>(count_word_[s] >> 32);
      if (occurrences == 1) {
        apply(s, grads + i * c_.dim, tick);
        count_word_[s] = 0;
        continue;
      }
      for (uint32_t k = 0; k < c_.dim; ++k) acc[k] += grads[i * c_.dim + k];
      ++count_word_[s];  // this occurrence has arrived; the last one applies the sum
      if ((count_word_[s] & 0xffffffffull) == occurrences) {
        apply(s, acc, tick);
        std::fill(acc, acc + c_.dim, 0.0f);
        count_word_[s] = 0;
      }
    }
  }

  // Every device row to the host tier (gpu_table's flush_to_host): afterwards the host table is complete.
  void flush_to_host() {
    std::vector<int64_t> k;
    std::vector<uint32_t> sc;
    std::vector<float> r;
    for (uint64_t s = 0; s < cap_; ++s)
      if (keys_[s] != kEmpty) {
        k.push_back(keys_[s]);
        sc.push_back(scores_[s]);
        r.insert(r.end(), row(s), row(s) + hstride_);
      }
    if (host_ && !k.empty()) host_->put_rows(k.data(), k.size(), r.data(), sc.data());
    std::fill(keys_.begin(), keys_.end(), kEmpty);
    std::fill(count_word_.begin(), count_word_.end(), 0ull);
    evicted_ += count_;
    count_ = 0;
  }

  // The layout's invariants: every key after an unbroken run from its home, no mark left, count_ keys, no
  // key twice, counts and accumulators zero between batches.  Returns what is wrong, or "".
  std::string check_layout() const {
    uint64_t live = 0;
    for (uint64_t s = 0; s < cap_; ++s) {
      if (keys_[s] == kEmpty) {
        if (count_word_[s] != 0) return "empty slot " + std::to_string(s) + " has a count";
        continue;
      }
      ++live;
      if (count_word_[s] != 0) return "slot " + std::to_string(s) + " keeps a count or a victim's mark";
      if (heterps_slots::probe_find(keys_.data(), mask_, keys_[s]) != int64_t(s))
        return "key " + std::to_string(keys_[s]) + " at slot " + std::to_string(s) + " is not found there";
      for (uint32_t k = 0; host_ && k < c_.dim; ++k)
        if (accum_[s * c_.dim + k] != 0.0f) return "slot " + std::to_string(s) + " keeps an accumulated gradient";
    }
    if (live != count_) return "count " + std::to_string(count_) + " but " + std::to_string(live) + " keys";
    return "";
  }

  // The layout's probe lengths now: mean slots a hit reads, mean and longest a miss reads, the longest cluster.
  struct Probes {
    double hit_mean = 0, miss_mean = 0;
    uint64_t miss_max = 0, longest_cluster = 0;
  };
  Probes probes() const {
    Probes p;
    uint64_t hits = 0, hit_sum = 0, miss_sum = 0, run = 0;
    uint64_t first_empty = 0;
    while (first_empty < cap_ && keys_[first_empty] != kEmpty) ++first_empty;
    if (first_empty == cap_) return p;
    for (uint64_t k = 1; k <= cap_; ++k) {  // from the slot after an empty one, around the table
      const uint64_t s = (first_empty + k) & mask_;
      if (keys_[s] == kEmpty) {
        miss_sum += run * (run + 1) / 2 + run + 1;  // a miss homed in the run reads to its end and the empty; one here
        run = 0;
        continue;
      }
      ++run;
      p.longest_cluster = std::max(p.longest_cluster, run);
      p.miss_max = std::max(p.miss_max, run + 1);
      ++hits;
      hit_sum += ((s - heterps_slots::home_of(keys_[s], mask_)) & mask_) + 1;
    }
    p.hit_mean = hits ? double(hit_sum) / double(hits) : 0;
    p.miss_mean = double(miss_sum) / double(cap_);
    return p;
  }

 private:
  heterps::TableConfig c_;
  std::shared_ptr<heterps::SparseTable> host_;
  uint64_t max_rows_;
  Evict mode_;
  Ties ties_;
  uint32_t hstride_, dstride_;
  uint64_t cap_ = 0, mask_ = 0, count_ = 0, evicted_ = 0, promoted_ = 0;
  uint32_t tick_ = 1;
  std::vector<int64_t> keys_;
  std::vector<uint32_t> scores_, seen_;
  std::vector<unsigned long long> count_word_;
  std::vector<float> rows_, accum_;
  EvictionCost last_;

  bool lfu() const { return c_.eviction == heterps::EvictPolicy::kLFU; }
  float* row(uint64_t s) { return rows_.data() + s * dstride_; }
  const float* row(uint64_t s) const { return rows_.data() + s * dstride_; }
  heterps_slots::Slots slots() { return {keys_.data(), scores_.data(), count_word_.data(), seen_.data(), mask_}; }

  void alloc(uint64_t cap) {
    cap_ = cap;
    mask_ = cap - 1;
    keys_.assign(cap, kEmpty);
    scores_.assign(cap, 0);
    seen_.assign(cap, 0);
    count_word_.assign(cap, 0ull);
    rows_.assign(host_ ? cap * dstride_ : 0, 0.0f);
    accum_.assign(host_ ? cap * c_.dim : 0, 0.0f);
  }

  void touch(uint64_t s, uint32_t tick) {
    if (lfu()) {
      if (scores_[s] != 0xffffffffu) ++scores_[s];
      seen_[s] = tick;
    } else {
      scores_[s] = tick;
    }
  }
  bool in_use(uint64_t s, uint32_t tick) const { return (lfu() ? seen_[s] : scores_[s]) == tick; }

  void apply(uint64_t s, const float* g_in, uint32_t tick) {
    const uint32_t d = c_.dim;
    float* w = row(s);
    float p1 = 1, p2 = 1, c1 = 1, c2 = 1;
    if (c_.optimizer == heterps::Optimizer::kAdam) {
      p1 = w[3 * d];
      p2 = w[3 * d + 1];
      heterps::adam_powers(p1, p2, c_.beta1, c_.beta2, c1, c2);
    }
    std::vector<float> next(w, w + hstride_);
    for (uint32_t k = 0; k < d; ++k) {
      float g = g_in[k];
      if (c_.grad_clip > 0) g = heterps::clip_gradient(g, c_.grad_clip);
      if (c_.optimizer == heterps::Optimizer::kSGD)
        heterps::sgd_column(next[k], g, c_.lr);
      else if (c_.optimizer == heterps::Optimizer::kAdagrad)
        heterps::adagrad_column(next[k], next[d + k], g, c_.lr, c_.epsilon);
      else
        heterps::adam_column(next[k], next[d + k], next[2 * d + k], g, c_.lr, c_.beta1, c_.beta2, c1, c2, c_.epsilon);
    }
    for (float v : next)
      if (!std::isfinite(v)) return;  // left as it was (the device raises after the batch; not modelled)
    if (c_.optimizer == heterps::Optimizer::kAdam) next[3 * d] = p1, next[3 * d + 1] = p2;
    std::copy(next.begin(), next.end(), w);
    if (lfu()) touch(s, tick);
  }

  // bring_in: the misses' distinct keys (sorted), room made, their rows taken from the host tier and inserted.
  // Returns whether an eviction moved rows.
  bool bring_in(const int64_t* keys, const std::vector<uint32_t>& miss, uint32_t tick) {
    std::vector<int64_t> mk;
    mk.reserve(miss.size());
    for (uint32_t p : miss) mk.push_back(keys[p]);
    std::sort(mk.begin(), mk.end());
    mk.erase(std::unique(mk.begin(), mk.end()), mk.end());
    const uint64_t u = mk.size();
    if (max_rows_ && u > max_rows_)
      throw heterps::TableError("a batch needs " + std::to_string(u) + " new device rows, more than the budget's " +
                                std::to_string(max_rows_));
    std::vector<float> in(u * hstride_);
    const bool moved = make_room(u, tick);
    if (host_) host_->take_rows(mk.data(), u, in.data());
    if (max_rows_ && (count_ + u) * 10 > cap_ * 9)
      throw heterps::TableError("a batch touches more distinct ids than the device budget holds");
    for (uint64_t i = 0; i < u; ++i) {  // insert_kernel
      const uint64_t h = heterps_slots::claim_slot(keys_.data(), mask_, mk[i]);
      scores_[h] = lfu() ? 1u : tick;
      count_word_[h] = 0;
      seen_[h] = tick;
      if (host_) std::memcpy(row(h), in.data() + i * hstride_, hstride_ * 4);
    }
    count_ += u;
    promoted_ += u;
    return moved;
  }

  bool make_room(uint64_t incoming, uint32_t tick) {
    if (max_rows_ == 0) {
      if ((count_ + incoming) * 2 > cap_) {
        uint64_t cap = cap_;
        while ((count_ + incoming) * 2 > cap) cap <<= 1;
        rehash(cap, Choice(), 0, tick);  // growth: every row into a larger table, no victim
        return true;
      }
      return false;
    }
    if (count_ + incoming <= max_rows_ || count_ == 0) return false;
    const uint64_t want = count_ + incoming - max_rows_;
    // nth_lowest_score: the radix select finds the want-th lowest live score, as ordering them does
    std::vector<uint32_t> live;
    live.reserve(count_);
    for (uint64_t s = 0; s < cap_; ++s)
      if (keys_[s] != kEmpty) live.push_back(scores_[s]);
    if (live.empty()) return false;
    const uint64_t n = std::min<uint64_t>(want, live.size());
    std::nth_element(live.begin(), live.begin() + (n - 1), live.end());
    Choice ch;
    ch.none = false;
    ch.ties = ties_;
    ch.nth = live[n - 1];
    uint64_t below = 0, ties = 0;  // the radix select's last histogram gives both
    for (uint32_t v : live) below += v < ch.nth, ties += v == ch.nth;
    ch.cut = heterps_slots::tie_cut_for(n - below, ties);
    const uint64_t max_victims = want + want / 4 + 1024;
    if (mode_ == Evict::kRehash) {
      rehash(cap_, ch, max_victims, tick);
      return true;
    }
    evict_in_place(ch, max_victims, tick);
    return true;
  }

  // mark_victims_kernel, the victims' copy to the host tier, then elect_leaders_kernel and shift_kernel.
  void evict_in_place(const Choice& ch, uint64_t max_victims, uint32_t protect) {
    last_ = EvictionCost();
    auto t0 = thread_seconds();
    std::vector<uint64_t> vpos;
    std::vector<int64_t> vk;
    std::vector<uint32_t> vs;
    std::vector<float> vr;
    for (uint64_t s = 0; s < cap_; ++s) {
      if (keys_[s] == kEmpty || !ch.victim(keys_[s], scores_[s]) || in_use(s, protect) || vpos.size() >= max_victims)
        continue;
      vpos.push_back(s);
      vk.push_back(keys_[s]);
      vs.push_back(scores_[s]);
      if (host_) vr.insert(vr.end(), row(s), row(s) + hstride_);
      count_word_[s] = kVictim;
    }
    last_.slots_scanned = cap_;
    auto t1 = thread_seconds();
    if (host_ && !vk.empty()) host_->put_rows(vk.data(), vk.size(), vr.data(), vs.data());
    auto t2 = thread_seconds();
    const heterps_slots::Slots sl = slots();
    std::vector<uint64_t> starts;
    for (uint64_t v : vpos) {
      uint64_t start;
      if (heterps_slots::leads_cluster(sl, v, &start)) starts.push_back(start);
    }
    for (uint64_t start : starts) {
      heterps_slots::ClusterShift cs(sl, start);
      heterps_slots::Move m;
      while (cs.next(&m))
        if (host_) std::memcpy(row(m.to), row(m.from), dstride_ * 4);
      last_.moved += cs.moved();
      last_.passes += cs.passes();
      last_.cluster_slots += cs.length();
      last_.max_cluster = std::max<uint64_t>(last_.max_cluster, cs.length());
    }
    auto t3 = thread_seconds();
    last_.victims = vpos.size();
    last_.leaders = starts.size();
    last_.mark_s = t1 - t0;
    last_.remove_s = t3 - t2;
    count_ -= vpos.size();
    evicted_ += vpos.size();
  }

  // rehash_kernel: every slot's row into a fresh table of `cap` slots, except victims (the choice's, not used by
  // the batch `protect`, at most max_victims), which go to the host tier.
  void rehash(uint64_t cap, const Choice& ch, uint64_t max_victims, uint32_t protect) {
    last_ = EvictionCost();
    auto t0 = thread_seconds();
    std::vector<int64_t> ok = std::move(keys_);
    std::vector<uint32_t> os = std::move(scores_), oseen = std::move(seen_);
    std::vector<unsigned long long> ocount = std::move(count_word_);  // a push's counts go with their rows
    std::vector<float> orows = std::move(rows_);
    const uint64_t ocap = cap_;
    alloc(cap);
    std::vector<int64_t> vk;
    std::vector<uint32_t> vs;
    std::vector<float> vr;
    const uint32_t ds = dstride_;
    for (uint64_t s = 0; s < ocap; ++s) {
      if (ok[s] == kEmpty) continue;
      const bool busy = (lfu() ? oseen[s] : os[s]) == protect;
      const float* src = orows.data() + s * ds;
      if (ch.victim(ok[s], os[s]) && !busy && vk.size() < max_victims) {
        vk.push_back(ok[s]);
        vs.push_back(os[s]);
        if (host_) vr.insert(vr.end(), src, src + hstride_);
        continue;
      }
      const uint64_t h = heterps_slots::claim_slot(keys_.data(), mask_, ok[s]);
      scores_[h] = os[s];
      seen_[h] = oseen[s];
      count_word_[h] = ocount[s];
      if (host_) std::memcpy(row(h), src, ds * 4);
      ++last_.rows_rehashed;
    }
    auto t1 = thread_seconds();
    if (host_ && !vk.empty()) host_->put_rows(vk.data(), vk.size(), vr.data(), vs.data());
    last_.victims = vk.size();
    last_.slots_scanned = ocap;
    last_.remove_s = t1 - t0;
    count_ -= vk.size();
    evicted_ += vk.size();
  }
};

}  // namespace heterps_model
