// RMSNorm as HF's LlamaRMSNorm: y = w * (x * rsqrt(mean(x²) + eps)).
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

// Σ a[i] * b[i] in double, i in increasing order.
template <typename T>
double Dot(const T* a, const T* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return sum;
}

// Columns of dw handled together by one thread (each column sums its rows in order).
constexpr int64_t kColumnBlock = 256;

// dw[j] += Σ_r dy[r,j] * x[r,j] * rstd[r], rows in increasing order.
template <typename T>
void RmsNormWeightGrad(const T* x, const T* rstd, const T* dy, int64_t rows, int64_t D, T* dw) {
  const int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kColumnBlock, j1 = std::min(D, j0 + kColumnBlock);
    std::vector<double> acc(j1 - j0, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const double rs = static_cast<double>(rstd[r]);
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += static_cast<double>(dy[r * D + j]) * x[r * D + j] * rs;
    }
    for (int64_t j = j0; j < j1; ++j) dw[j] = static_cast<T>(dw[j] + acc[j - j0]);
  }
}

}  // namespace

template <typename T>
void RmsNormForward(const T* x, const T* w, int64_t rows, int64_t D, T eps, T* y, T* rstd) {
  FT_CHECK(rows >= 0 && D > 0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * D;
    const double mean_sq = Dot(xr, xr, D) / static_cast<double>(D);
    const T rs = static_cast<T>(1.0 / std::sqrt(mean_sq + static_cast<double>(eps)));
    rstd[r] = rs;
    T* yr = y + r * D;
    for (int64_t j = 0; j < D; ++j) yr[j] = w[j] * (xr[j] * rs);
  }
}

// With r = (mean(x²) + eps)^(-1/2), y_j = x_j r w_j and ∂r/∂x_j = -r³ x_j / D:
//   dx_j = r (dy_j w_j - x_j r² (Σ_k dy_k w_k x_k) / D)
//   dw_j = Σ_rows dy_j x_j r
template <typename T>
void RmsNormBackward(const T* x, const T* w, const T* rstd, const T* dy, int64_t rows, int64_t D, T* dx,
                     T* dw) {
  FT_CHECK(rows >= 0 && D > 0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * D;
    const T* dyr = dy + r * D;
    double dot = 0;  // Σ_k dy_k w_k x_k
    for (int64_t k = 0; k < D; ++k) dot += static_cast<double>(dyr[k]) * w[k] * xr[k];
    const double rs = static_cast<double>(rstd[r]);
    const double c = rs * rs * dot / static_cast<double>(D);
    T* dxr = dx + r * D;
    for (int64_t j = 0; j < D; ++j) {
      dxr[j] = static_cast<T>(rs * (static_cast<double>(dyr[j]) * w[j] - static_cast<double>(xr[j]) * c));
    }
  }
  if (dw != nullptr) RmsNormWeightGrad(x, rstd, dy, rows, D, dw);
}

template void RmsNormForward<float>(const float*, const float*, int64_t, int64_t, float, float*, float*);
template void RmsNormForward<double>(const double*, const double*, int64_t, int64_t, double, double*,
                                     double*);
template void RmsNormBackward<float>(const float*, const float*, const float*, const float*, int64_t, int64_t,
                                     float*, float*);
template void RmsNormBackward<double>(const double*, const double*, const double*, const double*, int64_t,
                                      int64_t, double*, double*);

}  // namespace ft::cpu
