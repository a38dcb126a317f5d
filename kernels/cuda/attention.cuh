// Internal to kernels/cuda: what the flash-attention forward and backward
// kernels share (tile sizes, tile loads, the visibility rule, soft-capping).
//
// Tiling: a block of kWarps = 4 warps works on one (batch, head): a tile of
// its own rows (queries in the forward and dQ kernels, keys in the dK/dV
// kernel) against tiles of kTile = 32 columns (keys, or queries in the dK/dV
// kernel): lane l of every warp stands for column l. Each warp owns
// ROWS / kWarps of the block's rows: ROWS = kTile in the forward, and
// BackwardRows<HD>() in the backward (16 at head dim 256, so that four fp32
// tiles of 256 dims fit kMaxSmemPerBlock). Tiles are staged in shared memory
// as fp32. A tile read by lane l along its own row is padded to HD + 1 floats
// per row, so the 32 lanes' addresses l * (HD + 1) + d fall in 32 different
// banks; tiles read with one address per warp (broadcast) or along d are
// unpadded.
//
// Index arithmetic of the [batch * seq, heads * HD] tensors: element d of
// head h of token i of sequence b is at ((b * seq + i) * heads + h) * HD + d.
//
// Visibility (cpu::AttentionShape): key j is visible to the query at position
// pos (query i stands at i + past with a KV cache) when j <= pos, pos - j <
// window (window > 0), and both are in the same document (segments). The
// kernels skip whole tiles outside the window (FirstKeyTile, QueryEnd), so a
// sliding window costs O(seq * window).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/limits.h"
#include "kernels/cuda/ops.h"

namespace ft::cuda::internal {

constexpr int kTile = 32;
constexpr int kWarps = 4;
constexpr int kAttentionThreads = kWarps * 32;
constexpr int kRowsPerWarp = kTile / kWarps;  // the forward's

// Rows of the backward kernels' own tiles (keys in dK/dV, queries in dQ):
// at head dim 256 four fp32 tiles of 32 rows (128 KiB) exceed
// kMaxSmemPerBlock, so the block owns 16 rows there (4 a warp).
template <int HD>
__host__ __device__ constexpr int BackwardRows() {
  return HD <= 128 ? kTile : kTile / 2;
}

__device__ __forceinline__ float NegInf() { return -__int_as_float(0x7f800000); }

// Rows [row0, row0 + ROWS) of head `head` into dst[ROWS][LD] (fp32); rows
// past the sequence are zero.
template <int HD, int LD, int ROWS = kTile, typename T>
__device__ void LoadTile(float* dst, const T* src, int64_t b, int64_t row0, int64_t seq, int64_t heads,
                         int64_t head) {
  for (int idx = threadIdx.x; idx < ROWS * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD;
    const int64_t i = row0 + r;
    dst[r * LD + d] = i < seq ? Load(src[((b * seq + i) * heads + head) * HD + d]) : 0.0f;
  }
}

// Where a block that owns one query tile of ROWS queries works (grid: x =
// query tile, y = batch b * q_heads + query head h): the thread's lane and
// warp, the kv head of h, the tile's first query i0, the score scale and
// sequence b's document ids (seg; nullptr, and segmented false, without
// packing segments). The forward and dQ kernels unpack it with a structured
// binding.
struct QueryTileBlock {
  int lane, warp;
  int64_t b, h, kvh, i0, seq;
  float scale;
  bool segmented;
  const int32_t* seg;
};

template <int ROWS = kTile>
__device__ __forceinline__ QueryTileBlock QueryTile(const AttentionShape& s, const int32_t* segments) {
  const int64_t b = blockIdx.y / s.q_heads, h = blockIdx.y % s.q_heads;
  return {static_cast<int>(threadIdx.x % 32),
          static_cast<int>(threadIdx.x / 32),
          b,
          h,
          h / (s.q_heads / s.kv_heads),
          int64_t{blockIdx.x} * ROWS,
          s.seq,
          static_cast<float>(s.scale),
          segments != nullptr,
          segments != nullptr ? segments + b * s.seq : nullptr};
}

// Key j is visible to the query at position pos: causal, inside the keys
// (pos < keys: the query is inside the sequence), inside the window (0 =
// none), same document.
__device__ __forceinline__ bool Visible(int64_t pos, int64_t j, int64_t keys, int64_t window, int32_t seg_i,
                                        int32_t seg_j, bool segmented) {
  return pos < keys && j <= pos && (window == 0 || pos - j < window) && (!segmented || seg_i == seg_j);
}

// The first key of the key tiles (of `tile` keys, starting at multiples of
// `tile`) a query tile whose first query stands at position pos0 must visit:
// the tile holding its window's first key (0 without a window). Later queries
// of the tile see no earlier key either (their windows start later).
__device__ __forceinline__ int64_t FirstKeyTile(int64_t pos0, int64_t window, int tile) {
  return window > 0 && pos0 - window + 1 > 0 ? (pos0 - window + 1) / tile * tile : 0;
}

// One past the last query (past = 0: the backward) that sees a key of the
// tile ending at key j_last: query i sees key j only when i - j < window.
__device__ __forceinline__ int64_t QueryEnd(int64_t j_last, int64_t seq, int64_t window) {
  return window > 0 ? min(seq, j_last + window) : seq;
}

// Gemma 2's soft-capping of the scaled scores (AttentionShape::softcap):
// x -> cap tanh(x / cap), whose slope is 1 - tanh^2; cap = 0: none (x, slope 1).
struct ScoreCap {
  float cap, inv_cap;
  __device__ __forceinline__ bool on() const { return cap > 0.0f; }
  __device__ __forceinline__ float Apply(float x, float& slope) const {
    if (!on()) {
      slope = 1.0f;
      return x;
    }
    const float t = tanhf(x * inv_cap);
    slope = 1.0f - t * t;
    return cap * t;
  }
};
__device__ __forceinline__ ScoreCap MakeScoreCap(const AttentionShape& s) {
  return {static_cast<float>(s.softcap), s.softcap > 0 ? static_cast<float>(1.0 / s.softcap) : 0.0f};
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
// AttentionForward / AttentionBackward accepted (head_dim 64, 128 or 256).
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
