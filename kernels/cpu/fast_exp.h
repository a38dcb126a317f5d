// exp(x) in plain arithmetic, so that loops over arrays vectorise (std::exp is
// a libm call that GCC only vectorises under -ffast-math). Internal to
// kernels/cpu. Within 2 ulp of std::exp for float and double (tested in
// tests/kernels/cpu/fast_exp_test.cc); exp(-inf) = 0, exp(inf) = inf, NaN
// stays NaN, results below the smallest normal may flush towards 0.
//
// Method (Cody and Waite): e^x = 2^n e^r with n = round(x / ln 2) and
// r = x - n ln 2 in [-ln2/2, ln2/2], where ln 2 = kLn2Hi + kLn2Lo and kLn2Hi
// has few enough significant bits that n * kLn2Hi is exact. e^r is its Taylor
// polynomial (degree 7 for float, 13 for double: the first omitted term is
// below half an ulp on that interval), evaluated by Horner's rule. 2^n is
// built from exponent bits in two factors 2^(n/2) 2^(n - n/2), so overflow to
// inf and underflow to 0 round correctly without branches.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace ft::cpu::internal {

template <typename T>
struct ExpConstants;

template <>
struct ExpConstants<float> {
  using Int = int32_t;
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f;  // 355/512: 9 significant bits
  static constexpr float kLn2Lo = -2.12194440054690583e-4f;  // ln 2 - kLn2Hi
  static constexpr float kMin = -104.0f;  // e^x < half the smallest subnormal below this
  static constexpr float kMax = 89.0f;  // e^x > FLT_MAX above this
  static constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: x + it - it rounds to an integer
  static constexpr int kMantissaBits = 23;
  static constexpr int kExponentBias = 127;
  static constexpr int kDegree = 7;
};

template <>
struct ExpConstants<double> {
  using Int = int64_t;
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
constexpr auto InverseFactorials() {
  std::array<T, ExpConstants<T>::kDegree + 1> c{};
  double f = 1;
  for (int k = 0; k <= ExpConstants<T>::kDegree; ++k) {
    if (k > 0) f *= k;
    c[k] = static_cast<T>(1.0 / f);
  }
  return c;
}

// 2^n for n within the normal exponent range.
template <typename T>
T TwoToThe(typename ExpConstants<T>::Int n) {
  using C = ExpConstants<T>;
  return std::bit_cast<T>((n + C::kExponentBias) << C::kMantissaBits);
}

template <typename T>
T FastExp(T x) {
  using C = ExpConstants<T>;
  using Int = typename C::Int;
  static constexpr auto kCoeff = InverseFactorials<T>();
  // Clamping keeps n in range; a NaN fails both comparisons and stays.
  T xc = x < C::kMin ? C::kMin : x;
  xc = xc > C::kMax ? C::kMax : xc;
  const T n = (xc * C::kLog2e + C::kRoundMagic) - C::kRoundMagic;  // round to nearest
  const T r = (xc - n * C::kLn2Hi) - n * C::kLn2Lo;
  T p = kCoeff[C::kDegree];
  for (int k = C::kDegree - 1; k >= 0; --k) p = p * r + kCoeff[k];
  const Int ni = static_cast<Int>(n);
  const Int half = ni / 2;
  return p * TwoToThe<T>(half) * TwoToThe<T>(ni - half);
}

}  // namespace ft::cpu::internal
