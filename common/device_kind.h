// The kinds of device a job runs on and a worker offers (job.yaml's
// resources.device, ft-worker's devices, the scheduler's placement, the
// engine's backends): one enum for all of them, with its name table.
#pragma once

#include <string_view>

#include "common/enum_table.h"

namespace ft {

enum class DeviceKind { kCpu, kCuda };

template <>
struct EnumTraits<DeviceKind> {
  static constexpr std::string_view kWhat = "device";
  static constexpr EnumEntry<DeviceKind> kTable[] = {
      {"cpu", DeviceKind::kCpu, "the host's cores (the reference backend; Gloo across ranks)"},
      {"cuda", DeviceKind::kCuda, "an NVIDIA GPU (the CUDA backend; NCCL across ranks)"},
  };
};

inline const char* DeviceKindName(DeviceKind kind) { return EnumName(kind).data(); }
// "cpu" or "cuda" to a kind; InvalidArgument naming the accepted names otherwise.
inline StatusOr<DeviceKind> ParseDeviceKind(std::string_view name) { return ParseEnum<DeviceKind>(name); }

}  // namespace ft
