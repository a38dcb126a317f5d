// Gated MLP activations (cpu::SwiGluForward/Backward, cpu::GeluTanhGluForward/
// Backward): h = act(g) * u with act SiLU, silu(g) = g σ(g), d/dg =
// σ(g) (1 + g (1 - σ(g))), or GELU with the tanh approximation (Gemma's
// "gelu_pytorch_tanh"), ½ g (1 + t), t = tanh(β (g + κ g³)), d/dg =
// ½ (1 + t) + ½ g (1 - t²) β (1 + 3κ g²). One thread per element
// (grid-stride); every input is read before an output is written, so
// dgate/dup may alias gate/up. σ and tanh use the accurate expf and tanhf.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

struct Silu {
  static __device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
  static __device__ __forceinline__ float Value(float g) { return g * Sigmoid(g); }
  static __device__ __forceinline__ float Derivative(float g) {
    const float sig = Sigmoid(g);
    return sig * (1.0f + g * (1.0f - sig));
  }
};

struct GeluTanh {
  static constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  static __device__ __forceinline__ float Tanh(float g) { return tanhf(kBeta * (g + kKappa * g * g * g)); }
  static __device__ __forceinline__ float Value(float g) { return 0.5f * g * (1.0f + Tanh(g)); }
  static __device__ __forceinline__ float Derivative(float g) {
    const float t = Tanh(g);
    return 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kBeta * (1.0f + 3.0f * kKappa * g * g);
  }
};

template <typename Act, typename T>
__global__ void GluForwardKernel(const T* gate, const T* up, int64_t n, T* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    h[i] = Store<T>(Act::Value(Load(gate[i])) * Load(up[i]));
  }
}

template <typename Act, typename T, typename P>
__global__ void GluBackwardKernel(const T* gate, const T* up, const P* dh, int64_t n, P* dgate, P* dup) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = Load(gate[i]), u = Load(up[i]), d = Load(dh[i]);
    dgate[i] = Store<P>(d * u * Act::Derivative(g));
    dup[i] = Store<P>(d * Act::Value(g));
  }
}

template <typename Act, typename T>
Status GluForward(const T* gate, const T* up, int64_t n, T* h, cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  GluForwardKernel<Act, T><<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(gate, up, n, h);
  return internal::LaunchStatus("GluForwardKernel");
}

template <typename Act, typename T, typename P>
Status GluBackward(const T* gate, const T* up, const P* dh, int64_t n, P* dgate, P* dup,
                   cudaStream_t stream) {
  FT_CHECK(n >= 0);
  if (n == 0) return Status::OK();
  GluBackwardKernel<Act, T, P>
      <<<internal::BlocksFor(n, kThreads), kThreads, 0, stream>>>(gate, up, dh, n, dgate, dup);
  return internal::LaunchStatus("GluBackwardKernel");
}

}  // namespace

template <typename T>
Status SwiGluForward(const T* gate, const T* up, int64_t n, T* h, cudaStream_t stream) {
  return GluForward<Silu>(gate, up, n, h, stream);
}
template <typename T, typename P>
Status SwiGluBackward(const T* gate, const T* up, const P* dh, int64_t n, P* dgate, P* dup,
                      cudaStream_t stream) {
  return GluBackward<Silu>(gate, up, dh, n, dgate, dup, stream);
}
template <typename T>
Status GeluTanhGluForward(const T* gate, const T* up, int64_t n, T* h, cudaStream_t stream) {
  return GluForward<GeluTanh>(gate, up, n, h, stream);
}
template <typename T, typename P>
Status GeluTanhGluBackward(const T* gate, const T* up, const P* dh, int64_t n, P* dgate, P* dup,
                           cudaStream_t stream) {
  return GluBackward<GeluTanh>(gate, up, dh, n, dgate, dup, stream);
}

#define FT_INSTANTIATE_GLU_FORWARD(T)                                              \
  template Status SwiGluForward<T>(const T*, const T*, int64_t, T*, cudaStream_t); \
  template Status GeluTanhGluForward<T>(const T*, const T*, int64_t, T*, cudaStream_t);
FT_INSTANTIATE_GLU_FORWARD(float)
FT_INSTANTIATE_GLU_FORWARD(bf16)
FT_INSTANTIATE_GLU_FORWARD(fp16)
#undef FT_INSTANTIATE_GLU_FORWARD
#define FT_INSTANTIATE_GLU_BACKWARD(T, P)                                                            \
  template Status SwiGluBackward<T, P>(const T*, const T*, const P*, int64_t, P*, P*, cudaStream_t); \
  template Status GeluTanhGluBackward<T, P>(const T*, const T*, const P*, int64_t, P*, P*, cudaStream_t);
FT_INSTANTIATE_GLU_BACKWARD(float, float)
FT_INSTANTIATE_GLU_BACKWARD(bf16, bf16)
FT_INSTANTIATE_GLU_BACKWARD(bf16, float)
FT_INSTANTIATE_GLU_BACKWARD(fp16, float)
FT_INSTANTIATE_GLU_BACKWARD(fp16, fp16)
#undef FT_INSTANTIATE_GLU_BACKWARD

}  // namespace ft::cuda
