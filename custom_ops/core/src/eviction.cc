// Eviction of a shard's coldest rows to its SSD log, and compaction of the log.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "io.h"
#include "shard_ops.h"

namespace heterps {

// Moves the coldest rows (lowest score) to the SSD log until the shard is 1/8 below its capacity, in one
// write.  Evicting a batch at once amortises the O(shard) selection to O(8) per evicted row.
void ShardOps::evict() {
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
    const uint32_t crc = record_crc(rec, rb);
    std::memcpy(rec + 12, &crc, 4);
  }
  std::string err;
  if (!sh.log.append(buf, rb, &err)) {
    // Full disk: keep every row resident (over budget, but nothing is lost) and back off so that the
    // next attempt comes only after the shard has grown by another 1/8 of its capacity.
    ++sh.spill_errors;
    sh.no_spill_below = sh.count + std::max<uint64_t>(1, capacity / 8);
    if (!sh.spill_warned) {  // once per shard: every op path (Python, Paddle op, C++) sees it on stderr
      std::fprintf(stderr,
                   "heterps sparse table: spilling rows to '%s' failed (%s); they stay in memory "
                   "over the budget (stats: spill_errors)\n",
                   sh.log.file.c_str(), err.c_str());
      sh.spill_warned = true;
    }
    return;
  }
  sh.no_spill_below = 0;
  for (uint64_t k = 0; k < n; ++k) {
    int64_t i = sh.find(keys[k]);
    sh.free_slots.push_back(sh.entries[i].slot);
    sh.erase_at(static_cast<uint64_t>(i));
    sh.ssd_index.assign(keys[k], sh.log.records_written + k);
  }
  sh.log.records_written += n;
  sh.evictions += n;
  maybe_compact();
}

// The log only appends; once dead records (promoted or overwritten) outnumber live ones, rewrite the live
// ones into a fresh file and rename it over the old one.  Amortised O(1) per eviction.
void ShardOps::maybe_compact() {
  uint64_t live = sh.ssd_index.size();
  uint64_t dead = sh.log.records_written - live;
  if (dead < 4096 || dead <= live) return;
  const size_t rb = record_bytes();
  std::string tmp = sh.log.file + ".compact";
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
    // Only checked records are carried over: a bad one ends the compaction (the old log stays) and is
    // reported like any other read of it (ShardOps::spilled).
    const int64_t key = sh.ssd_index.key_at(uint64_t(order[k].second));
    const char* rec;
    try {
      rec = spilled(key, order[k].second);
    } catch (...) {
      ::close(nfd);
      ::unlink(tmp.c_str());
      throw;
    }
    buf.insert(buf.end(), rec, rec + rb);
    if (ok && (buf.size() >= 4096 * rb || k + 1 == order.size())) {
      ok = io::pwrite_full(nfd, buf.data(), buf.size(), written * rb, &err);
      written += buf.size() / rb;
      buf.clear();
    }
  }
  if (!ok || ::rename(tmp.c_str(), sh.log.file.c_str()) != 0) {
    ::close(nfd);
    ::unlink(tmp.c_str());
    ++sh.spill_errors;
    return;
  }
  sh.log.replace(nfd, order.size());
  for (size_t k = 0; k < order.size(); ++k) sh.ssd_index.set_value_at(uint64_t(order[k].second), k);
  ++sh.compactions;
}

}  // namespace heterps
