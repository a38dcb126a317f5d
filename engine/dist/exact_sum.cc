// Binned exact sums (engine/dist/exact_sum.h).
#include "engine/dist/exact_sum.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "common/openmp_start.h"

namespace ft {
namespace {

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
  // The magnitude M·2^s on the window's grid (s: its lowest bit above the window's base), cut
  // at the bin boundary; bits below the base are truncated. At most 2·kBinBits - 24 for
  // float and 2·kBinBits - 53 for double, so the shifts stay under 64 (left shifts drop only
  // bits the mask drops too).
  const int s = p.pos - (top - 1) * kBinBits;
  constexpr uint64_t kMask = (uint64_t{1} << kBinBits) - 1;
  const auto shifted = [](uint64_t m, int by) { return by >= 0 ? m << by : by > -64 ? m >> -by : 0; };
  const auto high = static_cast<int64_t>(shifted(p.mantissa, s - kBinBits));
  const auto low = static_cast<int64_t>(shifted(p.mantissa, s) & kMask);
  bin[0] += p.negative ? -high : high;
  bin[1] += p.negative ? -low : low;
}

template <typename T>
void ExactSum<T>::Add(const T* x) {
  const int64_t n = size();
  // Elements are independent: threads change the time, never a bit.
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
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
  // 2^(base of the window) for each top bin: multiplying by a power of two is exact, so it is
  // ldexp's result wherever that power is a normal double (always for float; a double sum
  // within 2^-1000 of zero goes through ldexp).
  constexpr int kTops = ((1 << Layout<T>::kExpBits) - 3 + Layout<T>::kMantBits - 1) / kBinBits + 1;
  double scale[kTops];
  for (int t = 0; t < kTops; ++t) scale[t] = std::ldexp(1.0, (t - 1) * kBinBits + Layout<T>::kMinExp);
  const auto place = [&scale](double whole, int top) {
    return std::isnormal(scale[top]) ? whole * scale[top]
                                     : std::ldexp(whole, (top - 1) * kBinBits + Layout<T>::kMinExp);
  };
  const int64_t n = size();
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t k = 0; k < n; ++k) {
    const int8_t top = top_[static_cast<size_t>(k)];
    if (top == kPoisoned) {
      out[k] = std::numeric_limits<T>::quiet_NaN();
    } else if (top == kEmpty) {
      out[k] = 0;
    } else {
      // The two bins as one double (each int64 → double, then their sum: two roundings at most,
      // both at 2^-52 of the sum or finer, a function of the bins alone), placed on the grid,
      // then rounded to T.
      const int64_t* bin = &bins_[static_cast<size_t>(2 * k)];
      constexpr auto kHigh = static_cast<double>(int64_t{1} << kBinBits);
      const double whole = static_cast<double>(bin[0]) * kHigh + static_cast<double>(bin[1]);
      const double sum = place(whole, top);
      // Past T's range the sum is infinite (a cast would be undefined there).
      out[k] = std::fabs(sum) <= std::numeric_limits<T>::max()
                   ? static_cast<T>(sum)
                   : std::copysign(std::numeric_limits<T>::infinity(), static_cast<T>(sum > 0 ? 1 : -1));
    }
  }
}

template class ExactSum<float>;
template class ExactSum<double>;

}  // namespace ft
