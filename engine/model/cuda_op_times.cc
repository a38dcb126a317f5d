// engine/model/cuda_op_times.h.
#include "engine/model/cuda_op_times.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace ft {

CudaOpTimes::CudaOpTimes() {
  const char* v = std::getenv("FT_CUDA_OP_TIMES");
  enabled_ = v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

CudaOpTimes::~CudaOpTimes() {
  for (Pending& p : pending_) {
    free_.push_back(p.start);
    free_.push_back(p.stop);
  }
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t CudaOpTimes::Take() {
  if (free_.empty()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    return e;
  }
  cudaEvent_t e = free_.back();
  free_.pop_back();
  return e;
}

CudaOpTimes::Scope::Scope(CudaOpTimes* times, const char* op, cudaStream_t stream)
    : times_(times), stream_(stream) {
  if (!times_->enabled_) return;
  cudaEvent_t start = times_->Take(), stop = times_->Take();
  if (start == nullptr || stop == nullptr || cudaEventRecord(start, stream_) != cudaSuccess) {
    if (start != nullptr) times_->free_.push_back(start);
    if (stop != nullptr) times_->free_.push_back(stop);
    return;
  }
  index_ = static_cast<int>(times_->pending_.size());
  times_->pending_.push_back({op, start, stop});
}

CudaOpTimes::Scope::~Scope() {
  if (index_ >= 0) cudaEventRecord(times_->pending_[static_cast<size_t>(index_)].stop, stream_);
}

void CudaOpTimes::Resolve() {
  for (Pending& p : pending_) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, p.start, p.stop) == cudaSuccess) {
      Total& t = totals_[p.op];
      ++t.calls;
      t.ms += ms;
    }
    free_.push_back(p.start);
    free_.push_back(p.stop);
  }
  pending_.clear();
}

std::string CudaOpTimes::Report() {
  if (!enabled_) return "";
  Resolve();
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double sum = 0;
  for (const auto& r : rows) sum += r.second.ms;
  std::string out;
  char line[160];
  for (const auto& [op, t] : rows) {
    std::snprintf(line, sizeof(line), "OPTIME %-28s %8lld calls %11.1f ms %5.1f%%\n", op.c_str(),
                  static_cast<long long>(t.calls), t.ms, sum > 0 ? 100.0 * t.ms / sum : 0.0);
    out += line;
  }
  return out;
}

}  // namespace ft
