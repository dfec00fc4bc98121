// The CUDA table's design checked on the host: its layout code (custom_ops/cuda/slot_table.h, which the kernels
// call) and its tier policy (custom_ops/cuda/table_model.h) against the CPU core.
//   1. Eviction in place on hand-made clusters: long ones, ones that wrap around the table's end, more victims
//      in a run than a leader holds holes for; afterwards every remaining key is found at its slot with its
//      row, every victim is gone, and nothing else changed.
//   2. The model through random sequences of pulls and pushes with the device budget a fraction of the ids (so
//      rows travel device -> host tier -> device), for SGD, Adagrad and Adam (LRU) and Adagrad (LFU), dims 8
//      and 9: every pulled row equals the CPU core's bit for bit, the layout's invariants hold after every
//      batch, and at the end (device rows flushed to the host tier) every stored row, optimizer state
//      included, equals the core's.  The rehash the in-place eviction replaced is run too, as the reference.
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "check.h"
#include "table_model.h"

using heterps_slots::kEmpty;
using heterps_slots::kVictim;

namespace {

// A table of `cap` slots (metadata and a one-float "row" holding the key) filled with keys whose homes
// crowd into [lo, lo + spread), then the marked victims removed by their leaders.
void one_cluster_case(std::mt19937_64& rng, uint64_t cap, uint64_t lo, uint64_t spread, uint32_t nkeys,
                      double victim_share) {
  const uint64_t mask = cap - 1;
  std::vector<int64_t> keys(cap, kEmpty);
  std::vector<uint32_t> scores(cap, 0), seen(cap, 0);
  std::vector<unsigned long long> count(cap, 0);
  std::vector<double> rows(cap, -1.0);
  heterps_slots::Slots s{keys.data(), scores.data(), count.data(), seen.data(), mask};
  std::set<int64_t> inserted;
  for (int64_t k = int64_t(rng() % 1000000); inserted.size() < nkeys; ++k) {
    if (((heterps_slots::home_of(k, mask) - lo) & mask) >= spread) continue;
    uint64_t h = heterps_slots::home_of(k, mask);
    while (keys[h] != kEmpty) h = (h + 1) & mask;
    keys[h] = k;
    scores[h] = uint32_t(k);
    seen[h] = uint32_t(k) * 3u;
    rows[h] = double(k);
    inserted.insert(k);
  }
  std::set<int64_t> victims;
  std::vector<uint64_t> vpos;
  std::bernoulli_distribution pick(victim_share);
  for (uint64_t j = 0; j < cap; ++j)
    if (keys[j] != kEmpty && pick(rng)) {
      victims.insert(keys[j]);
      vpos.push_back(j);
      count[j] = kVictim;
    }
  std::vector<uint64_t> starts;
  for (uint64_t v : vpos) {
    uint64_t start;
    if (heterps_slots::leads_cluster(s, v, &start)) starts.push_back(start);
  }
  for (uint64_t start : starts) {
    heterps_slots::ClusterShift cs(s, start);
    heterps_slots::Move m;
    while (cs.next(&m)) rows[m.to] = rows[m.from];
  }
  uint64_t live = 0;
  for (uint64_t j = 0; j < cap; ++j) {
    if (keys[j] == kEmpty) {
      CHECK(count[j] == 0);
      continue;
    }
    ++live;
    const int64_t k = keys[j];
    CHECK(victims.count(k) == 0);
    CHECK(count[j] == 0);
    CHECK(heterps_slots::probe_find(keys.data(), mask, k) == int64_t(j));
    CHECK(rows[j] == double(k) && scores[j] == uint32_t(k) && seen[j] == uint32_t(k) * 3u);
  }
  CHECK(live == inserted.size() - victims.size());
  for (int64_t k : inserted)
    if (!victims.count(k)) CHECK(heterps_slots::probe_find(keys.data(), mask, k) >= 0);
}

void test_cluster_shift() {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const uint64_t cap = 1ull << (6 + trial % 4);
    // a crowd of homes anywhere, the end of the table included (its cluster wraps to slot 0)
    const uint64_t lo = trial % 3 == 0 ? cap - 3 : rng() % cap;
    const uint64_t spread = 1 + rng() % 12;
    const uint32_t nkeys = static_cast<uint32_t>(std::min<uint64_t>(cap * 7 / 10, 8 + rng() % 60));
    const double share = trial % 5 == 0 ? 0.9 : 0.05 + double(rng() % 60) / 100.0;  // 0.9: many holes a run
    one_cluster_case(rng, cap, lo, spread, nkeys, share);
  }
  // spread-out homes at the device's load (half the slots): the clusters of a real table
  for (int trial = 0; trial < 20; ++trial) one_cluster_case(rng, 4096, 0, 4096, 2048, 0.3);
}

struct Case {
  const char* config;
  uint32_t dim;
};

void model_against_core(const Case& c, heterps_model::Evict mode, uint64_t seed) {
  const heterps::TableConfig cfg = heterps::TableConfig::parse(c.config);
  auto host = std::make_shared<heterps::SparseTable>(cfg);
  heterps::SparseTable core(cfg);
  const uint64_t universe = 3000, max_rows = 1024;  // the device holds a third of the ids at most
  heterps_model::TableModel m(cfg, host, max_rows, mode);
  std::mt19937_64 rng(seed);
  const uint32_t d = cfg.dim;
  for (int step = 0; step < 40; ++step) {
    const size_t n = 200 + rng() % 500;
    std::vector<int64_t> keys(n);
    const uint64_t hot = 64 + rng() % 400;  // a hot range that moves, and a cold tail
    const uint64_t shift = rng() % universe;
    for (auto& k : keys)
      k = int64_t(rng() % 4 ? (shift + rng() % hot) % universe : rng() % universe) * 7 - 9000;  // negatives too
    std::vector<float> a(n * d), b(n * d);
    m.pull(keys.data(), n, a.data());
    core.pull(keys.data(), n, b.data());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    std::vector<float> g(n * d);
    for (auto& x : g) x = float(int(rng() % 2001) - 1000) / 1024.0f;  // sums exact in any order
    if (step % 3 != 2) {
      m.push(keys.data(), n, g.data());
      core.push(keys.data(), n, g.data());
    } else {  // a push of ids the pull did not bring in: the push itself evicts and promotes
      for (auto& k : keys) k = int64_t(rng() % universe) * 7 - 9000;
      m.push(keys.data(), n, g.data());
      core.push(keys.data(), n, g.data());
    }
    const std::string bad = m.check_layout();
    if (!bad.empty()) std::fprintf(stderr, "%s step %d: %s\n", c.config, step, bad.c_str());
    CHECK(bad.empty());
    // LRU: within the budget after every batch.  LFU: the threshold is chosen among every live row, and rows
    // the batch uses that score under it stay, so the table may exceed the budget by up to a batch's ids.
    CHECK(m.count() <= max_rows + (cfg.eviction == heterps::EvictPolicy::kLFU ? n : 0));
  }
  CHECK(m.evicted() > 1000 && m.promoted() > 1000);  // rows really travelled
  m.flush_to_host();
  std::vector<int64_t> all;
  for (uint64_t k = 0; k < universe; ++k) all.push_back(int64_t(k) * 7 - 9000);
  std::vector<float> ra(all.size() * cfg.stride()), rb(ra.size());
  std::vector<uint8_t> fa(all.size()), fb(all.size());
  host->peek(all.data(), all.size(), ra.data(), fa.data());
  core.peek(all.data(), all.size(), rb.data(), fb.data());
  CHECK(fa == fb);
  CHECK(std::memcmp(ra.data(), rb.data(), ra.size() * 4) == 0);
}

}  // namespace

int main() {
  test_cluster_shift();
  const Case cases[] = {
      {"dim=8;optimizer=sgd;lr=0.05;seed=3", 8},
      {"dim=8;optimizer=adagrad;lr=0.05;seed=3", 8},
      {"dim=9;optimizer=adam;lr=0.01;seed=5", 9},
      {"dim=8;optimizer=adagrad;lr=0.05;seed=3;eviction=lfu", 8},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    model_against_core(c, heterps_model::Evict::kInPlace, seed);
    model_against_core(c, heterps_model::Evict::kRehash, seed++);
  }
  if (g_failures) {
    std::fprintf(stderr, "test_table_model: %d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("test_table_model: all checks passed\n");
  return 0;
}
