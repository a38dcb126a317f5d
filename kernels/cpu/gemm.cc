// C = alpha * op(A) * op(B) + beta * C through BLAS when available, else a
// blocked loop. Both paths sum over k in increasing order for every element of
// C, so neither depends on the OpenMP thread count.
#include <algorithm>
#include <climits>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/ops.h"

#ifdef FT_HAVE_BLAS
#include <cblas.h>
#endif

namespace ft::cpu {
namespace {

#ifdef FT_HAVE_BLAS
CBLAS_TRANSPOSE BlasTrans(bool t) { return t ? CblasTrans : CblasNoTrans; }

void BlasGemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
              int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, BlasTrans(ta), BlasTrans(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void BlasGemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
              int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, BlasTrans(ta), BlasTrans(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif

// Tile sizes of the fallback: a [kTileK, kTileN] panel of op(B) (64 KiB of
// floats) stays in L2 while kTileM rows of C accumulate against it.
constexpr int64_t kTileM = 32;
constexpr int64_t kTileN = 128;
constexpr int64_t kTileK = 128;

// One [m0, m1) x [n0, n1) tile of C. op(B) is packed row-major per k panel so
// the innermost loop runs over contiguous columns (and vectorises); each
// element of C still accumulates k = 0, 1, ..., K-1 in order.
template <typename T>
void GemmTile(bool ta, bool tb, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K, T alpha,
              const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  const int64_t tn = n1 - n0;
  std::vector<T> acc((m1 - m0) * tn, T(0));
  std::vector<T> panel(kTileK * tn);
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    const int64_t k1 = std::min(K, k0 + kTileK);
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t j = n0; j < n1; ++j)
        panel[(k - k0) * tn + (j - n0)] = tb ? B[j * ldb + k] : B[k * ldb + j];
    }
    for (int64_t i = m0; i < m1; ++i) {
      T* row = &acc[(i - m0) * tn];
      for (int64_t k = k0; k < k1; ++k) {
        const T a = ta ? A[k * lda + i] : A[i * lda + k];
        const T* b = &panel[(k - k0) * tn];
        for (int64_t j = 0; j < tn; ++j) row[j] += a * b[j];
      }
    }
  }
  for (int64_t i = m0; i < m1; ++i) {
    for (int64_t j = n0; j < n1; ++j) {
      T& c = C[i * ldc + j];
      // BLAS semantics: beta == 0 ignores C's old contents (even NaN).
      c = beta == T(0) ? alpha * acc[(i - m0) * tn + (j - n0)]
                       : alpha * acc[(i - m0) * tn + (j - n0)] + beta * c;
    }
  }
}

template <typename T>
void BlockedGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                 const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  const int64_t tiles_m = (M + kTileM - 1) / kTileM;
  const int64_t tiles_n = (N + kTileN - 1) / kTileN;
  // Tiles of C are disjoint: any thread may take any tile.
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < tiles_m * tiles_n; ++t) {
    const int64_t m0 = (t / tiles_n) * kTileM, n0 = (t % tiles_n) * kTileN;
    GemmTile(ta, tb, m0, std::min(M, m0 + kTileM), n0, std::min(N, n0 + kTileN), K, alpha, A, lda, B, ldb,
             beta, C, ldc);
  }
}

}  // namespace

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  FT_CHECK(M >= 0 && N >= 0 && K >= 0);
  FT_CHECK(lda >= std::max<int64_t>(1, trans_a ? M : K));
  FT_CHECK(ldb >= std::max<int64_t>(1, trans_b ? K : N));
  FT_CHECK(ldc >= std::max<int64_t>(1, N));
  if (M == 0 || N == 0) return;
#ifdef FT_HAVE_BLAS
  // cblas takes int sizes and strides.
  FT_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX);
  FT_CHECK(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
  BlasGemm(trans_a, trans_b, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
           static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
#else
  BlockedGemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

template void Gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                          int64_t, float, float*, int64_t);
template void Gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace ft::cpu
