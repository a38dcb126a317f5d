// The CUDA backend for a GPU test, or why it skips: nullptr with *skip set when
// the build has no CUDA or no device is visible. With FT_REQUIRE_GPU=1
// (bench/gpu/run.sh, on a GPU machine) a missing GPU is a test failure
// instead of a skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "engine/model/backend.h"

namespace ft::testing_support {

inline std::shared_ptr<Backend> CudaOrSkip(std::string* skip) {
  auto cuda = CreateBackend(DeviceKind::kCuda);
  if (cuda.ok()) return *cuda;
  const char* require = std::getenv("FT_REQUIRE_GPU");
  if (require != nullptr && std::string(require) == "1") {
    ADD_FAILURE() << "FT_REQUIRE_GPU=1 but " << cuda.status().ToString();
  }
  *skip = cuda.status().ToString() + " (this test runs on a GPU machine: bench/gpu/run.sh)";
  return nullptr;
}

}  // namespace ft::testing_support
