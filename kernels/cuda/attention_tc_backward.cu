// Flash attention backward on tensor cores (FlashAttention-2's gradients with
// mma.sync, attention_tc.cuh), deterministic and without atomics: like the
// fp32 kernels (attention_backward.cu), dK/dV and dQ come from two kernels
// that each recompute P from the saved lse. bf16 operands (Q, K, V, dO, P,
// dS), fp32 accumulation; D_i = dout_i · out_i comes precomputed (`delta`).
//
//   S_ij  = scale q_i·k_j, soft-capped (cap tanh(S / cap)) with a cap
//   P_ij  = 2^(S_ij log2(e) - lse_i log2(e)) where j is visible to i
//   dS_ij = P_ij (dout_i · v_j - D_i) (1 - (S_ij / cap)^2)   (the cap's slope; 1 without)
//   dV_j  = Σ_i P_ij dout_i,  dK_j = scale Σ_i dS_ij q_i  (TcDkDvKernel)
//   dQ_i  = scale Σ_j dS_ij k_j                           (TcDqKernel)
// TcDkDvKernel: block (64 keys, batch b, kv head, column part z), 4 warps of
// 16 keys. It walks the kv head's query heads in order and, for each, the
// query tiles (kInner rows) from the key tile on (causal) up to the last
// query whose window reaches the tile (QueryEnd), computing the transposed
// products S^T = K Q^T and dP^T = V dO^T, so P^T and dS^T are A fragments of
// dV += P^T dO and dK += dS^T Q. TcDqKernel: block (64 queries, b, query
// head), 4 warps of 16 queries, key tiles of kInner rows from the first
// row's window (FirstKeyTile) to the diagonal: S = Q K^T, dP = dO V^T,
// dQ += dS K. Every gradient element is accumulated by one lane in a fixed
// order, so results are bit-identical run to run.
//
// Head dim 256: a warp's dK and dV accumulators over 256 columns would take
// 256 registers a lane, so the dK/dV grid has two column parts (z), each
// accumulating 128 of the columns (kOutCols) of dK and dV; both recompute
// S^T and dP^T over all 256 (1.5x the kernel's products). The dQ kernel
// keeps its one accumulator (128 registers). kInner is 16 there, so the
// shared memory, 2 x 64 + 2 x 16 rows of 264 bf16, is 83 KiB.
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/limits.h"

namespace ft::cuda::internal {
namespace {

using namespace tc;  // NOLINT: the kernel vocabulary of attention_tc.cuh

constexpr int kBlock = kTcWarps * kWarpRows;  // keys (dK/dV) or queries (dQ) of a block
// Rows of the inner loop's tiles: fewer at head dim 128, where the two
// HD-wide accumulators already take 128 registers a lane, and fewer again
// at 256, so that the tiles fit kMaxSmemPerBlock.
template <int HD>
__host__ __device__ constexpr int Inner() {
  return HD == 64 ? 64 : HD == 128 ? 32 : 16;
}
// Columns of dK and dV one TcDkDvKernel block accumulates (see above).
template <int HD>
__host__ __device__ constexpr int OutCols() {
  return HD <= 128 ? HD : 128;
}

template <int HD>
constexpr int BackwardSmemBytes() {
  return 2 * (kBlock + Inner<HD>()) * TileLd<HD>() * 2 + 2 * Inner<HD>() * 4;
}

// acc[n-tiles] += A (16 rows of `tile_a`) x B^T (kInner rows of `tile_b`) over HD.
template <int HD, int N>
__device__ __forceinline__ void RowsTimesRows(float (&acc)[N / 8][4], const bf16* tile_a, int row0,
                                              const bf16* tile_b, int lane) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t a[4];
    LoadA<HD>(a, tile_a, row0, kk * 16, lane);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t bf[4];
      LoadBRows<HD>(bf, tile_b, np * 16, kk * 16, lane);
      Mma(acc[2 * np], a, bf[0], bf[1]);
      Mma(acc[2 * np + 1], a, bf[2], bf[3]);
    }
  }
}

// Writes scale * acc (rows row0 + g, row0 + g + 8 of the warp; columns
// col0 .. col0 + COLS - 1) to dst rows below `rows`, head `head` of `heads`.
template <typename T, int HD, int COLS = HD>
__device__ __forceinline__ void StoreRows(T* dst, const float (&acc)[COLS / 8][4], float scale, int64_t b,
                                          int64_t row0, int64_t rows, int64_t heads, int64_t head, int lane,
                                          int col0 = 0) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row0 + g + 8 * r;
    if (i >= rows) continue;
    T* p = dst + ((b * rows + i) * heads + head) * HD + col0 + 2 * t;
#pragma unroll
    for (int dt = 0; dt < COLS / 8; ++dt)
      Store2(p + dt * 8, scale * acc[dt][2 * r], scale * acc[dt][2 * r + 1]);
  }
}

// P and dS of one score entry: s = the raw product q·k, dp = dout · v; lse2
// = lse log2(e) (+inf for a row that saw no key: P = 0).
__device__ __forceinline__ void ProbAndGrad(float& p, float& ds, float s, float dp, bool visible, float lse2,
                                            float delta, float scale, const ScoreCap& cap) {
  float slope = 1.0f;
  const float x = cap.on() ? cap.Apply(s * scale, slope) * kLog2e : s * (scale * kLog2e);
  p = visible ? exp2f(x - lse2) : 0.0f;
  ds = p * (dp - delta) * slope;
}

template <typename T, typename P, int HD>
__global__ void __launch_bounds__(kTcThreads)
    TcDkDvKernel(AttentionShape s, const T* q, const T* k, const T* v, const int32_t* segments,
                 const float* lse, const P* dout, const float* delta, P* dk, P* dv) {
  constexpr int kInner = Inner<HD>(), kTiles = kInner / 8, kOutCols = OutCols<HD>();
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kBlock * TileLd<HD>();
  bf16* Qs = Vs + kBlock * TileLd<HD>();
  bf16* dOs = Qs + kInner * TileLd<HD>();
  float* lse2_s = reinterpret_cast<float*>(dOs + kInner * TileLd<HD>());
  float* delta_s = lse2_s + kInner;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.y / s.kv_heads, kvh = blockIdx.y % s.kv_heads;
  const int64_t group = s.q_heads / s.kv_heads, seq = s.seq, window = s.window;
  const int64_t j0 = int64_t{blockIdx.x} * kBlock, wj = j0 + warp * kWarpRows;
  const int col0 = static_cast<int>(blockIdx.z) * kOutCols;
  const bool segmented = segments != nullptr;
  const int32_t* seg = segmented ? segments + b * seq : nullptr;
  const float scale = static_cast<float>(s.scale);
  const ScoreCap cap = MakeScoreCap(s);

  LoadTileBf16<HD, kBlock>(Ks, k, b, j0, seq, s.kv_heads, kvh);
  LoadTileBf16<HD, kBlock>(Vs, v, b, j0, seq, s.kv_heads, kvh);
  int32_t seg_j[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) seg_j[r] = segmented && wj + g + 8 * r < seq ? seg[wj + g + 8 * r] : 0;
  float dk_acc[kOutCols / 8][4], dv_acc[kOutCols / 8][4];
#pragma unroll
  for (int dt = 0; dt < kOutCols / 8; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[dt][e] = dv_acc[dt][e] = 0.0f;
  }

  // Causal: earlier queries see none of these keys; windowed: nor queries at or past query_end.
  const int64_t query_end = QueryEnd(j0 + kBlock - 1, seq, window);
  for (int64_t qh = kvh * group; qh < (kvh + 1) * group; ++qh) {
    for (int64_t i0 = j0; i0 < query_end; i0 += kInner) {
      __syncthreads();  // the previous query tile is no longer read
      LoadTileBf16<HD, kInner>(Qs, q, b, i0, seq, s.q_heads, qh);
      LoadTileBf16<HD, kInner>(dOs, dout, b, i0, seq, s.q_heads, qh);
      for (int r = threadIdx.x; r < kInner; r += kTcThreads) {
        const int64_t i = i0 + r;
        const float row_lse = i < seq ? lse[(b * s.q_heads + qh) * seq + i] : NegInf();
        lse2_s[r] = row_lse == NegInf() ? Inf() : row_lse * kLog2e;  // +inf: P = 0 for a row without keys
        delta_s[r] = i < seq ? delta[(b * s.q_heads + qh) * seq + i] : 0.0f;
      }
      __syncthreads();

      float p[kTiles][4], ds[kTiles][4];
      RowsTimesRows<HD, kInner>(p, Ks, warp * kWarpRows, Qs, lane);    // S^T
      RowsTimesRows<HD, kInner>(ds, Vs, warp * kWarpRows, dOs, lane);  // dP^T
      // Every query of the tile sees every key of the block: past the block's
      // last key, inside the sequence and (window) its last query's window
      // reaching back to the block's first key.
      const bool full = !segmented && i0 >= j0 + kBlock - 1 && i0 + kInner <= seq &&
                        (window == 0 || i0 + kInner - 1 - j0 < window);
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nt * 8 + 2 * t + e % 2;
          const int64_t i = i0 + col, j = wj + g + 8 * (e / 2);
          const bool visible =
              full || Visible(i, j, seq, window, segmented && i < seq ? seg[i] : 0, seg_j[e / 2], segmented);
          ProbAndGrad(p[nt][e], ds[nt][e], p[nt][e], ds[nt][e], visible, lse2_s[col], delta_s[col], scale,
                      cap);
        }
      }
      AccTimesTile<HD, kInner, kOutCols>(dv_acc, p, dOs, lane, col0);
      AccTimesTile<HD, kInner, kOutCols>(dk_acc, ds, Qs, lane, col0);
    }
  }
  StoreRows<P, HD, kOutCols>(dk, dk_acc, scale, b, wj, seq, s.kv_heads, kvh, lane, col0);
  StoreRows<P, HD, kOutCols>(dv, dv_acc, 1.0f, b, wj, seq, s.kv_heads, kvh, lane, col0);
}

template <typename T, typename P, int HD>
__global__ void __launch_bounds__(kTcThreads)
    TcDqKernel(AttentionShape s, const T* q, const T* k, const T* v, const int32_t* segments,
               const float* lse, const P* dout, const float* delta, P* dq) {
  constexpr int kInner = Inner<HD>(), kTiles = kInner / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* dOs = Qs + kBlock * TileLd<HD>();
  bf16* Ks = dOs + kBlock * TileLd<HD>();
  bf16* Vs = Ks + kInner * TileLd<HD>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.y / s.q_heads, h = blockIdx.y % s.q_heads, kvh = h / (s.q_heads / s.kv_heads);
  const int64_t seq = s.seq, window = s.window;
  const int64_t i0 = int64_t{gridDim.x - 1 - blockIdx.x} * kBlock, wi = i0 + warp * kWarpRows;
  const bool segmented = segments != nullptr;
  const int32_t* seg = segmented ? segments + b * seq : nullptr;
  const float scale = static_cast<float>(s.scale);
  const ScoreCap cap = MakeScoreCap(s);

  LoadTileBf16<HD, kBlock>(Qs, q, b, i0, seq, s.q_heads, h);
  LoadTileBf16<HD, kBlock>(dOs, dout, b, i0, seq, s.q_heads, h);
  float lse2[2], delta_r[2];
  int32_t seg_i[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = wi + g + 8 * r, at = (b * s.q_heads + h) * seq + i;
    const float row_lse = i < seq ? lse[at] : NegInf();
    lse2[r] = row_lse == NegInf() ? Inf() : row_lse * kLog2e;
    delta_r[r] = i < seq ? delta[at] : 0.0f;
    seg_i[r] = segmented && i < seq ? seg[i] : 0;
  }
  float dq_acc[HD / 8][4];
#pragma unroll
  for (int dt = 0; dt < HD / 8; ++dt) dq_acc[dt][0] = dq_acc[dt][1] = dq_acc[dt][2] = dq_acc[dt][3] = 0.0f;

  const int64_t key_end = min(seq, i0 + kBlock);  // causal: no key past the block's last query
  for (int64_t j0 = FirstKeyTile(i0, window, kInner); j0 < key_end; j0 += kInner) {
    __syncthreads();
    LoadTileBf16<HD, kInner>(Ks, k, b, j0, seq, s.kv_heads, kvh);
    LoadTileBf16<HD, kInner>(Vs, v, b, j0, seq, s.kv_heads, kvh);
    __syncthreads();
    float p[kTiles][4], ds[kTiles][4];
    RowsTimesRows<HD, kInner>(p, Qs, warp * kWarpRows, Ks, lane);    // S
    RowsTimesRows<HD, kInner>(ds, dOs, warp * kWarpRows, Vs, lane);  // dP
    // Every key of the tile is visible to every query of the block (as the forward's).
    const bool full = !segmented && j0 + kInner - 1 <= i0 && j0 + kInner <= seq &&
                      (window == 0 || i0 + kBlock - 1 - j0 < window);
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const int64_t i = wi + g + 8 * r, j = j0 + nt * 8 + 2 * t + e % 2;
        const bool visible =
            full || Visible(i, j, seq, window, seg_i[r], segmented && j < seq ? seg[j] : 0, segmented);
        ProbAndGrad(p[nt][e], ds[nt][e], p[nt][e], ds[nt][e], visible, lse2[r], delta_r[r], scale, cap);
      }
    }
    AccTimesTile<HD, kInner>(dq_acc, ds, Ks, lane);
  }
  StoreRows<P, HD>(dq, dq_acc, scale, b, wi, seq, s.q_heads, h, lane);
}

template <typename Kernel>
Status SetSmem(Kernel kernel, int bytes, const char* what) {
  return CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
}

template <typename T, typename P, int HD>
Status Launch(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
              const float* lse, const P* dout, const float* delta, P* dq, P* dk, P* dv, cudaStream_t stream) {
  constexpr int kSmem = BackwardSmemBytes<HD>();
  static_assert(kSmem <= kMaxSmemPerBlock);
  const unsigned tiles = static_cast<unsigned>((s.seq + kBlock - 1) / kBlock);
  const unsigned col_parts = HD / OutCols<HD>();
  FT_RETURN_IF_ERROR(SetSmem(TcDkDvKernel<T, P, HD>, kSmem, "cudaFuncSetAttribute(TcDkDvKernel)"));
  TcDkDvKernel<T, P, HD>
      <<<dim3(tiles, static_cast<unsigned>(s.batch * s.kv_heads), col_parts), kTcThreads, kSmem, stream>>>(
          s, q, k, v, segments, lse, dout, delta, dk, dv);
  FT_RETURN_IF_ERROR(LaunchStatus("TcDkDvKernel"));
  FT_RETURN_IF_ERROR(SetSmem(TcDqKernel<T, P, HD>, kSmem, "cudaFuncSetAttribute(TcDqKernel)"));
  TcDqKernel<T, P, HD>
      <<<dim3(tiles, static_cast<unsigned>(s.batch * s.q_heads)), kTcThreads, kSmem, stream>>>(
          s, q, k, v, segments, lse, dout, delta, dq);
  return LaunchStatus("TcDqKernel");
}

}  // namespace

template <typename T, typename P>
Status TcAttentionBackward(const AttentionShape& s, const T* q, const T* k, const T* v,
                           const int32_t* segments, const float* lse, const P* dout, const float* delta,
                           P* dq, P* dk, P* dv, cudaStream_t stream) {
  switch (s.head_dim) {
    case 64: return Launch<T, P, 64>(s, q, k, v, segments, lse, dout, delta, dq, dk, dv, stream);
    case 128: return Launch<T, P, 128>(s, q, k, v, segments, lse, dout, delta, dq, dk, dv, stream);
    default:
      FT_CHECK(s.head_dim == 256);
      return Launch<T, P, 256>(s, q, k, v, segments, lse, dout, delta, dq, dk, dv, stream);
  }
}

#define FT_INSTANTIATE_TC_BACKWARD(T, P)                                                                  \
  template Status TcAttentionBackward<T, P>(const AttentionShape&, const T*, const T*, const T*,          \
                                            const int32_t*, const float*, const P*, const float*, P*, P*, \
                                            P*, cudaStream_t);
FT_INSTANTIATE_TC_BACKWARD(float, float)
FT_INSTANTIATE_TC_BACKWARD(bf16, bf16)
FT_INSTANTIATE_TC_BACKWARD(bf16, float)
#undef FT_INSTANTIATE_TC_BACKWARD

}  // namespace ft::cuda::internal
