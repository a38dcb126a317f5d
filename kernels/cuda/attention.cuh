// Internal to kernels/cuda: what the flash-attention forward and backward
// kernels share (tile sizes, tile loads, the visibility rule).
//
// Tiling: a block of kWarps = 4 warps works on tiles of kTile = 32 queries
// and 32 keys of one (batch, head); each warp owns kRowsPerWarp = 8 of the
// block's 32 rows (queries in the forward and dQ kernels, keys in the dK/dV
// kernel) and lane l of the warp stands for column l of the 32 (a key, or a
// query in the dK/dV kernel). Tiles are staged in shared memory as fp32.
// A tile read by lane l along its own row is padded to HD + 1 floats per row,
// so the 32 lanes' addresses l * (HD + 1) + d fall in 32 different banks;
// tiles read with one address per warp (broadcast) or along d are unpadded.
//
// Index arithmetic of the [batch * seq, heads * HD] tensors: element d of
// head h of token i of sequence b is at ((b * seq + i) * heads + h) * HD + d.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda::internal {

constexpr int kTile = 32;
constexpr int kWarps = 4;
constexpr int kAttentionThreads = kWarps * 32;
constexpr int kRowsPerWarp = kTile / kWarps;

__device__ __forceinline__ float NegInf() { return -__int_as_float(0x7f800000); }

// Rows [row0, row0 + kTile) of head `head` into dst[kTile][LD] (fp32); rows
// past the sequence are zero.
template <int HD, int LD, typename T>
__device__ void LoadTile(float* dst, const T* src, int64_t b, int64_t row0, int64_t seq, int64_t heads,
                         int64_t head) {
  for (int idx = threadIdx.x; idx < kTile * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD;
    const int64_t i = row0 + r;
    dst[r * LD + d] = i < seq ? Load(src[((b * seq + i) * heads + head) * HD + d]) : 0.0f;
  }
}

// Where a block that owns one query tile works (grid: x = query tile, y =
// batch b * q_heads + query head h): the thread's lane and warp, the kv head
// of h, the tile's first query i0, the score scale and sequence b's document
// ids (seg; nullptr, and segmented false, without packing segments). The
// forward and dQ kernels unpack it with a structured binding.
struct QueryTileBlock {
  int lane, warp;
  int64_t b, h, kvh, i0, seq;
  float scale;
  bool segmented;
  const int32_t* seg;
};

__device__ __forceinline__ QueryTileBlock QueryTile(const AttentionShape& s, const int32_t* segments) {
  const int64_t b = blockIdx.y / s.q_heads, h = blockIdx.y % s.q_heads;
  return {static_cast<int>(threadIdx.x % 32),
          static_cast<int>(threadIdx.x / 32),
          b,
          h,
          h / (s.q_heads / s.kv_heads),
          int64_t{blockIdx.x} * kTile,
          s.seq,
          static_cast<float>(s.scale),
          segments != nullptr,
          segments != nullptr ? segments + b * s.seq : nullptr};
}

// Key j is visible to query i: causal, inside the sequence, same document.
__device__ __forceinline__ bool Visible(int64_t i, int64_t j, int64_t seq, int32_t seg_i, int32_t seg_j,
                                        bool segmented) {
  return i < seq && j <= i && (!segmented || seg_i == seg_j);
}

// The tensor-core kernels take these calls (ops.h's AttentionMath): bf16
// storage or kBf16 math, with every tensor 16-byte aligned. They load bf16 or
// fp32 (rounding it to bf16), never fp16: fp16 storage runs the fp32-math
// kernels (TensorCoreStorage).
template <typename T>
constexpr bool TensorCoreStorage() {
  return std::is_same_v<T, bf16> || std::is_same_v<T, float>;
}
template <typename T>
bool UseTensorCores(AttentionMath math, std::initializer_list<const void*> tensors) {
  if (!TensorCoreStorage<T>()) return false;
  if (!std::is_same_v<T, bf16> && math != AttentionMath::kBf16) return false;
  for (const void* p : tensors) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// attention_tc_forward.cu / attention_tc_backward.cu, for shapes
// AttentionForward / AttentionBackward accepted (head_dim 64 or 128).
// delta: D_i = dout_i · out_i per query ([batch, Hq, seq]). q, k, v, out in
// T, dout and the gradients in P (TensorCoreStorage both).
template <typename T>
Status TcAttentionForward(const AttentionShape& s, const T* q, const T* k, const T* v,
                          const int32_t* segments, T* out, float* lse, cudaStream_t stream);
template <typename T, typename P>
Status TcAttentionBackward(const AttentionShape& s, const T* q, const T* k, const T* v,
                           const int32_t* segments, const float* lse, const P* dout, const float* delta,
                           P* dq, P* dk, P* dv, cudaStream_t stream);

}  // namespace ft::cuda::internal
