#include <cmath>
#include <cstdlib>
#include <sstream>

#include "heterps/table.h"

namespace heterps {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n");
  size_t e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

double parse_number(const std::string& key, const std::string& value) {
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end == nullptr || *end != '\0') {
    throw TableError("table config: " + key + "=" + value + " is not a number");
  }
  return v;
}

uint64_t parse_uint(const std::string& key, const std::string& value) {
  char* end = nullptr;
  if (value.empty() || value[0] == '-') throw TableError("table config: " + key + " must be >= 0, got " + value);
  unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (end == nullptr || *end != '\0') throw TableError("table config: " + key + "=" + value + " is not an integer");
  return static_cast<uint64_t>(v);
}

}  // namespace

TableConfig TableConfig::parse(const std::string& text) {
  TableConfig c;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ';')) {
    item = trim(item);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) throw TableError("table config: expected key=value, got '" + item + "'");
    std::string k = trim(item.substr(0, eq)), v = trim(item.substr(eq + 1));
    if (k == "dim") {
      uint64_t d = parse_uint(k, v);
      if (d == 0 || d > 4096) throw TableError("table config: dim must be in [1, 4096], got " + v);
      c.dim = static_cast<uint32_t>(d);
    } else if (k == "optimizer") {
      if (v == "sgd")
        c.optimizer = Optimizer::kSGD;
      else if (v == "adagrad")
        c.optimizer = Optimizer::kAdagrad;
      else if (v == "adam")
        c.optimizer = Optimizer::kAdam;
      else
        throw TableError("table config: optimizer must be sgd, adagrad or adam, got '" + v + "'");
    } else if (k == "lr")
      c.lr = static_cast<float>(parse_number(k, v));
    else if (k == "beta1")
      c.beta1 = static_cast<float>(parse_number(k, v));
    else if (k == "beta2")
      c.beta2 = static_cast<float>(parse_number(k, v));
    else if (k == "epsilon")
      c.epsilon = static_cast<float>(parse_number(k, v));
    else if (k == "grad_clip")
      c.grad_clip = static_cast<float>(parse_number(k, v));
    else if (k == "init_range")
      c.init_range = static_cast<float>(parse_number(k, v));
    else if (k == "seed")
      c.seed = parse_uint(k, v);
    else if (k == "memory_budget_bytes")
      c.memory_budget_bytes = parse_uint(k, v);
    else if (k == "host_memory_budget_bytes")
      c.host_memory_budget_bytes = parse_uint(k, v);
    else if (k == "ssd_dir")
      c.ssd_dir = v;
    else if (k == "eviction") {
      if (v == "lru")
        c.eviction = EvictPolicy::kLRU;
      else if (v == "lfu")
        c.eviction = EvictPolicy::kLFU;
      else
        throw TableError("table config: eviction must be lru or lfu, got '" + v + "'");
    } else if (k == "host_threads") {
      uint64_t t = parse_uint(k, v);
      if (t > 1024)
        throw TableError("table config: host_threads must be in [0, 1024] (0 = every usable CPU), got " + v);
      c.host_threads = static_cast<uint32_t>(t);
    } else if (k == "shards") {
      uint64_t s = parse_uint(k, v);
      c.shards = static_cast<uint32_t>(s);
    } else {
      throw TableError("table config: unknown key '" + k + "'");
    }
  }
  c.validate();
  return c;
}

void TableConfig::validate() const {
  if (dim == 0 || dim > 4096) throw TableError("table config: dim must be in [1, 4096]");
  if (!(std::isfinite(lr) && lr > 0)) throw TableError("table config: lr must be a finite positive number");
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    throw TableError("table config: beta1 and beta2 must be in [0, 1)");
  if (!(std::isfinite(epsilon) && epsilon > 0)) throw TableError("table config: epsilon must be positive");
  if (!(std::isfinite(init_range) && init_range >= 0)) throw TableError("table config: init_range must be >= 0");
  if (!(std::isfinite(grad_clip) && grad_clip >= 0)) throw TableError("table config: grad_clip must be >= 0 (0 = off)");
  if (shards == 0 || shards > 1024 || (shards & (shards - 1)) != 0)
    throw TableError("table config: shards must be a power of two in [1, 1024]");
  if (host_threads > 1024) throw TableError("table config: host_threads must be in [0, 1024] (0 = every usable CPU)");
  if (ssd_dir.find(';') != std::string::npos) throw TableError("table config: ssd_dir may not contain ';'");
}

std::string TableConfig::to_string() const {
  std::ostringstream o;
  o.precision(9);
  const char* opt = optimizer == Optimizer::kSGD ? "sgd" : optimizer == Optimizer::kAdagrad ? "adagrad" : "adam";
  o << "dim=" << dim << ";optimizer=" << opt << ";lr=" << lr << ";beta1=" << beta1 << ";beta2=" << beta2
    << ";epsilon=" << epsilon << ";init_range=" << init_range << ";seed=" << seed
    << ";memory_budget_bytes=" << memory_budget_bytes << ";host_memory_budget_bytes=" << host_memory_budget_bytes
    << ";ssd_dir=" << ssd_dir << ";eviction=" << (eviction == EvictPolicy::kLRU ? "lru" : "lfu") << ";shards=" << shards
    << ";grad_clip=" << grad_clip << ";host_threads=" << host_threads;
  return o.str();
}

uint32_t TableConfig::state_dim() const {
  switch (optimizer) {
    case Optimizer::kSGD:
      return 0;
    case Optimizer::kAdagrad:
      return dim;  // sum of squared gradients per column
    case Optimizer::kAdam:
      return 2 * dim + 2;  // m, v per column, then beta1^t, beta2^t for the row
  }
  return 0;
}

// A resident row costs its floats plus its share of the hash index (16-byte entries kept at most half
// full, so up to 32 bytes a row).  Counting the index keeps the budget honest for small dims.
uint64_t TableConfig::row_cost_bytes() const {
  return uint64_t(stride()) * 4 + 32;
}

void TableStats::to_array(uint64_t* out) const {
  const uint64_t v[kFields] = {rows_in_memory,
                               rows_on_ssd,
                               hits,
                               misses,
                               ssd_promotions,
                               evictions,
                               bytes_in_memory,
                               bytes_on_ssd,
                               spill_errors,
                               memory_budget_bytes,
                               capacity_rows,
                               compactions,
                               bytes_ssd_index,
                               rows_lost};
  for (int i = 0; i < kFields; ++i) out[i] = v[i];
}

// Standard CRC-32 (zlib polynomial) so Python's zlib.crc32 can cross-check checkpoint files.
uint32_t crc32_update(uint32_t crc, const void* data, size_t len) {
  static uint32_t table[8][256];
  static bool init = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int t = 1; t < 8; ++t) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
    return true;
  }();
  (void)init;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  // slicing-by-8: checkpoints of a few GB should not be checksum-bound.
  while (len >= 8) {
    uint32_t lo = crc ^ (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
    crc = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
          table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
    p += 8;
    len -= 8;
  }
  while (len--) crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

}  // namespace heterps
