// Flash attention forward (cpu::AttentionForward's definition), fp32 math on
// CUDA cores: a straightforward, checkable kernel (attention.cuh's tiling).
//
// Block (query tile i0.., batch b, query head h), kv head h / (Hq / Hkv).
// Each warp keeps, for each of its 8 query rows, the online-softmax state:
// running max m, running sum l of exp(s - m), and acc[HD] (lane owns dims
// lane + 32 t). Per key tile (keys j0 .. j0 + 31, lane l = key j0 + l):
//   s    = scale * q_i · k_j (soft-capped: cap tanh(s / cap)), or -inf where
//          j is not visible to i
//   m'   = max(m, max_l s)                 (WarpMax)
//   corr = exp(m - m') (0 while m = -inf), p = exp(s - m')
//   l    = l corr + Σ_l p,  acc = acc corr + Σ_l p v_j   (p broadcast by shuffle)
// Causal: key tiles stop at the query tile's last row; with a sliding window
// they start at the tile holding the first row's first visible key
// (FirstKeyTile), so each query tile visits fewer than window + 64 keys. At
// the end out = acc / l and lse = m + log(l), or 0 and -inf when the row saw
// no key (only rows past the sequence: a query always sees its own position).
// With a KV cache (s.kv_seq > s.seq) the keys and values have kv_seq rows per
// sequence and query i stands at position i + past (past = kv_seq - seq).
#include <string>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/limits.h"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using namespace internal;  // NOLINT: the kernel vocabulary of attention.cuh

template <int HD>
constexpr int ForwardSmemFloats() {
  return kTile * HD + kTile * (HD + 1) + kTile * HD;  // Q, K (padded), V
}

template <typename T, int HD>
__global__ void __launch_bounds__(kAttentionThreads)
    FlashForwardKernel(AttentionShape s, const T* q, const T* k, const T* v, const int32_t* segments, T* out,
                       float* lse) {
  constexpr int kDimsPerLane = HD / 32;
  extern __shared__ float smem[];
  float* Qs = smem;                   // [kTile][HD], read by broadcast
  float* Ks = Qs + kTile * HD;        // [kTile][HD + 1], lane l reads row l
  float* Vs = Ks + kTile * (HD + 1);  // [kTile][HD], read along d
  const auto [lane, warp, b, h, kvh, i0, seq, scale, segmented, seg] = QueryTile(s, segments);
  const ScoreCap cap = MakeScoreCap(s);

  LoadTile<HD, HD>(Qs, q, b, i0, seq, s.q_heads, h);
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDimsPerLane];
  int32_t seg_i[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    m[rr] = NegInf();
    l[rr] = 0.0f;
    seg_i[rr] = segmented && i < seq ? seg[i] : 0;
#pragma unroll
    for (int t = 0; t < kDimsPerLane; ++t) acc[rr][t] = 0.0f;
  }

  const int64_t keys = s.kv_seq > 0 ? s.kv_seq : seq, past = keys - seq, window = s.window;
  const int64_t key_end = min(keys, i0 + kTile + past);  // causal: no key past the tile's last query
  for (int64_t j0 = FirstKeyTile(i0 + past, window, kTile); j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous tile's K and V are no longer read
    LoadTile<HD, HD + 1>(Ks, k, b, j0, keys, s.kv_heads, kvh);
    LoadTile<HD, HD>(Vs, v, b, j0, keys, s.kv_heads, kvh);
    __syncthreads();
    const int64_t j = j0 + lane;
    const int32_t seg_j = segmented && j < seq ? seg[j] : 0;
    float sc[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; ++d) {
      const float kd = Ks[lane * (HD + 1) + d];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] += Qs[(warp * kRowsPerWarp + rr) * HD + d] * kd;
    }
    float p[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      float slope;  // unused forward
      const float capped = cap.Apply(scale * sc[rr], slope);
      const float score = Visible(i + past, j, keys, window, seg_i[rr], seg_j, segmented) ? capped : NegInf();
      const float new_m = fmaxf(m[rr], WarpMax(score));
      if (new_m == NegInf()) {  // nothing visible yet (warp-uniform)
        p[rr] = 0.0f;
        continue;
      }
      const float corr = expf(m[rr] - new_m);  // exp(-inf) = 0 on the first visible tile
      p[rr] = expf(score - new_m);
      l[rr] = l[rr] * corr + WarpSum(p[rr]);
#pragma unroll
      for (int t = 0; t < kDimsPerLane; ++t) acc[rr][t] *= corr;
      m[rr] = new_m;
    }
    // acc += P V: key jj's probability comes from lane jj.
#pragma unroll 4
    for (int jj = 0; jj < kTile; ++jj) {
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float pj = __shfl_sync(0xffffffffu, p[rr], jj);
#pragma unroll
        for (int t = 0; t < kDimsPerLane; ++t) acc[rr][t] += pj * Vs[jj * HD + lane + 32 * t];
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= seq) continue;
    const bool any = l[rr] > 0.0f;
    T* o = out + ((b * seq + i) * s.q_heads + h) * HD;
#pragma unroll
    for (int t = 0; t < kDimsPerLane; ++t) o[lane + 32 * t] = Store<T>(any ? acc[rr][t] / l[rr] : 0.0f);
    if (lane == 0) lse[(b * s.q_heads + h) * seq + i] = any ? m[rr] + logf(l[rr]) : NegInf();
  }
}

template <typename T, int HD>
Status LaunchForward(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
                     T* out, float* lse, cudaStream_t stream) {
  constexpr size_t kSmem = ForwardSmemFloats<HD>() * sizeof(float);  // 96.1 KiB at head dim 256
  static_assert(kSmem <= kMaxSmemPerBlock);
  FT_RETURN_IF_ERROR(CudaStatus(
      cudaFuncSetAttribute(FlashForwardKernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
      "cudaFuncSetAttribute(FlashForwardKernel)"));
  const dim3 grid(static_cast<unsigned>((s.seq + kTile - 1) / kTile),
                  static_cast<unsigned>(s.batch * s.q_heads));
  FlashForwardKernel<T, HD><<<grid, kAttentionThreads, kSmem, stream>>>(s, q, k, v, segments, out, lse);
  return LaunchStatus("FlashForwardKernel");
}

}  // namespace

template <typename T>
Status AttentionForward(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
                        T* out, float* lse, cudaStream_t stream, AttentionMath math) {
  FT_CHECK(s.batch >= 0 && s.seq >= 0 && s.q_heads > 0 && s.kv_heads > 0);
  if (s.q_heads % s.kv_heads != 0) {
    return Status::InvalidArgument("AttentionForward: query heads must be a multiple of kv heads");
  }
  if (s.past() < 0 || (segments != nullptr && s.past() > 0)) {
    return Status::InvalidArgument("AttentionForward: kv_seq must be 0 or >= seq, and without segments");
  }
  if (s.window < 0 || !(s.softcap >= 0)) {
    return Status::InvalidArgument("AttentionForward: window and softcap must be >= 0 (0 = none)");
  }
  if (s.batch == 0 || s.seq == 0) return Status::OK();
  if (s.batch * s.q_heads > 65535) return Status::InvalidArgument("AttentionForward: batch * heads > 65535");
  if constexpr (TensorCoreStorage<T>()) {
    if (AttentionTakesHeadDim(s.head_dim) && UseTensorCores<T>(math, {q, k, v, out})) {
      return TcAttentionForward<T>(s, q, k, v, segments, out, lse, stream);
    }
  }
  switch (s.head_dim) {
    case 64: return LaunchForward<T, 64>(s, q, k, v, segments, out, lse, stream);
    case 128: return LaunchForward<T, 128>(s, q, k, v, segments, out, lse, stream);
    case 256: return LaunchForward<T, 256>(s, q, k, v, segments, out, lse, stream);
    default:
      return Status::InvalidArgument("AttentionForward: head_dim " + std::to_string(s.head_dim) +
                                     " is not supported on CUDA (64, 128 or 256)");
  }
}

template Status AttentionForward<float>(const AttentionShape&, const float*, const float*, const float*,
                                        const int32_t*, float*, float*, cudaStream_t, AttentionMath);
template Status AttentionForward<bf16>(const AttentionShape&, const bf16*, const bf16*, const bf16*,
                                       const int32_t*, bf16*, float*, cudaStream_t, AttentionMath);
template Status AttentionForward<fp16>(const AttentionShape&, const fp16*, const fp16*, const fp16*,
                                       const int32_t*, fp16*, float*, cudaStream_t, AttentionMath);

}  // namespace ft::cuda
