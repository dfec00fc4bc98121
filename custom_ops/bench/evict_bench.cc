// What one eviction of the CUDA table costs, measured on its host model (custom_ops/cuda/table_model.h, the
// kernels' own layout code): in place (victims marked and copied out, their clusters shifted back) against the
// full rehash it replaced, at several table sizes, with the same victims.  Prints JSON.
//
//   cmake --build build --target evict_bench && ./build/bench/evict_bench [--dim 16] [--sizes 16,18,20,21]
//         [--victims 16384] [--reps 3]
//
// A size s: a device budget of 2^s rows, filled (every row pulled once, 1024 rows a batch, so that LRU ticks tie
// 1024 rows at most), then `reps` pulls of `victims` new ids, each of which evicts that many of the coldest rows.
// Times are the thread's CPU seconds (a loaded machine's other processes do not count).  Reported per size, medians
// over the reps: the mark's scan (keys and scores of every slot, as each of the
// threshold's four histogram passes reads them) in ns a slot, the removal (leaders elected, clusters shifted) in
// ns a victim, and the rehash's time in ns a victim; the rows the removal moved, its clusters and passes.  On the
// device the scan reads 12 bytes a slot and the removal moves the victims' clusters' rows, where the rehash
// moved every row of the table.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "table_model.h"

namespace {

std::vector<int> ints(const char* s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 10 || v > 26) {
      std::fprintf(stderr, "evict_bench: --sizes: '%s' is not a power of two's exponent in [10, 26]\n", item.c_str());
      std::exit(2);
    }
    out.push_back(int(v));
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Figures {
  double mark_ns_per_slot = 0, remove_ns_per_victim = 0, victims = 0, moved = 0, leaders = 0, passes = 0;
  double max_cluster = 0, rehash_ns_per_victim = 0, rehash_ns_per_slot = 0;
};

// One mode at one size: the reps' evictions.
std::vector<heterps_model::EvictionCost> run(const heterps::TableConfig& cfg, int size, uint64_t victims, int reps,
                                             heterps_model::Evict mode) {
  auto host = std::make_shared<heterps::SparseTable>(cfg);
  const uint64_t rows = 1ull << size;
  heterps_model::TableModel m(cfg, host, rows, mode);
  std::vector<int64_t> keys(std::max<uint64_t>(1024, victims));
  std::vector<float> out(keys.size() * cfg.dim);
  int64_t next = 0;
  for (uint64_t off = 0; off < rows; off += 1024) {
    for (uint64_t i = 0; i < 1024; ++i) keys[i] = next++;
    m.pull(keys.data(), 1024, out.data());
  }
  std::vector<heterps_model::EvictionCost> costs;
  for (int r = 0; r < reps; ++r) {
    for (uint64_t i = 0; i < victims; ++i) keys[i] = next++;
    m.pull(keys.data(), victims, out.data());
    costs.push_back(m.last_eviction());
    const std::string bad = m.check_layout();
    if (!bad.empty()) {
      std::fprintf(stderr, "evict_bench: the layout is broken: %s\n", bad.c_str());
      std::exit(1);
    }
  }
  return costs;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t dim = 16;
  std::vector<int> sizes = {16, 18, 20, 21};
  uint64_t victims = 16384;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--dim")
      dim = static_cast<uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
    else if (k == "--sizes")
      sizes = ints(argv[i + 1]);
    else if (k == "--victims")
      victims = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "evict_bench: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (dim == 0 || victims == 0 || reps < 1) {
    std::fprintf(stderr, "evict_bench: --dim, --victims and --reps must be positive\n");
    return 2;
  }
  const heterps::TableConfig cfg = heterps::TableConfig::parse("dim=" + std::to_string(dim) + ";optimizer=sgd;seed=1");
  std::printf("{\n \"dim\": %u, \"victims\": %llu, \"reps\": %d, \"sizes\": [\n", dim, (unsigned long long)victims,
              reps);
  for (size_t si = 0; si < sizes.size(); ++si) {
    const int s = sizes[si];
    if ((1ull << s) < 2 * victims) {
      std::fprintf(stderr, "evict_bench: size %d holds fewer than twice the victims\n", s);
      return 2;
    }
    const auto in_place = run(cfg, s, victims, reps, heterps_model::Evict::kInPlace);
    const auto rehash = run(cfg, s, victims, reps, heterps_model::Evict::kRehash);
    std::vector<double> mark, remove, rh, rh_slot;
    Figures f;
    for (const auto& c : in_place) {
      mark.push_back(c.mark_s * 1e9 / double(c.slots_scanned));
      remove.push_back(c.remove_s * 1e9 / double(std::max<uint64_t>(c.victims, 1)));
      f.victims += double(c.victims) / reps;
      f.moved += double(c.moved) / reps;
      f.leaders += double(c.leaders) / reps;
      f.passes += double(c.passes) / reps;
      f.max_cluster = std::max<double>(f.max_cluster, double(c.max_cluster));
    }
    for (const auto& c : rehash) {
      rh.push_back(c.remove_s * 1e9 / double(std::max<uint64_t>(c.victims, 1)));
      rh_slot.push_back(c.remove_s * 1e9 / double(c.slots_scanned));
    }
    f.mark_ns_per_slot = median(mark);
    f.remove_ns_per_victim = median(remove);
    f.rehash_ns_per_victim = median(rh);
    f.rehash_ns_per_slot = median(rh_slot);
    std::printf(
        "  {\"rows\": %llu, \"slots\": %llu, \"victims\": %.0f, \"in_place\": {\"mark_ns_per_slot\": %.2f, "
        "\"remove_ns_per_victim\": %.1f, \"rows_moved_per_victim\": %.3f, \"clusters\": %.0f, \"passes\": %.0f, "
        "\"longest_cluster\": %.0f}, \"rehash\": {\"ns_per_victim\": %.1f, \"ns_per_slot\": %.2f}, "
        "\"rehash_over_removal\": %.1f}%s\n",
        (unsigned long long)(1ull << s), (unsigned long long)(2ull << s), f.victims, f.mark_ns_per_slot,
        f.remove_ns_per_victim, f.moved / std::max(f.victims, 1.0), f.leaders, f.passes, f.max_cluster,
        f.rehash_ns_per_victim, f.rehash_ns_per_slot, f.rehash_ns_per_victim / f.remove_ns_per_victim,
        si + 1 < sizes.size() ? "," : "");
    std::fflush(stdout);
  }
  std::printf(" ]\n}\n");
  return 0;
}
