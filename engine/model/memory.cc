#include "engine/model/memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

namespace ft {

const char* MemCategoryName(MemCategory c) {
  switch (c) {
    case MemCategory::kWeights: return "weights";
    case MemCategory::kAdapter: return "adapter";
    case MemCategory::kGradients: return "gradients";
    case MemCategory::kOptimizer: return "optimizer";
    case MemCategory::kActivations: return "activations";
    case MemCategory::kWorkspace: return "workspace";
    case MemCategory::kCount: break;
  }
  return "unknown";
}

void MemoryTracker::RaiseTo(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {
  }
}

void MemoryTracker::Add(MemCategory c, int64_t bytes) {
  RaiseTo(peak_[Index(c)], current_[Index(c)].fetch_add(bytes) + bytes);
  RaiseTo(peak_total_, total_.fetch_add(bytes) + bytes);
}

void MemoryTracker::Sub(MemCategory c, int64_t bytes) {
  current_[Index(c)].fetch_sub(bytes);
  total_.fetch_sub(bytes);
}

void MemoryTracker::ResetPeaks() {
  for (size_t i = 0; i < current_.size(); ++i) peak_[i].store(current_[i].load());
  peak_total_.store(total_.load());
}

MemoryTracker& GlobalMemoryTracker() {
  static MemoryTracker tracker;
  return tracker;
}

MemoryTracker& HostMemoryTracker() {
  static MemoryTracker tracker;
  return tracker;
}

Buffer::Buffer(int64_t n, MemCategory category, MemoryTracker* tracker)
    : n_(n), category_(category), tracker_(tracker) {
  if (n_ == 0) return;
  size_t bytes = (static_cast<size_t>(n_) * sizeof(float) + 63) / 64 * 64;
  data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, bytes);
  if (tracker_) tracker_->Add(category_, static_cast<int64_t>(n_ * sizeof(float)));
}

Buffer::~Buffer() { Release(); }

void Buffer::Release() {
  if (data_) {
    std::free(data_);
    if (tracker_) tracker_->Sub(category_, static_cast<int64_t>(n_ * sizeof(float)));
  }
  data_ = nullptr;
  n_ = 0;
}

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = other.data_;
    n_ = other.n_;
    category_ = other.category_;
    tracker_ = other.tracker_;
    other.data_ = nullptr;
    other.n_ = 0;
  }
  return *this;
}

void Buffer::Zero() {
  if (data_) std::memset(data_, 0, static_cast<size_t>(n_) * sizeof(float));
}

StatusOr<int64_t> HostAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kb) == 1) return static_cast<int64_t>(kb) * 1024;
  }
  return Status::Unavailable("/proc/meminfo: no MemAvailable line");
}

}  // namespace ft
