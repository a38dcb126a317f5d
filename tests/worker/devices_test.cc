// Device discovery: the CPU device, with and without --cpu-memory.
#include "worker/devices.h"

#include <gtest/gtest.h>

namespace ft::worker {
namespace {

TEST(DevicesTest, CpuDeviceWithOverriddenMemory) {
  DeviceOptions options;
  options.cpu_memory_bytes = int64_t{8} << 30;
  options.allow_cuda = false;
  auto devices = DiscoverDevices(options);
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  ASSERT_EQ(devices->size(), 1u);
  const Device& d = (*devices)[0];
  EXPECT_EQ(d.kind, "cpu");
  EXPECT_EQ(d.index, 0);
  EXPECT_FALSE(d.name.empty());
  EXPECT_EQ(d.total_bytes, int64_t{8} << 30);
  EXPECT_EQ(d.free_bytes, int64_t{8} << 30);
}

TEST(DevicesTest, CpuDeviceFromProcMeminfo) {
  DeviceOptions options;
  options.allow_cuda = false;
  auto d = CpuDevice(options);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_GT(d->total_bytes, 0);
  EXPECT_GT(d->free_bytes, 0);
  EXPECT_LE(d->free_bytes, d->total_bytes);
  EXPECT_EQ(d->used_bytes, d->total_bytes - d->free_bytes);
}

TEST(DevicesTest, DiscoveryFindsSomething) {
  // GPUs where CUDA is compiled in and visible; else the CPU.
  auto devices = DiscoverDevices(DeviceOptions{});
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  ASSERT_FALSE(devices->empty());
  for (const Device& d : *devices) {
    EXPECT_TRUE(d.kind == "cpu" || d.kind == "cuda") << d.kind;
    EXPECT_GT(d.total_bytes, 0);
  }
}

TEST(DevicesTest, MonitorRefreshesCpuMemory) {
  DeviceOptions options;
  options.allow_cuda = false;
  DeviceMonitor monitor(options);
  ASSERT_TRUE(monitor.Init().ok());
  const std::vector<Device>& now = monitor.Current(/*busy=*/true);
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].kind, "cpu");
  EXPECT_GT(now[0].free_bytes, 0);
}

}  // namespace
}  // namespace ft::worker
