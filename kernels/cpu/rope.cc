// Rotary position embedding, HF rotate_half convention: element i of a head is
// paired with element i + hd/2 (not with its neighbour 2i+1), i.e.
//   x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x2, x1).
#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {

template <typename T>
void RopeApply(T* x, int64_t rows, int64_t heads, int64_t hd, const int32_t* positions, const T* cos_table,
               const T* sin_table, bool inverse) {
  FT_CHECK(rows >= 0 && heads > 0 && hd > 0 && hd % 2 == 0);
  const int64_t half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    FT_CHECK(positions[r] >= 0);
    const T* c = cos_table + static_cast<int64_t>(positions[r]) * half;
    const T* s = sin_table + static_cast<int64_t>(positions[r]) * half;
    for (int64_t h = 0; h < heads; ++h) {
      T* x1 = x + (r * heads + h) * hd;
      T* x2 = x1 + half;
      for (int64_t i = 0; i < half; ++i) {
        // The rotation by -θ (cos, -sin) is the transpose of the one by θ.
        const T sn = inverse ? -s[i] : s[i];
        const T a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * sn;
        x2[i] = b * c[i] + a * sn;
      }
    }
  }
}

template void RopeApply<float>(float*, int64_t, int64_t, int64_t, const int32_t*, const float*, const float*,
                               bool);
template void RopeApply<double>(double*, int64_t, int64_t, int64_t, const int32_t*, const double*,
                                const double*, bool);

}  // namespace ft::cpu
