// Rotary position embedding, HF rotate_half convention: element i of a head is
// paired with element i + hd/2 (not with its neighbour 2i+1), i.e.
//   x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x2, x1).
#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {

template <typename T, typename S>
void RopeApply(S* x, int64_t rows, int64_t heads, int64_t hd, const int32_t* positions, const T* cos_table,
               const T* sin_table, bool inverse, int64_t rotary) {
  if (rotary == 0) rotary = hd;
  FT_CHECK(rows >= 0 && heads > 0 && hd > 0 && rotary > 0 && rotary <= hd && rotary % 2 == 0);
  const int64_t half = rotary / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    FT_CHECK(positions[r] >= 0);
    const T* c = cos_table + static_cast<int64_t>(positions[r]) * half;
    const T* s = sin_table + static_cast<int64_t>(positions[r]) * half;
    for (int64_t h = 0; h < heads; ++h) {
      S* x1 = x + (r * heads + h) * hd;
      S* x2 = x1 + half;
      for (int64_t i = 0; i < half; ++i) {
        // The rotation by -θ (cos, -sin) is the transpose of the one by θ.
        const T sn = inverse ? -s[i] : s[i];
        const T a = Load(x1[i]), b = Load(x2[i]);
        Store(a * c[i] - b * sn, x1 + i);
        Store(b * c[i] + a * sn, x2 + i);
      }
    }
  }
}

#define FT_INSTANTIATE_ROPE(T, S)                                                                        \
  template void RopeApply<T, S>(S*, int64_t, int64_t, int64_t, const int32_t*, const T*, const T*, bool, \
                                int64_t);
FT_INSTANTIATE_ROPE(float, float)
FT_INSTANTIATE_ROPE(double, double)
FT_INSTANTIATE_ROPE(float, Bf16)
FT_INSTANTIATE_ROPE(float, Half)
#undef FT_INSTANTIATE_ROPE

}  // namespace ft::cpu
