// LinearOutput (ops.h): a typed linear's last step in one pass. Each block
// holds one row's LoRA input xa[i, :] in shared memory (fp32) and a tile of
// kThreads columns; thread j sums xa[i, k] · b[j, k] over k = 0..r-1 in order
// (fp32), adds alpha times it to c[i, j], rounds to T, adds the residual and
// rounds again (with a residual), and stores y[i, j]. c is read once, y
// written once; B ([n, r], at most a few hundred KB) stays in the caches.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

template <typename T>
__global__ void LinearOutputKernel(int64_t n, int64_t r, int64_t tiles, float alpha, const T* xa, const T* b,
                                   const float* c, const T* residual, T* y) {
  extern __shared__ float xa_row[];
  const int64_t i = blockIdx.x / tiles, j = (blockIdx.x % tiles) * kThreads + threadIdx.x;
  for (int64_t k = threadIdx.x; k < r; k += blockDim.x) xa_row[k] = Load(xa[i * r + k]);
  __syncthreads();
  if (j >= n) return;
  float acc = 0.0f;
  for (int64_t k = 0; k < r; ++k) acc += xa_row[k] * Load(b[j * r + k]);
  const int64_t at = i * n + j;
  float v = c[at] + alpha * acc;
  if (residual != nullptr) v = Load(Store<T>(v)) + Load(residual[at]);
  y[at] = Store<T>(v);
}

}  // namespace

template <typename T>
Status LinearOutput(int64_t rows, int64_t n, int64_t r, float alpha, const T* xa, const T* b, const float* c,
                    const T* residual, T* y, cudaStream_t stream) {
  FT_CHECK(rows >= 0 && n >= 0 && r >= 0 && (r == 0 || (xa != nullptr && b != nullptr)));
  if (rows == 0 || n == 0) return Status::OK();
  const int64_t tiles = (n + kThreads - 1) / kThreads, blocks = rows * tiles;
  if (blocks > 0x7fffffff || r > kMaxLoraRank) {
    return Status::InvalidArgument("LinearOutput: " + std::to_string(rows) + " rows of " + std::to_string(n) +
                                   " columns at LoRA rank " + std::to_string(r) +
                                   " exceed the kernel's grid or its " + std::to_string(kMaxLoraRank) +
                                   "-rank shared row");
  }
  const size_t shared = static_cast<size_t>(std::max<int64_t>(r, 1)) * sizeof(float);
  LinearOutputKernel<T><<<static_cast<unsigned>(blocks), kThreads, shared, stream>>>(n, r, tiles, alpha, xa,
                                                                                     b, c, residual, y);
  return internal::LaunchStatus("LinearOutputKernel");
}

template Status LinearOutput<bf16>(int64_t, int64_t, int64_t, float, const bf16*, const bf16*, const float*,
                                   const bf16*, bf16*, cudaStream_t);
template Status LinearOutput<fp16>(int64_t, int64_t, int64_t, float, const fp16*, const fp16*, const float*,
                                   const fp16*, fp16*, cudaStream_t);

}  // namespace ft::cuda
