#include "engine/train/step_cost.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "engine/job/planner.h"
#include "engine/model/cuda_op_names.h"
#include "engine/model/model.h"
#include "engine/train/optimizer.h"
#include "engine/train/trainer.h"

namespace ft {

namespace {

// A micro-batch of `batch` rows of `seq` tokens, every position a target (the most work a step does).
MicroBatch FullMicroBatch(int64_t batch, int64_t seq) {
  MicroBatch mb;
  mb.batch = batch;
  mb.seq = seq;
  mb.ids.assign(static_cast<size_t>(batch * seq), 0);
  mb.targets.assign(static_cast<size_t>(batch * seq), 0);
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t p = 0; p < seq; ++p) mb.positions.push_back(static_cast<int32_t>(p));
  }
  return mb;
}

// One optimizer step as Trainer::Step issues it on the backend (one rank): the micro-batches'
// forward and backward (each folded into the exact sum through a host copy when the job sums
// exactly over several micro-batches), the summed gradients back on the device (one micro-batch:
// their -0s made +0 on the device, Trainer::OneTermGradientSum), the norm, the clip and AdamW.
Status OneStep(const JobSpec& spec, Model& model, AdamWOptimizer& optimizer, const MicroBatch& mb,
               int64_t accumulation, const DeviceBuffer& zeros) {
  const bool exact = ExactGradientSum(spec) && accumulation > 1;
  if (ExactGradientSum(spec) && accumulation == 1) {
    model.ZeroGrads();
    model.ForwardBackward(mb, 1.0f / static_cast<float>(mb.rows()));
    for (const TrainableParam& p : model.TrainableParams())
      model.backend().AddBias(p.grad, zeros.data(), 1, p.numel);
    FT_RETURN_IF_ERROR(optimizer.ClipAndStep(optimizer.GradNorm(), spec.train.lr));
    return model.backend().Synchronize();
  }
  std::vector<TrainableParam> params = model.TrainableParams();
  std::vector<float> host;
  model.ZeroGrads();
  for (int64_t a = 0; a < accumulation; ++a) {
    model.ForwardBackward(mb, 1.0f / static_cast<float>(mb.rows() * accumulation));
    if (!exact) continue;
    for (const TrainableParam& p : params) {
      host.resize(static_cast<size_t>(p.numel));
      model.backend().CopyToHost(host.data(), p.grad, p.numel * static_cast<int64_t>(sizeof(float)));
    }
    model.ZeroGrads();
  }
  if (exact) {
    for (const TrainableParam& p : params) {
      host.assign(static_cast<size_t>(p.numel), 0.0f);
      model.Upload(p.grad, host.data(), p.numel);
    }
  }
  const double norm = optimizer.GradNorm();
  FT_RETURN_IF_ERROR(optimizer.ClipAndStep(norm, spec.train.lr));
  return model.backend().Synchronize();
}

// The categories that only convert: what a native 16-bit step would not need.
const std::set<std::string>& ConversionOps() {
  static const std::set<std::string> kOps = {
      cuda_op::kConvert,   cuda_op::kOperandsToBf16, cuda_op::kOperandsToF16, cuda_op::kOperandToF32,
      cuda_op::kRoundBf16, cuda_op::kRoundF16,       cuda_op::kNf4Dequantize};
  return kOps;
}

}  // namespace

StatusOr<StepCost> PredictCudaStep(const JobSpec& spec, const ModelConfig& config, int64_t micro_batch,
                                   int64_t accumulation) {
  auto backend = std::make_shared<CudaCostBackend>();
  MemoryTracker& tracker = GlobalMemoryTracker();
  const int64_t before = tracker.current_total();
  Model model(config, JobModelOptions(spec, backend));
  model.ReserveNf4Weights();
  if (spec.adapter.type == AdapterType::kFull) {
    FT_RETURN_IF_ERROR(model.EnableFullTraining());
  } else {
    FT_RETURN_IF_ERROR(
        model.EnableLora({spec.adapter.r, spec.adapter.alpha, spec.adapter.rslora, spec.adapter.dropout,
                          spec.adapter.target_modules, static_cast<uint64_t>(spec.train.seed)}));
  }
  AdamWOptimizer optimizer(model.TrainableParams(), JobOptimizerConfig(spec), backend,
                           spec.train.optimizer == OptimizerKind::kPagedAdamW);
  const MicroBatch mb = FullMicroBatch(micro_batch, spec.data.seq_len);
  int64_t largest = 0;
  for (const TrainableParam& p : model.TrainableParams()) largest = std::max(largest, p.numel);
  const DeviceBuffer zeros = backend->Alloc(largest, MemCategory::kWorkspace);  // the trainer's zeros_
  FT_RETURN_IF_ERROR(
      OneStep(spec, model, optimizer, mb, accumulation, zeros));  // warm-up: workspaces, tables
  backend->ClearLedger();
  FT_RETURN_IF_ERROR(OneStep(spec, model, optimizer, mb, accumulation, zeros));
  StepCost cost;
  cost.ops = backend->ledger();
  cost.tokens = micro_batch * spec.data.seq_len * accumulation;
  for (const NamedTensor& t : model.NamedWeights()) cost.parameters += t.numel();
  cost.device_bytes = tracker.current_total() - before;
  return cost;
}

double ConversionBytes(const StepCost& cost) {
  double bytes = 0;
  for (const auto& [name, w] : cost.ops) {
    if (ConversionOps().count(name)) bytes += w.bytes;
  }
  return bytes;
}

int64_t Launches(const StepCost& cost) {
  int64_t n = 0;
  for (const auto& [name, w] : cost.ops) n += w.launches;
  return n;
}

std::string FormatStepCost(const StepCost& cost, const GpuSpec& gpu) {
  std::vector<std::pair<double, std::string>> rows;
  double total = 0, flops = 0, bytes = 0;
  for (const auto& [name, w] : cost.ops) {
    const double s = RooflineSeconds(w, gpu);
    total += s;
    flops += w.flops;
    bytes += w.link ? 0 : w.bytes;
    rows.emplace_back(s, name);
  }
  std::sort(rows.rbegin(), rows.rend());
  std::string out;
  char line[400];
  std::snprintf(
      line, sizeof(line),
      "CUDA step on %s (cost model: what the CUDA backend issues for one optimizer step; roofline = "
      "max(FLOPs at peak, bytes at bandwidth) per category):\n  %-32s %7s %8s %10s %9s %11s %6s\n",
      gpu.name, "category", "calls", "launches", "GFLOP", "GB", "roofline ms", "share");
  out += line;
  for (const auto& [s, name] : rows) {
    const OpWork& w = cost.ops.at(name);
    std::snprintf(line, sizeof(line), "  %-32s %7lld %8lld %10.1f %9.3f %11.3f %5.1f%%%s\n", name.c_str(),
                  static_cast<long long>(w.calls), static_cast<long long>(w.launches), w.flops / 1e9,
                  w.bytes / 1e9, s * 1e3, total > 0 ? 100 * s / total : 0.0, w.timed ? "" : " (not timed)");
    out += line;
  }
  const double model_flops = 6.0 * static_cast<double>(cost.parameters) * static_cast<double>(cost.tokens);
  std::snprintf(line, sizeof(line),
                "  total: %lld launches, %.1f TFLOP, %.1f GB in device memory (%.1f GB of it conversions), "
                "roofline %.1f ms\n",
                static_cast<long long>(Launches(cost)), flops / 1e12, bytes / 1e9,
                ConversionBytes(cost) / 1e9, total * 1e3);
  out += line;
  std::snprintf(line, sizeof(line),
                "  at the roofline: %.0f tokens/s (%lld tokens a step), MFU %.1f%% (6 x %.2fB parameters x "
                "tokens over %.0f TF/s)\n",
                total > 0 ? static_cast<double>(cost.tokens) / total : 0.0,
                static_cast<long long>(cost.tokens),
                total > 0 ? 100 * model_flops / total / gpu.tensor_flops : 0.0,
                static_cast<double>(cost.parameters) / 1e9, gpu.tensor_flops / 1e12);
  out += line;
  std::snprintf(
      line, sizeof(line),
      "  device memory the CUDA backend allocates for it (model, activations, workspaces; not the CUDA "
      "context or cuBLASLt's): %s\n",
      FormatBytes(cost.device_bytes).c_str());
  out += line;
  return out;
}

}  // namespace ft
