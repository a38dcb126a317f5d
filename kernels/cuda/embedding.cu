// Token embedding lookup and its deterministic scatter-add backward
// (cpu::EmbeddingForward/Backward).
//
// Forward: one thread per output element (r, j) copies table[ids[r], j].
// Backward: one thread per column j walks the rows in increasing order and
// adds dout[r, j] to dtable[ids[r], j]. Only that thread touches column j, so
// a token that appears many times accumulates without atomics and in the
// CPU's order. Parallelism is D threads, which suffices for a step that only
// full fine-tunes run (LoRA freezes the embedding).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;
constexpr int kColumnThreads = 128;

// Store<T>(Load(v)) is v itself when the table's type is T.
template <typename T, typename P>
__global__ void EmbeddingForwardKernel(const P* table, const int32_t* ids, int64_t rows, int64_t D, T* out) {
  const int64_t total = rows * D;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = t / D, j = t % D;
    out[t] = Store<T>(Load(table[static_cast<int64_t>(ids[r]) * D + j]));
  }
}

template <typename T>
__global__ void EmbeddingBackwardKernel(const T* dout, const int32_t* ids, int64_t rows, int64_t D,
                                        float* dtable) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= D) return;
  for (int64_t r = 0; r < rows; ++r) dtable[static_cast<int64_t>(ids[r]) * D + j] += Load(dout[r * D + j]);
}

}  // namespace

template <typename T, typename P>
Status EmbeddingForward(const P* table, const int32_t* ids, int64_t rows, int64_t D, T* out,
                        cudaStream_t stream) {
  FT_CHECK(rows >= 0 && D > 0);
  if (rows == 0) return Status::OK();
  EmbeddingForwardKernel<T, P>
      <<<internal::BlocksFor(rows * D, kThreads), kThreads, 0, stream>>>(table, ids, rows, D, out);
  return internal::LaunchStatus("EmbeddingForwardKernel");
}

template <typename T>
Status EmbeddingBackward(const T* dout, const int32_t* ids, int64_t rows, int64_t D, float* dtable,
                         cudaStream_t stream) {
  FT_CHECK(rows >= 0 && D > 0);
  if (rows == 0) return Status::OK();
  EmbeddingBackwardKernel<T>
      <<<internal::BlocksFor(D, kColumnThreads), kColumnThreads, 0, stream>>>(dout, ids, rows, D, dtable);
  return internal::LaunchStatus("EmbeddingBackwardKernel");
}

#define FT_INSTANTIATE_EMBEDDING_FORWARD(T, P) \
  template Status EmbeddingForward<T, P>(const P*, const int32_t*, int64_t, int64_t, T*, cudaStream_t);
FT_INSTANTIATE_EMBEDDING_FORWARD(float, float)
FT_INSTANTIATE_EMBEDDING_FORWARD(bf16, bf16)
FT_INSTANTIATE_EMBEDDING_FORWARD(bf16, float)
FT_INSTANTIATE_EMBEDDING_FORWARD(fp16, float)
#undef FT_INSTANTIATE_EMBEDDING_FORWARD
template Status EmbeddingBackward<float>(const float*, const int32_t*, int64_t, int64_t, float*,
                                         cudaStream_t);
template Status EmbeddingBackward<bf16>(const bf16*, const int32_t*, int64_t, int64_t, float*, cudaStream_t);

}  // namespace ft::cuda
