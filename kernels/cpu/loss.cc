// Token-level cross entropy with PyTorch's ignore_index = -100.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

constexpr int32_t kIgnoreIndex = -100;

// -log softmax(row)[target], stable: log Σ_j exp(x_j - max) + max - x_target.
// When grad != nullptr (it may alias row) writes scale * (softmax - onehot).
template <typename T>
double RowCrossEntropy(const T* row, int32_t target, int64_t V, T scale, T* grad) {
  const T mx = *std::max_element(row, row + V);
  const double x_target = static_cast<double>(row[target]);  // before grad overwrites row
  double sum = 0;                                            // Σ exp(x_j - max), j in order
  for (int64_t j = 0; j < V; ++j) {
    const T e = std::exp(row[j] - mx);
    sum += static_cast<double>(e);
    if (grad != nullptr) grad[j] = e;  // unnormalised softmax, finished below
  }
  if (grad != nullptr) {
    const double inv_sum = 1.0 / sum;
    for (int64_t j = 0; j < V; ++j) {
      const double softmax = static_cast<double>(grad[j]) * inv_sum;
      grad[j] = static_cast<T>(static_cast<double>(scale) * (j == target ? softmax - 1.0 : softmax));
    }
  }
  return std::log(sum) + static_cast<double>(mx) - x_target;
}

}  // namespace

template <typename T>
double CrossEntropy(const T* logits, const int32_t* targets, int64_t rows, int64_t V, T grad_scale,
                    T* dlogits) {
  FT_CHECK(rows >= 0 && V > 0);
  std::vector<double> row_loss(rows, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* grad = dlogits == nullptr ? nullptr : dlogits + r * V;
    if (targets[r] == kIgnoreIndex) {
      if (grad != nullptr) std::fill(grad, grad + V, T(0));
      continue;
    }
    FT_CHECK(targets[r] >= 0 && targets[r] < V);
    row_loss[r] = RowCrossEntropy(logits + r * V, targets[r], V, grad_scale, grad);
  }
  double total = 0;  // rows in order, whatever the thread count
  for (int64_t r = 0; r < rows; ++r) total += row_loss[r];
  return total;
}

template double CrossEntropy<float>(const float*, const int32_t*, int64_t, int64_t, float, float*);
template double CrossEntropy<double>(const double*, const int32_t*, int64_t, int64_t, double, double*);

}  // namespace ft::cpu
