// Cross-entropy over one chunk of rows of the loss head (cpu::CrossEntropy).
//
// One block per row, three passes over the row's V logits:
//   1. mx = max_j x_j (BlockMax), and every thread reads x_t (the target's
//      logit) before any gradient is written (dlogits may alias logits; the
//      block barriers of the reductions order the read before pass 3's writes);
//   2. sum = Σ_j exp(x_j - mx) (BlockSum, fixed order);
//   3. loss = log(sum) + mx - x_t; when wanted
//      dlogits_j = scale * (exp(x_j - mx) / sum - [j == t]), times
//      1 - (x_j / softcap)² when the logits were soft-capped.
// Each thread rewrites only the indices it read, so in-place is safe.
// The batch loss is then summed over rows by one block in a fixed order (fp64).
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;
constexpr int32_t kIgnoreIndex = -100;

template <typename T>
__global__ void CrossEntropyKernel(const T* logits, const int32_t* targets, int64_t V, float grad_scale,
                                   T* dlogits, float* row_loss, float softcap) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int32_t t = targets[r];
  const T* x = logits + r * V;
  T* dx = dlogits == nullptr ? nullptr : dlogits + r * V;
  if (t == kIgnoreIndex) {
    if (threadIdx.x == 0) row_loss[r] = 0.0f;
    if (dx != nullptr) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = Store<T>(0.0f);
    }
    return;
  }
  if (t < 0 || t >= V) {  // a bad target: loud NaNs, never a silent wrong loss
    const float nan = __int_as_float(0x7fc00000);
    if (threadIdx.x == 0) row_loss[r] = nan;
    if (dx != nullptr) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = Store<T>(nan);
    }
    return;
  }
  const float x_target = Load(x[t]);
  float mx = -__int_as_float(0x7f800000);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, Load(x[j]));
  mx = internal::BlockMax(mx, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += expf(Load(x[j]) - mx);
  sum = internal::BlockSum(sum, scratch);
  if (threadIdx.x == 0) {
    row_loss[r] = static_cast<float>(log(static_cast<double>(sum)) + static_cast<double>(mx) - x_target);
  }
  if (dx == nullptr) return;
  const float inv_sum = 1.0f / sum, inv_cap = softcap > 0 ? 1.0f / softcap : 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float y = Load(x[j]), p = expf(y - mx) * inv_sum, u = y * inv_cap;
    const float g = grad_scale * (j == t ? p - 1.0f : p);
    dx[j] = Store<T>(softcap > 0 ? g * (1.0f - u * u) : g);
  }
}

// One block: *loss_sum += Σ_r row_loss[r], thread i taking rows i, i + 256, ...
// in order, then BlockSum's fixed tree.
__global__ void SumRowLossesKernel(const float* row_loss, int64_t rows, double* loss_sum) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) acc += static_cast<double>(row_loss[r]);
  acc = internal::BlockSum(acc, scratch);
  if (threadIdx.x == 0) *loss_sum += acc;
}

}  // namespace

template <typename T>
Status CrossEntropy(const T* logits, const int32_t* targets, int64_t rows, int64_t V, float grad_scale,
                    T* dlogits, float* row_loss, double* loss_sum, cudaStream_t stream, float softcap) {
  FT_CHECK(rows >= 0 && V > 0 && row_loss != nullptr && softcap >= 0);
  if (rows == 0) return Status::OK();
  CrossEntropyKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, targets, V, grad_scale,
                                                                              dlogits, row_loss, softcap);
  FT_RETURN_IF_ERROR(internal::LaunchStatus("CrossEntropyKernel"));
  if (loss_sum == nullptr) return Status::OK();
  SumRowLossesKernel<<<1, kThreads, 0, stream>>>(row_loss, rows, loss_sum);
  return internal::LaunchStatus("SumRowLossesKernel");
}

template Status CrossEntropy<float>(const float*, const int32_t*, int64_t, int64_t, float, float*, float*,
                                    double*, cudaStream_t, float);
template Status CrossEntropy<bf16>(const bf16*, const int32_t*, int64_t, int64_t, float, bf16*, float*,
                                   double*, cudaStream_t, float);

}  // namespace ft::cuda
