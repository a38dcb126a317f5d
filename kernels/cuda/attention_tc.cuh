// Internal to kernels/cuda: the tensor-core vocabulary of the bf16 flash
// attention kernels (attention_tc_forward.cu, attention_tc_backward.cu):
// FlashAttention-2's scheme on mma.sync.m16n8k16 (bf16 operands, fp32
// accumulation; sm_80 and later).
//
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane = 4 g + t:
//   A (16 x 16, row-major): a[0] = A[g][2t..2t+1],   a[1] = A[g+8][2t..],
//                           a[2] = A[g][2t+8..],     a[3] = A[g+8][2t+8..]
//   B (16 x 8, k x n):      b[0] = B[2t..2t+1][g],   b[1] = B[2t+8..][g]
//   C (16 x 8, fp32):       c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..]
// Two C tiles side by side (columns 0-7 and 8-15) are, packed to bf16, the A
// fragment of the next product over those 16 columns (AccToA): the
// probabilities never leave registers.
//
// Tiles live in shared memory as bf16 rows of HD elements with a row stride
// of HD + 8 (TileLd): the 8 row addresses of one ldmatrix land in 8 distinct
// 16-byte bank groups. Operand loads are ldmatrix.x4: LoadA (A from a
// row-major tile), LoadBRows (B = T^T, i.e. the tile's rows are B's columns:
// K for Q K^T) and LoadBCols (B = the tile itself, rows along k: V for P V),
// the last two giving the fragments of two adjacent n-tiles; AccTimesTile is
// the product acc += P x tile with P in registers (P V, P^T dO, dS^T Q, dS K).
//
// Global tiles: element d of head h of token i of sequence b at
// ((b * rows + i) * heads + h) * HD + d (attention.cuh); LoadTileBf16 reads
// 8 elements (16 or 32 bytes) per access, so the kernels need 16-byte
// aligned tensors (the launchers check and fall back to the fp32 kernels).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/device_math.cuh"

namespace ft::cuda::internal::tc {

using bf16 = __nv_bfloat16;

constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kWarpRows = 16;  // rows of the block's tile each warp owns (the mma's M)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int HD>
__host__ __device__ constexpr int TileLd() {
  return HD + 8;
}

__device__ __forceinline__ float Inf() { return __int_as_float(0x7f800000); }

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p)));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p)));
}

// d += a b (m16n8k16, bf16 x bf16 -> fp32).
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A = tile[row0 .. row0 + 15][k0 .. k0 + 15].
template <int HD>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const bf16* tile, int row0, int k0, int lane) {
  LdMatrixX4(a, tile + (row0 + lane % 16) * TileLd<HD>() + k0 + (lane / 16) * 8);
}

// B[k][n] = tile[n0 + n][k0 + k] for the n-tiles n0 (b[0], b[1]) and n0 + 8 (b[2], b[3]).
template <int HD>
__device__ __forceinline__ void LoadBRows(uint32_t (&b)[4], const bf16* tile, int n0, int k0, int lane) {
  LdMatrixX4(b, tile + (n0 + lane % 8 + (lane / 16) * 8) * TileLd<HD>() + k0 + ((lane / 8) % 2) * 8);
}

// B[k][n] = tile[k0 + k][n0 + n] for the n-tiles n0 (b[0], b[1]) and n0 + 8 (b[2], b[3]).
template <int HD>
__device__ __forceinline__ void LoadBCols(uint32_t (&b)[4], const bf16* tile, int k0, int n0, int lane) {
  LdMatrixX4Trans(b, tile + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * TileLd<HD>() + n0 + (lane / 16) * 8);
}

// The A fragment over the 16 columns of accumulator tiles c0 (columns 0-7) and c1 (8-15).
__device__ __forceinline__ void AccToA(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = PackBf16(c0[0], c0[1]);
  a[1] = PackBf16(c0[2], c0[3]);
  a[2] = PackBf16(c1[0], c1[1]);
  a[3] = PackBf16(c1[2], c1[3]);
}

// acc[COLS / 8] += P (16 x N, accumulator tiles in registers) x tile (N rows
// of HD columns, of which columns col0 .. col0 + COLS - 1).
template <int HD, int N, int COLS = HD>
__device__ __forceinline__ void AccTimesTile(float (&acc)[COLS / 8][4], const float (&p)[N / 8][4],
                                             const bf16* tile, int lane, int col0 = 0) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t a[4];
    AccToA(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int dp = 0; dp < COLS / 16; ++dp) {
      uint32_t bf[4];
      LoadBCols<HD>(bf, tile, kk * 16, col0 + dp * 16, lane);
      Mma(acc[2 * dp], a, bf[0], bf[1]);
      Mma(acc[2 * dp + 1], a, bf[2], bf[3]);
    }
  }
}

// 8 consecutive elements as bf16 (16-byte aligned source).
__device__ __forceinline__ uint4 Load8(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint4 Load8(const float* p) {
  const float4 lo = reinterpret_cast<const float4*>(p)[0], hi = reinterpret_cast<const float4*>(p)[1];
  return make_uint4(PackBf16(lo.x, lo.y), PackBf16(lo.z, lo.w), PackBf16(hi.x, hi.y), PackBf16(hi.z, hi.w));
}

// Rows [row0, row0 + ROWS) of head `head` into dst[ROWS][TileLd] as bf16;
// rows at or past `rows` (the sequence's length) are zero.
template <int HD, int ROWS, typename T>
__device__ __forceinline__ void LoadTileBf16(bf16* dst, const T* src, int64_t b, int64_t row0, int64_t rows,
                                             int64_t heads, int64_t head) {
  constexpr int kChunks = HD / 8;
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += kTcThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const int64_t i = row0 + r;
    const uint4 v = i < rows ? Load8(src + ((b * rows + i) * heads + head) * HD + c) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + r * TileLd<HD>() + c) = v;
  }
}

// Stores two adjacent elements (a C fragment's pair) of row `row`, columns d, d + 1.
__device__ __forceinline__ void Store2(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = {x, y}; }
__device__ __forceinline__ void Store2(bf16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}

// Max / sum over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace ft::cuda::internal::tc
