// Runs HierarchicalKV's own benchmark routine (test_one_api from its merlin_hashtable_benchmark.cc.cu) for
// one dim, load factor 0.5, 1M keys a call, the calls our table has a counterpart for, and prints one JSON
// line in keys/s.  Nothing of HKV is in this repository: hkv_compare.sh compiles this file against a copy of
// HKV's include/ and benchmark/ (Apache-2.0; HKV_DIR, default .hkv), for benchmarking only.  HKV's `main`
// is renamed away so that this one chooses what runs (its full main takes minutes of GPU time); each figure
// is, as in HKV's test_main, the better of two calls on a table cleared once.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -I HKV/include -I HKV/benchmark \
//        custom_ops/bench/hkv_driver.cu -o hkv_driver
//   ./hkv_driver DIM CAPACITY HBM_GB      e.g. ./hkv_driver 8 134217728 4
#define main hkv_benchmark_main
#include "merlin_hashtable_benchmark.cc.cu"
#undef main

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DIM CAPACITY HBM_GB\n", argv[0]);
    return 2;
  }
  const size_t dim = std::strtoull(argv[1], nullptr, 10);
  const size_t capacity = std::strtoull(argv[2], nullptr, 10);
  const size_t hbm = std::strtoull(argv[3], nullptr, 10);
  const size_t per_op = 1024 * 1024;
  const float load_factor = 0.5f;
  cudaDeviceProp props;
  CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
  TableOptions options;
  options.init_capacity = capacity;
  options.max_capacity = capacity;
  options.dim = dim;
  options.max_hbm_for_vectors = nv::merlin::GB(hbm);
  options.io_by_cpu = false;
  using Table = nv::merlin::HashTable<K, V, S, EvictStrategy::kLru, Sm80>;
  auto table = std::make_shared<Table>();
  table->init(options);
  const std::pair<API_Select, const char*> apis[] = {{API_Select::find, "find"},
                                                     {API_Select::find_or_insert, "find_or_insert"},
                                                     {API_Select::assign, "assign"},
                                                     {API_Select::insert_or_assign, "insert_or_assign"}};
  std::printf("{\"device\": \"%s\", \"dim\": %zu, \"capacity\": %zu, \"load_factor\": %.2f, \"keys_per_call\": %zu",
              props.name, dim, capacity, load_factor, per_op);
  for (const auto& api : apis) {
    table->clear();
    CUDA_CHECK(cudaDeviceSynchronize());
    // test_one_api returns billions (2^30) of keys per second; printed here in keys per second
    const float r1 = test_one_api<Table>(table, api.first, dim, capacity, per_op, load_factor);
    const float r2 = test_one_api<Table>(table, api.first, dim, capacity, per_op, load_factor);
    std::printf(", \"%s_keys_per_s\": %.4g", api.second, double(std::max(r1, r2)) * 1073741824.0);
  }
  std::printf("}\n");
  return 0;
}
