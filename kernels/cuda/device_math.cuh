// Internal to kernels/cuda: device helpers shared by the kernels.
//
// Load/Store convert between a storage type (float, bf16, fp16) and the fp32
// every kernel computes in; stores round to nearest even. WarpSum/WarpMax
// reduce over the 32 lanes of a warp with butterfly shuffles (every lane gets
// the result; the order is fixed, so results are deterministic). BlockSum
// reduces over a whole block (blockDim.x a multiple of 32, at most 1024) in a
// fixed order and returns the total to every thread; it synchronises the
// block, so every thread must call it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ft::cuda::internal {

__device__ __forceinline__ float Load(float x) { return x; }
__device__ __forceinline__ float Load(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float Load(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T Store(float x);
template <>
__device__ __forceinline__ float Store<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half Store<__half>(float x) {
  return __float2half_rn(x);
}

template <typename A>
__device__ __forceinline__ A WarpSum(A x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float WarpMax(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum over the block; `scratch` holds at least 32 values of A in shared memory.
template <typename A>
__device__ A BlockSum(A x, A* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = WarpSum(x);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  A total = lane < warps ? scratch[lane] : A(0);
  return WarpSum(total);
}

// Max over the block, as BlockSum.
__device__ inline float BlockMax(float x, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = WarpMax(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : -__int_as_float(0x7f800000);
  return WarpMax(total);
}

}  // namespace ft::cuda::internal
