// Flash attention backward (cpu::AttentionBackward's gradients), fp32 math on
// CUDA cores, deterministic: three kernels and no atomics.
//
//   D_i   = dout_i · out_i                              (DeltaKernel, one warp per row)
//   S_ij  = scale q_i·k_j, soft-capped (cap tanh(S / cap)) with a cap
//   P_ij  = exp(S_ij - lse_i) where j is visible to i, else 0
//   dS_ij = P_ij (dout_i · v_j - D_i) (1 - (S_ij / cap)^2)   (the cap's slope; 1 without)
//   dV_j  = Σ_i P_ij dout_i,  dK_j = scale Σ_i dS_ij q_i  (DkDvKernel)
//   dQ_i  = scale Σ_j dS_ij k_j                           (DqKernel)
// DkDvKernel: block (key tile j0.. of kRows = BackwardRows<HD>() keys, batch
// b, kv head); each warp owns kRows / 4 keys and lane l stands for query
// i0 + l of the current 32-query tile; it walks the kv head's query heads in
// increasing order and, for each, the query tiles from the key tile on
// (causal) up to the last query whose window reaches the tile (QueryEnd).
// DqKernel: block (kRows queries, b, query head); each warp owns kRows / 4
// queries and lane l stands for key j0 + l, over the key tiles from the
// first row's window (FirstKeyTile) to the diagonal. Both recompute P from
// the saved lse (so dS is computed twice: the price of no atomics). Every
// dK/dV/dQ element is summed by one thread in a fixed order.
//
// Shared memory at head dim 256 (kRows = 16): DkDv 2 x 16 x 256 (K, V) +
// 2 x 32 x 257 (Q, dO) + 64 floats = 96.5 KiB; dQ the same with the roles
// swapped (no lse, delta), both within kMaxSmemPerBlock (limits.h).
#include <string>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/limits.h"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using namespace internal;  // NOLINT: the kernel vocabulary of attention.cuh

// delta[(b * Hq + h) * seq + i] = Σ_d dout · out; one warp per (token, head).
template <typename T, typename P, int HD>
__global__ void DeltaKernel(AttentionShape s, const T* out, const P* dout, float* delta) {
  const int64_t warp_id = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp_id >= s.batch * s.seq * s.q_heads) return;  // whole warps exit together
  const int64_t token = warp_id / s.q_heads, h = warp_id % s.q_heads;
  const int64_t b = token / s.seq, i = token % s.seq;
  const int64_t base = warp_id * HD;  // == (token * Hq + h) * HD
  float acc = 0.0f;
  for (int d = lane; d < HD; d += 32) acc += Load(dout[base + d]) * Load(out[base + d]);
  acc = WarpSum(acc);
  if (lane == 0) delta[(b * s.q_heads + h) * s.seq + i] = acc;
}

template <int HD>
constexpr int DkDvSmemFloats() {
  return 2 * BackwardRows<HD>() * HD + 2 * kTile * (HD + 1) + 2 * kTile;  // K, V; Q, dO (padded); lse, delta
}

template <typename T, typename P, int HD>
__global__ void __launch_bounds__(kAttentionThreads)
    DkDvKernel(AttentionShape s, const T* q, const T* k, const T* v, const int32_t* segments,
               const float* lse, const P* dout, const float* delta, P* dk, P* dv) {
  constexpr int kDimsPerLane = HD / 32, kRows = BackwardRows<HD>(), kPerWarp = kRows / kWarps;
  extern __shared__ float smem[];
  float* Ks = smem;                       // [kRows][HD]: warp reads its key's row by broadcast
  float* Vs = Ks + kRows * HD;            // [kRows][HD]
  float* Qs = Vs + kRows * HD;            // [kTile][HD + 1]: lane l reads row l, and rows along d
  float* dOs = Qs + kTile * (HD + 1);     // [kTile][HD + 1]
  float* lse_s = dOs + kTile * (HD + 1);  // [kTile]
  float* delta_s = lse_s + kTile;         // [kTile]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t b = blockIdx.y / s.kv_heads, kvh = blockIdx.y % s.kv_heads;
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t j0 = int64_t{blockIdx.x} * kRows, seq = s.seq, window = s.window;
  const float scale = static_cast<float>(s.scale);
  const ScoreCap cap = MakeScoreCap(s);
  const bool segmented = segments != nullptr;
  const int32_t* seg = segmented ? segments + b * seq : nullptr;

  LoadTile<HD, HD, kRows>(Ks, k, b, j0, seq, s.kv_heads, kvh);
  LoadTile<HD, HD, kRows>(Vs, v, b, j0, seq, s.kv_heads, kvh);
  float dk_acc[kPerWarp][kDimsPerLane], dv_acc[kPerWarp][kDimsPerLane];
  int32_t seg_j[kPerWarp];
#pragma unroll
  for (int kk = 0; kk < kPerWarp; ++kk) {
    const int64_t j = j0 + warp * kPerWarp + kk;
    seg_j[kk] = segmented && j < seq ? seg[j] : 0;
#pragma unroll
    for (int t = 0; t < kDimsPerLane; ++t) dk_acc[kk][t] = dv_acc[kk][t] = 0.0f;
  }

  // Causal: queries before the key tile see none of its keys; windowed: nor
  // queries at or past QueryEnd.
  const int64_t query_end = QueryEnd(j0 + kRows - 1, seq, window);
  for (int64_t qh = kvh * group; qh < (kvh + 1) * group; ++qh) {
    for (int64_t i0 = j0; i0 < query_end; i0 += kTile) {
      __syncthreads();  // the previous query tile is no longer read
      LoadTile<HD, HD + 1>(Qs, q, b, i0, seq, s.q_heads, qh);
      LoadTile<HD, HD + 1>(dOs, dout, b, i0, seq, s.q_heads, qh);
      if (threadIdx.x < kTile) {
        const int64_t i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < seq ? lse[(b * s.q_heads + qh) * seq + i] : NegInf();
        delta_s[threadIdx.x] = i < seq ? delta[(b * s.q_heads + qh) * seq + i] : 0.0f;
      }
      __syncthreads();
      const int64_t i = i0 + lane;
      const int32_t seg_i = segmented && i < seq ? seg[i] : 0;
      const float lse_i = lse_s[lane], delta_i = delta_s[lane];
      float sc[kPerWarp], dp[kPerWarp];
#pragma unroll
      for (int kk = 0; kk < kPerWarp; ++kk) sc[kk] = dp[kk] = 0.0f;
#pragma unroll 4
      for (int d = 0; d < HD; ++d) {
        const float qd = Qs[lane * (HD + 1) + d], dod = dOs[lane * (HD + 1) + d];
#pragma unroll
        for (int kk = 0; kk < kPerWarp; ++kk) {
          sc[kk] += qd * Ks[(warp * kPerWarp + kk) * HD + d];
          dp[kk] += dod * Vs[(warp * kPerWarp + kk) * HD + d];
        }
      }
      float p[kPerWarp], ds[kPerWarp];
#pragma unroll
      for (int kk = 0; kk < kPerWarp; ++kk) {
        const int64_t j = j0 + warp * kPerWarp + kk;
        const bool vis =
            j < seq && Visible(i, j, seq, window, seg_i, seg_j[kk], segmented) && lse_i != NegInf();
        p[kk] = 0.0f;
        ds[kk] = 0.0f;
        if (vis) {
          float slope;
          const float score = cap.Apply(scale * sc[kk], slope);
          p[kk] = expf(score - lse_i);
          ds[kk] = p[kk] * (dp[kk] - delta_i) * slope;
        }
      }
      // dV_j += Σ_l P_lj dout_l, dK_j += Σ_l dS_lj q_l: query l's values come from lane l.
#pragma unroll 2
      for (int ll = 0; ll < kTile; ++ll) {
#pragma unroll
        for (int kk = 0; kk < kPerWarp; ++kk) {
          const float pl = __shfl_sync(0xffffffffu, p[kk], ll);
          const float dsl = __shfl_sync(0xffffffffu, ds[kk], ll);
#pragma unroll
          for (int t = 0; t < kDimsPerLane; ++t) {
            dv_acc[kk][t] += pl * dOs[ll * (HD + 1) + lane + 32 * t];
            dk_acc[kk][t] += dsl * Qs[ll * (HD + 1) + lane + 32 * t];
          }
        }
      }
    }
  }

#pragma unroll
  for (int kk = 0; kk < kPerWarp; ++kk) {
    const int64_t j = j0 + warp * kPerWarp + kk;
    if (j >= seq) continue;
    const int64_t base = ((b * seq + j) * s.kv_heads + kvh) * HD;
#pragma unroll
    for (int t = 0; t < kDimsPerLane; ++t) {
      dk[base + lane + 32 * t] = Store<P>(scale * dk_acc[kk][t]);
      dv[base + lane + 32 * t] = Store<P>(dv_acc[kk][t]);
    }
  }
}

template <int HD>
constexpr int DqSmemFloats() {
  return 2 * BackwardRows<HD>() * HD + 2 * kTile * (HD + 1);  // Q, dO; K, V (padded)
}

template <typename T, typename P, int HD>
__global__ void __launch_bounds__(kAttentionThreads)
    DqKernel(AttentionShape s, const T* q, const T* k, const T* v, const int32_t* segments, const float* lse,
             const P* dout, const float* delta, P* dq) {
  constexpr int kDimsPerLane = HD / 32, kRows = BackwardRows<HD>(), kPerWarp = kRows / kWarps;
  extern __shared__ float smem[];
  float* Qs = smem;                   // [kRows][HD]: warp reads its query's row by broadcast
  float* dOs = Qs + kRows * HD;       // [kRows][HD]
  float* Ks = dOs + kRows * HD;       // [kTile][HD + 1]: lane l reads row l, and rows along d
  float* Vs = Ks + kTile * (HD + 1);  // [kTile][HD + 1]
  const auto [lane, warp, b, h, kvh, i0, seq, scale, segmented, seg] = QueryTile<kRows>(s, segments);
  const int64_t window = s.window;
  const ScoreCap cap = MakeScoreCap(s);

  LoadTile<HD, HD, kRows>(Qs, q, b, i0, seq, s.q_heads, h);
  LoadTile<HD, HD, kRows>(dOs, dout, b, i0, seq, s.q_heads, h);
  float dq_acc[kPerWarp][kDimsPerLane], lse_i[kPerWarp], delta_i[kPerWarp];
  int32_t seg_i[kPerWarp];
#pragma unroll
  for (int rr = 0; rr < kPerWarp; ++rr) {
    const int64_t i = i0 + warp * kPerWarp + rr;
    const int64_t row = (b * s.q_heads + h) * seq + i;
    lse_i[rr] = i < seq ? lse[row] : NegInf();
    delta_i[rr] = i < seq ? delta[row] : 0.0f;
    seg_i[rr] = segmented && i < seq ? seg[i] : 0;
#pragma unroll
    for (int t = 0; t < kDimsPerLane; ++t) dq_acc[rr][t] = 0.0f;
  }

  const int64_t key_end = min(seq, i0 + kRows);  // causal: no key past the tile's last query
  for (int64_t j0 = FirstKeyTile(i0, window, kTile); j0 < key_end; j0 += kTile) {
    __syncthreads();
    LoadTile<HD, HD + 1>(Ks, k, b, j0, seq, s.kv_heads, kvh);
    LoadTile<HD, HD + 1>(Vs, v, b, j0, seq, s.kv_heads, kvh);
    __syncthreads();
    const int64_t j = j0 + lane;
    const int32_t seg_j = segmented && j < seq ? seg[j] : 0;
    float sc[kPerWarp], dp[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) sc[rr] = dp[rr] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; ++d) {
      const float kd = Ks[lane * (HD + 1) + d], vd = Vs[lane * (HD + 1) + d];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; ++rr) {
        sc[rr] += Qs[(warp * kPerWarp + rr) * HD + d] * kd;
        dp[rr] += dOs[(warp * kPerWarp + rr) * HD + d] * vd;
      }
    }
    float ds[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) {
      const int64_t i = i0 + warp * kPerWarp + rr;
      const bool vis =
          j < seq && Visible(i, j, seq, window, seg_i[rr], seg_j, segmented) && lse_i[rr] != NegInf();
      float slope;
      const float score = cap.Apply(scale * sc[rr], slope);
      const float p = vis ? expf(score - lse_i[rr]) : 0.0f;
      ds[rr] = p * (dp[rr] - delta_i[rr]) * slope;
    }
    // dQ_i += Σ_l dS_il k_l: key l's dS comes from lane l.
#pragma unroll 4
    for (int ll = 0; ll < kTile; ++ll) {
#pragma unroll
      for (int rr = 0; rr < kPerWarp; ++rr) {
        const float dsl = __shfl_sync(0xffffffffu, ds[rr], ll);
#pragma unroll
        for (int t = 0; t < kDimsPerLane; ++t) dq_acc[rr][t] += dsl * Ks[ll * (HD + 1) + lane + 32 * t];
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kPerWarp; ++rr) {
    const int64_t i = i0 + warp * kPerWarp + rr;
    if (i >= seq) continue;
    P* o = dq + ((b * seq + i) * s.q_heads + h) * HD;
#pragma unroll
    for (int t = 0; t < kDimsPerLane; ++t) o[lane + 32 * t] = Store<P>(scale * dq_acc[rr][t]);
  }
}

template <typename T, typename P, int HD>
Status LaunchBackward(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
                      const T* out, const float* lse, const P* dout, P* dq, P* dk, P* dv, float* delta,
                      cudaStream_t stream, bool tensor_cores) {
  const int64_t rows = s.batch * s.seq * s.q_heads;  // one warp each
  DeltaKernel<T, P, HD><<<BlocksFor(rows * 32, 256), 256, 0, stream>>>(s, out, dout, delta);
  FT_RETURN_IF_ERROR(LaunchStatus("DeltaKernel"));
  if constexpr (TensorCoreStorage<T>() && TensorCoreStorage<P>()) {
    if (tensor_cores)
      return TcAttentionBackward<T, P>(s, q, k, v, segments, lse, dout, delta, dq, dk, dv, stream);
  }
  constexpr int kRows = BackwardRows<HD>();
  const unsigned tiles = static_cast<unsigned>((s.seq + kRows - 1) / kRows);

  constexpr size_t kDkDvSmem = DkDvSmemFloats<HD>() * sizeof(float);
  constexpr size_t kDqSmem = DqSmemFloats<HD>() * sizeof(float);
  static_assert(kDkDvSmem <= kMaxSmemPerBlock && kDqSmem <= kMaxSmemPerBlock);
  FT_RETURN_IF_ERROR(CudaStatus(
      cudaFuncSetAttribute(DkDvKernel<T, P, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDkDvSmem),
      "cudaFuncSetAttribute(DkDvKernel)"));
  DkDvKernel<T, P, HD>
      <<<dim3(tiles, static_cast<unsigned>(s.batch * s.kv_heads)), kAttentionThreads, kDkDvSmem, stream>>>(
          s, q, k, v, segments, lse, dout, delta, dk, dv);
  FT_RETURN_IF_ERROR(LaunchStatus("DkDvKernel"));

  FT_RETURN_IF_ERROR(CudaStatus(
      cudaFuncSetAttribute(DqKernel<T, P, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqSmem),
      "cudaFuncSetAttribute(DqKernel)"));
  DqKernel<T, P, HD>
      <<<dim3(tiles, static_cast<unsigned>(s.batch * s.q_heads)), kAttentionThreads, kDqSmem, stream>>>(
          s, q, k, v, segments, lse, dout, delta, dq);
  return LaunchStatus("DqKernel");
}

}  // namespace

int64_t AttentionBackwardWorkspaceFloats(const AttentionShape& s) { return s.batch * s.q_heads * s.seq; }

template <typename T, typename P>
Status AttentionBackward(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
                         const T* out, const float* lse, const P* dout, P* dq, P* dk, P* dv, float* workspace,
                         cudaStream_t stream, AttentionMath math) {
  FT_CHECK(s.batch >= 0 && s.seq >= 0 && s.q_heads > 0 && s.kv_heads > 0);
  if (s.q_heads % s.kv_heads != 0) {
    return Status::InvalidArgument("AttentionBackward: query heads must be a multiple of kv heads");
  }
  if (s.past() != 0)
    return Status::InvalidArgument("AttentionBackward: no backward with a KV cache (kv_seq != seq)");
  if (s.window < 0 || !(s.softcap >= 0)) {
    return Status::InvalidArgument("AttentionBackward: window and softcap must be >= 0 (0 = none)");
  }
  if (s.batch == 0 || s.seq == 0) return Status::OK();
  if (s.batch * s.q_heads > 65535) return Status::InvalidArgument("AttentionBackward: batch * heads > 65535");
  FT_CHECK(workspace != nullptr);
  const bool tc = UseTensorCores<T>(math, {q, k, v, out, dout, dq, dk, dv});
  switch (s.head_dim) {
    case 64:
      return LaunchBackward<T, P, 64>(s, q, k, v, segments, out, lse, dout, dq, dk, dv, workspace, stream,
                                      tc);
    case 128:
      return LaunchBackward<T, P, 128>(s, q, k, v, segments, out, lse, dout, dq, dk, dv, workspace, stream,
                                       tc);
    case 256:
      return LaunchBackward<T, P, 256>(s, q, k, v, segments, out, lse, dout, dq, dk, dv, workspace, stream,
                                       tc);
    default:
      return Status::InvalidArgument("AttentionBackward: head_dim " + std::to_string(s.head_dim) +
                                     " is not supported on CUDA (64, 128 or 256)");
  }
}

#define FT_INSTANTIATE_ATTENTION_BACKWARD(T, P)                                                         \
  template Status AttentionBackward<T, P>(const AttentionShape&, const T*, const T*, const T*,          \
                                          const int32_t*, const T*, const float*, const P*, P*, P*, P*, \
                                          float*, cudaStream_t, AttentionMath);
FT_INSTANTIATE_ATTENTION_BACKWARD(float, float)
FT_INSTANTIATE_ATTENTION_BACKWARD(bf16, bf16)
FT_INSTANTIATE_ATTENTION_BACKWARD(bf16, float)
FT_INSTANTIATE_ATTENTION_BACKWARD(fp16, float)
#undef FT_INSTANTIATE_ATTENTION_BACKWARD

}  // namespace ft::cuda
