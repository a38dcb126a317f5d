// CudaBackend: engine/model/backend.h on one CUDA device (built when FT_HAVE_CUDA).
//
// Memory comes from cudaMalloc (zeroed on the backend's stream) and is
// counted by the MemoryTracker like every engine allocation. Every op is
// enqueued on the backend's one stream: the kernels/cuda op where one exists
// (cuBLASLt GEMM with fp32 compute, flash attention, fused norms...), and a
// small kernel of this file for the engine-level helpers kernels/cuda does
// not have (bias add and bias gradient, in-place bf16 rounding, LoRA dropout
// masks). Workspaces the ops ask for grow on demand and are counted as
// workspace bytes.
//
// Typed storage: bf16/fp16 activations are read and written in place by
// every op (kernels/cuda's <T, P> instantiations beside the fp32 weights and
// fp32 or 16-bit gradients), each value computed in fp32 and rounded once where it is
// stored; only the fp32 GEMM (the loss head) widens a 16-bit operand into a
// staging copy, and the 16-bit GEMMs round an fp32 operand into one.
//
// Memory techniques (issue #16): a second stream, the copy stream, moves
// data between device memory and page-locked host memory (AllocHost) beside
// the ops. A transfer waits for an event recorded on the compute stream when
// it is called (so it sees every op before it); WaitForCopies makes the
// compute stream wait for an event recorded on the copy stream, with a pair
// of timing events around the wait: their elapsed time, summed by
// copy_stats(), is how long the ops stalled on transfers.
//
// Errors: the first failed call is recorded; every later op is skipped and
// Synchronize() returns it (engine/model/backend.h).
//
// Cost model: engine/model/cuda_cost.cc predicts, method by method, the
// launches, FLOPs and bytes each op here issues (the same staging and
// conversions), under the category names of cuda_op_names.h that the
// FT_TIME_OP scopes here use: a change to what an op launches changes both.
//
// Determinism: every kernel here reduces in an order fixed by the shape (the
// bias gradient walks rows in order, one thread per column), as kernels/cuda
// does; results are bit-identical run to run, not to the CPU.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/model/backend.h"
#include "engine/model/cuda_op_names.h"
#include "engine/model/cuda_op_times.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft {
namespace {

using cuda::internal::BlocksFor;
using cuda::internal::CudaStatus;
using cuda::internal::LaunchStatus;

constexpr int kThreads = 256;

// The op's launches, timed when FT_CUDA_OP_TIMES is set (engine/model/cuda_op_times.h).
#define FT_TIME_OP(name) CudaOpTimes::Scope op_time_scope_(&times_, name, stream_)

// engine/model/rng.h's Mix64 / HashKeys / UniformFloat, on the device (the same
// integer arithmetic, so the same dropout masks as the CPU backend).
__device__ __forceinline__ uint64_t DevMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ uint64_t DevHashKeys(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return DevMix64(DevMix64(DevMix64(DevMix64(seed) ^ a) ^ b) ^ c);
}
__device__ __forceinline__ float DevUniformFloat(uint64_t bits) {
  return __fmul_rn(static_cast<float>(bits >> 40), 1.0f / 16777216.0f);
}

__global__ void AddBiasKernel(float* y, const float* bias, int64_t rows, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __fadd_rn(y[i], bias[i % n]);
  }
}

// One thread per column, rows in order (the CPU's order for each column); dy fp32 or 16-bit.
template <typename G>
__global__ void BiasGradKernel(const G* dy, int64_t rows, int64_t n, float* dbias) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    float acc = dbias[j];
    for (int64_t r = 0; r < rows; ++r) acc = __fadd_rn(acc, cuda::internal::Load(dy[r * n + j]));
    dbias[j] = acc;
  }
}

// dst[r, c] (packed, row stride cols) = T(src[r, c]) (row stride ld), T bf16
// or fp16, round-to-nearest-even (fp16 out of range: infinity, as
// cpu::FloatToHalf).
__device__ __forceinline__ void StoreRounded(float x, __nv_bfloat16* dst) { *dst = __float2bfloat16_rn(x); }
__device__ __forceinline__ void StoreRounded(float x, __half* dst) { *dst = __float2half_rn(x); }
template <typename T>
__global__ void ToLowPrecisionKernel(const float* src, int64_t rows, int64_t cols, int64_t ld, T* dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    StoreRounded(src[(i / cols) * ld + i % cols], dst + i);
  }
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

// out[r, :] = table[ids[r], :] for 16-bit codes (bf16 or fp16 alike).
__global__ void GatherRows16Kernel(const uint16_t* table, const int32_t* ids, int64_t rows, int64_t D,
                                   uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * D;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = table[static_cast<int64_t>(ids[i / D]) * D + i % D];
  }
}

// dst[r, c] (packed, row stride cols) = float(src[r, c]) (row stride ld), exact.
template <typename T>
__global__ void ToFloatKernel(const T* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = ToFloat(src[(i / cols) * ld + i % cols]);
  }
}

// x[i] = T(x[i]) back as float: the bf16 or fp16 emulation in place.
template <typename T>
__global__ void RoundInPlaceKernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    T rounded;
    StoreRounded(x[i], &rounded);
    x[i] = ToFloat(rounded);
  }
}

// keep(r, c) = UniformFloat(Mix64(row_key(r) ^ c)) >= p, as the CPU backend.
__device__ __forceinline__ bool Keep(const DropoutKey& key, int64_t r, int64_t c) {
  const uint64_t row_key = DevHashKeys(key.seed, static_cast<uint64_t>(key.first_sequence + r / key.seq),
                                       static_cast<uint64_t>(r % key.seq), key.module_key);
  return static_cast<double>(DevUniformFloat(DevMix64(row_key ^ static_cast<uint64_t>(c)))) >= key.p;
}

// add = false: out = keep ? x * keep_scale : 0. add = true: out += x * (keep ? keep_scale : 0).
// x in fp32 or 16-bit storage (read in place, widened exactly).
template <typename T>
__global__ void DropoutKernel(DropoutKey key, float keep_scale, const T* x, int64_t rows, int64_t in,
                              float* out, bool add) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * in;
       i += int64_t{gridDim.x} * blockDim.x) {
    const bool keep = Keep(key, i / in, i % in);
    const float xi = ToFloat(x[i]);
    if (add) {
      out[i] = __fadd_rn(out[i], __fmul_rn(xi, keep ? keep_scale : 0.0f));
    } else {
      out[i] = keep ? __fmul_rn(xi, keep_scale) : 0.0f;
    }
  }
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::string name) : device_(device), name_(std::move(name)) {}
  ~CudaBackend() override {
    if (times_.enabled() && Synchronize().ok()) {
      std::fprintf(stderr, "GPU time by backend op on %s (FT_CUDA_OP_TIMES):\n%s", Describe().c_str(),
                   times_.Report().c_str());
    }
    // Workspaces go back to this backend before the stream does.
    rms_ws_ = DeviceBuffer();
    for (DeviceBuffer& b : stage_ws_) b = DeviceBuffer();
    a16_ws_ = DeviceBuffer();
    b16_ws_ = DeviceBuffer();
    att_ws_ = DeviceBuffer();
    row_loss_ = DeviceBuffer();
    ss_ws_ = DeviceBuffer();
    ss_list_ = DeviceBuffer();
    blas_.reset();
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    cudnn_.reset();  // after the stream's work that may still use its workspace
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (cudaEvent_t e : timing_events_) cudaEventDestroy(e);
    for (const auto& w : waits_) {
      cudaEventDestroy(w.first);
      cudaEventDestroy(w.second);
    }
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init() {
    FT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    FT_RETURN_IF_ERROR(
        CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    FT_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                                  "cudaStreamCreate (copy stream)"));
    FT_ASSIGN_OR_RETURN(blas_, cuda::BlasLt::Create());
    return Synchronize();
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string Describe() const override { return "cuda:" + std::to_string(device_) + " (" + name_ + ")"; }

  void CopyToDevice(void* dst, const void* host_src, int64_t bytes) override {
    if (!status_.ok() || bytes <= 0) return;
    FT_TIME_OP(cuda_op::kCopyToDevice);
    Record(CudaStatus(
        cudaMemcpyAsync(dst, host_src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (host to device)"));
  }
  void CopyToHost(void* host_dst, const void* src, int64_t bytes) override {
    if (!status_.ok() || bytes <= 0) return;
    Record(CudaStatus(
        cudaMemcpyAsync(host_dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (device to host)"));
    Record(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  }
  void Copy(void* dst, const void* src, int64_t bytes) override {
    if (!status_.ok() || bytes <= 0) return;
    FT_TIME_OP(cuda_op::kCopy);
    Record(
        CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_),
                   "cudaMemcpyAsync (device to device)"));
  }
  void Copy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
              int64_t rows) override {
    if (!status_.ok() || width <= 0 || rows <= 0) return;
    FT_TIME_OP(cuda_op::kCopy);
    Record(CudaStatus(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src,
                                        static_cast<size_t>(src_pitch), static_cast<size_t>(width),
                                        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_),
                      "cudaMemcpy2DAsync (device to device)"));
  }
  void Zero(float* x, int64_t n) override {
    if (!status_.ok() || n <= 0) return;
    FT_TIME_OP(cuda_op::kZero);
    Record(CudaStatus(cudaMemsetAsync(x, 0, sizeof(float) * static_cast<size_t>(n), stream_),
                      "cudaMemsetAsync"));
  }
  void CopyToDeviceAsync(void* dst, const void* host_src, int64_t bytes) override {
    CopyOnCopyStream(dst, host_src, bytes, cudaMemcpyHostToDevice);
    stats_.to_device_bytes += bytes > 0 ? bytes : 0;
  }
  void CopyToHostAsync(void* host_dst, const void* src, int64_t bytes) override {
    CopyOnCopyStream(host_dst, src, bytes, cudaMemcpyDeviceToHost);
    stats_.to_host_bytes += bytes > 0 ? bytes : 0;
  }
  void WaitForCopies() override {
    if (!status_.ok() || !copies_pending_) return;
    cudaEvent_t done = NewEvent(false), before = NewEvent(true), after = NewEvent(true);
    Record(CudaStatus(cudaEventRecord(done, copy_stream_), "cudaEventRecord (copy stream)"));
    Record(CudaStatus(cudaEventRecord(before, stream_), "cudaEventRecord"));
    Record(CudaStatus(cudaStreamWaitEvent(stream_, done, 0), "cudaStreamWaitEvent"));
    Record(CudaStatus(cudaEventRecord(after, stream_), "cudaEventRecord"));
    free_events_.push_back(done);  // reusable once recorded again: the wait has captured it
    waits_.emplace_back(before, after);
    copies_pending_ = false;
    // Timing pairs are recycled when read: read them now and then even if nobody asks.
    if (waits_.size() >= kMaxPendingWaits) copy_stats();
  }
  CopyStats copy_stats() override {
    if (Synchronize().ok()) {
      for (const auto& w : waits_) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, w.first, w.second) == cudaSuccess) stats_.wait_seconds += ms * 1e-3;
        timing_events_.push_back(w.first);
        timing_events_.push_back(w.second);
      }
      waits_.clear();
    }
    return stats_;
  }
  Status Synchronize() override {
    if (status_.ok() && copy_stream_ != nullptr)
      Record(CudaStatus(cudaStreamSynchronize(copy_stream_), "cudaStreamSynchronize (copy stream)"));
    if (status_.ok()) Record(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    if (status_.ok() && times_.enabled()) times_.Resolve();
    return status_;
  }
  StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() override {
    size_t free_bytes = 0, total_bytes = 0;
    FT_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    return std::make_pair(static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes));
  }

  void Gemm(GemmOperands operands, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            ConstAct A, int64_t lda, ConstAct B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    if (!status_.ok() || M == 0 || N == 0) return;
    if (K == 0) {  // cuBLASLt refuses K = 0; C = beta * C is what the CPU computes
      if (beta == 0.0f) {
        for (int64_t i = 0; i < M; ++i) Zero(C + i * ldc, N);
      } else {
        for (int64_t i = 0; i < M; ++i) Scale(N, beta, C + i * ldc);
      }
      return;
    }
    if (operands == GemmOperands::kF32) {
      // A 16-bit stored operand of an fp32 GEMM (the loss head's) is widened first.
      const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
      const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
      const float* a = StagedOperand(A, a_rows, a_cols, &lda, 0);
      const float* b = StagedOperand(B, b_rows, b_cols, &ldb, 1);
      if (!status_.ok()) return;
      FT_TIME_OP(cuda_op::kGemmF32);
      Record(
          blas_->Gemm<float, float>(stream_, trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc));
      return;
    }
    if (operands == GemmOperands::kF16) {
      LowPrecisionGemm<cuda::fp16>(cuda_op::kOperandsToF16, cuda_op::kGemmF16, trans_a, trans_b, M, N, K,
                                   alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
      LowPrecisionGemm<cuda::bf16>(cuda_op::kOperandsToBf16, cuda_op::kGemmBf16, trans_a, trans_b, M, N, K,
                                   alpha, A, lda, B, ldb, beta, C, ldc);
    }
  }
  // bf16/fp16 operands (Operand16), then cuBLASLt 16-bit x 16-bit -> fp32 (fp32 compute).
  template <typename T>
  void LowPrecisionGemm(const char* convert_name, const char* gemm_name, bool trans_a, bool trans_b,
                        int64_t M, int64_t N, int64_t K, float alpha, ConstAct A, int64_t lda, ConstAct B,
                        int64_t ldb, float beta, float* C, int64_t ldc) {
    const T* a16 = Operand16<T>(convert_name, A, trans_a ? K : M, trans_a ? M : K, &lda, a16_ws_, 0);
    const T* b16 = Operand16<T>(convert_name, B, trans_b ? N : K, trans_b ? K : N, &ldb, b16_ws_, 1);
    if (!status_.ok()) return;
    FT_TIME_OP(gemm_name);
    Record(
        blas_->Gemm<T, float>(stream_, trans_a, trans_b, M, N, K, alpha, a16, lda, b16, ldb, beta, C, ldc));
  }
  // A GEMM operand x [rows, cols] (row stride *ld) as T: read in place when stored in T; else
  // rounded into a packed copy in `ws` (then *ld = cols), from fp32 or, for the other 16-bit type
  // (not made by the model), through an fp32 staging copy.
  template <typename T>
  const T* Operand16(const char* convert_name, ConstAct x, int64_t rows, int64_t cols, int64_t* ld,
                     DeviceBuffer& ws, int slot) {
    const ActDType t = std::is_same_v<T, cuda::bf16> ? ActDType::kBF16 : ActDType::kF16;
    if (x.dtype == t) return x.as<T>();
    const float* x32 = StagedOperand(x, rows, cols, ld, slot);
    auto* out = reinterpret_cast<T*>(Workspace(ws, rows * cols * 2));
    if (!status_.ok()) return nullptr;
    FT_TIME_OP(convert_name);
    ToLowPrecisionKernel<T>
        <<<BlocksFor(rows * cols, kThreads), kThreads, 0, stream_>>>(x32, rows, cols, *ld, out);
    Record(LaunchStatus(convert_name));
    *ld = cols;
    return out;
  }
  void RmsNormForward(ConstAct x, const float* w, int64_t rows, int64_t D, float eps, Act y,
                      float* rstd) override {
    if (!SameStorage("RmsNormForward", {x.dtype, y.dtype})) return;
    FT_TIME_OP(cuda_op::kRmsNormForward);
    WithStorage(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record(cuda::RmsNormForward(x.as<T>(), w, rows, D, eps, y.as<T>(), rstd, stream_));
    });
  }
  void RmsNormBackward(ConstAct x, const float* w, const float* rstd, ConstAct dy, int64_t rows, int64_t D,
                       float* dx, float* dw) override {
    if (!GradientStorage("RmsNormBackward", x.dtype, dy.dtype)) return;
    FT_TIME_OP(cuda_op::kRmsNormBackward);
    float* ws = nullptr;
    if (dw != nullptr) ws = Workspace(rms_ws_, cuda::RmsNormBackwardWorkspaceFloats(rows, D) * 4);
    if (!status_.ok()) return;
    WithStorageAndGradient(x.dtype, dy.dtype, [&](auto tag, auto grad_tag) {
      using T = typename decltype(tag)::type;
      using G = typename decltype(grad_tag)::type;
      Record(cuda::RmsNormBackward(x.as<T>(), w, rstd, dy.as<G>(), rows, D, dx, dw, ws, stream_));
    });
  }
  void RopeApply(Act x, int64_t rows, int64_t heads, int64_t hd, int64_t rotary, const int32_t* positions,
                 const float* cos_table, const float* sin_table, bool inverse) override {
    if (!status_.ok()) return;
    FT_TIME_OP(cuda_op::kRope);
    WithStorage(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record(cuda::RopeApply(x.as<T>(), rows, heads, hd, positions, cos_table, sin_table, inverse, stream_,
                             rotary));
    });
  }
  static cuda::AttentionMath Math(GemmOperands operands) {
    return operands == GemmOperands::kBF16 ? cuda::AttentionMath::kBf16 : cuda::AttentionMath::kFp32;
  }
  Status SetAttentionRoute(AttentionRouteRequest request) override {
    attention_request_ = request;
    int major = 0, minor = 0;
    FT_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_),
                                  "cudaDeviceGetAttribute"));
    FT_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_),
                                  "cudaDeviceGetAttribute"));
    sm_ = major * 10 + minor;
    if (request == AttentionRouteRequest::kOurs || cudnn_ != nullptr) return Status::OK();
    if (request == AttentionRouteRequest::kAuto && !CudnnMeasuredFaster(name_)) return Status::OK();
    FT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    auto created = cuda::CudnnAttention::Create();
    if (created.ok()) {
      cudnn_ = std::move(*created);
    } else {
      cudnn_missing_ = created.status().message();
    }
    // An explicit cudnn whose library is missing is refused now, not at the first step.
    if (request == AttentionRouteRequest::kCudnn && cudnn_ == nullptr)
      return created.status().WithContext("train.attention: cudnn");
    return Status::OK();
  }
  // Whether this call runs cuDNN's route (attention_route.h decides; its
  // refusal of an explicit cudnn is recorded). Prepares cuDNN's documents when it does.
  bool CudnnRoute(const cpu::AttentionShape& s, ActDType storage, const int32_t* segments) {
    if (attention_request_ == AttentionRouteRequest::kOurs || !status_.ok()) return false;
    AttentionRouteFacts f;
    f.cudnn_loaded = cudnn_ != nullptr;
    f.cudnn_missing = cudnn_missing_;
    f.cudnn_version = cuda::CudnnAttention::LoadedVersion(nullptr);
    f.sm = sm_;
    f.gpu = name_;
    f.shape = s;
    f.storage = storage == ActDType::kF32    ? AttentionStorage::kF32
                : storage == ActDType::kBF16 ? AttentionStorage::kBF16
                                             : AttentionStorage::kF16;
    f.segments = segments != nullptr;
    f.documents = s.batch;
    f.max_doc_len = s.seq;
    if (cudnn_ != nullptr && ShapeFitsCudnn(f)) {
      auto docs = cudnn_->Prepare(s, segments, stream_);
      if (!docs.ok()) {
        Record(docs.status());
        return false;
      }
      f.documents = docs->batch;
      f.max_doc_len = docs->seq;
      f.workspace_budget_bytes = cudnn_->workspace_budget_bytes;
    }
    auto route = ChooseAttentionRoute(attention_request_, f);
    if (!route.ok()) {
      Record(route.status());
      return false;
    }
    return *route == AttentionRoute::kCudnn;
  }
  // Whether cuDNN would take the call apart from its documents (so Prepare's cost is paid only then).
  static bool ShapeFitsCudnn(AttentionRouteFacts f) {
    f.documents = 0;
    return CudnnAttentionRefusal(f).ok();
  }
  void AttentionForward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q, ConstAct k,
                        ConstAct v, const int32_t* segments, Act out, float* lse,
                        bool /*naive: flash only*/) override {
    if (!SameStorage("AttentionForward", {q.dtype, k.dtype, v.dtype, out.dtype})) return;
    FT_TIME_OP(cuda_op::kAttentionForward);
    if (CudnnRoute(s, q.dtype, segments)) {
      WithHalfStorage(q.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        Record(cudnn_->Forward(s, q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse, stream_));
      });
      return;
    }
    if (!status_.ok()) return;
    WithStorage(q.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record(cuda::AttentionForward(s, q.as<T>(), k.as<T>(), v.as<T>(), segments, out.as<T>(), lse, stream_,
                                    Math(operands)));
    });
  }
  void AttentionBackward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q, ConstAct k,
                         ConstAct v, const int32_t* segments, ConstAct out, const float* lse,
                         const float* dout, float* dq, float* dk, float* dv) override {
    if (!SameStorage("AttentionBackward", {q.dtype, k.dtype, v.dtype, out.dtype})) return;
    FT_TIME_OP(cuda_op::kAttentionBackward);
    if (CudnnRoute(s, q.dtype, segments)) {
      WithHalfStorage(q.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        Record(cudnn_->Backward(s, q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse, dout, dq, dk, dv,
                                stream_));
      });
      return;
    }
    if (!status_.ok()) return;
    float* ws = Workspace(att_ws_, cuda::AttentionBackwardWorkspaceFloats(s) * 4);
    if (!status_.ok()) return;
    WithStorage(q.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record(cuda::AttentionBackward(s, q.as<T>(), k.as<T>(), v.as<T>(), segments, out.as<T>(), lse, dout, dq,
                                     dk, dv, ws, stream_, Math(operands)));
    });
  }
  void GluForward(Activation act, ConstAct gate, ConstAct up, int64_t n, Act h) override {
    if (!SameStorage("GluForward", {gate.dtype, up.dtype, h.dtype})) return;
    const bool silu = act == Activation::kSilu;
    FT_TIME_OP(silu ? cuda_op::kSwiGluForward : cuda_op::kGeluGluForward);
    WithStorage(gate.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record((silu ? cuda::SwiGluForward<T> : cuda::GeluTanhGluForward<T>)(gate.as<T>(), up.as<T>(), n,
                                                                           h.as<T>(), stream_));
    });
  }
  void GluBackward(Activation act, ConstAct gate, ConstAct up, ConstAct dh, int64_t n, Act dgate,
                   Act dup) override {
    if (!SameStorage("GluBackward", {gate.dtype, up.dtype}) ||
        !SameStorage("GluBackward", {dh.dtype, dgate.dtype, dup.dtype}) ||
        !GradientStorage("GluBackward", gate.dtype, dh.dtype)) {
      return;
    }
    const bool silu = act == Activation::kSilu;
    FT_TIME_OP(silu ? cuda_op::kSwiGluBackward : cuda_op::kGeluGluBackward);
    WithStorageAndGradient(gate.dtype, dh.dtype, [&](auto tag, auto grad_tag) {
      using T = typename decltype(tag)::type;
      using G = typename decltype(grad_tag)::type;
      Record((silu ? cuda::SwiGluBackward<T, G>
                   : cuda::GeluTanhGluBackward<T, G>)(gate.as<T>(), up.as<T>(), dh.as<G>(), n, dgate.as<G>(),
                                                      dup.as<G>(), stream_));
    });
  }
  void EmbeddingForward(ConstAct table, const int32_t* ids, int64_t rows, int64_t D, Act out) override {
    if (!status_.ok() || rows * D <= 0) return;
    if (table.dtype != ActDType::kF32) {  // a 16-bit table: its rows of codes, gathered as they are
      if (table.dtype != out.dtype) {
        Record(Status::InvalidArgument("EmbeddingForward: a 16-bit table needs an output of its type"));
        return;
      }
      FT_TIME_OP(cuda_op::kEmbeddingForward16);
      GatherRows16Kernel<<<BlocksFor(rows * D, kThreads), kThreads, 0, stream_>>>(
          table.as<uint16_t>(), ids, rows, D, out.as<uint16_t>());
      Record(LaunchStatus("GatherRows16Kernel"));
      return;
    }
    FT_TIME_OP(cuda_op::kEmbeddingForward);  // an fp32 table's rows, rounded to out's type
    WithStorage(out.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record(cuda::EmbeddingForward(table.as<float>(), ids, rows, D, out.as<T>(), stream_));
    });
  }
  void EmbeddingBackward(const float* dout, const int32_t* ids, int64_t rows, int64_t D,
                         float* dtable) override {
    if (!status_.ok()) return;
    FT_TIME_OP(cuda_op::kEmbeddingBackward);
    Record(cuda::EmbeddingBackward<float>(dout, ids, rows, D, dtable, stream_));
  }
  void CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V, float grad_scale,
                    float* dlogits, double* loss_sum, float softcap) override {
    if (!status_.ok()) return;
    FT_TIME_OP(cuda_op::kCrossEntropy);
    float* row_loss = Workspace(row_loss_, rows * 4);
    if (!status_.ok()) return;
    Record(cuda::CrossEntropy<float>(logits, targets, rows, V, grad_scale, dlogits, row_loss, loss_sum,
                                     stream_, softcap));
  }
  void DequantizeNf4(const cpu::Nf4Layout& layout, const void* blob, Act out) override {
    if (!status_.ok()) return;
    FT_TIME_OP(cuda_op::kNf4Dequantize);
    const auto* base = static_cast<const uint8_t*>(blob);
    cuda::Nf4DeviceTensor t;
    t.n = layout.n;
    t.config = layout.config;
    t.offset = layout.offset;
    t.packed = base;
    if (layout.config.double_quant) {
      t.absmax_q = base + layout.absmax_at;
      t.absmax2 = reinterpret_cast<const float*>(base + layout.absmax2_at);
    } else {
      t.absmax = reinterpret_cast<const float*>(base + layout.absmax_at);
    }
    // 16-bit: each value computed in fp32 as the fp32 kernel does, stored rounded to nearest even.
    WithStorage(out.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record(cuda::DequantizeNf4(t, out.as<T>(), stream_));
    });
  }

  void Axpy(int64_t n, float alpha, ConstAct x, float* y) override {
    if (!status_.ok() || n <= 0) return;
    FT_TIME_OP(cuda_op::kAxpy);
    WithStorage(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record(cuda::Axpy(n, alpha, x.as<T>(), y, stream_));
    });
  }
  void Scale(int64_t n, float alpha, float* x) override {
    if (!status_.ok() || n <= 0) return;
    FT_TIME_OP(cuda_op::kScale);
    Record(cuda::Scale<float>(n, alpha, x, stream_));
  }
  void SoftCap(int64_t n, float cap, float* x) override {
    if (!status_.ok() || n <= 0) return;
    FT_TIME_OP(cuda_op::kSoftCap);
    Record(cuda::SoftCap(n, cap, x, stream_));
  }
  void AddBias(float* y, const float* bias, int64_t rows, int64_t n) override {
    if (!status_.ok() || rows * n <= 0) return;
    FT_TIME_OP(cuda_op::kBiasAdd);
    AddBiasKernel<<<BlocksFor(rows * n, kThreads), kThreads, 0, stream_>>>(y, bias, rows, n);
    Record(LaunchStatus("AddBiasKernel"));
  }
  void BiasGrad(ConstAct dy, int64_t rows, int64_t n, float* dbias) override {
    if (!status_.ok() || n <= 0) return;
    FT_TIME_OP(cuda_op::kBiasGrad);
    WithStorage(dy.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      BiasGradKernel<<<BlocksFor(n, kThreads), kThreads, 0, stream_>>>(dy.as<T>(), rows, n, dbias);
    });
    Record(LaunchStatus("BiasGradKernel"));
  }
  void RoundToBf16(float* x, int64_t n) override { RoundInPlace<cuda::bf16>(x, n, cuda_op::kRoundBf16); }
  void RoundToFp16(float* x, int64_t n) override { RoundInPlace<cuda::fp16>(x, n, cuda_op::kRoundF16); }
  template <typename T>
  void RoundInPlace(float* x, int64_t n, const char* name) {
    if (!status_.ok() || n <= 0) return;
    FT_TIME_OP(name);
    RoundInPlaceKernel<T><<<BlocksFor(n, kThreads), kThreads, 0, stream_>>>(x, n);
    Record(LaunchStatus(name));
  }
  void LinearOutput(int64_t rows, int64_t n, int64_t r, float alpha, ConstAct xa, ConstAct b, float* c,
                    const ConstAct* residual, Act y) override {
    if (!status_.ok()) return;
    if (r > 0 && !SameStorage("LinearOutput", {xa.dtype, b.dtype, y.dtype})) return;
    if (residual != nullptr && !SameStorage("LinearOutput", {residual->dtype, y.dtype})) return;
    FT_TIME_OP(cuda_op::kLinearOutput);
    WithStorage(y.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, float>) {
        Record(Status::InvalidArgument("LinearOutput stores a 16-bit y; got fp32"));
      } else {
        Record(cuda::LinearOutput<T>(rows, n, r, alpha, xa.as<T>(), b.as<T>(), c,
                                     residual != nullptr ? residual->as<T>() : nullptr, y.as<T>(), stream_));
      }
    });
  }
  void Convert(ConstAct x, int64_t n, Act out) override {
    if (!status_.ok() || n <= 0) return;
    if (x.dtype == out.dtype) {
      Copy(out.data, x.data, n * ActDTypeBytes(x.dtype));
      return;
    }
    FT_TIME_OP(cuda_op::kConvert);
    const unsigned blocks = BlocksFor(n, kThreads);
    if (x.dtype == ActDType::kF32 && out.dtype == ActDType::kBF16) {
      ToLowPrecisionKernel<cuda::bf16>
          <<<blocks, kThreads, 0, stream_>>>(x.as<float>(), 1, n, n, out.as<cuda::bf16>());
    } else if (x.dtype == ActDType::kF32 && out.dtype == ActDType::kF16) {
      ToLowPrecisionKernel<cuda::fp16>
          <<<blocks, kThreads, 0, stream_>>>(x.as<float>(), 1, n, n, out.as<cuda::fp16>());
    } else if (x.dtype == ActDType::kBF16 && out.dtype == ActDType::kF32) {
      ToFloatKernel<cuda::bf16>
          <<<blocks, kThreads, 0, stream_>>>(x.as<cuda::bf16>(), 1, n, n, out.as<float>());
    } else if (x.dtype == ActDType::kF16 && out.dtype == ActDType::kF32) {
      ToFloatKernel<cuda::fp16>
          <<<blocks, kThreads, 0, stream_>>>(x.as<cuda::fp16>(), 1, n, n, out.as<float>());
    } else {
      Record(Status::InvalidArgument(std::string("Convert: ") + ActDTypeName(x.dtype) + " to " +
                                     ActDTypeName(out.dtype) + " is not a conversion the engine makes"));
      return;
    }
    Record(LaunchStatus("Convert"));
  }
  void Dropout(const DropoutKey& key, ConstAct x, int64_t rows, int64_t in, float* out) override {
    WithStorage(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      LaunchDropout(key, x.as<T>(), rows, in, out, false);
    });
  }
  void DropoutBackwardAdd(const DropoutKey& key, const float* d, int64_t rows, int64_t in,
                          float* dx) override {
    LaunchDropout(key, d, rows, in, dx, true);
  }
  // Every tensor's total in one multi-tensor pass (two launches), read at once and added in the
  // list's order from the first: the sum the per-tensor kernels chained on the device gave. The
  // device list of tensors is uploaded only when it changes (the optimizer passes the same each step).
  double SumSquares(const std::vector<FloatRange>& tensors) override {
    if (!status_.ok() || tensors.empty()) return 0.0;
    const auto count = static_cast<int64_t>(tensors.size());
    if (tensors != ss_list_host_) {
      std::vector<cuda::TensorSpan<float>> spans;
      for (const FloatRange& t : tensors) spans.push_back({t.data, t.n});
      const auto bytes = static_cast<int64_t>(spans.size() * sizeof(spans[0]));
      Workspace(ss_list_, bytes);
      CopyToDevice(ss_list_.data(), spans.data(), bytes);
      ss_list_host_ = tensors;
    }
    auto* ws = reinterpret_cast<double*>(
        Workspace(ss_ws_, (cuda::SumSquaresListWorkspaceDoubles(count) + count) * int64_t{sizeof(double)}));
    if (!status_.ok()) return 0.0;
    double* totals = ws + cuda::SumSquaresListWorkspaceDoubles(count);
    {
      FT_TIME_OP(cuda_op::kSumSquares);
      Record(cuda::SumSquaresList<float>(ss_list_.as<cuda::TensorSpan<float>>(), count, ws, totals, stream_));
    }
    std::vector<double> host(tensors.size(), 0.0);
    CopyToHost(host.data(), totals, count * int64_t{sizeof(double)});
    double sum = host[0];
    for (size_t i = 1; i < host.size(); ++i) sum += host[i];
    return sum;
  }
  // The 16-bit copy is stored by the update's own kernel (no pass of its own).
  void AdamW(const cpu::AdamWParams& hp, int64_t n, float* param, const float* grad, float* m, float* v,
             Act copy) override {
    if (!status_.ok() || n <= 0) return;
    FT_TIME_OP(cuda_op::kAdamW);
    WithStorage(copy.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Record(cuda::AdamW<T>(hp, n, param, grad, m, v, copy.as<T>(), nullptr, nullptr, stream_));
    });
  }

 protected:
  void* RawAlloc(int64_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) allocation error
      return nullptr;
    }
    // Zeroed before any later op on the stream reads it.
    Record(CudaStatus(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_), "cudaMemsetAsync"));
    return p;
  }
  void RawFree(void* p) override {
    // Ops and copies still queued may read the memory: wait for them (cudaFree would too).
    cudaStreamSynchronize(copy_stream_);
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  void* RawAllocHost(int64_t bytes) override {
    void* p = nullptr;
    if (cudaMallocHost(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    std::memset(p, 0, static_cast<size_t>(bytes));
    return p;
  }
  void RawFreeHost(void* p) override {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamSynchronize(stream_);
    cudaFreeHost(p);
  }

 private:
  void Record(Status s) {
    if (status_.ok() && !s.ok()) status_ = std::move(s);
  }
  // An event from its pool (timing events record timestamps; ordering ones do not).
  cudaEvent_t NewEvent(bool timing) {
    std::vector<cudaEvent_t>& pool = timing ? timing_events_ : free_events_;
    cudaEvent_t e = nullptr;
    if (!pool.empty()) {
      e = pool.back();
      pool.pop_back();
      return e;
    }
    Record(CudaStatus(timing ? cudaEventCreate(&e) : cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                      "cudaEventCreate"));
    return e;
  }
  // A copy-stream transfer ordered after everything called on the compute stream so far.
  void CopyOnCopyStream(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind) {
    if (!status_.ok() || bytes <= 0) return;
    cudaEvent_t issued = NewEvent(false);
    Record(CudaStatus(cudaEventRecord(issued, stream_), "cudaEventRecord"));
    Record(CudaStatus(cudaStreamWaitEvent(copy_stream_, issued, 0), "cudaStreamWaitEvent (copy stream)"));
    Record(CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, copy_stream_),
                      "cudaMemcpyAsync (copy stream)"));
    free_events_.push_back(issued);
    copies_pending_ = true;
  }
  // Typed storage (issue #33): every op reads and writes its 16-bit activations in place
  // (kernels/cuda's <T, P> ops: fp32 math, each value rounded once where it is stored), so the
  // values are the ones an fp32 kernel over the widened tensors, narrowed afterwards, gave: the
  // CPU backend's. An op's activations share one storage type (the model's activation dtype);
  // SameStorage refuses a mix, naming the op.
  bool SameStorage(const char* op, std::initializer_list<ActDType> types) {
    if (!status_.ok()) return false;
    for (ActDType t : types) {
      if (t != *types.begin()) {
        Record(Status::InvalidArgument(std::string(op) +
                                       ": its activations must share one storage type, got " +
                                       ActDTypeName(*types.begin()) + " and " + ActDTypeName(t)));
        return false;
      }
    }
    return true;
  }
  // A gradient `g` that goes with activations of `t`: fp32, or stored as they are (backend.h).
  bool GradientStorage(const char* op, ActDType t, ActDType g) {
    if (!status_.ok()) return false;
    if (g == ActDType::kF32 || g == t) return true;
    Record(Status::InvalidArgument(std::string(op) + ": a gradient is fp32 or stored as its activations (" +
                                   ActDTypeName(t) + "), got " + ActDTypeName(g)));
    return false;
  }
  // Calls f(StorageTag<T>{}) with T the CUDA type of storage `t`: float, bf16 or fp16.
  template <typename T>
  struct StorageTag {
    using type = T;
  };
  // The 16-bit storage types only (cuDNN's route; attention_route.h refuses fp32 before it).
  template <typename F>
  static void WithHalfStorage(ActDType t, F&& f) {
    if (t == ActDType::kF16) {
      f(StorageTag<cuda::fp16>{});
    } else {
      f(StorageTag<cuda::bf16>{});
    }
  }
  template <typename F>
  static void WithStorage(ActDType t, F&& f) {
    switch (t) {
      case ActDType::kF32: f(StorageTag<float>{}); return;
      case ActDType::kBF16: f(StorageTag<cuda::bf16>{}); return;
      case ActDType::kF16: f(StorageTag<cuda::fp16>{}); return;
    }
  }
  // Calls f(StorageTag<T>{}, StorageTag<G>{}): T of storage `t`, G a gradient's, `g` (fp32, or T:
  // the only pairs GradientStorage lets through).
  template <typename F>
  static void WithStorageAndGradient(ActDType t, ActDType g, F&& f) {
    WithStorage(t, [&](auto tag) {
      if (g == ActDType::kF32) return f(tag, StorageTag<float>{});
      f(tag, tag);
    });
  }
  // A GEMM operand [rows, cols] (row stride *ld) as fp32: itself, or widened
  // packed into staging workspace (then *ld = cols).
  const float* StagedOperand(ConstAct x, int64_t rows, int64_t cols, int64_t* ld, int slot) {
    if (x.dtype == ActDType::kF32) return x.as<float>();
    float* tmp = Workspace(stage_ws_[slot], rows * cols * 4);
    if (!status_.ok()) return nullptr;
    FT_TIME_OP(cuda_op::kOperandToF32);
    if (x.dtype == ActDType::kBF16) {
      ToFloatKernel<cuda::bf16><<<BlocksFor(rows * cols, kThreads), kThreads, 0, stream_>>>(
          x.as<cuda::bf16>(), rows, cols, *ld, tmp);
    } else {
      ToFloatKernel<cuda::fp16><<<BlocksFor(rows * cols, kThreads), kThreads, 0, stream_>>>(
          x.as<cuda::fp16>(), rows, cols, *ld, tmp);
    }
    Record(LaunchStatus("ToFloatKernel"));
    *ld = cols;
    return tmp;
  }
  // `buf` grown to at least `bytes` (tracked as workspace); nullptr for 0 bytes.
  float* Workspace(DeviceBuffer& buf, int64_t bytes) {
    if (bytes <= 0) return nullptr;
    if (buf.bytes() < bytes) {
      buf = DeviceBuffer();  // waits for queued users of the old one
      buf = AllocBytes(bytes, MemCategory::kWorkspace);
    }
    return buf.data();
  }
  template <typename T>
  void LaunchDropout(const DropoutKey& key, const T* x, int64_t rows, int64_t in, float* out, bool add) {
    if (!status_.ok() || rows * in <= 0) return;
    FT_TIME_OP(cuda_op::kDropout);
    const float keep_scale = static_cast<float>(1.0 / (1.0 - key.p));
    DropoutKernel<T>
        <<<BlocksFor(rows * in, kThreads), kThreads, 0, stream_>>>(key, keep_scale, x, rows, in, out, add);
    Record(LaunchStatus("DropoutKernel"));
  }

  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;      // memory-technique transfers (CopyTo*Async)
  bool copies_pending_ = false;             // transfers issued since the last WaitForCopies
  std::vector<cudaEvent_t> free_events_;    // ordering events, reusable
  std::vector<cudaEvent_t> timing_events_;  // timing events whose pair was read, reusable
  static constexpr size_t kMaxPendingWaits = 4096;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> waits_;  // timing pairs around each stall
  CopyStats stats_;
  std::unique_ptr<cuda::BlasLt> blas_;
  Status status_;
  CudaOpTimes times_;
  DeviceBuffer rms_ws_, att_ws_, row_loss_, ss_ws_, ss_list_, a16_ws_, b16_ws_;
  std::vector<FloatRange> ss_list_host_;  // what ss_list_ holds (SumSquares' tensors)
  DeviceBuffer stage_ws_[2];              // the fp32 GEMM's 16-bit operands, widened (StagedOperand)
  // Attention's route (SetAttentionRoute): cuDNN's, when asked for and loaded, else why not.
  AttentionRouteRequest attention_request_ = AttentionRouteRequest::kOurs;
  std::unique_ptr<cuda::CudnnAttention> cudnn_;
  std::string cudnn_missing_ = "not requested";
  int sm_ = 0;  // compute capability, major * 10 + minor
};

}  // namespace

StatusOr<std::shared_ptr<Backend>> CreateCudaBackend() {
  std::string reason;
  FT_ASSIGN_OR_RETURN(std::vector<cuda::DeviceInfo> devices, cuda::QueryDevices(&reason));
  if (devices.empty()) return Status::FailedPrecondition("no CUDA device: " + reason);
  auto backend = std::make_shared<CudaBackend>(devices[0].index, devices[0].name);
  FT_RETURN_IF_ERROR(backend->Init());
  return std::shared_ptr<Backend>(std::move(backend));
}

}  // namespace ft
