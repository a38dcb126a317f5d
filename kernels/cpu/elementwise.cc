// Elementwise helpers of the optimizer and gradient clipping.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

// SumSquares adds fixed-size chunks in parallel, then the chunk sums in order:
// the chunking, hence the result, does not depend on the thread count.
constexpr int64_t kChunk = 1 << 14;

// Below this many elements a thread team costs more than it saves.
[[maybe_unused]] constexpr int64_t kParallelMin = 1 << 15;

}  // namespace

template <typename T>
double SumSquares(const T* x, int64_t n) {
  FT_CHECK(n >= 0);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double sum = 0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
      sum += static_cast<double>(x[i]) * x[i];
    partial[c] = sum;
  }
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

template <typename T, typename S>
void Axpy(int64_t n, T alpha, const S* x, T* y) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * Load(x[i]);
}

template <typename T>
void Scale(int64_t n, T alpha, T* x) {
  FT_CHECK(n >= 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

template <typename T>
void SoftCap(int64_t n, T cap, T* x) {
  FT_CHECK(n >= 0 && cap > 0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

template double SumSquares<float>(const float*, int64_t);
template double SumSquares<double>(const double*, int64_t);
template void Axpy<float, float>(int64_t, float, const float*, float*);
template void Axpy<double, double>(int64_t, double, const double*, double*);
template void Axpy<float, Bf16>(int64_t, float, const Bf16*, float*);
template void Axpy<float, Half>(int64_t, float, const Half*, float*);
template void Scale<float>(int64_t, float, float*);
template void Scale<double>(int64_t, double, double*);
template void SoftCap<float>(int64_t, float, float*);
template void SoftCap<double>(int64_t, double, double*);

}  // namespace ft::cpu
