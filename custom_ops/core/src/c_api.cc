#include "heterps/c_api.h"

#include <cstring>
#include <map>
#include <mutex>

#include "heterps/c_api_guard.h"
#include "heterps/table.h"
#include "io.h"

namespace heterps {

namespace {
std::mutex g_registry_mu;
std::map<std::string, std::shared_ptr<SparseTable>>& registry() {
  static auto* r = new std::map<std::string, std::shared_ptr<SparseTable>>();  // never destroyed: ops may
  return *r;                                                                   // run during interpreter exit
}
}  // namespace

std::shared_ptr<SparseTable> get_or_create_table(const std::string& name, const std::string& config_text) {
  TableConfig c = TableConfig::parse(config_text);
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = registry().find(name);
  if (it != registry().end()) {
    const TableConfig& o = it->second->config();
    // Same name must mean the same rows and the same training math; placement (budget, SSD directory,
    // eviction, shards) may differ, e.g. the GPU table's host tier asks for the table with its own budget.
    if (o.dim != c.dim || o.optimizer != c.optimizer || o.lr != c.lr || o.beta1 != c.beta1 || o.beta2 != c.beta2 ||
        o.epsilon != c.epsilon || o.init_range != c.init_range || o.seed != c.seed) {
      throw TableError("table '" + name + "' already exists with config '" + o.to_string() + "', asked for '" +
                       c.to_string() + "'");
    }
    return it->second;
  }
  auto t = std::make_shared<SparseTable>(c);
  registry()[name] = t;
  return t;
}

std::shared_ptr<SparseTable> find_table(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}

bool drop_table(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  return registry().erase(name) > 0;
}

void SparseTable::inject_write_failure_after(int64_t n) {
  io::inject_write_failure_after(n);
}

}  // namespace heterps

namespace {
thread_local std::string t_error;

template <class F>
int guarded(F&& f) {
  return heterps::guarded(t_error, f);
}

std::shared_ptr<heterps::SparseTable> need(const char* name) {
  auto t = heterps::find_table(name);
  if (!t) throw heterps::TableError(std::string("no sparse table named '") + name + "' in this process");
  return t;
}
}  // namespace

extern "C" {

const char* heterps_last_error(void) {
  return t_error.c_str();
}

int heterps_table_open(const char* name, const char* config) {
  return guarded([&] { heterps::get_or_create_table(name, config); });
}
int heterps_table_drop(const char* name) {
  return guarded([&] {
    if (!heterps::drop_table(name)) throw heterps::TableError(std::string("no sparse table named '") + name + "'");
  });
}
int heterps_table_dim(const char* name, uint32_t* dim, uint32_t* stride) {
  return guarded([&] {
    auto t = need(name);
    *dim = t->config().dim;
    *stride = t->config().stride();
  });
}
int heterps_table_pull(const char* name, const int64_t* keys, size_t n, float* out) {
  return guarded([&] { need(name)->pull(keys, n, out); });
}
int heterps_table_push(const char* name, const int64_t* keys, size_t n, const float* grads) {
  return guarded([&] { need(name)->push(keys, n, grads); });
}
int heterps_table_assign(const char* name, const int64_t* keys, size_t n, const float* weights) {
  return guarded([&] { need(name)->assign(keys, n, weights); });
}
int heterps_table_peek(const char* name, const int64_t* keys, size_t n, float* rows, uint8_t* found) {
  return guarded([&] { need(name)->peek(keys, n, rows, found); });
}
int heterps_table_take_rows(const char* name, const int64_t* keys, size_t n, float* rows) {
  return guarded([&] { need(name)->take_rows(keys, n, rows); });
}
int heterps_table_put_rows(const char* name, const int64_t* keys, size_t n, const float* rows, const uint32_t* scores) {
  return guarded([&] { need(name)->put_rows(keys, n, rows, scores); });
}
int heterps_table_save(const char* name, const char* path) {
  return guarded([&] { need(name)->save(path); });
}
int heterps_table_load(const char* name, const char* path) {
  return guarded([&] { need(name)->load(path); });
}
int heterps_table_stats(const char* name, uint64_t* out, int n_fields) {
  return guarded([&] {
    uint64_t all[heterps::TableStats::kFields];
    need(name)->stats().to_array(all);
    for (int i = 0; i < n_fields && i < heterps::TableStats::kFields; ++i) out[i] = all[i];
  });
}
int heterps_table_clear(const char* name) {
  return guarded([&] { need(name)->clear(); });
}
int heterps_table_config(const char* name, char* buf, size_t len) {
  return guarded([&] {
    std::string s = need(name)->config().to_string();
    if (s.size() + 1 > len) throw heterps::TableError("config buffer too small");
    std::memcpy(buf, s.c_str(), s.size() + 1);
  });
}
int heterps_table_lost(const char* name, char* buf, size_t len, size_t* needed) {
  return guarded([&] {
    std::string text;  // one "id<TAB>what was wrong" line per lost id
    for (const auto& [key, why] : need(name)->lost()) text += std::to_string(key) + "\t" + why + "\n";
    *needed = text.size() + 1;
    if (text.size() + 1 <= len) std::memcpy(buf, text.c_str(), text.size() + 1);
  });
}
int heterps_table_forget_lost(const char* name, uint64_t* n) {
  return guarded([&] { *n = need(name)->forget_lost(); });
}
void heterps_inject_write_failure_after(int64_t n) {
  heterps::io::inject_write_failure_after(n);
}

}  // extern "C"
