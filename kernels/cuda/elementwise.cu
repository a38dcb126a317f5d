// Reductions and elementwise helpers of the optimizer step: the deterministic
// sum of squares (global grad norm), the clipping multiplier, Axpy, Scale and
// dtype conversion.
//
// SumSquares runs two passes over a grid fixed at compile time (kBlocks x
// kThreads threads): thread g sums x[g], x[g + stride], ... in order (fp64),
// each block reduces its threads in BlockSum's fixed tree into workspace[block],
// and one block adds the kBlocks partials the same way. The order depends on
// nothing but n, so the result is bit-identical from run to run (it is not
// the CPU's order: the two agree to fp64 rounding). SumSquaresList does the
// same for a list of tensors in two launches: block (x, y) is tensor y's
// block x, then block y adds tensor y's partials; each total is the one
// SumSquares gives that tensor alone, bit for bit.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kBlocks = 512;
constexpr int kThreads = 256;

// Block blockIdx.x's share of Σ x² (every thread of the block calls it).
template <typename T>
__device__ double BlockSumSquares(const T* x, int64_t n) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double v = Load(x[i]);
    acc += v * v;
  }
  return internal::BlockSum(acc, scratch);
}

template <typename T>
__global__ void SumSquaresPartialKernel(const T* x, int64_t n, double* partial) {
  const double acc = BlockSumSquares(x, n);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block of kBlocks threads: thread i takes partial[i].
__global__ void SumSquaresFinalKernel(const double* partial, double* out, bool accumulate) {
  __shared__ double scratch[32];
  const double total = internal::BlockSum(partial[threadIdx.x], scratch);
  if (threadIdx.x == 0) *out = accumulate ? *out + total : total;
}

// Grid (kBlocks, tensors): tensor blockIdx.y's partials, as SumSquaresPartialKernel's.
template <typename T>
__global__ void SumSquaresListPartialKernel(const TensorSpan<T>* list, double* partial) {
  const TensorSpan<T> t = list[blockIdx.y];
  const double acc = BlockSumSquares(t.data, t.n);
  if (threadIdx.x == 0) partial[blockIdx.y * int64_t{kBlocks} + blockIdx.x] = acc;
}

// One block of kBlocks threads per tensor, as SumSquaresFinalKernel's.
__global__ void SumSquaresListTotalsKernel(const double* partial, double* totals) {
  __shared__ double scratch[32];
  const double total = internal::BlockSum(partial[blockIdx.x * int64_t{kBlocks} + threadIdx.x], scratch);
  if (threadIdx.x == 0) totals[blockIdx.x] = total;
}

__global__ void ClipMultiplierKernel(const double* sum_squares, float max_norm, const float* inv_loss_scale,
                                     float* multiplier) {
  const double inv = inv_loss_scale == nullptr ? 1.0 : static_cast<double>(*inv_loss_scale);
  const double norm = sqrt(*sum_squares) * inv;
  double coef = 1.0;
  if (max_norm > 0.0f) coef = fmin(1.0, static_cast<double>(max_norm) / (norm + 1e-6));
  *multiplier = static_cast<float>(inv * coef);
}

template <typename T, typename P>
__global__ void AxpyKernel(int64_t n, float alpha, const T* x, P* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = Store<P>(Load(y[i]) + alpha * Load(x[i]));
  }
}

template <typename T>
__global__ void ScaleKernel(int64_t n, float alpha, T* x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = Store<T>(Load(x[i]) * alpha);
  }
}

__global__ void SoftCapKernel(int64_t n, float cap, float* x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = cap * tanhf(x[i] / cap);
  }
}

template <typename TIn, typename TOut>
__global__ void ConvertKernel(const TIn* x, int64_t n, TOut* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = Store<TOut>(Load(x[i]));
  }
}

}  // namespace

int64_t SumSquaresWorkspaceDoubles() { return kBlocks; }

template <typename T>
Status SumSquares(const T* x, int64_t n, double* workspace, double* out, bool accumulate,
                  cudaStream_t stream) {
  FT_CHECK(n >= 0 && workspace != nullptr && out != nullptr);
  SumSquaresPartialKernel<T><<<kBlocks, kThreads, 0, stream>>>(x, n, workspace);
  FT_RETURN_IF_ERROR(internal::LaunchStatus("SumSquaresPartialKernel"));
  SumSquaresFinalKernel<<<1, kBlocks, 0, stream>>>(workspace, out, accumulate);
  return internal::LaunchStatus("SumSquaresFinalKernel");
}

// The grid's y dimension holds at most 65535 tensors: longer lists go in groups.
constexpr int64_t kMaxListGroup = 65535;

int64_t SumSquaresListWorkspaceDoubles(int64_t count) { return std::min(count, kMaxListGroup) * kBlocks; }

template <typename T>
Status SumSquaresList(const TensorSpan<T>* list, int64_t count, double* workspace, double* totals,
                      cudaStream_t stream) {
  FT_CHECK(count >= 0 && list != nullptr && workspace != nullptr && totals != nullptr);
  for (int64_t first = 0; first < count; first += kMaxListGroup) {
    const auto group = static_cast<unsigned>(std::min(count - first, kMaxListGroup));
    SumSquaresListPartialKernel<T><<<dim3(kBlocks, group), kThreads, 0, stream>>>(list + first, workspace);
    FT_RETURN_IF_ERROR(internal::LaunchStatus("SumSquaresListPartialKernel"));
    SumSquaresListTotalsKernel<<<group, kBlocks, 0, stream>>>(workspace, totals + first);
    FT_RETURN_IF_ERROR(internal::LaunchStatus("SumSquaresListTotalsKernel"));
  }
  return Status::OK();
}

Status ClipMultiplier(const double* sum_squares, float max_norm, const float* inv_loss_scale,
                      float* multiplier, cudaStream_t stream) {
  ClipMultiplierKernel<<<1, 1, 0, stream>>>(sum_squares, max_norm, inv_loss_scale, multiplier);
  return internal::LaunchStatus("ClipMultiplierKernel");
}

template <typename T, typename P>
Status Axpy(int64_t n, float alpha, const T* x, P* y, cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  AxpyKernel<T, P><<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(n, alpha, x, y);
  return internal::LaunchStatus("AxpyKernel");
}

template <typename T>
Status Scale(int64_t n, float alpha, T* x, cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  ScaleKernel<T><<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(n, alpha, x);
  return internal::LaunchStatus("ScaleKernel");
}

Status SoftCap(int64_t n, float cap, float* x, cudaStream_t stream) {
  FT_CHECK(n >= 0 && cap > 0);
  if (n == 0) return Status::OK();
  SoftCapKernel<<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(n, cap, x);
  return internal::LaunchStatus("SoftCapKernel");
}

template <typename TIn, typename TOut>
Status Convert(const TIn* x, int64_t n, TOut* out, cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  ConvertKernel<TIn, TOut><<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(x, n, out);
  return internal::LaunchStatus("ConvertKernel");
}

#define FT_INSTANTIATE_ELEMENTWISE(T)                                                               \
  template Status SumSquares<T>(const T*, int64_t, double*, double*, bool, cudaStream_t);           \
  template Status SumSquaresList<T>(const TensorSpan<T>*, int64_t, double*, double*, cudaStream_t); \
  template Status Axpy<T, T>(int64_t, float, const T*, T*, cudaStream_t);                           \
  template Status Scale<T>(int64_t, float, T*, cudaStream_t);
FT_INSTANTIATE_ELEMENTWISE(float)
FT_INSTANTIATE_ELEMENTWISE(bf16)
FT_INSTANTIATE_ELEMENTWISE(fp16)
#undef FT_INSTANTIATE_ELEMENTWISE
template Status Axpy<bf16, float>(int64_t, float, const bf16*, float*, cudaStream_t);
template Status Axpy<fp16, float>(int64_t, float, const fp16*, float*, cudaStream_t);
template Status Convert<float, bf16>(const float*, int64_t, bf16*, cudaStream_t);
template Status Convert<float, fp16>(const float*, int64_t, fp16*, cudaStream_t);
template Status Convert<bf16, float>(const bf16*, int64_t, float*, cudaStream_t);
template Status Convert<fp16, float>(const fp16*, int64_t, float*, cudaStream_t);

}  // namespace ft::cuda
