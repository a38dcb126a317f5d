// The CUDA backend's cost, predicted on any machine (issue #33): a Backend
// that runs nothing and records, for every op the model calls, what
// engine/model/cuda_backend.cu would issue for it on a GPU — its kernel
// launches, FLOPs and bytes moved (typed activations at their storage's
// size), the operand conversions of a 16-bit GEMM and the fp32 staging of the
// loss head's, NF4 dequantization, the rounding passes — under the category names FT_CUDA_OP_TIMES reports
// (engine/model/cuda_op_names.h). A real model (any shape, the 8B one
// included) runs real training steps on it: device memory is an address
// range reserved without access (PROT_NONE, nothing committed; up to 1 TiB,
// the most the process is granted), so a host read of device memory faults as
// on a GPU, and only the host-side copies the model makes cost memory.
//
// Each op's rules mirror its CudaBackend method line by line (same helper
// names: StagedOperand, Operand16, Workspace);
// change both together. Kernel counts per op are those of kernels/cuda
// (e.g. attention backward: a delta kernel and two tile kernels).
//
// Roofline: a category's time on a GPU is the larger of its FLOPs at the
// GPU's peak (tensor-core bf16/fp16 peak for cuBLASLt 16-bit GEMMs and the
// bf16 attention kernels, the fp32 peak otherwise) and its bytes at the
// memory bandwidth (host<->device copies at the link's), summed over the
// category as a whole: a lower bound of what the GPU can do, not a forecast
// of launch gaps (launches are reported beside it).
//
// Thread safety: one thread at a time (as every Backend).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model/backend.h"

namespace ft {

// What one category of ops issues.
struct OpWork {
  int64_t calls = 0;     // backend calls (FT_CUDA_OP_TIMES' "calls")
  int64_t launches = 0;  // kernel launches (or copies)
  double flops = 0;
  double bytes = 0;     // read + written in device memory, or over the host link
  bool tensor = false;  // FLOPs on tensor cores
  bool link = false;    // a host<->device transfer
  bool timed = true;    // timed by FT_CUDA_OP_TIMES (copies on the copy stream and to the host are not)
};
using CostLedger = std::map<std::string, OpWork>;

// A GPU's published peaks (dense, no sparsity).
struct GpuSpec {
  const char* key;      // --gpu name
  const char* name;     // what it is
  double tensor_flops;  // bf16/fp16 tensor cores with fp32 accumulation, FLOP/s
  double fp32_flops;    // fp32 CUDA cores, FLOP/s
  double memory_bytes_per_s;
  double link_bytes_per_s;  // host<->device (PCIe) one way
  int64_t memory_bytes;     // device memory
};
const std::vector<GpuSpec>& KnownGpus();
// The GPU named `key`; InvalidArgument listing the keys otherwise.
StatusOr<GpuSpec> FindGpu(const std::string& key);
// Seconds for `w` at `gpu`'s roofline (see above).
double RooflineSeconds(const OpWork& w, const GpuSpec& gpu);

class CudaCostBackend final : public Backend {
 public:
  CudaCostBackend();
  ~CudaCostBackend() override;
  CudaCostBackend(const CudaCostBackend&) = delete;
  CudaCostBackend& operator=(const CudaCostBackend&) = delete;

  const CostLedger& ledger() const { return ledger_; }
  void ClearLedger() { ledger_.clear(); }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string Describe() const override { return "cuda (cost model: nothing runs)"; }
  void CopyToDevice(void* dst, const void* host_src, int64_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, int64_t bytes) override;  // fills zeros
  void CopyToDeviceAsync(void* dst, const void* host_src, int64_t bytes) override;
  void CopyToHostAsync(void* host_dst, const void* src, int64_t bytes) override;
  void WaitForCopies() override {}
  CopyStats copy_stats() override { return {}; }
  void Copy(void* dst, const void* src, int64_t bytes) override;
  void Copy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
              int64_t rows) override;
  void Zero(float* x, int64_t n) override;
  Status Synchronize() override { return Status::OK(); }
  StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() override;

  void Gemm(GemmOperands operands, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            ConstAct A, int64_t lda, ConstAct B, int64_t ldb, float beta, float* C, int64_t ldc) override;
  void RmsNormForward(ConstAct x, const float* w, int64_t rows, int64_t D, float eps, Act y,
                      float* rstd) override;
  void RmsNormBackward(ConstAct x, const float* w, const float* rstd, ConstAct dy, int64_t rows, int64_t D,
                       float* dx, float* dw) override;
  void RopeApply(Act x, int64_t rows, int64_t heads, int64_t hd, int64_t rotary, const int32_t* positions,
                 const float* cos_table, const float* sin_table, bool inverse) override;
  void AttentionForward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q, ConstAct k,
                        ConstAct v, const int32_t* segments, Act out, float* lse, bool naive) override;
  void AttentionBackward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q, ConstAct k,
                         ConstAct v, const int32_t* segments, ConstAct out, const float* lse,
                         const float* dout, float* dq, float* dk, float* dv) override;
  void GluForward(Activation act, ConstAct gate, ConstAct up, int64_t n, Act h) override;
  void GluBackward(Activation act, ConstAct gate, ConstAct up, ConstAct dh, int64_t n, Act dgate,
                   Act dup) override;
  void EmbeddingForward(ConstAct table, const int32_t* ids, int64_t rows, int64_t D, Act out) override;
  void EmbeddingBackward(const float* dout, const int32_t* ids, int64_t rows, int64_t D,
                         float* dtable) override;
  void CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V, float grad_scale,
                    float* dlogits, double* loss_sum, float softcap) override;
  void DequantizeNf4(const cpu::Nf4Layout& layout, const void* blob, Act out) override;
  void Axpy(int64_t n, float alpha, ConstAct x, float* y) override;
  void Scale(int64_t n, float alpha, float* x) override;
  void SoftCap(int64_t n, float cap, float* x) override;
  void AddBias(float* y, const float* bias, int64_t rows, int64_t n) override;
  void BiasGrad(ConstAct dy, int64_t rows, int64_t n, float* dbias) override;
  void RoundToBf16(float* x, int64_t n) override;
  void RoundToFp16(float* x, int64_t n) override;
  void Convert(ConstAct x, int64_t n, Act out) override;
  void LinearOutput(int64_t rows, int64_t n, int64_t r, float alpha, ConstAct xa, ConstAct b, float* c,
                    const ConstAct* residual, Act y) override;
  void Dropout(const DropoutKey& key, ConstAct x, int64_t rows, int64_t in, float* out) override;
  void DropoutBackwardAdd(const DropoutKey& key, const float* d, int64_t rows, int64_t in,
                          float* dx) override;
  double SumSquares(const std::vector<FloatRange>& tensors) override;
  void AdamW(const cpu::AdamWParams& hp, int64_t n, float* param, const float* grad, float* m, float* v,
             Act copy) override;

 protected:
  void* RawAlloc(int64_t bytes) override;
  void RawFree(void* /*p*/) override {}
  void* RawAllocHost(int64_t bytes) override { return RawAlloc(bytes); }
  void RawFreeHost(void* /*p*/) override {}

 private:
  // Adds `calls` calls of `launches` launches doing `flops` and moving `bytes` to category `op`.
  void Record(const char* op, int64_t launches, double flops, double bytes, bool tensor = false);
  void Link(const char* op, int64_t bytes, bool timed);
  // CudaBackend's GEMM operand staging (see its comments), recorded instead of run.
  void StagedOperand(ConstAct x, int64_t rows, int64_t cols, int slot);
  void Operand16(const char* convert_name, ActDType t, ConstAct x, int64_t rows, int64_t cols,
                 DeviceBuffer& ws, int slot);
  void Workspace(DeviceBuffer& buf, int64_t bytes);

  char* base_ = nullptr;  // the reserved range
  int64_t reserved_ = 0, used_ = 0;
  CostLedger ledger_;
  DeviceBuffer rms_ws_, att_ws_, row_loss_, a16_ws_, b16_ws_, ss_ws_, ss_list_;
  DeviceBuffer stage_ws_[2];
  std::vector<FloatRange> ss_list_host_;  // CudaBackend's cached device list of SumSquares' tensors
};

}  // namespace ft
