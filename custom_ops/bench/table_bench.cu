// Standalone harness for the CUDA table: checks it against the CPU core (same config, same batches,
// through device evictions to the host tier) and measures find / pull / push throughput.  Prints JSON.
//
//   cmake -S . -B build -DHETERPS_CUDA=ON && cmake --build build -j --target table_bench
//   ./build/bench/table_bench [--rows 8388608] [--batch 1048576] [--dim 8] [--iters 20] [--device 0]
//                             [--zipf 1.05] [--check 1] [--check-dim 8] [--throughput 1] [--tolerance 0]
// --check 0 / --throughput 0 skip a part (the sanitizer runs of custom_ops/bench/gpu_check.sh time nothing).
// The check requires the device rows to equal the CPU core's bit for bit (--tolerance: an absolute and
// relative bound instead).  Exit status 0 only if the check passed (or was skipped) and every timed key
// was found.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_check.h"
#include "gpu_table.h"
#include "heterps/table.h"
#include "zipf_ids.h"

namespace {

struct Args {
  uint64_t rows = 8ull << 20;
  uint64_t batch = 1ull << 20;
  uint32_t dim = 8;
  int iters = 20;
  int device = 0;
  double zipf = 0;  // > 0: also time a batch of Zipf(zipf) ids
  int check = 1, throughput = 1;
  double tolerance = 0;
  uint32_t check_dim = 8;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    uint64_t v = std::strtoull(argv[i + 1], nullptr, 10);
    if (k == "--zipf")
      a.zipf = std::strtod(argv[i + 1], nullptr);
    else if (k == "--tolerance")
      a.tolerance = std::strtod(argv[i + 1], nullptr);
    else if (k == "--check-dim")
      a.check_dim = static_cast<uint32_t>(v);
    else if (k == "--check")
      a.check = static_cast<int>(v);
    else if (k == "--throughput")
      a.throughput = static_cast<int>(v);
    else if (k == "--rows")
      a.rows = v;
    else if (k == "--batch")
      a.batch = v;
    else if (k == "--dim")
      a.dim = static_cast<uint32_t>(v);
    else if (k == "--iters")
      a.iters = static_cast<int>(v);
    else if (k == "--device")
      a.device = static_cast<int>(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

struct CheckResult {
  bool ok = true;
  double max_abs_diff = 0;
  uint64_t values_differing = 0;
  uint64_t evictions = 0, host_rows = 0;
  bool nan_rejected = false;
  std::string failure;
};

// Random batches with duplicates through pull and push on both tables; the device budget holds ~1/4 of
// the keys, so rows travel device -> host -> device repeatedly.
//
// The gradients are multiples of 1/1024 in [-1, 1]: every sum of up to 2^14 of them is exact in float32,
// so the order in which the device adds a repeated id's gradients (atomics: whatever order the threads
// arrive in) cannot change the sum, and with the shared update rules (heterps/update_rules.h, no FMA) every
// device row must equal the CPU core's bit for bit.  A lost, doubled or stale update shows as a difference.
// (With gradients k/1000 the order did matter: Adagrad and Adam step by lr * g / (|g| + eps) on a row's
// first update, so a repeated id whose gradients nearly cancel moved by up to ~lr depending on the order
// of the additions, which is what failed this check intermittently under compute-sanitizer.)
CheckResult check_against_cpu(const char* optimizer, const char* eviction, uint32_t dim, int device, double tolerance) {
  CheckResult r;
  const int64_t keyspace = 20000;
  std::string base =
      "dim=" + std::to_string(dim) + ";optimizer=" + optimizer + ";lr=0.01;seed=7;init_range=0.1;eviction=" + eviction;
  heterps::SparseTable cpu(heterps::TableConfig::parse(base));
  // ~5000 device rows (a slot: key, score, counts and flags 24 bytes, the row padded to 4 floats, the
  // accumulator; two slots a row), so the 20000 ids travel between the device and the host tier.
  std::string name = std::string("check-") + optimizer + "-" + eviction;
  const uint64_t slot = 24 + 4 * ((3 * dim + 2 + 3) & ~3u) + 4 * dim;
  std::string gcfg = base + ";memory_budget_bytes=" + std::to_string(2 * 5000 * slot);
  CKT(heterps_gpu_table_open(name.c_str(), gcfg.c_str(), device));
  std::mt19937_64 rng(42);
  const size_t n = 3000;
  int64_t* dk;
  float *dout, *dg;
  CK(cudaMalloc(&dk, keyspace * 8));
  CK(cudaMalloc(&dout, keyspace * dim * 4));
  CK(cudaMalloc(&dg, n * dim * 4));
  std::vector<int64_t> keys(n);
  std::vector<float> g(n * dim), out_c(keyspace * dim), out_g(keyspace * dim);
  auto compare = [&](size_t m, const char* what) {
    for (size_t i = 0; i < m * dim; ++i) {
      double d = std::fabs(double(out_c[i]) - double(out_g[i]));
      r.max_abs_diff = std::max(r.max_abs_diff, d);
      if (std::memcmp(&out_c[i], &out_g[i], 4) != 0) ++r.values_differing;
      const bool same =
          tolerance > 0 ? d <= tolerance + tolerance * std::fabs(out_c[i]) : std::memcmp(&out_c[i], &out_g[i], 4) == 0;
      if (!same) {
        if (r.ok) r.failure = std::string(what) + ": row " + std::to_string(i / dim) + " differs";
        r.ok = false;
      }
    }
  };
  for (int step = 0; step < 60; ++step) {
    for (auto& k : keys) k = static_cast<int64_t>(rng() % keyspace) - keyspace / 2;
    if (step % 5 == 0)
      for (size_t i = 0; i < n / 3; ++i) keys[i] = keys[0];  // heavy duplicates
    for (auto& x : g) x = static_cast<float>(static_cast<int>(rng() % 2049) - 1024) / 1024.0f;
    CK(cudaMemcpy(dk, keys.data(), n * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dg, g.data(), n * dim * 4, cudaMemcpyHostToDevice));
    cpu.pull(keys.data(), n, out_c.data());
    CKT(heterps_gpu_table_pull(name.c_str(), dk, n, dout, nullptr));
    CK(cudaMemcpy(out_g.data(), dout, n * dim * 4, cudaMemcpyDeviceToHost));
    compare(n, "pull");
    cpu.push(keys.data(), n, g.data());
    CKT(heterps_gpu_table_push(name.c_str(), dk, n, dg, nullptr));
  }
  // NaN: rejected, nothing changes.
  g[5] = NAN;
  CK(cudaMemcpy(dg, g.data(), n * dim * 4, cudaMemcpyHostToDevice));
  r.nan_rejected = heterps_gpu_table_push(name.c_str(), dk, n, dg, nullptr) != 0 &&
                   std::strstr(heterps_gpu_last_error(), "not finite") != nullptr;
  if (!r.nan_rejected) {
    r.ok = false;
    r.failure = "NaN gradient was not rejected";
  }
  // Every key, after all that traffic: the device copy (or its host tier) equals the CPU table.
  std::vector<int64_t> all(keyspace);
  for (int64_t i = 0; i < keyspace; ++i) all[i] = i - keyspace / 2;
  CK(cudaMemcpy(dk, all.data(), keyspace * 8, cudaMemcpyHostToDevice));
  cpu.pull(all.data(), keyspace, out_c.data());
  // in chunks: one batch may not touch more distinct rows than the device budget holds
  for (int64_t off = 0; off < keyspace; off += 4000) {
    int64_t m = std::min<int64_t>(4000, keyspace - off);
    CKT(heterps_gpu_table_pull(name.c_str(), dk + off, m, dout + off * dim, nullptr));
  }
  CK(cudaMemcpy(out_g.data(), dout, keyspace * dim * 4, cudaMemcpyDeviceToHost));
  compare(keyspace, "final rows");
  uint64_t st[4];
  CKT(heterps_gpu_table_stats(name.c_str(), st));
  r.evictions = st[2];
  r.host_rows = st[1];
  if (r.evictions == 0) {
    r.ok = false;
    r.failure = "the check never evicted to the host tier";
  }
  CKT(heterps_gpu_table_drop(name.c_str()));
  cudaFree(dk);
  cudaFree(dout);
  cudaFree(dg);
  return r;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Rates {
  double find = 0, find_hit60 = 0, pull = 0, push = 0;
  uint64_t unique = 0;
  bool all_found = false;
};

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  CK(cudaSetDevice(a.device));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, a.device));

  const char* names[4] = {"sgd", "adagrad", "adam", "adagrad_lfu"};
  CheckResult checks[4];
  bool all_ok = true;
  if (a.check) {
    checks[0] = check_against_cpu("sgd", "lru", a.check_dim, a.device, a.tolerance);
    checks[1] = check_against_cpu("adagrad", "lru", a.check_dim, a.device, a.tolerance);
    checks[2] = check_against_cpu("adam", "lru", a.check_dim, a.device, a.tolerance);
    checks[3] = check_against_cpu("adagrad", "lfu", a.check_dim, a.device, a.tolerance);
    for (auto& c : checks) all_ok = all_ok && c.ok;
  }

  std::printf("{\n \"device\": \"%s\",\n \"sm\": %d%d,\n", prop.name, prop.major, prop.minor);
  if (a.check) {
    std::printf(" \"correctness\": {\"ok\": %s, \"dim\": %u, \"exact\": %s", all_ok ? "true" : "false", a.check_dim,
                a.tolerance > 0 ? "false" : "true");
    for (int i = 0; i < 4; ++i) {
      std::printf(
          ", \"%s\": {\"ok\": %s, \"values_differing\": %llu, \"max_abs_diff\": %.3g, \"evictions_to_host\": %llu, "
          "\"host_rows\": %llu, \"nan_rejected\": %s%s%s%s}",
          names[i], checks[i].ok ? "true" : "false", (unsigned long long)checks[i].values_differing,
          checks[i].max_abs_diff, (unsigned long long)checks[i].evictions, (unsigned long long)checks[i].host_rows,
          checks[i].nan_rejected ? "true" : "false", checks[i].failure.empty() ? "" : ", \"failure\": \"",
          checks[i].failure.c_str(), checks[i].failure.empty() ? "" : "\"");
    }
    std::printf("}%s\n", a.throughput ? "," : "");
  }
  if (!a.throughput) {
    std::printf("}\n");
    return all_ok ? 0 : 1;
  }

  // Throughput: a table of `rows` keys (unlimited device budget), batches of `batch` existing keys.
  std::string cfg = "dim=" + std::to_string(a.dim) + ";optimizer=sgd;lr=0.01;seed=1";
  CKT(heterps_gpu_table_open("bench", cfg.c_str(), a.device));
  int64_t* dk;
  float *dout, *dg;
  uint8_t* dfound;
  const uint64_t fill_batch = std::min<uint64_t>(a.rows, 1ull << 20);
  CK(cudaMalloc(&dk, std::max(a.batch, fill_batch) * 8));
  CK(cudaMalloc(&dout, std::max(a.batch, fill_batch) * a.dim * 4));
  CK(cudaMalloc(&dg, a.batch * a.dim * 4));
  CK(cudaMalloc(&dfound, a.batch));
  std::vector<int64_t> hk(std::max(a.batch, fill_batch));
  for (uint64_t off = 0; off < a.rows; off += fill_batch) {
    uint64_t m = std::min(fill_batch, a.rows - off);
    for (uint64_t i = 0; i < m; ++i) hk[i] = static_cast<int64_t>(off + i);
    CK(cudaMemcpy(dk, hk.data(), m * 8, cudaMemcpyHostToDevice));
    CKT(heterps_gpu_table_pull("bench", dk, m, dout, nullptr));
  }
  {  // small non-zero gradients (timing on zeros proves nothing)
    std::mt19937_64 rng(3);
    std::vector<float> g(a.batch * a.dim);
    for (auto& x : g) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-6f;
    CK(cudaMemcpy(dg, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time_it = [&](auto&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    CK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < a.iters; ++i) {
      CK(cudaEventRecord(e0));
      fn();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    return a.batch / (median(ms) / 1000.0);
  };
  auto measure = [&](const std::vector<int64_t>& ids, uint64_t unique) {
    Rates r;
    r.unique = unique;
    CK(cudaMemcpy(dk, ids.data(), a.batch * 8, cudaMemcpyHostToDevice));
    r.find = time_it([&] { CKT(heterps_gpu_table_find("bench", dk, a.batch, dout, dfound, nullptr)); });
    std::vector<uint8_t> found(a.batch);
    CK(cudaMemcpy(found.data(), dfound, a.batch, cudaMemcpyDeviceToHost));
    uint64_t nfound = 0;
    for (uint8_t f : found) nfound += f;
    r.all_found = nfound == a.batch;
    r.pull = time_it([&] { CKT(heterps_gpu_table_pull("bench", dk, a.batch, dout, nullptr)); });
    r.push = time_it([&] { CKT(heterps_gpu_table_push("bench", dk, a.batch, dg, nullptr)); });
    // find with 60% of the ids present, as HierarchicalKV's benchmark looks them up (absent ids: >= rows)
    std::vector<int64_t> mixed(ids);
    std::mt19937_64 rng(11);
    for (auto& k : mixed)
      if (rng() % 10 >= 6) k = static_cast<int64_t>(a.rows + rng() % a.rows);
    CK(cudaMemcpy(dk, mixed.data(), a.batch * 8, cudaMemcpyHostToDevice));
    r.find_hit60 = time_it([&] { CKT(heterps_gpu_table_find("bench", dk, a.batch, dout, dfound, nullptr)); });
    return r;
  };
  std::mt19937_64 rng(7);
  std::vector<int64_t> uni(a.batch);
  for (auto& k : uni) k = static_cast<int64_t>(rng() % a.rows);
  std::vector<int64_t> sorted(uni);
  std::sort(sorted.begin(), sorted.end());
  const uint64_t uni_unique = std::unique(sorted.begin(), sorted.end()) - sorted.begin();
  const Rates ru = measure(uni, uni_unique);
  Rates rz;
  if (a.zipf > 0) {
    uint64_t zu = 0;
    std::vector<int64_t> z = heterps_bench::zipf_ids(a.rows, a.batch, a.zipf, 9, &zu);
    rz = measure(z, zu);
  }
  auto print_rates = [&](const char* what, const Rates& r) {
    std::printf(
        "  \"%s\": {\"unique_ids\": %llu, \"all_found\": %s, \"find_keys_per_s\": %.4g, "
        "\"find_hit60_keys_per_s\": %.4g, \"pull_keys_per_s\": %.4g, \"push_keys_per_s\": %.4g}",
        what, (unsigned long long)r.unique, r.all_found ? "true" : "false", r.find, r.find_hit60, r.pull, r.push);
  };
  std::printf(" \"throughput\": {\"rows\": %llu, \"batch\": %llu, \"dim\": %u, \"optimizer\": \"sgd\",\n",
              (unsigned long long)a.rows, (unsigned long long)a.batch, a.dim);
  print_rates("uniform", ru);
  if (a.zipf > 0) {
    std::printf(",\n");
    char what[32];
    std::snprintf(what, sizeof what, "zipf_%.2f", a.zipf);
    print_rates(what, rz);
  }
  std::printf("\n }\n}\n");
  CKT(heterps_gpu_table_drop("bench"));
  const bool found_ok = ru.all_found && (a.zipf <= 0 || rz.all_found);
  return all_ok && found_ok ? 0 : 1;
}
