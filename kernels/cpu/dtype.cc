// Whole-array bf16 and IEEE binary16 conversions (the element conversions are
// inline in kernels/cpu/dtype.h), all round-to-nearest-even.
#include "kernels/cpu/dtype.h"

#include "common/openmp_start.h"
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

template <typename SIn, typename SOut>
void Convert(const SIn* x, int64_t n, SOut* out) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) Store(Load(x[i]), out + i);
}

// The raw-code forms of Convert (Bf16 and Half are one uint16_t each).
void NarrowTo16(bool bf16, const float* x, int64_t n, uint16_t* out) {
  if (bf16) {
    Convert(x, n, reinterpret_cast<Bf16*>(out));
  } else {
    Convert(x, n, reinterpret_cast<Half*>(out));
  }
}

void WidenFrom16(bool bf16, const uint16_t* x, int64_t n, float* out) {
  if (bf16) {
    Convert(reinterpret_cast<const Bf16*>(x), n, out);
  } else {
    Convert(reinterpret_cast<const Half*>(x), n, out);
  }
}

template void Convert<float, Bf16>(const float*, int64_t, Bf16*);
template void Convert<float, Half>(const float*, int64_t, Half*);
template void Convert<Bf16, float>(const Bf16*, int64_t, float*);
template void Convert<Half, float>(const Half*, int64_t, float*);

}  // namespace ft::cpu
