#include "engine/trainer.h"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "engine/hf_model.h"
#include "engine/peft_adapter.h"
#include "kernels/cpu/ops.h"

namespace ft {

namespace fs = std::filesystem;

namespace {
// Until the memory planner lands, "auto" keeps a micro-batch at or under this many tokens.
constexpr int64_t kAutoMicroBatchTokens = 8192;
}  // namespace

StatusOr<BatchPlan> ChooseBatchPlan(const JobSpec& spec) {
  const auto& t = spec.train;
  BatchPlan plan;
  plan.world = 1;
  if (spec.resources.gpus != 1 && spec.resources.device == "cpu") {
    return Status::InvalidArgument(spec.file + ": resources.gpus: CPU jobs run one rank; set gpus: 1");
  }
  if (t.micro_batch_size > 0) {
    plan.micro_batch = t.micro_batch_size;
  } else if (t.gradient_accumulation > 0) {
    if (t.global_batch_size % t.gradient_accumulation != 0) {
      return Status::InvalidArgument(
          spec.file + ": train.gradient_accumulation (" + std::to_string(t.gradient_accumulation) +
          ") must divide global_batch_size (" + std::to_string(t.global_batch_size) + ")");
    }
    plan.micro_batch = t.global_batch_size / t.gradient_accumulation;
  } else {
    // Largest divisor of the global batch within the token budget.
    plan.micro_batch = 1;
    for (int64_t m = t.global_batch_size; m >= 1; --m) {
      if (t.global_batch_size % m == 0 && m * spec.data.seq_len <= kAutoMicroBatchTokens) {
        plan.micro_batch = m;
        break;
      }
    }
  }
  plan.accumulation = t.global_batch_size / (plan.micro_batch * plan.world);
  if (plan.micro_batch * plan.accumulation * plan.world != t.global_batch_size) {
    return Status::InvalidArgument(spec.file + ": train: micro_batch_size " +
                                   std::to_string(plan.micro_batch) + " does not divide global_batch_size " +
                                   std::to_string(t.global_batch_size));
  }
  return plan;
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const JobSpec& spec) {
  std::unique_ptr<Trainer> tr(new Trainer());
  tr->spec_ = spec;
  const std::string& f = spec.file;
  if (spec.model.quantization != "none") {
    return Status::Unimplemented(f +
                                 ": model.quantization: nf4 is not available in this build yet; use none");
  }
  if (spec.model.dtype == "fp16") {
    return Status::Unimplemented(f +
                                 ": model.dtype: fp16 needs dynamic loss scaling, not available on the CPU "
                                 "backend; use bf16 or fp32");
  }
  if (spec.resources.device == "cuda") {
    return Status::Unimplemented(
        f + ": resources.device: the CUDA engine is not built into ft-train yet; use cpu");
  }
  if (spec.data.format != "tokens") {
    return Status::Unimplemented(f + ": data.format: '" + spec.data.format +
                                 "' arrives with the tokenizer; use tokens ({\"input_ids\": [...]}) for now");
  }
  if (spec.data.packing) {
    FT_LOG(INFO) << f << ": data.packing is not implemented yet; sequences are padded instead";
  }
  FT_ASSIGN_OR_RETURN(tr->plan_, ChooseBatchPlan(spec));
  FT_ASSIGN_OR_RETURN(ModelConfig config, ReadHfConfig(spec.model.path));
  if (config.sliding_window > 0 && spec.data.seq_len > config.sliding_window) {
    return Status::Unimplemented(f + ": data.seq_len " + std::to_string(spec.data.seq_len) +
                                 " exceeds the model's sliding_window " + std::to_string(config.sliding_window) +
                                 " (sliding-window attention is not implemented); use seq_len <= sliding_window");
  }
  ModelOptions options;
  options.dtype = spec.model.dtype == "bf16" ? ComputeDType::kBF16 : ComputeDType::kF32;
  options.activation_checkpointing = spec.train.activation_checkpointing != "false";
  options.naive_attention = spec.train.attention == "naive";
  tr->model_ = std::make_unique<Model>(config, options);
  FT_RETURN_IF_ERROR(LoadHfWeights(spec.model.path, tr->model_.get()));
  if (options.dtype == ComputeDType::kBF16) {
    for (NamedTensor& t : tr->model_->NamedWeights()) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      cpu::RoundToBf16(t.data, n);
    }
  }
  if (spec.adapter.type == "full") {
    tr->model_->EnableFullTraining();
  } else {
    LoraSpec lora{spec.adapter.r,       spec.adapter.alpha,          spec.adapter.rslora,
                  spec.adapter.dropout, spec.adapter.target_modules, static_cast<uint64_t>(spec.train.seed)};
    FT_RETURN_IF_ERROR(tr->model_->EnableLora(lora));
    if (!spec.adapter.init.empty()) {
      FT_RETURN_IF_ERROR(
          LoadPeftAdapter(spec.adapter.init, tr->model_.get()).WithContext(f + ": adapter.init"));
    }
  }
  FT_ASSIGN_OR_RETURN(TokenDataset data,
                      TokenDataset::Load(spec.data.train, config.vocab_size, spec.data.seq_len));
  tr->data_ = std::make_unique<TokenDataset>(std::move(data));
  const int64_t steps_per_epoch =
      (tr->data_->size() + spec.train.global_batch_size - 1) / spec.train.global_batch_size;
  tr->total_steps_ = spec.train.max_steps > 0 ? spec.train.max_steps : spec.train.epochs * steps_per_epoch;
  OptimizerConfig oc{spec.train.adam_beta1, spec.train.adam_beta2, spec.train.adam_eps,
                     spec.train.weight_decay, spec.train.max_grad_norm};
  tr->optimizer_ = std::make_unique<AdamWOptimizer>(tr->model_->TrainableParams(), oc);
  return tr;
}

Status Trainer::Step(StepMetrics* m) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t global = spec_.train.global_batch_size;
  const bool shuffle = spec_.data.shuffle;
  const uint64_t seed = static_cast<uint64_t>(spec_.train.seed);
  const int64_t tokens = data_->CountTargets(cursor_, global, shuffle, seed);
  if (tokens == 0) return Status::InvalidArgument(spec_.data.train + ": a global batch has no target tokens");
  model_->ZeroGrads();
  double loss_sum = 0;
  const float grad_scale = static_cast<float>(1.0 / static_cast<double>(tokens));
  for (int64_t a = 0; a < plan_.accumulation; ++a) {
    const int64_t first = cursor_ + a * plan_.micro_batch;
    model_->set_dropout_key(static_cast<uint64_t>(first));
    MicroBatch mb = data_->MakeBatch(first, plan_.micro_batch, shuffle, seed);
    loss_sum += model_->ForwardBackward(mb, grad_scale).loss_sum;
  }
  const int64_t update = optimizer_->step();
  if (grad_hook_) grad_hook_(update + 1);
  const double lr =
      spec_.train.lr * LrMultiplier(spec_.train.lr_schedule, update, spec_.train.warmup_steps, total_steps_);
  const double norm = optimizer_->GradNorm();
  optimizer_->ClipAndStep(norm, lr);
  cursor_ += global;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *m = StepMetrics{update + 1, loss_sum / static_cast<double>(tokens),
                   lr,         norm,
                   tokens,     static_cast<double>(tokens) / std::max(secs, 1e-9),
                   secs,       GlobalMemoryTracker().peak_total()};
  return Status::OK();
}

Status Trainer::Run() {
  std::error_code ec;
  fs::create_directories(spec_.output.dir, ec);
  if (ec) return Status::IOError(spec_.output.dir + ": cannot create output.dir: " + ec.message());
  const std::string metrics_path = (fs::path(spec_.output.dir) / "metrics.jsonl").string();
  std::ofstream metrics(metrics_path, std::ios::trunc);
  if (!metrics) return Status::IOError(metrics_path + ": cannot write metrics");
  FT_LOG(INFO) << "training " << spec_.model.path << ": " << total_steps_ << " steps, micro-batch "
               << plan_.micro_batch << " x accumulation " << plan_.accumulation << " x world " << plan_.world;
  while (steps_done() < total_steps_) {
    StepMetrics m;
    FT_RETURN_IF_ERROR(Step(&m));
    nlohmann::json j = {{"step", m.step},
                        {"loss", m.loss},
                        {"lr", m.lr},
                        {"grad_norm", m.grad_norm},
                        {"tokens", m.tokens},
                        {"tokens_per_s", m.tokens_per_s},
                        {"step_seconds", m.step_seconds},
                        {"peak_bytes", m.peak_bytes}};
    metrics << j.dump() << "\n";
    metrics.flush();
    if (!metrics) return Status::IOError(metrics_path + ": write failed");
    std::fprintf(stderr,
                 "step %" PRId64 "/%" PRId64
                 "  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tok/s  peak %.1f MiB\n",
                 m.step, total_steps_, m.loss, m.lr, m.grad_norm, m.tokens_per_s,
                 static_cast<double>(m.peak_bytes) / (1 << 20));
  }
  return WriteOutputs();
}

Status Trainer::WriteOutputs() {
  const fs::path out(spec_.output.dir);
  if (model_->full_training()) {
    DType dtype = model_->config().torch_dtype == "bfloat16" ? DType::kBF16 : DType::kF32;
    FT_RETURN_IF_ERROR(SaveHfModel((out / "model").string(), *model_, dtype));
    return Status::OK();
  }
  FT_RETURN_IF_ERROR(SavePeftAdapter((out / "adapter").string(), *model_, spec_.model.path));
  if (spec_.output.merge) {
    // Merge into a copy so the training model keeps its adapters.
    Model merged(model_->config(), model_->options());
    FT_RETURN_IF_ERROR(LoadHfWeights(spec_.model.path, &merged));
    FT_RETURN_IF_ERROR(merged.EnableLora(*model_->lora_spec()));
    FT_RETURN_IF_ERROR(LoadPeftAdapter((out / "adapter").string(), &merged));
    merged.MergeLora();
    FT_RETURN_IF_ERROR(SaveHfModel((out / "merged").string(), merged, DType::kF32));
  }
  return Status::OK();
}

}  // namespace ft
