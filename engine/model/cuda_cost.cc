#include "engine/model/cuda_cost.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "engine/model/cuda_op_names.h"

namespace ft {

namespace op = cuda_op;

namespace {

// Address space reserved for a cost model's "device": nothing is committed.
constexpr int64_t kReserveBytes = int64_t{1} << 40;
constexpr int64_t kMinReserveBytes = int64_t{1} << 26;
constexpr int64_t kAlign = 256;
// kernels/cuda's workspace shapes (norm.cu kRowsPerChunk, elementwise.cu kBlocks and its list groups).
constexpr int64_t kRmsRowsPerChunk = 64;
constexpr int64_t kSumSquaresBlocks = 512, kMaxListGroup = 65535;
constexpr int64_t kTensorSpanBytes = 16;  // cuda::TensorSpan<float>: a pointer and an int64

// Published dense peaks (vendor data sheets); the link is PCIe one way.
const std::vector<GpuSpec> kGpus = {
    {"h100", "NVIDIA H100 SXM5 80GB", 989e12, 67e12, 3.35e12, 64e9, int64_t{80} << 30},
    {"h200", "NVIDIA H200 SXM 141GB", 989e12, 67e12, 4.8e12, 64e9, int64_t{141} * 1000 * 1000 * 1000},
    {"a100", "NVIDIA A100 SXM4 80GB", 312e12, 19.5e12, 2.039e12, 32e9, int64_t{80} << 30},
    {"l40s", "NVIDIA L40S 48GB", 362e12, 91.6e12, 0.864e12, 32e9, int64_t{48} << 30},
    {"4090", "NVIDIA GeForce RTX 4090 24GB", 165e12, 82.6e12, 1.008e12, 32e9, int64_t{24} << 30},
};

double D(int64_t v) { return static_cast<double>(v); }
int64_t Bytes(ActDType t) { return ActDTypeBytes(t); }

}  // namespace

const std::vector<GpuSpec>& KnownGpus() { return kGpus; }

StatusOr<GpuSpec> FindGpu(const std::string& key) {
  std::string keys;
  for (const GpuSpec& g : kGpus) {
    if (key == g.key) return g;
    keys += std::string(keys.empty() ? "" : ", ") + g.key;
  }
  return Status::InvalidArgument("unknown GPU '" + key + "': one of " + keys);
}

double RooflineSeconds(const OpWork& w, const GpuSpec& gpu) {
  if (w.link) return w.bytes / gpu.link_bytes_per_s;
  return std::max(w.flops / (w.tensor ? gpu.tensor_flops : gpu.fp32_flops), w.bytes / gpu.memory_bytes_per_s);
}

// The largest range up to kReserveBytes the process is granted: address-space limits (ulimit -v, a
// sanitizer's shadow layout) can refuse 1 TiB; a model larger than the range then fails to allocate
// as on a GPU too small for it.
CudaCostBackend::CudaCostBackend() {
  for (int64_t bytes = kReserveBytes; bytes >= kMinReserveBytes; bytes /= 2) {
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) continue;
    base_ = static_cast<char*>(p);
    reserved_ = bytes;
    return;
  }
  throw std::bad_alloc();
}

CudaCostBackend::~CudaCostBackend() {
  // Buffers go back (to nothing) before the range does.
  rms_ws_ = DeviceBuffer();
  att_ws_ = DeviceBuffer();
  row_loss_ = DeviceBuffer();
  a16_ws_ = DeviceBuffer();
  b16_ws_ = DeviceBuffer();
  ss_ws_ = DeviceBuffer();
  ss_list_ = DeviceBuffer();
  for (DeviceBuffer& b : stage_ws_) b = DeviceBuffer();
  munmap(base_, static_cast<size_t>(reserved_));
}

void* CudaCostBackend::RawAlloc(int64_t bytes) {
  const int64_t size = (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (used_ + size > reserved_) return nullptr;
  void* p = base_ + used_;
  used_ += size;
  return p;
}

StatusOr<std::pair<int64_t, int64_t>> CudaCostBackend::MemoryInfo() {
  return std::make_pair(reserved_ - used_, reserved_);
}

void CudaCostBackend::Record(const char* name, int64_t launches, double flops, double bytes, bool tensor) {
  OpWork& w = ledger_[name];
  w.calls += 1;
  w.launches += launches;
  w.flops += flops;
  w.bytes += bytes;
  w.tensor = w.tensor || tensor;
}

void CudaCostBackend::Link(const char* name, int64_t bytes, bool timed) {
  if (bytes <= 0) return;
  OpWork& w = ledger_[name];
  w.calls += 1;
  w.launches += 1;
  w.bytes += D(bytes);
  w.link = true;
  w.timed = timed;
}

void CudaCostBackend::CopyToDevice(void*, const void*, int64_t bytes) {
  Link(op::kCopyToDevice, bytes, true);
}
void CudaCostBackend::CopyToHost(void* host_dst, const void*, int64_t bytes) {
  if (bytes > 0) std::memset(host_dst, 0, static_cast<size_t>(bytes));
  Link(op::kCopyToHost, bytes, false);
}
void CudaCostBackend::CopyToDeviceAsync(void*, const void*, int64_t bytes) {
  Link(op::kCopyStreamToDevice, bytes, false);
}
void CudaCostBackend::CopyToHostAsync(void*, const void*, int64_t bytes) {
  Link(op::kCopyStreamToHost, bytes, false);
}
void CudaCostBackend::Copy(void*, const void*, int64_t bytes) {
  if (bytes > 0) Record(op::kCopy, 1, 0, 2 * D(bytes));
}
void CudaCostBackend::Copy2D(void*, int64_t, const void*, int64_t, int64_t width, int64_t rows) {
  if (width * rows > 0) Record(op::kCopy, 1, 0, 2 * D(width * rows));
}
void CudaCostBackend::Zero(float*, int64_t n) {
  if (n > 0) Record(op::kZero, 1, 0, 4 * D(n));
}

// ---- CudaBackend's staging --------------------------------------------------
void CudaCostBackend::Workspace(DeviceBuffer& buf, int64_t bytes) {
  if (bytes > 0 && buf.bytes() < bytes) {
    buf = DeviceBuffer();
    buf = AllocBytes(bytes, MemCategory::kWorkspace);
  }
}
void CudaCostBackend::StagedOperand(ConstAct x, int64_t rows, int64_t cols, int slot) {
  if (x.dtype == ActDType::kF32) return;
  Workspace(stage_ws_[slot], rows * cols * 4);
  Record(op::kOperandToF32, 1, 0, D(rows * cols) * D(Bytes(x.dtype) + 4));
}
void CudaCostBackend::Operand16(const char* convert_name, ActDType t, ConstAct x, int64_t rows, int64_t cols,
                                DeviceBuffer& ws, int slot) {
  if (x.dtype == t) return;
  StagedOperand(x, rows, cols, slot);
  Workspace(ws, rows * cols * 2);
  Record(convert_name, 1, 0, D(rows * cols) * (4 + 2));
}

// ---- Ops --------------------------------------------------------------------
void CudaCostBackend::Gemm(GemmOperands operands, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                           float, ConstAct A, int64_t, ConstAct B, int64_t, float beta, float* C,
                           int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) beta == 0.0f ? Zero(C + i * ldc, N) : Scale(N, beta, C + i * ldc);
    return;
  }
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const double c_bytes = 4 * D(M * N) * (beta != 0.0f ? 2 : 1), flops = 2 * D(M) * D(N) * D(K);
  if (operands == GemmOperands::kF32) {
    StagedOperand(A, a_rows, a_cols, 0);
    StagedOperand(B, b_rows, b_cols, 1);
    Record(op::kGemmF32, 1, flops, 4 * D(M * K + K * N) + c_bytes);
    return;
  }
  const bool f16 = operands == GemmOperands::kF16;
  const ActDType t = f16 ? ActDType::kF16 : ActDType::kBF16;
  const char* convert = f16 ? op::kOperandsToF16 : op::kOperandsToBf16;
  Operand16(convert, t, A, a_rows, a_cols, a16_ws_, 0);
  Operand16(convert, t, B, b_rows, b_cols, b16_ws_, 1);
  Record(f16 ? op::kGemmF16 : op::kGemmBf16, 1, flops, 2 * D(M * K + K * N) + c_bytes, true);
}

// Typed activations are read and written in place by every op (CudaBackend's WithStorage): their
// bytes are their storage's.
void CudaCostBackend::RmsNormForward(ConstAct x, const float*, int64_t rows, int64_t dim, float, Act y,
                                     float*) {
  Record(op::kRmsNormForward, 1, 4 * D(rows * dim),
         D(rows * dim) * D(Bytes(x.dtype) + Bytes(y.dtype)) + 4 * D(dim + rows));
}

void CudaCostBackend::RmsNormBackward(ConstAct x, const float*, const float*, ConstAct dy, int64_t rows,
                                      int64_t dim, float*, float* dw) {
  const int64_t chunks = (rows + kRmsRowsPerChunk - 1) / kRmsRowsPerChunk;
  if (dw != nullptr) Workspace(rms_ws_, chunks * dim * 4);
  // dx: read x, dy, w, rstd, write dx (fp32); dw: partials over x, dy, then their reduction.
  const double x_dy_bytes = D(rows * dim) * D(Bytes(x.dtype) + Bytes(dy.dtype));
  double bytes = x_dy_bytes + 4 * D(rows * dim + dim + rows), flops = 6 * D(rows * dim);
  if (dw != nullptr)
    bytes += x_dy_bytes + 4 * D(rows + 2 * chunks * dim + 2 * dim), flops += 3 * D(rows * dim);
  Record(op::kRmsNormBackward, dw != nullptr ? 3 : 1, flops, bytes);
}

void CudaCostBackend::RopeApply(Act x, int64_t rows, int64_t heads, int64_t /*hd*/, int64_t rotary,
                                const int32_t*, const float*, const float*, bool) {
  const int64_t n = rows * heads * rotary;  // the turned dims only
  // x read and written, the tables' n / 2 (cos, sin) pairs read.
  Record(op::kRope, 1, 3 * D(n), D(n) * D(2 * Bytes(x.dtype) + 4) + 4 * D(rows));
}

namespace {
// Query-key pairs a causal attention of `s` computes (per batch row and head):
// query i, at position n - 1 = i + past, sees min(n, window) keys (n without
// a window), so a sliding window bounds the work by seq * window (the
// kernels skip the key tiles outside it; the partial tiles at its edges are
// not counted).
double VisiblePairs(const cpu::AttentionShape& s) {
  const int64_t first = s.past() + 1, last = s.past() + s.seq;  // n over the queries
  const int64_t window = s.window > 0 ? std::min(s.window, last) : last;
  double pairs = 0;
  const int64_t below_end = std::min(last, window);  // n <= window: n keys
  if (below_end >= first) pairs += (D(first) + D(below_end)) * D(below_end - first + 1) / 2;
  const int64_t capped_begin = std::max(first, window + 1);  // n > window: window keys
  if (last >= capped_begin) pairs += D(window) * D(last - capped_begin + 1);
  return pairs;
}
}  // namespace

void CudaCostBackend::AttentionForward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q,
                                       ConstAct, ConstAct, const int32_t*, Act, float*, bool) {
  const int64_t hd = s.head_dim, q_n = s.batch * s.seq * s.q_heads * hd,
                kv_n = s.batch * s.keys() * s.kv_heads * hd;
  // QK^T and PV over the visible pairs; q, k, v read once, out and lse written (k, v, out in q's storage).
  const double flops = 4 * D(s.batch * s.q_heads * hd) * VisiblePairs(s);
  Record(op::kAttentionForward, 1, flops,
         D(2 * q_n + 2 * kv_n) * D(Bytes(q.dtype)) + 4 * D(s.batch * s.q_heads * s.seq),
         operands == GemmOperands::kBF16);
}

void CudaCostBackend::AttentionBackward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q,
                                        ConstAct, ConstAct, const int32_t*, ConstAct, const float*,
                                        const float*, float*, float*, float*) {
  const int64_t hd = s.head_dim, q_n = s.batch * s.seq * s.q_heads * hd,
                kv_n = s.batch * s.seq * s.kv_heads * hd, rows = s.batch * s.q_heads * s.seq;
  Workspace(att_ws_, rows * 4);
  // QK^T recomputed, dV, dP, dQ, dK: five products over the pairs; a delta kernel and two tile kernels.
  // Read: q, k, v, out (their storage), dout twice; written: dq, dk, dv (fp32); lse, delta.
  const double flops = 10 * D(s.batch * s.q_heads * hd) * VisiblePairs(s);
  const double bytes = D(2 * q_n + 2 * kv_n) * D(Bytes(q.dtype)) + 4 * D(3 * q_n + 2 * kv_n + 3 * rows);
  Record(op::kAttentionBackward, 3, flops, bytes, operands == GemmOperands::kBF16);
}

// GELU-tanh's polynomial and tanh cost about twice SiLU's exp and divide.
void CudaCostBackend::GluForward(Activation act, ConstAct gate, ConstAct up, int64_t n, Act h) {
  const bool silu = act == Activation::kSilu;
  Record(silu ? op::kSwiGluForward : op::kGeluGluForward, 1, (silu ? 8 : 16) * D(n),
         D(n) * D(Bytes(gate.dtype) + Bytes(up.dtype) + Bytes(h.dtype)));
}

void CudaCostBackend::GluBackward(Activation act, ConstAct gate, ConstAct up, ConstAct dh, int64_t n, Act,
                                  Act) {
  const bool silu = act == Activation::kSilu;
  // gate, up and dh read; dgate and dup written in dh's storage.
  Record(silu ? op::kSwiGluBackward : op::kGeluGluBackward, 1, (silu ? 12 : 24) * D(n),
         D(n) * D(Bytes(gate.dtype) + Bytes(up.dtype) + 3 * Bytes(dh.dtype)));
}

void CudaCostBackend::EmbeddingForward(ConstAct table, const int32_t*, int64_t rows, int64_t dim, Act out) {
  if (rows * dim <= 0) return;
  if (table.dtype != ActDType::kF32) {
    Record(op::kEmbeddingForward16, 1, 0, 4 * D(rows * dim) + 4 * D(rows));
    return;
  }
  Record(op::kEmbeddingForward, 1, 0, D(rows * dim) * D(4 + Bytes(out.dtype)) + 4 * D(rows));
}

void CudaCostBackend::EmbeddingBackward(const float*, const int32_t*, int64_t rows, int64_t dim, float*) {
  Record(op::kEmbeddingBackward, 1, D(rows * dim), 12 * D(rows * dim) + 4 * D(rows));
}

void CudaCostBackend::CrossEntropy(const float*, const int32_t*, int64_t rows, int64_t V, float,
                                   float* dlogits, double*, float) {
  Workspace(row_loss_, rows * 4);
  Record(op::kCrossEntropy, 2, 5 * D(rows * V), 4 * D(rows * V) * (dlogits != nullptr ? 2 : 1) + 8 * D(rows));
}

void CudaCostBackend::DequantizeNf4(const cpu::Nf4Layout& layout, const void*, Act out) {
  Record(op::kNf4Dequantize, 1, 2 * D(layout.n), D(layout.bytes) + D(layout.n) * D(Bytes(out.dtype)));
}

void CudaCostBackend::Axpy(int64_t n, float, ConstAct x, float*) {
  if (n <= 0) return;
  Record(op::kAxpy, 1, 2 * D(n), D(n) * D(Bytes(x.dtype) + 8));
}
void CudaCostBackend::Scale(int64_t n, float, float*) {
  if (n > 0) Record(op::kScale, 1, D(n), 8 * D(n));
}
void CudaCostBackend::SoftCap(int64_t n, float, float*) {
  if (n > 0) Record(op::kSoftCap, 1, 3 * D(n), 8 * D(n));  // a divide, tanh, a multiply
}
void CudaCostBackend::AddBias(float*, const float*, int64_t rows, int64_t n) {
  if (rows * n > 0) Record(op::kBiasAdd, 1, D(rows * n), 8 * D(rows * n) + 4 * D(n));
}
void CudaCostBackend::BiasGrad(ConstAct dy, int64_t rows, int64_t n, float*) {
  if (n > 0) Record(op::kBiasGrad, 1, D(rows * n), D(rows * n) * D(Bytes(dy.dtype)) + 8 * D(n));
}
void CudaCostBackend::RoundToBf16(float*, int64_t n) {
  if (n > 0) Record(op::kRoundBf16, 1, 0, 8 * D(n));
}
void CudaCostBackend::RoundToFp16(float*, int64_t n) {
  if (n > 0) Record(op::kRoundF16, 1, 0, 8 * D(n));
}
void CudaCostBackend::Convert(ConstAct x, int64_t n, Act out) {
  if (n <= 0) return;
  if (x.dtype == out.dtype) {
    Copy(out.data, x.data, n * Bytes(x.dtype));
    return;
  }
  Record(op::kConvert, 1, 0, D(n) * D(Bytes(x.dtype) + Bytes(out.dtype)));
}
// One kernel: c read, y written (and the residual read), each row's xa and B (cached) read; the
// product's 2r FLOPs an element on the fp32 cores.
void CudaCostBackend::LinearOutput(int64_t rows, int64_t n, int64_t r, float, ConstAct xa, ConstAct, float*,
                                   const ConstAct* residual, Act y) {
  if (rows * n <= 0) return;
  const double es = D(Bytes(y.dtype)), per = 4 + es + (residual != nullptr ? es : 0);
  Record(op::kLinearOutput, 1, 2 * D(r) * D(rows * n),
         D(rows * n) * per + D(rows + n) * D(r) * D(Bytes(xa.dtype)));
}
void CudaCostBackend::Dropout(const DropoutKey&, ConstAct x, int64_t rows, int64_t in, float*) {
  if (rows * in > 0) Record(op::kDropout, 1, D(rows * in), D(rows * in) * D(Bytes(x.dtype) + 4));
}
void CudaCostBackend::DropoutBackwardAdd(const DropoutKey&, const float*, int64_t rows, int64_t in, float*) {
  if (rows * in > 0) Record(op::kDropout, 1, 2 * D(rows * in), 12 * D(rows * in));
}
// One multi-tensor pass (kernels/cuda SumSquaresList: two launches per group of 65535 tensors), its
// list uploaded when it changes, every tensor's total read at once.
double CudaCostBackend::SumSquares(const std::vector<FloatRange>& tensors) {
  if (tensors.empty()) return 0.0;
  const auto count = static_cast<int64_t>(tensors.size());
  if (tensors != ss_list_host_) {
    Workspace(ss_list_, count * kTensorSpanBytes);
    Link(op::kCopyToDevice, count * kTensorSpanBytes, true);
    ss_list_host_ = tensors;
  }
  const int64_t groups = (count + kMaxListGroup - 1) / kMaxListGroup,
                partials = std::min(count, kMaxListGroup) * kSumSquaresBlocks;
  Workspace(ss_ws_, (partials + count) * 8);
  double n = 0;
  for (const FloatRange& t : tensors) n += D(t.n);
  // x read once; each tensor's partials written and read, its total written.
  Record(op::kSumSquares, 2 * groups, 2 * n, 4 * n + 16 * D(count * kSumSquaresBlocks) + 8 * D(count));
  Link(op::kCopyToHost, count * 8, false);  // the totals, read at once
  return 0.0;
}
void CudaCostBackend::AdamW(const cpu::AdamWParams&, int64_t n, float*, const float*, float*, float*,
                            Act copy) {
  const double copy_bytes = copy.data != nullptr ? D(Bytes(copy.dtype)) : 0;
  if (n > 0) Record(op::kAdamW, 1, 15 * D(n), (28 + copy_bytes) * D(n));
}

}  // namespace ft
