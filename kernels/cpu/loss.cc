// Token-level cross entropy with PyTorch's ignore_index = -100.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

constexpr int32_t kIgnoreIndex = -100;

// -log softmax(row)[target], stable: log Σ_j exp(x_j - max) + max - x_target.
// exp(row - max) is written to `work` (which may be row itself: row is read
// first); with write_grad, work then becomes scale * (softmax - onehot).
template <typename T>
double RowCrossEntropy(const T* row, int32_t target, int64_t V, T scale, T* work, bool write_grad) {
  const T mx = internal::Max(row, V);
  const double x_target = static_cast<double>(row[target]);  // before work overwrites row
  if (work != row) std::copy(row, row + V, work);
  internal::ExpShiftedInPlace(work, V, mx);
  const double sum = internal::LaneSum<double>(work, V);  // fixed order, in double
  if (write_grad) {
    const double inv_sum = 1.0 / sum;
    const double e_target = static_cast<double>(work[target]);
    for (int64_t j = 0; j < V; ++j) {
      work[j] = static_cast<T>(static_cast<double>(scale) * (static_cast<double>(work[j]) * inv_sum));
    }
    work[target] = static_cast<T>(static_cast<double>(scale) * (e_target * inv_sum - 1.0));
  }
  return std::log(sum) + static_cast<double>(mx) - x_target;
}

}  // namespace

template <typename T>
double CrossEntropy(const T* logits, const int32_t* targets, int64_t rows, int64_t V, T grad_scale,
                    T* dlogits, T softcap) {
  FT_CHECK(rows >= 0 && V > 0 && softcap >= 0);
  std::vector<double> row_loss(rows, 0.0);
  // Exps go to scratch when no gradient is wanted, or when the capped logits must outlive them.
  const bool scratch_rows = dlogits == nullptr || softcap > 0;
#pragma omp parallel
  {
    std::vector<T> scratch(scratch_rows ? V : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      T* grad = dlogits == nullptr ? nullptr : dlogits + r * V;
      if (targets[r] == kIgnoreIndex) {
        if (grad != nullptr) std::fill(grad, grad + V, T(0));
        continue;
      }
      FT_CHECK(targets[r] >= 0 && targets[r] < V);
      const T* row = logits + r * V;
      T* work = scratch_rows ? scratch.data() : grad;
      row_loss[r] = RowCrossEntropy(row, targets[r], V, grad_scale, work, grad != nullptr);
      if (grad == nullptr || !scratch_rows) continue;
      // Through the cap: d cap·tanh(x/cap) / dx = 1 - tanh² = 1 - (y / cap)², y the capped logit.
      for (int64_t j = 0; j < V; ++j) {
        const T u = row[j] / softcap;
        grad[j] = work[j] * (T(1) - u * u);
      }
    }
  }
  double total = 0;  // rows in order, whatever the thread count
  for (int64_t r = 0; r < rows; ++r) total += row_loss[r];
  return total;
}

template double CrossEntropy<float>(const float*, const int32_t*, int64_t, int64_t, float, float*, float);
template double CrossEntropy<double>(const double*, const int32_t*, int64_t, int64_t, double, double*,
                                     double);

}  // namespace ft::cpu
