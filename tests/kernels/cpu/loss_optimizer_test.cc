// Cross entropy, AdamW and the elementwise helpers against formulas computed
// independently here in double.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/test_util.h"

namespace ft::cpu {
namespace {

using test_util::ExpectClose;
using test_util::Random;

template <typename T>
class CpuLossOptimizer : public ::testing::Test {
 protected:
  static constexpr double kTol = sizeof(T) == 4 ? 1e-6 : 1e-14;
};
using ScalarTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CpuLossOptimizer, ScalarTypes);

TYPED_TEST(CpuLossOptimizer, CrossEntropySumsNegativeLogSoftmaxOfCountedRows) {
  using T = TypeParam;
  const int64_t rows = 5, V = 100;
  const auto logits = Random<T>(rows * V, 1, -8, 8);
  const std::vector<int32_t> targets = {7, -100, 99, 0, -100};
  const T scale = T(1) / T(3);
  std::vector<T> grad(rows * V);
  const double loss = CrossEntropy(logits.data(), targets.data(), rows, V, scale, grad.data());
  double want_loss = 0;
  std::vector<T> want_grad(rows * V, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == -100) continue;
    double z = 0;  // no max shift: logits are small enough here
    for (int64_t j = 0; j < V; ++j) z += std::exp(static_cast<double>(logits[r * V + j]));
    want_loss += std::log(z) - logits[r * V + targets[r]];
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(static_cast<double>(logits[r * V + j])) / z;
      want_grad[r * V + j] = static_cast<T>((p - (j == targets[r] ? 1.0 : 0.0)) / 3.0);
    }
  }
  EXPECT_NEAR(loss, want_loss, 1e-12 * want_loss + (sizeof(T) == 4 ? 1e-5 : 0));
  ExpectClose(grad, want_grad, 10 * this->kTol, this->kTol * 1e-2, "dlogits");

  // dlogits may alias logits; a null dlogits only computes the loss.
  auto in_place = logits;
  EXPECT_EQ(CrossEntropy(in_place.data(), targets.data(), rows, V, scale, in_place.data()), loss);
  EXPECT_EQ(in_place, grad);
  EXPECT_EQ(CrossEntropy(logits.data(), targets.data(), rows, V, scale, static_cast<T*>(nullptr)), loss);
}

TYPED_TEST(CpuLossOptimizer, CrossEntropyIsStableForHugeLogits) {
  using T = TypeParam;
  const std::vector<T> logits = {T(1000), T(-1000), T(990), T(0)};
  const std::vector<int32_t> targets = {2};
  std::vector<T> grad(4);
  const double loss = CrossEntropy(logits.data(), targets.data(), 1, 4, T(1), grad.data());
  EXPECT_NEAR(loss, 10.0 + std::log1p(std::exp(-10.0)), 1e-6);
  EXPECT_NEAR(grad[0], 1.0 / (1.0 + std::exp(-10.0)), 1e-6);
  EXPECT_EQ(grad[1], T(0));
  EXPECT_NEAR(grad[2], std::exp(-10.0) / (1.0 + std::exp(-10.0)) - 1.0, 1e-6);
}

TYPED_TEST(CpuLossOptimizer, CrossEntropyOfOnlyIgnoredRowsIsZero) {
  using T = TypeParam;
  const auto logits = Random<T>(2 * 3, 2);
  const std::vector<int32_t> targets = {-100, -100};
  std::vector<T> grad(6, T(5));
  EXPECT_EQ(CrossEntropy(logits.data(), targets.data(), 2, 3, T(1), grad.data()), 0.0);
  EXPECT_EQ(grad, std::vector<T>(6, T(0)));
}

TYPED_TEST(CpuLossOptimizer, AdamWThreeStepsMatchTorchFormula) {
  using T = TypeParam;
  const int64_t n = 13;
  AdamWParams hp;
  hp.lr = 1e-2;
  hp.beta1 = 0.8;
  hp.beta2 = 0.95;
  hp.eps = 1e-6;
  hp.weight_decay = 0.1;
  auto param = Random<T>(n, 3);
  std::vector<T> m(n, T(0)), v(n, T(0));
  std::vector<double> want_p(param.begin(), param.end()), want_m(n, 0.0), want_v(n, 0.0);
  for (int64_t step = 1; step <= 3; ++step) {
    const auto grad = Random<T>(n, 10 + static_cast<uint32_t>(step), -2, 2);
    hp.step = step;
    AdamW(hp, n, param.data(), grad.data(), m.data(), v.data());
    // torch.optim.AdamW, single tensor: decay first, then the Adam update.
    for (int64_t i = 0; i < n; ++i) {
      const double g = grad[i];
      want_p[i] *= 1 - hp.lr * hp.weight_decay;
      want_m[i] = hp.beta1 * want_m[i] + (1 - hp.beta1) * g;
      want_v[i] = hp.beta2 * want_v[i] + (1 - hp.beta2) * g * g;
      const double bc1 = 1 - std::pow(hp.beta1, step), bc2 = 1 - std::pow(hp.beta2, step);
      want_p[i] -= hp.lr / bc1 * want_m[i] / (std::sqrt(want_v[i]) / std::sqrt(bc2) + hp.eps);
    }
    ExpectClose(std::vector<double>(param.begin(), param.end()), want_p, this->kTol, 0,
                "param after step " + std::to_string(step));
    ExpectClose(std::vector<double>(m.begin(), m.end()), want_m, this->kTol, 0, "m");
    ExpectClose(std::vector<double>(v.begin(), v.end()), want_v, this->kTol, 0, "v");
  }
}

TYPED_TEST(CpuLossOptimizer, SumSquaresAxpyScale) {
  using T = TypeParam;
  const int64_t n = 100000;  // several SumSquares chunks
  const auto x = Random<T>(n, 4);
  long double want = 0;
  for (T e : x) want += static_cast<long double>(e) * e;
  EXPECT_NEAR(SumSquares(x.data(), n), static_cast<double>(want), 1e-12 * static_cast<double>(want));
  EXPECT_EQ(SumSquares(x.data(), 0), 0.0);

  auto y = Random<T>(n, 5);
  auto want_y = y;
  for (int64_t i = 0; i < n; ++i) want_y[i] += T(0.25) * x[i];
  Axpy(n, T(0.25), x.data(), y.data());
  EXPECT_EQ(y, want_y);
  for (int64_t i = 0; i < n; ++i) want_y[i] *= T(-3);
  Scale(n, T(-3), y.data());
  EXPECT_EQ(y, want_y);
}

}  // namespace
}  // namespace ft::cpu
