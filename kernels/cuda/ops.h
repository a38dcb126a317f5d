// The CUDA ops: the GPU twin of kernels/cpu/ops.h (the reference every op here
// is checked against by tests/kernels/cuda/ops_test.cc).
//
// Conventions (the same as the CPU backend unless said otherwise):
//   - Pointers are device pointers; every op is enqueued on `stream` and
//     returns without synchronising. Row-major throughout: activations
//     [rows, D] with rows = batch * seq; q [rows, Hq*hd]; k, v [rows, Hkv*hd];
//     lse [batch, Hq, seq] (natural log).
//   - Storage types: T = float or bf16 (__nv_bfloat16) for every op; the GEMM
//     and the loss-scaling ops also take fp16 (__half). Arithmetic is fp32
//     inside every kernel (fp64 where the CPU reference accumulates in double:
//     AdamW, sums of squares, loss sums). Side outputs (rstd, lse, row losses)
//     and weight gradients of norms/embeddings are fp32 whatever T is.
//   - Typed activations beside fp32 weights and gradients (the engine's
//     bf16/fp16 storage, engine/model/backend.h): the ops whose tensors are
//     of both kinds take a second type P, the storage of the weights, tables
//     and gradients: P = T (one type throughout), or P = float with T = bf16
//     or fp16. T is read and written in place (no fp32 copy), each value
//     computed in fp32 and rounded once where it is stored: the values an
//     fp32 kernel over the widened tensors, narrowed afterwards, gives.
//   - Return value: OK means the work was enqueued. A Status::InvalidArgument
//     names an unsupported shape that a model config can cause (e.g. a head
//     dim other than 64/128); a Status::Internal names a failed CUDA launch or
//     library call (with the CUDA error string). Errors raised while a kernel
//     runs surface at the next synchronisation, as everywhere in CUDA.
//     Negative sizes are caller bugs (FT_CHECK, as in the CPU backend).
//   - Workspaces are passed in by the caller (sizes from the *Workspace*
//     functions), so every byte comes from the engine's planned arenas; no op
//     allocates device memory except BlasLt::Create.
//   - Determinism: no op uses floating-point atomics; every reduction runs in
//     an order fixed by the shape alone, so repeated runs are bit-identical.
//
// Thread safety: the free functions are thread-safe. A BlasLt is not: use
// one per host thread.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/ops.h"

namespace ft::cuda {

using bf16 = __nv_bfloat16;
using fp16 = __half;
using AttentionShape = cpu::AttentionShape;
using AdamWParams = cpu::AdamWParams;

// ---- GEMM (cuBLASLt) ---------------------------------------------------------

// A cuBLASLt handle, its workspace and a cache of chosen algorithms.
class BlasLt {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Creates the handle and allocates `workspace_bytes` of device memory on the
  // current device. Internal when cuBLASLt or cudaMalloc fails.
  static StatusOr<std::unique_ptr<BlasLt>> Create(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~BlasLt();
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;

  // C[M,N] = alpha * op(A) op(B) + beta * C, exactly cpu::Gemm's convention
  // (row-major, A [M,K] or [K,M] when trans_a, B [K,N] or [N,K] when trans_b,
  // ld* = row strides). Accumulates in fp32 (CUBLAS_COMPUTE_32F: true fp32
  // for float inputs, never TF32). (TIn, TOut) is one of (float, float),
  // (bf16, bf16), (bf16, float), (fp16, fp16), (fp16, float). With beta = 0
  // C is not read (it may hold NaN). M, N or K = 0 is InvalidArgument;
  // Unimplemented when cuBLASLt has no algorithm for the shape/alignment.
  template <typename TIn, typename TOut>
  Status Gemm(cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const TIn* A, int64_t lda, const TIn* B, int64_t ldb, float beta, TOut* C, int64_t ldc);

 private:
  struct Impl;
  explicit BlasLt(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- NF4 -----------------------------------------------------------------------

// A cpu::Nf4Tensor whose arrays live on the device (same layout, same meaning).
struct Nf4DeviceTensor {
  int64_t n = 0;
  cpu::Nf4Config config;
  const uint8_t* packed = nullptr;    // (n+1)/2 bytes, element 2i in the HIGH nibble
  const float* absmax = nullptr;      // [num_blocks], without double quant
  const uint8_t* absmax_q = nullptr;  // [num_blocks], with double quant
  const float* absmax2 = nullptr;     // [ceil(num_blocks / dq_block)], with double quant
  float offset = 0;                   // with double quant
};

// out[q.n] = cpu::DequantizeNf4 bit for bit (T = float), or that value rounded
// to bf16 or fp16 (round-to-nearest-even). InvalidArgument for an odd or non-positive
// block size.
template <typename T>
Status DequantizeNf4(const Nf4DeviceTensor& q, T* out, cudaStream_t stream);

// ---- RMSNorm ---------------------------------------------------------------------

// y = w * (x * rstd), rstd = 1/sqrt(mean(x²) + eps), per row of x[rows, D];
// writes rstd[rows] (fp32). w in P.
template <typename T, typename P>
Status RmsNormForward(const T* x, const P* w, int64_t rows, int64_t D, float eps, T* y, float* rstd,
                      cudaStream_t stream);
// Floats of workspace RmsNormBackward needs for dw (0 when dw is not wanted).
int64_t RmsNormBackwardWorkspaceFloats(int64_t rows, int64_t D);
// dx overwritten; dw[D] (fp32, nullable) += Σ_rows dy * x * rstd, summed in a
// fixed order through `workspace`. w and dx in P; dy in G (P, or T when the
// gradient is kept in the activations' 16 bits with P = float).
template <typename T, typename P, typename G = P>
Status RmsNormBackward(const T* x, const P* w, const float* rstd, const G* dy, int64_t rows, int64_t D, P* dx,
                       float* dw, float* workspace, cudaStream_t stream);

// ---- RoPE ------------------------------------------------------------------------

// In place on x[rows, heads*hd], HF rotate_half pairing (i, i + hd/2), cos/sin
// tables [max_pos, hd/2] read at positions[row]; `inverse` rotates by -θ (the
// backward). InvalidArgument for an odd hd. The tables in P.
template <typename T, typename P>
// rotary (0 = hd): cpu::RopeApply's partial rotary.
Status RopeApply(T* x, int64_t rows, int64_t heads, int64_t hd, const int32_t* positions, const P* cos_table,
                 const P* sin_table, bool inverse, cudaStream_t stream, int64_t rotary = 0);

// ---- SwiGLU ----------------------------------------------------------------------

// h = silu(gate) * up over n elements (T = float, bf16 or fp16).
template <typename T>
Status SwiGluForward(const T* gate, const T* up, int64_t n, T* h, cudaStream_t stream);
// dgate, dup overwritten (may alias gate/up when P = T). dh, dgate, dup in P
// (float, or T: 16-bit gradients, stored rounded to nearest even).
template <typename T, typename P>
Status SwiGluBackward(const T* gate, const T* up, const P* dh, int64_t n, P* dgate, P* dup,
                      cudaStream_t stream);
// h = gelu_tanh(gate) * up (cpu::GeluTanhGluForward), and its backward, with the same contract.
template <typename T>
Status GeluTanhGluForward(const T* gate, const T* up, int64_t n, T* h, cudaStream_t stream);
template <typename T, typename P>
Status GeluTanhGluBackward(const T* gate, const T* up, const P* dh, int64_t n, P* dgate, P* dup,
                           cudaStream_t stream);

// ---- Embedding -------------------------------------------------------------------

// out[rows, D] = table[ids[r], :] (the table in P, rounded to T when they
// differ). ids must be valid rows of the table.
template <typename T, typename P>
Status EmbeddingForward(const P* table, const int32_t* ids, int64_t rows, int64_t D, T* out,
                        cudaStream_t stream);
// dtable[ids[r], :] += dout[r, :] in fp32, rows in increasing order (one
// thread per column walks the rows: deterministic, no atomics; only full
// fine-tunes need it).
template <typename T>
Status EmbeddingBackward(const T* dout, const int32_t* ids, int64_t rows, int64_t D, float* dtable,
                         cudaStream_t stream);

// ---- Cross-entropy (one chunk of rows of the loss head) ---------------------------

// Per row of logits[rows, V] with target t (-100 = ignored):
//   row_loss[r] = -log softmax(logits[r])[t]   (0 for ignored rows)
// dlogits (nullable, may alias logits) = grad_scale * (softmax - onehot), 0
// for ignored rows. loss_sum (nullable device double) += Σ row_loss in a
// fixed order, so calling this per chunk of rows accumulates the loss of the
// whole batch deterministically without a [tokens, V] buffer. A target
// outside [0, V) other than -100 gives a NaN row loss and NaN gradients.
// softcap > 0: the logits were soft-capped (SoftCap) and dlogits is also
// multiplied by 1 - (logit / softcap)² (cpu::CrossEntropy's softcap).
template <typename T>
Status CrossEntropy(const T* logits, const int32_t* targets, int64_t rows, int64_t V, float grad_scale,
                    T* dlogits, float* row_loss, double* loss_sum, cudaStream_t stream, float softcap = 0);

// ---- Optimizer -------------------------------------------------------------------

// One AdamW step, cpu::AdamW's formula in fp64 per element, on the fp32
// master param/m/v, with the gradient multiplied by *grad_multiplier first
// when that device scalar is given (loss-scale unscaling times the clipping
// coefficient). When `skip` (device int, nullable) is nonzero nothing is
// written (fp16 overflow step). param_copy (nullable) receives the updated
// param in the compute dtype TCopy (float, bf16 or fp16).
template <typename TCopy>
Status AdamW(const AdamWParams& hp, int64_t n, float* param, const float* grad, float* m, float* v,
             TCopy* param_copy, const float* grad_multiplier, const int* skip, cudaStream_t stream);

// ---- Linear output ------------------------------------------------------------------

// The largest LoRA rank LinearOutput takes (its row of xa in 48 KiB of shared memory).
inline constexpr int64_t kMaxLoraRank = 12288;
// y[i, j] = T(c[i, j] + alpha · Σ_k xa[i, k] · b[j, k]) for y [rows, n], c [rows, n] fp32, xa
// [rows, r] and b [n, r] in T (r = 0: no product; xa and b may be null); with `residual`
// (nullable, [rows, n] in T, may alias y) the sum is rounded to T and the residual added before
// the final rounding. Sums over k in order in fp32; rounding to nearest even (Backend::LinearOutput).
// InvalidArgument for a rank over kMaxLoraRank or more than 2^31 - 1 blocks.
template <typename T>
Status LinearOutput(int64_t rows, int64_t n, int64_t r, float alpha, const T* xa, const T* b, const float* c,
                    const T* residual, T* y, cudaStream_t stream);

// ---- Reductions and elementwise ----------------------------------------------------

// Doubles of workspace SumSquares needs (a constant).
int64_t SumSquaresWorkspaceDoubles();
// *out = Σ x² (or *out += Σ x² when accumulate) in fp64, two passes over a
// grid fixed by n: bit-identical run to run. For the global grad norm call it
// per tensor with accumulate = true, then sqrt on the host or in ClipMultiplier.
template <typename T>
Status SumSquares(const T* x, int64_t n, double* workspace, double* out, bool accumulate,
                  cudaStream_t stream);
// One tensor of a multi-tensor op's list (the list itself lives in device memory).
template <typename T>
struct TensorSpan {
  const T* data;
  int64_t n;
};
// Doubles of workspace SumSquaresList needs for `count` tensors.
int64_t SumSquaresListWorkspaceDoubles(int64_t count);
// totals[i] = Σ x² of list[i] for the `count` tensors of the device array `list`: each the value
// SumSquares gives that tensor alone, bit for bit, in two launches for the whole list (per group
// of 65535 tensors) instead of two per tensor. Adding the totals in order from totals[0] gives what
// SumSquares with accumulate over the list gives.
template <typename T>
Status SumSquaresList(const TensorSpan<T>* list, int64_t count, double* workspace, double* totals,
                      cudaStream_t stream);
// *multiplier = (inv_loss_scale ? *inv_loss_scale : 1) * min(1, max_norm / (norm + 1e-6))
// with norm = sqrt(*sum_squares) of the UNSCALED gradient, i.e.
// sqrt(*sum_squares) * inv_loss_scale (torch's clip_grad_norm_; max_norm <= 0
// disables clipping). Feeds AdamW's grad_multiplier.
Status ClipMultiplier(const double* sum_squares, float max_norm, const float* inv_loss_scale,
                      float* multiplier, cudaStream_t stream);
// y += alpha * x (cpu::Axpy; y in P); x *= alpha (cpu::Scale).
template <typename T, typename P>
Status Axpy(int64_t n, float alpha, const T* x, P* y, cudaStream_t stream);
template <typename T>
Status Scale(int64_t n, float alpha, T* x, cudaStream_t stream);
// x = cap * tanh(x / cap) in place (cpu::SoftCap), fp32.
Status SoftCap(int64_t n, float cap, float* x, cudaStream_t stream);
// out[i] = x[i] converted with round-to-nearest-even (e.g. fp32 master ->
// bf16 compute copy). TIn, TOut in {float, bf16, fp16}.
template <typename TIn, typename TOut>
Status Convert(const TIn* x, int64_t n, TOut* out, cudaStream_t stream);

// ---- Dynamic loss scaling (fp16) ---------------------------------------------------

// torch.cuda.amp.GradScaler's defaults.
struct LossScalerParams {
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;
};
// grad *= *inv_scale; sets *found_inf = 1 when any element (before scaling)
// is inf or NaN, leaves it alone otherwise (torch's
// _amp_foreach_non_finite_check_and_unscale_). Zero *found_inf before the
// first tensor of a step.
template <typename T>
Status UnscaleAndCheckFinite(T* grad, int64_t n, const float* inv_scale, int* found_inf, cudaStream_t stream);
// torch's _amp_update_scale_: on found_inf, scale *= backoff and tracker = 0;
// else ++tracker and, when it reaches growth_interval, scale *= growth (kept
// only if finite) and tracker = 0. Also writes *inv_scale = 1 / *scale.
Status UpdateLossScale(const LossScalerParams& p, const int* found_inf, float* scale, float* inv_scale,
                       int* growth_tracker, cudaStream_t stream);

// ---- Flash attention ---------------------------------------------------------------

// How the attention kernels multiply. kFp32: fp32 products on CUDA cores
// (the stored values exactly: fp32 training). kBf16: tensor cores
// (mma.sync) with bf16 operands — Q, K, V, dO and the probabilities P and dS
// rounded to bf16 — and fp32 scores, softmax and accumulation:
// FlashAttention-2's precision, what bf16 training uses. bf16 storage always
// takes kBf16. kBf16 needs 16-byte aligned tensors; unaligned ones run the
// kFp32 kernels (the same definition, more exact, far slower). fp16 storage
// runs the kFp32 kernels, reading and writing fp16 in place.
enum class AttentionMath { kFp32, kBf16 };

// Causal GQA attention, cpu::AttentionForward's definition: query head h
// reads kv head h / (Hq/Hkv); key j is visible to query i iff j <= i + past
// (past = kv_seq - seq: keys cached before the first query; then no
// segments), i + past - j < s.window (a sliding window; 0 = none), and (no
// segments, or segments[b*seq + j] == segments[b*seq + i]). The scaled
// scores are soft-capped (s.softcap = c > 0: x -> c tanh(x / c)) before the
// mask. out[rows, Hq*hd] in T, lse[batch, Hq, seq] in fp32 (-inf and out = 0
// for a query that sees no key). head_dim must be 64, 128 or 256 (limits.h;
// InvalidArgument otherwise), window and softcap >= 0. A window costs
// O(seq * window): key tiles outside it are skipped. T = float, bf16 or fp16.
template <typename T>
Status AttentionForward(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
                        T* out, float* lse, cudaStream_t stream, AttentionMath math = AttentionMath::kFp32);
// Floats of workspace AttentionBackward needs (D_i = dout_i · out_i per query).
int64_t AttentionBackwardWorkspaceFloats(const AttentionShape& s);
// dq, dk, dv overwritten, FlashAttention-2's gradients recomputed from lse
// (window and soft-cap as the forward's; no KV cache: kv_seq 0 or seq).
// dK/dV and dQ are computed by separate kernels, so no atomics are needed.
// q, k, v, out in T; dout, dq, dk, dv in P. Every head dim runs on both
// kinds of kernel; at 256 the tensor-core dK/dV kernel recomputes the scores
// once per half of the columns (attention_tc_backward.cu).
template <typename T, typename P>
Status AttentionBackward(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
                         const T* out, const float* lse, const P* dout, P* dq, P* dk, P* dv, float* workspace,
                         cudaStream_t stream, AttentionMath math = AttentionMath::kFp32);

}  // namespace ft::cuda
