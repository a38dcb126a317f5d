// RMSNorm forward/backward (cpu::RmsNormForward/Backward's math in fp32).
//
// Forward and the dx part of backward: one block per row; the block's
// threads stride over the row's D columns and BlockSum (fixed order) gives
// Σx² or Σ dy w x.
// dw: Σ over rows of dy * x * rstd per column, in two passes with no atomics:
// pass 1 gives each chunk of kRowsPerChunk rows one partial sum per column
// (workspace[chunk, D], rows in order), pass 2 adds the chunks in order.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kRowThreads = 256;
constexpr int kColumnThreads = 256;
constexpr int64_t kRowsPerChunk = 64;

// One block per row r: y = w * (x * rs), rs = 1 / sqrt(mean(x²) + eps).
template <typename T, typename P>
__global__ void RmsNormForwardKernel(const T* x, const P* w, int64_t D, float eps, T* y, float* rstd) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = Load(xr[j]);
    ss += v * v;
  }
  ss = internal::BlockSum(ss, scratch);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  T* yr = y + r * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = Store<T>(Load(w[j]) * (Load(xr[j]) * rs));
}

// dx_j = rs (dy_j w_j - x_j c), c = rs² (Σ_k dy_k w_k x_k) / D.
template <typename T, typename P, typename G>
__global__ void RmsNormBackwardDxKernel(const T* x, const P* w, const float* rstd, const G* dy, int64_t D,
                                        P* dx) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  const G* dyr = dy + r * D;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += Load(dyr[j]) * Load(w[j]) * Load(xr[j]);
  dot = internal::BlockSum(dot, scratch);
  const float rs = rstd[r];
  const float c = rs * rs * dot / static_cast<float>(D);
  P* dxr = dx + r * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    dxr[j] = Store<P>(rs * (Load(dyr[j]) * Load(w[j]) - Load(xr[j]) * c));
  }
}

// Pass 1: partial[chunk, j] = Σ_{rows of chunk, in order} dy[r,j] x[r,j] rstd[r].
// grid (column blocks, chunks).
template <typename T, typename G>
__global__ void RmsNormWeightPartialKernel(const T* x, const float* rstd, const G* dy, int64_t rows,
                                           int64_t D, float* partial) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= D) return;
  const int64_t r0 = blockIdx.y * kRowsPerChunk;
  const int64_t r1 = min(rows, r0 + kRowsPerChunk);
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) acc += Load(dy[r * D + j]) * Load(x[r * D + j]) * rstd[r];
  partial[blockIdx.y * D + j] = acc;
}

// Pass 2: dw[j] += Σ_chunks partial[c, j], chunks in order.
__global__ void RmsNormWeightReduceKernel(const float* partial, int64_t chunks, int64_t D, float* dw) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= D) return;
  float acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * D + j];
  dw[j] += acc;
}

int64_t Chunks(int64_t rows) { return (rows + kRowsPerChunk - 1) / kRowsPerChunk; }

}  // namespace

template <typename T, typename P>
Status RmsNormForward(const T* x, const P* w, int64_t rows, int64_t D, float eps, T* y, float* rstd,
                      cudaStream_t stream) {
  FT_CHECK(rows >= 0 && D > 0);
  if (rows == 0) return Status::OK();
  RmsNormForwardKernel<T, P><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, w, D, eps, y, rstd);
  return internal::LaunchStatus("RmsNormForwardKernel");
}

int64_t RmsNormBackwardWorkspaceFloats(int64_t rows, int64_t D) { return Chunks(rows) * D; }

template <typename T, typename P, typename G>
Status RmsNormBackward(const T* x, const P* w, const float* rstd, const G* dy, int64_t rows, int64_t D, P* dx,
                       float* dw, float* workspace, cudaStream_t stream) {
  FT_CHECK(rows >= 0 && D > 0);
  if (rows == 0) return Status::OK();
  RmsNormBackwardDxKernel<T, P, G>
      <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, w, rstd, dy, D, dx);
  FT_RETURN_IF_ERROR(internal::LaunchStatus("RmsNormBackwardDxKernel"));
  if (dw == nullptr) return Status::OK();
  FT_CHECK(workspace != nullptr);
  const unsigned column_blocks = internal::BlocksFor(D, kColumnThreads);
  const dim3 grid(column_blocks, static_cast<unsigned>(Chunks(rows)));
  RmsNormWeightPartialKernel<T, G><<<grid, kColumnThreads, 0, stream>>>(x, rstd, dy, rows, D, workspace);
  FT_RETURN_IF_ERROR(internal::LaunchStatus("RmsNormWeightPartialKernel"));
  RmsNormWeightReduceKernel<<<column_blocks, kColumnThreads, 0, stream>>>(workspace, Chunks(rows), D, dw);
  return internal::LaunchStatus("RmsNormWeightReduceKernel");
}

#define FT_INSTANTIATE_NORM_BACKWARD(T, P, G)                                                                \
  template Status RmsNormBackward<T, P, G>(const T*, const P*, const float*, const G*, int64_t, int64_t, P*, \
                                           float*, float*, cudaStream_t);
#define FT_INSTANTIATE_NORM(T, P)                                                               \
  template Status RmsNormForward<T, P>(const T*, const P*, int64_t, int64_t, float, T*, float*, \
                                       cudaStream_t);                                           \
  FT_INSTANTIATE_NORM_BACKWARD(T, P, P)
FT_INSTANTIATE_NORM(float, float)
FT_INSTANTIATE_NORM(bf16, bf16)
FT_INSTANTIATE_NORM(bf16, float)
FT_INSTANTIATE_NORM(fp16, float)
// A gradient stored in the activations' 16 bits (engine/model/backend.h).
FT_INSTANTIATE_NORM_BACKWARD(bf16, float, bf16)
FT_INSTANTIATE_NORM_BACKWARD(fp16, float, fp16)
#undef FT_INSTANTIATE_NORM
#undef FT_INSTANTIATE_NORM_BACKWARD

}  // namespace ft::cuda
