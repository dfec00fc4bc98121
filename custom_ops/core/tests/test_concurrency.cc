// Several threads pull and push overlapping keys while the budget forces spills and promotions.
// SGD with lr 1, integer gradients and zero init makes every row's final value exactly -(number of
// pushes that touched it), whatever the interleaving: any lost or torn update shows.
// Meanwhile other threads move rows out and back in through the host tier's batch calls (take_rows,
// put_rows), which run each batch's shards on the table's own pool of host_threads workers: every such
// round trip adds 1 to its rows, so those rows end at exactly the number of round trips.
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "check.h"
#include "heterps/table.h"
#include "task_pool.h"  // internal (custom_ops/core/src): the threads of take_rows / put_rows

// The pool itself: run(n, fn) runs every task once, on several threads at once (the tasks below wait for one
// another, so a pool that ran them one after another would fail the check after 10 s instead of hanging), from
// several callers at once, and rethrows a task's exception after every task has run.
static void test_task_pool() {
  heterps::TaskPool pool(4);
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  bool all_met = true;
  std::set<std::thread::id> ids;
  pool.run(4, [&](size_t) {
    std::unique_lock<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
    ++arrived;
    cv.notify_all();
    if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return arrived == 4; })) all_met = false;
  });
  CHECK(all_met && ids.size() == 4);

  std::vector<std::atomic<int>> hits(1000);
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&, c] { pool.run(1000, [&, c](size_t i) { hits[i] += 1 << (8 * c); }); });
  for (auto& t : callers) t.join();
  int wrong = 0;
  for (auto& h : hits) wrong += h.load() != (1 | 1 << 8 | 1 << 16);
  CHECK(wrong == 0);  // every task of every caller exactly once

  std::atomic<int> ran{0};
  CHECK_THROWS_WITH(pool.run(50,
                             [&](size_t i) {
                               ++ran;
                               if (i == 7) throw heterps::TableError("task 7 failed");
                             }),
                    "task 7 failed");
  CHECK(ran.load() == 50);

  heterps::TaskPool inline_pool(1);  // one thread: every task on the caller's
  std::set<std::thread::id> where;
  inline_pool.run(5, [&](size_t) { where.insert(std::this_thread::get_id()); });
  CHECK(where.size() == 1 && *where.begin() == std::this_thread::get_id());
  CHECK(heterps::usable_cpus() >= 1);
}

int main(int argc, char** argv) {
  test_task_pool();
  std::string tmp = argc > 1 ? argv[1] : "/tmp/heterps-test";
  ::mkdir(tmp.c_str(), 0755);
  auto c = heterps::TableConfig::parse("dim=4;optimizer=sgd;lr=1;init_range=0;shards=8;host_threads=3;" +
                                       std::string("memory_budget_bytes=") + std::to_string(300 * 48) +
                                       ";ssd_dir=" + tmp + "/ssd-conc");
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
  // Tier threads: keys of their own range (kTierBase + w * kTierKeys ...), taken in batches with repeats
  // (a repeated key's later copies get the initial row, zeros: only the first copy is put back) and put back
  // with 1 added.
  const int kTierThreads = 2, kTierKeys = 500, kTierRounds = 60;
  const int64_t kTierBase = 1000000;
  std::vector<std::vector<int>> trips(kTierThreads, std::vector<int>(kTierKeys, 0));
  for (int w = 0; w < kTierThreads; ++w) {
    th.emplace_back([&, w] {
      std::mt19937 rng(100 + w);
      for (int r = 0; r < kTierRounds; ++r) {
        std::vector<int64_t> k(200);
        for (auto& x : k) x = kTierBase + w * kTierKeys + static_cast<int64_t>(rng() % kTierKeys);
        std::vector<float> rows(k.size() * 4);
        t.take_rows(k.data(), k.size(), rows.data());
        std::vector<int64_t> back;
        std::vector<float> back_rows;
        std::vector<char> seen(kTierKeys, 0);
        for (size_t i = 0; i < k.size(); ++i) {
          const int64_t local = k[i] - kTierBase - w * kTierKeys;
          if (seen[local]) continue;
          seen[local] = 1;
          ++trips[w][local];
          back.push_back(k[i]);
          for (int j = 0; j < 4; ++j) back_rows.push_back(rows[i * 4 + j] + 1.0f);
        }
        t.put_rows(back.data(), back.size(), back_rows.data(), nullptr);
      }
    });
  }
  for (auto& x : th) x.join();
  CHECK(bad.load() == 0);
  for (int w = 0; w < kTierThreads; ++w) {
    std::vector<int64_t> k(kTierKeys);
    for (int i = 0; i < kTierKeys; ++i) k[i] = kTierBase + w * kTierKeys + i;
    std::vector<float> rows(kTierKeys * 4);
    std::vector<uint8_t> found(kTierKeys);
    t.peek(k.data(), k.size(), rows.data(), found.data());
    for (int i = 0; i < kTierKeys; ++i) {
      if (trips[w][i] == 0) continue;
      CHECK(found[i] != 0 && rows[i * 4] == static_cast<float>(trips[w][i]) && rows[i * 4 + 3] == rows[i * 4]);
    }
  }
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
