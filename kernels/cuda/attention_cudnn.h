// cuDNN 9's fused flash attention (SDPA) beside our kernels: the same
// definition as cuda::AttentionForward/Backward (kernels/cuda/ops.h) for the
// calls engine/model/attention_route.h lets it take: bf16 or fp16 tensors,
// causal, grouped-query heads, head dims 64/128/256, and packed rows' documents
// masked from each other; no window, soft-cap or KV cache.
//
// How it is expressed (cuDNN's backend graph API, kernels/cuda/cudnn_graph.h):
//   - Every sequence is one of cuDNN's ragged batch entries: q, k, v, out
//     [rows*seq, heads*head_dim] are described as [B, heads, S, head_dim]
//     with element offsets per entry ("THD" layout), a padding mask from
//     per-entry lengths, and the causal mask (row >= column) on top. Without
//     segments the entries are the rows (B = batch, S = seq). With segments,
//     each run of equal ids in a row is a document and one entry: B is the
//     documents' count rounded up to a power of two (entries past it have
//     length 0), S the longest document rounded up to a power of two (at
//     most seq), so plans are built for few shapes.
//   - lse is cuDNN's softmax stats (max + log sum exp of the scaled scores,
//     natural log), written ragged straight into our [batch, Hq, seq] layout.
//   - The backward is the deterministic form of cuDNN's graph (dQ written
//     by its matmul, no fp32 atomic accumulator), and Plan::Build takes
//     only engines without the non-deterministic note. Its scratch is what
//     attention_route.h's CudnnDeterministicWorkspaceBytes estimates.
//
// Costs beyond cuDNN's kernels: per call, one small kernel turns rows or
// segments into lengths and offsets (O(tokens), one block). With segments
// the documents' count and longest length are read back to choose the plan:
// one 8-byte copy and a stream synchronisation per call. The backward takes
// dout in fp32 and writes fp32 dq/dk/dv (the Backend's convention): dout is
// rounded to T (what our tensor-core kernels do too) and the gradients,
// which cuDNN writes in T, are widened: 3 elementwise passes over 4
// tensors, and the gradients are rounded to T once more than ours are.
//
// Thread safety: one CudnnAttention per stream and thread (it owns the cuDNN
// handle, its plans and its workspaces).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/cuda/ops.h"

namespace ft::cuda {

// cuDNN's batch and sequence for one call (see above).
struct CudnnDocuments {
  int64_t count = 0;    // documents (the rows without segments), before rounding up
  int64_t max_len = 0;  // the longest one's length
  int64_t batch = 0;    // cuDNN's B
  int64_t seq = 0;      // cuDNN's S
};

class CudnnAttention {
 public:
  // The loaded library's version (cudnnGetVersion: 91900 = 9.19.0), or 0
  // with *why saying why it is not available (built without cudnn_graph.h,
  // libcudnn.so.9 not found, not 9.x).
  static int64_t LoadedVersion(std::string* why);

  // A cuDNN handle on the current device. FailedPrecondition (with the
  // reason above) when cuDNN is not available; Internal when cudnnCreate fails.
  static StatusOr<std::unique_ptr<CudnnAttention>> Create();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Writes this call's lengths and offsets on `stream` and returns the
  // documents (synchronising `stream` once when segments is not null).
  // Forward and Backward use the last Prepare's, which must be of the same s
  // and segments. InvalidArgument when a segments run is longer than seq.
  StatusOr<CudnnDocuments> Prepare(const AttentionShape& s, const int32_t* segments, cudaStream_t stream);

  // cuda::AttentionForward's contract for T = bf16 or fp16 (out and lse
  // written for every token). FailedPrecondition when no deterministic
  // cuDNN engine takes the graph; ResourceExhausted when its workspace
  // exceeds workspace_budget_bytes; Internal on a cuDNN or CUDA failure.
  template <typename T>
  Status Forward(const AttentionShape& s, const T* q, const T* k, const T* v, T* out, float* lse,
                 cudaStream_t stream);
  // cuda::AttentionBackward's contract (P = float), errors as Forward's.
  template <typename T>
  Status Backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* out, const float* lse,
                  const float* dout, float* dq, float* dk, float* dv, cudaStream_t stream);

  // The most device memory one plan's workspace may take (its dP scratch).
  int64_t workspace_budget_bytes = int64_t{2} << 30;

  struct Impl;  // opaque: the handle, plans and scratch (attention_cudnn.cu)

 private:
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft::cuda
