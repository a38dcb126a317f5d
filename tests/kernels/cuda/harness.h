// The CUDA op test harness, in the style of ggml's test-backend-ops: every
// CUDA op (kernels/cuda/ops.h) runs on fresh random inputs and is compared
// with the CPU reference (kernels/cpu), with a per-op error bound.
//
//   - CudaOpTest::SetUp skips the test ("no CUDA device: <why>") only when no
//     device is visible; with FT_REQUIRE_GPU=1 in the environment (set by
//     bench/gpu/run.sh) a missing device is a failure instead. On a machine
//     with a GPU every check runs and a wrong op fails.
//   - Inputs are random, drawn from a seed that is new on every run and
//     printed with every failure (FT_TEST_SEED=<n> replays one).
//   - Output buffers are poisoned (every byte 0xFF: NaN in fp32, bf16, fp16
//     and fp64) before the op runs, so an element the op forgot to write
//     fails the comparison.
//   - ExpectClose compares the norm-wise relative error ‖out − ref‖ / ‖ref‖
//     with the bound (fp32: kF32Bound = 1e-5, bf16/fp16: kHalfBound = 1e-2);
//     any non-finite output where the reference is finite fails. It prints
//     llm.c's "TENSOR OK" line with the error and the max abs diff.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/ops.h"

namespace ft::cuda::testing {

constexpr double kF32Bound = 1e-5;
constexpr double kHalfBound = 1e-2;

template <typename T>
constexpr double Bound() {
  return std::is_same_v<T, float> ? kF32Bound : kHalfBound;
}

// A CUDA runtime call in test code that must succeed: aborts loudly (with the
// call and file:line) otherwise, which fails the test binary.
#define FT_CUDA_TEST_CHECK(expr) ::ft::cuda::testing::CheckCuda((expr), #expr, __FILE__, __LINE__)
inline void CheckCuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, what, cudaGetErrorString(err));
  std::abort();
}

#define FT_ASSERT_OK(expr)                   \
  do {                                       \
    const ::ft::Status st_ = (expr);         \
    ASSERT_TRUE(st_.ok()) << st_.ToString(); \
  } while (0)

// Host <-> storage type conversions (round-to-nearest-even, the CPU's).
template <typename T>
T FromFloat(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat16_raw raw;
    raw.x = cpu::FloatToBf16(x);
    return bf16(raw);
  } else {
    __half_raw raw;
    raw.x = cpu::FloatToHalf(x);
    return fp16(raw);
  }
}
template <typename T>
float ToFloat(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return cpu::Bf16ToFloat(static_cast<__nv_bfloat16_raw>(x).x);
  } else {
    return cpu::HalfToFloat(static_cast<__half_raw>(x).x);
  }
}
// x rounded to T and back: the values a T tensor can hold.
template <typename T>
std::vector<float> RoundTo(std::vector<float> x) {
  for (float& v : x) v = ToFloat(FromFloat<T>(v));
  return x;
}
inline std::vector<double> ToDouble(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// A device array of n T's, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t n) : n_(n) {
    FT_CUDA_TEST_CHECK(cudaMalloc(&ptr_, Bytes() > 0 ? Bytes() : 1));
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(static_cast<int64_t>(host.size())) { Upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  int64_t size() const { return n_; }
  size_t Bytes() const { return static_cast<size_t>(n_) * sizeof(T); }
  void Poison() { FT_CUDA_TEST_CHECK(cudaMemset(ptr_, 0xFF, Bytes())); }
  void Upload(const std::vector<T>& host) {
    FT_CUDA_TEST_CHECK(cudaMemcpy(ptr_, host.data(), Bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> Download() const {
    FT_CUDA_TEST_CHECK(cudaDeviceSynchronize());  // the op's errors surface here
    std::vector<T> host(n_);
    FT_CUDA_TEST_CHECK(cudaMemcpy(host.data(), ptr_, Bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // Downloads and widens to float (for bf16/fp16 buffers).
  std::vector<float> DownloadFloat() const {
    const std::vector<T> raw = Download();
    std::vector<float> out(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) out[i] = ToFloat(raw[i]);
    return out;
  }

 private:
  int64_t n_;
  T* ptr_ = nullptr;
};

// A device buffer of T holding `values` (rounded to T).
template <typename T>
std::vector<T> Encode(const std::vector<float>& values) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = FromFloat<T>(values[i]);
  return out;
}

// ‖out − ref‖ / ‖ref‖ within `bound`, every output finite where ref is.
template <typename Ref>
::testing::AssertionResult Close(const std::string& name, const std::vector<float>& out,
                                 const std::vector<Ref>& ref, double bound) {
  if (out.size() != ref.size()) {
    return ::testing::AssertionFailure() << name << ": size " << out.size() << " != " << ref.size();
  }
  double diff2 = 0, ref2 = 0, max_abs = 0;
  int64_t bad = 0, first_bad = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    const double r = static_cast<double>(ref[i]), o = out[i];
    if (std::isfinite(r) != std::isfinite(o) || (!std::isfinite(r) && r != o)) {
      if (bad++ == 0) first_bad = static_cast<int64_t>(i);
      continue;
    }
    if (!std::isfinite(r)) continue;  // the same infinity on both sides
    diff2 += (o - r) * (o - r);
    ref2 += r * r;
    max_abs = std::max(max_abs, std::fabs(o - r));
  }
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (bad > 0) {
    return ::testing::AssertionFailure()
           << name << ": " << bad << " elements non-finite or unwritten (first at " << first_bad << ": out "
           << out[first_bad] << ", ref " << static_cast<double>(ref[first_bad]) << ")";
  }
  if (!(rel <= bound)) {
    return ::testing::AssertionFailure()
           << name << ": relative error " << rel << " > bound " << bound << " (maxdiff " << max_abs << ")";
  }
  std::printf("TENSOR OK %-28s rel %.3g (bound %.0e), maxdiff %.3g\n", name.c_str(), rel, bound, max_abs);
  return ::testing::AssertionSuccess();
}

// Skips without a GPU, owns a stream and the random source of one test.
class CudaOpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    auto devices = QueryDevices(&reason);
    ASSERT_TRUE(devices.ok()) << devices.status().ToString();
    if (devices->empty()) {
      const char* require = std::getenv("FT_REQUIRE_GPU");
      ASSERT_FALSE(require != nullptr && std::string(require) == "1")
          << "FT_REQUIRE_GPU=1 but no CUDA device: " << reason;
      GTEST_SKIP() << "no CUDA device: " << reason
                   << " (the CUDA op tests run on a GPU machine, bench/gpu/run.sh)";
    }
    FT_CUDA_TEST_CHECK(cudaStreamCreate(&stream_));
    const char* fixed = std::getenv("FT_TEST_SEED");
    seed_ =
        fixed != nullptr ? static_cast<uint32_t>(std::strtoul(fixed, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed_);
    RecordProperty("seed", std::to_string(seed_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (HasFailure()) std::printf("(replay with FT_TEST_SEED=%u)\n", seed_);
  }

  std::vector<float> Random(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng_);
    return x;
  }
  int RandomInt(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  void Sync() { FT_CUDA_TEST_CHECK(cudaStreamSynchronize(stream_)); }

  cudaStream_t stream_ = nullptr;
  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

}  // namespace ft::cuda::testing
