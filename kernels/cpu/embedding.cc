// Token embedding lookup and its scatter-add backward.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {

template <typename T, typename S>
void EmbeddingForward(const T* table, const int32_t* ids, int64_t rows, int64_t D, S* out) {
  FT_CHECK(rows >= 0 && D > 0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    FT_CHECK(ids[r] >= 0);
    const T* row = table + static_cast<int64_t>(ids[r]) * D;
    if constexpr (std::is_same_v<S, T>) {
      std::memcpy(out + r * D, row, sizeof(T) * D);
    } else {
      for (int64_t j = 0; j < D; ++j) Store(row[j], out + r * D + j);
    }
  }
}

// Threads split the columns; each column adds rows in increasing order, so a
// token that appears twice accumulates the same way on any thread count.
template <typename T>
void EmbeddingBackward(const T* dout, const int32_t* ids, int64_t rows, int64_t D, T* dtable) {
  FT_CHECK(rows >= 0 && D > 0);
  for (int64_t r = 0; r < rows; ++r) FT_CHECK(ids[r] >= 0);
  constexpr int64_t kColumnBlock = 256;
  const int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kColumnBlock, j1 = std::min(D, j0 + kColumnBlock);
    for (int64_t r = 0; r < rows; ++r) {
      T* dst = dtable + static_cast<int64_t>(ids[r]) * D;
      const T* src = dout + r * D;
      for (int64_t j = j0; j < j1; ++j) dst[j] += src[j];
    }
  }
}

template void EmbeddingForward<float, float>(const float*, const int32_t*, int64_t, int64_t, float*);
template void EmbeddingForward<double, double>(const double*, const int32_t*, int64_t, int64_t, double*);
template void EmbeddingForward<float, Bf16>(const float*, const int32_t*, int64_t, int64_t, Bf16*);
template void EmbeddingForward<float, Half>(const float*, const int32_t*, int64_t, int64_t, Half*);
template void EmbeddingForward<Bf16, Bf16>(const Bf16*, const int32_t*, int64_t, int64_t, Bf16*);
template void EmbeddingForward<Half, Half>(const Half*, const int32_t*, int64_t, int64_t, Half*);
template void EmbeddingBackward<float>(const float*, const int32_t*, int64_t, int64_t, float*);
template void EmbeddingBackward<double>(const double*, const int32_t*, int64_t, int64_t, double*);

}  // namespace ft::cpu
