// Gated MLP activations: h = act(gate) * up, with act SiLU (SwiGLU, HF's
// LlamaMLP) or GELU with the tanh approximation (GeGLU, HF's Gemma MLP,
// "gelu_pytorch_tanh"); one loop over an activation's value and derivative.
#include <cmath>

#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

// Below this many elements a thread team costs more than it saves.
[[maybe_unused]] constexpr int64_t kParallelMin = 1 << 15;

// FastExp so the loops vectorise; exp overflow gives exactly 0, no NaN.
template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + internal::FastExp(-x));
}

// silu(g) = g σ(g); d/dg = σ(g) + g σ(g) (1 - σ(g)) = σ(g) (1 + g (1 - σ(g))).
struct Silu {
  template <typename T>
  static T Value(T g) {
    return g * Sigmoid(g);
  }
  template <typename T>
  static T Derivative(T g) {
    const T sig = Sigmoid(g);
    return sig * (T(1) + g * (T(1) - sig));
  }
};

// gelu_tanh(g) = ½ g (1 + tanh(β (g + κ g³))), β = √(2/π), κ = 0.044715 (PyTorch's
// approximate="tanh"); d/dg = ½ (1 + t) + ½ g (1 - t²) β (1 + 3κ g²), t = tanh(β (g + κ g³)).
struct GeluTanh {
  static constexpr double kBeta = 0.7978845608028654, kKappa = 0.044715;
  template <typename T>
  static T Tanh(T g) {
    return std::tanh(T(kBeta) * (g + T(kKappa) * g * g * g));
  }
  template <typename T>
  static T Value(T g) {
    return T(0.5) * g * (T(1) + Tanh(g));
  }
  template <typename T>
  static T Derivative(T g) {
    const T t = Tanh(g);
    return T(0.5) * (T(1) + t) + T(0.5) * g * (T(1) - t * t) * T(kBeta) * (T(1) + T(3 * kKappa) * g * g);
  }
};

template <typename Act, typename S>
void GluForward(const S* gate, const S* up, int64_t n, S* h) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) Store(Act::Value(Load(gate[i])) * Load(up[i]), h + i);
}

template <typename Act, typename T, typename S, typename G>
void GluBackward(const S* gate, const S* up, const G* dh, int64_t n, G* dgate, G* dup) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    // Read everything before writing: dgate/dup may alias gate/up.
    const T g = Load(gate[i]), u = Load(up[i]), d = Load(dh[i]);
    Store(d * u * Act::Derivative(g), dgate + i);
    Store(d * Act::Value(g), dup + i);
  }
}

}  // namespace

template <typename S>
void SwiGluForward(const S* gate, const S* up, int64_t n, S* h) {
  GluForward<Silu>(gate, up, n, h);
}
template <typename T, typename S, typename G>
void SwiGluBackward(const S* gate, const S* up, const G* dh, int64_t n, G* dgate, G* dup) {
  GluBackward<Silu, T>(gate, up, dh, n, dgate, dup);
}
template <typename S>
void GeluTanhGluForward(const S* gate, const S* up, int64_t n, S* h) {
  GluForward<GeluTanh>(gate, up, n, h);
}
template <typename T, typename S, typename G>
void GeluTanhGluBackward(const S* gate, const S* up, const G* dh, int64_t n, G* dgate, G* dup) {
  GluBackward<GeluTanh, T>(gate, up, dh, n, dgate, dup);
}

#define FT_INSTANTIATE_GLU_BACKWARD(T, S, G)                                            \
  template void SwiGluBackward<T, S, G>(const S*, const S*, const G*, int64_t, G*, G*); \
  template void GeluTanhGluBackward<T, S, G>(const S*, const S*, const G*, int64_t, G*, G*);
#define FT_INSTANTIATE_SWIGLU(T, S)                                     \
  template void SwiGluForward<S>(const S*, const S*, int64_t, S*);      \
  template void GeluTanhGluForward<S>(const S*, const S*, int64_t, S*); \
  FT_INSTANTIATE_GLU_BACKWARD(T, S, T)
FT_INSTANTIATE_SWIGLU(float, float)
FT_INSTANTIATE_SWIGLU(double, double)
FT_INSTANTIATE_SWIGLU(float, Bf16)
FT_INSTANTIATE_SWIGLU(float, Half)
FT_INSTANTIATE_GLU_BACKWARD(float, Bf16, Bf16)
FT_INSTANTIATE_GLU_BACKWARD(float, Half, Half)
#undef FT_INSTANTIATE_SWIGLU
#undef FT_INSTANTIATE_GLU_BACKWARD

}  // namespace ft::cpu
