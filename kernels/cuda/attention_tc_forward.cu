// Flash attention forward on tensor cores (FlashAttention-2's forward with
// mma.sync, attention_tc.cuh): bf16 Q, K, V and P operands, fp32 scores,
// softmax state and output accumulation.
//
// Block (query tile of kBlockM = 64 rows, batch b, query head h), 4 warps of
// 16 query rows each; the warp keeps its Q fragments in registers for the
// whole key loop. Per key tile of kBlockN = 64 keys (K and V staged in
// shared memory as bf16):
//   S = Q K^T (fp32), scaled by scale * log2(e), masked to -inf where the key
//   is not visible (only on tiles that straddle the diagonal, the sequence's
//   end or documents);
//   m' = max(m, rowmax S), corr = 2^(m - m'), P = 2^(S - m'),
//   l = l corr + rowsum P, O = O corr + bf16(P) V.
// Each row lives in one quad (4 lanes, attention_tc.cuh), so the row max and
// sum are two shuffles. At the end O / l and lse = (m + log2 l) ln 2; a row
// that saw no key (past the sequence) stores nothing. Query tiles are issued
// last-first: under the causal mask the last tiles have the most keys.
// With a KV cache (kv_seq > seq) query i stands at position i + past.
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/cuda_check.h"

namespace ft::cuda::internal {
namespace {

using namespace tc;  // NOLINT: the kernel vocabulary of attention_tc.cuh

constexpr int kBlockM = kTcWarps * kWarpRows;
constexpr int kBlockN = 64;

template <int HD>
constexpr int ForwardSmemBytes() {
  return (kBlockM + 2 * kBlockN) * TileLd<HD>() * 2;  // Q, K, V (bf16)
}

template <typename T, int HD>
__global__ void __launch_bounds__(kTcThreads)
    TcForwardKernel(AttentionShape s, const T* q, const T* k, const T* v, const int32_t* segments, T* out,
                    float* lse) {
  constexpr int kKSteps = HD / 16, kScoreTiles = kBlockN / 8, kOutTiles = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kBlockM * TileLd<HD>();
  bf16* Vs = Ks + kBlockN * TileLd<HD>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.y / s.q_heads, h = blockIdx.y % s.q_heads, kvh = h / (s.q_heads / s.kv_heads);
  const int64_t seq = s.seq, keys = s.kv_seq > 0 ? s.kv_seq : seq, past = keys - seq;
  const int64_t i0 = int64_t{gridDim.x - 1 - blockIdx.x} * kBlockM;
  const bool segmented = segments != nullptr;
  const int32_t* seg = segmented ? segments + b * seq : nullptr;
  const float c = static_cast<float>(s.scale) * kLog2e;

  LoadTileBf16<HD, kBlockM>(Qs, q, b, i0, seq, s.q_heads, h);
  __syncthreads();
  uint32_t qf[kKSteps][4];
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) LoadA<HD>(qf[kk], Qs, warp * kWarpRows, kk * 16, lane);

  int64_t row[2];
  int32_t seg_r[2];
  float m[2], l[2], o[kOutTiles][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = i0 + warp * kWarpRows + g + 8 * r;
    seg_r[r] = segmented && row[r] < seq ? seg[row[r]] : 0;
    m[r] = -Inf();
    l[r] = 0.0f;
  }
#pragma unroll
  for (int dt = 0; dt < kOutTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

  const int64_t key_end = min(keys, i0 + kBlockM + past);  // causal: no key past the tile's last query
  for (int64_t j0 = 0; j0 < key_end; j0 += kBlockN) {
    __syncthreads();  // the previous tile's K and V are no longer read
    LoadTileBf16<HD, kBlockN>(Ks, k, b, j0, keys, s.kv_heads, kvh);
    LoadTileBf16<HD, kBlockN>(Vs, v, b, j0, keys, s.kv_heads, kvh);
    __syncthreads();

    float sc[kScoreTiles][4];
#pragma unroll
    for (int nt = 0; nt < kScoreTiles; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < kScoreTiles / 2; ++np) {
        uint32_t bf[4];
        LoadBRows<HD>(bf, Ks, np * 16, kk * 16, lane);
        Mma(sc[2 * np], qf[kk], bf[0], bf[1]);
        Mma(sc[2 * np + 1], qf[kk], bf[2], bf[3]);
      }
    }

    // Scale and mask; every key of the tile is visible to every row when the
    // tile ends at or before the first row's position and inside the keys.
    const bool full = !segmented && j0 + kBlockN - 1 <= i0 + past && j0 + kBlockN <= keys;
    float mx[2] = {-Inf(), -Inf()};
#pragma unroll
    for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        float x = sc[nt][e] * c;
        if (!full) {
          const int64_t j = j0 + nt * 8 + 2 * t + e % 2;
          const bool visible = row[r] < seq && j <= row[r] + past && (!segmented || seg[j] == seg_r[r]);
          if (!visible) x = -Inf();
        }
        sc[nt][e] = x;
        mx[r] = fmaxf(mx[r], x);
      }
    }
    float m_use[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float new_m = fmaxf(m[r], QuadMax(mx[r]));
      m_use[r] = new_m == -Inf() ? 0.0f : new_m;  // nothing visible yet: P = 0, no NaN
      corr[r] = exp2f(m[r] - m_use[r]);           // 0 on the first visible tile
      m[r] = new_m;
    }
    float rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[nt][e] = exp2f(sc[nt][e] - m_use[e / 2]);
        rowsum[e / 2] += sc[nt][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + rowsum[r];  // the quad's partial sums
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt) {
      o[dt][0] *= corr[0];
      o[dt][1] *= corr[0];
      o[dt][2] *= corr[1];
      o[dt][3] *= corr[1];
    }

    AccTimesTile<HD, kBlockN>(o, sc, Vs, lane);  // O += P V
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = QuadSum(l[r]);  // every lane shuffles, before any leaves
    if (row[r] >= seq) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* orow = out + ((b * seq + row[r]) * s.q_heads + h) * HD;
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt)
      Store2(orow + dt * 8 + 2 * t, o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (t == 0) lse[(b * s.q_heads + h) * seq + row[r]] = sum > 0.0f ? (m[r] + log2f(sum)) * kLn2 : NegInf();
  }
}

template <typename T, int HD>
Status Launch(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments, T* out,
              float* lse, cudaStream_t stream) {
  constexpr int kSmem = ForwardSmemBytes<HD>();
  FT_RETURN_IF_ERROR(CudaStatus(
      cudaFuncSetAttribute(TcForwardKernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
      "cudaFuncSetAttribute(TcForwardKernel)"));
  const dim3 grid(static_cast<unsigned>((s.seq + kBlockM - 1) / kBlockM),
                  static_cast<unsigned>(s.batch * s.q_heads));
  TcForwardKernel<T, HD><<<grid, kTcThreads, kSmem, stream>>>(s, q, k, v, segments, out, lse);
  return LaunchStatus("TcForwardKernel");
}

}  // namespace

template <typename T>
Status TcAttentionForward(const AttentionShape& s, const T* q, const T* k, const T* v,
                          const int32_t* segments, T* out, float* lse, cudaStream_t stream) {
  if (s.head_dim == 64) return Launch<T, 64>(s, q, k, v, segments, out, lse, stream);
  FT_CHECK(s.head_dim == 128);
  return Launch<T, 128>(s, q, k, v, segments, out, lse, stream);
}

template Status TcAttentionForward<float>(const AttentionShape&, const float*, const float*, const float*,
                                          const int32_t*, float*, float*, cudaStream_t);
template Status TcAttentionForward<bf16>(const AttentionShape&, const bf16*, const bf16*, const bf16*,
                                         const int32_t*, bf16*, float*, cudaStream_t);

}  // namespace ft::cuda::internal
