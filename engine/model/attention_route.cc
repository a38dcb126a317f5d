#include "engine/model/attention_route.h"

#include <array>

namespace ft {

namespace {

// GPUs (cudaDeviceProp::name) on which bench/gpu/run.sh measured cuDNN's
// route faster than ours at every attention case, backward deterministic.
// Empty: no run has measured it yet; add a name only with the run's table
// in docs/PERFORMANCE.md.
constexpr std::array<std::string_view, 0> kCudnnFasterOn = {};

std::string Version(int64_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string GiB(int64_t bytes) {
  const int64_t tenths = (bytes * 10 + (int64_t{1} << 29)) >> 30;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " GiB";
}

// The library and the device: loaded, new enough, free of known bugs, a GPU whose backward is deterministic.
Status LibraryRefusal(const AttentionRouteFacts& f) {
  if (!f.cudnn_loaded) return Status::FailedPrecondition("cuDNN is not available: " + f.cudnn_missing);
  if (f.cudnn_version < kCudnnMinVersion || f.cudnn_version >= 100000) {
    return Status::FailedPrecondition("cuDNN " + Version(f.cudnn_version) +
                                      " is loaded; the route needs 9.x from " + Version(kCudnnMinVersion) +
                                      " (ragged documents with grouped-query heads)");
  }
  if (f.cudnn_version == 91000 || f.cudnn_version == 91001) {
    return Status::FailedPrecondition(
        "cuDNN " + Version(f.cudnn_version) +
        " has known bf16/fp16 SDPA bugs (NVIDIA's frontend refuses it): use 9.10.2 or newer");
  }
  if (f.sm / 10 != 9) {
    return Status::FailedPrecondition(
        "cuDNN's deterministic SDPA backward is built here for Hopper (sm_90) only; this GPU is sm_" +
        std::to_string(f.sm) +
        " (Ampere/Ada have none for packed documents, Blackwell needs engine knobs this route does not set)");
  }
  return Status::OK();
}

// The shape: what our kernels take and this route does not express.
Status ShapeRefusal(const AttentionRouteFacts& f) {
  const cpu::AttentionShape& s = f.shape;
  if (f.storage == AttentionStorage::kF32) {
    return Status::Unimplemented(
        "cuDNN's fused SDPA takes bf16 or fp16 tensors; this model stores fp32 (model.dtype: bf16 uses it)");
  }
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256) {
    return Status::Unimplemented("the cuDNN route is built for head dims 64, 128 and 256, not " +
                                 std::to_string(s.head_dim));
  }
  if (s.softcap > 0) {
    return Status::Unimplemented(
        "the cuDNN route takes no soft-capped scores (Gemma 2's attn_logit_softcapping): cuDNN's "
        "fused engines do not fuse the tanh");
  }
  if (s.window > 0) {
    return Status::Unimplemented("the cuDNN route does not express sliding windows (window " +
                                 std::to_string(s.window) + ") yet; our kernels do");
  }
  if (s.past() != 0) {
    return Status::Unimplemented("the cuDNN route runs training attention only: no KV cache (" +
                                 std::to_string(s.past()) + " cached keys)");
  }
  const int64_t elements = s.batch * s.seq * s.q_heads * s.head_dim;
  if (elements >= (int64_t{1} << 31)) {
    return Status::Unimplemented("the cuDNN route's ragged offsets are int32: " + std::to_string(elements) +
                                 " elements per tensor is too many; use a smaller micro-batch");
  }
  return Status::OK();
}

}  // namespace

const char* AttentionRouteName(AttentionRoute r) { return r == AttentionRoute::kCudnn ? "cudnn" : "ours"; }

int64_t CudnnDeterministicWorkspaceBytes(const AttentionRouteFacts& f) {
  const int64_t s = (f.max_doc_len + 63) / 64 * 64;
  return f.documents * f.shape.q_heads * s * s * 2;
}

Status CudnnAttentionRefusal(const AttentionRouteFacts& f) {
  FT_RETURN_IF_ERROR(LibraryRefusal(f));
  FT_RETURN_IF_ERROR(ShapeRefusal(f));
  const int64_t need = CudnnDeterministicWorkspaceBytes(f);
  if (need > f.workspace_budget_bytes) {
    return Status::ResourceExhausted(
        "cuDNN's deterministic backward needs " + GiB(need) + " of dP scratch (" +
        std::to_string(f.documents) + (f.segments ? " documents" : " rows") + " x " +
        std::to_string(f.shape.q_heads) + " heads x " + std::to_string(f.max_doc_len) +
        "^2 x 2 bytes), over its " + GiB(f.workspace_budget_bytes) + " budget; use a smaller micro-batch" +
        (f.segments ? " or fewer, more even documents per row" : ""));
  }
  return Status::OK();
}

bool CudnnMeasuredFaster(std::string_view gpu) {
  for (std::string_view name : kCudnnFasterOn) {
    if (name == gpu) return true;
  }
  return false;
}

StatusOr<AttentionRoute> ChooseAttentionRoute(AttentionRouteRequest request, const AttentionRouteFacts& f) {
  switch (request) {
    case AttentionRouteRequest::kOurs: return AttentionRoute::kOurs;
    case AttentionRouteRequest::kCudnn:
      FT_RETURN_IF_ERROR(
          CudnnAttentionRefusal(f).WithContext("train.attention: cudnn (train.attention: flash runs ours)"));
      return AttentionRoute::kCudnn;
    case AttentionRouteRequest::kAuto: break;
  }
  if (CudnnMeasuredFaster(f.gpu) && CudnnAttentionRefusal(f).ok()) return AttentionRoute::kCudnn;
  return AttentionRoute::kOurs;
}

}  // namespace ft
