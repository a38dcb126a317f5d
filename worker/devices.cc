#include "worker/devices.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "common/logging.h"
#include "worker/process_memory.h"

#ifdef FT_WORKER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/device_info.h"
#endif

namespace ft::worker {

namespace {

// GPUs are re-queried at most this often (each query creates CUDA contexts).
constexpr auto kGpuRefreshInterval = std::chrono::seconds(30);

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string ReadCpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return Trim(line.substr(colon + 1));
  }
  return "cpu";
}

const std::string& CpuModelName() {
  static const std::string name = ReadCpuModelName();  // /proc/cpuinfo is large on big hosts
  return name;
}

// MemTotal and MemAvailable in bytes.
Status ReadMemInfo(int64_t* total, int64_t* available) {
  std::ifstream in("/proc/meminfo");
  if (!in) return Status::Unavailable("/proc/meminfo: cannot open");
  *total = *available = -1;
  for (std::string line; std::getline(in, line);) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %lld kB", &kb) == 1) *total = kb * 1024;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kb) == 1) *available = kb * 1024;
  }
  if (*total < 0 || *available < 0) return Status::Unavailable("/proc/meminfo: no MemTotal/MemAvailable");
  return Status::OK();
}

}  // namespace

StatusOr<HostMemory> ReadHostMemory() {
  HostMemory h;
  FT_RETURN_IF_ERROR(ReadMemInfo(&h.total_bytes, &h.free_bytes));
  return h;
}

namespace {

#ifdef FT_WORKER_HAVE_CUDA
// Every visible GPU; empty when there is none. Releases the contexts the query created.
StatusOr<std::vector<Device>> CudaDevices() {
  std::string reason;
  auto infos = ft::cuda::QueryDevices(&reason);
  std::vector<Device> out;
  if (infos.ok()) {
    for (const ft::cuda::DeviceInfo& d : *infos) {
      const auto total = static_cast<int64_t>(d.total_bytes), free = static_cast<int64_t>(d.free_bytes);
      out.push_back({d.index, DeviceKind::kCuda, d.name, total, free, total - free});
      if (cudaSetDevice(d.index) == cudaSuccess) cudaDeviceReset();
    }
  }
  if (!infos.ok()) return infos.status();
  if (out.empty()) FT_LOG(DEBUG) << "no CUDA device: " << reason;
  return out;
}
#endif

}  // namespace

StatusOr<Device> CpuDevice(const DeviceOptions& options, int64_t trainers_resident_bytes, int index) {
  const int64_t n = std::max(1, options.cpu_devices);
  Device d;
  d.index = index;
  d.kind = DeviceKind::kCpu;
  d.name = CpuModelName();
  if (options.cpu_memory_bytes > 0) {
    d.total_bytes = options.cpu_memory_bytes;
    d.used_bytes = std::max<int64_t>(0, trainers_resident_bytes) / n;  // may exceed the budget: say so
    d.free_bytes = std::max<int64_t>(0, d.total_bytes - d.used_bytes);
    return d;
  }
  FT_RETURN_IF_ERROR(ReadMemInfo(&d.total_bytes, &d.free_bytes));
  d.total_bytes /= n;
  d.free_bytes /= n;
  d.used_bytes = d.total_bytes - d.free_bytes;
  return d;
}

StatusOr<std::vector<Device>> CpuDevices(const DeviceOptions& options, int64_t trainers_resident_bytes) {
  std::vector<Device> out;
  for (int i = 0; i < std::max(1, options.cpu_devices); ++i) {
    FT_ASSIGN_OR_RETURN(Device d, CpuDevice(options, trainers_resident_bytes, i));
    out.push_back(std::move(d));
  }
  return out;
}

StatusOr<std::vector<Device>> DiscoverDevices(const DeviceOptions& options) {
#ifdef FT_WORKER_HAVE_CUDA
  if (options.allow_cuda) {
    FT_ASSIGN_OR_RETURN(std::vector<Device> gpus, CudaDevices());
    if (!gpus.empty()) return gpus;
  }
#endif
  return CpuDevices(options);
}

Status DeviceMonitor::Init() {
  FT_ASSIGN_OR_RETURN(devices_, DiscoverDevices(options_));
  last_gpu_query_ = std::chrono::steady_clock::now();
  return Status::OK();
}

const std::vector<Device>& DeviceMonitor::Current(const std::vector<pid_t>& trainers) {
  const bool busy = !trainers.empty();
  const bool cpu = !devices_.empty() && devices_[0].kind == DeviceKind::kCpu;
  if (cpu) {
    int64_t resident = 0;
    if (options_.cpu_memory_bytes > 0 && busy) {
      auto bytes = ProcessTreesResidentBytes(trainers);
      if (!bytes.ok()) {
        FT_LOG(WARN) << "device refresh: " << bytes.status().ToString();
        return devices_;  // keep the last numbers
      }
      resident = *bytes;
    }
    auto fresh = CpuDevices(options_, resident);
    if (fresh.ok()) devices_ = std::move(*fresh);
    return devices_;
  }
  const auto now = std::chrono::steady_clock::now();
  if (busy || now - last_gpu_query_ < kGpuRefreshInterval) return devices_;
  last_gpu_query_ = now;
  auto fresh = DiscoverDevices(options_);
  if (fresh.ok() && !fresh->empty()) devices_ = *fresh;
  if (!fresh.ok()) FT_LOG(WARN) << "device refresh: " << fresh.status().ToString();
  return devices_;
}

RankLaunch RankLaunchOn(const std::vector<Device>& devices, int device_index, const char* cuda_visible,
                        const char* omp_threads, unsigned cores) {
  if (!devices.empty() && devices[0].kind == DeviceKind::kCuda) {
    std::string visible = std::to_string(device_index);
    if (cuda_visible != nullptr && *cuda_visible != '\0') {
      std::stringstream list(cuda_visible);
      std::string entry;
      for (int i = 0; std::getline(list, entry, ','); ++i) {
        if (i == device_index) visible = entry;
      }
    }
    return {{"CUDA_VISIBLE_DEVICES=" + visible}, "nccl"};
  }
  if (omp_threads != nullptr) return {};
  const std::string threads =
      std::to_string(std::max<size_t>(1, std::max(1u, cores) / std::max<size_t>(1, devices.size())));
  return {{"OMP_NUM_THREADS=" + threads, "OPENBLAS_NUM_THREADS=" + threads}, ""};
}

}  // namespace ft::worker
