// C = alpha * op(A) * op(B) + beta * C.
//
// C is cut into blocks whose sizes depend only on the problem's shape; OpenMP
// threads take whole blocks, and each block is computed by one thread: a
// single-threaded BLAS call when built with BLAS, else the blocked loop below
// (which sums k = 0, 1, ..., K-1 in order for every element). Which thread
// computes a block never changes its bits, so results do not depend on the
// thread count. BLAS's own threading would (OpenBLAS 0.3.21's sgemm gives
// different bits with 1 and 2 threads for e.g. 1000x999x3001), so OpenBLAS is
// set to one thread.
#include <algorithm>
#include <climits>
#include <vector>

#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/ops.h"

#ifdef FT_HAVE_BLAS
#include <cblas.h>

#include <mutex>
#endif

namespace ft::cpu {
namespace {

// Below this many multiply-adds a thread team costs more than it saves.
constexpr int64_t kSerialWork = int64_t{1} << 18;

// Operands shifted to the block of C at rows [m0, ...) and columns [n0, ...).
template <typename T>
struct BlockOperands {
  const T* A;
  const T* B;
  T* C;
};
template <typename T>
BlockOperands<T> Shift(bool ta, bool tb, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc,
                       int64_t m0, int64_t n0) {
  return {ta ? A + m0 : A + m0 * lda, tb ? B + n0 * ldb : B + n0, C + m0 * ldc + n0};
}

// Calls fn(m0, m1, n0, n1) for every [block_m, block_n] block of an [M, N]
// result, in parallel when the work is large enough. Blocks are disjoint.
template <typename Fn>
void ForEachBlock(int64_t M, int64_t N, int64_t K, int64_t block_m, int64_t block_n, Fn&& fn) {
  const int64_t blocks_m = (M + block_m - 1) / block_m, blocks_n = (N + block_n - 1) / block_n;
  auto run = [&](int64_t t) {
    const int64_t m0 = (t / blocks_n) * block_m, n0 = (t % blocks_n) * block_n;
    fn(m0, std::min(M, m0 + block_m), n0, std::min(N, n0 + block_n));
  };
  if (M * N * std::max<int64_t>(K, 1) < kSerialWork || blocks_m * blocks_n == 1) {
    for (int64_t t = 0; t < blocks_m * blocks_n; ++t) run(t);  // no thread team for small work
    return;
  }
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < blocks_m * blocks_n; ++t) run(t);
}

#ifdef FT_HAVE_BLAS
// Blocks big enough for BLAS's own cache blocking to pay off.
constexpr int64_t kBlasBlockM = 256;
constexpr int64_t kBlasBlockN = 512;

CBLAS_TRANSPOSE BlasTrans(bool t) { return t ? CblasTrans : CblasNoTrans; }

void BlasCall(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
              int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, BlasTrans(ta), BlasTrans(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void BlasCall(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
              int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, BlasTrans(ta), BlasTrans(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void MakeBlasSingleThreaded() {
#ifdef FT_HAVE_OPENBLAS_THREADS
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
#endif
}

template <typename T>
void BlasGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
              int64_t ldb, T beta, T* C, int64_t ldc) {
  // cblas takes int sizes and strides.
  FT_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX);
  FT_CHECK(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
  MakeBlasSingleThreaded();
  ForEachBlock(M, N, K, kBlasBlockM, kBlasBlockN, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const BlockOperands<T> op = Shift(ta, tb, A, lda, B, ldb, C, ldc, m0, n0);
    BlasCall(ta, tb, static_cast<int>(m1 - m0), static_cast<int>(n1 - n0), static_cast<int>(K), alpha, op.A,
             static_cast<int>(lda), op.B, static_cast<int>(ldb), beta, op.C, static_cast<int>(ldc));
  });
}
#endif  // FT_HAVE_BLAS

// The fallback's blocks: a [kLoopBlockK, kLoopBlockN] panel of op(B) (64 KiB
// of floats) stays in L2 while kLoopBlockM rows of C accumulate against it.
constexpr int64_t kLoopBlockM = 32;
constexpr int64_t kLoopBlockN = 128;
constexpr int64_t kLoopBlockK = 128;

// One block of C, rows [0, rows) and columns [0, cols) of the shifted operands.
// Each panel of op(B) is packed row-major so the innermost loop runs over
// contiguous columns (and vectorises); every element of C still accumulates
// k = 0, 1, ..., K-1 in order.
template <typename T>
void LoopBlock(bool ta, bool tb, int64_t rows, int64_t cols, int64_t K, T alpha, const T* A, int64_t lda,
               const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  std::vector<T> acc(rows * cols, T(0));
  std::vector<T> panel(kLoopBlockK * cols);
  for (int64_t k0 = 0; k0 < K; k0 += kLoopBlockK) {
    const int64_t k1 = std::min(K, k0 + kLoopBlockK);
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t j = 0; j < cols; ++j) panel[(k - k0) * cols + j] = tb ? B[j * ldb + k] : B[k * ldb + j];
    }
    for (int64_t i = 0; i < rows; ++i) {
      T* row = &acc[i * cols];
      for (int64_t k = k0; k < k1; ++k) {
        const T a = ta ? A[k * lda + i] : A[i * lda + k];
        const T* b = &panel[(k - k0) * cols];
        for (int64_t j = 0; j < cols; ++j) row[j] += a * b[j];
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      T& c = C[i * ldc + j];
      // BLAS semantics: beta == 0 ignores C's old contents (even NaN).
      c = beta == T(0) ? alpha * acc[i * cols + j] : alpha * acc[i * cols + j] + beta * c;
    }
  }
}

template <typename T>
void LoopGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
              int64_t ldb, T beta, T* C, int64_t ldc) {
  ForEachBlock(M, N, K, kLoopBlockM, kLoopBlockN, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const BlockOperands<T> op = Shift(ta, tb, A, lda, B, ldb, C, ldc, m0, n0);
    LoopBlock(ta, tb, m1 - m0, n1 - n0, K, alpha, op.A, lda, op.B, ldb, beta, op.C, ldc);
  });
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
  BlasGemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  LoopGemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

template void Gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                          int64_t, float, float*, int64_t);
template void Gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace ft::cpu
