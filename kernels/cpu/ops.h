// The CPU reference ops: readable, deterministic, templated on the scalar type.
//
// Every op exists for T = float (what the engine runs) and T = double (what the
// finite-difference gradient checks run). Each is the definition the CUDA
// backend is checked against. Ops that read or write activations also take
// their storage type S (kernels/cpu/dtype.h): S = T, or with T = float the
// 16-bit Bf16 and Half (typed storage: loaded exactly, computed in float,
// stored rounded to nearest even, so the result is the float op's rounded). Layout conventions, row-major
// throughout:
//   activations  [rows, D] with rows = batch * seq (token-major)
//   q            [rows, Hq * hd], k and v [rows, Hkv * hd] (head-major inside a row)
//   lse          [batch, Hq, seq] (natural-log sum of exp of the scaled scores)
// Determinism: every reduction runs in a fixed order independent of thread
// count; results are bit-identical from run to run.
// Errors: shapes are preconditions checked with FT_CHECK (a mismatch is a bug
// in the caller, never user input).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dtype.h"

namespace ft::cpu {

// C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or Xᵀ. A is [M,K] (or
// [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b); ld* are row strides.
// float/double go through BLAS (OpenBLAS) when built with it, else a blocked loop.
// Threads: OpenMP over blocks of C whose sizes depend only on the shape, each
// block one single-threaded BLAS call; the first call sets OpenBLAS to one
// thread for the whole process (its own threading changes results with its
// thread count).
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// y = x * rsqrt(mean(x²) + eps) * w, per row of x[rows, D]; saves rstd[rows].
template <typename T, typename S = T>
void RmsNormForward(const S* x, const T* w, int64_t rows, int64_t D, T eps, S* y, T* rstd);
// dx = gradient w.r.t. x (overwritten); dw += gradient w.r.t. w when dw != nullptr.
// dy is stored in G: T, or with T = float S (a gradient kept in the activations' 16 bits).
template <typename T, typename S = T, typename G = T>
void RmsNormBackward(const S* x, const T* w, const T* rstd, const G* dy, int64_t rows, int64_t D, T* dx,
                     T* dw);

// Rotary embedding in place on x[rows, heads * hd], HF rotate_half pairing
// (i, i + hd/2): x1' = x1*cos - x2*sin, x2' = x2*cos + x1*sin, with
// cos/sin[pos, hd/2] looked up at positions[row]. `inverse` applies the
// transposed rotation (angle -θ), which is the backward of the forward.
template <typename T, typename S = T>
void RopeApply(S* x, int64_t rows, int64_t heads, int64_t hd, const int32_t* positions, const T* cos_table,
               const T* sin_table, bool inverse, int64_t rotary = 0);
// rotary (0 = hd): partial rotary (Phi's partial_rotary_factor): only each head's first `rotary`
// dims turn, pairing i with i + rotary/2 by tables of [pos, rotary/2]; the rest are unchanged.

// Causal attention for batch sequences of length seq, GQA (Hq % Hkv == 0, query
// head h uses kv head h / (Hq/Hkv)). `segments` (nullable, [batch*seq]) confines
// attention to keys with the same segment id (packing). out[rows, Hq*hd];
// lse[batch, Hq, seq]. Rows whose query sees no key (impossible when causal) are zero.
//
// Decoding with a KV cache: kv_seq > seq keys per sequence (k, v are
// [batch*kv_seq, Hkv*hd]) of which the queries are the last seq positions, so
// query i sees keys j <= i + past(). Forward only, without segments; the
// backward needs kv_seq == seq (or 0).
struct AttentionShape {
  int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  double scale = 0;    // usually 1/sqrt(head_dim)
  int64_t kv_seq = 0;  // keys per sequence; 0 = seq
  // Sliding window (Mistral, Gemma 2/3 local layers; HF's rule): key j is
  // visible to query i only when (i + past()) - j < window. 0 = no window.
  int64_t window = 0;
  // Soft-capping of the scores (Gemma 2's attn_logit_softcapping): the scaled
  // score x becomes softcap * tanh(x / softcap) before the mask and softmax.
  // 0 = none.
  double softcap = 0;
  int64_t keys() const { return kv_seq > 0 ? kv_seq : seq; }
  int64_t past() const { return keys() - seq; }  // keys before the first query
};
// The "flash" form: tiles of keys, online softmax, O(seq) extra memory.
template <typename T, typename S = T>
void AttentionForward(const AttentionShape& s, const S* q, const S* k, const S* v, const int32_t* segments,
                      S* out, T* lse);
// Reference: materialises the [seq, seq] score matrix per head.
template <typename T, typename S = T>
void AttentionForwardNaive(const AttentionShape& s, const S* q, const S* k, const S* v,
                           const int32_t* segments, S* out, T* lse);
// Backward from saved out and lse (recomputes probabilities tile by tile).
// dq, dk, dv are overwritten. With 16-bit S, each (batch, head) of q, k, v
// and out is widened into float scratch of one head (seq x head_dim) first.
template <typename T, typename S = T>
void AttentionBackward(const AttentionShape& s, const S* q, const S* k, const S* v, const int32_t* segments,
                       const S* out, const T* lse, const T* dout, T* dq, T* dk, T* dv);

// h = silu(gate) * up, elementwise over n.
// (Computed in Load(S)'s type: float for the 16-bit S.)
template <typename S>
void SwiGluForward(const S* gate, const S* up, int64_t n, S* h);
// dgate, dup overwritten (may alias gate/up only if the caller no longer needs them).
// dh, dgate and dup are stored in G: T, or with T = float S (16-bit gradients, the
// float results stored rounded to nearest even).
template <typename T, typename S = T, typename G = T>
void SwiGluBackward(const S* gate, const S* up, const G* dh, int64_t n, G* dgate, G* dup);
// h = gelu_tanh(gate) * up (GeGLU, Gemma's "gelu_pytorch_tanh": PyTorch's GELU with
// approximate="tanh"); the same contract as SwiGluForward/Backward.
template <typename S>
void GeluTanhGluForward(const S* gate, const S* up, int64_t n, S* h);
template <typename T, typename S = T, typename G = T>
void GeluTanhGluBackward(const S* gate, const S* up, const G* dh, int64_t n, G* dgate, G* dup);

// Cross-entropy over logits[rows, V] with targets[rows] (-100 = ignored).
// Returns the SUM of -log softmax(logits)[target] over non-ignored rows (in
// double, fixed order). When dlogits != nullptr writes
// dlogits = grad_scale * (softmax - onehot) for counted rows and 0 for ignored
// ones; dlogits may alias logits. softcap > 0: the logits were soft-capped by
// SoftCap(softcap), and dlogits is the gradient with respect to the logits
// before it, i.e. also multiplied by 1 - (logit / softcap)².
template <typename T>
double CrossEntropy(const T* logits, const int32_t* targets, int64_t rows, int64_t V, T grad_scale,
                    T* dlogits, T softcap = 0);

// out[rows, D] = table[ids[r], :] (T = S: the stored rows copied; T = float
// and a 16-bit S: rounded).
template <typename T, typename S = T>
void EmbeddingForward(const T* table, const int32_t* ids, int64_t rows, int64_t D, S* out);
// dtable[ids[r], :] += dout[r, :] (rows in order: deterministic).
template <typename T>
void EmbeddingBackward(const T* dout, const int32_t* ids, int64_t rows, int64_t D, T* dtable);

// Σ x² in double, fixed order (for global grad norms).
template <typename T>
double SumSquares(const T* x, int64_t n);

// y += alpha * x; x *= alpha.
template <typename T, typename S = T>
void Axpy(int64_t n, T alpha, const S* x, T* y);
template <typename T>
void Scale(int64_t n, T alpha, T* x);
// x = cap * tanh(x / cap), in place (Gemma 2's final_logit_softcapping); cap > 0.
template <typename T>
void SoftCap(int64_t n, T cap, T* x);

// One AdamW update with PyTorch's semantics (torch.optim.AdamW, foreach=False):
//   p -= lr*wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g²;
//   p -= (lr / (1-b1^step)) * m / (sqrt(v)/sqrt(1-b2^step) + eps)
// step counts from 1.
struct AdamWParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;
};
template <typename T>
void AdamW(const AdamWParams& hp, int64_t n, T* param, const T* grad, T* m, T* v);

// bf16 emulation: rounds each float to the nearest bf16 (round-to-nearest-even,
// NaN kept) and stores it back as float. This is how the CPU backend runs the
// bf16 compute path: bf16 values, fp32 arithmetic.
void RoundToBf16(float* x, int64_t n);
// fp16 emulation, as RoundToBf16: each float rounded to the nearest half
// (round-to-nearest-even; beyond 65504 to infinity, below 2^-24 to zero).
void RoundToFp16(float* x, int64_t n);
// Whole arrays: float -> bf16 (bf16 = true) or fp16 codes, round-to-nearest-even,
// and back (exact).
void NarrowTo16(bool bf16, const float* x, int64_t n, uint16_t* out);
void WidenFrom16(bool bf16, const uint16_t* x, int64_t n, float* out);
// out[i] = x[i] in SOut's storage: float <-> Bf16 / Half (narrowing rounds to nearest even).
template <typename SIn, typename SOut>
void Convert(const SIn* x, int64_t n, SOut* out);

}  // namespace ft::cpu
