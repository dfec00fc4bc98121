// Key hashing shared by the CPU core and the CUDA table (one definition, usable on host and device).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HETERPS_HOST_DEVICE __host__ __device__
#else
#define HETERPS_HOST_DEVICE
#endif

namespace heterps {

// splitmix64's finaliser: a cheap, well-mixed 64-bit permutation.
HETERPS_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Where a key lands in an index (and which shard owns it): the golden-ratio offset keeps key 0 away from 0.
HETERPS_HOST_DEVICE inline uint64_t key_hash(int64_t key) {
  return mix64(static_cast<uint64_t>(key) + 0x9e3779b97f4a7c15ull);
}

}  // namespace heterps
