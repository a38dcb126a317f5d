// Helpers shared by the kernels/cpu tests: seeded random tensors and
// finite-difference gradient checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

namespace ft::cpu::test_util {

// n values uniform in [lo, hi), the same for a given seed on every run.
template <typename T>
std::vector<T> Random(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(rng));
  return v;
}

template <typename T>
double Dot(const std::vector<T>& a, const std::vector<T>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return sum;
}

// Expects |a - b| <= rtol * max(|a|, |b|) + atol element by element.
template <typename T>
void ExpectClose(const std::vector<T>& actual, const std::vector<T>& expected, double rtol, double atol,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const double tol = rtol * std::max(std::abs(a), std::abs(e)) + atol;
    const bool same_inf = std::isinf(a) && a == e;
    if (!same_inf && !(std::abs(a - e) <= tol) && reported++ < 10) {
      ADD_FAILURE() << what << "[" << i << "]: " << a << " vs expected " << e << " (diff " << a - e << ")";
    }
  }
}

// Checks `analytic` = d loss / d x for every element of x by central
// differences (x is perturbed in place and restored).
template <typename Loss>
void ExpectGradMatchesFiniteDifferences(const std::vector<double>& analytic, std::vector<double>& x,
                                        Loss&& loss, const std::string& what, double eps = 1e-6,
                                        double rtol = 1e-6, double atol = 1e-8) {
  ASSERT_EQ(analytic.size(), x.size()) << what;
  std::vector<double> numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = loss();
    x[i] = saved - eps;
    const double minus = loss();
    x[i] = saved;
    numeric[i] = (plus - minus) / (2 * eps);
  }
  ExpectClose(analytic, numeric, rtol, atol, what);
  // Guard against a vacuous pass (an all-zero gradient matching a flat loss).
  double norm = 0;
  for (double g : analytic) norm += g * g;
  EXPECT_GT(norm, 0.0) << what << ": gradient is identically zero";
}

}  // namespace ft::cpu::test_util
