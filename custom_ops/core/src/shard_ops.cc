#include "shard_ops.h"

#include <cstring>
#include <string>

#include "optimizer.h"

namespace heterps {

float* ShardOps::get_h(int64_t key, uint64_t h, uint32_t tick) {
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
      rec = spilled(key, it);
    } catch (...) {
      sh.free_slots.push_back(slot);
      throw;
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

const char* ShardOps::spilled(int64_t key, int64_t at) {
  std::string fault;
  const char* rec = sh.log.checked(sh.ssd_index.value_at(at), record_bytes(), key, &log_size, &fault);
  if (rec != nullptr) return rec;
  // The rest of the table keeps serving: this id leaves the SSD tier (a later touch starts it afresh, as
  // a new id) and is listed, so that no checkpoint is written without the user accepting the loss.
  sh.ssd_index.erase_at(static_cast<uint64_t>(at));
  sh.lost.emplace_back(key, fault);
  throw TableError(fault + "; the row is lost (SparseTable::lost_ids(); save() refuses until forget_lost())");
}

void ShardOps::put(int64_t key, uint32_t score, const float* src) {
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

void ShardOps::take(int64_t key, float* dst) {
  int64_t i = sh.find(key);
  if (i >= 0) {
    std::memcpy(dst, sh.row(sh.entries[i].slot), size_t(c.stride()) * 4);
    sh.free_slots.push_back(sh.entries[i].slot);
    sh.erase_at(static_cast<uint64_t>(i));
    return;
  }
  int64_t at = sh.ssd_index.empty() ? -1 : sh.ssd_index.find(key);
  if (at >= 0) {
    std::memcpy(dst, spilled(key, at) + kRecordHeader, size_t(c.stride()) * 4);
    sh.ssd_index.erase_at(static_cast<uint64_t>(at));
    ++sh.promotions;
    return;
  }
  init_row(c, key, dst);
}

}  // namespace heterps
