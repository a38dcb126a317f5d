// The parts of engine/model/backend.h shared by every backend: DeviceBuffer,
// tracked allocation and the backend factory.
#include "engine/model/backend.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace ft {

#ifdef FT_HAVE_CUDA
// engine/cuda_backend.cu.
StatusOr<std::shared_ptr<Backend>> CreateCudaBackend();
#endif

int64_t ActDTypeBytes(ActDType t) { return t == ActDType::kF32 ? 4 : 2; }
const char* ActDTypeName(ActDType t) {
  static constexpr const char* kNames[] = {"fp32", "bf16", "fp16"};
  return kNames[static_cast<int>(t)];
}

namespace {
std::shared_ptr<Backend> DefaultCpuBackend() {
  static const std::shared_ptr<Backend> instance = [] {
    const char* mib = std::getenv("FT_GUARDED_DEVICE_MEMORY");
    if (mib == nullptr || *mib == '\0') return CpuBackendInstance();
    const long long n = std::atoll(mib);
    FT_CHECK(n > 0);  // FT_GUARDED_DEVICE_MEMORY: the guarded arena's capacity in MiB
    return MakeGuardedCpuBackend(static_cast<int64_t>(n) << 20);
  }();
  return instance;
}
}  // namespace

StatusOr<std::shared_ptr<Backend>> CreateBackend(DeviceKind kind) {
  if (kind == DeviceKind::kCpu) return DefaultCpuBackend();
#ifdef FT_HAVE_CUDA
  return CreateCudaBackend();
#else
  return Status::Unimplemented(
      "device cuda: this build has no CUDA backend (built without the CUDA toolkit); use cpu");
#endif
}

Status Backend::SetAttentionRoute(AttentionRouteRequest request) {
  if (request != AttentionRouteRequest::kCudnn) return Status::OK();
  return Status::FailedPrecondition("train.attention: cudnn runs on the CUDA backend, not on " + Describe() +
                                    "; use attention: flash (or auto)");
}

DeviceBuffer Backend::Alloc(int64_t n_floats, MemCategory category, MemoryTracker* tracker) {
  FT_CHECK(n_floats >= 0);
  return AllocBytes(n_floats * static_cast<int64_t>(sizeof(float)), category, tracker);
}

DeviceBuffer Backend::AllocBytes(int64_t bytes, MemCategory category, MemoryTracker* tracker) {
  return Allocate(bytes, false, category, tracker);
}

DeviceBuffer Backend::AllocHost(int64_t bytes, MemCategory category, MemoryTracker* tracker) {
  return Allocate(bytes, true, category, tracker);
}

DeviceBuffer Backend::Allocate(int64_t bytes, bool host, MemCategory category, MemoryTracker* tracker) {
  FT_CHECK(bytes >= 0);
  DeviceBuffer b;
  if (bytes == 0) return b;
  b.ptr_ = host ? RawAllocHost(bytes) : RawAlloc(bytes);
  if (b.ptr_ == nullptr) throw std::bad_alloc();
  b.bytes_ = bytes;
  b.host_ = host;
  b.category_ = category;
  b.tracker_ = tracker;
  b.backend_ = this;
  if (tracker) tracker->Add(category, bytes);
  return b;
}

void* Backend::RawAllocHost(int64_t bytes) {
  const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p != nullptr) std::memset(p, 0, rounded);
  return p;
}

void Backend::RawFreeHost(void* p) { std::free(p); }

void Backend::InlineCopy(void* dst, const void* src, int64_t bytes, bool to_device, CopyStats* stats) {
  if (bytes <= 0) return;
  const auto start = std::chrono::steady_clock::now();
  std::memcpy(dst, src, static_cast<size_t>(bytes));
  stats->wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  (to_device ? stats->to_device_bytes : stats->to_host_bytes) += bytes;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(other.ptr_),
      bytes_(other.bytes_),
      host_(other.host_),
      category_(other.category_),
      tracker_(other.tracker_),
      backend_(other.backend_) {
  other.ptr_ = nullptr;
  other.bytes_ = 0;
  other.tracker_ = nullptr;
  other.backend_ = nullptr;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    host_ = other.host_;
    category_ = other.category_;
    tracker_ = other.tracker_;
    backend_ = other.backend_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
    other.tracker_ = nullptr;
    other.backend_ = nullptr;
  }
  return *this;
}

void DeviceBuffer::Release() {
  if (ptr_ == nullptr) return;
  if (host_) {
    backend_->RawFreeHost(ptr_);
  } else {
    backend_->RawFree(ptr_);
  }
  if (tracker_) tracker_->Sub(category_, bytes_);
  ptr_ = nullptr;
  bytes_ = 0;
  tracker_ = nullptr;
  backend_ = nullptr;
}

}  // namespace ft
