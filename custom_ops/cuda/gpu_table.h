// C interface of the CUDA table (custom_ops/cuda/gpu_table.cu).  No CUDA headers here: the Paddle ops and
// the benchmark call it with raw device pointers and a stream given as void*.
// Every function returns 0 on success, -1 on error (message from heterps_gpu_last_error()).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char* heterps_gpu_last_error(void);
// Get or create the device table `name` from a core config string (same keys as the CPU table;
// memory_budget_bytes bounds the device-resident rows, the overflow goes to the host table of the same
// config, which itself spills to ssd_dir).  Device memory: a table of budget / (2 x a slot's bytes) rows holds
// twice that many slots (rounded up to a power of two): 1 to 2 times the budget, plus the batches' staging
// buffers.  Evictions remove rows in place; only a table without a budget rehashes (into a larger one) to grow.
int heterps_gpu_table_open(const char* name, const char* config, int device);
int heterps_gpu_table_drop(const char* name);
// keys: device int64[n]; out: device float[n * dim].  Missing rows are created (same deterministic init
// as the CPU core) or promoted from the host tier.
int heterps_gpu_table_pull(const char* name, const int64_t* keys, size_t n, float* out, void* stream);
// grads: device float[n * dim]; repeated keys are summed before the fused optimizer update.
int heterps_gpu_table_push(const char* name, const int64_t* keys, size_t n, const float* grads, void* stream);
// Read-only lookup of resident rows (no insert, no score update): found[i] = 1 if resident; the out row
// of an absent id is left as it was (as HierarchicalKV's find leaves it), or zeroed when found is null.
// For the throughput benchmark and tests.
int heterps_gpu_table_find(const char* name, const int64_t* keys, size_t n, float* out, uint8_t* found, void* stream);
// rows resident on the device, rows in the host tier, evictions to host, promotions from host
int heterps_gpu_table_stats(const char* name, uint64_t* out4);
// Bytes the table has copied over the link since it was opened: out2[0] to the device, out2[1] from it
// (rows and keys moved between the tiers, the eviction threshold's histograms).
int heterps_gpu_table_link_bytes(const char* name, uint64_t* out2);
// Host seconds the table's batches have spent moving rows between the tiers, cumulative, in this order (n
// at most 7): making the misses distinct, selecting the eviction threshold, taking rows from the host tier,
// waiting for the victims to be marked and copied to the host (behind the take), copying them (now 0: inside the
// wait), putting them into the host tier, inserting the promoted rows.
int heterps_gpu_table_phase_seconds(const char* name, double* out, size_t n);
// Moves every device row to the host table (used before save): afterwards the host table is complete.
int heterps_gpu_table_flush_to_host(const char* name);

#ifdef __cplusplus
}
#endif
