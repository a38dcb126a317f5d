// Binned exact sums (engine/dist/exact_sum.h).
#include "engine/dist/exact_sum.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace ft {
namespace {

__extension__ typedef __int128 Int128;  // GCC's and Clang's 128-bit integers (not ISO C++)
__extension__ typedef unsigned __int128 UInt128;

constexpr int8_t kEmpty = -1;      // nothing added yet: the sum is 0
constexpr int8_t kPoisoned = 127;  // a NaN or infinity was added; the max of indices spreads it

// The IEEE layout of T: a value is sign · M · 2^(pos + kMinExp) with M an
// integer of at most kMantBits bits and pos >= 0 its lowest bit's place on
// the grid (0 = the smallest subnormal's bit).
template <typename T>
struct Layout;
template <>
struct Layout<float> {
  using Bits = uint32_t;
  static constexpr int kMantBits = 24, kExpBits = 8, kMinExp = -149;
};
template <>
struct Layout<double> {
  using Bits = uint64_t;
  static constexpr int kMantBits = 53, kExpBits = 11, kMinExp = -1074;
};

struct Parts {
  bool negative = false, finite = true;
  uint64_t mantissa = 0;
  int pos = 0;
};

template <typename T>
Parts Split(T x) {
  using L = Layout<T>;
  typename L::Bits bits;
  std::memcpy(&bits, &x, sizeof(bits));
  constexpr int kFraction = L::kMantBits - 1;
  constexpr uint64_t kExpMask = (uint64_t{1} << L::kExpBits) - 1;
  Parts p;
  p.negative = (bits >> (sizeof(bits) * 8 - 1)) != 0;
  const uint64_t exponent = (static_cast<uint64_t>(bits) >> kFraction) & kExpMask;
  const uint64_t fraction = static_cast<uint64_t>(bits) & ((uint64_t{1} << kFraction) - 1);
  if (exponent == kExpMask) p.finite = false;
  p.mantissa = exponent == 0 ? fraction : fraction | (uint64_t{1} << kFraction);
  p.pos = exponent == 0 ? 0 : static_cast<int>(exponent) - 1;
  return p;
}

}  // namespace

template <typename T>
ExactSum<T>::ExactSum(int64_t n)
    : top_(static_cast<size_t>(n), kEmpty), bins_(static_cast<size_t>(2 * n), 0) {}

template <typename T>
void ExactSum<T>::Clear() {
  std::fill(top_.begin(), top_.end(), kEmpty);
  std::fill(bins_.begin(), bins_.end(), 0);
}

template <typename T>
void ExactSum<T>::Raise(int64_t k, int8_t top) {
  int8_t& now = top_[static_cast<size_t>(k)];
  int64_t* bin = &bins_[static_cast<size_t>(2 * k)];
  if (now != kEmpty && top == now + 1) {
    bin[1] = bin[0];  // the old top bin is the new low one; the old low bin leaves the window
    bin[0] = 0;
  } else if (now != kEmpty && top > now + 1) {
    bin[0] = bin[1] = 0;
  }
  now = top;
}

template <typename T>
void ExactSum<T>::AddOne(int64_t k, T x) {
  if (x == 0) return;
  const Parts p = Split(x);
  int8_t& top = top_[static_cast<size_t>(k)];
  if (top == kPoisoned) return;
  int64_t* bin = &bins_[static_cast<size_t>(2 * k)];
  if (!p.finite) {
    top = kPoisoned;
    bin[0] = bin[1] = 0;
    return;
  }
  const int8_t needed = static_cast<int8_t>((p.pos + Layout<T>::kMantBits - 1) / kBinBits);
  if (top < needed) Raise(k, needed);
  // The magnitude on the window's grid: shifted up into it, or truncated below its base.
  const int shift = p.pos - (top - 1) * kBinBits;
  UInt128 v = 0;
  if (shift >= 0) {
    v = static_cast<UInt128>(p.mantissa) << shift;
  } else if (shift > -64) {
    v = p.mantissa >> -shift;
  }
  const auto high = static_cast<int64_t>(v >> kBinBits);
  const auto low = static_cast<int64_t>(v & ((static_cast<UInt128>(1) << kBinBits) - 1));
  bin[0] += p.negative ? -high : high;
  bin[1] += p.negative ? -low : low;
}

template <typename T>
void ExactSum<T>::Add(const T* x) {
  const int64_t n = size();
  for (int64_t k = 0; k < n; ++k) AddOne(k, x[k]);
}

template <typename T>
Status ExactSum<T>::AllReduce(Collective* ranks) {
  if (ranks->world() == 1) return Status::OK();
  std::vector<int8_t> agreed = top_;
  FT_RETURN_IF_ERROR(ranks->AllReduceMax(agreed.data(), size()).WithContext("exact sum: window indices"));
  for (int64_t k = 0; k < size(); ++k) {
    const int8_t top = agreed[static_cast<size_t>(k)];
    if (top == kPoisoned) {
      top_[static_cast<size_t>(k)] = kPoisoned;
      bins_[static_cast<size_t>(2 * k)] = bins_[static_cast<size_t>(2 * k + 1)] = 0;
    } else if (top > top_[static_cast<size_t>(k)]) {
      Raise(k, top);
    }
  }
  return ranks->AllReduceSum(bins_.data(), 2 * size()).WithContext("exact sum: bins");
}

template <typename T>
void ExactSum<T>::Round(T* out) const {
  for (int64_t k = 0; k < size(); ++k) {
    const int8_t top = top_[static_cast<size_t>(k)];
    if (top == kPoisoned) {
      out[k] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    if (top == kEmpty) {
      out[k] = 0;
      continue;
    }
    const int64_t* bin = &bins_[static_cast<size_t>(2 * k)];
    // Both bins in one integer (the top one is at most 2^63 · 2^40: 103 bits), rounded once to
    // double, then placed on the grid; the last rounding to float comes after.
    const Int128 whole = static_cast<Int128>(bin[0]) * (static_cast<Int128>(1) << kBinBits) + bin[1];
    const double placed = std::ldexp(static_cast<double>(whole), (top - 1) * kBinBits + Layout<T>::kMinExp);
    out[k] = static_cast<T>(placed);
  }
}

template class ExactSum<float>;
template class ExactSum<double>;

}  // namespace ft
