// Which flash-attention route runs an attention call: ours
// (kernels/cuda/attention_tc_*.cu) or cuDNN's fused SDPA
// (kernels/cuda/attention_cudnn.h). The choice is data: a pure function of
// the request (job.yaml's train.attention) and the facts of the call, with
// no CUDA in it, so every refusal is tested on any machine
// (tests/engine/model/attention_route_test.cc).
//
// The rules: a route that cannot give this project's semantics is refused
// with the reason, never silently replaced: a deterministic backward (two
// runs give the same bytes), per-document masks of packed rows, and the
// shape's extras (sliding window, soft-cap, a KV cache). `cudnn` asked for
// explicitly and refused is an error naming the reason and the fix; `auto`
// takes cuDNN only where the measured per-GPU table below says it is
// faster and the facts allow it, else ours.
//
// Thread-safe: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft {

// What the job asked for (train.attention: flash = kOurs, cudnn = kCudnn, auto = kAuto).
enum class AttentionRouteRequest { kAuto, kOurs, kCudnn };
enum class AttentionRoute { kOurs, kCudnn };
const char* AttentionRouteName(AttentionRoute r);  // "ours" | "cudnn"

// The storage dtype of q, k, v and out.
enum class AttentionStorage { kF32, kBF16, kF16 };

// The oldest cuDNN this route builds its graphs for: 9.6.0 (ragged offsets
// with grouped-query heads; kernels/cuda/attention_cudnn.h), as cudnnGetVersion() counts.
constexpr int64_t kCudnnMinVersion = 90600;

struct AttentionRouteFacts {
  // The library: whether libcudnn loaded (kernels/cuda/attention_cudnn.h)
  // and, when not, why ("built without cudnn.h", "dlopen libcudnn.so.9: ...").
  bool cudnn_loaded = false;
  std::string cudnn_missing;
  int64_t cudnn_version = 0;  // cudnnGetVersion(): 91900 = 9.19.0
  int sm = 0;                 // the device's compute capability, major * 10 + minor (90 = H100/H200)
  std::string gpu;            // the device's name, for the measured-default table
  // The call.
  cpu::AttentionShape shape;
  AttentionStorage storage = AttentionStorage::kBF16;
  bool segments = false;    // packed rows: per-document masks
  int64_t documents = 0;    // cuDNN's batch: rows, or the documents' count rounded up (packed)
  int64_t max_doc_len = 0;  // cuDNN's sequence: seq, or the longest document rounded up (packed)
  // Device memory the deterministic backward may take for its dP scratch.
  int64_t workspace_budget_bytes = int64_t{2} << 30;
};

// Bytes of scratch cuDNN's deterministic backward needs on Hopper: dP in
// 16 bits for every (document, query head, query, key) of the padded batch,
// sequences rounded up to 64 (the cuDNN frontend's estimate, the one it
// sizes its limit by): documents * q_heads * ceil64(max_doc_len)^2 * 2.
int64_t CudnnDeterministicWorkspaceBytes(const AttentionRouteFacts& f);

// OK when cuDNN's route takes this call with this project's semantics; else
// FailedPrecondition (library missing, too old, wrong GPU) or Unimplemented
// (a shape feature the route has no deterministic, exact form for) whose
// message says why, in words a user can act on.
Status CudnnAttentionRefusal(const AttentionRouteFacts& f);

// Whether bench/gpu/run.sh has measured cuDNN's route faster than ours on
// the GPU `gpu` (cudaDeviceProp::name) with a deterministic backward at
// every case of bench/gpu/cases.txt. The table lives in attention_route.cc;
// it is empty until a run's numbers are recorded there (docs/PERFORMANCE.md).
bool CudnnMeasuredFaster(std::string_view gpu);

// kOurs -> ours. kCudnn -> cudnn, or CudnnAttentionRefusal's status (never
// ours in its place). kAuto -> cudnn when CudnnMeasuredFaster(f.gpu) and
// cuDNN takes the call, else ours.
StatusOr<AttentionRoute> ChooseAttentionRoute(AttentionRouteRequest request, const AttentionRouteFacts& f);

}  // namespace ft
