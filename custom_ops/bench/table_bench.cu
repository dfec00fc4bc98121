// Standalone harness for the CUDA table: checks it against the CPU core (same config, same batches,
// through device evictions to the host tier) and measures find / pull / push throughput.  Prints JSON.
//
//   cmake -S . -B build -DHETERPS_CUDA=ON && cmake --build build -j --target table_bench
//   ./build/bench/table_bench [--rows 8388608] [--batch 1048576] [--dim 8] [--iters 20] [--device 0]
// Exit status 0 only if the correctness check passed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_table.h"
#include "heterps/table.h"

namespace {

#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                                 \
    }                                                                                               \
  } while (0)
#define CKT(x)                                                                                         \
  do {                                                                                                 \
    if ((x) != 0) {                                                                                    \
      std::fprintf(stderr, "table error: %s (%s:%d)\n", heterps_gpu_last_error(), __FILE__, __LINE__); \
      std::exit(2);                                                                                    \
    }                                                                                                  \
  } while (0)

struct Args {
  uint64_t rows = 8ull << 20;
  uint64_t batch = 1ull << 20;
  uint32_t dim = 8;
  int iters = 20;
  int device = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    uint64_t v = std::strtoull(argv[i + 1], nullptr, 10);
    if (k == "--rows")
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
  uint64_t evictions = 0, host_rows = 0;
  bool nan_rejected = false;
  std::string failure;
};

// Random batches with duplicates through pull and push on both tables; the device budget holds ~1/4 of
// the keys, so rows travel device -> host -> device repeatedly.
CheckResult check_against_cpu(const char* optimizer, int device) {
  CheckResult r;
  const uint32_t dim = 8;
  const int64_t keyspace = 20000;
  std::string base = std::string("dim=8;optimizer=") + optimizer + ";lr=0.01;seed=7;init_range=0.1";
  heterps::SparseTable cpu(heterps::TableConfig::parse(base));
  // slot bytes for dim 8: key 8 + score/flags 12 + row (padded stride) + accum 32
  std::string name = std::string("check-") + optimizer;
  std::string gcfg = base + ";memory_budget_bytes=" + std::to_string(2 * 5000 * (8 + 12 + 4 * 28 + 32));
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
      if (!(d <= 1e-4 + 1e-4 * std::fabs(out_c[i]))) {
        if (r.ok) r.failure = std::string(what) + ": row " + std::to_string(i / dim) + " differs";
        r.ok = false;
      }
    }
  };
  for (int step = 0; step < 60; ++step) {
    for (auto& k : keys) k = static_cast<int64_t>(rng() % keyspace) - keyspace / 2;
    if (step % 5 == 0)
      for (size_t i = 0; i < n / 3; ++i) keys[i] = keys[0];  // heavy duplicates
    for (auto& x : g) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.0f;
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

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  CK(cudaSetDevice(a.device));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, a.device));

  CheckResult checks[3] = {check_against_cpu("sgd", a.device), check_against_cpu("adagrad", a.device),
                           check_against_cpu("adam", a.device)};
  bool all_ok = checks[0].ok && checks[1].ok && checks[2].ok;

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
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < a.batch; ++i) hk[i] = static_cast<int64_t>(rng() % a.rows);
  CK(cudaMemcpy(dk, hk.data(), a.batch * 8, cudaMemcpyHostToDevice));
  CK(cudaMemset(dg, 0, a.batch * a.dim * 4));
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
  double find_rate = time_it([&] { CKT(heterps_gpu_table_find("bench", dk, a.batch, dout, dfound, nullptr)); });
  std::vector<uint8_t> found(a.batch);
  CK(cudaMemcpy(found.data(), dfound, a.batch, cudaMemcpyDeviceToHost));
  uint64_t nfound = 0;
  for (uint8_t f : found) nfound += f;
  double pull_rate = time_it([&] { CKT(heterps_gpu_table_pull("bench", dk, a.batch, dout, nullptr)); });
  double push_rate = time_it([&] { CKT(heterps_gpu_table_push("bench", dk, a.batch, dg, nullptr)); });

  std::printf("{\n \"device\": \"%s\",\n \"sm\": %d%d,\n", prop.name, prop.major, prop.minor);
  std::printf(" \"correctness\": {\"ok\": %s", all_ok ? "true" : "false");
  const char* names[3] = {"sgd", "adagrad", "adam"};
  for (int i = 0; i < 3; ++i) {
    std::printf(
        ", \"%s\": {\"ok\": %s, \"max_abs_diff\": %.3g, \"evictions_to_host\": %llu, \"host_rows\": %llu, "
        "\"nan_rejected\": %s%s%s%s}",
        names[i], checks[i].ok ? "true" : "false", checks[i].max_abs_diff, (unsigned long long)checks[i].evictions,
        (unsigned long long)checks[i].host_rows, checks[i].nan_rejected ? "true" : "false",
        checks[i].failure.empty() ? "" : ", \"failure\": \"", checks[i].failure.c_str(),
        checks[i].failure.empty() ? "" : "\"");
  }
  std::printf(
      "},\n \"throughput\": {\"rows\": %llu, \"batch\": %llu, \"dim\": %u, \"all_found\": %s, "
      "\"find_keys_per_s\": %.4g, \"pull_keys_per_s\": %.4g, \"push_keys_per_s\": %.4g, "
      "\"target_find_keys_per_s\": 2e9, \"find_target_met\": %s}\n}\n",
      (unsigned long long)a.rows, (unsigned long long)a.batch, a.dim, nfound == a.batch ? "true" : "false", find_rate,
      pull_rate, push_rate, find_rate >= 2e9 ? "true" : "false");
  CKT(heterps_gpu_table_drop("bench"));
  return all_ok && nfound == a.batch ? 0 : 1;
}
