// RMSNorm as HF's LlamaRMSNorm: y = w * (x * rsqrt(mean(x²) + eps)).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

// Σ x[i]² in double, i in increasing order.
template <typename S>
double SumSq(const S* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(Load(x[i]));
    sum += v * v;
  }
  return sum;
}

// Columns of dw handled together by one thread (each column sums its rows in order).
constexpr int64_t kColumnBlock = 256;

// dw[j] += Σ_r dy[r,j] * x[r,j] * rstd[r], rows in increasing order.
template <typename T, typename S, typename G>
void RmsNormWeightGrad(const S* x, const T* rstd, const G* dy, int64_t rows, int64_t D, T* dw) {
  const int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kColumnBlock, j1 = std::min(D, j0 + kColumnBlock);
    std::vector<double> acc(j1 - j0, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const double rs = static_cast<double>(rstd[r]);
      for (int64_t j = j0; j < j1; ++j)
        acc[j - j0] += static_cast<double>(Load(dy[r * D + j])) * Load(x[r * D + j]) * rs;
    }
    for (int64_t j = j0; j < j1; ++j) dw[j] = static_cast<T>(dw[j] + acc[j - j0]);
  }
}

}  // namespace

template <typename T, typename S>
void RmsNormForward(const S* x, const T* w, int64_t rows, int64_t D, T eps, S* y, T* rstd) {
  FT_CHECK(rows >= 0 && D > 0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const S* xr = x + r * D;
    const double mean_sq = SumSq(xr, D) / static_cast<double>(D);
    const T rs = static_cast<T>(1.0 / std::sqrt(mean_sq + static_cast<double>(eps)));
    rstd[r] = rs;
    S* yr = y + r * D;
    for (int64_t j = 0; j < D; ++j) Store(w[j] * (Load(xr[j]) * rs), yr + j);
  }
}

// With r = (mean(x²) + eps)^(-1/2), y_j = x_j r w_j and ∂r/∂x_j = -r³ x_j / D:
//   dx_j = r (dy_j w_j - x_j r² (Σ_k dy_k w_k x_k) / D)
//   dw_j = Σ_rows dy_j x_j r
template <typename T, typename S, typename G>
void RmsNormBackward(const S* x, const T* w, const T* rstd, const G* dy, int64_t rows, int64_t D, T* dx,
                     T* dw) {
  FT_CHECK(rows >= 0 && D > 0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const S* xr = x + r * D;
    const G* dyr = dy + r * D;
    double dot = 0;  // Σ_k dy_k w_k x_k
    for (int64_t k = 0; k < D; ++k) dot += static_cast<double>(Load(dyr[k])) * w[k] * Load(xr[k]);
    const double rs = static_cast<double>(rstd[r]);
    const double c = rs * rs * dot / static_cast<double>(D);
    T* dxr = dx + r * D;
    for (int64_t j = 0; j < D; ++j) {
      dxr[j] = static_cast<T>(
          rs * (static_cast<double>(Load(dyr[j])) * w[j] - static_cast<double>(Load(xr[j])) * c));
    }
  }
  if (dw != nullptr) RmsNormWeightGrad(x, rstd, dy, rows, D, dw);
}

#define FT_INSTANTIATE_NORM(T, S)                                                      \
  template void RmsNormForward<T, S>(const S*, const T*, int64_t, int64_t, T, S*, T*); \
  template void RmsNormBackward<T, S, T>(const S*, const T*, const T*, const T*, int64_t, int64_t, T*, T*);
#define FT_INSTANTIATE_NORM_TYPED_DY(S)                                                               \
  template void RmsNormBackward<float, S, S>(const S*, const float*, const float*, const S*, int64_t, \
                                             int64_t, float*, float*);
FT_INSTANTIATE_NORM(float, float)
FT_INSTANTIATE_NORM(double, double)
FT_INSTANTIATE_NORM(float, Bf16)
FT_INSTANTIATE_NORM(float, Half)
FT_INSTANTIATE_NORM_TYPED_DY(Bf16)
FT_INSTANTIATE_NORM_TYPED_DY(Half)
#undef FT_INSTANTIATE_NORM
#undef FT_INSTANTIATE_NORM_TYPED_DY

}  // namespace ft::cpu
