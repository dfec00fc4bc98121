// heterps sparse table: int64 keys -> fixed-dim float32 rows with optimizer state.
//
// Framework-free (no Paddle headers): the Paddle ops, the ctypes binding and the C++ tests all sit on
// this one class.  Layout and policies are described in docs/sparse-table.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "heterps/update_rules.h"  // Optimizer, and the update rules the CPU and CUDA tables share

namespace heterps {

enum class EvictPolicy : uint32_t { kLRU = 0, kLFU = 1 };

// Every user-caused problem (bad config, bad ids, NaN gradient, corrupted checkpoint, failed write)
// is a TableError with a message that names the offending thing.
class TableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TableConfig {
  uint32_t dim = 8;
  Optimizer optimizer = Optimizer::kAdagrad;
  float lr = 0.01f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  // Rows start uniform in [-init_range, init_range), drawn from a hash of (seed, key, column): the same
  // in every process and independent of insertion order.
  float init_range = 0.01f;
  uint64_t seed = 0;
  // 0 = unlimited.  Otherwise resident rows are capped at budget / row_cost_bytes() and the coldest
  // rows are written to ssd_dir.
  uint64_t memory_budget_bytes = 0;
  // Only for the GPU table: memory_budget_bytes bounds device memory, this its host tier (0 = unlimited).
  uint64_t host_memory_budget_bytes = 0;
  std::string ssd_dir;
  EvictPolicy eviction = EvictPolicy::kLRU;
  uint32_t shards = 16;
  // > 0: each (summed) gradient value is clipped to [-grad_clip, grad_clip] before the update, for users
  // who prefer clipping to push's error on an update that would make a row non-finite.  0 = off.
  float grad_clip = 0.0f;
  // Threads of the host tier's batch calls (take_rows, put_rows: what the GPU table's promotions and
  // evictions cost on the host): 0 = every CPU this process may use (sched_getaffinity), 1 = the calling
  // thread only.  Results do not depend on it.
  uint32_t host_threads = 0;

  // "dim=8;optimizer=adam;lr=0.01;...": one textual form shared by the C API and the Paddle op
  // attribute, so a table is described identically everywhere.
  static TableConfig parse(const std::string& text);
  std::string to_string() const;
  void validate() const;

  uint32_t state_dim() const;                            // optimizer floats per row
  uint32_t stride() const { return dim + state_dim(); }  // floats per stored row
  uint64_t row_cost_bytes() const;                       // what one resident row counts against the budget
};

class TaskPool;

struct TableStats {
  uint64_t rows_in_memory = 0;
  uint64_t rows_on_ssd = 0;
  uint64_t hits = 0;    // key found resident
  uint64_t misses = 0;  // key not resident (new row created or promoted from SSD)
  uint64_t ssd_promotions = 0;
  uint64_t evictions = 0;        // rows written to SSD
  uint64_t bytes_in_memory = 0;  // resident rows + their index (what the budget bounds)
  uint64_t bytes_on_ssd = 0;
  uint64_t spill_errors = 0;  // failed SSD writes (rows kept resident over budget)
  uint64_t memory_budget_bytes = 0;
  uint64_t capacity_rows = 0;  // resident-row cap derived from the budget (0 = unlimited)
  uint64_t compactions = 0;
  uint64_t bytes_ssd_index = 0;  // in-memory index of the SSD tier (outside the budget)
  uint64_t rows_lost = 0;        // ids dropped because their SSD record failed its check (lost())
  static constexpr int kFields = 14;
  void to_array(uint64_t* out) const;
};

class SparseTable {
 public:
  explicit SparseTable(const TableConfig& config);
  ~SparseTable();
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  const TableConfig& config() const { return config_; }

  // out: n * dim floats.  Creates missing rows (deterministic init), promotes SSD rows.
  void pull(const int64_t* keys, size_t n, float* out);
  // grads: n * dim floats.  Gradients of repeated keys are summed (then clipped, config grad_clip), then
  // the fused optimizer is applied once per key.  The whole batch is rejected (no row's values change) if
  // any gradient is not finite, if an update would make a weight or optimizer state non-finite, or if a
  // spilled row fails its check.
  void push(const int64_t* keys, size_t n, const float* grads);
  // Full stored rows (weights then optimizer state, stride() floats each) without touching scores;
  // missing keys give found[i] = 0 and zeros.  For tests and inspection.
  void peek(const int64_t* keys, size_t n, float* rows, uint8_t* found);
  // Overwrite the weights (n * dim floats) of keys, creating missing rows and promoting spilled ones; the
  // optimizer state of an existing row is kept (a new row gets the initial state).  What a cache of an
  // authoritative store needs: rows loaded from the parameter servers keep training with their local
  // optimizer state.  Repeated keys: the last row given wins.  The whole call is rejected (nothing
  // changes) if any value is not finite.
  void assign(const int64_t* keys, size_t n, const float* weights);

  // For an upper tier (the GPU table) that keeps its own copy of hot rows: take_rows removes the keys'
  // full rows (stride() floats: weights then optimizer state) from this table, or gives their initial rows
  // if absent; put_rows inserts or overwrites full rows (scores: eviction scores, or null for "now").
  // Batch calls: the keys are grouped by shard once, each shard touched is locked once for the call (in
  // ascending order, as push does), and the shards' groups run on config().host_threads threads, each
  // group in the batch's order, so the results (rows, where they live, the SSD logs, stats) are those of
  // the keys taken or put one at a time in the batch's order, whatever the thread count.  Repeated keys:
  // take_rows gives the row to the first and the initial row to the later ones; put_rows' last row wins.
  // Errors: an INT64_MIN key rejects the call before anything changes.  take_rows checks every spilled
  // record it will read before it removes any row: a bad one throws (naming file, offset and id; the id is
  // lost, as for pull) and no row is taken.  put_rows puts every row; a bad spilled record of another id
  // met meanwhile (compaction) is thrown after the whole batch is in.  The error thrown is the one of the
  // smallest batch position.
  void take_rows(const int64_t* keys, size_t n, float* rows);
  void put_rows(const int64_t* keys, size_t n, const float* rows, const uint32_t* scores);

  // Atomic (temp file + rename), checksummed, versioned.  Failures throw TableError naming the file;
  // the table is unchanged by a failed save or a rejected load.
  void save(const std::string& path);
  void load(const std::string& path);

  TableStats stats() const;
  // Ids whose SSD record failed its check, with what was wrong (file, offset, why).  The rest of the
  // table keeps serving; a lost id touched again starts from its initial row; save() refuses while any
  // are listed.  forget_lost() accepts the loss (returns how many were listed).
  std::vector<std::pair<int64_t, std::string>> lost() const;
  uint64_t forget_lost();
  uint64_t size() const;  // rows resident + on SSD
  void clear();

  // Test hook: make the Nth following low-level write (SSD spill or checkpoint) fail with ENOSPC.
  // n = 0 disables.  Process-wide.
  static void inject_write_failure_after(int64_t n);

  struct Shard;

 private:
  TableConfig config_;
  uint64_t capacity_per_shard_ = 0;  // 0 = unlimited
  std::string ssd_path_;             // this table's private directory under ssd_dir
  int ssd_lock_fd_ = -1;             // flock()ed while the table lives (io::make_private_dir)
  std::vector<std::unique_ptr<Shard>> shards_;
  uint32_t shard_bits_ = 6;
  uint64_t clock_ = 1;              // LRU clock, advanced once per pull/push call (atomic access in .cc)
  std::unique_ptr<TaskPool> pool_;  // host_threads threads for take_rows / put_rows (started on first use)

  void check_keys(const int64_t* keys, size_t n) const;
  void group_by_shard(const int64_t* keys, size_t n, std::vector<uint32_t>& order,
                      std::vector<uint32_t>& offsets) const;
  // A batch grouped by shard and the shards it touches, whose locks lock_groups takes in ascending order
  // (take_rows, put_rows; defined in table.cc).
  struct ShardGroups;
  void lock_groups(const int64_t* keys, size_t n, ShardGroups& g);
  uint32_t next_tick();
  uint32_t shard_of(int64_t key) const;
  static void track_spill_dir(const std::string& dir, bool add);
};

// Process-wide registry so that ops in any thread (and the Python binding) reach the same table by name.
std::shared_ptr<SparseTable> get_or_create_table(const std::string& name, const std::string& config_text);
std::shared_ptr<SparseTable> find_table(const std::string& name);
bool drop_table(const std::string& name);

uint32_t crc32_update(uint32_t crc, const void* data, size_t len);

}  // namespace heterps
