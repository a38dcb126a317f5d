#include "kernels/cuda/device_info.h"

#include <gtest/gtest.h>

namespace ft::cuda {
namespace {

TEST(CudaDeviceInfoTest, ReportsMemoryOfEachDevice) {
  std::string reason;
  auto devices = QueryDevices(&reason);
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  if (devices->empty()) GTEST_SKIP() << "no GPU on this machine (" << reason << "): CUDA device test skipped";
  for (const auto& d : *devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.compute_major, 8) << "ftune targets sm_80 and newer";
    EXPECT_GT(d.total_bytes, 1ull << 30);
    EXPECT_LE(d.free_bytes, d.total_bytes);
    EXPECT_GT(d.multiprocessors, 0);
  }
}

}  // namespace
}  // namespace ft::cuda
