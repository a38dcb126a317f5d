// Internal to kernels/cuda: turning CUDA runtime errors into ft::Status.
//
// CudaStatus(err, what) is OK for cudaSuccess and Status::Internal("what:
// <CUDA error string>") otherwise. LaunchStatus(kernel) checks the launch that
// just happened (cudaGetLastError), so every launcher ends with
// `return LaunchStatus("KernelName");`.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/status.h"

namespace ft::cuda::internal {

inline Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  return Status::Internal(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                          ")");
}

inline Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), (std::string("launch of ") + kernel).c_str());
}

// Blocks of `threads` threads covering n items (at least one block; capped at
// the grid's x limit, kernels then stride).
inline unsigned BlocksFor(int64_t n, int threads) {
  constexpr int64_t kMaxBlocks = 2147483647;
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace ft::cuda::internal
