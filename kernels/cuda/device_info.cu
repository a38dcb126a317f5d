#include <cuda_runtime.h>

#include "kernels/cuda/device_info.h"

namespace ft::cuda {

StatusOr<std::vector<DeviceInfo>> QueryDevices(std::string* reason) {
  std::vector<DeviceInfo> devices;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // No driver or no device is a normal state for a CPU-only node.
    if (reason) *reason = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, i);
    if (err != cudaSuccess) {
      return Status::Unavailable("cudaGetDeviceProperties(" + std::to_string(i) +
                                 "): " + cudaGetErrorString(err));
    }
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.total_bytes = prop.totalGlobalMem;
    info.multiprocessors = prop.multiProcessorCount;
    size_t free_b = 0, total_b = 0;
    err = cudaSetDevice(i);
    if (err == cudaSuccess) err = cudaMemGetInfo(&free_b, &total_b);
    if (err != cudaSuccess) {
      return Status::Unavailable("cudaMemGetInfo on device " + std::to_string(i) + ": " +
                                 cudaGetErrorString(err));
    }
    info.free_bytes = free_b;
    devices.push_back(info);
  }
  if (devices.empty() && reason) *reason = "no CUDA device visible";
  return devices;
}

}  // namespace ft::cuda
