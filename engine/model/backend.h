// The device the model runs on: what engine/model/model.cc needs from a backend.
//
// The model's forward and backward are written once, against this interface;
// a backend supplies memory on its device and the ops (the same ops, with the
// same definitions, as kernels/cpu/ops.h, which is the reference every backend
// is checked against). Two implementations:
//   - CpuBackend (engine/model/cpu_backend.cc, always built): "device" memory is
//     host memory and every op forwards to kernels/cpu. It is the reference:
//     deterministic and bit-identical to calling kernels/cpu directly.
//   - CudaBackend (engine/model/cuda_backend.cu, built when FT_HAVE_CUDA): memory
//     from cudaMalloc, ops from kernels/cuda, enqueued on one stream.
//
// Conventions
//   - Every pointer an op takes ("device pointer") points into memory of this
//     backend: a DeviceBuffer from Alloc(), or, for the integer inputs of a
//     micro-batch (ids, targets, positions, segments), a DeviceBuffer filled
//     with CopyToDevice. Only CopyToDevice/CopyToHost take host pointers.
//     On the CPU backend device and host memory are the same, so host
//     pointers work everywhere; code meant for every backend must not rely
//     on it.
//   - Storage: weights' masters, gradients and optimizer states are fp32.
//     Activations are typed (Act / ConstAct: a pointer and its ActDType): with
//     ComputeDType::kBF16 (kF16) the model keeps the tensors it saves for the
//     backward (and the layer inputs, the KV cache) as 16-bit codes, half the
//     bytes; an op reads them exactly, computes in fp32 and stores its typed
//     output rounded to nearest even. The gradients where PyTorch keeps bf16
//     tensors (a layer's input and output gradients, SwiGLU's, each
//     linear's output gradient) are stored in the
//     activations' dtype too, and the ops that read them take them typed;
//     what GEMMs accumulate into (a linear's input gradient, the sums of
//     branches) stays an fp32 workspace, stored 16-bit once (Convert) where
//     PyTorch's tensor is. Every backend stores the same types (the CPU one
//     included), so a CPU run has the bytes and rounding points of a GPU one.
//   - Ordering: ops and copies run in the order they are called (one stream
//     per backend). Ops return without waiting; CopyToHost and Synchronize
//     wait for everything before them.
//   - Errors: ops return void so the model reads like the math. A backend
//     whose ops can fail (the CUDA one: a launch error, an unsupported shape)
//     records the FIRST failure; later ops are skipped, and Synchronize()
//     returns it (and keeps returning it: the backend is then unusable). The
//     CPU backend never fails; shape mismatches are caller bugs (FT_CHECK)
//     on every backend.
//   - Memory: every byte is counted by a MemoryTracker under a MemCategory,
//     as engine/model/memory.h's Buffer is, so the planner's figures and the
//     tracked peak stay comparable whatever the device.
//
// Thread safety: one thread at a time per backend (like a Model).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/device_kind.h"
#include "common/status.h"
#include "engine/model/activation.h"
#include "engine/model/attention_route.h"
#include "engine/model/memory.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/ops.h"

namespace ft {

class Backend;

// The storage type of an activation: fp32, or bf16 / fp16 codes (2 bytes).
enum class ActDType { kF32, kBF16, kF16 };
int64_t ActDTypeBytes(ActDType t);
const char* ActDTypeName(ActDType t);  // "fp32", "bf16", "fp16"

// An activation tensor in backend memory: where it starts and how its
// elements are stored. Made implicitly from a float* (an fp32 tensor), so
// fp32 code reads as before.
struct Act {
  void* data = nullptr;
  ActDType dtype = ActDType::kF32;
  Act() = default;            // none (data nullptr)
  Act(float* p) : data(p) {}  // NOLINT(google-explicit-constructor): fp32 is the common case
  Act(void* p, ActDType t) : data(p), dtype(t) {}
  // The tensor from element `i` on.
  Act At(int64_t i) const { return Act(static_cast<char*>(data) + i * ActDTypeBytes(dtype), dtype); }
  template <typename S>
  S* as() const {
    return static_cast<S*>(data);
  }
};
struct ConstAct {
  const void* data = nullptr;
  ActDType dtype = ActDType::kF32;
  ConstAct(const float* p) : data(p) {}              // NOLINT(google-explicit-constructor)
  ConstAct(Act a) : data(a.data), dtype(a.dtype) {}  // NOLINT(google-explicit-constructor)
  ConstAct(const void* p, ActDType t) : data(p), dtype(t) {}
  ConstAct At(int64_t i) const {
    return ConstAct(static_cast<const char*>(data) + i * ActDTypeBytes(dtype), dtype);
  }
  template <typename S>
  const S* as() const {
    return static_cast<const S*>(data);
  }
};

// n floats of backend memory from `data` (one tensor of a list an op reads).
struct FloatRange {
  const float* data = nullptr;
  int64_t n = 0;
};
// The same span of memory (spelled out: CUDA sources compile as C++17).
inline bool operator==(const FloatRange& a, const FloatRange& b) { return a.data == b.data && a.n == b.n; }
inline bool operator!=(const FloatRange& a, const FloatRange& b) { return !(a == b); }

// A tracked allocation of a backend's memory (floats, or raw bytes for
// integer inputs and NF4 codes). Zero-initialised, move-only; returns its
// bytes to the backend and the tracker when destroyed. The backend must
// outlive its buffers.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // The storage as floats (n = bytes / 4) or as another element type.
  float* data() { return static_cast<float*>(ptr_); }
  const float* data() const { return static_cast<const float*>(ptr_); }
  template <typename T>
  T* as() {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }
  int64_t size() const { return bytes_ / static_cast<int64_t>(sizeof(float)); }  // floats
  bool empty() const { return bytes_ == 0; }
  // Host memory from Backend::AllocHost rather than device memory.
  bool host() const { return host_; }

 private:
  friend class Backend;
  void Release();

  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
  bool host_ = false;
  MemCategory category_ = MemCategory::kWorkspace;
  MemoryTracker* tracker_ = nullptr;
  Backend* backend_ = nullptr;
};

// Where a LoRA dropout mask comes from: a pure function of these keys and the
// element (engine/model/rng.h), so every backend draws the same mask.
struct DropoutKey {
  double p = 0;                // drop probability, in (0, 1)
  uint64_t seed = 0;           // LoraSpec::seed
  int64_t first_sequence = 0;  // MicroBatch::first_sequence
  int64_t seq = 1;             // MicroBatch::seq
  uint64_t module_key = 0;     // layer * kNumModules + module
};

// How a GEMM takes its operands: as their values are (true fp32 products), or
// each fp32-stored one rounded to bf16 (fp16) first (round-to-nearest-even;
// a 16-bit stored operand is already such a value).
// bf16 and fp16 products are exact in fp32 and accumulate in fp32, so kBF16
// (kF16) is the tensor-core GEMM of torch.autocast(bfloat16 / float16) on
// every backend: backends differ only in the order of the fp32 sums.
enum class GemmOperands { kF32, kBF16, kF16 };

// Bytes moved by a backend's copy stream so far, and how long its ops waited
// for those copies: the overlap of the memory techniques made visible.
struct CopyStats {
  int64_t to_device_bytes = 0;
  int64_t to_host_bytes = 0;
  // CUDA: time the compute stream stalled in WaitForCopies (events around each
  // wait); CPU: the time the copies themselves took (they run inline, so every
  // byte is waited for).
  double wait_seconds = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  // "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string Describe() const = 0;
  // Which flash attention AttentionForward/Backward run from now on
  // (job.yaml's train.attention; engine/model/attention_route.h). OK, or
  // FailedPrecondition naming why this backend cannot honour `request`: the
  // CPU backends have only their own attention, so kCudnn is refused there
  // (kAuto and kOurs run it). The CUDA backend checks each call's facts and
  // refuses one that cuDNN cannot take, with the reason (a sticky error).
  virtual Status SetAttentionRoute(AttentionRouteRequest request);

  // ---- Memory -------------------------------------------------------------
  // Zeroed floats (n >= 0) or bytes of device memory, counted under
  // `category`. Allocation failure throws std::bad_alloc, as Buffer does
  // (out of memory is what the planner exists to prevent).
  DeviceBuffer Alloc(int64_t n_floats, MemCategory category, MemoryTracker* tracker = &GlobalMemoryTracker());
  DeviceBuffer AllocBytes(int64_t bytes, MemCategory category,
                          MemoryTracker* tracker = &GlobalMemoryTracker());
  // Host <-> device copies of `bytes` bytes; CopyToHost waits for the copy.
  // CopyToDevice may return before the copy is done: the host memory must
  // stay unchanged until the next Synchronize or CopyToHost.
  virtual void CopyToDevice(void* dst, const void* host_src, int64_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, int64_t bytes) = 0;
  // Host memory for what a memory technique keeps off the device (offloaded
  // activations and frozen weights, paged optimizer states): page-locked on
  // CUDA so the copy stream can move it asynchronously; plain aligned memory
  // on the CPU backends (outside the guarded arena, so the host may read it).
  // Zeroed, counted under `category` by `tracker` (HostMemoryTracker by
  // default: host bytes are reported apart from device bytes). Throws
  // std::bad_alloc when the host has no room.
  DeviceBuffer AllocHost(int64_t bytes, MemCategory category, MemoryTracker* tracker = &HostMemoryTracker());
  // Copy-stream transfers between device memory and an AllocHost buffer that
  // run beside the ops: each starts once every op and copy called before it
  // is done with its memory (CUDA: a second stream that waits for an event of
  // the first); the CPU backends copy at once. Neither blocks the host. Ops
  // called later do NOT wait for them: call WaitForCopies first, before any op
  // reads what a copy writes or overwrites what a copy reads; host code reads
  // a host buffer only after Synchronize.
  virtual void CopyToDeviceAsync(void* dst, const void* host_src, int64_t bytes) = 0;
  virtual void CopyToHostAsync(void* host_dst, const void* src, int64_t bytes) = 0;
  // Every op called after this waits for every copy-stream transfer called
  // before it (on the device; the host does not block).
  virtual void WaitForCopies() = 0;
  // Totals since the backend was made; waits for the device.
  virtual CopyStats copy_stats() = 0;
  // Device -> device copy (non-overlapping).
  virtual void Copy(void* dst, const void* src, int64_t bytes) = 0;
  // For each of `rows` rows: the first `width` bytes of src's row into dst's, rows `src_pitch` /
  // `dst_pitch` bytes apart (a block of columns of a row-major matrix; cudaMemcpy2D's contract).
  virtual void Copy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                      int64_t rows) = 0;
  // x[0..n) = 0.
  virtual void Zero(float* x, int64_t n) = 0;
  // Waits for every op called so far; the first recorded failure, if any.
  virtual Status Synchronize() = 0;
  // Bytes of device memory free now and in all (the CPU backend: the host's
  // MemAvailable and its total; the guarded one: what its capacity has left).
  virtual StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() = 0;

  // ---- Ops (definitions in kernels/cpu/ops.h) ------------------------------
  // Act / ConstAct arguments may be stored in any ActDType; those of one op
  // that the definition pairs (x and y of a norm, q k v out of attention,
  // gate up h of SwiGLU) share one. A typed gradient argument (dy, dh,
  // dgate, dup) is fp32 or stored as its op's activations are. Every other
  // pointer is fp32.
  // C[M,N] = alpha * op(A) op(B) + beta * C (cpu::Gemm's convention), with
  // A and B taken as `operands` says; C is fp32 storage either way.
  virtual void Gemm(GemmOperands operands, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                    float alpha, ConstAct A, int64_t lda, ConstAct B, int64_t ldb, float beta, float* C,
                    int64_t ldc) = 0;
  virtual void RmsNormForward(ConstAct x, const float* w, int64_t rows, int64_t D, float eps, Act y,
                              float* rstd) = 0;
  // dx overwritten; dw (nullable) accumulated.
  virtual void RmsNormBackward(ConstAct x, const float* w, const float* rstd, ConstAct dy, int64_t rows,
                               int64_t D, float* dx, float* dw) = 0;
  // positions: device int32 [rows]; cos/sin tables device [max_pos, hd/2].
  // rotary: the dims of each head that turn (cpu::RopeApply's partial rotary; hd for all).
  virtual void RopeApply(Act x, int64_t rows, int64_t heads, int64_t hd, int64_t rotary,
                         const int32_t* positions, const float* cos_table, const float* sin_table,
                         bool inverse) = 0;
  // `naive` asks for the reference form that materialises the scores; a
  // backend without one runs its flash form (the same definition).
  // segments: device int32 [rows] or nullptr. lse [batch, Hq, seq].
  // operands kBF16: q, k, v and dout hold bf16-rounded values, and the
  // backend may multiply them, and the probabilities, as bf16 with fp32
  // accumulation (CUDA: the tensor-core kernels); the CPU computes in fp32.
  virtual void AttentionForward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q, ConstAct k,
                                ConstAct v, const int32_t* segments, Act out, float* lse, bool naive) = 0;
  virtual void AttentionBackward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q, ConstAct k,
                                 ConstAct v, const int32_t* segments, ConstAct out, const float* lse,
                                 const float* dout, float* dq, float* dk, float* dv) = 0;
  // h = act(gate) * up (SwiGLU, GeGLU-tanh), and its backward (dh, dgate and dup share a dtype:
  // 16-bit ones are computed in fp32 and stored rounded to nearest even).
  virtual void GluForward(Activation act, ConstAct gate, ConstAct up, int64_t n, Act h) = 0;
  virtual void GluBackward(Activation act, ConstAct gate, ConstAct up, ConstAct dh, int64_t n, Act dgate,
                           Act dup) = 0;
  // ids: device int32 [rows]. The table is fp32 (out any type) or stored in out's type.
  virtual void EmbeddingForward(ConstAct table, const int32_t* ids, int64_t rows, int64_t D, Act out) = 0;
  virtual void EmbeddingBackward(const float* dout, const int32_t* ids, int64_t rows, int64_t D,
                                 float* dtable) = 0;
  // One chunk of the loss head: *loss_sum (a device double) += Σ token
  // cross-entropies of logits[rows, V] against targets (device int32,
  // -100 = ignored), in a fixed order; dlogits (nullable, may alias logits)
  // = grad_scale * (softmax - onehot). Read loss_sum with CopyToHost.
  virtual void CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V,
                            float grad_scale, float* dlogits, double* loss_sum, float softcap) = 0;
  // A typed linear's last step, y[rows, n] (bf16 or fp16) from its fp32 result c (x·Wᵀ, + bias):
  // c + alpha · xa·Bᵀ (LoRA: xa [rows, r] and B [n, r] in y's type; r = 0: none), then, with a
  // residual (nullable, y's type), that sum rounded to y's type plus the residual; stored in y
  // rounded to nearest even. The values of Gemm(y's type as operands, xa, Bᵀ, alpha, beta 1, c),
  // Round (with a residual) and Axpy(residual), then Convert(c, y), up to the order of the
  // product's fp32 sums: what the CPU does, where a GPU runs one kernel that reads c once (instead
  // of a GEMM pass over c and two or three elementwise ones). c is left unspecified; y may alias
  // the residual.
  virtual void LinearOutput(int64_t rows, int64_t n, int64_t r, float alpha, ConstAct xa, ConstAct b,
                            float* c, const ConstAct* residual, Act y) = 0;
  // out[layout.n] = cpu::DequantizeNf4Blob of the NF4 blob (kernels/cpu/nf4.h)
  // at `blob`, a tensor's codes and scales in this backend's memory, bit for
  // bit: how a QLoRA model's frozen weights, kept at about half a byte per
  // value, are made float just before their GEMMs. A bf16 / fp16 `out` gets
  // those values rounded to nearest even (what RoundToBf16 of the fp32 ones
  // gives): the 16-bit GEMM operand itself, without an fp32 intermediate.
  virtual void DequantizeNf4(const cpu::Nf4Layout& layout, const void* blob, Act out) = 0;

  // ---- Elementwise and reductions -----------------------------------------
  virtual void Axpy(int64_t n, float alpha, ConstAct x, float* y) = 0;  // y += alpha x
  virtual void Scale(int64_t n, float alpha, float* x) = 0;             // x *= alpha
  virtual void SoftCap(int64_t n, float cap, float* x) = 0;             // x = cap tanh(x / cap)
  // y[rows, n] += bias[n] per row.
  virtual void AddBias(float* y, const float* bias, int64_t rows, int64_t n) = 0;
  // dbias[n] += Σ_rows dy[r, n], rows in order.
  virtual void BiasGrad(ConstAct dy, int64_t rows, int64_t n, float* dbias) = 0;
  // bf16 and fp16 emulation in place (cpu::RoundToBf16, cpu::RoundToFp16).
  virtual void RoundToBf16(float* x, int64_t n) = 0;
  virtual void RoundToFp16(float* x, int64_t n) = 0;
  // out[i] = x[i] in out's storage (fp32 <-> bf16/fp16; widening is exact,
  // narrowing rounds to nearest even, as RoundToBf16/RoundToFp16 do): typed
  // activations, and 16-bit frozen weights widened for their GEMMs. Same
  // types: a copy.
  virtual void Convert(ConstAct x, int64_t n, Act out) = 0;
  // out[r, c] = x[r, c] * keep_scale or 0 by the mask of `key` for x[rows, in].
  virtual void Dropout(const DropoutKey& key, ConstAct x, int64_t rows, int64_t in, float* out) = 0;
  // dx[i] += d[i] * mask[i] (mask = Dropout of ones): the gradient through the dropout.
  virtual void DropoutBackwardAdd(const DropoutKey& key, const float* d, int64_t rows, int64_t in,
                                  float* dx) = 0;
  // Σ over `tensors` of Σ x², in double: each tensor's sum in a fixed order, the sums added in the
  // list's order starting from the first's (the global grad norm). Waits once, for the total.
  virtual double SumSquares(const std::vector<FloatRange>& tensors) = 0;
  // One AdamW update (cpu::AdamW's definition) on device param/grad/m/v. `copy` (none when its
  // data is nullptr): the updated param is also stored there in its dtype, rounded to nearest
  // even (the 16-bit copy the GEMMs read of a trainable tensor: the same values a Convert after
  // the update gives, in the update's own pass on a GPU).
  virtual void AdamW(const cpu::AdamWParams& hp, int64_t n, float* param, const float* grad, float* m,
                     float* v, Act copy) = 0;

 protected:
  // Device memory primitives behind Alloc/AllocBytes and DeviceBuffer.
  // RawAlloc returns zeroed memory, or nullptr when the device has no room.
  virtual void* RawAlloc(int64_t bytes) = 0;
  virtual void RawFree(void* p) = 0;
  // Host memory behind AllocHost: zeroed 64-byte-aligned memory (nullptr when
  // there is none); CUDA overrides with page-locked memory.
  virtual void* RawAllocHost(int64_t bytes);
  virtual void RawFreeHost(void* p);
  // The CPU backends' copy-stream transfer: an inline memcpy, timed into `stats`.
  static void InlineCopy(void* dst, const void* src, int64_t bytes, bool to_device, CopyStats* stats);

 private:
  friend class DeviceBuffer;
  DeviceBuffer Allocate(int64_t bytes, bool host, MemCategory category, MemoryTracker* tracker);
};

// The process-wide CPU reference backend.
std::shared_ptr<Backend> CpuBackendInstance();
// A CPU backend whose device memory the host cannot reach: one arena of
// `capacity_bytes`, PROT_NONE except while a backend call runs, so a host
// dereference of device memory faults as it would on a GPU; allocations past
// the capacity fail like a full device's (engine/model/guarded_backend.cc). Ops are
// the CPU reference's, bit for bit. For tests; see CreateBackend.
std::shared_ptr<Backend> MakeGuardedCpuBackend(int64_t capacity_bytes);
// The backend for `kind`: CPU always (the guarded one of
// MakeGuardedCpuBackend, one per process, when the environment sets
// FT_GUARDED_DEVICE_MEMORY to its capacity in MiB: how CI runs the model,
// checkpoint and memory tests with device memory kept apart); CUDA when built with it (FT_HAVE_CUDA)
// and a device is visible (FailedPrecondition "no CUDA device: ..." when
// none is, Unimplemented "built without CUDA" when the build has no CUDA).
StatusOr<std::shared_ptr<Backend>> CreateBackend(DeviceKind kind);

}  // namespace ft
