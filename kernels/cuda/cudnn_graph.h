// cuDNN's backend (graph) API, loaded at run time, and a small builder of
// operation graphs over it: what kernels/cuda/attention_cudnn.cu builds its
// SDPA graphs with. Compiled only where cudnn_graph.h was found
// (FT_HAVE_CUDNN); the library itself is dlopen'ed, so a binary built here
// runs on machines without libcudnn (the route then reports why).
//
// Thread safety: CudnnLibrary() is safe from any thread; a Graph and a Plan
// belong to one thread at a time.
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace ft::cuda::cudnn {

// The entry points this project calls, resolved from libcudnn.so.9.
struct Api {
  decltype(&cudnnGetVersion) GetVersion;
  decltype(&cudnnGetErrorString) GetErrorString;
  decltype(&cudnnCreate) Create;
  decltype(&cudnnDestroy) Destroy;
  decltype(&cudnnSetStream) SetStream;
  decltype(&cudnnBackendCreateDescriptor) CreateDescriptor;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor;
  decltype(&cudnnBackendSetAttribute) SetAttribute;
  decltype(&cudnnBackendGetAttribute) GetAttribute;
  decltype(&cudnnBackendFinalize) Finalize;
  decltype(&cudnnBackendExecute) Execute;
};

// Loads the library once per process: $FT_CUDNN_ROOT/lib/libcudnn.so.9 when
// FT_CUDNN_ROOT is set (the pip wheel nvidia-cudnn-cu*'s folder), else
// libcudnn.so.9 from the loader's path. Null when it cannot, with *why set
// (dlopen's error, a missing symbol, a major version other than 9).
const Api* Library(std::string* why);

// OK, or Internal naming `what` and cuDNN's message for `st`.
Status Check(cudnnStatus_t st, const char* what);

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  bool ok() const { return d_ != nullptr; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A tensor of the graph: its unique id (the variant pack's key) and descriptor.
struct Tensor {
  int64_t uid = 0;
  cudnnBackendDescriptor_t desc = nullptr;
};

// What a tensor is: 4-d dims and strides; virtual ones live inside the
// fused kernel; by-value ones are host scalars passed in the variant pack;
// ragged ones start each batch entry at the offset (in elements) that
// `ragged`'s [batch+1] int32 tensor holds.
struct TensorSpec {
  std::vector<int64_t> dims, strides;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  bool is_virtual = false;
  bool by_value = false;
  const Tensor* ragged = nullptr;
};

// An operation graph under construction. Each call adds a tensor or an
// operation; the first failure is kept and every later call is a no-op, so
// a graph reads as straight-line code and status() says what failed.
class Graph {
 public:
  explicit Graph(const Api* api) : api_(api) {}
  Tensor Add(const TensorSpec& spec);
  Tensor Virtual(std::vector<int64_t> dims, cudnnDataType_t type = CUDNN_DATA_FLOAT);  // packed strides
  // y = mode(x[, b[, t]]); GEN_INDEX takes `axis`.
  void Pointwise(cudnnPointwiseMode_t mode, Tensor x, const Tensor* b, const Tensor* t, Tensor y,
                 int64_t axis = -1);
  // c = a b with fp32 accumulation; the overrides (int32 [batch,1,1,1], nullable)
  // bound M, N and K per batch entry (variable sequence lengths).
  void Matmul(Tensor a, Tensor b, Tensor c, const Tensor* m_override, const Tensor* n_override,
              const Tensor* k_override);
  void Reduction(cudnnReduceTensorOp_t op, Tensor x, Tensor y);
  void Reshape(Tensor x, Tensor y);
  const Status& status() const { return status_; }
  const Api* api() const { return api_; }

 private:
  friend class Plan;
  Descriptor& New(cudnnBackendDescriptorType_t type);
  void Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* value, const char* what);
  void Finalize(cudnnBackendDescriptor_t d, const char* what);

  const Api* api_;
  Status status_;
  int64_t next_uid_ = 1;
  std::vector<std::unique_ptr<Descriptor>> owned_;  // every descriptor, alive as long as the plan
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// A finalized execution plan for one graph, with what it needs to run.
class Plan {
 public:
  // Finalizes the graph on `handle` and takes the first engine configuration
  // of heuristics mode A that finalizes and, when `deterministic`, carries
  // no CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC. FailedPrecondition naming the
  // reason when none does (no engine supports the graph; only
  // non-deterministic ones do); Internal on an API failure.
  static StatusOr<std::unique_ptr<Plan>> Build(std::unique_ptr<Graph> graph, cudnnHandle_t handle,
                                               bool deterministic);
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // Runs it on the handle's stream with the tensors' device (or, by value, host) pointers.
  Status Execute(cudnnHandle_t handle, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
                 void* workspace) const;

 private:
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<Descriptor> op_graph_, heuristics_, plan_;
  std::vector<std::unique_ptr<Descriptor>> configs_;
  int64_t workspace_bytes_ = 0;
};

}  // namespace ft::cuda::cudnn
