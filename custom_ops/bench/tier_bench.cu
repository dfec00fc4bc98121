// The CUDA table's tiers under training traffic: steps/s when the device holds only part of the rows, the
// rest in the host tier.  A step is a pull then a push of one batch of Zipf ids (the hot rows stay on the
// device, the cold ones travel); each device budget is measured against all rows resident, in the same run,
// with the link's own bandwidth (a plain page-locked copy) beside it.  Prints JSON.
//
//   cmake -S . -B build -DHETERPS_CUDA=ON && cmake --build build -j --target tier_bench
//   ./build/bench/tier_bench [--rows 16777216] [--dim 64] [--batch 1048576] [--budgets 1,0.5,0.25,0.1]
//                            [--zipf 1.05,0.8] [--optimizer sgd,adam] [--one-step 1] [--warm 3] [--steps 8]
//                            [--host-threads 0] [--device 0]
//
// --one-step 1 adds a budget of one step's distinct ids (the largest batch's, plus 1024 rows): the cache size the
// caching peers (dynamicemb, FBGEMM's caching TBE) are published at.  --optimizer: each one a table of its own.
//
// Every table starts with all `rows` rows (their initial values) in it: all-resident, pulled onto the device; for a
// budget f under 1, put into the host tier and the f * rows hottest (by Zipf rank) then pulled onto the device, so the
// timed steps evict and promote existing rows as a long job's would.  Budget f: the device holds f * rows rows
// (memory_budget_bytes = f * rows * the device bytes of a row).  A step's figures: rows_moved, promoted + evicted;
// link_bytes, what the table copied over the link both ways (heterps_gpu_table_link_bytes); link_share, the busier
// direction's bytes/s over a plain copy's that way; host_ms_per_step, where the misses' host time went
// (heterps_gpu_table_phase_seconds).  Built with -DTIER_BENCH_NO_LINK_BYTES for a table without those two calls: the
// rows moved times a row's bytes instead, and no host_ms_per_step.  Exit 1 if a step's pull or push failed, 2 if a
// table or CUDA call setting up failed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_check.h"
#include "gpu_table.h"
#include "heterps/table.h"
#include "zipf_ids.h"

namespace {

// A comma-separated list of numbers (an option's value); anything else ends the run naming it.
std::vector<double> list_of(const std::string& option, const char* s) {
  std::vector<double> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0') {
      std::fprintf(stderr, "tier_bench: %s: '%s' is not a number\n", option.c_str(), item.c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

struct Args {
  uint64_t rows = 1ull << 24, batch = 1ull << 20;
  uint32_t dim = 64, host_threads = 0;
  std::vector<double> budgets = {1, 0.5, 0.25, 0.1}, zipf = {1.05, 0.8};
  std::vector<std::string> optimizers = {"sgd"};
  int warm = 3, steps = 8, device = 0, one_step = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--rows")
      a.rows = std::strtoull(v, nullptr, 10);
    else if (k == "--batch")
      a.batch = std::strtoull(v, nullptr, 10);
    else if (k == "--dim")
      a.dim = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    else if (k == "--host-threads")
      a.host_threads = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    else if (k == "--budgets")
      a.budgets = list_of(k, v);
    else if (k == "--zipf")
      a.zipf = list_of(k, v);
    else if (k == "--warm")
      a.warm = std::atoi(v);
    else if (k == "--steps")
      a.steps = std::atoi(v);
    else if (k == "--device")
      a.device = std::atoi(v);
    else if (k == "--one-step")
      a.one_step = std::atoi(v);
    else if (k == "--optimizer") {
      a.optimizers.clear();
      std::stringstream in(v);
      std::string item;
      while (std::getline(in, item, ','))
        if (item == "sgd" || item == "adagrad" || item == "adam") {
          a.optimizers.push_back(item);
        } else {
          std::fprintf(stderr, "tier_bench: --optimizer: '%s' is not sgd, adagrad or adam\n", item.c_str());
          std::exit(2);
        }
      if (a.optimizers.empty()) {
        std::fprintf(stderr, "tier_bench: --optimizer needs at least one\n");
        std::exit(2);
      }
    } else {
      std::fprintf(stderr, "tier_bench: unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.steps < 1 || a.warm < 0 || a.rows == 0 || a.batch == 0 || a.dim == 0) {
    std::fprintf(stderr, "tier_bench: --rows, --batch, --dim and --steps must be positive\n");
    std::exit(2);
  }
  for (double f : a.budgets)
    if (!(f > 0 && f <= 1)) {
      std::fprintf(stderr, "tier_bench: --budgets: each a share of the rows in (0, 1], got %g\n", f);
      std::exit(2);
    }
  for (double s : a.zipf)
    if (!(s > 0 && s < 10)) {
      std::fprintf(stderr, "tier_bench: --zipf: each an exponent in (0, 10), got %g\n", s);
      std::exit(2);
    }
  if (a.budgets.empty() || a.zipf.empty()) {
    std::fprintf(stderr, "tier_bench: --budgets and --zipf need at least one value each\n");
    std::exit(2);
  }
  return a;
}

// GB/s of a plain page-locked copy each way (the median of 5 copies of 256 MiB).
void link_bandwidth(double* h2d, double* d2h) {
  const size_t bytes = 256ull << 20;
  void *host, *dev;
  CK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dev, bytes));
  std::memset(host, 1, bytes);
  auto time = [&](cudaMemcpyKind kind) {
    std::vector<double> s;
    for (int i = 0; i < 6; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      CK(cudaMemcpy(kind == cudaMemcpyHostToDevice ? dev : host, kind == cudaMemcpyHostToDevice ? host : dev, bytes,
                    kind));
      s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(s.begin() + 1, s.end());  // the first copy warms up
    return bytes / s[3] / 1e9;
  };
  *h2d = time(cudaMemcpyHostToDevice);
  *d2h = time(cudaMemcpyDeviceToHost);
  CK(cudaFreeHost(host));
  CK(cudaFree(dev));
}

struct Result {
  std::string optimizer;
  bool one_step = false;
  double zipf, budget, steps_per_s, median_step_ms, rows_moved, promoted, evicted, link_bytes, unique;
  double link_in = 0, link_out = 0;  // a step's bytes to and from the device (the same split of rows moved without
                                     // the counter: promoted rows in, evicted rows out)
  uint64_t device_rows;
  double phase_ms[7] = {};  // heterps_gpu_table_phase_seconds' phases, a step
};
constexpr int kPhases = 7;
#ifndef TIER_BENCH_NO_LINK_BYTES
const char* kPhaseNames[kPhases] = {"distinct", "select", "take", "evict_wait", "victim_copy", "put", "insert"};
#endif

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  CK(cudaSetDevice(a.device));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, a.device));
  double h2d = 0, d2h = 0;
  link_bandwidth(&h2d, &d2h);

  const uint64_t fill = std::min<uint64_t>(a.rows, 1ull << 20);
  int64_t* dk;
  float *dout, *dg;
  CK(cudaMalloc(&dk, std::max(a.batch, fill) * 8));
  CK(cudaMalloc(&dout, std::max(a.batch, fill) * a.dim * 4));
  CK(cudaMalloc(&dg, a.batch * a.dim * 4));
  {  // small non-zero gradients
    std::mt19937_64 rng(3);
    std::vector<float> g(a.batch * a.dim);
    for (auto& x : g) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-6f;
    CK(cudaMemcpy(dg, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
  }
  std::vector<Result> results;
  bool ok = true;
  for (double s : a.zipf) {
    const heterps_bench::ZipfRanks ranks(a.rows, s);
    std::vector<std::vector<int64_t>> batches;
    double unique = 0;
    uint64_t max_unique = 0;
    for (int i = 0; i < a.warm + a.steps; ++i) {
      uint64_t u = 0;
      batches.push_back(heterps_bench::zipf_ids(ranks, a.rows, a.batch, 100 + i, &u));
      if (i >= a.warm) unique += double(u) / a.steps;
      max_unique = std::max(max_unique, u);
    }
    std::vector<double> budgets = a.budgets;
    const double step_budget = std::min(1.0, double(max_unique + 1024) / double(a.rows));
    if (a.one_step) budgets.push_back(step_budget);
    for (const std::string& opt : a.optimizers)
      for (double f : budgets) {
        const std::string base = "dim=" + std::to_string(a.dim) + ";optimizer=" + opt +
                                 ";lr=0.01;seed=1;host_threads=" + std::to_string(a.host_threads);
        const heterps::TableConfig cfg = heterps::TableConfig::parse(base);
        const uint32_t hstride = cfg.stride(), dstride = (hstride + 3) & ~3u;
        const uint64_t slot_bytes = 8 + 4 + 8 + 4 + uint64_t(dstride) * 4 + uint64_t(a.dim) * 4;  // as gpu_table.cu
#ifdef TIER_BENCH_NO_LINK_BYTES
        const uint64_t row_link_bytes = 8 + 4 + uint64_t(hstride) * 4;  // key, score, row
#endif
        char name[80];
        std::snprintf(name, sizeof name, "tier-%s-%.2f-%.5f", opt.c_str(), s, f);
        std::string c = base;
        // the budget in bytes of f * rows device rows (rounded up: one step's budget must hold its largest batch)
        if (f < 1)
          c += ";memory_budget_bytes=" + std::to_string(uint64_t(std::ceil(f * double(a.rows))) * 2 * slot_bytes);
        CKT(heterps_gpu_table_open(name, c.c_str(), a.device));
        std::vector<int64_t> hk(fill);
        if (f < 1) {  // every row in the host tier (initial rows taken, absent, and put back), then the hottest
          auto host = heterps::find_table(name);  // f * rows pulled onto the device, as a long job would hold them
          std::vector<float> rows(fill * hstride);
          for (uint64_t off = 0; off < a.rows; off += fill) {
            const uint64_t m = std::min(fill, a.rows - off);
            for (uint64_t i = 0; i < m; ++i) hk[i] = static_cast<int64_t>(off + i);
            host->take_rows(hk.data(), m, rows.data());
            host->put_rows(hk.data(), m, rows.data(), nullptr);
          }
          const uint64_t hot = std::min(a.rows, static_cast<uint64_t>(std::ceil(f * double(a.rows))));
          for (uint64_t off = 0; off < hot; off += fill) {
            const uint64_t m = std::min(fill, hot - off);
            for (uint64_t i = 0; i < m; ++i) hk[i] = heterps_bench::id_of_rank(off + i, a.rows);
            CK(cudaMemcpy(dk, hk.data(), m * 8, cudaMemcpyHostToDevice));
            CKT(heterps_gpu_table_pull(name, dk, m, dout, nullptr));
          }
        } else {  // every row on the device
          for (uint64_t off = 0; off < a.rows; off += fill) {
            const uint64_t m = std::min(fill, a.rows - off);
            for (uint64_t i = 0; i < m; ++i) hk[i] = static_cast<int64_t>(off + i);
            CK(cudaMemcpy(dk, hk.data(), m * 8, cudaMemcpyHostToDevice));
            CKT(heterps_gpu_table_pull(name, dk, m, dout, nullptr));
          }
        }
        uint64_t st0[4], st1[4];
#ifndef TIER_BENCH_NO_LINK_BYTES
        uint64_t lb0[2] = {0, 0}, lb1[2] = {0, 0};
        double ph0[kPhases] = {}, ph1[kPhases] = {};
#endif
        std::vector<double> ms;
        double total = 0;
        for (int i = 0; i < a.warm + a.steps; ++i) {
          if (i == a.warm) {
            CKT(heterps_gpu_table_stats(name, st0));
#ifndef TIER_BENCH_NO_LINK_BYTES
            CKT(heterps_gpu_table_link_bytes(name, lb0));
            CKT(heterps_gpu_table_phase_seconds(name, ph0, kPhases));
#endif
          }
          CK(cudaMemcpy(dk, batches[i].data(), a.batch * 8, cudaMemcpyHostToDevice));
          CK(cudaDeviceSynchronize());
          const auto t0 = std::chrono::steady_clock::now();
          if (heterps_gpu_table_pull(name, dk, a.batch, dout, nullptr) != 0 ||
              heterps_gpu_table_push(name, dk, a.batch, dg, nullptr) != 0) {
            std::fprintf(stderr, "tier_bench: %s zipf %.2f budget %.4f step %d: %s\n", opt.c_str(), s, f, i,
                         heterps_gpu_last_error());
            ok = false;
            break;
          }
          CK(cudaDeviceSynchronize());
          const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (i >= a.warm) {
            ms.push_back(t * 1e3);
            total += t;
          }
        }
        CKT(heterps_gpu_table_stats(name, st1));
#ifndef TIER_BENCH_NO_LINK_BYTES
        CKT(heterps_gpu_table_link_bytes(name, lb1));
        CKT(heterps_gpu_table_phase_seconds(name, ph1, kPhases));
#endif
        if (ms.size() == size_t(a.steps)) {
          std::sort(ms.begin(), ms.end());
          Result r;
          r.optimizer = opt;
          r.one_step =
              a.one_step && f == step_budget && std::find(a.budgets.begin(), a.budgets.end(), f) == a.budgets.end();
          r.zipf = s;
          r.budget = f;
          r.steps_per_s = a.steps / total;
          r.median_step_ms = ms[ms.size() / 2];
          r.promoted = double(st1[3] - st0[3]) / a.steps;
          r.evicted = double(st1[2] - st0[2]) / a.steps;
          r.rows_moved = r.promoted + r.evicted;
#ifndef TIER_BENCH_NO_LINK_BYTES
          r.link_in = double(lb1[0] - lb0[0]) / a.steps;
          r.link_out = double(lb1[1] - lb0[1]) / a.steps;
          r.link_bytes = r.link_in + r.link_out;
          for (int p = 0; p < kPhases; ++p) r.phase_ms[p] = (ph1[p] - ph0[p]) * 1e3 / a.steps;
#else
          r.link_in = r.promoted * row_link_bytes;
          r.link_out = r.evicted * row_link_bytes;
          r.link_bytes = r.rows_moved * row_link_bytes;
#endif
          r.unique = unique;
          r.device_rows = st1[0];
          results.push_back(r);
          std::fprintf(
              stderr,
              "tier_bench: %s zipf %.2f budget %.4f: %.2f steps/s (median step %.2f ms), %.0f rows moved a step\n",
              opt.c_str(), s, f, r.steps_per_s, r.median_step_ms, r.rows_moved);
        }
        CKT(heterps_gpu_table_drop(name));
        heterps::drop_table(name);
      }
  }
  CK(cudaFree(dk));
  CK(cudaFree(dout));
  CK(cudaFree(dg));

  std::printf(
      "{\n \"device\": \"%s\",\n \"rows\": %llu, \"dim\": %u, \"batch\": %llu, "
      "\"warm_steps\": %d, \"timed_steps\": %d,\n",
      prop.name, (unsigned long long)a.rows, a.dim, (unsigned long long)a.batch, a.warm, a.steps);
#ifdef TIER_BENCH_NO_LINK_BYTES
  std::printf(" \"link_bytes_counted\": false,\n");
#else
  std::printf(" \"link_bytes_counted\": true,\n");
#endif
  std::printf(" \"link_gb_per_s\": {\"h2d\": %.2f, \"d2h\": %.2f},\n \"configs\": [\n", h2d, d2h);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    double resident = 0;
    for (const Result& q : results)
      if (q.zipf == r.zipf && q.optimizer == r.optimizer && q.budget >= 1) resident = q.steps_per_s;
    const double gbps = r.link_bytes * r.steps_per_s / 1e9;
    // the busier direction's share of what a plain page-locked copy moves that way
    const double share = h2d > 0 && d2h > 0
                             ? std::max(r.link_in / 1e9 * r.steps_per_s / h2d, r.link_out / 1e9 * r.steps_per_s / d2h)
                             : 0.0;
    std::printf(
        "  {\"optimizer\": \"%s\", \"one_step_budget\": %s, \"zipf\": %.2f, \"budget\": %.5f, \"steps_per_s\": %.2f, "
        "\"median_step_ms\": %.3f, \"vs_resident\": %.4f, "
        "\"unique_ids_per_batch\": %.0f, \"rows_moved_per_step\": %.0f, \"promoted_per_step\": %.0f, "
        "\"evicted_per_step\": %.0f, \"link_bytes_per_step\": %.0f, \"link_gb_per_s\": %.3f, "
        "\"link_share\": %.4f, \"link_share_h2d\": %.4f, \"link_share_d2h\": %.4f, \"device_rows\": %llu",
        r.optimizer.c_str(), r.one_step ? "true" : "false", r.zipf, r.budget, r.steps_per_s, r.median_step_ms,
        resident > 0 ? r.steps_per_s / resident : 0.0, r.unique, r.rows_moved, r.promoted, r.evicted, r.link_bytes,
        gbps, share, h2d > 0 ? r.link_in / 1e9 * r.steps_per_s / h2d : 0.0,
        d2h > 0 ? r.link_out / 1e9 * r.steps_per_s / d2h : 0.0, (unsigned long long)r.device_rows);
#ifndef TIER_BENCH_NO_LINK_BYTES
    std::printf(", \"host_ms_per_step\": {");
    for (int p = 0; p < kPhases; ++p) std::printf("%s\"%s\": %.3f", p ? ", " : "", kPhaseNames[p], r.phase_ms[p]);
    std::printf("}");
#endif
    std::printf("}%s\n", i + 1 < results.size() ? "," : "");
  }
  std::printf(" ]\n}\n");
  return ok ? 0 : 1;
}
