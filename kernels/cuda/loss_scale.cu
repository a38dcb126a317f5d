// Dynamic loss scaling for fp16, with torch.cuda.amp.GradScaler's semantics.
//
// UnscaleAndCheckFinite: one thread per element; a thread that sees a
// non-finite value stores 1 into *found_inf. Many threads may store the same
// 1 concurrently: the result does not depend on their order.
// UpdateLossScale: one thread runs torch's _amp_update_scale_ on the device
// scalars, so the training loop never waits for the host.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

template <typename T>
__global__ void UnscaleKernel(T* grad, int64_t n, const float* inv_scale, int* found_inf) {
  const float inv = *inv_scale;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = Load(grad[i]);
    if (!isfinite(g)) *found_inf = 1;
    grad[i] = Store<T>(g * inv);
  }
}

__global__ void UpdateLossScaleKernel(LossScalerParams p, const int* found_inf, float* scale,
                                      float* inv_scale, int* growth_tracker) {
  if (*found_inf != 0) {
    *scale = *scale * p.backoff_factor;
    *growth_tracker = 0;
  } else {
    const int successful = *growth_tracker + 1;
    if (successful == p.growth_interval) {
      const float grown = *scale * p.growth_factor;
      if (isfinite(grown)) *scale = grown;
      *growth_tracker = 0;
    } else {
      *growth_tracker = successful;
    }
  }
  *inv_scale = 1.0f / *scale;
}

}  // namespace

template <typename T>
Status UnscaleAndCheckFinite(T* grad, int64_t n, const float* inv_scale, int* found_inf,
                             cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  UnscaleKernel<T><<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(grad, n, inv_scale, found_inf);
  return internal::LaunchStatus("UnscaleKernel");
}

Status UpdateLossScale(const LossScalerParams& p, const int* found_inf, float* scale, float* inv_scale,
                       int* growth_tracker, cudaStream_t stream) {
  if (p.growth_interval <= 0 || !(p.growth_factor > 1.0f) ||
      !(p.backoff_factor > 0.0f && p.backoff_factor < 1.0f)) {
    return Status::InvalidArgument(
        "UpdateLossScale: need growth_interval > 0, growth_factor > 1, 0 < backoff < 1");
  }
  UpdateLossScaleKernel<<<1, 1, 0, stream>>>(p, found_inf, scale, inv_scale, growth_tracker);
  return internal::LaunchStatus("UpdateLossScaleKernel");
}

template Status UnscaleAndCheckFinite<float>(float*, int64_t, const float*, int*, cudaStream_t);
template Status UnscaleAndCheckFinite<bf16>(bf16*, int64_t, const float*, int*, cudaStream_t);
template Status UnscaleAndCheckFinite<fp16>(fp16*, int64_t, const float*, int*, cudaStream_t);

}  // namespace ft::cuda
