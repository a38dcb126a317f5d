// A lock-free latency histogram (log-spaced buckets from 1 µs to ~10,000 s) for
// the daemon's own measurements: heartbeat handling, scheduler ticks,
// checkpoint writes, recovery after a preemption. Good to
// a few percent per bucket, which is what percentiles on a dashboard need.
// Thread safety: Record and the readers may run concurrently.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>

namespace ft {

class LatencyHistogram {
 public:
  static constexpr int kBuckets = 200;  // 20 per decade over 10 decades

  void Record(double seconds) {
    const double us = seconds * 1e6;
    int b = us <= 1 ? 0 : static_cast<int>(std::log10(us) * 20.0);
    if (b >= kBuckets) b = kBuckets - 1;
    counts_[b].fetch_add(1, std::memory_order_relaxed);
    total_.fetch_add(1, std::memory_order_relaxed);
    double sum = sum_.load(std::memory_order_relaxed);
    while (!sum_.compare_exchange_weak(sum, sum + seconds)) {
    }
    double seen = max_.load(std::memory_order_relaxed);
    while (seconds > seen && !max_.compare_exchange_weak(seen, seconds)) {
    }
  }
  int64_t count() const { return total_.load(); }
  double max_seconds() const { return max_.load(); }
  double sum_seconds() const { return sum_.load(); }
  // Records in bucket b (0 <= b < kBuckets), which holds values up to UpperEdge(b).
  int64_t bucket_count(int b) const { return counts_[b].load(); }
  // Upper edge of bucket b in seconds (the last bucket also holds everything above).
  static double UpperEdge(int b) { return std::pow(10.0, (b + 1) / 20.0) * 1e-6; }
  // The q-quantile (0 < q <= 1) in seconds: the upper edge of the bucket that
  // holds it (within 12% above the true value), never above the largest value
  // recorded (so p99 <= max), 0 before any record.
  double Quantile(double q) const {
    const int64_t n = total_.load();
    if (n == 0) return 0;
    const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q * static_cast<double>(n))));
    int64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += counts_[b].load();
      if (seen >= rank) return std::min(UpperEdge(b), max_seconds());
    }
    return max_seconds();
  }

 private:
  std::array<std::atomic<int64_t>, kBuckets> counts_{};
  std::atomic<int64_t> total_{0};
  std::atomic<double> max_{0};
  std::atomic<double> sum_{0};
};

}  // namespace ft
