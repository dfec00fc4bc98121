// Core table tests: determinism, optimizer math, spill/promote, checkpoints, corruption, failed writes.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "check.h"
#include "heterps/table.h"

using heterps::SparseTable;
using heterps::TableConfig;

static std::string g_tmp;

static std::vector<float> pull(SparseTable& t, const std::vector<int64_t>& k) {
  std::vector<float> out(k.size() * t.config().dim);
  t.pull(k.data(), k.size(), out.data());
  return out;
}

static void test_deterministic_init() {
  auto c = TableConfig::parse("dim=8;optimizer=sgd;seed=42;init_range=0.5");
  SparseTable a(c), b(c);
  std::vector<int64_t> k1 = {5, -3, 1LL << 40, 7}, k2 = {7, 1LL << 40, -3, 5};
  auto x = pull(a, k1), y = pull(b, k2);
  for (int j = 0; j < 8; ++j) {
    CHECK(x[0 * 8 + j] == y[3 * 8 + j]);  // order of first touch does not matter
    CHECK(x[1 * 8 + j] == y[2 * 8 + j]);
    CHECK(std::fabs(x[j]) <= 0.5f);
  }
  CHECK(std::memcmp(x.data(), x.data() + 8, 32) != 0);  // different keys, different rows
  auto c2 = TableConfig::parse("dim=8;optimizer=sgd;seed=43;init_range=0.5");
  SparseTable d(c2);
  CHECK(pull(d, k1)[0] != x[0]);  // the seed matters
  CHECK(a.size() == 4);
}

static void test_sgd_and_duplicates() {
  SparseTable t(TableConfig::parse("dim=2;optimizer=sgd;lr=0.5;init_range=0"));
  std::vector<int64_t> k = {1, 1, 2};
  std::vector<float> g = {1, 2, 3, 4, 10, 20};
  t.push(k.data(), 3, g.data());
  auto w = pull(t, {1, 2});
  CHECK(w[0] == -2.0f && w[1] == -3.0f);  // summed: (4, 6) * 0.5
  CHECK(w[2] == -5.0f && w[3] == -10.0f);
}

static void test_adam_matches_formula() {
  SparseTable t(TableConfig::parse("dim=1;optimizer=adam;lr=0.1;init_range=0;epsilon=1e-8"));
  int64_t k = 9;
  float g = 0.5f;
  double m = 0, v = 0, w = 0, b1p = 1, b2p = 1;
  for (int s = 0; s < 5; ++s) {
    t.push(&k, 1, &g);
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    b1p *= 0.9;
    b2p *= 0.999;
    w -= 0.1 * (m / (1 - b1p)) / (std::sqrt(v / (1 - b2p)) + 1e-8);
  }
  float got;
  t.pull(&k, 1, &got);
  CHECK(std::fabs(got - w) < 1e-5);
}

static void test_nan_rejected() {
  SparseTable t(TableConfig::parse("dim=2;optimizer=adagrad"));
  std::vector<int64_t> k = {1, 2};
  auto before = pull(t, k);
  std::vector<float> g = {1, 1, 1, NAN};
  CHECK_THROWS_WITH(t.push(k.data(), 2, g.data()), "not finite");
  CHECK(pull(t, k) == before);
  std::vector<float> big = {3e38f, 0, 0, 0};
  std::vector<int64_t> dup = {1, 1};
  CHECK_THROWS_WITH(t.push(dup.data(), 2, (big.insert(big.begin() + 2, 3e38f), big.data())), "not finite");
  CHECK(pull(t, k) == before);
  int64_t bad = INT64_MIN;
  float out[2];
  CHECK_THROWS_WITH(t.pull(&bad, 1, out), "reserved");
  CHECK_THROWS_WITH(TableConfig::parse("dim=0"), "dim");
  CHECK_THROWS_WITH(TableConfig::parse("optimizer=rmsprop"), "optimizer");
  CHECK_THROWS_WITH(SparseTable(TableConfig::parse("memory_budget_bytes=100")), "ssd_dir");
}

static void test_spill_and_promote(const char* policy) {
  std::string dir = g_tmp + "/ssd-" + policy;
  // 8 shards, budget for ~800 rows of dim 4 adam (stride 14 -> 56 + 32 bytes)
  auto c = TableConfig::parse(std::string("dim=4;optimizer=adam;lr=0.01;shards=8;memory_budget_bytes=70400;ssd_dir=") +
                              dir + ";eviction=" + policy);
  SparseTable t(c);
  SparseTable ref(TableConfig::parse("dim=4;optimizer=adam;lr=0.01;shards=8"));
  std::mt19937_64 rng(1);
  for (int step = 0; step < 60; ++step) {
    std::vector<int64_t> k(200);
    for (auto& x : k) x = static_cast<int64_t>(rng() % 5000);
    std::vector<float> g(k.size() * 4);
    for (auto& x : g) x = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 100.0f;
    t.push(k.data(), k.size(), g.data());
    ref.push(k.data(), k.size(), g.data());
  }
  auto s = t.stats();
  CHECK(s.rows_on_ssd > 0);
  CHECK(s.evictions > 0);
  CHECK(s.rows_in_memory <= s.capacity_rows);
  CHECK(s.rows_in_memory + s.rows_on_ssd == ref.size());
  std::vector<int64_t> all(5000);
  for (int i = 0; i < 5000; ++i) all[i] = i;
  CHECK(pull(t, all) == pull(ref, all));  // promoted rows carry their optimizer state intact
  CHECK(t.stats().ssd_promotions > 0);
  // The SSD tier is private to the table and removed with it.
  struct stat st;
  CHECK(::stat(dir.c_str(), &st) == 0);
}

static void test_lfu_keeps_frequent_rows() {
  std::string dir = g_tmp + "/ssd-lfu2";
  auto c = TableConfig::parse("dim=4;optimizer=sgd;shards=1;eviction=lfu;memory_budget_bytes=" +
                              std::to_string(100 * (16 + 32)) + ";ssd_dir=" + dir);
  SparseTable t(c);
  std::vector<int64_t> hot = {1, 2, 3};
  std::vector<float> out(3 * 4);
  for (int i = 0; i < 50; ++i) t.pull(hot.data(), 3, out.data());
  for (int64_t k = 100; k < 400; ++k) t.pull(&k, 1, out.data());
  std::vector<float> rows(3 * 4);
  uint8_t found[3];
  t.peek(hot.data(), 3, rows.data(), found);
  CHECK(found[0] == 1 && found[1] == 1 && found[2] == 1);  // still resident
}

// LFU spares the rows the current call uses: a batch of new (count 1) rows that fits the budget must not
// push itself out to SSD while older, more frequent rows are there to evict.
static void test_lfu_spares_current_batch() {
  std::string dir = g_tmp + "/ssd-lfu3";
  auto c = TableConfig::parse("dim=4;optimizer=sgd;shards=1;eviction=lfu;memory_budget_bytes=" +
                              std::to_string(200 * (16 + 32)) + ";ssd_dir=" + dir);
  SparseTable t(c);
  std::vector<int64_t> old(150), batch(100);
  for (int i = 0; i < 150; ++i) old[i] = i;
  for (int i = 0; i < 100; ++i) batch[i] = 1000 + i;
  std::vector<float> out(150 * 4);
  for (int r = 0; r < 5; ++r) t.pull(old.data(), old.size(), out.data());
  t.pull(batch.data(), batch.size(), out.data());  // needs evictions: must take old rows, not these
  uint64_t promoted = t.stats().ssd_promotions;
  t.pull(batch.data(), batch.size(), out.data());
  CHECK(t.stats().ssd_promotions == promoted);
  CHECK(t.stats().evictions > 0);
}

static void test_save_load_and_corruption() {
  std::string dir = g_tmp + "/ckpt";
  ::mkdir(dir.c_str(), 0755);
  auto c = TableConfig::parse(
      "dim=3;optimizer=adagrad;lr=0.1;seed=3;shards=4;memory_budget_bytes=4000;ssd_dir=" + g_tmp + "/ssd-ckpt");
  SparseTable t(c);
  std::vector<int64_t> k(300);
  for (int i = 0; i < 300; ++i) k[i] = i * 7 - 100;
  std::vector<float> g(300 * 3, 0.25f);
  t.push(k.data(), k.size(), g.data());
  CHECK(t.stats().rows_on_ssd > 0);
  std::string path = dir + "/t.bin";
  t.save(path);
  SparseTable u(c);
  u.load(path);
  std::vector<float> a(300 * 9), b(300 * 9);
  std::vector<uint8_t> fa(300), fb(300);
  t.peek(k.data(), 300, a.data(), fa.data());
  u.peek(k.data(), 300, b.data(), fb.data());
  CHECK(a == b);  // weights and optimizer state

  // Corruption: flip one byte in the middle; truncate; wrong magic; wrong dim.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::string bad = bytes;
  bad[bad.size() / 2] ^= 0x40;
  std::ofstream(dir + "/flip.bin", std::ios::binary) << bad;
  CHECK_THROWS_WITH(u.load(dir + "/flip.bin"), "flip.bin' is corrupted");
  std::ofstream(dir + "/short.bin", std::ios::binary) << bytes.substr(0, bytes.size() - 20);
  CHECK_THROWS_WITH(u.load(dir + "/short.bin"), "short.bin' is truncated");
  std::ofstream(dir + "/junk.bin", std::ios::binary) << std::string(200, 'x');
  CHECK_THROWS_WITH(u.load(dir + "/junk.bin"), "not a heterps");
  SparseTable other(TableConfig::parse("dim=4;optimizer=adagrad"));
  CHECK_THROWS_WITH(other.load(path), "dim 3");
  u.peek(k.data(), 300, b.data(), fb.data());
  CHECK(a == b);  // failed loads left the table as it was

  // Failed write during save: error names the temp file, the old checkpoint survives intact.
  t.push(k.data(), 1, g.data());
  SparseTable::inject_write_failure_after(1);
  CHECK_THROWS_WITH(t.save(path), ".tmp.");
  SparseTable::inject_write_failure_after(0);
  SparseTable w(c);
  w.load(path);
  w.peek(k.data(), 300, b.data(), fb.data());
  CHECK(a == b);
  CHECK(::access((path + ".tmp." + std::to_string(::getpid())).c_str(), F_OK) != 0);
}

static void test_failed_spill_keeps_rows() {
  auto c = TableConfig::parse("dim=2;optimizer=sgd;lr=1;init_range=0;shards=1;memory_budget_bytes=" +
                              std::to_string(50 * 40) + ";ssd_dir=" + g_tmp + "/ssd-full");
  SparseTable t(c);
  SparseTable::inject_write_failure_after(1);
  std::vector<int64_t> k(400);
  for (int i = 0; i < 400; ++i) k[i] = i;
  std::vector<float> g(800, 1.0f);
  t.push(k.data(), 400, g.data());
  SparseTable::inject_write_failure_after(0);
  auto s = t.stats();
  CHECK(s.spill_errors > 0);
  CHECK(s.rows_in_memory + s.rows_on_ssd == 400);
  auto w = pull(t, k);
  for (float x : w) CHECK(x == -1.0f);  // every update kept
  // With the disk "freed", spilling resumes and values survive.
  for (int i = 0; i < 400; ++i) k[i] = 1000 + i;
  t.push(k.data(), 400, g.data());
  CHECK(t.stats().rows_in_memory <= 2 * t.stats().capacity_rows);
  std::vector<int64_t> first(400);
  for (int i = 0; i < 400; ++i) first[i] = i;
  for (float x : pull(t, first)) CHECK(x == -1.0f);
}

static void test_compaction() {
  auto c = TableConfig::parse("dim=2;optimizer=sgd;lr=1;init_range=0;shards=1;memory_budget_bytes=" +
                              std::to_string(500 * 40) + ";ssd_dir=" + g_tmp + "/ssd-compact");
  SparseTable t(c);
  std::vector<int64_t> k(2000);
  std::vector<float> g(4000, 1.0f);
  for (int round = 0; round < 8; ++round) {
    for (int i = 0; i < 2000; ++i) k[i] = i;
    t.push(k.data(), 2000, g.data());
  }
  CHECK(t.stats().compactions > 0);
  for (float x : pull(t, k)) CHECK(x == -8.0f);
}

// One shard, 4-byte rows: 700k rows span the doubling blocks and two 2 MiB huge-page blocks of the arena.
static void test_arena_across_block_kinds() {
  SparseTable t(TableConfig::parse("dim=1;optimizer=sgd;lr=1;init_range=0;shards=1"));
  const int64_t n = 700000;
  std::vector<int64_t> k(n);
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) {
    k[i] = i * 3 + 1;
    g[i] = static_cast<float>(i % 1000) + 0.5f;
  }
  t.push(k.data(), n, g.data());
  std::vector<float> w(n);
  t.pull(k.data(), n, w.data());
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += w[i] != -g[i];
  CHECK(bad == 0);
  CHECK(t.stats().bytes_in_memory >= uint64_t(n) * 4);
}

int main(int argc, char** argv) {
  g_tmp = argc > 1 ? argv[1] : "/tmp/heterps-test";
  ::mkdir(g_tmp.c_str(), 0755);
  test_deterministic_init();
  test_sgd_and_duplicates();
  test_adam_matches_formula();
  test_nan_rejected();
  test_spill_and_promote("lru");
  test_spill_and_promote("lfu");
  test_lfu_keeps_frequent_rows();
  test_lfu_spares_current_batch();
  test_save_load_and_corruption();
  test_failed_spill_keeps_rows();
  test_compaction();
  test_arena_across_block_kinds();
  std::printf(g_failures ? "FAILED (%d)\n" : "OK\n", g_failures);
  return g_failures ? 1 : 0;
}
