// Order-independent sums of float (or double) vectors, within a rank and
// across ranks (issue #30): the result depends only on the multiset of the
// vectors added, not on how they were split into micro-batches and ranks
// or on the order they met in, so 1, 2 or 8 ranks and any resume give the
// same bits.
//
// How: each element keeps a binned fixed-point accumulator (the idea of
// ReproBLAS's indexed sums, on integers). The element's bits are cut on one
// global grid of bins kBinBits wide, from the type's smallest bit up; an
// accumulator holds the window of the two bins that reach the largest value
// seen so far (an int8 index) and, per bin, the exact int64 sum of every
// value's bits that fall in it. A value's bits below the window are dropped
// (truncation of its magnitude on the grid: a property of the value and of
// the window, never of the order); when a larger value moves the window up,
// the bins that leave it are dropped whole, which is exactly the bits every
// earlier value would have lost had the window been there from the start.
// Across ranks: the maximum of the indices (an int8 all-reduce), each rank
// moves its window there, then an exact int64 sum of the bins. Rounding to
// the element type happens once, in Round.
//
// Precision: every value keeps at least kBinBits (40) bits below the top of
// the element's largest value (fp32 sums keep 24 below the partial sum's),
// so a sum is exact for values within 2^16 of the largest and otherwise
// errs by at most count · 2^-40 of it. Capacity: 2^22 values per element
// per sum (each bin's int64 has 23 bits of headroom over a 40-bit piece).
// A NaN or infinity anywhere makes that element NaN, on every rank.
//
// Cost: 17 bytes per element in memory (two int64 bins and the index) and on
// the wire (ExactSum::kWireBytesPerElement), against 4 for an fp32 sum.
//
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/dist/collective.h"

namespace ft {

template <typename T>
class ExactSum {
 public:
  static constexpr int kBinBits = 40;
  static constexpr int64_t kWireBytesPerElement = 2 * sizeof(int64_t) + sizeof(int8_t);

  explicit ExactSum(int64_t n);
  int64_t size() const { return static_cast<int64_t>(top_.size()); }

  // Back to the empty sum (every element 0).
  void Clear();
  // Adds x[0..size()) element-wise.
  void Add(const T* x);
  // Makes this sum the sum over every rank's (each rank calls it; every
  // rank ends with the same bits). Unavailable as the collective reports it.
  Status AllReduce(Collective* ranks);
  // out[0..size()) = the sums, each rounded once to T.
  void Round(T* out) const;

 private:
  void AddOne(int64_t k, T x);
  // Moves element k's window up so its top bin is `top` (drops what leaves it).
  void Raise(int64_t k, int8_t top);

  std::vector<int8_t> top_;    // bin of the window's top; kEmpty, or kPoisoned for a NaN/inf
  std::vector<int64_t> bins_;  // 2 per element: [2k] the top bin, [2k + 1] the one below
};

extern template class ExactSum<float>;
extern template class ExactSum<double>;

}  // namespace ft
