// Vectorisable building blocks of the CPU kernels (internal to kernels/cpu).
//
// FastExp: exp(x) in plain arithmetic, so that loops over arrays vectorise
// (std::exp is a libm call that GCC vectorises only under -ffast-math).
// Within 2 ulp of the exact value for float and double (checked by
// tests/kernels/cpu/fast_math_test.cc); exp(-inf) = 0, exp(inf) = inf, NaN
// stays NaN, and subnormal results are close to, not exactly, libm's.
//
// Method (Cody and Waite): e^x = 2^n e^r with n = round(x / ln 2) and
// r = x - n ln 2 in [-ln2/2, ln2/2], where ln 2 = kLn2Hi + kLn2Lo and kLn2Hi
// has few enough significant bits that n * kLn2Hi is exact. e^r is its Taylor
// polynomial (degree 7 for float, 13 for double: the first omitted term is
// below 0.2 ulp on that interval), evaluated by Horner's rule. 2^n is built
// from exponent bits in two factors 2^(n/2) 2^(n - n/2), so overflow to inf
// and underflow to 0 round correctly without branches.
//
// The selects below (a ? b : c on floats) vectorise only with
// -fno-trapping-math, which kernels/cpu is built with (it changes no value).
// Vectorised or not, every element goes through the same operations, so
// results do not depend on how a loop was compiled or split among threads.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>

namespace ft::cpu::internal {

template <typename T>
struct ExpConstants;

template <>
struct ExpConstants<float> {
  using Bits = uint32_t;
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f;              // 355/512: 9 significant bits
  static constexpr float kLn2Lo = -2.12194440054690583e-4f;  // ln 2 - kLn2Hi
  static constexpr float kMin = -104.0f;                     // below: e^x rounds to 0
  static constexpr float kMax = 89.0f;                       // above: e^x rounds to inf
  static constexpr float kRoundMagic = 12582912.0f;          // 1.5 * 2^23: (x + it) - it rounds x
  static constexpr int kMantissaBits = 23;
  static constexpr int kExponentBias = 127;
  static constexpr int kDegree = 7;
};

template <>
struct ExpConstants<double> {
  using Bits = uint64_t;
  static constexpr double kLog2e = 1.44269504088896340736;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 32 significant bits
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
  static constexpr double kMin = -746.0;
  static constexpr double kMax = 710.0;
  static constexpr double kRoundMagic = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr int kMantissaBits = 52;
  static constexpr int kExponentBias = 1023;
  static constexpr int kDegree = 13;
};

// 1/k! for k = 0 ... degree, rounded to T: the Taylor coefficients of e^r.
template <typename T>
constexpr std::array<T, ExpConstants<T>::kDegree + 1> InverseFactorials() {
  std::array<T, ExpConstants<T>::kDegree + 1> c{};
  double factorial = 1;
  for (int k = 0; k <= ExpConstants<T>::kDegree; ++k) {
    if (k > 0) factorial *= k;
    c[k] = static_cast<T>(1.0 / factorial);
  }
  return c;
}

// 2^n for n within the normal exponent range.
template <typename T>
T TwoToThe(int32_t n) {
  using C = ExpConstants<T>;
  return std::bit_cast<T>(static_cast<typename C::Bits>(n + C::kExponentBias) << C::kMantissaBits);
}

template <typename T>
T FastExp(T x) {
  using C = ExpConstants<T>;
  static constexpr std::array<T, C::kDegree + 1> kCoeff = InverseFactorials<T>();
  // Clamp so that n stays in range; a NaN fails both comparisons and stays.
  T xc = x < C::kMin ? C::kMin : x;
  xc = xc > C::kMax ? C::kMax : xc;
  const T finite = xc == xc ? xc : T(0);                               // n from a NaN would not be an integer
  const T n = (finite * C::kLog2e + C::kRoundMagic) - C::kRoundMagic;  // round to nearest
  const T r = (xc - n * C::kLn2Hi) - n * C::kLn2Lo;                    // NaN stays NaN here
  T p = kCoeff[C::kDegree];
  for (int k = C::kDegree - 1; k >= 0; --k) p = p * r + kCoeff[k];
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t half = ni / 2;
  return p * TwoToThe<T>(half) * TwoToThe<T>(ni - half);
}

// x[i] = FastExp(x[i] - shift) for i < n, in place.
template <typename T>
void ExpShiftedInPlace(T* x, int64_t n, T shift) {
  for (int64_t i = 0; i < n; ++i) x[i] = FastExp(x[i] - shift);
}

// max(x[0], ..., x[n-1]); -inf when n == 0.
template <typename T>
T Max(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Σ x[i], accumulated in Acc in a fixed order that vectorises: kLanes
// interleaved partial sums (lane u adds x[u], x[u + kLanes], ...), then the
// lanes in order, then the tail. The order depends only on n.
template <typename Acc, typename T>
Acc LaneSum(const T* x, int64_t n) {
  constexpr int kLanes = 8;
  Acc lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int u = 0; u < kLanes; ++u) lane[u] += static_cast<Acc>(x[i + u]);
  }
  Acc sum = 0;
  for (int u = 0; u < kLanes; ++u) sum += lane[u];
  for (; i < n; ++i) sum += static_cast<Acc>(x[i]);
  return sum;
}

}  // namespace ft::cpu::internal
