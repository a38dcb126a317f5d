// SwiGLU as in HF's LlamaMLP: h = silu(gate) * up, silu(g) = g * sigmoid(g).
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

}  // namespace

template <typename S>
void SwiGluForward(const S* gate, const S* up, int64_t n, S* h) {
  using T = decltype(Load(S{}));
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T g = Load(gate[i]);
    Store(g * Sigmoid(g) * Load(up[i]), h + i);
  }
}

// d silu(g)/dg = σ(g) + g σ(g) (1 - σ(g)) = σ(g) (1 + g (1 - σ(g))).
template <typename T, typename S>
void SwiGluBackward(const S* gate, const S* up, const T* dh, int64_t n, T* dgate, T* dup) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    // Read everything before writing: dgate/dup may alias gate/up.
    const T g = Load(gate[i]), u = Load(up[i]), d = dh[i];
    const T sig = Sigmoid(g);
    dgate[i] = d * u * sig * (T(1) + g * (T(1) - sig));
    dup[i] = d * g * sig;
  }
}

#define FT_INSTANTIATE_SWIGLU(T, S)                                \
  template void SwiGluForward<S>(const S*, const S*, int64_t, S*); \
  template void SwiGluBackward<T, S>(const S*, const S*, const T*, int64_t, T*, T*);
FT_INSTANTIATE_SWIGLU(float, float)
FT_INSTANTIATE_SWIGLU(double, double)
FT_INSTANTIATE_SWIGLU(float, Bf16)
FT_INSTANTIATE_SWIGLU(float, Half)
#undef FT_INSTANTIATE_SWIGLU

}  // namespace ft::cpu
