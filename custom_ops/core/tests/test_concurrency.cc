// Several threads pull and push overlapping keys while the budget forces spills and promotions.
// SGD with lr 1, integer gradients and zero init makes every row's final value exactly -(number of
// pushes that touched it), whatever the interleaving: any lost or torn update shows.
#include <sys/stat.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "check.h"
#include "heterps/table.h"

int main(int argc, char** argv) {
  std::string tmp = argc > 1 ? argv[1] : "/tmp/heterps-test";
  ::mkdir(tmp.c_str(), 0755);
  auto c = heterps::TableConfig::parse("dim=4;optimizer=sgd;lr=1;init_range=0;shards=8;memory_budget_bytes=" +
                                       std::to_string(300 * 48) + ";ssd_dir=" + tmp + "/ssd-conc");
  heterps::SparseTable t(c);
  const int kThreads = 4, kSteps = 600, kKeys = 2000;
  std::vector<std::vector<int>> counts(kThreads, std::vector<int>(kKeys, 0));
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (int w = 0; w < kThreads; ++w) {
    th.emplace_back([&, w] {
      std::mt19937 rng(w);
      std::vector<int64_t> k(64);
      std::vector<float> g(64 * 4, 1.0f), out(64 * 4);
      for (int s = 0; s < kSteps; ++s) {
        for (auto& x : k) x = static_cast<int64_t>(rng() % kKeys);
        if (s % 2) {
          t.push(k.data(), k.size(), g.data());
          for (auto x : k) ++counts[w][x];
        } else {
          t.pull(k.data(), k.size(), out.data());
          for (size_t i = 0; i < out.size(); i += 4)
            if (out[i] != out[i + 1] || out[i] > 0) ++bad;  // a row is always whole
        }
        if (s % 50 == 0) (void)t.stats();
      }
    });
  }
  for (auto& x : th) x.join();
  CHECK(bad.load() == 0);
  std::vector<int64_t> all(kKeys);
  for (int i = 0; i < kKeys; ++i) all[i] = i;
  std::vector<float> out(kKeys * 4);
  t.pull(all.data(), kKeys, out.data());
  for (int i = 0; i < kKeys; ++i) {
    int total = 0;
    for (int w = 0; w < kThreads; ++w) total += counts[w][i];
    CHECK(out[i * 4] == -static_cast<float>(total));
  }
  auto s = t.stats();
  CHECK(s.evictions > 0 && s.ssd_promotions > 0);
  std::printf(g_failures ? "FAILED (%d)\n" : "OK\n", g_failures);
  return g_failures ? 1 : 0;
}
