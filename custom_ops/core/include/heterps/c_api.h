// C API over the core table: used by the ctypes binding (heterps_paddle/table/sparse_table.py) and shared,
// through the same loaded library, with the Paddle ops, so both see one process-wide table registry.
// Every function returns 0 on success and -1 on error; heterps_last_error() gives the message
// (thread-local).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char* heterps_last_error(void);
int heterps_table_open(const char* name, const char* config);  // get or create
int heterps_table_drop(const char* name);
int heterps_table_dim(const char* name, uint32_t* dim, uint32_t* stride);
int heterps_table_pull(const char* name, const int64_t* keys, size_t n, float* out);
int heterps_table_push(const char* name, const int64_t* keys, size_t n, const float* grads);
int heterps_table_assign(const char* name, const int64_t* keys, size_t n, const float* weights);
int heterps_table_peek(const char* name, const int64_t* keys, size_t n, float* rows, uint8_t* found);
// The host tier's batch calls (SparseTable::take_rows / put_rows): full rows of stride floats; scores may be null.
int heterps_table_take_rows(const char* name, const int64_t* keys, size_t n, float* rows);
int heterps_table_put_rows(const char* name, const int64_t* keys, size_t n, const float* rows, const uint32_t* scores);
int heterps_table_save(const char* name, const char* path);
int heterps_table_load(const char* name, const char* path);
int heterps_table_stats(const char* name, uint64_t* out, int n_fields);
int heterps_table_clear(const char* name);
int heterps_table_config(const char* name, char* buf, size_t len);
// Lost ids as text, one "id<TAB>what was wrong" line each; *needed: the buffer size it takes (with the NUL).
int heterps_table_lost(const char* name, char* buf, size_t len, size_t* needed);
int heterps_table_forget_lost(const char* name, uint64_t* n);
void heterps_inject_write_failure_after(int64_t n);

#ifdef __cplusplus
}
#endif
