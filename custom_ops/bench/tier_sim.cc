// The CUDA table's tier policy over tier_bench's id streams, simulated on the host at full size: the same
// generator, seeds, batches, budgets and warm-up as custom_ops/bench/tier_bench.cu, through the host model of
// the table (custom_ops/cuda/table_model.h: the kernels' own slots, probing, scores and eviction) without
// rows.  Prints JSON, per (Zipf s, budget): a batch's distinct ids and their share of the device's rows, the
// rows promoted and evicted a step, the evictions a step (pull's and push's), the probe lengths of the layout
// after the step, and how often each scratch buffer on the step's path would be allocated again, under the
// table's former policy (exact sizes: a batch larger than any before frees and allocates, and cudaFree waits
// for the whole device) and the current one (powers of two, stream-ordered), in the timed steps.
//
//   cmake --build build --target tier_sim && ./build/bench/tier_sim [--rows 16777216] [--batch 1048576]
//       [--budgets 0.5,0.25,0.2,0.15,0.12,0.1] [--zipf 1.05,0.8] [--warm 3] [--steps 8] [--evict in_place|rehash]
//       [--ties hashed|slot_order]
// --ties slot_order: a tie at the eviction threshold cut in slot order, as the table did before (the cliff).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "table_model.h"
#include "zipf_ids.h"

namespace {

std::vector<double> list_of(const char* option, const char* s) {
  std::vector<double> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0') {
      std::fprintf(stderr, "tier_sim: %s: '%s' is not a number\n", option, item.c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

// How often a grow-only buffer is allocated again over a run's requests: exactly sized, or in powers of two.
struct Growth {
  uint64_t exact = 0, pow2 = 0;
  uint64_t exact_n = 0, pow2_n = 0;
  void want(uint64_t n, bool counted) {  // counted: a timed step's request
    if (n > exact_n) exact_n = n, exact += counted;
    if (n > pow2_n) {
      uint64_t p = 1;
      while (p < n) p <<= 1;
      pow2_n = p;
      pow2 += counted;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t rows = 1ull << 24, batch = 1ull << 20;
  std::vector<double> budgets = {0.5, 0.25, 0.2, 0.15, 0.12, 0.1}, zipf = {1.05, 0.8};
  int warm = 3, steps = 8;
  heterps_model::Evict mode = heterps_model::Evict::kInPlace;
  heterps_model::Ties ties = heterps_model::Ties::kHashed;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--rows")
      rows = std::strtoull(v, nullptr, 10);
    else if (k == "--batch")
      batch = std::strtoull(v, nullptr, 10);
    else if (k == "--budgets")
      budgets = list_of("--budgets", v);
    else if (k == "--zipf")
      zipf = list_of("--zipf", v);
    else if (k == "--warm")
      warm = std::atoi(v);
    else if (k == "--steps")
      steps = std::atoi(v);
    else if (k == "--evict" && (std::string(v) == "in_place" || std::string(v) == "rehash"))
      mode = std::string(v) == "rehash" ? heterps_model::Evict::kRehash : heterps_model::Evict::kInPlace;
    else if (k == "--ties" && (std::string(v) == "hashed" || std::string(v) == "slot_order"))
      ties = std::string(v) == "hashed" ? heterps_model::Ties::kHashed : heterps_model::Ties::kSlotOrder;
    else {
      std::fprintf(stderr, "tier_sim: unknown argument %s %s\n", k.c_str(), v);
      return 2;
    }
  }
  for (double f : budgets)
    if (!(f > 0 && f < 1)) {
      std::fprintf(stderr, "tier_sim: --budgets: each a share of the rows in (0, 1), got %g\n", f);
      return 2;
    }
  if (rows == 0 || batch == 0 || steps < 1 || warm < 0) {
    std::fprintf(stderr, "tier_sim: --rows, --batch and --steps must be positive\n");
    return 2;
  }
  const heterps::TableConfig cfg = heterps::TableConfig::parse("dim=64;optimizer=sgd;seed=1");
  std::printf("{\n \"rows\": %llu, \"batch\": %llu, \"evict\": \"%s\", \"ties\": \"%s\", \"configs\": [\n",
              (unsigned long long)rows, (unsigned long long)batch,
              mode == heterps_model::Evict::kRehash ? "rehash" : "in_place",
              ties == heterps_model::Ties::kHashed ? "hashed" : "slot_order");
  bool first = true;
  for (double s : zipf) {
    const heterps_bench::ZipfRanks ranks(rows, s);
    std::vector<std::vector<int64_t>> batches;
    std::vector<uint64_t> unique;
    for (int i = 0; i < warm + steps; ++i) {  // tier_bench's batches: seeds 100 + i
      uint64_t u = 0;
      batches.push_back(heterps_bench::zipf_ids(ranks, rows, batch, 100 + i, &u));
      unique.push_back(u);
    }
    for (double f : budgets) {
      const uint64_t max_rows = static_cast<uint64_t>(f * double(rows));
      heterps_model::TableModel m(cfg, nullptr, max_rows, mode, ties);
      // tier_bench's warm-up: the f * rows hottest ranks pulled onto the device, 2^20 a call
      const uint64_t fill = std::min<uint64_t>(rows, 1ull << 20);
      std::vector<int64_t> hk(fill);
      for (uint64_t off = 0; off < max_rows; off += fill) {
        const uint64_t n = std::min(fill, max_rows - off);
        for (uint64_t i = 0; i < n; ++i) hk[i] = heterps_bench::id_of_rank(off + i, rows);
        m.pull(hk.data(), n, nullptr);
      }
      std::map<std::string, Growth> bufs;  // gpu_table.cu's scratch on the step's path, by name
      double promoted = 0, evicted = 0, evictions = 0, victims_over_want = 0, moved = 0, passes = 0;
      double misses = 0, unique_mean = 0, longest_cluster = 0, miss_probe = 0, miss_probe_max = 0, hit_probe = 0;
      uint64_t max_unique = 0;
      std::string error;
      for (int i = 0; i < warm + steps; ++i) {
        const bool timed = i >= warm;
        const uint64_t p0 = m.promoted(), e0 = m.evicted();
        try {
          for (int half = 0; half < 2; ++half) {  // the step: a pull, then a push of the same batch
            const uint64_t before = m.evicted();
            const uint64_t ms = half == 0 ? m.pull(batches[i].data(), batch, nullptr) : 0;
            if (half == 1) m.push(batches[i].data(), batch, nullptr);
            bufs["pos, slots (batch)"].want(batch, timed);
            if (ms) {
              bufs["missed keys, sorted (misses)"].want(ms, timed);
              bufs["rows in (distinct misses)"].want(m.promoted() - p0, timed);
            }
            if (m.evicted() != before) {
              const auto& c = m.last_eviction();
              bufs["victims (1.25 x wanted + 1024)"].want(c.victims, timed);
              if (timed) {
                evictions += 1.0 / steps;
                moved += double(c.moved) / steps;
                passes += double(c.passes) / steps;
                longest_cluster = std::max<double>(longest_cluster, double(c.max_cluster));
              }
            }
            if (timed && half == 0) misses += double(ms) / steps;
          }
        } catch (const std::exception& e) {
          error = e.what();
          break;
        }
        if (timed) {
          promoted += double(m.promoted() - p0) / steps;
          evicted += double(m.evicted() - e0) / steps;
          unique_mean += double(unique[i]) / steps;
          max_unique = std::max(max_unique, unique[i]);
          const auto pr = m.probes();
          hit_probe += pr.hit_mean / steps;
          miss_probe += pr.miss_mean / steps;
          miss_probe_max = std::max<double>(miss_probe_max, double(pr.miss_max));
          longest_cluster = std::max<double>(longest_cluster, double(pr.longest_cluster));
          const double want = double(m.promoted() - p0);  // each step's misses need as many victims
          if (want > 0) victims_over_want += double(m.evicted() - e0) / want / steps;
        }
      }
      std::printf("%s  {\"zipf\": %.2f, \"budget\": %.3f, \"device_rows\": %llu, \"slots\": %llu", first ? "" : ",\n",
                  s, f, (unsigned long long)max_rows, (unsigned long long)m.capacity());
      first = false;
      if (!error.empty()) {
        std::printf(", \"error\": \"%s\"}", error.c_str());
        continue;
      }
      std::printf(
          ", \"unique_ids_per_batch\": %.0f, \"unique_over_device_rows\": %.3f, \"misses_per_pull\": %.0f, "
          "\"promoted_per_step\": %.0f, \"evicted_per_step\": %.0f, \"evictions_per_step\": %.2f, "
          "\"evicted_over_promoted\": %.3f, \"rows_shifted_per_step\": %.0f, \"shift_passes_per_step\": %.0f, "
          "\"load\": %.3f, \"hit_probe_mean\": %.3f, \"miss_probe_mean\": %.3f, \"miss_probe_max\": %.0f, "
          "\"longest_cluster\": %.0f, \"reallocations\": {",
          unique_mean, unique_mean / double(max_rows), misses, promoted, evicted, evictions, victims_over_want, moved,
          passes, double(m.count()) / double(m.capacity()), hit_probe, miss_probe, miss_probe_max, longest_cluster);
      bool fb = true;
      for (const auto& b : bufs) {
        std::printf("%s\"%s\": {\"exact\": %llu, \"pow2\": %llu}", fb ? "" : ", ", b.first.c_str(),
                    (unsigned long long)b.second.exact, (unsigned long long)b.second.pow2);
        fb = false;
      }
      std::printf("}}");
      std::fflush(stdout);
    }
  }
  std::printf("\n ]\n}\n");
  return 0;
}
