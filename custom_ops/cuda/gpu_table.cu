// The sparse table on the GPU: keys, eviction scores, rows (weights + optimizer state) and a gradient
// accumulator live in device memory in one open-addressing table (linear probing, a row stored at its
// key's slot, so a lookup is one probe sequence plus one row read).  Batched kernels find, insert, sum
// gradients and apply the fused optimizers.  Rows that do not fit the device budget go to a host tier,
// which is the CPU core table (heterps::SparseTable) of the same config and itself spills to SSD.
//
// Host-side control flow per batch: a find kernel serves the hits and lists the misses; only when there
// are misses does the host take their rows from the host tier (or their initial rows: the same
// deterministic init as the CPU core), make room (grow, or evict the coldest eighth to the host tier) and
// insert them.  One mutex per table serialises batches; kernels run on the caller's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "gpu_table.h"
#include "heterps/c_api_guard.h"
#include "heterps/hash.h"
#include "heterps/table.h"

namespace {

constexpr int64_t kEmpty = INT64_MIN;
constexpr int kThreads = 256;

using heterps::key_hash;

struct Dev {
  int64_t* keys = nullptr;
  uint32_t* scores = nullptr;
  uint32_t* touched = nullptr;  // 1 while the slot has gradients in accum
  uint32_t* seen = nullptr;     // tick of the last batch that used the row: such rows are never evicted
  float* rows = nullptr;        // cap * dstride
  float* accum = nullptr;       // cap * dim
  uint64_t cap = 0, mask = 0;
  uint32_t dim = 0, hstride = 0, dstride = 0;  // host stride (packed), device stride (multiple of 4)
};

struct Opt {
  int kind;  // 0 sgd, 1 adagrad, 2 adam
  float lr, beta1, beta2, eps;
  int lfu;
  float clip;  // > 0: clip each summed gradient value to [-clip, clip] (TableConfig::grad_clip)
};

__device__ inline int64_t probe_find(const Dev& t, int64_t key) {
  uint64_t h = key_hash(key) & t.mask;
  while (true) {
    int64_t k = t.keys[h];
    if (k == key) return static_cast<int64_t>(h);
    if (k == kEmpty) return -1;
    h = (h + 1) & t.mask;
  }
}

__device__ inline void touch(const Dev& t, uint64_t slot, uint32_t tick, int lfu) {
  if (lfu) {
    if (t.scores[slot] != 0xffffffffu) atomicAdd(&t.scores[slot], 1u);
  } else if (t.scores[slot] != tick) {
    t.scores[slot] = tick;
  }
}

__device__ inline void copy_weights(const Dev& t, uint64_t slot, float* dst) {
  const float* src = t.rows + slot * t.dstride;
  if ((t.dim & 3) == 0) {  // dstride is a multiple of 4, so rows are 16-byte aligned
    const float4* s4 = reinterpret_cast<const float4*>(src);
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (uint32_t j = 0; j < t.dim / 4; ++j) d4[j] = s4[j];
  } else {
    for (uint32_t j = 0; j < t.dim; ++j) dst[j] = src[j];
  }
}

// Hits: copy weights, touch score, found=1.  Misses: zeros, found=0, position appended to miss_pos.
__global__ void find_kernel(Dev t, const int64_t* __restrict__ keys, size_t n, float* __restrict__ out,
                            uint8_t* __restrict__ found, uint32_t tick, int lfu, int update_scores,
                            uint32_t* miss_count, uint32_t* miss_pos) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int64_t s = probe_find(t, keys[i]);
  if (s >= 0) {
    if (out) copy_weights(t, uint64_t(s), out + i * t.dim);
    if (update_scores) {
      touch(t, uint64_t(s), tick, lfu);
      if (t.seen[s] != tick) t.seen[s] = tick;
    }
    if (found) found[i] = 1;
    return;
  }
  if (out)
    for (uint32_t j = 0; j < t.dim; ++j) out[i * t.dim + j] = 0.0f;
  if (found) found[i] = 0;
  if (miss_pos) miss_pos[atomicAdd(miss_count, 1u)] = static_cast<uint32_t>(i);
}

__global__ void gather_keys_kernel(const int64_t* keys, const uint32_t* pos, uint32_t m, int64_t* out) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < m) out[i] = keys[pos[i]];
}

// Second pass for the misses of a pull, after their rows were inserted.
__global__ void fill_kernel(Dev t, const int64_t* keys, const uint32_t* pos, uint32_t m, float* out) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  uint32_t p = pos[i];
  int64_t s = probe_find(t, keys[p]);
  if (s >= 0) copy_weights(t, uint64_t(s), out + size_t(p) * t.dim);
}

__device__ inline uint64_t claim_slot(const Dev& t, int64_t key) {
  uint64_t h = key_hash(key) & t.mask;
  while (true) {
    unsigned long long prev = atomicCAS(reinterpret_cast<unsigned long long*>(t.keys + h),
                                        static_cast<unsigned long long>(kEmpty), static_cast<unsigned long long>(key));
    if (prev == static_cast<unsigned long long>(kEmpty) || prev == static_cast<unsigned long long>(key)) return h;
    h = (h + 1) & t.mask;
  }
}

// Inserts distinct keys with full packed rows (host stride) and their scores.
__global__ void insert_kernel(Dev t, const int64_t* keys, const float* rows, const uint32_t* scores, uint32_t m,
                              uint32_t tick) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  uint64_t s = claim_slot(t, keys[i]);
  float* dst = t.rows + s * t.dstride;
  const float* src = rows + size_t(i) * t.hstride;
  for (uint32_t j = 0; j < t.hstride; ++j) dst[j] = src[j];
  t.scores[s] = scores[i];
  t.touched[s] = 0;
  t.seen[s] = tick;
}

// Rebuild into `to` (grow, or drop victims): rows scoring below `threshold` (all rows with `all`), except
// those used by the current batch (seen == protect), go to the staging buffers (key, score, packed row) for
// the host tier; the rest are re-inserted.
__global__ void rehash_kernel(Dev from, Dev to, uint32_t threshold, int all, uint32_t protect, uint32_t max_victims,
                              uint32_t* victim_count, int64_t* v_keys, uint32_t* v_scores, float* v_rows) {
  uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
  if (i >= from.cap) return;
  int64_t key = from.keys[i];
  if (key == kEmpty) return;
  const float* src = from.rows + i * from.dstride;
  uint32_t score = from.scores[i];
  if (all || (score < threshold && from.seen[i] != protect)) {
    uint32_t v = atomicAdd(victim_count, 1u);
    if (v < max_victims) {
      v_keys[v] = key;
      v_scores[v] = score;
      for (uint32_t j = 0; j < from.hstride; ++j) v_rows[size_t(v) * from.hstride + j] = src[j];
      return;
    }
  }
  uint64_t s = claim_slot(to, key);
  float* dst = to.rows + s * to.dstride;
  for (uint32_t j = 0; j < from.hstride; ++j) dst[j] = src[j];
  to.scores[s] = score;
  to.touched[s] = 0;
  to.seen[s] = from.seen[i];
}

__global__ void fill_empty_kernel(int64_t* keys, uint64_t n) {
  uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
  if (i < n) keys[i] = kEmpty;
}

__global__ void nonfinite_kernel(const float* g, size_t n, int* flag) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n && !isfinite(g[i])) *flag = 1;
}

// Sums the gradients of each key into its slot's accumulator and lists each touched slot once.
__global__ void accumulate_kernel(Dev t, const int64_t* keys, const float* grads, size_t n, uint32_t* touched_count,
                                  uint64_t* touched_slots) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int64_t s = probe_find(t, keys[i]);
  if (s < 0) return;  // cannot happen: the host inserted every key first
  for (uint32_t j = 0; j < t.dim; ++j) atomicAdd(&t.accum[uint64_t(s) * t.dim + j], grads[i * t.dim + j]);
  if (atomicExch(&t.touched[s], 1u) == 0) touched_slots[atomicAdd(touched_count, 1u)] = uint64_t(s);
}

// One column's step of the fused optimizers, same formulas and order of float operations as the CPU core
// (optimizer.h): the new weight and the column's optimizer state (a: Adagrad's sum or Adam's m; b: Adam's v).
// c1, c2: Adam's bias corrections after this step.
struct ColumnStep {
  float w, a, b;
};

__device__ inline ColumnStep column_step(const Opt& o, const float* row, uint32_t d, uint32_t j, float g, float c1,
                                         float c2) {
  if (o.kind == 0) return {row[j] - o.lr * g, 0.0f, 0.0f};
  if (o.kind == 1) {
    const float acc = row[d + j] + g * g;
    return {row[j] - o.lr * g / (sqrtf(acc) + o.eps), acc, 0.0f};
  }
  const float m = o.beta1 * row[d + j] + (1.0f - o.beta1) * g;
  const float v = o.beta2 * row[2 * d + j] + (1.0f - o.beta2) * g * g;
  return {row[j] - o.lr * (m / c1) / (sqrtf(v / c2) + o.eps), m, v};
}

__global__ void apply_kernel(Dev t, const uint64_t* slots, uint32_t m, Opt o, uint32_t tick, int* overflow) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  uint64_t s = slots[i];
  float* row = t.rows + s * t.dstride;
  float* g = t.accum + s * t.dim;
  const uint32_t d = t.dim;
  bool finite = true;
  for (uint32_t j = 0; j < d; ++j) {
    finite = finite && isfinite(g[j]);
    if (o.clip > 0) g[j] = fminf(o.clip, fmaxf(-o.clip, g[j]));
  }
  // An update whose weights or optimizer state would not be finite leaves the row as it was (the CPU core
  // rejects the whole batch; here rows are updated in parallel, so the check is per row): every column is
  // stepped once to check, then again to write.
  float c1 = 1.0f, c2 = 1.0f;
  if (o.kind == 2) {  // Adam's row holds beta1^t, beta2^t after its columns
    c1 = 1.0f - row[3 * d] * o.beta1;
    c2 = 1.0f - row[3 * d + 1] * o.beta2;
  }
  for (uint32_t j = 0; j < d && finite; ++j) {
    const ColumnStep c = column_step(o, row, d, j, g[j], c1, c2);
    finite = isfinite(c.w) && isfinite(c.a) && isfinite(c.b);
  }
  if (finite) {
    for (uint32_t j = 0; j < d; ++j) {
      const ColumnStep c = column_step(o, row, d, j, g[j], c1, c2);
      row[j] = c.w;
      if (o.kind >= 1) row[d + j] = c.a;
      if (o.kind == 2) row[2 * d + j] = c.b;
    }
    if (o.kind == 2) {
      row[3 * d] *= o.beta1;
      row[3 * d + 1] *= o.beta2;
    }
    touch(t, s, tick, o.lfu);
  } else {
    atomicExch(overflow, 1);  // a summed gradient or the update it makes is not finite: the row keeps its values
  }
  for (uint32_t j = 0; j < d; ++j) g[j] = 0.0f;
  t.touched[s] = 0;
}

inline unsigned blocks_for(uint64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

struct CudaError : heterps::TableError {
  using heterps::TableError::TableError;
};

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

template <class T>
struct DevBuf {  // grow-only device scratch
  T* p = nullptr;
  size_t n = 0;
  T* get(size_t want) {
    if (want > n) {
      if (p) cudaFree(p);
      p = nullptr;
      n = 0;
      ck(cudaMalloc(&p, std::max<size_t>(want, 1) * sizeof(T)), "cudaMalloc (scratch)");
      n = want;
    }
    return p;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
};

class GpuTable {
 public:
  GpuTable(const std::string& name, const heterps::TableConfig& c, int device) : c_(c), device_(device) {
    // The host tier is the CPU table of the same name in the core registry: Python's SparseTable (save,
    // load, stats, pull on the host) sees every row once the device rows are flushed to it.
    heterps::TableConfig host = c;
    host.memory_budget_bytes = c.host_memory_budget_bytes;
    host_ = heterps::get_or_create_table(name, host.to_string());
    hstride_ = c.stride();
    dstride_ = (hstride_ + 3) & ~3u;
    slot_bytes_ = 8 + 4 + 4 + 4 + uint64_t(dstride_) * 4 + uint64_t(c.dim) * 4;  // key, score, flags, seen, row, accum
    // Half-full table: a resident row costs two slots.
    max_rows_ = c.memory_budget_bytes ? std::max<uint64_t>(1024, c.memory_budget_bytes / (2 * slot_bytes_)) : 0;
    ck(cudaSetDevice(device_), "cudaSetDevice");
    uint64_t cap = 1024;
    if (max_rows_)
      while (cap < 2 * max_rows_) cap <<= 1;
    t_ = alloc(cap, nullptr);
  }
  ~GpuTable() { release(t_); }

  std::mutex mu;

  void pull(const int64_t* keys, size_t n, float* out, cudaStream_t st) {
    if (n == 0) return;
    ck(cudaSetDevice(device_), "cudaSetDevice");
    const uint32_t tick = ++tick_;
    uint32_t* cnt = counter_.get(1);
    uint32_t* pos = pos_.get(n);
    ck(cudaMemsetAsync(cnt, 0, sizeof(uint32_t), st), "memset");
    find_kernel<<<blocks_for(n), kThreads, 0, st>>>(t_, keys, n, out, nullptr, tick, lfu(), 1, cnt, pos);
    uint32_t m = read_counter(cnt, st);
    if (m == 0) return;
    bring_in(keys, pos, m, tick, st);
    fill_kernel<<<blocks_for(m), kThreads, 0, st>>>(t_, keys, pos, m, out);
    ck(cudaGetLastError(), "fill_kernel");
    ck(cudaStreamSynchronize(st), "pull");
  }

  void push(const int64_t* keys, size_t n, const float* grads, cudaStream_t st) {
    if (n == 0) return;
    ck(cudaSetDevice(device_), "cudaSetDevice");
    int* flag = flag_.get(1);
    ck(cudaMemsetAsync(flag, 0, sizeof(int), st), "memset");
    nonfinite_kernel<<<blocks_for(n * c_.dim), kThreads, 0, st>>>(grads, n * c_.dim, flag);
    int bad = 0;
    ck(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, st), "copy flag");
    ck(cudaStreamSynchronize(st), "push check");
    if (bad) throw heterps::TableError("a gradient is not finite; the batch was not applied");
    const uint32_t tick = ++tick_;
    uint32_t* cnt = counter_.get(1);
    uint32_t* pos = pos_.get(n);
    ck(cudaMemsetAsync(cnt, 0, sizeof(uint32_t), st), "memset");
    // update_scores=1 marks the batch's resident rows as seen, so making room for its misses cannot evict
    // them before their gradients are accumulated.
    find_kernel<<<blocks_for(n), kThreads, 0, st>>>(t_, keys, n, nullptr, nullptr, tick, lfu(), 1, cnt, pos);
    uint32_t m = read_counter(cnt, st);
    if (m) bring_in(keys, pos, m, tick, st);
    uint64_t* slots = slots_.get(n);
    ck(cudaMemsetAsync(cnt, 0, sizeof(uint32_t), st), "memset");
    accumulate_kernel<<<blocks_for(n), kThreads, 0, st>>>(t_, keys, grads, n, cnt, slots);
    uint32_t touched = read_counter(cnt, st);
    Opt o{static_cast<int>(c_.optimizer), c_.lr, c_.beta1, c_.beta2, c_.epsilon, lfu(), c_.grad_clip};
    ck(cudaMemsetAsync(flag, 0, sizeof(int), st), "memset");
    apply_kernel<<<blocks_for(touched), kThreads, 0, st>>>(t_, slots, touched, o, tick, flag);
    ck(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, st), "copy flag");
    ck(cudaStreamSynchronize(st), "push");
    if (bad)
      throw heterps::TableError(
          "a summed gradient, or the update it makes, is not finite; those rows were left unchanged");
  }

  void find(const int64_t* keys, size_t n, float* out, uint8_t* found, cudaStream_t st) {
    if (n == 0) return;
    find_kernel<<<blocks_for(n), kThreads, 0, st>>>(t_, keys, n, out, found, 0, 0, 0, nullptr, nullptr);
    ck(cudaGetLastError(), "find_kernel");
  }

  void stats(uint64_t* out4) {
    out4[0] = count_;
    out4[1] = host_->size();
    out4[2] = evicted_;
    out4[3] = promoted_;
  }

  void flush_to_host() {
    ck(cudaSetDevice(device_), "cudaSetDevice");
    if (count_) rebuild(t_.cap, 0, /*all=*/true, count_, nullptr);
  }

 private:
  heterps::TableConfig c_;
  int device_;
  std::shared_ptr<heterps::SparseTable> host_;
  uint32_t hstride_, dstride_;
  uint64_t slot_bytes_, max_rows_;
  Dev t_;
  uint64_t count_ = 0, evicted_ = 0, promoted_ = 0;
  uint32_t tick_ = 1;
  DevBuf<uint32_t> counter_, pos_, vcount_, vscores_, scores_in_;
  DevBuf<int> flag_;
  DevBuf<uint64_t> slots_;
  DevBuf<int64_t> mkeys_, vkeys_;
  DevBuf<float> rows_in_, vrows_;

  int lfu() const { return c_.eviction == heterps::EvictPolicy::kLFU ? 1 : 0; }

  Dev alloc(uint64_t cap, cudaStream_t st) {
    Dev d;
    d.cap = cap;
    d.mask = cap - 1;
    d.dim = c_.dim;
    d.hstride = hstride_;
    d.dstride = dstride_;
    ck(cudaMalloc(&d.keys, cap * 8), "cudaMalloc keys");
    ck(cudaMalloc(&d.scores, cap * 4), "cudaMalloc scores");
    ck(cudaMalloc(&d.touched, cap * 4), "cudaMalloc flags");
    ck(cudaMalloc(&d.seen, cap * 4), "cudaMalloc seen");
    ck(cudaMalloc(&d.rows, cap * dstride_ * 4), "cudaMalloc rows");
    ck(cudaMalloc(&d.accum, cap * c_.dim * 4), "cudaMalloc accum");
    fill_empty_kernel<<<blocks_for(cap), kThreads, 0, st>>>(d.keys, cap);
    ck(cudaMemsetAsync(d.touched, 0, cap * 4, st), "memset");
    ck(cudaMemsetAsync(d.seen, 0, cap * 4, st), "memset");
    ck(cudaMemsetAsync(d.accum, 0, cap * c_.dim * 4, st), "memset");
    return d;
  }

  static void release(Dev& d) {
    cudaFree(d.keys);
    cudaFree(d.scores);
    cudaFree(d.touched);
    cudaFree(d.seen);
    cudaFree(d.rows);
    cudaFree(d.accum);
    d = Dev();
  }

  uint32_t read_counter(uint32_t* cnt, cudaStream_t st) {
    uint32_t m = 0;
    ck(cudaGetLastError(), "kernel launch");
    ck(cudaMemcpyAsync(&m, cnt, sizeof(uint32_t), cudaMemcpyDeviceToHost, st), "copy counter");
    ck(cudaStreamSynchronize(st), "sync");
    return m;
  }

  // Rows for the keys at pos[0..m) that are not on the device: from the host tier (or initial rows).
  void bring_in(const int64_t* keys, const uint32_t* pos, uint32_t m, uint32_t tick, cudaStream_t st) {
    int64_t* mk = mkeys_.get(m);
    gather_keys_kernel<<<blocks_for(m), kThreads, 0, st>>>(keys, pos, m, mk);
    std::vector<int64_t> hk(m);
    ck(cudaMemcpyAsync(hk.data(), mk, m * 8, cudaMemcpyDeviceToHost, st), "copy keys");
    ck(cudaStreamSynchronize(st), "sync");
    std::sort(hk.begin(), hk.end());
    hk.erase(std::unique(hk.begin(), hk.end()), hk.end());
    const uint64_t u = hk.size();
    if (max_rows_ && u > max_rows_)
      throw heterps::TableError("a batch needs " + std::to_string(u) +
                                " new device rows, more than the device budget's " + std::to_string(max_rows_) +
                                "; split the batch or raise memory_budget_bytes");
    make_room(u, tick, st);
    std::vector<float> rows(u * hstride_);
    host_->take_rows(hk.data(), u, rows.data());
    std::vector<uint32_t> sc(u, lfu() ? 1u : tick);
    float* dr = rows_in_.get(u * hstride_);
    uint32_t* ds = scores_in_.get(u);
    ck(cudaMemcpyAsync(mk, hk.data(), u * 8, cudaMemcpyHostToDevice, st), "copy keys");
    ck(cudaMemcpyAsync(dr, rows.data(), u * hstride_ * 4, cudaMemcpyHostToDevice, st), "copy rows");
    ck(cudaMemcpyAsync(ds, sc.data(), u * 4, cudaMemcpyHostToDevice, st), "copy scores");
    insert_kernel<<<blocks_for(u), kThreads, 0, st>>>(t_, mk, dr, ds, static_cast<uint32_t>(u), tick);
    ck(cudaGetLastError(), "insert_kernel");
    ck(cudaStreamSynchronize(st), "insert");  // the host buffers above must outlive the copies
    count_ += u;
    promoted_ += u;
  }

  void make_room(uint64_t incoming, uint32_t tick, cudaStream_t st) {
    if (max_rows_ == 0) {
      if ((count_ + incoming) * 2 > t_.cap) {
        uint64_t cap = t_.cap;
        while ((count_ + incoming) * 2 > cap) cap <<= 1;
        rebuild(cap, 0, false, 0, st);
      }
      return;
    }
    if (count_ + incoming > max_rows_) {
      // Evict the coldest rows so that an eighth of the budget is free after this batch.
      uint64_t free_after = std::min<uint64_t>(max_rows_, std::max<uint64_t>(max_rows_ / 8, incoming));
      uint64_t target = max_rows_ - free_after;
      if (count_ > target) evict_coldest(count_ - target, tick, st);
    }
    // Rows of the current batch are never evicted, so a batch touching more rows than the budget holds
    // cannot be served: the table must stay at most ~90% full for probing to terminate.
    if ((count_ + incoming) * 10 > t_.cap * 9)
      throw heterps::TableError("a batch touches more distinct ids than the device budget holds (" +
                                std::to_string(max_rows_) + " rows); split the batch or raise memory_budget_bytes");
  }

  // Evicts about n rows with the lowest scores to the host tier (never rows used by batch `tick`).
  void evict_coldest(uint64_t n, uint32_t tick, cudaStream_t st) {
    if (n == 0 || count_ == 0) return;
    std::vector<uint32_t> sc(t_.cap);
    std::vector<int64_t> ks(t_.cap);
    ck(cudaMemcpyAsync(sc.data(), t_.scores, t_.cap * 4, cudaMemcpyDeviceToHost, st), "copy scores");
    ck(cudaMemcpyAsync(ks.data(), t_.keys, t_.cap * 8, cudaMemcpyDeviceToHost, st), "copy keys");
    ck(cudaStreamSynchronize(st), "sync");
    std::vector<uint32_t> live;
    live.reserve(count_);
    for (uint64_t i = 0; i < t_.cap; ++i)
      if (ks[i] != kEmpty) live.push_back(sc[i]);
    if (live.empty()) return;
    n = std::min<uint64_t>(n, live.size());
    std::nth_element(live.begin(), live.begin() + (n - 1), live.end());
    uint32_t nth = live[n - 1];
    uint32_t threshold = nth == UINT32_MAX ? nth : nth + 1;  // scores <= the n-th lowest
    // Ties (LRU ticks are per batch) may select more than n: the victim buffer caps the overshoot.
    rebuild(t_.cap, threshold, false, n + n / 4 + 1024, st, tick);
  }

  // Re-inserts every row into a fresh table of `cap` slots, except victims (see rehash_kernel), at most
  // max_victims of them, which go to the host tier.
  void rebuild(uint64_t cap, uint32_t threshold, bool all, uint64_t max_victims, cudaStream_t st,
               uint32_t protect = 0) {
    Dev fresh = alloc(cap, st);
    uint32_t* vc = vcount_.get(1);
    ck(cudaMemsetAsync(vc, 0, 4, st), "memset");
    uint64_t vcap = std::max<uint64_t>(1, max_victims);
    int64_t* vk = vkeys_.get(vcap);
    uint32_t* vs = vscores_.get(vcap);
    float* vr = vrows_.get(vcap * hstride_);
    rehash_kernel<<<blocks_for(t_.cap), kThreads, 0, st>>>(t_, fresh, threshold, all ? 1 : 0, protect,
                                                           static_cast<uint32_t>(max_victims), vc, vk, vs, vr);
    uint32_t nv = read_counter(vc, st);
    nv = static_cast<uint32_t>(std::min<uint64_t>(nv, max_victims));
    if (nv) {
      std::vector<int64_t> hk(nv);
      std::vector<uint32_t> hs(nv);
      std::vector<float> hr(size_t(nv) * hstride_);
      ck(cudaMemcpyAsync(hk.data(), vk, nv * 8, cudaMemcpyDeviceToHost, st), "copy victims");
      ck(cudaMemcpyAsync(hs.data(), vs, nv * 4, cudaMemcpyDeviceToHost, st), "copy victims");
      ck(cudaMemcpyAsync(hr.data(), vr, size_t(nv) * hstride_ * 4, cudaMemcpyDeviceToHost, st), "copy victims");
      ck(cudaStreamSynchronize(st), "sync");
      host_->put_rows(hk.data(), nv, hr.data(), hs.data());
    }
    release(t_);
    t_ = fresh;
    count_ -= nv;
    evicted_ += nv;
  }
};

std::mutex g_mu;
std::map<std::string, std::shared_ptr<GpuTable>>& registry() {
  static auto* r = new std::map<std::string, std::shared_ptr<GpuTable>>();
  return *r;
}
thread_local std::string t_error;

std::shared_ptr<GpuTable> need(const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = registry().find(name);
  if (it == registry().end()) throw heterps::TableError(std::string("no GPU sparse table named '") + name + "'");
  return it->second;
}

template <class F>
int guarded(F&& f) {
  return heterps::guarded(t_error, f);
}

}  // namespace

extern "C" {

const char* heterps_gpu_last_error(void) {
  return t_error.c_str();
}

int heterps_gpu_table_open(const char* name, const char* config, int device) {
  return guarded([&] {
    heterps::TableConfig c = heterps::TableConfig::parse(config);
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = registry().find(name);
    if (it != registry().end()) return;
    registry()[name] = std::make_shared<GpuTable>(name, c, device);
  });
}

int heterps_gpu_table_drop(const char* name) {
  return guarded([&] {
    std::lock_guard<std::mutex> lock(g_mu);
    registry().erase(name);
  });
}

int heterps_gpu_table_pull(const char* name, const int64_t* keys, size_t n, float* out, void* stream) {
  return guarded([&] {
    auto t = need(name);
    std::lock_guard<std::mutex> lock(t->mu);
    t->pull(keys, n, out, static_cast<cudaStream_t>(stream));
  });
}

int heterps_gpu_table_push(const char* name, const int64_t* keys, size_t n, const float* grads, void* stream) {
  return guarded([&] {
    auto t = need(name);
    std::lock_guard<std::mutex> lock(t->mu);
    t->push(keys, n, grads, static_cast<cudaStream_t>(stream));
  });
}

int heterps_gpu_table_find(const char* name, const int64_t* keys, size_t n, float* out, uint8_t* found, void* stream) {
  return guarded([&] {
    auto t = need(name);
    std::lock_guard<std::mutex> lock(t->mu);
    t->find(keys, n, out, found, static_cast<cudaStream_t>(stream));
  });
}

int heterps_gpu_table_stats(const char* name, uint64_t* out4) {
  return guarded([&] {
    auto t = need(name);
    std::lock_guard<std::mutex> lock(t->mu);
    t->stats(out4);
  });
}

int heterps_gpu_table_flush_to_host(const char* name) {
  return guarded([&] {
    auto t = need(name);
    std::lock_guard<std::mutex> lock(t->mu);
    t->flush_to_host();
  });
}

}  // extern "C"
