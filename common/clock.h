// Time for ftd and ft-worker. The daemon's is injected (Clock) so tests can run
// leases on simulated time; WallNowMs() is the plain wall clock for code that
// needs no injection (the worker's reports and slot ends).
//   MonotonicMs(): for leases and timeouts (never jumps).
//   WallMs():      Unix milliseconds, for what users see and for slot ends.
// Thread safety: implementations are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ft {

// Unix milliseconds now (the system clock: may jump; never for timeouts).
inline int64_t WallNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t MonotonicMs() const = 0;
  virtual int64_t WallMs() const = 0;
};

class SystemClock : public Clock {
 public:
  int64_t MonotonicMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  int64_t WallMs() const override { return WallNowMs(); }
};

// Simulated time for tests: starts at the given values, moves only by Advance().
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t mono = 1'000'000, int64_t wall = 1'700'000'000'000) : mono_(mono), wall_(wall) {}
  int64_t MonotonicMs() const override { return mono_.load(); }
  int64_t WallMs() const override { return wall_.load(); }
  void Advance(int64_t ms) {
    mono_ += ms;
    wall_ += ms;
  }

 private:
  std::atomic<int64_t> mono_, wall_;
};

}  // namespace ft
