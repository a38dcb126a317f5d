// CudaOpTimes: where a CUDA training run spends its GPU time, by backend op
// (FT_CUDA_OP_TIMES=1 in the environment; off otherwise, at the cost of one
// branch per op).
//
// Each timed op records a CUDA event before and after its launches on the
// backend's stream; nothing synchronises for it. Resolve() (called by the
// backend whenever it synchronises anyway) reads the finished pairs and adds
// each op's elapsed GPU time to its name's total; Report() is the table of
// totals, largest first, with calls and share. Event pairs measure the
// stream's time between the two records, so launch gaps (a GPU idle while the
// host catches up) count against the op that follows them.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

namespace ft {

class CudaOpTimes {
 public:
  CudaOpTimes();  // enabled when FT_CUDA_OP_TIMES is set to something other than "0"
  ~CudaOpTimes();
  CudaOpTimes(const CudaOpTimes&) = delete;
  CudaOpTimes& operator=(const CudaOpTimes&) = delete;

  bool enabled() const { return enabled_; }

  // RAII: the op's launches on `stream` between construction and destruction.
  class Scope {
   public:
    Scope(CudaOpTimes* times, const char* op, cudaStream_t stream);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CudaOpTimes* times_;
    cudaStream_t stream_;
    int index_ = -1;
  };

  // Adds the finished pairs to the totals; the stream must be idle (after a synchronize).
  void Resolve();
  // "op  calls  ms  share" lines, largest total first; empty when disabled or nothing ran.
  std::string Report();

 private:
  struct Pending {
    const char* op;
    cudaEvent_t start, stop;
  };
  struct Total {
    int64_t calls = 0;
    double ms = 0;
  };
  cudaEvent_t Take();

  bool enabled_ = false;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_;
  std::map<std::string, Total> totals_;
};

}  // namespace ft
