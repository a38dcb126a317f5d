// Forward ops against the formulas of HF transformers' Llama, written out
// independently here (float and double).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/test_util.h"

namespace ft::cpu {
namespace {

using test_util::ExpectClose;
using test_util::Random;

template <typename T>
class CpuForward : public ::testing::Test {
 protected:
  // Relative tolerance for results computed in T with a different rounding order.
  static constexpr double kTol = sizeof(T) == 4 ? 2e-6 : 1e-14;
};
using ScalarTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CpuForward, ScalarTypes);

TYPED_TEST(CpuForward, RmsNormIsXTimesRsqrtMeanSquareTimesWeight) {
  using T = TypeParam;
  const int64_t rows = 3, D = 37;
  const double eps = 1e-6;
  const auto x = Random<T>(rows * D, 1, -3, 3), w = Random<T>(D, 2);
  std::vector<T> y(rows * D), rstd(rows);
  RmsNormForward(x.data(), w.data(), rows, D, static_cast<T>(eps), y.data(), rstd.data());
  std::vector<T> want_y(rows * D), want_rstd(rows);
  for (int64_t r = 0; r < rows; ++r) {
    long double ms = 0;
    for (int64_t j = 0; j < D; ++j) ms += static_cast<long double>(x[r * D + j]) * x[r * D + j];
    const double rs = 1.0 / std::sqrt(static_cast<double>(ms / D) + eps);
    want_rstd[r] = static_cast<T>(rs);
    for (int64_t j = 0; j < D; ++j) want_y[r * D + j] = static_cast<T>(x[r * D + j] * rs * w[j]);
  }
  ExpectClose(rstd, want_rstd, this->kTol, 0, "rstd");
  ExpectClose(y, want_y, this->kTol, 1e-30, "y");
}

// cos and sin tables [positions, rotary / 2] of base `theta` over `rotary` dims.
template <typename T>
std::pair<std::vector<T>, std::vector<T>> RopeTestTables(int64_t positions, int64_t rotary, double theta) {
  const int64_t half = rotary / 2;
  std::vector<T> cos_t(positions * half), sin_t(positions * half);
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * std::pow(theta, -2.0 * i / rotary);
      cos_t[p * half + i] = static_cast<T>(std::cos(angle));
      sin_t[p * half + i] = static_cast<T>(std::sin(angle));
    }
  }
  return {cos_t, sin_t};
}

// HF's apply_rotary_pos_emb on each head's first `rotary` dims, written out:
// q * cat(cos, cos) + rotate_half(q) * cat(sin, sin), rotate_half(q) = cat(-q2, q1); the rest passed.
template <typename T>
std::vector<T> RotateHalfReference(const std::vector<T>& x, const std::vector<int32_t>& pos, int64_t heads,
                                   int64_t hd, int64_t rotary, const std::vector<T>& cos_t,
                                   const std::vector<T>& sin_t) {
  const int64_t half = rotary / 2;
  std::vector<T> want(x.size());
  for (size_t r = 0; r < pos.size(); ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* q = &x[(r * heads + h) * hd];
      for (int64_t d = 0; d < hd; ++d) {
        if (d >= rotary) {
          want[(r * heads + h) * hd + d] = q[d];
          continue;
        }
        const T c = cos_t[pos[r] * half + d % half], s = sin_t[pos[r] * half + d % half];
        const T rotated = d < half ? -q[d + half] : q[d - half];
        want[(r * heads + h) * hd + d] = q[d] * c + rotated * s;
      }
    }
  }
  return want;
}

TYPED_TEST(CpuForward, RopeMatchesRotateHalf) {
  using T = TypeParam;
  const int64_t rows = 5, heads = 2, hd = 16;
  const std::vector<int32_t> pos = {0, 1, 7, 3, 30};
  const auto [cos_t, sin_t] = RopeTestTables<T>(31, hd, 500000.0);
  const auto x = Random<T>(rows * heads * hd, 3);
  auto y = x;
  RopeApply(y.data(), rows, heads, hd, pos.data(), cos_t.data(), sin_t.data(), false);
  ExpectClose(y, RotateHalfReference(x, pos, heads, hd, hd, cos_t, sin_t), this->kTol, 1e-6 * this->kTol,
              "rope");
  // Position 0 is the identity.
  for (int64_t d = 0; d < heads * hd; ++d) EXPECT_EQ(y[d], x[d]);
}

// Partial rotary (Phi's partial_rotary_factor): HF's apply_rotary_pos_emb on each head's first
// `rotary` dims (pairs i, i + rotary/2, tables of rotary/2 columns); the other dims unchanged.
TYPED_TEST(CpuForward, PartialRopeTurnsOnlyTheFirstRotaryDims) {
  using T = TypeParam;
  const int64_t rows = 4, heads = 3, hd = 16, rotary = 12;
  const std::vector<int32_t> pos = {0, 2, 9, 5};
  const auto [cos_t, sin_t] = RopeTestTables<T>(10, rotary, 10000.0);
  const auto x = Random<T>(rows * heads * hd, 5);
  auto y = x;
  RopeApply(y.data(), rows, heads, hd, pos.data(), cos_t.data(), sin_t.data(), false, rotary);
  ExpectClose(y, RotateHalfReference(x, pos, heads, hd, rotary, cos_t, sin_t), this->kTol, 1e-6 * this->kTol,
              "partial rope");
  RopeApply(y.data(), rows, heads, hd, pos.data(), cos_t.data(), sin_t.data(), true, rotary);
  ExpectClose(y, x, this->kTol, 1e-6 * this->kTol, "inverse");
}

TYPED_TEST(CpuForward, SwiGluIsSiluOfGateTimesUp) {
  using T = TypeParam;
  const int64_t n = 300;
  auto gate = Random<T>(n, 4, -10, 10);
  gate[0] = static_cast<T>(-200);  // exp(200) overflows float: silu must be -0, not NaN
  gate[1] = static_cast<T>(200);
  const auto up = Random<T>(n, 5, -2, 2);
  std::vector<T> h(n), want(n);
  SwiGluForward(gate.data(), up.data(), n, h.data());
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    want[i] = static_cast<T>(g / (1.0 + std::exp(-g)) * up[i]);
  }
  ExpectClose(h, want, 4 * this->kTol, 1e-30, "h");
  EXPECT_NEAR(h[0], 0.0, 1e-30);
  EXPECT_EQ(h[1], static_cast<T>(200) * up[1]);
}

// PyTorch's gelu(approximate="tanh") times up; saturating gates give g·up and 0, no NaN.
TYPED_TEST(CpuForward, GeluTanhGluIsPyTorchsTanhGeluOfGateTimesUp) {
  using T = TypeParam;
  const int64_t n = 300;
  auto gate = Random<T>(n, 4, -10, 10);
  gate[0] = static_cast<T>(-200);
  gate[1] = static_cast<T>(200);
  const auto up = Random<T>(n, 5, -2, 2);
  std::vector<T> h(n), want(n);
  GeluTanhGluForward(gate.data(), up.data(), n, h.data());
  // (For very negative gates 1 + tanh cancels in float, as in PyTorch's float GELU: absolute error.)
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    want[i] = static_cast<T>(
        0.5 * g * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (g + 0.044715 * g * g * g))) * up[i]);
  }
  ExpectClose(h, want, 4 * this->kTol, 4 * this->kTol, "h");
  EXPECT_EQ(h[0], static_cast<T>(0) * up[0]);
  EXPECT_EQ(h[1], static_cast<T>(200) * up[1]);
}

TYPED_TEST(CpuForward, EmbeddingCopiesTableRows) {
  using T = TypeParam;
  const int64_t vocab = 9, D = 6;
  const auto table = Random<T>(vocab * D, 6);
  const std::vector<int32_t> ids = {8, 0, 8, 4};
  std::vector<T> out(ids.size() * D);
  EmbeddingForward(table.data(), ids.data(), static_cast<int64_t>(ids.size()), D, out.data());
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int64_t j = 0; j < D; ++j) EXPECT_EQ(out[r * D + j], table[ids[r] * D + j]);
  }
}

}  // namespace
}  // namespace ft::cpu
