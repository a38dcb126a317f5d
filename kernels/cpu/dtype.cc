// Whole-array bf16 and IEEE binary16 conversions (the element conversions are
// inline in kernels/cpu/dtype.h), all round-to-nearest-even.
#include "kernels/cpu/dtype.h"

#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {

void RoundToBf16(float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToFloat(FloatToBf16(x[i]));
}

void RoundToFp16(float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) x[i] = HalfToFloat(FloatToHalf(x[i]));
}

void NarrowTo16(bool bf16, const float* x, int64_t n, uint16_t* out) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = bf16 ? FloatToBf16(x[i]) : FloatToHalf(x[i]);
}

void WidenFrom16(bool bf16, const uint16_t* x, int64_t n, float* out) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = bf16 ? Bf16ToFloat(x[i]) : HalfToFloat(x[i]);
}

template <typename SIn, typename SOut>
void Convert(const SIn* x, int64_t n, SOut* out) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) Store(Load(x[i]), out + i);
}

template void Convert<float, Bf16>(const float*, int64_t, Bf16*);
template void Convert<float, Half>(const float*, int64_t, Half*);
template void Convert<Bf16, float>(const Bf16*, int64_t, float*);
template void Convert<Half, float>(const Half*, int64_t, float*);

}  // namespace ft::cpu
