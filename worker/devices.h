// The devices this node offers the daemon, with their memory.
//
// With the CUDA backend compiled in and a GPU visible, one device per GPU
// (kind "cuda"); otherwise one CPU device (kind "cpu") named after
// /proc/cpuinfo's "model name", with MemTotal as total and MemAvailable as
// free memory (used = total - free: the host's own numbers). With a fixed
// --cpu-memory the device is a budget, not the host: total is the budget,
// used is the resident memory of the running trainers' process trees (0 when
// idle; see process_memory.h) and free = total - used (never below 0).
// With --cpu-devices N the CPU is offered as N devices (indices 0..N-1, one
// rank of a multi-rank job each): each has 1/N of the host's memory (or the
// whole --cpu-memory budget) and 1/N of the trainers' resident memory as used.
//
// A CUDA query creates a context on every GPU (hundreds of MiB each), so the
// monitor releases the contexts right away and re-queries GPUs only while no
// trainer runs; while one does, GPU numbers are those of the last idle query.
//
// Thread safety: DeviceMonitor is not thread-safe; the functions are.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/device_kind.h"
#include "common/status.h"

namespace ft::worker {

struct Device {
  int index = 0;
  DeviceKind kind = DeviceKind::kCpu;  // DeviceKindName on the wire
  std::string name;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  int64_t used_bytes = 0;
};

struct DeviceOptions {
  int64_t cpu_memory_bytes = 0;  // > 0: each CPU device's total and free memory (--cpu-memory)
  int cpu_devices = 1;           // the CPU offered as this many devices (--cpu-devices)
  bool allow_cuda = true;        // false: report the CPU even when GPUs are visible
};

// The node's host memory: MemTotal and MemAvailable (what the memory
// techniques' host buffers come from). Unavailable when /proc/meminfo cannot
// be read.
struct HostMemory {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
};
StatusOr<HostMemory> ReadHostMemory();

// One discovery. Unavailable when /proc/meminfo cannot be read (CPU device,
// no override) or a GPU query fails after GPUs were found.
StatusOr<std::vector<Device>> DiscoverDevices(const DeviceOptions& options);

// How one rank of a multi-rank attempt starts on device `device_index` of `devices`: on a GPU, its
// CUDA_VISIBLE_DEVICES (the index counts the GPUs this worker sees: under the worker's own
// `cuda_visible` list, that list's entry) and NCCL between the ranks (ft-train --dist-backend nccl:
// each rank learns the NCCL id through the rendezvous rank 0 serves); on a CPU device, its share of
// the `cores` as OpenMP/OpenBLAS threads (none set when the operator set `omp_threads` for the
// worker: its trainers inherit that) and Gloo, ft-train's default ("").
struct RankLaunch {
  std::vector<std::string> env;  // NAME=VALUE added to the trainer's environment
  std::string dist_backend;      // ft-train --dist-backend ("" = its default, gloo)
};
RankLaunch RankLaunchOn(const std::vector<Device>& devices, int device_index, const char* cuda_visible,
                        const char* omp_threads, unsigned cores);

// The CPU device `index` of options.cpu_devices. `trainers_resident_bytes`:
// the running trainers' resident memory (all of them), used only with
// cpu_memory_bytes. Errors as DiscoverDevices.
StatusOr<Device> CpuDevice(const DeviceOptions& options, int64_t trainers_resident_bytes = 0, int index = 0);
// Every CPU device (options.cpu_devices of them).
StatusOr<std::vector<Device>> CpuDevices(const DeviceOptions& options, int64_t trainers_resident_bytes = 0);

// Keeps the device list and refreshes its free memory.
class DeviceMonitor {
 public:
  explicit DeviceMonitor(DeviceOptions options) : options_(options) {}

  // The first discovery; must succeed before Current() is used.
  Status Init();

  // The devices with fresh free memory where it is safe to measure (see the
  // file comment). `trainers`: pids of the running ft-train processes (empty =
  // idle); with --cpu-memory their trees' resident memory is the CPU's used.
  // Keeps the last numbers when a refresh fails.
  const std::vector<Device>& Current(const std::vector<pid_t>& trainers);

 private:
  DeviceOptions options_;
  std::vector<Device> devices_;
  std::chrono::steady_clock::time_point last_gpu_query_;
};

}  // namespace ft::worker
