// The memory planner: predicts the bytes a training job needs on a device and
// picks the largest micro-batch that fits, with
//   accumulation = global_batch / (micro × world)
// so the global batch, and with it the training math, never depends on the
// device. It works from the model's config.json alone (no weights), so a
// laptop can plan a Llama-3-8B. The daemon uses the same library to decide
// where a job fits.
//
// The model mirrors how the engine allocates (engine/model/model.cc arenas) and is
// checked against the tracking allocator's measured peak (tests/engine/model/memory_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/job/job_spec.h"
#include "engine/model/model_config.h"

namespace ft {

struct PlanRequest {
  ModelConfig model;
  DeviceKind device = DeviceKind::kCpu;
  ComputeDType dtype = ComputeDType::kF32;
  bool nf4 = false;
  bool double_quant = true;
  int64_t nf4_block = 64;
  bool full = false;  // full fine-tune instead of LoRA
  int64_t lora_r = 16;
  std::vector<std::string> lora_targets;
  double lora_dropout = 0;
  int64_t seq_len = 2048;
  // Sequences per micro-batch unit: 2 for DPO's preference pairs (chosen and rejected rows).
  int64_t sequences_per_example = 1;
  bool activation_checkpointing = true;
  bool offload_activations = false;  // checkpointing with the layer inputs in host memory
  bool cpu_offload = false;          // frozen linear weights in host memory, two layers staged
  bool paged_optimizer = false;      // Adam moments in host memory, two parameters paged in
  bool exact_gradient_sum = false;   // train.gradient_sum exact: host accumulators, wider all-reduce
  // distributed.strategy fsdp at world > 1 (LoRA/QLoRA): each rank keeps 1/world of every layer's
  // frozen linear storage (plus two gathered layers) and 1/world of the Adam moments.
  bool fsdp = false;
  int64_t global_batch = 1;
  int64_t world = 1;
  int64_t loss_chunk_rows = 0;  // 0 = the engine's default budget
  // train.attention: cudnn on CUDA: cuDNN's deterministic backward's dP scratch and its 16-bit
  // gradient copies (engine/model/attention_route.h); `packed`: data.packing (documents per row).
  bool cudnn_attention = false;
  bool packed = false;
  bool operator==(const PlanRequest&) const = default;  // every field: what the plan depends on
};

// Bytes by category for one micro-batch size (device memory of one rank; under
// FSDP, of rank 0, whose optimizer range is never smaller than another's).
struct MemoryBreakdown {
  int64_t micro_batch = 0;
  int64_t weights = 0;  // frozen base weights (NF4 or compute dtype), embeddings, norms, head
  int64_t adapter = 0;  // trainable LoRA master weights (fp32)
  int64_t gradients = 0;
  int64_t optimizer = 0;    // AdamW moments (fp32)
  int64_t activations = 0;  // saved for backward
  int64_t workspace = 0;    // backward buffers, logits chunk, RoPE tables, dequant scratch
  int64_t runtime = 0;      // CUDA context and library handles (0 on CPU)
  int64_t total() const {
    return weights + adapter + gradients + optimizer + activations + workspace + runtime;
  }
  // Host memory the memory techniques use instead (Backend::AllocHost):
  // offloaded frozen weights, paged Adam moments, offloaded layer inputs.
  int64_t host_weights = 0;
  int64_t host_optimizer = 0;
  int64_t host_activations = 0;
  // train.gradient_sum exact: the binned accumulators and the host copy of every gradient.
  int64_t host_gradient_sum = 0;
  int64_t host_total() const { return host_weights + host_optimizer + host_activations + host_gradient_sum; }
  int64_t trainable_values = 0;  // adapter (or every weight, full) values with a gradient
};

// Bytes per trainable value of an exact gradient sum (engine/dist/exact_sum.h:
// two int64 bins and an int8 index), in host memory and in each step's
// all-reduce; an fp32 sum's all-reduce carries kF32SumBytesPerValue.
constexpr int64_t kExactSumBytesPerValue = 17;
constexpr int64_t kF32SumBytesPerValue = 4;

struct BatchPlanChoice {
  int64_t micro_batch = 0;
  int64_t accumulation = 0;
  int64_t world = 1;
  MemoryBreakdown memory;    // at the chosen micro-batch
  int64_t device_bytes = 0;  // what the device offered
};

// Predicted memory at `micro_batch`.
MemoryBreakdown PredictMemory(const PlanRequest& r, int64_t micro_batch);

// The largest micro-batch dividing global_batch / world whose prediction fits
// in `device_bytes` (less a 5% margin). ResourceExhausted, naming the bytes
// needed at micro-batch 1, when nothing fits; InvalidArgument when world does
// not divide the global batch.
StatusOr<BatchPlanChoice> ChooseMicroBatch(const PlanRequest& r, int64_t device_bytes);

// The plan at a micro-batch the job fixed (`micro_batch` per rank) when its
// prediction fits in `device_bytes` (as `ft-train plan` judges it: no
// margin). ResourceExhausted otherwise, before anything is allocated: the
// bytes it needs (weights, activations, workspace), what the device offers,
// and the fix (the largest micro-batch that fits, or auto; when none fits,
// the memory techniques).
StatusOr<BatchPlanChoice> CheckFixedMicroBatch(const PlanRequest& r, int64_t micro_batch,
                                               int64_t device_bytes);

// The micro-batch a job fixes itself for `world` ranks: micro_batch_size, or
// the one gradient_accumulation implies; 0 when both are auto (the planner picks).
int64_t FixedMicroBatch(const JobSpec& spec, int64_t world);

// OK unless the job runs on CUDA and the CUDA kernels cannot run the model
// (the attention's head dims: engine/model/backend.h CheckHeadDimForDevice);
// then InvalidArgument "<job file>: resources.device: <how>, but model.path
// <dir> (config.json) has head_dim 16: ...; use resources.device: cpu".
// `how` says how CUDA was chosen ("cuda", or "auto found a CUDA device").
// ft-train checks before it loads the model, ftd when the job is submitted.
Status CheckCudaTakesModel(const JobSpec& spec, const ModelConfig& model, const std::string& how);

// OK unless the job does not fit the model: a LoRA adapter.target_modules
// naming a module the model's family lacks (a Llama's qkv_proj, a Phi-3's
// q_proj: InvalidArgument "<job file>: adapter.target_modules: module 'q_proj'
// is not a module of a phi3 model (its modules: ...)"), or a config.json
// whose max_position_embeddings is below data.seq_len (InvalidArgument naming
// both, the config.json and the fix; a config.json without the key is not
// checked). ft-train checks before it loads the model, ftd when the job is
// submitted.
Status CheckJobTakesModel(const JobSpec& spec, const ModelConfig& model);

// Builds a request from a job and the model's config.
PlanRequest PlanRequestFromJob(const JobSpec& spec, const ModelConfig& model, DeviceKind device,
                               int64_t world);

// "24GiB", "512MiB", "8e9", "16G" → bytes. InvalidArgument otherwise.
StatusOr<int64_t> ParseBytes(const std::string& text);
std::string FormatBytes(int64_t bytes);  // "7.42 GiB"

// A human-readable breakdown and plan (what `ft-train plan` prints).
std::string FormatPlan(const PlanRequest& r, const BatchPlanChoice& c);

}  // namespace ft
