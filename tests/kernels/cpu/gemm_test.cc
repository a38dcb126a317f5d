// Gemm (BLAS or the blocked fallback) against a naive triple loop in long double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/test_util.h"

namespace ft::cpu {
namespace {

using test_util::ExpectClose;
using test_util::Random;

struct GemmCase {
  bool ta, tb;
  int64_t M, N, K;
  double alpha, beta;
};

// Runs one case with padded leading dimensions and checks every element of C,
// including that the padding between rows is left alone.
template <typename T>
void CheckGemm(const GemmCase& c, double tol) {
  SCOPED_TRACE("ta " + std::to_string(c.ta) + " tb " + std::to_string(c.tb) + " M " + std::to_string(c.M) +
               " N " + std::to_string(c.N) + " K " + std::to_string(c.K) + " beta " + std::to_string(c.beta));
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = c.N + 2;
  const auto A = Random<T>(a_rows * lda, 1), B = Random<T>(b_rows * ldb, 2);
  // beta == 0 must ignore C entirely, NaN included (BLAS semantics).
  auto C =
      c.beta == 0 ? std::vector<T>(c.M * ldc, std::numeric_limits<T>::quiet_NaN()) : Random<T>(c.M * ldc, 3);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = c.N; j < ldc; ++j) C[i * ldc + j] = T(42);  // padding
  }
  std::vector<T> want = C;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      long double sum = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const T a = c.ta ? A[k * lda + i] : A[i * lda + k];
        const T b = c.tb ? B[j * ldb + k] : B[k * ldb + j];
        sum += static_cast<long double>(a) * b;
      }
      const long double old = c.beta == 0 ? 0 : c.beta * static_cast<long double>(C[i * ldc + j]);
      want[i * ldc + j] = static_cast<T>(c.alpha * sum + old);
    }
  }
  Gemm<T>(c.ta, c.tb, c.M, c.N, c.K, static_cast<T>(c.alpha), A.data(), lda, B.data(), ldb,
          static_cast<T>(c.beta), C.data(), ldc);
  // Products of values in [-1, 1]: errors scale with sqrt(K), floor them by K.
  ExpectClose(C, want, tol, tol * static_cast<double>(c.K + 1), "C");
}

template <typename T>
class CpuGemm : public ::testing::Test {
 protected:
  static constexpr double kTol = sizeof(T) == 4 ? 1e-6 : 1e-15;
};
using ScalarTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CpuGemm, ScalarTypes);

TYPED_TEST(CpuGemm, AllTransposesMatchTripleLoop) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{5, 7, 3},
                             {1, 9, 4},
                             {37, 70, 129},
                             {65, 131, 260},
                             {300, 530, 17}}) {  // several BLAS blocks of C
        for (auto [alpha, beta] :
             {std::pair<double, double>{1.0, 0.0}, {1.0, 1.0}, {0.5, 0.0}, {-2.0, 1.0}}) {
          CheckGemm<TypeParam>({ta, tb, M, N, K, alpha, beta}, this->kTol);
        }
      }
    }
  }
}

TYPED_TEST(CpuGemm, EmptyInnerDimensionScalesC) {
  using T = TypeParam;
  const std::vector<T> A(1), B(3);
  std::vector<T> C = {1, 2, 3, 4, 5, 6};
  Gemm<T>(false, false, 2, 3, 0, T(1), A.data(), 1, B.data(), 3, T(1), C.data(), 3);
  EXPECT_EQ(C, (std::vector<T>{1, 2, 3, 4, 5, 6}));
  Gemm<T>(false, false, 2, 3, 0, T(1), A.data(), 1, B.data(), 3, T(0), C.data(), 3);
  EXPECT_EQ(C, std::vector<T>(6, T(0)));
  Gemm<T>(false, false, 0, 3, 2, T(1), A.data(), 2, B.data(), 3, T(0), C.data(), 3);  // M = 0: nothing
}

}  // namespace
}  // namespace ft::cpu
