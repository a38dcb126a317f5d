// What the CUDA devices of this machine are and how much memory they have.
//
// Used by the worker to report devices (and free memory) to the daemon and by
// the memory planner to size micro-batches. Compiled only when the CUDA
// toolkit is found; it links against the CUDA runtime, and on a machine with
// no GPU (or no driver) it returns an empty list, never an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace ft::cuda {

struct DeviceInfo {
  int index = 0;             // CUDA ordinal
  std::string name;          // e.g. "NVIDIA H100 80GB HBM3"
  int compute_major = 0;     // compute capability, e.g. 9
  int compute_minor = 0;     // e.g. 0
  uint64_t total_bytes = 0;  // device memory in bytes
  uint64_t free_bytes = 0;   // free now, as cudaMemGetInfo reports it
  int multiprocessors = 0;   // SM count
};

// Lists every visible device. An empty list means no usable GPU (no driver,
// no device, or CUDA_VISIBLE_DEVICES hides them all); `reason` (optional)
// then says why. Errors after a device was found are Unavailable.
StatusOr<std::vector<DeviceInfo>> QueryDevices(std::string* reason = nullptr);

}  // namespace ft::cuda
