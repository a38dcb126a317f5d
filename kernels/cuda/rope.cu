// Rotary position embedding, HF rotate_half pairing (cpu::RopeApply).
//
// One thread per (row, head, i < hd/2): it reads the pair (x1 = x[i],
// x2 = x[i + hd/2]) of its head and writes
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin
// with (cos, sin) = tables[positions[row], i], sin negated for the inverse.
// Pairs are disjoint, so the update in place needs no synchronisation.
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

template <typename T, typename P>
__global__ void RopeKernel(T* x, int64_t rows, int64_t heads, int64_t hd, int64_t half,
                           const int32_t* positions, const P* cos_table, const P* sin_table, bool inverse) {
  const int64_t total = rows * heads * half;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = t % half;         // index inside the half head
    const int64_t row_head = t / half;  // row * heads + head
    const int64_t row = row_head / heads;
    const int64_t table = static_cast<int64_t>(positions[row]) * half + i;
    const float c = Load(cos_table[table]);
    const float sn = inverse ? -Load(sin_table[table]) : Load(sin_table[table]);
    T* x1 = x + row_head * hd + i;
    T* x2 = x1 + half;
    const float a = Load(*x1), b = Load(*x2);
    *x1 = Store<T>(a * c - b * sn);
    *x2 = Store<T>(b * c + a * sn);
  }
}

}  // namespace

template <typename T, typename P>
Status RopeApply(T* x, int64_t rows, int64_t heads, int64_t hd, const int32_t* positions, const P* cos_table,
                 const P* sin_table, bool inverse, cudaStream_t stream, int64_t rotary) {
  FT_CHECK(rows >= 0 && heads > 0 && hd > 0);
  if (rotary == 0) rotary = hd;
  if (rotary % 2 != 0 || rotary > hd)
    return Status::InvalidArgument("RopeApply: the rotary dims must be even and at most the head dim, got " +
                                   std::to_string(rotary) + " of " + std::to_string(hd));
  const int64_t total = rows * heads * (rotary / 2);
  if (total == 0) return Status::OK();
  RopeKernel<T, P><<<internal::BlocksFor(total, kThreads), kThreads, 0, stream>>>(
      x, rows, heads, hd, rotary / 2, positions, cos_table, sin_table, inverse);
  return internal::LaunchStatus("RopeKernel");
}

#define FT_INSTANTIATE_ROPE(T, P)                                                                          \
  template Status RopeApply<T, P>(T*, int64_t, int64_t, int64_t, const int32_t*, const P*, const P*, bool, \
                                  cudaStream_t, int64_t);
FT_INSTANTIATE_ROPE(float, float)
FT_INSTANTIATE_ROPE(bf16, bf16)
FT_INSTANTIATE_ROPE(bf16, float)
FT_INSTANTIATE_ROPE(fp16, float)
#undef FT_INSTANTIATE_ROPE

}  // namespace ft::cuda
