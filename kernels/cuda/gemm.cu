// GEMM through cuBLASLt, with cpu::Gemm's row-major convention.
//
// cuBLASLt is column-major. A row-major matrix X[r, c] with row stride ld is,
// read column-major, Xᵀ[c, r] with leading dimension ld. So the row-major
//   C[M,N] = op(A) op(B)
// is the column-major
//   Cᵀ[N,M] = op(B)ᵀ op(A)ᵀ,
// i.e. one cuBLASLt matmul with its "A" = our B and its "B" = our A:
//   - our B, not transposed, is stored [K,N] row-major = [N,K] column-major,
//     which already is op(B)ᵀ: CUBLAS_OP_N on a (rows N, cols K, ld ldb) layout;
//     transposed, it is stored [N,K] row-major = [K,N] column-major: CUBLAS_OP_T
//     on a (rows K, cols N, ld ldb) layout.
//   - our A likewise: not transposed, (rows K, cols M, ld lda) with OP_N;
//     transposed, (rows M, cols K, ld lda) with OP_T.
//   - C: (rows N, cols M, ld ldc), column-major.
// Compute type CUBLAS_COMPUTE_32F (no TF32), scale type fp32 (alpha, beta are floats).
#include <cublasLt.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

template <typename T>
constexpr cudaDataType_t DataType() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, bf16>) return CUDA_R_16BF;
  if constexpr (std::is_same_v<T, fp16>) return CUDA_R_16F;
}

// cuBLASLt's status names (cublasGetStatusName lives in libcublas, which we do not link).
const char* LtStatusName(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS status";
  }
}

Status LtStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::OK();
  return Status::Internal(std::string(what) + ": " + LtStatusName(st) + " (" +
                          std::to_string(static_cast<int>(st)) + ")");
}

// Largest power of two (up to 16) dividing the address: cuBLASLt picks
// vectorised algorithms by the pointers' alignment.
int Alignment(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  int a = 16;
  while (a > 1 && addr % a != 0) a /= 2;
  return a;
}

// Owns the cuBLASLt descriptors of one call (destroyed on every return path).
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

struct BlasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Algorithm chosen per (types, transposes, sizes, strides, alignments): the
  // heuristic query costs more than a small matmul.
  using Key =
      std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool>;
  std::map<Key, cublasLtMatmulAlgo_t> algos;

  ~Impl() {
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }
};

BlasLt::BlasLt(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlasLt::~BlasLt() = default;

StatusOr<std::unique_ptr<BlasLt>> BlasLt::Create(size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  FT_RETURN_IF_ERROR(LtStatus(cublasLtCreate(&impl->handle), "cublasLtCreate"));
  if (workspace_bytes > 0) {
    FT_RETURN_IF_ERROR(internal::CudaStatus(cudaMalloc(&impl->workspace, workspace_bytes),
                                            "cudaMalloc(cuBLASLt workspace)"));
  }
  impl->workspace_bytes = workspace_bytes;
  return std::unique_ptr<BlasLt>(new BlasLt(std::move(impl)));
}

template <typename TIn, typename TOut>
Status BlasLt::Gemm(cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                    float alpha, const TIn* A, int64_t lda, const TIn* B, int64_t ldb, float beta, TOut* C,
                    int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) {
    return Status::InvalidArgument("Gemm: M, N and K must be positive (got " + std::to_string(M) + ", " +
                                   std::to_string(N) + ", " + std::to_string(K) + ")");
  }
  FT_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N);
  constexpr cudaDataType_t in_type = DataType<TIn>(), out_type = DataType<TOut>();
  Descriptors d;
  FT_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  // cuBLASLt's operand "A" is our B, its "B" is our A (see the file comment).
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  FT_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
               "TRANSA"));
  FT_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
      "TRANSB"));
  FT_RETURN_IF_ERROR(LtStatus(
      cublasLtMatrixLayoutCreate(&d.a, in_type, trans_b ? K : N, trans_b ? N : K, ldb), "layout of B"));
  FT_RETURN_IF_ERROR(LtStatus(
      cublasLtMatrixLayoutCreate(&d.b, in_type, trans_a ? M : K, trans_a ? K : M, lda), "layout of A"));
  FT_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&d.c, out_type, N, M, ldc), "layout of C"));

  const int align = std::min({Alignment(A), Alignment(B), Alignment(C)});
  const Impl::Key key{in_type, out_type, trans_a, trans_b, M, N, K, lda, ldb, ldc, align, beta == 0.0f};
  auto it = impl_->algos.find(key);
  if (it == impl_->algos.end()) {
    FT_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate"));
    const size_t ws = impl_->workspace_bytes;
    FT_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceSetAttribute(
                                    d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                                "workspace preference"));
    const uint32_t align_bytes = static_cast<uint32_t>(align);
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      FT_RETURN_IF_ERROR(
          LtStatus(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &align_bytes, sizeof(align_bytes)),
                   "alignment"));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    FT_RETURN_IF_ERROR(LtStatus(
        cublasLtMatmulAlgoGetHeuristic(impl_->handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found),
        "cublasLtMatmulAlgoGetHeuristic"));
    if (found == 0) {
      return Status::Unimplemented("Gemm: cuBLASLt has no algorithm for M=" + std::to_string(M) +
                                   " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                   " with alignment " + std::to_string(align));
    }
    it = impl_->algos.emplace(key, result.algo).first;
  }
  // D = C: in place, cuBLASLt's "C" and "D" are the same matrix.
  return LtStatus(cublasLtMatmul(impl_->handle, d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c,
                                 &it->second, impl_->workspace, impl_->workspace_bytes, stream),
                  "cublasLtMatmul");
}

#define FT_INSTANTIATE_GEMM(TIn, TOut)                                                                \
  template Status BlasLt::Gemm<TIn, TOut>(cudaStream_t, bool, bool, int64_t, int64_t, int64_t, float, \
                                          const TIn*, int64_t, const TIn*, int64_t, float, TOut*, int64_t);
FT_INSTANTIATE_GEMM(float, float)
FT_INSTANTIATE_GEMM(bf16, bf16)
FT_INSTANTIATE_GEMM(bf16, float)
FT_INSTANTIATE_GEMM(fp16, fp16)
FT_INSTANTIATE_GEMM(fp16, float)
#undef FT_INSTANTIATE_GEMM

}  // namespace ft::cuda
