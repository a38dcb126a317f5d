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

template <typename T, typename P>
__global__ void SwiGluBackwardKernel(const T* gate, const T* up, const P* dh, int64_t n, P* dgate, P* dup) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = Load(gate[i]), u = Load(up[i]), d = Load(dh[i]);
    const float sig = Sigmoid(g);
    dgate[i] = Store<P>(d * u * sig * (1.0f + g * (1.0f - sig)));
    dup[i] = Store<P>(d * g * sig);
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

template <typename T, typename P>
Status SwiGluBackward(const T* gate, const T* up, const P* dh, int64_t n, P* dgate, P* dup,
                      cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  SwiGluBackwardKernel<T, P>
      <<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(gate, up, dh, n, dgate, dup);
  return internal::LaunchStatus("SwiGluBackwardKernel");
}

template Status SwiGluForward<float>(const float*, const float*, int64_t, float*, cudaStream_t);
template Status SwiGluForward<bf16>(const bf16*, const bf16*, int64_t, bf16*, cudaStream_t);
template Status SwiGluForward<fp16>(const fp16*, const fp16*, int64_t, fp16*, cudaStream_t);
#define FT_INSTANTIATE_SWIGLU_BACKWARD(T, P) \
  template Status SwiGluBackward<T, P>(const T*, const T*, const P*, int64_t, P*, P*, cudaStream_t);
FT_INSTANTIATE_SWIGLU_BACKWARD(float, float)
FT_INSTANTIATE_SWIGLU_BACKWARD(bf16, bf16)
FT_INSTANTIATE_SWIGLU_BACKWARD(bf16, float)
FT_INSTANTIATE_SWIGLU_BACKWARD(fp16, float)
#undef FT_INSTANTIATE_SWIGLU_BACKWARD

}  // namespace ft::cuda
