// Tracked memory: every engine allocation goes through a MemoryTracker, so
// current and peak bytes are known per category (and, later, checked against
// what the planner predicted).
//
// A Buffer owns one 64-byte-aligned float array and returns its bytes to the
// tracker when destroyed. Buffers are move-only.
//
// Thread safety: MemoryTracker counters are atomic; a Buffer is not shared.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace ft {

enum class MemCategory { kWeights = 0, kAdapter, kGradients, kOptimizer, kActivations, kWorkspace, kCount };
const char* MemCategoryName(MemCategory c);

class MemoryTracker {
 public:
  void Add(MemCategory c, int64_t bytes);
  void Sub(MemCategory c, int64_t bytes);
  int64_t current(MemCategory c) const { return current_[Index(c)].load(); }
  int64_t peak(MemCategory c) const { return peak_[Index(c)].load(); }
  int64_t current_total() const { return total_.load(); }
  int64_t peak_total() const { return peak_total_.load(); }
  // Forgets peaks (current stays), e.g. to measure one phase.
  void ResetPeaks();

 private:
  static size_t Index(MemCategory c) { return static_cast<size_t>(c); }
  static void RaiseTo(std::atomic<int64_t>& peak, int64_t value);

  std::array<std::atomic<int64_t>, static_cast<size_t>(MemCategory::kCount)> current_{};
  std::array<std::atomic<int64_t>, static_cast<size_t>(MemCategory::kCount)> peak_{};
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> peak_total_{0};
};

// Memory the CPU "device" offers: MemAvailable from /proc/meminfo (what the
// CPU backend's MemoryInfo reports free, and `ft-train plan` assumes).
StatusOr<int64_t> HostAvailableBytes();

// The tracker used by the engine in this process: device memory (on the CPU
// backends, the memory the model computes in).
MemoryTracker& GlobalMemoryTracker();
// Host memory the memory techniques keep off the device (Backend::AllocHost):
// offloaded activations and frozen weights, paged optimizer states.
MemoryTracker& HostMemoryTracker();

class Buffer {
 public:
  Buffer() = default;
  // Zero-initialised array of n floats, counted under `category`.
  Buffer(int64_t n, MemCategory category, MemoryTracker* tracker = &GlobalMemoryTracker());
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }
  void Zero();

 private:
  void Release();

  float* data_ = nullptr;
  int64_t n_ = 0;
  MemCategory category_ = MemCategory::kWorkspace;
  MemoryTracker* tracker_ = nullptr;
};

// Counts `bytes` of memory held elsewhere (e.g. a std::vector of packed NF4
// codes) under `category` for as long as it lives. Move-only.
class TrackedBytes {
 public:
  TrackedBytes() = default;
  TrackedBytes(int64_t bytes, MemCategory category, MemoryTracker* tracker = &GlobalMemoryTracker())
      : bytes_(bytes), category_(category), tracker_(tracker) {
    tracker_->Add(category_, bytes_);
  }
  ~TrackedBytes() {
    if (tracker_) tracker_->Sub(category_, bytes_);
  }
  TrackedBytes(TrackedBytes&& o) noexcept : bytes_(o.bytes_), category_(o.category_), tracker_(o.tracker_) {
    o.tracker_ = nullptr;
  }
  TrackedBytes& operator=(TrackedBytes&&) = delete;
  TrackedBytes(const TrackedBytes&) = delete;

 private:
  int64_t bytes_ = 0;
  MemCategory category_ = MemCategory::kWeights;
  MemoryTracker* tracker_ = nullptr;
};

}  // namespace ft
