// The host tier's side of the CUDA table's traffic, against this machine's memory: take_rows (promotions) and
// put_rows (evictions) of the CPU core, in GB/s of rows, beside a plain memcpy of the same bytes in the same run
// (one thread and every thread).  The rows go to and come from page-aligned, pre-faulted staging buffers, as the
// device table's page-locked ones are.  A PCIe Gen5 x16 link moves ~50 GB/s each way (55 GB/s measured on the
// H100 host): the host side keeps up with the link when take and put each reach the link's rate.  Prints JSON.
//
//   cmake --build build --target host_tier_bench && ./build/bench/host_tier_bench [--rows 1048576]
//       [--batch 131072] [--dim 64] [--optimizer sgd] [--threads 1,0] [--batches 7]
//
// Each thread count (0 = every usable CPU) builds its own table of `rows` rows (in memory, no budget); a batch
// takes `batch` distinct uniform ids out and puts them back (what a device evicts and misses is spread over the
// cold rows).  The thread counts and the memcpy run interleaved batch by batch, so a shared machine's load hits
// them alike; medians over the batches.  Exit 1 if the tables end different from the 1-thread one.
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "heterps/table.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint32_t usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// Page-aligned and touched once: what cudaHostAlloc hands out (page-locked memory is resident).
struct Staging {
  float* p = nullptr;
  size_t bytes = 0;
  explicit Staging(size_t b) : bytes(b) {
    void* m = mmap(nullptr, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "host_tier_bench: mmap of %zu bytes failed\n", b);
      std::exit(2);
    }
    p = static_cast<float*>(m);
    std::memset(p, 1, b);
  }
  ~Staging() { munmap(p, bytes); }
};

// memcpy of `bytes` from src to dst on `threads` threads, each its own contiguous part.
double memcpy_seconds(const char* src, char* dst, size_t bytes, uint32_t threads) {
  const auto t0 = Clock::now();
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
  } else {
    std::vector<std::thread> pool;
    const size_t part = (bytes / threads + 63) & ~size_t(63);
    for (uint32_t t = 0; t < threads; ++t) {
      const size_t off = std::min(bytes, t * part), n = std::min(part, bytes - off);
      pool.emplace_back([=] { std::memcpy(dst + off, src + off, n); });
    }
    for (auto& th : pool) th.join();
  }
  return seconds_since(t0);
}

std::vector<uint32_t> thread_list(const char* s) {
  std::vector<uint32_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v > 1024) {
      std::fprintf(stderr, "host_tier_bench: --threads: '%s' is not a thread count (0 = every CPU)\n", item.c_str());
      std::exit(2);
    }
    out.push_back(v == 0 ? usable_cpus() : uint32_t(v));
  }
  if (std::find(out.begin(), out.end(), 1u) == out.end()) out.insert(out.begin(), 1u);  // the baseline
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t rows = 1ull << 20, batch = 1ull << 17;
  uint32_t dim = 64;
  std::string optimizer = "sgd";
  std::vector<uint32_t> threads = thread_list("1,0");
  int batches = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--rows")
      rows = std::strtoull(v, nullptr, 10);
    else if (k == "--batch")
      batch = std::strtoull(v, nullptr, 10);
    else if (k == "--dim")
      dim = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
    else if (k == "--optimizer")
      optimizer = v;
    else if (k == "--threads")
      threads = thread_list(v);
    else if (k == "--batches")
      batches = std::atoi(v);
    else {
      std::fprintf(stderr, "host_tier_bench: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (rows == 0 || batch == 0 || batch > rows || dim == 0 || batches < 1) {
    std::fprintf(stderr, "host_tier_bench: need 0 < --batch <= --rows, --dim > 0, --batches > 0\n");
    return 2;
  }
  std::vector<std::shared_ptr<heterps::SparseTable>> tables;
  heterps::TableConfig cfg;
  try {
    for (uint32_t t : threads) {
      cfg = heterps::TableConfig::parse("dim=" + std::to_string(dim) + ";optimizer=" + optimizer +
                                        ";seed=1;host_threads=" + std::to_string(t));
      tables.push_back(std::make_shared<heterps::SparseTable>(cfg));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host_tier_bench: %s\n", e.what());
    return 2;
  }
  const size_t stride = cfg.stride(), row_bytes = stride * 4, bytes = batch * row_bytes;
  Staging staging(bytes), copy_to(bytes);
  {  // every table holds every row (their initial values)
    std::vector<int64_t> k(batch);
    for (auto& t : tables)
      for (uint64_t off = 0; off < rows; off += batch) {
        const uint64_t n = std::min(batch, rows - off);
        for (uint64_t i = 0; i < n; ++i) k[i] = int64_t(off + i);
        t->take_rows(k.data(), n, staging.p);
        t->put_rows(k.data(), n, staging.p, nullptr);
      }
  }
  std::mt19937_64 rng(7);
  std::vector<int64_t> all(rows);
  for (uint64_t i = 0; i < rows; ++i) all[i] = int64_t(i);
  const uint32_t cpus = usable_cpus();
  std::vector<std::vector<double>> take(threads.size()), put(threads.size());
  std::vector<double> copy1, copy_all;
  for (int b = 0; b < batches + 1; ++b) {  // the first batch warms up
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int64_t> ids(all.begin(), all.begin() + batch);
    const double c1 =
        memcpy_seconds(reinterpret_cast<const char*>(staging.p), reinterpret_cast<char*>(copy_to.p), bytes, 1);
    const double cn =
        memcpy_seconds(reinterpret_cast<const char*>(staging.p), reinterpret_cast<char*>(copy_to.p), bytes, cpus);
    if (b > 0) copy1.push_back(c1), copy_all.push_back(cn);
    for (size_t t = 0; t < threads.size(); ++t) {
      auto t0 = Clock::now();
      tables[t]->take_rows(ids.data(), batch, staging.p);
      const double tk = seconds_since(t0);
      t0 = Clock::now();
      tables[t]->put_rows(ids.data(), batch, staging.p, nullptr);
      const double pt = seconds_since(t0);
      if (b > 0) take[t].push_back(tk), put[t].push_back(pt);
    }
  }
  // the tables end equal (the thread count never changes a result)
  bool same = true;
  {
    std::vector<float> a(batch * stride), c(batch * stride);
    std::vector<uint8_t> fa(batch), fc(batch);
    for (uint64_t off = 0; off < rows && same; off += batch) {
      const uint64_t n = std::min(batch, rows - off);
      std::vector<int64_t> k(n);
      for (uint64_t i = 0; i < n; ++i) k[i] = int64_t(off + i);
      tables[0]->peek(k.data(), n, a.data(), fa.data());
      for (size_t t = 1; t < tables.size(); ++t) {
        tables[t]->peek(k.data(), n, c.data(), fc.data());
        same = same && fa == fc && std::memcmp(a.data(), c.data(), n * row_bytes) == 0;
      }
    }
  }
  const double gb = double(bytes) / 1e9;
  const double m1 = gb / median(copy1), mn = gb / median(copy_all);
  std::printf(
      "{\n \"rows\": %llu, \"batch\": %llu, \"dim\": %u, \"optimizer\": \"%s\", \"row_bytes\": %zu, "
      "\"batches\": %d, \"cpus\": %u,\n",
      (unsigned long long)rows, (unsigned long long)batch, dim, optimizer.c_str(), row_bytes, batches, cpus);
  std::printf(" \"memcpy_gb_per_s\": {\"1_thread\": %.2f, \"all_threads\": %.2f},\n \"tables_equal\": %s,\n", m1, mn,
              same ? "true" : "false");
  std::printf(" \"host_tier\": [\n");
  for (size_t t = 0; t < threads.size(); ++t) {
    const double tk = gb / median(take[t]), pt = gb / median(put[t]);
    const double mem = threads[t] > 1 ? mn : m1;
    std::printf(
        "  {\"threads\": %u, \"take_gb_per_s\": %.2f, \"put_gb_per_s\": %.2f, \"take_rows_per_s\": %.0f, "
        "\"put_rows_per_s\": %.0f, \"take_vs_memcpy\": %.3f, \"put_vs_memcpy\": %.3f, "
        "\"take_vs_1_thread\": %.2f, \"put_vs_1_thread\": %.2f, \"take_vs_50_gb_link\": %.3f, "
        "\"put_vs_50_gb_link\": %.3f}%s\n",
        threads[t], tk, pt, double(batch) / median(take[t]), double(batch) / median(put[t]), tk / mem, pt / mem,
        median(take[0]) / median(take[t]), median(put[0]) / median(put[t]), tk / 50.0, pt / 50.0,
        t + 1 < threads.size() ? "," : "");
  }
  std::printf(" ]\n}\n");
  return same ? 0 : 1;
}
