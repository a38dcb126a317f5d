#include "kernels/cuda/cudnn_graph.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace ft::cuda::cudnn {

namespace {

template <typename F>
bool Resolve(void* lib, const char* name, F* out, std::string* why) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr && why->empty()) *why = std::string("libcudnn has no ") + name;
  return *out != nullptr;
}

void* OpenLibrary(std::string* why) {
  std::string path = "libcudnn.so.9";
  if (const char* root = std::getenv("FT_CUDNN_ROOT"); root != nullptr && *root != '\0')
    path = std::string(root) + "/lib/libcudnn.so.9";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    *why = "dlopen " + path + ": " + (err != nullptr ? err : "failed") +
           " (install cuDNN 9, or set FT_CUDNN_ROOT to the nvidia-cudnn wheel's folder)";
  }
  return lib;
}

Api Load(std::string* why) {
  Api api{};
  void* lib = OpenLibrary(why);
  if (lib == nullptr) return api;
  bool all = Resolve(lib, "cudnnGetVersion", &api.GetVersion, why);
  all &= Resolve(lib, "cudnnGetErrorString", &api.GetErrorString, why);
  all &= Resolve(lib, "cudnnCreate", &api.Create, why);
  all &= Resolve(lib, "cudnnDestroy", &api.Destroy, why);
  all &= Resolve(lib, "cudnnSetStream", &api.SetStream, why);
  all &= Resolve(lib, "cudnnBackendCreateDescriptor", &api.CreateDescriptor, why);
  all &= Resolve(lib, "cudnnBackendDestroyDescriptor", &api.DestroyDescriptor, why);
  all &= Resolve(lib, "cudnnBackendSetAttribute", &api.SetAttribute, why);
  all &= Resolve(lib, "cudnnBackendGetAttribute", &api.GetAttribute, why);
  all &= Resolve(lib, "cudnnBackendFinalize", &api.Finalize, why);
  all &= Resolve(lib, "cudnnBackendExecute", &api.Execute, why);
  if (all && api.GetVersion() / 10000 != 9) {
    *why = "libcudnn is version " + std::to_string(api.GetVersion()) +
           "; this build speaks cuDNN 9's backend API";
    all = false;
  }
  if (!all) api.GetVersion = nullptr;  // the library stays loaded: dlclose of cuDNN is not safe to rely on
  return api;
}

}  // namespace

const Api* Library(std::string* why) {
  static std::string reason;
  static const Api api = Load(&reason);
  if (api.GetVersion == nullptr) {
    if (why != nullptr) *why = reason;
    return nullptr;
  }
  return &api;
}

Status Check(cudnnStatus_t st, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return Status::OK();
  const Api* api = Library(nullptr);
  const char* msg = api != nullptr ? api->GetErrorString(st) : "cuDNN not loaded";
  return Status::Internal(std::string(what) + ": " + msg + " (" + std::to_string(static_cast<int>(st)) + ")");
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  const Api* api = Library(nullptr);
  if (api == nullptr || api->CreateDescriptor(type, &d_) != CUDNN_STATUS_SUCCESS) d_ = nullptr;
}

Descriptor::~Descriptor() {
  if (d_ != nullptr) Library(nullptr)->DestroyDescriptor(d_);
}

Descriptor& Graph::New(cudnnBackendDescriptorType_t type) {
  owned_.push_back(std::make_unique<Descriptor>(type));
  if (status_.ok() && !owned_.back()->ok())
    status_ = Status::Internal("cudnnBackendCreateDescriptor(" + std::to_string(static_cast<int>(type)) +
                               ") failed");
  return *owned_.back();
}

void Graph::Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void* value, const char* what) {
  if (!status_.ok()) return;
  status_ = Check(api_->SetAttribute(d, name, type, count, value), what);
}

void Graph::Finalize(cudnnBackendDescriptor_t d, const char* what) {
  if (!status_.ok()) return;
  status_ = Check(api_->Finalize(d), what);
}

Tensor Graph::Add(const TensorSpec& spec) {
  Descriptor& t = New(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  Tensor out{next_uid_++, t.get()};
  const int64_t alignment = 16;
  const auto n = static_cast<int64_t>(spec.dims.size());
  Set(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &spec.type, "tensor data type");
  Set(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, spec.dims.data(), "tensor dims");
  Set(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, spec.strides.data(), "tensor strides");
  Set(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &out.uid, "tensor uid");
  Set(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
  Set(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &spec.is_virtual, "tensor virtual");
  if (spec.by_value)
    Set(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &spec.by_value, "by value");
  if (spec.ragged != nullptr) {
    Set(t.get(), CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &spec.ragged->desc,
        "tensor ragged offset");
  }
  Finalize(t.get(), "tensor");
  return out;
}

Tensor Graph::Virtual(std::vector<int64_t> dims, cudnnDataType_t type) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
  return Add({std::move(dims), std::move(strides), type, true});
}

void Graph::Pointwise(cudnnPointwiseMode_t mode, Tensor x, const Tensor* b, const Tensor* t, Tensor y,
                      int64_t axis) {
  Descriptor& pw = New(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  Set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  Set(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
  if (axis >= 0) Set(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
  Finalize(pw.get(), "pointwise");
  Descriptor& op = New(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  const cudnnBackendDescriptor_t pwd = pw.get();
  Set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pwd,
      "pw op");
  Set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc, "pw x");
  if (b != nullptr)
    Set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->desc, "pw b");
  if (t != nullptr)
    Set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t->desc, "pw t");
  Set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc, "pw y");
  Finalize(op.get(), "pointwise operation");
  ops_.push_back(op.get());
}

void Graph::Matmul(Tensor a, Tensor b, Tensor c, const Tensor* m_override, const Tensor* n_override,
                   const Tensor* k_override) {
  Descriptor& mm = New(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  Set(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
  if (m_override != nullptr ||
      n_override != nullptr) {  // rows and columns past a sequence's length read as 0
    const double padding = 0.0;
    Set(mm.get(), CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &padding, "matmul padding");
  }
  Finalize(mm.get(), "matmul");
  Descriptor& op = New(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  const cudnnBackendDescriptor_t mmd = mm.get();
  Set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mmd, "matmul op");
  Set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.desc, "matmul a");
  Set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.desc, "matmul b");
  Set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.desc, "matmul c");
  const std::pair<cudnnBackendAttributeName_t, const Tensor*> overrides[] = {
      {CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override},
      {CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override},
      {CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override}};
  for (const auto& [name, tensor] : overrides) {
    if (tensor != nullptr)
      Set(op.get(), name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensor->desc, "matmul override");
  }
  Finalize(op.get(), "matmul operation");
  ops_.push_back(op.get());
}

void Graph::Reduction(cudnnReduceTensorOp_t reduce, Tensor x, Tensor y) {
  Descriptor& r = New(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  Set(r.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce, "reduction op");
  Set(r.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
  Finalize(r.get(), "reduction");
  Descriptor& op = New(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  const cudnnBackendDescriptor_t rd = r.get();
  Set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction desc");
  Set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc,
      "reduction x");
  Set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc,
      "reduction y");
  Finalize(op.get(), "reduction operation");
  ops_.push_back(op.get());
}

void Graph::Reshape(Tensor x, Tensor y) {
  Descriptor& op = New(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  Set(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc, "reshape x");
  Set(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc, "reshape y");
  Finalize(op.get(), "reshape operation");
  ops_.push_back(op.get());
}

namespace {

// Whether an engine configuration's engine is marked non-deterministic.
StatusOr<bool> Nondeterministic(const Api* api, cudnnBackendDescriptor_t config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  int64_t n = 0;
  FT_RETURN_IF_ERROR(
      Check(api->GetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
            "engine config's engine"));
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  FT_RETURN_IF_ERROR(Check(api->GetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                             CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes),
                           "engine numerical notes"));
  for (int64_t i = 0; i < n; ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<Plan>> Plan::Build(std::unique_ptr<Graph> graph, cudnnHandle_t handle,
                                            bool deterministic) {
  FT_RETURN_IF_ERROR(graph->status());
  const Api* api = graph->api();
  auto plan = std::make_unique<Plan>();
  plan->op_graph_ = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  Graph& g = *graph;
  const cudnnBackendDescriptor_t og = plan->op_graph_->get();
  g.Set(og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  g.Set(og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(g.ops_.size()),
        g.ops_.data(), "graph ops");
  g.Finalize(og, "operation graph (no cuDNN engine fuses this SDPA graph)");
  plan->heuristics_ = std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendDescriptor_t h = plan->heuristics_->get();
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  g.Set(h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, "heuristics graph");
  g.Set(h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  g.Finalize(h, "heuristics");
  FT_RETURN_IF_ERROR(g.status());
  constexpr int64_t kMaxConfigs = 16;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < kMaxConfigs; ++i) {
    plan->configs_.push_back(std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(plan->configs_.back()->get());
  }
  int64_t count = 0;
  FT_RETURN_IF_ERROR(Check(api->GetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             kMaxConfigs, &count, raw.data()),
                           "heuristics results"));
  bool saw_nondeterministic = false;
  for (int64_t i = 0; i < count; ++i) {
    FT_ASSIGN_OR_RETURN(bool nondeterministic, Nondeterministic(api, raw[i]));
    if (deterministic && nondeterministic) {
      saw_nondeterministic = true;
      continue;
    }
    auto p = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    const cudnnBackendDescriptor_t pd = p->get();
    if (api->SetAttribute(pd, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle) != 0 ||
        api->SetAttribute(pd, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                          &raw[i]) != 0 ||
        api->Finalize(pd) != CUDNN_STATUS_SUCCESS) {
      continue;  // this engine does not take the graph: try the next
    }
    int64_t n = 0;
    FT_RETURN_IF_ERROR(Check(api->GetAttribute(pd, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                               1, &n, &plan->workspace_bytes_),
                             "plan workspace size"));
    plan->plan_ = std::move(p);
    plan->graph_ = std::move(graph);
    return plan;
  }
  return Status::FailedPrecondition(saw_nondeterministic
                                        ? "cuDNN offers only non-deterministic engines for this SDPA graph"
                                        : "no cuDNN engine finalizes this SDPA graph (" +
                                              std::to_string(count) + " tried)");
}

Status Plan::Execute(cudnnHandle_t handle, const std::vector<int64_t>& uids,
                     const std::vector<void*>& pointers, void* workspace) const {
  const Api* api = graph_->api();
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const cudnnBackendDescriptor_t vp = pack.get();
  const auto n = static_cast<int64_t>(uids.size());
  FT_RETURN_IF_ERROR(
      Check(api->SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data()),
            "variant pack ids"));
  FT_RETURN_IF_ERROR(Check(
      api->SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, pointers.data()),
      "variant pack pointers"));
  FT_RETURN_IF_ERROR(
      Check(api->SetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace),
            "variant pack workspace"));
  FT_RETURN_IF_ERROR(Check(api->Finalize(vp), "variant pack"));
  return Check(api->Execute(handle, plan_->get(), vp), "cudnnBackendExecute (SDPA)");
}

}  // namespace ft::cuda::cudnn
