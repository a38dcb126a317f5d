// GuardedCpuBackend: the CPU reference backend with device memory the host
// cannot reach (engine/model/backend.h, MakeGuardedCpuBackend).
//
// Device memory is one mmap'd arena of `capacity` bytes, PROT_NONE except
// while a backend call (an op, a copy, an allocation's zeroing) runs: any
// host dereference of device memory outside the backend faults (SIGSEGV) at
// the offending line, the way a GPU pointer would. Ops forward to the CPU
// reference backend inside the open window, so results are bit-identical to
// CpuBackend's. Allocations are first-fit in the arena, 64-byte aligned; an
// allocation that does not fit the capacity fails (Alloc throws
// std::bad_alloc), as a full device would.
//
// Copy-stream transfers (CopyTo*Async) are deferred to the latest moment a
// device may run them: the next WaitForCopies, Synchronize or copy_stats. A
// caller that reads a transfer's destination without WaitForCopies, or
// overwrites its source before one, sees the stale or changed bytes and its
// results change (the CPU backend, which copies at once, is the other
// extreme); a real copy stream lands anywhere in between.
//
// Thread safety: one thread at a time, like every backend (the CPU ops'
// OpenMP threads run inside the open window).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "engine/model/backend.h"

namespace ft {
namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kHuge = int64_t{2} << 20;

class GuardedCpuBackend final : public Backend {
 public:
  explicit GuardedCpuBackend(int64_t capacity) : inner_(CpuBackendInstance()) {
    // Whole 2 MiB huge pages where the kernel gives them: each open/close is an
    // mprotect over the arena, whose cost grows with the page-table entries it rewrites.
    capacity_ = (capacity + kAlign - 1) / kAlign * kAlign;
    span_ = (capacity_ + kHuge - 1) / kHuge * kHuge;
    void* p = mmap(nullptr, static_cast<size_t>(span_ + kHuge), PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    FT_CHECK(p != MAP_FAILED);  // reserving address space only (MAP_NORESERVE)
    map_ = static_cast<char*>(p);
    base_ = map_ + (kHuge - reinterpret_cast<uintptr_t>(map_) % kHuge) % kHuge;
    madvise(base_, static_cast<size_t>(span_), MADV_HUGEPAGE);  // a hint; fine if refused
    free_[0] = capacity_;
  }
  ~GuardedCpuBackend() override { munmap(map_, static_cast<size_t>(span_ + kHuge)); }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string Describe() const override {
    return "cpu (guarded device memory, " + std::to_string(capacity_ >> 20) + " MiB)";
  }

  // ---- copies and memory ----
  void CopyToDevice(void* dst, const void* host_src, int64_t bytes) override {
    Open o(this);
    inner_->CopyToDevice(dst, host_src, bytes);
  }
  void CopyToHost(void* host_dst, const void* src, int64_t bytes) override {
    Open o(this);
    inner_->CopyToHost(host_dst, src, bytes);
  }
  void Copy(void* dst, const void* src, int64_t bytes) override {
    Open o(this);
    inner_->Copy(dst, src, bytes);
  }
  void Copy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
              int64_t rows) override {
    Open o(this);
    inner_->Copy2D(dst, dst_pitch, src, src_pitch, width, rows);
  }
  void CopyToDeviceAsync(void* dst, const void* host_src, int64_t bytes) override {
    pending_.push_back({dst, host_src, bytes, true});
  }
  void CopyToHostAsync(void* host_dst, const void* src, int64_t bytes) override {
    pending_.push_back({host_dst, src, bytes, false});
  }
  void WaitForCopies() override {
    if (pending_.empty()) return;
    Open o(this);
    for (const PendingCopy& c : pending_) InlineCopy(c.dst, c.src, c.bytes, c.to_device, &stats_);
    pending_.clear();
  }
  CopyStats copy_stats() override {
    WaitForCopies();
    return stats_;
  }
  void Zero(float* x, int64_t n) override {
    Open o(this);
    inner_->Zero(x, n);
  }
  Status Synchronize() override {
    WaitForCopies();
    return Status::OK();
  }
  StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() override {
    return std::make_pair(capacity_ - used_, capacity_);
  }

  // ---- ops: the CPU reference inside the open window ----
  void Gemm(GemmOperands operands, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            ConstAct A, int64_t lda, ConstAct B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    Open o(this);
    inner_->Gemm(operands, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void RmsNormForward(ConstAct x, const float* w, int64_t rows, int64_t D, float eps, Act y,
                      float* rstd) override {
    Open o(this);
    inner_->RmsNormForward(x, w, rows, D, eps, y, rstd);
  }
  void RmsNormBackward(ConstAct x, const float* w, const float* rstd, ConstAct dy, int64_t rows, int64_t D,
                       float* dx, float* dw) override {
    Open o(this);
    inner_->RmsNormBackward(x, w, rstd, dy, rows, D, dx, dw);
  }
  void RopeApply(Act x, int64_t rows, int64_t heads, int64_t hd, int64_t rotary, const int32_t* positions,
                 const float* cos_table, const float* sin_table, bool inverse) override {
    Open o(this);
    inner_->RopeApply(x, rows, heads, hd, rotary, positions, cos_table, sin_table, inverse);
  }
  void AttentionForward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q, ConstAct k,
                        ConstAct v, const int32_t* segments, Act out, float* lse, bool naive) override {
    Open o(this);
    inner_->AttentionForward(operands, s, q, k, v, segments, out, lse, naive);
  }
  void AttentionBackward(GemmOperands operands, const cpu::AttentionShape& s, ConstAct q, ConstAct k,
                         ConstAct v, const int32_t* segments, ConstAct out, const float* lse,
                         const float* dout, float* dq, float* dk, float* dv) override {
    Open o(this);
    inner_->AttentionBackward(operands, s, q, k, v, segments, out, lse, dout, dq, dk, dv);
  }
  void GluForward(Activation act, ConstAct gate, ConstAct up, int64_t n, Act h) override {
    Open o(this);
    inner_->GluForward(act, gate, up, n, h);
  }
  void GluBackward(Activation act, ConstAct gate, ConstAct up, ConstAct dh, int64_t n, Act dgate,
                   Act dup) override {
    Open o(this);
    inner_->GluBackward(act, gate, up, dh, n, dgate, dup);
  }
  void EmbeddingForward(ConstAct table, const int32_t* ids, int64_t rows, int64_t D, Act out) override {
    Open o(this);
    inner_->EmbeddingForward(table, ids, rows, D, out);
  }
  void EmbeddingBackward(const float* dout, const int32_t* ids, int64_t rows, int64_t D,
                         float* dtable) override {
    Open o(this);
    inner_->EmbeddingBackward(dout, ids, rows, D, dtable);
  }
  void CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V, float grad_scale,
                    float* dlogits, double* loss_sum, float softcap) override {
    Open o(this);
    inner_->CrossEntropy(logits, targets, rows, V, grad_scale, dlogits, loss_sum, softcap);
  }
  void DequantizeNf4(const cpu::Nf4Layout& layout, const void* blob, Act out) override {
    Open o(this);
    inner_->DequantizeNf4(layout, blob, out);
  }

  void Axpy(int64_t n, float alpha, ConstAct x, float* y) override {
    Open o(this);
    inner_->Axpy(n, alpha, x, y);
  }
  void Scale(int64_t n, float alpha, float* x) override {
    Open o(this);
    inner_->Scale(n, alpha, x);
  }
  void SoftCap(int64_t n, float cap, float* x) override {
    Open o(this);
    inner_->SoftCap(n, cap, x);
  }
  void AddBias(float* y, const float* bias, int64_t rows, int64_t n) override {
    Open o(this);
    inner_->AddBias(y, bias, rows, n);
  }
  void BiasGrad(ConstAct dy, int64_t rows, int64_t n, float* dbias) override {
    Open o(this);
    inner_->BiasGrad(dy, rows, n, dbias);
  }
  void RoundToBf16(float* x, int64_t n) override {
    Open o(this);
    inner_->RoundToBf16(x, n);
  }
  void RoundToFp16(float* x, int64_t n) override {
    Open o(this);
    inner_->RoundToFp16(x, n);
  }
  void Convert(ConstAct x, int64_t n, Act out) override {
    Open o(this);
    inner_->Convert(x, n, out);
  }
  void Dropout(const DropoutKey& key, ConstAct x, int64_t rows, int64_t in, float* out) override {
    Open o(this);
    inner_->Dropout(key, x, rows, in, out);
  }
  void DropoutBackwardAdd(const DropoutKey& key, const float* d, int64_t rows, int64_t in,
                          float* dx) override {
    Open o(this);
    inner_->DropoutBackwardAdd(key, d, rows, in, dx);
  }
  void LinearOutput(int64_t rows, int64_t n, int64_t r, float alpha, ConstAct xa, ConstAct b, float* c,
                    const ConstAct* residual, Act y) override {
    Open o(this);
    inner_->LinearOutput(rows, n, r, alpha, xa, b, c, residual, y);
  }
  double SumSquares(const std::vector<FloatRange>& tensors) override {
    Open o(this);
    return inner_->SumSquares(tensors);
  }
  void AdamW(const cpu::AdamWParams& hp, int64_t n, float* param, const float* grad, float* m, float* v,
             Act copy) override {
    Open o(this);
    inner_->AdamW(hp, n, param, grad, m, v, copy);
  }

 protected:
  void RawFreeHost(void* p) override {
    WaitForCopies();
    Backend::RawFreeHost(p);
  }
  void* RawAlloc(int64_t bytes) override {
    const int64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const int64_t offset = it->first, left = it->second - size;
      free_.erase(it);
      if (left > 0) free_[offset + size] = left;
      used_blocks_[offset] = size;
      used_ += size;
      char* p = base_ + offset;
      OpenLocked();
      std::memset(p, 0, static_cast<size_t>(size));
      CloseLocked();
      return p;
    }
    return nullptr;  // the capacity is spent: Alloc throws std::bad_alloc
  }
  void RawFree(void* p) override {
    WaitForCopies();  // as a device would, the memory is free once no transfer uses it
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t offset = static_cast<char*>(p) - base_;
    auto it = used_blocks_.find(offset);
    FT_CHECK(it != used_blocks_.end());  // a pointer this backend handed out
    int64_t start = offset, size = it->second;
    used_ -= size;
    used_blocks_.erase(it);
    // Coalesce with the free neighbours.
    auto next = free_.lower_bound(start);
    if (next != free_.end() && next->first == start + size) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        size += prev->second;
        free_.erase(prev);
      }
    }
    free_[start] = size;
  }

 private:
  // The arena is readable and writable while at least one Open lives.
  class Open {
   public:
    explicit Open(GuardedCpuBackend* b) : b_(b) {
      std::lock_guard<std::mutex> lock(b_->mu_);
      b_->OpenLocked();
    }
    ~Open() {
      std::lock_guard<std::mutex> lock(b_->mu_);
      b_->CloseLocked();
    }

   private:
    GuardedCpuBackend* b_;
  };
  void OpenLocked() {
    if (open_++ == 0) FT_CHECK(mprotect(base_, static_cast<size_t>(span_), PROT_READ | PROT_WRITE) == 0);
  }
  void CloseLocked() {
    if (--open_ == 0) FT_CHECK(mprotect(base_, static_cast<size_t>(span_), PROT_NONE) == 0);
  }

  std::shared_ptr<Backend> inner_;
  struct PendingCopy {
    void* dst;
    const void* src;
    int64_t bytes;
    bool to_device;
  };
  std::vector<PendingCopy> pending_;  // copy-stream transfers not run yet
  CopyStats stats_;
  char* map_ = nullptr;   // the mapping (span + one huge page, for alignment)
  char* base_ = nullptr;  // the arena: 2 MiB-aligned
  int64_t span_ = 0;      // bytes mapped and protected: the capacity rounded up to huge pages
  int64_t capacity_ = 0, used_ = 0;
  std::mutex mu_;
  int open_ = 0;
  std::map<int64_t, int64_t> free_;         // offset -> bytes
  std::map<int64_t, int64_t> used_blocks_;  // offset -> bytes
};

}  // namespace

std::shared_ptr<Backend> MakeGuardedCpuBackend(int64_t capacity_bytes) {
  return std::make_shared<GuardedCpuBackend>(capacity_bytes);
}

}  // namespace ft
