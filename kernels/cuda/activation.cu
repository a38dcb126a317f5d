// SwiGLU (cpu::SwiGluForward/Backward): h = silu(g) * u, silu(g) = g σ(g),
// d silu/dg = σ(g) (1 + g (1 - σ(g))). One thread per element (grid-stride);
// every input is read before an output is written, so dgate/dup may alias
// gate/up. σ uses the accurate expf (not __expf).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void SwiGluForwardKernel(const T* gate, const T* up, int64_t n, T* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = Load(gate[i]);
    h[i] = Store<T>(g * Sigmoid(g) * Load(up[i]));
  }
}

template <typename T>
__global__ void SwiGluBackwardKernel(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = Load(gate[i]), u = Load(up[i]), d = Load(dh[i]);
    const float sig = Sigmoid(g);
    dgate[i] = Store<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
    dup[i] = Store<T>(d * g * sig);
  }
}

}  // namespace

template <typename T>
Status SwiGluForward(const T* gate, const T* up, int64_t n, T* h, cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  SwiGluForwardKernel<T><<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(gate, up, n, h);
  return internal::LaunchStatus("SwiGluForwardKernel");
}

template <typename T>
Status SwiGluBackward(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup,
                      cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  SwiGluBackwardKernel<T>
      <<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(gate, up, dh, n, dgate, dup);
  return internal::LaunchStatus("SwiGluBackwardKernel");
}

template Status SwiGluForward<float>(const float*, const float*, int64_t, float*, cudaStream_t);
template Status SwiGluForward<bf16>(const bf16*, const bf16*, int64_t, bf16*, cudaStream_t);
template Status SwiGluBackward<float>(const float*, const float*, const float*, int64_t, float*, float*,
                                      cudaStream_t);
template Status SwiGluBackward<bf16>(const bf16*, const bf16*, const bf16*, int64_t, bf16*, bf16*,
                                     cudaStream_t);

}  // namespace ft::cuda
