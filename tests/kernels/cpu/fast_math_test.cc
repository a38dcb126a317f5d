// The vectorisable helpers of kernels/cpu/fast_math.h against libm and plain
// loops.
#include "kernels/cpu/fast_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ft::cpu::internal {
namespace {

// |a - b| in units of the spacing of T at b (b normal).
template <typename T>
double Ulps(T a, long double b) {
  int exponent = 0;
  std::frexp(static_cast<double>(b), &exponent);
  const long double ulp = std::ldexp(1.0L, exponent - std::numeric_limits<T>::digits);
  return static_cast<double>(std::abs(static_cast<long double>(a) - b) / ulp);
}

template <typename T>
class FastMath : public ::testing::Test {};
using ScalarTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FastMath, ScalarTypes);

TYPED_TEST(FastMath, ExpIsWithinTwoUlpsOverTheNormalRange) {
  using T = TypeParam;
  // Arguments whose e^x is a normal number of T.
  const double lo = std::log(static_cast<double>(std::numeric_limits<T>::min()));
  const double hi = std::log(static_cast<double>(std::numeric_limits<T>::max()));
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> wide(lo, hi), narrow(-1, 1);
  double worst = 0;
  for (int i = 0; i < 400000; ++i) {
    const T x = static_cast<T>(i % 2 ? wide(rng) : narrow(rng));
    worst = std::max(worst, Ulps(FastExp(x), std::exp(static_cast<long double>(x))));
  }
  EXPECT_LE(worst, 2.0);
}

TYPED_TEST(FastMath, ExpSpecialValues) {
  using T = TypeParam;
  const T inf = std::numeric_limits<T>::infinity();
  EXPECT_EQ(FastExp(T(0)), T(1));
  EXPECT_EQ(FastExp(-inf), T(0));
  EXPECT_EQ(FastExp(inf), inf);
  EXPECT_TRUE(std::isnan(FastExp(std::numeric_limits<T>::quiet_NaN())));
  EXPECT_EQ(FastExp(T(1000)), inf);
  EXPECT_EQ(FastExp(T(-1000)), T(0));
  const T big = std::log(std::numeric_limits<T>::max()) * T(0.999);  // just below overflow
  EXPECT_LE(Ulps(FastExp(big), std::exp(static_cast<long double>(big))), 2.0);
  EXPECT_TRUE(std::isinf(FastExp(std::log(std::numeric_limits<T>::max()) * T(1.001))));
}

TYPED_TEST(FastMath, ExpOfSubnormalResultsIsClose) {
  using T = TypeParam;
  const T x = std::log(std::numeric_limits<T>::min()) - T(5);  // e^x ≈ min / 148: subnormal
  const long double want = std::exp(static_cast<long double>(x));
  EXPECT_NEAR(static_cast<double>(FastExp(x)), static_cast<double>(want),
              4 * static_cast<double>(std::numeric_limits<T>::denorm_min()));
}

TYPED_TEST(FastMath, VectorisedLoopMatchesScalarCallsBitForBit) {
  using T = TypeParam;
  std::mt19937 rng(2);
  std::uniform_real_distribution<double> dist(-120, 100);
  std::vector<T> x(1003);
  for (auto& e : x) e = static_cast<T>(dist(rng));
  x[5] = -std::numeric_limits<T>::infinity();
  auto y = x;
  ExpShiftedInPlace(y.data(), static_cast<int64_t>(y.size()), T(0.5));
  for (size_t i = 0; i < x.size(); ++i) {
    const T scalar = FastExp(x[i] - T(0.5));
    EXPECT_EQ(0, std::memcmp(&scalar, &y[i], sizeof(T))) << "x = " << x[i];
  }
}

// The library's loops are compiled with -O3 -fno-trapping-math and vectorise;
// each element must still get the scalar function's bits.
TYPED_TEST(FastMath, LibrarySwiGluUsesTheSameExpBitForBit) {
  using T = TypeParam;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-20, 20);
  const int64_t n = 1001;
  std::vector<T> gate(n), up(n), h(n);
  for (int64_t i = 0; i < n; ++i) {
    gate[i] = static_cast<T>(dist(rng));
    up[i] = static_cast<T>(dist(rng));
  }
  SwiGluForward(gate.data(), up.data(), n, h.data());
  for (int64_t i = 0; i < n; ++i) {
    const T sigmoid = T(1) / (T(1) + FastExp(-gate[i]));
    const T want = gate[i] * sigmoid * up[i];
    EXPECT_EQ(0, std::memcmp(&want, &h[i], sizeof(T))) << "gate = " << gate[i];
  }
}

TYPED_TEST(FastMath, LaneSumAndMax) {
  using T = TypeParam;
  std::vector<T> x(103);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<T>(i + 1);
  EXPECT_EQ(LaneSum<T>(x.data(), 103), T(103 * 104 / 2));  // exact in any order
  EXPECT_EQ(LaneSum<double>(x.data(), 5), 15.0);           // tail only
  EXPECT_EQ(LaneSum<T>(x.data(), 0), T(0));
  EXPECT_EQ(Max(x.data(), 103), T(103));
  EXPECT_EQ(Max(x.data(), 0), -std::numeric_limits<T>::infinity());
  x[50] = -std::numeric_limits<T>::infinity();
  EXPECT_EQ(Max(x.data(), 60), T(60));
}

}  // namespace
}  // namespace ft::cpu::internal
