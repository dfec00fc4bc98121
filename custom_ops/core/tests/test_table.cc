// Core table tests: determinism, optimizer math, spill/promote, checkpoints, corruption, failed writes.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "heterps/hash.h"
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

// ---- the host tier's batch calls (take_rows / put_rows) ----------------------------------------------------

struct Snapshot {
  std::vector<float> rows;
  std::vector<uint8_t> found;
  uint64_t in_memory, on_ssd, evictions, promotions, compactions, lost;
  bool operator==(const Snapshot& o) const {
    return rows == o.rows && found == o.found && in_memory == o.in_memory && on_ssd == o.on_ssd &&
           evictions == o.evictions && promotions == o.promotions && compactions == o.compactions && lost == o.lost;
  }
};

// Every row of keys [0, n) with where it lives (0 absent, 1 memory, 2 SSD), and the counters eviction moves.
static Snapshot snapshot(SparseTable& t, int64_t n) {
  std::vector<int64_t> k(n);
  for (int64_t i = 0; i < n; ++i) k[i] = i;
  Snapshot s;
  s.rows.resize(size_t(n) * t.config().stride());
  s.found.resize(n);
  t.peek(k.data(), k.size(), s.rows.data(), s.found.data());
  auto st = t.stats();
  s.in_memory = st.rows_in_memory, s.on_ssd = st.rows_on_ssd, s.evictions = st.evictions;
  s.promotions = st.ssd_promotions, s.compactions = st.compactions, s.lost = st.rows_lost;
  return s;
}

static TableConfig tier_config(const std::string& policy, const std::string& name, int threads) {
  // dim 3 Adam: stride 11, 76 bytes a row against the budget; 8 shards, ~600 rows resident.
  return TableConfig::parse("dim=3;optimizer=adam;shards=8;memory_budget_bytes=45600;eviction=" + policy +
                            ";host_threads=" + std::to_string(threads) + ";ssd_dir=" + g_tmp + "/ssd-batch-" + policy +
                            "-" + name);
}

// One round of the host tier's traffic: a batch put (repeated keys: the last row wins; scores given, or
// null for "now") and a batch taken (repeated keys: the row, then the initial row; some keys never put).
struct TierRound {
  std::vector<int64_t> put_keys, take_keys;
  std::vector<float> rows;
  std::vector<uint32_t> scores;
  TierRound(std::mt19937_64& rng, size_t stride, size_t puts, size_t takes, int64_t space) {
    put_keys.resize(puts);
    for (auto& x : put_keys) x = static_cast<int64_t>(rng() % space);
    rows.resize(puts * stride);
    for (auto& x : rows) x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 64.0f;
    scores.resize(puts);
    for (auto& x : scores) x = static_cast<uint32_t>(rng() % 5000);
    take_keys.resize(takes);
    for (auto& x : take_keys) x = static_cast<int64_t>(rng() % (space + space / 8));
  }
};

// The batch path on one thread and on four gives what the same keys put and taken one call each give, in
// the batch's order: the rows handed out, and every row's value and place (memory or SSD) after each batch,
// with a budget that spills and promotes all the time.  (LRU with scores given: one call per key then makes
// the same eviction choices; LFU's spares the rows of the current call, a per-call notion.)
static void test_batch_rows_equal_one_at_a_time() {
  SparseTable one(tier_config("lru", "one", 1)), four(tier_config("lru", "four", 4)),
      each(tier_config("lru", "each", 1));
  const size_t st = one.config().stride();
  const int64_t space = 4000;
  std::mt19937_64 rng(7);
  for (int round = 0; round < 30; ++round) {
    TierRound r(rng, st, 400, 300, space);
    one.put_rows(r.put_keys.data(), r.put_keys.size(), r.rows.data(), r.scores.data());
    four.put_rows(r.put_keys.data(), r.put_keys.size(), r.rows.data(), r.scores.data());
    for (size_t i = 0; i < r.put_keys.size(); ++i)
      each.put_rows(&r.put_keys[i], 1, r.rows.data() + i * st, r.scores.data() + i);
    std::vector<float> a(r.take_keys.size() * st), b(a.size()), c(a.size());
    one.take_rows(r.take_keys.data(), r.take_keys.size(), a.data());
    four.take_rows(r.take_keys.data(), r.take_keys.size(), b.data());
    for (size_t i = 0; i < r.take_keys.size(); ++i) each.take_rows(&r.take_keys[i], 1, c.data() + i * st);
    CHECK(a == b);
    CHECK(a == c);
    Snapshot s1 = snapshot(one, space + space / 8);
    CHECK(s1 == snapshot(four, space + space / 8));
    CHECK(s1 == snapshot(each, space + space / 8));
  }
  auto s = one.stats();
  CHECK(s.evictions > 1000 && s.ssd_promotions > 100 && s.rows_on_ssd > 0);
}

// 1 and 4 threads, either policy, scores given or not: the same rows handed out, the same table after each batch.
static void test_batch_rows_equal_across_threads(const char* policy) {
  SparseTable one(tier_config(policy, "t1", 1)), four(tier_config(policy, "t4", 4));
  const size_t st = one.config().stride();
  const int64_t space = 4000;
  std::mt19937_64 rng(11);
  for (int round = 0; round < 30; ++round) {
    TierRound r(rng, st, 700, 300, space);
    const uint32_t* sc = round % 2 ? nullptr : r.scores.data();
    one.put_rows(r.put_keys.data(), r.put_keys.size(), r.rows.data(), sc);
    four.put_rows(r.put_keys.data(), r.put_keys.size(), r.rows.data(), sc);
    std::vector<float> a(r.take_keys.size() * st), b(a.size());
    one.take_rows(r.take_keys.data(), r.take_keys.size(), a.data());
    four.take_rows(r.take_keys.data(), r.take_keys.size(), b.data());
    CHECK(a == b);
    CHECK(snapshot(one, space + space / 8) == snapshot(four, space + space / 8));
  }
  CHECK(one.stats().evictions > 1000 && one.stats().ssd_promotions > 100);
}

// The table's private spill directory under ssd_dir, and the byte offset of key's record in one of its logs.
static std::string spill_dir(const std::string& ssd_dir) {
  std::string found;
  if (DIR* d = ::opendir(ssd_dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind("heterps-table-", 0) == 0) found = ssd_dir + "/" + e->d_name;
    ::closedir(d);
  }
  return found;
}

// Flips a bit of the row in key's newest record (the live one) in the shard logs of `dir`; false if none.
static bool corrupt_record(const std::string& dir, int64_t key, size_t stride, uint32_t shards) {
  const size_t rb = 16 + stride * 4;
  for (uint32_t s = 0; s < shards; ++s) {
    const std::string file = dir + "/shard-" + std::to_string(s) + ".log";
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    long at = -1;
    for (size_t off = 0; off + rb <= bytes.size(); off += rb) {
      int64_t k;
      std::memcpy(&k, bytes.data() + off, 8);
      if (k == key) at = static_cast<long>(off);
    }
    if (at < 0) continue;
    const int fd = ::open(file.c_str(), O_WRONLY);
    char b = static_cast<char>(bytes[at + 20] ^ 0x10);
    const bool ok = fd >= 0 && ::pwrite(fd, &b, 1, at + 20) == 1;
    if (fd >= 0) ::close(fd);
    return ok;
  }
  return false;
}

// Errors of the batch calls: a reserved key rejects the call before anything changes; take_rows meeting a bad
// spilled record takes nothing (the bad id is lost, as for pull) and names the bad record of the smallest batch
// position, with 1 thread and with 4; put_rows meeting one (compaction) still puts every row of its batch.
static void test_batch_errors() {
  for (int threads : {1, 4}) {
    const std::string ssd = g_tmp + "/ssd-batch-errors-" + std::to_string(threads);
    SparseTable t(TableConfig::parse("dim=2;optimizer=sgd;shards=8;memory_budget_bytes=4000;host_threads=" +
                                     std::to_string(threads) + ";ssd_dir=" + ssd));
    const size_t st = t.config().stride();
    const int64_t n = 1000;
    std::vector<int64_t> k(n);
    std::vector<float> rows(n * st);
    for (int64_t i = 0; i < n; ++i) k[i] = i, rows[i * st] = float(i), rows[i * st + 1] = -float(i);
    t.put_rows(k.data(), n, rows.data(), nullptr);
    Snapshot before = snapshot(t, n);
    CHECK(before.on_ssd > 800);

    std::vector<int64_t> bad_key = {1, 2, INT64_MIN, 3};
    std::vector<float> out(bad_key.size() * st);
    CHECK_THROWS_WITH(t.take_rows(bad_key.data(), bad_key.size(), out.data()), "reserved");
    CHECK_THROWS_WITH(t.put_rows(bad_key.data(), bad_key.size(), rows.data(), nullptr), "reserved");
    CHECK(snapshot(t, n) == before);

    // Two spilled keys of different shards made bad, a resident key, a spilled good one, an absent one.
    std::vector<int64_t> spilled, resident;
    for (int64_t i = 0; i < n; ++i) (before.found[i] == 2 ? spilled : resident).push_back(i);
    const int64_t bad_a = spilled[0], good = spilled[1];
    int64_t bad_b = -1;
    std::vector<int64_t> probe(1);
    for (size_t i = 2; i < spilled.size() && bad_b < 0; ++i) {
      // a different shard: compare the shard the table would pick (the hash's top bits, as shard_of)
      const uint64_t ha = heterps::key_hash(bad_a) >> 61, hb = heterps::key_hash(spilled[i]) >> 61;
      if (ha != hb) bad_b = spilled[i];
    }
    CHECK(bad_b >= 0);
    const std::string dir = spill_dir(ssd);
    CHECK(corrupt_record(dir, bad_a, st, 8) && corrupt_record(dir, bad_b, st, 8));
    std::vector<int64_t> batch = {resident[0], bad_b, good, bad_a, n + 5};
    std::vector<float> got(batch.size() * st, 7.0f);
    CHECK_THROWS_WITH(t.take_rows(batch.data(), batch.size(), got.data()),
                      ("for id " + std::to_string(bad_b) + ": checksum mismatch").c_str());
    Snapshot after = snapshot(t, n);
    for (int64_t i = 0; i < n; ++i) {
      if (i == bad_a || i == bad_b) {
        CHECK(after.found[i] == 0);  // lost: listed, gone from the SSD tier
        continue;
      }
      CHECK(after.found[i] == before.found[i]);  // nothing was taken
      CHECK(std::memcmp(after.rows.data() + i * st, before.rows.data() + i * st, st * 4) == 0);
    }
    CHECK(after.promotions == before.promotions && after.lost == 2 && t.lost().size() == 2);
    t.forget_lost();
    t.take_rows(batch.data(), batch.size(), got.data());  // now fine: the lost ids start afresh
    CHECK(got[0] == float(resident[0]) && got[2 * st] == float(good) && got[2 * st + 1] == -float(good));
  }

  // put_rows: one shard; most spilled records are made dead (taken back), one live record is made bad, and the
  // next batch's eviction compacts the log, meets it and throws, after putting every row of the batch.
  for (int threads : {1, 4}) {
    const std::string ssd = g_tmp + "/ssd-batch-compact-" + std::to_string(threads);
    SparseTable t(TableConfig::parse("dim=2;optimizer=sgd;shards=1;memory_budget_bytes=4000;host_threads=" +
                                     std::to_string(threads) + ";ssd_dir=" + ssd));
    const size_t st = t.config().stride();
    const int64_t n = 6000;
    std::vector<int64_t> k(n);
    std::vector<float> rows(n * st);
    for (int64_t i = 0; i < n; ++i) k[i] = i, rows[i * st] = float(i), rows[i * st + 1] = 1.0f;
    t.put_rows(k.data(), n, rows.data(), nullptr);
    std::vector<float> taken((n - 200) * st);
    t.take_rows(k.data(), n - 200, taken.data());  // dead records: 5800 - the resident ones
    CHECK(t.stats().compactions == 0 && t.stats().rows_on_ssd > 0);
    Snapshot s = snapshot(t, n);
    int64_t victim = -1;
    for (int64_t i = n - 200; i < n && victim < 0; ++i)
      if (s.found[i] == 2) victim = i;
    CHECK(victim >= 0 && corrupt_record(spill_dir(ssd), victim, st, 1));
    std::vector<int64_t> fresh(300);
    std::vector<float> fresh_rows(300 * st);
    for (int i = 0; i < 300; ++i) fresh[i] = 100000 + i, fresh_rows[i * st] = float(i), fresh_rows[i * st + 1] = 2.0f;
    CHECK_THROWS_WITH(t.put_rows(fresh.data(), fresh.size(), fresh_rows.data(), nullptr),
                      ("for id " + std::to_string(victim)).c_str());
    std::vector<float> peeked(300 * st);
    std::vector<uint8_t> where(300);
    t.peek(fresh.data(), fresh.size(), peeked.data(), where.data());
    int missing = 0;
    for (int i = 0; i < 300; ++i) missing += where[i] == 0 || peeked[i * st] != float(i) || peeked[i * st + 1] != 2.0f;
    CHECK(missing == 0);  // every row of the batch is in, in memory or spilled
    CHECK(t.lost().size() == 1 && t.lost()[0].first == victim);
  }
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
  test_batch_rows_equal_one_at_a_time();
  test_batch_rows_equal_across_threads("lru");
  test_batch_rows_equal_across_threads("lfu");
  test_batch_errors();
  std::printf(g_failures ? "FAILED (%d)\n" : "OK\n", g_failures);
  return g_failures ? 1 : 0;
}
