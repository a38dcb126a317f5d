// The named choices of job.yaml, each an enum with one table of
// {name, value, one-line meaning} (common/enum_table.h). The table alone
// drives parsing and the "one of ..." error (job_spec.cc), the job's math
// hash (job_hash.cc: the names, so a checkpoint's hash never changes), the
// plan's text and the docs' key list (docs/JOB_YAML.md; a test checks that
// it names every value). A table's order is the order of the error's list.
//
// model.dtype is ComputeDType (engine/model/compute_dtype.h) and
// resources.device is a DeviceRequest over DeviceKind (common/device_kind.h).
#pragma once

#include <optional>
#include <string_view>

#include "common/device_kind.h"
#include "common/enum_table.h"
#include "engine/model/compute_dtype.h"

namespace ft {

// model.quantization
enum class Quantization { kNone, kNf4 };
template <>
struct EnumTraits<Quantization> {
  static constexpr std::string_view kWhat = "model.quantization";
  static constexpr EnumEntry<Quantization> kTable[] = {
      {"none", Quantization::kNone, "base weights in model.dtype"},
      {"nf4", Quantization::kNf4,
       "base weights in 4-bit NormalFloat, frozen (QLoRA; needs adapter.type: lora)"},
  };
};

// adapter.type
enum class AdapterType { kLora, kFull };
template <>
struct EnumTraits<AdapterType> {
  static constexpr std::string_view kWhat = "adapter.type";
  static constexpr EnumEntry<AdapterType> kTable[] = {
      {"lora", AdapterType::kLora, "train low-rank adapters on the frozen base weights (LoRA/QLoRA)"},
      {"full", AdapterType::kFull, "train every weight (no quantization, cpu_offload or multi-rank fsdp)"},
  };
};

// data.format (engine/data/data_format.h encodes each)
enum class DataFormat { kTokens, kText, kAlpaca, kChat, kPreference };
template <>
struct EnumTraits<DataFormat> {
  static constexpr std::string_view kWhat = "data.format";
  static constexpr EnumEntry<DataFormat> kTable[] = {
      {"text", DataFormat::kText, "{\"text\": ...}: loss on every token"},
      {"alpaca", DataFormat::kAlpaca, "{\"instruction\", \"input\"?, \"output\"}: loss on the output"},
      {"chat", DataFormat::kChat, "{\"messages\": [...]} through the chat template: loss on assistant turns"},
      {"tokens", DataFormat::kTokens, "{\"input_ids\", \"labels\"?}: token ids as given"},
      {"preference", DataFormat::kPreference,
       "{\"prompt\", \"chosen\", \"rejected\"} as strings, as messages through the chat template, or as "
       "*_ids: preference pairs for train.objective: dpo"},
  };
};

// train.objective (engine/train/objective.h)
enum class TrainObjective { kSft, kDpo };
template <>
struct EnumTraits<TrainObjective> {
  static constexpr std::string_view kWhat = "train.objective";
  static constexpr EnumEntry<TrainObjective> kTable[] = {
      {"sft", TrainObjective::kSft, "mean token cross-entropy of the targets (supervised fine-tuning)"},
      {"dpo", TrainObjective::kDpo,
       "TRL's DPO on preference pairs (data.format: preference); the reference: the adapter off (LoRA, "
       "QLoRA) or the weights as loaded, stored beside the data (a full fine-tune)"},
  };
};

// train.dpo.loss
enum class DpoLoss { kSigmoid, kIpo };
template <>
struct EnumTraits<DpoLoss> {
  static constexpr std::string_view kWhat = "train.dpo.loss";
  static constexpr EnumEntry<DpoLoss> kTable[] = {
      {"sigmoid", DpoLoss::kSigmoid, "-log sigmoid(beta z) (DPO), with label_smoothing as TRL's"},
      {"ipo", DpoLoss::kIpo, "(z - 1/(2 beta))^2 over mean response log-probabilities (IPO)"},
  };
};

// train.early_stopping.metric: what an evaluation is judged by (engine/train/early_stopping.h):
// the early-stopping decision and checkpoint.keep_best's best checkpoint. Each value is one of
// EvalMetrics' numbers; EvalMetricHigherIsBetter and EvalMetricNeedsDpo give its direction and
// the objective that reports it.
enum class EvalMetric { kEvalLoss, kEvalRewardAccuracies, kEvalRewardMargins };
template <>
struct EnumTraits<EvalMetric> {
  static constexpr std::string_view kWhat = "train.early_stopping.metric";
  static constexpr EnumEntry<EvalMetric> kTable[] = {
      {"eval_loss", EvalMetric::kEvalLoss, "the objective's loss on the evaluation set; lower is better"},
      {"eval_rewards/accuracies", EvalMetric::kEvalRewardAccuracies,
       "DPO: the share of evaluation pairs whose chosen response has the higher reward; higher is better"},
      {"eval_rewards/margins", EvalMetric::kEvalRewardMargins,
       "DPO: the mean reward margin (chosen - rejected) over the evaluation pairs; higher is better"},
  };
};
constexpr bool EvalMetricHigherIsBetter(EvalMetric m) { return m != EvalMetric::kEvalLoss; }
// Reported by train.objective: dpo only.
constexpr bool EvalMetricNeedsDpo(EvalMetric m) { return m != EvalMetric::kEvalLoss; }

// train.lr_schedule (after warmup_steps of linear warmup)
enum class LrSchedule { kCosine, kLinear, kConstant };
template <>
struct EnumTraits<LrSchedule> {
  static constexpr std::string_view kWhat = "train.lr_schedule";
  static constexpr EnumEntry<LrSchedule> kTable[] = {
      {"cosine", LrSchedule::kCosine, "half a cosine from lr down to 0 at the last step"},
      {"linear", LrSchedule::kLinear, "a straight line from lr down to 0 at the last step"},
      {"constant", LrSchedule::kConstant, "lr throughout"},
  };
};

// train.optimizer
enum class OptimizerKind { kAdamW, kPagedAdamW };
template <>
struct EnumTraits<OptimizerKind> {
  static constexpr std::string_view kWhat = "train.optimizer";
  static constexpr EnumEntry<OptimizerKind> kTable[] = {
      {"adamw", OptimizerKind::kAdamW, "AdamW with its moments on the device"},
      {"paged_adamw", OptimizerKind::kPagedAdamW, "AdamW with its moments in host memory, paged in"},
  };
};

// train.activation_checkpointing
enum class ActivationCheckpointing { kOff, kOn, kOffload };
template <>
struct EnumTraits<ActivationCheckpointing> {
  static constexpr std::string_view kWhat = "train.activation_checkpointing";
  static constexpr EnumEntry<ActivationCheckpointing> kTable[] = {
      {"false", ActivationCheckpointing::kOff, "keep every layer's activations for backward"},
      {"true", ActivationCheckpointing::kOn, "keep layer inputs only and recompute in backward"},
      {"offload", ActivationCheckpointing::kOffload, "as true, with the layer inputs in host memory"},
  };
};

// train.attention (flash, cudnn and auto: engine/model/attention_route.h's request)
enum class AttentionKind { kFlash, kCudnn, kAuto, kNaive };
template <>
struct EnumTraits<AttentionKind> {
  static constexpr std::string_view kWhat = "train.attention";
  static constexpr EnumEntry<AttentionKind> kTable[] = {
      {"flash", AttentionKind::kFlash, "tiled attention that never holds the score matrix (our kernels)"},
      {"cudnn", AttentionKind::kCudnn,
       "cuDNN's fused SDPA on a CUDA device (bf16/fp16, Hopper); refused with the reason where it "
       "cannot give a deterministic backward or the model's masks"},
      {"auto", AttentionKind::kAuto,
       "flash, or cudnn on a GPU where bench/gpu/run.sh measured it faster (none is measured yet)"},
      {"naive", AttentionKind::kNaive, "the full score matrix (the reference)"},
  };
};

// train.gradient_sum: how gradients and reduced scalars are summed over
// micro-batches and ranks (engine/dist/exact_sum.h).
enum class GradientSum { kAuto, kExact, kFloat };
template <>
struct EnumTraits<GradientSum> {
  static constexpr std::string_view kWhat = "train.gradient_sum";
  static constexpr EnumEntry<GradientSum> kTable[] = {
      {"auto", GradientSum::kAuto, "exact for LoRA and QLoRA, float for a full fine-tune"},
      {"exact", GradientSum::kExact,
       "order-independent: the same bits at any world size (17 bytes per trainable value)"},
      {"float", GradientSum::kFloat, "fp32 sums in the order they come (bits depend on the world size)"},
  };
};

// checkpoint.every: how the interval between checkpoints is chosen.
enum class CheckpointEvery { kFixed, kAuto };
template <>
struct EnumTraits<CheckpointEvery> {
  static constexpr std::string_view kWhat = "checkpoint.every";
  static constexpr EnumEntry<CheckpointEvery> kTable[] = {
      {"fixed", CheckpointEvery::kFixed, "every_steps and every_minutes as written"},
      {"auto", CheckpointEvery::kAuto,
       "sqrt(2 C M): C the measured checkpoint time, M the pool's mean time between preemptions"},
  };
};

// output.adapter_from: which weights become the final adapter (or model) in output.dir.
enum class AdapterFrom { kLast, kBest };
template <>
struct EnumTraits<AdapterFrom> {
  static constexpr std::string_view kWhat = "output.adapter_from";
  static constexpr EnumEntry<AdapterFrom> kTable[] = {
      {"last", AdapterFrom::kLast, "the weights of the last step trained"},
      {"best", AdapterFrom::kBest,
       "the best evaluation's checkpoint (train.early_stopping.metric; needs checkpoint.keep_best: true)"},
  };
};

// resources.device: a DeviceKind, or auto.
enum class DeviceRequest { kAuto, kCuda, kCpu };
template <>
struct EnumTraits<DeviceRequest> {
  static constexpr std::string_view kWhat = "resources.device";
  static constexpr EnumEntry<DeviceRequest> kTable[] = {
      {"auto", DeviceRequest::kAuto, "a CUDA device when there is one, else the CPU"},
      {"cuda", DeviceRequest::kCuda, "an NVIDIA GPU (refused where there is none)"},
      {"cpu", DeviceRequest::kCpu, "the host's cores"},
  };
};
// The one kind a request takes; nullopt for auto (any kind).
inline std::optional<DeviceKind> RequiredDeviceKind(DeviceRequest request) {
  if (request == DeviceRequest::kAuto) return std::nullopt;
  return request == DeviceRequest::kCuda ? DeviceKind::kCuda : DeviceKind::kCpu;
}
// Whether a job asking for `request` may run on a device of `kind`.
inline bool DeviceRequestAccepts(DeviceRequest request, DeviceKind kind) {
  const std::optional<DeviceKind> required = RequiredDeviceKind(request);
  return !required || *required == kind;
}

// distributed.strategy
enum class DistributedStrategy { kDdp, kFsdp };
template <>
struct EnumTraits<DistributedStrategy> {
  static constexpr std::string_view kWhat = "distributed.strategy";
  static constexpr EnumEntry<DistributedStrategy> kTable[] = {
      {"ddp", DistributedStrategy::kDdp, "every rank holds the whole model; gradients are all-reduced"},
      {"fsdp", DistributedStrategy::kFsdp,
       "each rank holds 1/world of the frozen weights and optimizer state (LoRA/QLoRA only)"},
  };
};

}  // namespace ft
