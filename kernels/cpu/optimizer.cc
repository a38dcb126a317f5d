// AdamW with torch.optim.AdamW's single-tensor semantics (foreach=False):
//   p -= lr * wd * p                       (decoupled weight decay, first)
//   m  = b1 m + (1 - b1) g
//   v  = b2 v + (1 - b2) g²
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Every element's arithmetic runs in double; p, m and v are then stored as T.
// (torch runs it in the parameter's dtype; for float parameters the two agree
// to float rounding, and for double they are the same formula.)
#include <cmath>

#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

// Below this many elements a thread team costs more than it saves.
[[maybe_unused]] constexpr int64_t kParallelMin = 1 << 15;

}  // namespace

template <typename T>
void AdamW(const AdamWParams& hp, int64_t n, T* param, const T* grad, T* m, T* v) {
  FT_CHECK(n >= 0 && hp.step >= 1);
  const double t = static_cast<double>(hp.step);
  const double step_size = hp.lr / (1.0 - std::pow(hp.beta1, t));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(hp.beta2, t));
  const double decay = 1.0 - hp.lr * hp.weight_decay;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    const double p = static_cast<double>(param[i]) * decay;
    const double mi = hp.beta1 * static_cast<double>(m[i]) + (1.0 - hp.beta1) * g;
    const double vi = hp.beta2 * static_cast<double>(v[i]) + (1.0 - hp.beta2) * g * g;
    const double denom = std::sqrt(vi) / bias_correction2_sqrt + hp.eps;
    param[i] = static_cast<T>(p - step_size * mi / denom);
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
  }
}

template void AdamW<float>(const AdamWParams&, int64_t, float*, const float*, float*, float*);
template void AdamW<double>(const AdamWParams&, int64_t, double*, const double*, double*, double*);

}  // namespace ft::cpu
