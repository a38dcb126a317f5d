// SwiGLU as in HF's LlamaMLP: h = silu(gate) * up, silu(g) = g * sigmoid(g).
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

}  // namespace

template <typename T>
void SwiGluForward(const T* gate, const T* up, int64_t n, T* h) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) h[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

// d silu(g)/dg = σ(g) + g σ(g) (1 - σ(g)) = σ(g) (1 + g (1 - σ(g))).
template <typename T>
void SwiGluBackward(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    // Read everything before writing: dgate/dup may alias gate/up.
    const T g = gate[i], u = up[i], d = dh[i];
    const T sig = Sigmoid(g);
    dgate[i] = d * u * sig * (T(1) + g * (T(1) - sig));
    dup[i] = d * g * sig;
  }
}

template void SwiGluForward<float>(const float*, const float*, int64_t, float*);
template void SwiGluForward<double>(const double*, const double*, int64_t, double*);
template void SwiGluBackward<float>(const float*, const float*, const float*, int64_t, float*, float*);
template void SwiGluBackward<double>(const double*, const double*, const double*, int64_t, double*, double*);

}  // namespace ft::cpu
