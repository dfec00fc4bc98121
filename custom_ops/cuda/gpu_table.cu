// The sparse table on the GPU: keys, eviction scores, rows (weights + optimizer state) and a gradient
// accumulator live in device memory in one open-addressing table (linear probing, a row stored at its
// key's slot, so a lookup is one probe sequence plus one row read).  Batched kernels find, insert and
// apply the fused optimizers; rows that do not fit the device budget go to a host tier, which is the CPU
// core table (heterps::SparseTable) of the same config and itself spills to SSD.
//
// Each key is served by a tile of T consecutive threads (T = the row's 16-byte chunks rounded up to a power
// of two, at most a warp): the tile's lanes probe the same key (one broadcast load) and copy the row
// together, so a warp's loads and stores cover whole rows (dim 8: 16 keys a warp, dim 128: one).
//
// Host-side control flow per batch: a find kernel serves the hits and lists the misses; only when there
// are misses does the host bring their rows in: the missed ids made distinct and sorted on the device, and,
// when the budget needs room, the coldest rows the misses need room for (a radix select of the scores on the
// device) evicted in place (their rows copied out, their slots removed by shifting their clusters' later
// entries back: slot_table.h, the code the host model tests), while the host tier takes the incoming rows
// (or gives their initial rows: the same deterministic init as the CPU core).  Rows cross to and from the
// host tier through page-locked staging buffers; the host tier takes and puts them a batch at a time, over
// its shards on its own threads (heterps::SparseTable::take_rows / put_rows, TableConfig::host_threads).  A
// push counts each id's occurrences in its slot as it looks the ids up; an id seen once (most ids) is updated
// straight from its gradient, the occurrences of a repeated id add their gradients into the slot's
// accumulator and the last to arrive applies the update: the optimizer runs once per unique id.  The update
// rules are heterps/update_rules.h, the CPU core's own.  One mutex per table serialises batches; kernels run
// on the caller's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "gpu_table.h"
#include "heterps/c_api_guard.h"
#include "heterps/hash.h"
#include "heterps/table.h"
#include "heterps/update_rules.h"
#include "slot_table.h"

namespace {

using heterps_slots::kEmpty;
using heterps_slots::kVictim;
constexpr int kThreads = 256;
constexpr unsigned long long kOccurrence = 1ull << 32;

using heterps::key_hash;

struct Dev {
  int64_t* keys = nullptr;
  uint32_t* scores = nullptr;
  // A push's occurrences of the slot's id (high 32 bits, counted by the prepare pass) and how many of them
  // the apply pass has added up so far (low 32 bits); 0 between pushes.
  unsigned long long* count = nullptr;
  uint32_t* seen = nullptr;  // LFU: tick of the last batch that used the row (LRU: the score is that tick)
  float* rows = nullptr;     // cap * dstride
  float* accum = nullptr;    // cap * dim: summed gradients of a repeated id during a push (0 between pushes)
  uint64_t cap = 0, mask = 0;
  uint32_t dim = 0, hstride = 0, dstride = 0;  // host stride (packed), device stride (multiple of 4)
  int lfu = 0;
};

struct Opt {
  heterps::Optimizer kind;
  float lr, beta1, beta2, eps;
  float clip;  // > 0: clip each summed gradient value to [-clip, clip] (TableConfig::grad_clip)
};

// The layout's code is slot_table.h's, shared with the host model (table_model.h) that tests it on any machine.
__device__ inline int64_t probe_find(const Dev& t, int64_t key) {
  return heterps_slots::probe_find(t.keys, t.mask, key);
}

__device__ inline heterps_slots::Slots slots_of(const Dev& t) {
  return {t.keys, t.scores, t.count, t.seen, t.mask};
}

// Rows used by the batch `tick` are never evicted while it runs.  LRU: the score is the tick of the last
// batch that used the row, so it says so itself; LFU keeps that tick in `seen`.
__device__ inline void touch(const Dev& t, uint64_t slot, uint32_t tick) {
  if (t.lfu) {
    if (t.scores[slot] != 0xffffffffu) atomicAdd(&t.scores[slot], 1u);
    if (t.seen[slot] != tick) t.seen[slot] = tick;
  } else if (t.scores[slot] != tick) {
    t.scores[slot] = tick;
  }
}

__device__ inline bool in_use(const Dev& t, uint64_t slot, uint32_t tick) {
  return (t.lfu ? t.seen[slot] : t.scores[slot]) == tick;
}

// A tile of T lanes per key: lane = threadIdx.x % T; `mask` names the tile's lanes in their warp.
template <int T>
struct Tile {
  uint32_t lane, mask;
  size_t key;  // the index of the tile's key in the batch
  __device__ Tile() {
    const size_t g = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    lane = threadIdx.x % T;
    key = g / T;
    mask = T == 32 ? 0xffffffffu : (((1u << T) - 1u) << ((threadIdx.x % 32) / T * T));
  }
  __device__ bool all(bool p) const { return __all_sync(mask, p); }
  __device__ uint32_t first(uint32_t v) const { return __shfl_sync(mask, v, 0, T); }
};

template <class V>
struct Unit {  // a tag naming the unit type (std::type_identity is C++20)
  using type = V;
};

// V: float4 when rows and the caller's arrays are 16-byte aligned and dim is a multiple of 4, else float.
template <class V>
struct Units {
  static constexpr uint32_t kFloats = sizeof(V) / 4;
};

template <int T, class V>
__device__ inline void copy_row(const Dev& t, uint64_t slot, float* dst, uint32_t lane) {
  const V* s = reinterpret_cast<const V*>(t.rows + slot * t.dstride);
  V* d = reinterpret_cast<V*>(dst);
  const uint32_t units = t.dim / Units<V>::kFloats;
  for (uint32_t c = lane; c < units; c += T) d[c] = s[c];
}

template <class V>
__device__ inline V vzero();
template <>
__device__ inline float vzero<float>() {
  return 0.0f;
}
template <>
__device__ inline float4 vzero<float4>() {
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

template <int T, class V>
__device__ inline void zero_row(uint32_t dim, float* dst, uint32_t lane) {
  V* d = reinterpret_cast<V*>(dst);
  const uint32_t units = dim / Units<V>::kFloats;
  for (uint32_t c = lane; c < units; c += T) d[c] = vzero<V>();
}

// Hits: copy weights (out may be null), found=1, and with update_scores touch the row.  Misses: found=0
// and the row left as it was (HierarchicalKV's find does the same), or without `found` zeros; position
// appended to miss_pos.
template <int T, class V>
__global__ void find_kernel(Dev t, const int64_t* __restrict__ keys, size_t n, float* __restrict__ out,
                            uint8_t* __restrict__ found, uint32_t tick, int update_scores, uint32_t* miss_count,
                            uint32_t* miss_pos) {
  const Tile<T> tl;
  const size_t i = tl.key;
  if (i >= n) return;  // whole tiles leave together
  const int64_t s = probe_find(t, keys[i]);
  if (s >= 0) {
    if (out) copy_row<T, V>(t, uint64_t(s), out + i * t.dim, tl.lane);
    if (tl.lane == 0) {
      if (update_scores) touch(t, uint64_t(s), tick);
      if (found) found[i] = 1;
    }
    return;
  }
  if (out && !found) zero_row<T, V>(t.dim, out + i * t.dim, tl.lane);
  if (tl.lane == 0) {
    if (found) found[i] = 0;
    if (miss_pos) miss_pos[atomicAdd(miss_count, 1u)] = static_cast<uint32_t>(i);
  }
}

__global__ void gather_keys_kernel(const int64_t* keys, const uint32_t* pos, uint32_t m, int64_t* out) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < m) out[i] = keys[pos[i]];
}

// Second pass for the misses of a pull, after their rows were inserted.
template <int T, class V>
__global__ void fill_kernel(Dev t, const int64_t* keys, const uint32_t* pos, uint32_t m, float* out) {
  const Tile<T> tl;
  if (tl.key >= m) return;
  const uint32_t p = pos[tl.key];
  const int64_t s = probe_find(t, keys[p]);
  if (s >= 0) copy_row<T, V>(t, uint64_t(s), out + size_t(p) * t.dim, tl.lane);
}

__device__ inline uint64_t claim_slot(const Dev& t, int64_t key) {
  return heterps_slots::claim_slot(t.keys, t.mask, key);
}

// Inserts distinct keys with full packed rows (host stride), all with the same score; a tile of T lanes a row
// (lane 0 claims the slot) so that a warp's row copies are whole cache lines.
template <int T>
__global__ void insert_kernel(Dev t, const int64_t* keys, const float* rows, uint32_t score, uint32_t m,
                              uint32_t tick) {
  const Tile<T> tl;
  if (tl.key >= m) return;  // whole tiles leave together
  unsigned long long s = 0;
  if (tl.lane == 0) {
    s = claim_slot(t, keys[tl.key]);
    t.scores[s] = score;
    t.count[s] = 0;
    t.seen[s] = tick;
  }
  s = __shfl_sync(tl.mask, s, 0, T);
  float* dst = t.rows + s * t.dstride;
  const float* src = rows + tl.key * t.hstride;
  for (uint32_t j = tl.lane; j < t.hstride; j += T) dst[j] = src[j];
}

// Rebuild into `to`, a larger table (a table without a budget grows), or with `all` every row to the staging
// buffers (key, score, packed row) for the host tier (flush_to_host).  A push's counts go with their rows.  A
// tile of T lanes a slot, as above.  Evicting tables do not rebuild: see mark_victims_kernel.
template <int T>
__global__ void rehash_kernel(Dev from, Dev to, int all, uint32_t* victim_count, int64_t* v_keys, uint32_t* v_scores,
                              float* v_rows) {
  const Tile<T> tl;
  const uint64_t i = tl.key;
  if (i >= from.cap) return;
  const int64_t key = from.keys[i];
  if (key == kEmpty) return;
  const uint32_t score = from.scores[i];
  float* dst;
  if (all) {
    uint32_t v = 0;
    if (tl.lane == 0) {
      v = atomicAdd(victim_count, 1u);
      v_keys[v] = key;
      v_scores[v] = score;
    }
    v = tl.first(v);
    dst = v_rows + size_t(v) * from.hstride;
  } else {
    unsigned long long s = 0;
    if (tl.lane == 0) {
      s = heterps_slots::claim_slot(to.keys, to.mask, key);
      to.scores[s] = score;
      to.count[s] = from.count[i];
      to.seen[s] = from.seen[i];
    }
    s = __shfl_sync(tl.mask, s, 0, T);
    dst = to.rows + s * to.dstride;
  }
  const float* src = from.rows + i * from.dstride;
  for (uint32_t j = tl.lane; j < from.hstride; j += T) dst[j] = src[j];
}

// Eviction in place (slot_table.h), 1 of 3, a tile a slot: a live row the choice takes (below the n-th lowest score,
// or at it with its key's hash under tie_cut: heterps_slots::evictable) and not used by the batch `protect` is a
// victim, up to max_victims of them: its key, score, slot and row go to the staging buffers and its count word is
// marked kVictim.  It reads each slot's key and score, as a histogram pass of the threshold's select does; only
// the victims' rows move.
template <int T>
__global__ void mark_victims_kernel(Dev t, uint32_t nth, unsigned long long tie_cut, uint32_t protect,
                                    uint32_t max_victims, uint32_t* victim_count, int64_t* v_keys, uint32_t* v_scores,
                                    uint64_t* v_pos, float* v_rows) {
  const Tile<T> tl;
  const uint64_t i = tl.key;
  if (i >= t.cap) return;
  const int64_t key = t.keys[i];
  if (key == kEmpty || !heterps_slots::evictable(key, t.scores[i], nth, tie_cut) || in_use(t, i, protect)) return;
  uint32_t v = 0;
  if (tl.lane == 0) v = atomicAdd(victim_count, 1u);
  v = tl.first(v);
  if (v >= max_victims) return;
  if (tl.lane == 0) {
    v_keys[v] = key;
    v_scores[v] = t.scores[i];
    v_pos[v] = i;
    t.count[i] = kVictim;
  }
  const float* src = t.rows + i * t.dstride;
  float* dst = v_rows + size_t(v) * t.hstride;
  for (uint32_t j = tl.lane; j < t.hstride; j += T) dst[j] = src[j];
}

// 2 of 3, once the victims are in the host tier: the first victim of each cluster leads its removal (read-only).
__global__ void elect_leaders_kernel(Dev t, const uint64_t* v_pos, uint32_t nv, uint32_t* n_leaders, uint64_t* starts) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nv) return;
  uint64_t start;
  if (heterps_slots::leads_cluster(slots_of(t), v_pos[i], &start)) starts[atomicAdd(n_leaders, 1u)] = start;
}

// 3 of 3, a tile a leader: lane 0 walks the cluster (ClusterShift moves the metadata), the tile copies each moved
// row, each lane its own units, so a row that a later move reads was written by the lane that reads it.
template <int T>
__global__ void shift_kernel(Dev t, const uint64_t* starts, const uint32_t* n_leaders) {
  const Tile<T> tl;
  if (tl.key >= *n_leaders) return;  // whole tiles leave together
  heterps_slots::ClusterShift cs(slots_of(t), starts[tl.key]);
  while (true) {
    unsigned long long from = 0, to = 0;
    int more = 0;
    if (tl.lane == 0) {
      heterps_slots::Move m{0, 0};
      more = cs.next(&m) ? 1 : 0;
      from = m.from;
      to = m.to;
    }
    more = __shfl_sync(tl.mask, more, 0, T);
    if (!more) break;
    from = __shfl_sync(tl.mask, from, 0, T);
    to = __shfl_sync(tl.mask, to, 0, T);
    const float* src = t.rows + from * t.dstride;
    float* dst = t.rows + to * t.dstride;
    for (uint32_t j = tl.lane; j < t.hstride; j += T) dst[j] = src[j];
  }
}

// An eviction given up before its victims were removed (the host tier could not take them): the marks go.
__global__ void unmark_kernel(Dev t, const uint64_t* v_pos, uint32_t nv) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < nv) t.count[v_pos[i]] = 0;
}

// The eviction threshold's radix select, one pass: a histogram of 8 bits of the live slots' scores (bits
// [shift, shift + 8)) among the scores whose higher bits are `prefix` (under `high`), per block in shared
// memory, then added into 256 global bins.  Replaces copying every slot's key and score to the host and
// selecting there on one thread.
__global__ void score_histogram_kernel(Dev t, uint32_t prefix, uint32_t high, int shift, uint32_t* bins) {
  __shared__ uint32_t h[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) h[b] = 0;
  __syncthreads();
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < t.cap; i += stride) {
    if (t.keys[i] == kEmpty) continue;
    const uint32_t s = t.scores[i];
    if ((s & high) == prefix) atomicAdd(&h[(s >> shift) & 255u], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x)
    if (h[b]) atomicAdd(&bins[b], h[b]);
}

__global__ void fill_empty_kernel(int64_t* keys, uint64_t n) {
  uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
  if (i < n) keys[i] = kEmpty;
}

__device__ inline bool finite4(float4 v) {
  return isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w);
}
__device__ inline bool finite_v(float v) {
  return isfinite(v);
}
__device__ inline bool finite_v(float4 v) {
  return finite4(v);
}

// Push, first pass, a thread per id (so that a warp has 32 probes in flight): each id's slot (or a miss),
// its occurrence counted in the slot, the row touched (so that making room for the misses cannot evict it);
// flags[0] counts misses.  The same threads check the batch's gradients as one flat coalesced read (thread
// i reads units i, i + threads, ...): any non-finite value sets flags[1], and the host rejects the batch
// before a row changes.  One kernel, so that the read of the gradients overlaps the probes' latency.
template <class V>
__global__ void push_prepare_kernel(Dev t, const int64_t* __restrict__ keys, size_t n, const V* __restrict__ g,
                                    size_t g_units, uint32_t tick, int64_t* __restrict__ slot_of, uint32_t* flags,
                                    uint32_t* __restrict__ miss_pos) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t threads = size_t(gridDim.x) * blockDim.x;
  int64_t key = 0;
  if (i < n) key = keys[i];
  bool ok = true;
  for (size_t u = i; u < g_units; u += threads) ok = finite_v(g[u]) && ok;
  if (!__all_sync(0xffffffffu, ok) && threadIdx.x % 32 == 0) atomicExch(&flags[1], 1u);
  if (i >= n) return;
  const int64_t s = probe_find(t, key);
  slot_of[i] = s;
  if (s >= 0) {
    atomicAdd(&t.count[s], kOccurrence);
    touch(t, uint64_t(s), tick);
  } else {
    miss_pos[atomicAdd(&flags[0], 1u)] = static_cast<uint32_t>(i);
  }
}

// After the misses were inserted: their slots, and with `count` their occurrences (pos = null: every id, without
// counting, after an eviction or a growth moved rows: the counts went with their rows).
__global__ void push_resolve_kernel(Dev t, const int64_t* keys, const uint32_t* pos, uint32_t m, int64_t* slot_of,
                                    int count) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  const uint32_t p = pos ? pos[i] : i;
  const int64_t s = probe_find(t, keys[p]);
  slot_of[p] = s;
  if (count && s >= 0) atomicAdd(&t.count[s], kOccurrence);
}

// A rejected batch: the counts go back to 0.
__global__ void push_reset_kernel(Dev t, const int64_t* slot_of, size_t n) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n && slot_of[i] >= 0) t.count[slot_of[i]] = 0;
}

// One column of the fused update (heterps/update_rules.h) on values held in registers.
struct ColumnState {
  float w, a, b;  // weight; Adagrad's sum or Adam's m; Adam's v
};

__device__ inline bool step_column(const Opt& o, ColumnState& x, float g, float c1, float c2) {
  if (o.clip > 0) g = heterps::clip_gradient(g, o.clip);
  switch (o.kind) {
    case heterps::Optimizer::kSGD:
      heterps::sgd_column(x.w, g, o.lr);
      return isfinite(x.w);
    case heterps::Optimizer::kAdagrad:
      heterps::adagrad_column(x.w, x.a, g, o.lr, o.eps);
      return isfinite(x.w) && isfinite(x.a);
    default:
      heterps::adam_column(x.w, x.a, x.b, g, o.lr, o.beta1, o.beta2, c1, c2, o.eps);
      return isfinite(x.w) && isfinite(x.a) && isfinite(x.b);
  }
}

__device__ inline float comp(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}
__device__ inline float& comp(float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}
__device__ inline float comp(const float& v, int) {
  return v;
}
__device__ inline float& comp(float& v, int) {
  return v;
}

// The update of one unit (1 or 4 columns) of a row: new weights and state, whether all are finite.
template <class V>
__device__ inline bool step_unit(const Opt& o, const V& g, V& w, V& a, V& b, float c1, float c2) {
  bool ok = true;
#pragma unroll
  for (int k = 0; k < int(Units<V>::kFloats); ++k) {
    ColumnState x{comp(w, k), comp(a, k), comp(b, k)};
    ok = step_column(o, x, comp(g, k), c1, c2) && ok;
    comp(w, k) = x.w;
    comp(a, k) = x.a;
    comp(b, k) = x.b;
  }
  return ok;
}

template <class V>
__device__ inline V load_cg(const V* p) {
  return __ldcg(p);
}

template <class V>
__device__ inline void add_atomic(V* dst, const V& v);
template <>
__device__ inline void add_atomic<float>(float* dst, const float& v) {
  atomicAdd(dst, v);
}
template <>
__device__ inline void add_atomic<float4>(float4* dst, const float4& v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(dst, v);  // one 16-byte atomic (sm_90)
#else
  atomicAdd(&dst->x, v.x);
  atomicAdd(&dst->y, v.y);
  atomicAdd(&dst->z, v.z);
  atomicAdd(&dst->w, v.w);
#endif
}

// Push, second pass: once per unique id.  An id that occurs once is updated from its gradient; each
// occurrence of a repeated id adds its gradient into the slot's accumulator, and the last to count itself
// arrived (all others' additions are then visible: each fenced them before counting itself)
// applies the update from the sum and clears the accumulator.  The whole row is checked before it is
// written (an update whose summed gradient, weights or optimizer state would not be finite leaves the row
// as it was and sets *overflow; rows are updated in parallel, so the check is per row).
// K: the optimizer (a template argument, so that each kernel holds one optimizer's code and registers).
template <int T, class V, int K>
__global__ void push_apply_kernel(Dev t, const float* __restrict__ grads, const int64_t* __restrict__ slot_of, size_t n,
                                  Opt o, uint32_t tick, uint32_t* overflow) {
  o.kind = static_cast<heterps::Optimizer>(K);
  const Tile<T> tl;
  const size_t i = tl.key;
  if (i >= n) return;
  const int64_t s = slot_of[i];
  if (s < 0) return;  // cannot happen: every id was inserted before this pass
  const uint32_t d = t.dim;
  const uint32_t units = d / Units<V>::kFloats;
  const V* gi = reinterpret_cast<const V*>(grads + i * d);
  V* acc = reinterpret_cast<V*>(t.accum + uint64_t(s) * d);
  // Rows of up to T units (dim <= 128 with float4): the lane's gradient unit is loaded before the count,
  // so the two loads are in flight together.
  V g_lane = vzero<V>();
  if (units <= T && tl.lane < units) g_lane = __ldcs(gi + tl.lane);      // read once: evict first
  const uint32_t occurrences = static_cast<uint32_t>(t.count[s] >> 32);  // fixed since the prepare pass
  const bool single = occurrences == 1;
  if (!single) {
    if (units <= T) {
      if (tl.lane < units) add_atomic<V>(acc + tl.lane, g_lane);
    } else {
      for (uint32_t c = tl.lane; c < units; c += T) add_atomic<V>(acc + c, gi[c]);
    }
    __threadfence();
    uint32_t arrived = 0;
    if (tl.lane == 0) arrived = static_cast<uint32_t>(atomicAdd(&t.count[s], 1ull) & 0xffffffffu) + 1u;
    arrived = tl.first(arrived);
    if (arrived != occurrences) return;  // a later occurrence applies the sum
    __threadfence();
  }
  float* row = t.rows + uint64_t(s) * t.dstride;
  V* w = reinterpret_cast<V*>(row);
  V* a = reinterpret_cast<V*>(row + d);
  V* b = reinterpret_cast<V*>(row + 2 * d);
  float p1 = 1.0f, p2 = 1.0f, c1 = 1.0f, c2 = 1.0f;
  if (o.kind == heterps::Optimizer::kAdam) {
    p1 = row[3 * d];
    p2 = row[3 * d + 1];
    heterps::adam_powers(p1, p2, o.beta1, o.beta2, c1, c2);
  }
  const bool has_a = o.kind != heterps::Optimizer::kSGD, has_b = o.kind == heterps::Optimizer::kAdam;
  auto load = [&](uint32_t c, V& g, V& wv, V& av, V& bv) {
    g = single ? (units <= T ? g_lane : gi[c]) : load_cg<V>(acc + c);
    wv = w[c];
    if (has_a) av = a[c];
    if (has_b) bv = b[c];
  };
  bool ok = true;
  if (units <= T) {  // dims up to 32 units (128 floats): a lane's unit stays in registers through the vote
    const uint32_t c = tl.lane;
    V g = vzero<V>(), wv = vzero<V>(), av = vzero<V>(), bv = vzero<V>();
    if (c < units) {
      load(c, g, wv, av, bv);
      ok = finite_v(g) && step_unit<V>(o, g, wv, av, bv, c1, c2);
    }
    ok = tl.all(ok);
    if (c < units) {
      if (ok) {
        w[c] = wv;
        if (has_a) a[c] = av;
        if (has_b) b[c] = bv;
      }
      if (!single) acc[c] = vzero<V>();
    }
  } else {  // larger rows: every unit stepped once to check, then again to write
    for (uint32_t c = tl.lane; c < units; c += T) {
      V g, wv, av = vzero<V>(), bv = vzero<V>();
      load(c, g, wv, av, bv);
      ok = finite_v(g) && step_unit<V>(o, g, wv, av, bv, c1, c2) && ok;
    }
    ok = tl.all(ok);
    for (uint32_t c = tl.lane; c < units; c += T) {
      if (ok) {
        V g, wv, av = vzero<V>(), bv = vzero<V>();
        load(c, g, wv, av, bv);
        step_unit<V>(o, g, wv, av, bv, c1, c2);
        w[c] = wv;
        if (has_a) a[c] = av;
        if (has_b) b[c] = bv;
      }
      if (!single) acc[c] = vzero<V>();
    }
  }
  if (tl.lane != 0) return;
  if (ok) {
    if (has_b) {
      row[3 * d] = p1;
      row[3 * d + 1] = p2;
    }
    if (t.lfu) touch(t, uint64_t(s), tick);  // LRU: the prepare pass set the score to this tick
  } else {
    atomicExch(overflow, 1u);
  }
  t.count[s] = 0;
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

// Grow-only device scratch, in powers of two (a batch larger than any before reallocates a buffer at most log2
// times over the table's life, not at every new maximum), through the stream-ordered allocator: cudaFree and
// cudaMalloc wait for the whole device, cudaFreeAsync / cudaMallocAsync only take their place on the stream.
// The fixed-size ones (counters, histogram bins) are taken at construction.
template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  // clear: a new allocation is zeroed (a buffer copied whole, past what a kernel wrote, is then defined)
  T* get(size_t want, cudaStream_t st, bool clear = false) {
    if (want > n) {
      size_t size = 1;
      while (size < want) size <<= 1;
      if (p) ck(cudaFreeAsync(p, st), "cudaFreeAsync (scratch)");
      p = nullptr;
      n = 0;
      ck(cudaMallocAsync(reinterpret_cast<void**>(&p), size * sizeof(T), st), "cudaMallocAsync (scratch)");
      n = size;
      if (clear) ck(cudaMemsetAsync(p, 0, size * sizeof(T), st), "memset (scratch)");
    }
    return p;
  }
  T* get() const { return p; }  // sized already
  ~DevBuf() {
    if (p) cudaFree(p);
  }
};

// Grow-only page-locked host staging: the async copies to and from the device use it, and the host tier
// reads and writes it directly.
template <class T>
struct PinnedBuf {
  T* p = nullptr;
  size_t n = 0;
  T* get(size_t want) {
    if (want > n) {
      const size_t size = std::max<size_t>({want, n + n / 2, 1});  // geometric: page-locking is slow
      if (p) cudaFreeHost(p);
      p = nullptr;
      n = 0;
      ck(cudaHostAlloc(reinterpret_cast<void**>(&p), size * sizeof(T), cudaHostAllocDefault),
         "cudaHostAlloc (staging)");
      n = size;
    }
    return p;
  }
  ~PinnedBuf() {
    if (p) cudaFreeHost(p);
  }
};

// Where a batch's misses spend host time (seconds, cumulative): heterps_gpu_table_phase_seconds' order.
// kEvictWait: waiting for the kernel that marks the victims and copies their rows out, and for their copy to the
// host (both overlap the take); kVictimCopy is 0 since that copy moved inside it.
enum Phase { kDistinct, kSelect, kTake, kEvictWait, kVictimCopy, kPut, kInsert, kPhases };

// Adds the seconds from its construction to its destruction to `acc`.
struct PhaseClock {
  double& acc;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  explicit PhaseClock(double& a) : acc(a) {}
  ~PhaseClock() { acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
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
    // key, score, occurrences, seen, row, accumulator
    slot_bytes_ = 8 + 4 + 8 + 4 + uint64_t(dstride_) * 4 + uint64_t(c.dim) * 4;
    // Half-full table: a resident row costs two slots.
    max_rows_ = c.memory_budget_bytes ? std::max<uint64_t>(1024, c.memory_budget_bytes / (2 * slot_bytes_)) : 0;
    ck(cudaSetDevice(device_), "cudaSetDevice");
    uint64_t cap = 1024;
    if (max_rows_)
      while (cap < 2 * max_rows_) cap <<= 1;
    t_ = alloc(cap, nullptr);
    counter_.get(2, nullptr);
    vcount_.get(2, nullptr);  // victims marked, leaders elected
    bins_.get(256, nullptr);
    nsel_.get(1, nullptr);
    bins_host_.get(256);
    ck(cudaMallocHost(&pinned_, 2 * sizeof(uint32_t)), "cudaMallocHost");
    ck(cudaEventCreateWithFlags(&find_done_, cudaEventDisableTiming), "cudaEventCreate");
    ck(cudaEventRecord(find_done_, nullptr), "cudaEventRecord");
    ck(cudaStreamSynchronize(nullptr), "sync");
  }
  ~GpuTable() {
    release(t_);
    if (pinned_) cudaFreeHost(pinned_);
    if (find_done_) cudaEventDestroy(find_done_);
  }

  std::mutex mu;

  void pull(const int64_t* keys, size_t n, float* out, cudaStream_t st) {
    if (n == 0) return;
    ck(cudaSetDevice(device_), "cudaSetDevice");
    const uint32_t tick = ++tick_;
    uint32_t* cnt = counter_.get();
    uint32_t* pos = pos_.get(n, st);
    ck(cudaMemsetAsync(cnt, 0, 2 * sizeof(uint32_t), st), "memset");
    with_tile(out, [&](auto tile, auto unit) {
      constexpr int T = decltype(tile)::value;
      using V = typename decltype(unit)::type;
      find_kernel<T, V><<<blocks_for(n * T), kThreads, 0, st>>>(t_, keys, n, out, nullptr, tick, 1, cnt, pos);
    });
    const uint32_t m = read_counters(cnt, st)[0];
    if (m == 0) return;
    bring_in(keys, pos, m, tick, st);
    with_tile(out, [&](auto tile, auto unit) {
      constexpr int T = decltype(tile)::value;
      using V = typename decltype(unit)::type;
      fill_kernel<T, V><<<blocks_for(uint64_t(m) * T), kThreads, 0, st>>>(t_, keys, pos, m, out);
    });
    ck(cudaGetLastError(), "fill_kernel");
    ck(cudaStreamSynchronize(st), "pull");
  }

  void push(const int64_t* keys, size_t n, const float* grads, cudaStream_t st) {
    if (n == 0) return;
    ck(cudaSetDevice(device_), "cudaSetDevice");
    const uint32_t tick = ++tick_;
    uint32_t* flags = counter_.get();  // misses, a gradient not finite
    uint32_t* pos = pos_.get(n, st);
    int64_t* slot_of = slots_.get(n, st);
    ck(cudaMemsetAsync(flags, 0, 2 * sizeof(uint32_t), st), "memset");
    with_tile(grads, [&](auto, auto unit) {
      using V = typename decltype(unit)::type;
      push_prepare_kernel<V><<<blocks_for(n), kThreads, 0, st>>>(
          t_, keys, n, reinterpret_cast<const V*>(grads), n * c_.dim / Units<V>::kFloats, tick, slot_of, flags, pos);
    });
    const std::array<uint32_t, 2> f = read_counters(flags, st);
    if (f[1]) {
      push_reset_kernel<<<blocks_for(n), kThreads, 0, st>>>(t_, slot_of, n);
      ck(cudaGetLastError(), "push_reset_kernel");
      ck(cudaStreamSynchronize(st), "push reset");
      throw heterps::TableError("a gradient is not finite; the batch was not applied");
    }
    if (f[0]) {
      // Making room may move rows (an eviction shifts entries back, a growth rehashes), their counts with them:
      // then every id's slot is looked up again.  The misses' occurrences are counted once they are in.
      const uint64_t moves = moves_;
      try {
        bring_in(keys, pos, f[0], tick, st);
      } catch (...) {
        // The batch is not applied: the occurrences the prepare pass counted go back to 0 (else the next push of
        // those rows would wait for occurrences that never come, and leave their gradients in the accumulator).
        if (moves_ != moves)
          push_resolve_kernel<<<blocks_for(n), kThreads, 0, st>>>(t_, keys, nullptr, uint32_t(n), slot_of, 0);
        push_reset_kernel<<<blocks_for(n), kThreads, 0, st>>>(t_, slot_of, n);
        cudaStreamSynchronize(st);
        throw;
      }
      if (moves_ != moves)
        push_resolve_kernel<<<blocks_for(n), kThreads, 0, st>>>(t_, keys, nullptr, uint32_t(n), slot_of, 0);
      push_resolve_kernel<<<blocks_for(f[0]), kThreads, 0, st>>>(t_, keys, pos, f[0], slot_of, 1);
      ck(cudaGetLastError(), "push_resolve_kernel");
    }
    const Opt o{c_.optimizer, c_.lr, c_.beta1, c_.beta2, c_.epsilon, c_.grad_clip};
    uint32_t* overflow = flags + 1;  // 0 here: the batch was not rejected
    with_tile(grads, [&](auto tile, auto unit) {
      constexpr int T = decltype(tile)::value;
      using V = typename decltype(unit)::type;
      auto launch = [&](auto kind) {
        push_apply_kernel<T, V, decltype(kind)::value>
            <<<blocks_for(n * T), kThreads, 0, st>>>(t_, grads, slot_of, n, o, tick, overflow);
      };
      switch (c_.optimizer) {
        case heterps::Optimizer::kSGD:
          launch(std::integral_constant<int, 0>{});
          break;
        case heterps::Optimizer::kAdagrad:
          launch(std::integral_constant<int, 1>{});
          break;
        default:
          launch(std::integral_constant<int, 2>{});
          break;
      }
    });
    if (read_counters(flags, st)[1])
      throw heterps::TableError(
          "a summed gradient, or the update it makes, is not finite; those rows were left unchanged");
  }

  void find(const int64_t* keys, size_t n, float* out, uint8_t* found, cudaStream_t st) {
    if (n == 0) return;
    ck(cudaSetDevice(device_), "cudaSetDevice");
    with_tile(out, [&](auto tile, auto unit) {
      constexpr int T = decltype(tile)::value;
      using V = typename decltype(unit)::type;
      find_kernel<T, V><<<blocks_for(n * T), kThreads, 0, st>>>(t_, keys, n, out, found, 0, 0, nullptr, nullptr);
    });
    ck(cudaGetLastError(), "find_kernel");
    // find does not wait for its kernel; an eviction on another stream waits for it on the device (it moves
    // rows in place) instead of the host waiting for the whole device.
    ck(cudaEventRecord(find_done_, st), "cudaEventRecord");
  }

  void stats(uint64_t* out4) {
    out4[0] = count_;
    out4[1] = host_->size();
    out4[2] = evicted_;
    out4[3] = promoted_;
  }

  void phase_seconds(double* out, size_t n) const {
    for (size_t i = 0; i < n && i < kPhases; ++i) out[i] = phase_[i];
  }

  // Bytes copied over the link since the table was opened: to the device, from the device.
  void link_bytes(uint64_t* out2) const {
    out2[0] = link_in_;
    out2[1] = link_out_;
  }

  void flush_to_host() {
    ck(cudaSetDevice(device_), "cudaSetDevice");
    if (count_) rebuild(t_.cap, /*all=*/true, nullptr);
  }

 private:
  heterps::TableConfig c_;
  int device_;
  std::shared_ptr<heterps::SparseTable> host_;
  uint32_t hstride_, dstride_;
  uint64_t slot_bytes_, max_rows_;
  Dev t_;
  uint64_t count_ = 0, evicted_ = 0, promoted_ = 0;
  uint64_t link_in_ = 0, link_out_ = 0;  // bytes over the link, to and from the device
  double phase_[kPhases] = {};
  uint32_t tick_ = 1;
  uint64_t moves_ = 0;               // evictions and growths so far: a push's slots are looked up again after one
  cudaEvent_t find_done_ = nullptr;  // the last find's kernel (evictions wait for it on the device)
  DevBuf<uint32_t> counter_, pos_, vcount_, vscores_, bins_, nsel_;
  DevBuf<uint8_t> cub_tmp_;
  DevBuf<int64_t> slots_;
  uint32_t* pinned_ = nullptr;  // 2 words of page-locked host memory for counters read back each batch
  DevBuf<int64_t> mkeys_, sorted_, vkeys_;
  DevBuf<uint64_t> vpos_, starts_;  // the victims' slots, the clusters' first slots
  DevBuf<float> rows_in_, vrows_;
  // Host staging (page-locked): promoted rows (keys, rows, scores), evicted rows, and the eviction pass's
  // copies of the whole score and key arrays.
  PinnedBuf<int64_t> in_keys_, out_keys_;
  PinnedBuf<float> in_rows_, out_rows_;
  PinnedBuf<uint32_t> out_scores_, bins_host_;

  int lfu() const { return c_.eviction == heterps::EvictPolicy::kLFU ? 1 : 0; }

  // Calls f(std::integral_constant<int, T>, unit type) for this table's tile: float4 units where dim is a
  // multiple of 4 and the caller's array is 16-byte aligned (device rows always are), else floats.
  template <class F>
  void with_tile(const float* user, F&& f) const {
    const bool vec = c_.dim % 4 == 0 && (reinterpret_cast<uintptr_t>(user) & 15) == 0;
    with_lanes(vec ? c_.dim / 4 : c_.dim, [&](auto tile) {
      if (vec)
        f(tile, Unit<float4>{});
      else
        f(tile, Unit<float>{});
    });
  }

  // Calls go(std::integral_constant<int, T>) with T lanes for `units` units a row: the power of two at or
  // above, at most a warp.
  template <class G>
  static void with_lanes(uint32_t units, G&& go) {
    int t = 1;
    while (t < 32 && uint32_t(t) < units) t <<= 1;
    switch (t) {
      case 1:
        go(std::integral_constant<int, 1>{});
        break;
      case 2:
        go(std::integral_constant<int, 2>{});
        break;
      case 4:
        go(std::integral_constant<int, 4>{});
        break;
      case 8:
        go(std::integral_constant<int, 8>{});
        break;
      case 16:
        go(std::integral_constant<int, 16>{});
        break;
      default:
        go(std::integral_constant<int, 32>{});
        break;
    }
  }

  Dev alloc(uint64_t cap, cudaStream_t st) {
    Dev d;
    d.cap = cap;
    d.mask = cap - 1;
    d.dim = c_.dim;
    d.hstride = hstride_;
    d.dstride = dstride_;
    d.lfu = lfu();
    try {
      ck(cudaMalloc(&d.keys, cap * 8), "cudaMalloc keys");
      ck(cudaMalloc(&d.scores, cap * 4), "cudaMalloc scores");
      ck(cudaMalloc(&d.count, cap * 8), "cudaMalloc counts");
      ck(cudaMalloc(&d.seen, cap * 4), "cudaMalloc seen");
      ck(cudaMalloc(&d.rows, cap * dstride_ * 4), "cudaMalloc rows");
      ck(cudaMalloc(&d.accum, cap * c_.dim * 4), "cudaMalloc accum");
    } catch (...) {
      release(d);  // the arrays allocated before the one that failed
      throw;
    }
    fill_empty_kernel<<<blocks_for(cap), kThreads, 0, st>>>(d.keys, cap);
    // Every array defined once, here.
    ck(cudaMemsetAsync(d.scores, 0, cap * 4, st), "memset");
    ck(cudaMemsetAsync(d.count, 0, cap * 8, st), "memset");
    ck(cudaMemsetAsync(d.seen, 0, cap * 4, st), "memset");
    ck(cudaMemsetAsync(d.accum, 0, cap * c_.dim * 4, st), "memset");
    return d;
  }

  static void release(Dev& d) {
    cudaFree(d.keys);
    cudaFree(d.scores);
    cudaFree(d.count);
    cudaFree(d.seen);
    cudaFree(d.rows);
    cudaFree(d.accum);
    d = Dev();
  }

  // Two device words, read once the stream has done everything before (one copy, one sync).
  std::array<uint32_t, 2> read_counters(const uint32_t* dev, cudaStream_t st) {
    ck(cudaGetLastError(), "kernel launch");
    ck(cudaMemcpyAsync(pinned_, dev, 2 * sizeof(uint32_t), cudaMemcpyDeviceToHost, st), "copy counters");
    ck(cudaStreamSynchronize(st), "sync");
    return {pinned_[0], pinned_[1]};
  }

  uint32_t read_counter(const uint32_t* cnt, cudaStream_t st) {
    ck(cudaGetLastError(), "kernel launch");
    ck(cudaMemcpyAsync(pinned_, cnt, sizeof(uint32_t), cudaMemcpyDeviceToHost, st), "copy counter");
    ck(cudaStreamSynchronize(st), "sync");
    return pinned_[0];
  }

  // Rows for the keys at pos[0..m) that are not on the device: from the host tier (or initial rows).
  //
  // The misses' keys are made distinct and sorted on the device (the order the host tier takes them in);
  // when the budget needs room, the kernel that marks the victims and copies their rows out is launched before
  // the host takes the incoming rows, so the device works while the host does.  The two touch different ids
  // (victims are resident, the incoming rows are not), so the order is the one of a take after the put.  The
  // victims leave the device only once the host tier holds them; rows taken from the host tier are put back if
  // anything after the take fails: a failed batch loses no row.
  void bring_in(const int64_t* keys, const uint32_t* pos, uint32_t m, uint32_t tick, cudaStream_t st) {
    int64_t* mk = mkeys_.get(m, st);
    gather_keys_kernel<<<blocks_for(m), kThreads, 0, st>>>(keys, pos, m, mk);
    ck(cudaGetLastError(), "gather_keys_kernel");
    std::unique_ptr<PhaseClock> clock = std::make_unique<PhaseClock>(phase_[kDistinct]);
    const uint64_t u = distinct_sorted(mk, m, st);  // mk[0..u): the distinct keys, ascending
    if (max_rows_ && u > max_rows_)
      throw heterps::TableError("a batch needs " + std::to_string(u) +
                                " new device rows, more than the device budget's " + std::to_string(max_rows_) +
                                "; split the batch or raise memory_budget_bytes");
    int64_t* hk = in_keys_.get(u);
    ck(cudaMemcpyAsync(hk, mk, u * 8, cudaMemcpyDeviceToHost, st), "copy keys");
    ck(cudaStreamSynchronize(st), "sync");
    clock.reset();
    link_out_ += u * 8;
    float* dr = rows_in_.get(u * hstride_, st);  // before the take: nothing to put back if it fails
    Eviction room = make_room(u, tick, st);      // launched, not finished: its staging buffers are out_*, not these
    float* rows = nullptr;
    try {
      rows = in_rows_.get(u * hstride_);
      PhaseClock c(phase_[kTake]);
      host_->take_rows(hk, u, rows);  // the host tier's batch call: over its shards, on its threads
    } catch (...) {
      abandon(room, st);
      throw;
    }
    try {
      evict(room, st);
      // Rows of the current batch are never evicted, so a batch touching more rows than the budget holds
      // cannot be served: the table must stay at most ~90% full for probing to terminate.
      if (max_rows_ && (count_ + u) * 10 > t_.cap * 9)
        throw heterps::TableError("a batch touches more distinct ids than the device budget holds (" +
                                  std::to_string(max_rows_) + " rows); split the batch or raise memory_budget_bytes");
      PhaseClock c(phase_[kInsert]);
      ck(cudaMemcpyAsync(dr, rows, u * hstride_ * 4, cudaMemcpyHostToDevice, st), "copy rows");
      link_in_ += u * hstride_ * 4;
      with_lanes(hstride_, [&](auto tile) {
        constexpr int T = decltype(tile)::value;
        insert_kernel<T>
            <<<blocks_for(u * T), kThreads, 0, st>>>(t_, mk, dr, lfu() ? 1u : tick, static_cast<uint32_t>(u), tick);
      });
      ck(cudaGetLastError(), "insert_kernel");
      ck(cudaStreamSynchronize(st), "insert");  // the staging buffers are reused by the next batch
    } catch (const std::exception& e) {
      try {
        host_->put_rows(hk, u, rows, nullptr);  // back where they were (scores: now)
      } catch (const std::exception& back) {
        throw heterps::TableError(std::string(e.what()) + "; putting the " + std::to_string(u) +
                                  " rows taken from the host tier back failed too (" + back.what() +
                                  "): those rows are lost");
      }
      throw;
    }
    count_ += u;
    promoted_ += u;
  }

  // Sorts keys[0..m) on the device and moves the distinct ones to its front; returns how many.
  uint64_t distinct_sorted(int64_t* keys, uint32_t m, cudaStream_t st) {
    if (m > static_cast<uint32_t>(INT32_MAX))
      throw heterps::TableError("a batch of " + std::to_string(m) + " misses: split it (at most 2^31 - 1 a batch)");
    int64_t* sorted = sorted_.get(m, st);
    uint32_t* nsel = nsel_.get();
    size_t sort_bytes = 0, unique_bytes = 0;
    ck(cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, keys, sorted, int(m), 0, 64, st), "sort (size)");
    ck(cub::DeviceSelect::Unique(nullptr, unique_bytes, sorted, keys, nsel, int(m), st), "unique (size)");
    uint8_t* tmp = cub_tmp_.get(std::max(sort_bytes, unique_bytes), st);
    ck(cub::DeviceRadixSort::SortKeys(tmp, sort_bytes, keys, sorted, int(m), 0, 64, st), "sort");
    ck(cub::DeviceSelect::Unique(tmp, unique_bytes, sorted, keys, nsel, int(m), st), "unique");
    return read_counter(nsel, st);
  }

  // An eviction launched on the stream (its victims being marked and copied out while the host works); evict()
  // hands them to the host tier and removes them in place, abandon() unmarks them.
  struct Eviction {
    bool active = false;
    uint64_t max_victims = 0;
  };

  Eviction make_room(uint64_t incoming, uint32_t tick, cudaStream_t st) {
    if (max_rows_ == 0) {  // no budget: the table grows (a rehash into a larger one), nothing leaves it
      if ((count_ + incoming) * 2 > t_.cap) {
        uint64_t cap = t_.cap;
        while ((count_ + incoming) * 2 > cap) cap <<= 1;
        rebuild(cap, false, st);
      }
      return Eviction();
    }
    // Evict the coldest rows this batch's misses need room for, no more (issue 42: a pass of an eighth of the
    // budget made the host tier's share of a pass, hence a step's stall, grow with the budget).
    if (count_ + incoming <= max_rows_ || count_ == 0) return Eviction();
    const uint64_t want = count_ + incoming - max_rows_;
    uint64_t live = 0, need = 0, ties = 0;
    uint32_t nth;
    {
      PhaseClock c(phase_[kSelect]);
      nth = nth_lowest_score(want, &live, &need, &ties, st);
    }
    if (live == 0) return Eviction();
    // Every row below the n-th lowest score, and of the tie at it (LRU's scores are batch ticks) the rows whose key
    // hashes under the cut, about `need` of them, wherever they sit (slot_table.h says why not the first ones); the
    // victim buffer caps the count.
    const uint64_t cut = heterps_slots::tie_cut_for(need, ties);
    Eviction ev;
    ev.max_victims = want + want / 4 + 1024;
    uint32_t* vc = vcount_.get();
    int64_t* vk = vkeys_.get(ev.max_victims, st, true);
    uint32_t* vs = vscores_.get(ev.max_victims, st, true);
    uint64_t* vp = vpos_.get(ev.max_victims, st);
    float* vr = vrows_.get(ev.max_victims * hstride_, st, true);
    starts_.get(ev.max_victims, st);
    int64_t* hk = out_keys_.get(ev.max_victims);
    uint32_t* hs = out_scores_.get(ev.max_victims);
    float* hr = out_rows_.get(ev.max_victims * hstride_);
    // A find on another stream may still be reading rows this eviction will move.
    ck(cudaStreamWaitEvent(st, find_done_, 0), "cudaStreamWaitEvent");
    ck(cudaMemsetAsync(vc, 0, 2 * sizeof(uint32_t), st), "memset");
    with_lanes(hstride_, [&](auto tile) {
      constexpr int T = decltype(tile)::value;
      mark_victims_kernel<T><<<blocks_for(t_.cap * T), kThreads, 0, st>>>(
          t_, nth, cut, tick, static_cast<uint32_t>(ev.max_victims), vc, vk, vs, vp, vr);
    });
    ck(cudaGetLastError(), "mark_victims_kernel");
    // The victims' copy to the host, queued behind the mark for the buffers' whole capacity (their count is not
    // known yet), runs while the host tier takes the incoming rows instead of after it: a quarter more bytes over a
    // link the tiers use at a few percent of its rate, off the step's critical path.
    ck(cudaMemcpyAsync(hk, vk, ev.max_victims * 8, cudaMemcpyDeviceToHost, st), "copy victims");
    ck(cudaMemcpyAsync(hs, vs, ev.max_victims * 4, cudaMemcpyDeviceToHost, st), "copy victims");
    ck(cudaMemcpyAsync(hr, vr, ev.max_victims * hstride_ * 4, cudaMemcpyDeviceToHost, st), "copy victims");
    link_out_ += ev.max_victims * (12 + uint64_t(hstride_) * 4);
    ev.active = true;
    return ev;
  }

  // The n-th lowest score (1-based; n is capped at the live rows, their count stored in *live) of the live
  // slots: a radix select, 8 bits a pass from the top, each pass a histogram on the device and 256 counts
  // read back.  The same value as ordering every live score.  *ties: the live rows scoring exactly that; *need:
  // how many of them the n lowest include.
  uint32_t nth_lowest_score(uint64_t n, uint64_t* live, uint64_t* need, uint64_t* ties, cudaStream_t st) {
    uint32_t* bins = bins_.get();
    uint32_t* h = bins_host_.get(256);
    const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>(blocks_for(t_.cap), 1024));
    uint32_t prefix = 0, high = 0;
    *live = *need = *ties = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      ck(cudaMemsetAsync(bins, 0, 256 * 4, st), "memset");
      score_histogram_kernel<<<blocks, kThreads, 0, st>>>(t_, prefix, high, shift, bins);
      ck(cudaGetLastError(), "score_histogram_kernel");
      ck(cudaMemcpyAsync(h, bins, 256 * 4, cudaMemcpyDeviceToHost, st), "copy histogram");
      ck(cudaStreamSynchronize(st), "sync");
      link_out_ += 256 * 4;
      if (shift == 24) {
        for (int b = 0; b < 256; ++b) *live += h[b];
        if (*live == 0) return 0;
        n = std::min(n, *live);
      }
      int b = 0;
      uint64_t below = 0;
      while (b < 255 && below + h[b] < n) below += h[b++];
      prefix |= uint32_t(b) << shift;
      high |= 255u << shift;
      n -= below;
      *ties = h[b];  // after the last pass: the rows scoring exactly the prefix
    }
    *need = n;
    return prefix;
  }

  void abandon(Eviction& ev, cudaStream_t st) {
    if (!ev.active) return;
    ev.active = false;
    const uint32_t nv = static_cast<uint32_t>(std::min<uint64_t>(read_counter(vcount_.get(), st), ev.max_victims));
    if (nv) unmark_kernel<<<blocks_for(nv), kThreads, 0, st>>>(t_, vpos_.get(), nv);
    cudaStreamSynchronize(st);
  }

  // The victims' rows to the host tier, then their slots removed in place (elect_leaders_kernel, shift_kernel):
  // the cost is the victims and their clusters, not the table.  Until the host tier holds them they stay on the
  // device, so a failure before keeps every row there.
  void evict(Eviction& ev, cudaStream_t st) {
    if (!ev.active) return;
    ev.active = false;
    uint32_t nv = 0;
    {
      // the mark and the victims' copy (queued by make_room); kVictimCopy stays 0: the copy is inside this wait
      PhaseClock c(phase_[kEvictWait]);
      nv = read_counter(vcount_.get(), st);
    }
    nv = static_cast<uint32_t>(std::min<uint64_t>(nv, ev.max_victims));
    if (nv == 0) return;
    std::exception_ptr host_error;
    auto unmark = [&] {
      unmark_kernel<<<blocks_for(nv), kThreads, 0, st>>>(t_, vpos_.get(), nv);
      cudaStreamSynchronize(st);
    };
    int64_t* hk = out_keys_.get(nv);
    uint32_t* hs = out_scores_.get(nv);
    float* hr = out_rows_.get(size_t(nv) * hstride_);
    try {
      PhaseClock c(phase_[kPut]);
      host_->put_rows(hk, nv, hr, hs);  // the host tier's batch call: over its shards, on its threads
    } catch (const heterps::TableError&) {
      // put_rows puts every row, then reports a bad spilled record of another id that its compaction met:
      // the victims are in the host tier, so the eviction completes and the error is raised after it.
      host_error = std::current_exception();
    } catch (...) {
      unmark();  // anything else (no memory): every row stays on the device
      throw;
    }
    uint32_t* n_leaders = vcount_.get() + 1;  // zeroed with the victims' count
    elect_leaders_kernel<<<blocks_for(nv), kThreads, 0, st>>>(t_, vpos_.get(), nv, n_leaders, starts_.get());
    ck(cudaGetLastError(), "elect_leaders_kernel");
    with_lanes(hstride_, [&](auto tile) {
      constexpr int T = decltype(tile)::value;
      shift_kernel<T><<<blocks_for(uint64_t(nv) * T), kThreads, 0, st>>>(t_, starts_.get(), n_leaders);
    });
    ck(cudaGetLastError(), "shift_kernel");
    ++moves_;
    count_ -= nv;
    evicted_ += nv;
    if (host_error) std::rethrow_exception(host_error);
  }

  // Every row into a new table of `cap` slots (a table without a budget grows), or with `all` every row to the
  // host tier (flush_to_host), the new table then empty.  Not on an evicting table's step path.
  void rebuild(uint64_t cap, bool all, cudaStream_t st) {
    const uint64_t vcap = all ? std::max<uint64_t>(count_, 1) : 1;
    uint32_t* vc = vcount_.get();
    int64_t* vk = vkeys_.get(vcap, st, true);  // cleared: an eviction copies these buffers whole
    uint32_t* vs = vscores_.get(vcap, st, true);
    float* vr = vrows_.get(vcap * hstride_, st, true);
    Dev fresh = alloc(cap, st);
    uint32_t nv = 0;
    std::exception_ptr host_error;
    try {
      ck(cudaStreamWaitEvent(st, find_done_, 0), "cudaStreamWaitEvent");
      ck(cudaMemsetAsync(vc, 0, 4, st), "memset");
      with_lanes(hstride_, [&](auto tile) {
        constexpr int T = decltype(tile)::value;
        rehash_kernel<T><<<blocks_for(t_.cap * T), kThreads, 0, st>>>(t_, fresh, all ? 1 : 0, vc, vk, vs, vr);
      });
      ck(cudaGetLastError(), "rehash_kernel");
      nv = read_counter(vc, st);
      if (nv) {
        int64_t* hk = out_keys_.get(nv);
        uint32_t* hs = out_scores_.get(nv);
        float* hr = out_rows_.get(size_t(nv) * hstride_);
        ck(cudaMemcpyAsync(hk, vk, nv * 8, cudaMemcpyDeviceToHost, st), "copy rows");
        ck(cudaMemcpyAsync(hs, vs, nv * 4, cudaMemcpyDeviceToHost, st), "copy rows");
        ck(cudaMemcpyAsync(hr, vr, size_t(nv) * hstride_ * 4, cudaMemcpyDeviceToHost, st), "copy rows");
        ck(cudaStreamSynchronize(st), "sync");
        link_out_ += uint64_t(nv) * (12 + hstride_ * 4);
        try {
          host_->put_rows(hk, nv, hr, hs);
        } catch (const heterps::TableError&) {
          host_error = std::current_exception();  // every row is in: complete, then raise (as evict does)
        }
      }
    } catch (...) {
      release(fresh);  // t_ still holds every row
      throw;
    }
    release(t_);
    t_ = fresh;
    ++moves_;
    count_ -= nv;
    evicted_ += nv;
    if (host_error) std::rethrow_exception(host_error);
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

int heterps_gpu_table_phase_seconds(const char* name, double* out, size_t n) {
  return guarded([&] {
    auto t = need(name);
    std::lock_guard<std::mutex> lock(t->mu);
    t->phase_seconds(out, n);
  });
}

int heterps_gpu_table_link_bytes(const char* name, uint64_t* out2) {
  return guarded([&] {
    auto t = need(name);
    std::lock_guard<std::mutex> lock(t->mu);
    t->link_bytes(out2);
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
