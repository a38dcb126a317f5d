// Fused AdamW (cpu::AdamW's formula, in fp64 per element like the CPU):
//   g  = grad * multiplier                (loss-scale unscaling x clipping)
//   p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// The step-dependent scalars are computed on the host in double, as on the
// CPU. One thread per element; the fp32 master p, m, v are rewritten and the
// compute-dtype copy (if any) gets p rounded to nearest even. A nonzero *skip
// (fp16 overflow) leaves everything untouched; it is read on the device, so
// no host synchronisation is needed.
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

constexpr int kThreads = 256;

struct AdamWScalars {
  double beta1, beta2, eps, step_size, bias_correction2_sqrt, decay;
};

template <typename TCopy>
__global__ void AdamWKernel(AdamWScalars s, int64_t n, float* param, const float* grad, float* m, float* v,
                            TCopy* param_copy, const float* grad_multiplier, const int* skip) {
  if (skip != nullptr && *skip != 0) return;
  const double mult = grad_multiplier == nullptr ? 1.0 : static_cast<double>(*grad_multiplier);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    // grad * multiplier is rounded to float first, as when the CPU engine
    // scales the gradient buffer before its AdamW call.
    const double g = grad_multiplier == nullptr ? static_cast<double>(grad[i])
                                                : static_cast<double>(static_cast<float>(grad[i] * mult));
    const double p = static_cast<double>(param[i]) * s.decay;
    const double mi = s.beta1 * static_cast<double>(m[i]) + (1.0 - s.beta1) * g;
    const double vi = s.beta2 * static_cast<double>(v[i]) + (1.0 - s.beta2) * g * g;
    const double denom = sqrt(vi) / s.bias_correction2_sqrt + s.eps;
    const float updated = static_cast<float>(p - s.step_size * mi / denom);
    param[i] = updated;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    if (param_copy != nullptr) param_copy[i] = internal::Store<TCopy>(updated);
  }
}

}  // namespace

template <typename TCopy>
Status AdamW(const AdamWParams& hp, int64_t n, float* param, const float* grad, float* m, float* v,
             TCopy* param_copy, const float* grad_multiplier, const int* skip, cudaStream_t stream) {
  FT_CHECK(n >= 0 && hp.step >= 1);
  if (n == 0) return Status::OK();
  const double t = static_cast<double>(hp.step);
  const AdamWScalars s{hp.beta1,
                       hp.beta2,
                       hp.eps,
                       hp.lr / (1.0 - std::pow(hp.beta1, t)),
                       std::sqrt(1.0 - std::pow(hp.beta2, t)),
                       1.0 - hp.lr * hp.weight_decay};
  AdamWKernel<TCopy><<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(
      s, n, param, grad, m, v, param_copy, grad_multiplier, skip);
  return internal::LaunchStatus("AdamWKernel");
}

#define FT_INSTANTIATE_ADAMW(T)                                                                   \
  template Status AdamW<T>(const AdamWParams&, int64_t, float*, const float*, float*, float*, T*, \
                           const float*, const int*, cudaStream_t);
FT_INSTANTIATE_ADAMW(float)
FT_INSTANTIATE_ADAMW(bf16)
FT_INSTANTIATE_ADAMW(fp16)
#undef FT_INSTANTIATE_ADAMW

}  // namespace ft::cuda
