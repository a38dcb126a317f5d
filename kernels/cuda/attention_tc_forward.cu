// Flash attention forward on tensor cores (FlashAttention-2's forward with
// mma.sync, attention_tc.cuh): bf16 Q, K, V and P operands, fp32 scores,
// softmax state and output accumulation.
//
// Block (query tile of kBlockM = 64 rows, batch b, query head h), 4 warps of
// 16 query rows each; up to head dim 128 the warp keeps its Q fragments in
// registers for the whole key loop (at 256 they would take 64 registers a
// lane beside the output's 128, so they are read from shared memory per
// k-step). Per key tile of kBlockN = 64 keys (K and V staged in shared
// memory as bf16), from the tile holding the first row's first visible key
// (FirstKeyTile: a sliding window skips the tiles before it) to the
// diagonal:
//   S = Q K^T (fp32), scaled by scale (soft-capped: cap tanh(S / cap)) and
//   log2(e), masked to -inf where the key is not visible (only on tiles that
//   straddle the diagonal, the window's edge, the sequence's end or
//   documents);
//   m' = max(m, rowmax S), corr = 2^(m - m'), P = 2^(S - m'),
//   l = l corr + rowsum P, O = O corr + bf16(P) V.
// Each row lives in one quad (4 lanes, attention_tc.cuh), so the row max and
// sum are two shuffles. At the end O / l and lse = (m + log2 l) ln 2; a row
// that saw no key (past the sequence) stores nothing. Query tiles are issued
// last-first: under the causal mask the last tiles have the most keys.
// With a KV cache (kv_seq > seq) query i stands at position i + past.
// Shared memory: (64 + 2 * 64) rows of HD + 8 bf16, 99 KiB at head dim 256.
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/limits.h"

namespace ft::cuda::internal {
namespace {

using namespace tc;  // NOLINT: the kernel vocabulary of attention_tc.cuh

constexpr int kBlockM = kTcWarps * kWarpRows;
constexpr int kBlockN = 64;

template <int HD>
constexpr int ForwardSmemBytes() {
  return (kBlockM + 2 * kBlockN) * TileLd<HD>() * 2;  // Q, K, V (bf16)
}

// Where a warp's two accumulator rows (g and g + 8 of its 16) stand and what
// they may see: positions pos[r] (query row[r] + past), their documents.
struct WarpRows {
  int64_t row[2], pos[2];
  int32_t seg[2];
};

// The scores of one key tile (keys j0..) in log2 units, in place: sc = q·k
// becomes scale * q·k, soft-capped, times log2(e), or -inf where not visible;
// mx[r] = row r's max over this lane's entries. `full`: every key of the tile
// is visible to every row (no mask to apply). seg: the sequence's documents
// (nullptr: none).
__device__ __forceinline__ void ScoreTile(float (&sc)[kBlockN / 8][4], float (&mx)[2], const WarpRows& w,
                                          int64_t j0, bool full, const AttentionShape& s, const int32_t* seg,
                                          int t) {
  const float scale = static_cast<float>(s.scale), c = scale * kLog2e;
  const ScoreCap cap = MakeScoreCap(s);
  const int64_t keys = s.kv_seq > 0 ? s.kv_seq : s.seq;
  const bool segmented = seg != nullptr;
  mx[0] = mx[1] = -Inf();
#pragma unroll
  for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      float slope;  // unused forward
      float x = cap.on() ? cap.Apply(sc[nt][e] * scale, slope) * kLog2e : sc[nt][e] * c;
      if (!full) {
        const int64_t j = j0 + nt * 8 + 2 * t + e % 2;
        const int32_t seg_j = segmented && j < keys ? seg[j] : 0;  // segments: keys = seq
        if (!Visible(w.pos[r], j, keys, s.window, w.seg[r], seg_j, segmented)) x = -Inf();
      }
      sc[nt][e] = x;
      mx[r] = fmaxf(mx[r], x);
    }
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(kTcThreads)
    TcForwardKernel(AttentionShape s, const T* q, const T* k, const T* v, const int32_t* segments, T* out,
                    float* lse) {
  constexpr int kKSteps = HD / 16, kScoreTiles = kBlockN / 8, kOutTiles = HD / 8;
  constexpr bool kQInRegisters = HD <= 128;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kBlockM * TileLd<HD>();
  bf16* Vs = Ks + kBlockN * TileLd<HD>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.y / s.q_heads, h = blockIdx.y % s.q_heads, kvh = h / (s.q_heads / s.kv_heads);
  const int64_t seq = s.seq, keys = s.kv_seq > 0 ? s.kv_seq : seq, past = keys - seq, window = s.window;
  const int64_t i0 = int64_t{gridDim.x - 1 - blockIdx.x} * kBlockM;
  const bool segmented = segments != nullptr;
  const int32_t* seg = segmented ? segments + b * seq : nullptr;

  LoadTileBf16<HD, kBlockM>(Qs, q, b, i0, seq, s.q_heads, h);
  __syncthreads();
  uint32_t qf[kQInRegisters ? kKSteps : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) LoadA<HD>(qf[kk], Qs, warp * kWarpRows, kk * 16, lane);
  }

  WarpRows w;
  float m[2], l[2], o[kOutTiles][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    w.row[r] = i0 + warp * kWarpRows + g + 8 * r;
    w.pos[r] = w.row[r] + past;
    w.seg[r] = segmented && w.row[r] < seq ? seg[w.row[r]] : 0;
    m[r] = -Inf();
    l[r] = 0.0f;
  }
#pragma unroll
  for (int dt = 0; dt < kOutTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

  const int64_t key_end = min(keys, i0 + kBlockM + past);  // causal: no key past the tile's last query
  for (int64_t j0 = FirstKeyTile(i0 + past, window, kBlockN); j0 < key_end; j0 += kBlockN) {
    __syncthreads();  // the previous tile's K and V are no longer read
    LoadTileBf16<HD, kBlockN>(Ks, k, b, j0, keys, s.kv_heads, kvh);
    LoadTileBf16<HD, kBlockN>(Vs, v, b, j0, keys, s.kv_heads, kvh);
    __syncthreads();

    float sc[kScoreTiles][4];
#pragma unroll
    for (int nt = 0; nt < kScoreTiles; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t qa[4];
      if constexpr (kQInRegisters) {
#pragma unroll
        for (int x = 0; x < 4; ++x) qa[x] = qf[kk][x];
      } else {
        LoadA<HD>(qa, Qs, warp * kWarpRows, kk * 16, lane);
      }
#pragma unroll
      for (int np = 0; np < kScoreTiles / 2; ++np) {
        uint32_t bf[4];
        LoadBRows<HD>(bf, Ks, np * 16, kk * 16, lane);
        Mma(sc[2 * np], qa, bf[0], bf[1]);
        Mma(sc[2 * np + 1], qa, bf[2], bf[3]);
      }
    }

    // Every key of the tile is visible to every row when the tile ends at or
    // before the first row's position, inside the keys, and (window) the
    // last row's window reaches back to the tile's first key.
    const bool full = !segmented && j0 + kBlockN - 1 <= i0 + past && j0 + kBlockN <= keys &&
                      (window == 0 || i0 + kBlockM - 1 + past - j0 < window);
    float mx[2];
    ScoreTile(sc, mx, w, j0, full, s, seg, t);
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
    if (w.row[r] >= seq) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* orow = out + ((b * seq + w.row[r]) * s.q_heads + h) * HD;
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt)
      Store2(orow + dt * 8 + 2 * t, o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (t == 0)
      lse[(b * s.q_heads + h) * seq + w.row[r]] = sum > 0.0f ? (m[r] + log2f(sum)) * kLn2 : NegInf();
  }
}

template <typename T, int HD>
Status Launch(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments, T* out,
              float* lse, cudaStream_t stream) {
  constexpr int kSmem = ForwardSmemBytes<HD>();
  static_assert(kSmem <= kMaxSmemPerBlock);
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
  switch (s.head_dim) {
    case 64: return Launch<T, 64>(s, q, k, v, segments, out, lse, stream);
    case 128: return Launch<T, 128>(s, q, k, v, segments, out, lse, stream);
    default: FT_CHECK(s.head_dim == 256); return Launch<T, 256>(s, q, k, v, segments, out, lse, stream);
  }
}

template Status TcAttentionForward<float>(const AttentionShape&, const float*, const float*, const float*,
                                          const int32_t*, float*, float*, cudaStream_t);
template Status TcAttentionForward<bf16>(const AttentionShape&, const bf16*, const bf16*, const bf16*,
                                         const int32_t*, bf16*, float*, cudaStream_t);

}  // namespace ft::cuda::internal
