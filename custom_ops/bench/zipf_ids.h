// Zipf-distributed ids for the table benchmarks (table_bench.cu, tier_bench.cu): one generator, so both
// measure the same batches.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace heterps_bench {

// Ranks 0..rows-1 with weight 1 / (r + 1)^s, drawn by inverting the cumulative weights.  A guide table
// (the first rank of each of `rows` equal slices of the total weight) narrows each draw's search to a few
// ranks, so a batch of 2^20 draws over 2^24 ranks costs a fraction of a second instead of a binary search
// through 128 MB per draw; the rank drawn is the same as that search's.
class ZipfRanks {
 public:
  ZipfRanks(uint64_t rows, double s) : cdf_(rows), guide_(rows + 1) {
    double acc = 0;
    for (uint64_t r = 0; r < rows; ++r) cdf_[r] = (acc += std::pow(double(r + 1), -s));
    total_ = acc;
    uint64_t r = 0;
    for (uint64_t b = 0; b <= rows; ++b) {
      const double edge = total_ * double(b) / double(rows);
      while (r + 1 < rows && cdf_[r] < edge) ++r;
      guide_[b] = r;
    }
  }
  double total() const { return total_; }
  // The first rank whose cumulative weight reaches x (0 <= x <= total()).
  uint64_t rank_of(double x) const {
    const uint64_t rows = cdf_.size();
    uint64_t b = static_cast<uint64_t>(x / total_ * double(rows));
    if (b >= rows) b = rows - 1;
    uint64_t lo = guide_[b] > 0 ? guide_[b] - 1 : 0, hi = std::min(rows - 1, guide_[b + 1] + 1);
    if ((lo > 0 && cdf_[lo - 1] >= x) || cdf_[hi] < x) lo = 0, hi = rows - 1;  // rounding at a slice edge
    return static_cast<uint64_t>(std::lower_bound(cdf_.begin() + lo, cdf_.begin() + hi + 1, x) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
  std::vector<uint64_t> guide_;
  double total_ = 0;
};

// The id of rank r: ranks are scattered over [0, rows) by an odd multiplier (a bijection mod a power of two,
// cycle-walked back into range), so hot ids do not sit in neighbouring slots.
inline int64_t id_of_rank(uint64_t r, uint64_t rows) {
  uint64_t p2 = 1;
  while (p2 < rows) p2 <<= 1;
  uint64_t x = r;
  do x = (x * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) & (p2 - 1);
  while (x >= rows);
  return static_cast<int64_t>(x);
}

// n ids drawn from Zipf(s) over [0, rows): rank r (0 = hottest) has weight 1 / (r + 1)^s, its id
// id_of_rank(r).  *unique: how many distinct ids the batch holds.
inline std::vector<int64_t> zipf_ids(const ZipfRanks& z, uint64_t rows, uint64_t n, uint64_t seed, uint64_t* unique) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, z.total());
  std::vector<int64_t> out(n);
  for (auto& k : out) k = id_of_rank(z.rank_of(u(rng)), rows);
  std::vector<int64_t> sorted(out);
  std::sort(sorted.begin(), sorted.end());
  *unique = static_cast<uint64_t>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
  return out;
}

inline std::vector<int64_t> zipf_ids(uint64_t rows, uint64_t n, double s, uint64_t seed, uint64_t* unique) {
  return zipf_ids(ZipfRanks(rows, s), rows, n, seed, unique);
}

}  // namespace heterps_bench
