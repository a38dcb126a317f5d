#include "engine/train/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <new>
#include <sstream>
#include <utility>

#include "common/clock.h"
#include "common/confined_path.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "engine/data/chat_format.h"
#include "engine/data/data_format.h"
#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"
#include "engine/job/checkpoint_interval.h"
#include "engine/job/completion.h"
#include "engine/job/planner.h"
#include "kernels/cpu/ops.h"

namespace ft {

namespace fs = std::filesystem;

namespace {
// How long the other ranks wait for a phase only rank 0 works in (checking
// outputs and checkpoints, a checkpoint write on request): far beyond the
// per-collective timeout, which is for lost ranks.
constexpr std::chrono::milliseconds kRankZeroPhase = std::chrono::hours(1);

// The sources whose realised share a step line reports ("data_share/<k>", the first ones of a
// larger list): within the 32 metrics a step line may carry beside an objective's own.
constexpr int kReportedSourceShares = 16;

// A diverged run stops instead of finishing with NaN weights: FailedPrecondition
// naming the step and the quantity, unless `value` is finite.
Status RequireFinite(const JobSpec& spec, int64_t step, const std::string& what, double value) {
  if (std::isfinite(value)) return Status::OK();
  char text[256];
  std::snprintf(text, sizeof(text),
                ": step %" PRId64
                ": %s is %g: training diverged and stops (no adapter is written); "
                "lower train.lr (now %g), keep train.max_grad_norm > 0, or check the data",
                step, what.c_str(), value, spec.train.lr);
  return Status::FailedPrecondition(spec.file + text);
}

// RequireFinite for every value of the weights a checkpoint is about to save.
Status RequireFiniteWeights(const JobSpec& spec, const CheckpointContents& c) {
  for (const HostTensor& t : c.model) {
    for (float v : t.data) {
      if (!std::isfinite(v))
        return RequireFinite(spec, c.state.step, "a value of weight '" + t.name + "'", v);
    }
  }
  return Status::OK();
}

}  // namespace

AttentionRouteRequest AttentionRequest(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kCudnn: return AttentionRouteRequest::kCudnn;
    case AttentionKind::kAuto: return AttentionRouteRequest::kAuto;
    case AttentionKind::kFlash:
    case AttentionKind::kNaive: break;
  }
  return AttentionRouteRequest::kOurs;
}

ModelOptions JobModelOptions(const JobSpec& spec, std::shared_ptr<Backend> backend) {
  ModelOptions options;
  options.dtype = spec.model.dtype;
  options.activation_checkpointing = spec.train.activation_checkpointing != ActivationCheckpointing::kOff;
  options.offload_activations = spec.train.activation_checkpointing == ActivationCheckpointing::kOffload;
  options.cpu_offload = spec.train.cpu_offload;
  options.naive_attention = spec.train.attention == AttentionKind::kNaive;
  options.nf4 = spec.model.quantization == Quantization::kNf4;
  options.nf4_config = {64, spec.model.double_quant, 256};
  options.backend = std::move(backend);
  return options;
}

OptimizerConfig JobOptimizerConfig(const JobSpec& spec) {
  return {spec.train.adam_beta1, spec.train.adam_beta2, spec.train.adam_eps, spec.train.weight_decay,
          spec.train.max_grad_norm};
}

StatusOr<BatchPlan> ChooseBatchPlan(const JobSpec& spec, const ModelConfig& model, int64_t device_bytes,
                                    int64_t world) {
  const auto& t = spec.train;
  BatchPlan plan;
  plan.world = world;
  if (!AllowedWorld(spec, world)) {
    const bool elastic = spec.resources.min_gpus < spec.resources.gpus;
    return Status::InvalidArgument(
        spec.file + ": resources.gpus asks for " +
        (elastic ? std::to_string(spec.resources.min_gpus) + ".." : std::string()) +
        std::to_string(spec.resources.gpus) + " ranks but " + std::to_string(world) + " started" +
        (elastic ? " (and an elastic job's world must split global_batch_size into whole micro-batches)"
                 : std::string()) +
        "; start one ft-train per rank with --world " + std::to_string(spec.resources.gpus) +
        " --rank R --rendezvous HOST:PORT, or set gpus: " + std::to_string(world));
  }
  if (t.micro_batch_size == 0 && t.gradient_accumulation > 0 &&
      t.global_batch_size % (t.gradient_accumulation * plan.world) != 0) {
    return Status::InvalidArgument(
        spec.file + ": train.gradient_accumulation (" + std::to_string(t.gradient_accumulation) +
        ") must divide global_batch_size (" + std::to_string(t.global_batch_size) + ")");
  }
  plan.micro_batch = FixedMicroBatch(spec, plan.world);
  const PlanRequest request = PlanRequestFromJob(spec, model, DeviceKind::kCpu, plan.world);
  if (plan.micro_batch > 0) {
    // A fixed micro-batch is checked against the device too: refused here, not by bad_alloc later.
    auto fits = CheckFixedMicroBatch(request, plan.micro_batch, device_bytes);
    const char* key = t.micro_batch_size > 0 ? ": train.micro_batch_size" : ": train.gradient_accumulation";
    if (!fits.ok()) return fits.status().WithContext(spec.file + key);
  } else {
    // micro_batch_size: auto: the planner picks the largest that fits the device.
    auto choice = ChooseMicroBatch(request, device_bytes);
    if (!choice.ok()) return choice.status().WithContext(spec.file + ": train.micro_batch_size: auto");
    plan.micro_batch = choice->micro_batch;
  }
  plan.accumulation = t.global_batch_size / (plan.micro_batch * plan.world);
  if (plan.micro_batch * plan.accumulation * plan.world != t.global_batch_size) {
    return Status::InvalidArgument(spec.file + ": train: micro_batch_size " +
                                   std::to_string(plan.micro_batch) + " does not divide global_batch_size " +
                                   std::to_string(t.global_batch_size));
  }
  return plan;
}

StatusOr<std::unique_ptr<Dataset>> OpenJobSource(const JobSpec& spec, const ModelConfig& config,
                                                 const JobSpec::DataSource& source, const DataSplit& split,
                                                 std::unique_ptr<Tokenizer>* tokenizer,
                                                 const std::function<bool()>& stop_requested) {
  const std::string& f = spec.file;
  const DataFormat format = source.format;
  DatasetOptions options;
  options.path = source.path;
  options.seq_len = spec.data.seq_len;
  options.packing = spec.data.packing;
  options.skip_bad_lines = spec.data.skip_bad_lines;
  options.holdout = split.holdout;
  options.held_out = split.held_out;
  options.cache_key =
      "format=" + std::string(EnumName(format)) + ";vocab=" + std::to_string(config.vocab_size);
  if (!source.keys.empty() || !source.roles.empty()) {
    options.cache_key +=
        ";fields=" + nlohmann::json(source.keys).dump() + nlohmann::json(source.roles).dump();
  }
  options.stop_requested = stop_requested;
  const bool pairs = format == DataFormat::kPreference;
  options.pairs = pairs;
  PairLimits limits;
  if (pairs) {
    limits = {spec.data.max_prompt_len, spec.data.seq_len};
    options.cache_key += ";max_prompt_len=" + std::to_string(spec.data.max_prompt_len);
  }
  ChatOptions chat;
  chat.stop_requested = stop_requested;
  // Preference pairs given as token ids need no tokenizer: without one, only that form encodes.
  const bool tokenizer_optional = pairs && !fs::exists(fs::path(spec.model.path) / "tokenizer.json");
  if (format != DataFormat::kTokens && !tokenizer_optional) {
    if (!*tokenizer) {
      auto loaded = Tokenizer::Load(spec.model.path);
      if (!loaded.ok())
        return loaded.status().WithContext(f + ": " + source.key + ": format " +
                                           std::string(EnumName(format)) + " needs the tokenizer");
      *tokenizer = std::move(*loaded);
    }
    auto tok_sha = Sha256File((fs::path(spec.model.path) / "tokenizer.json").string());
    options.cache_key += ";tokenizer=" + (tok_sha.ok() ? *tok_sha : std::string("?"));
    const std::string& template_file =
        source.chat_template.empty() ? spec.data.chat_template : source.chat_template;
    if (!template_file.empty()) {
      auto text = ReadFileToString(template_file, kMaxConfigFileBytes);
      if (!text.ok())
        return text.status().WithContext(f + ": " + (source.chat_template.empty() ? "data" : source.key) +
                                         ".chat_template");
      chat.chat_template = *text;
    }
    chat.extra_vars = ChatVarsFromStrings(spec.data.chat_template_vars);
    const std::string& chat_template =
        chat.chat_template.empty() ? (*tokenizer)->chat_template() : chat.chat_template;
    options.cache_key += ";template=" + Sha256Hex(chat_template) + ";vars=" + chat.extra_vars.dump();
  }
  FT_ASSIGN_OR_RETURN(RecordEncoder encode,
                      MakeRecordEncoder(format, tokenizer->get(), config.vocab_size, chat, limits,
                                        FieldMap(format, source.keys, source.roles)));
  return Dataset::Open(options, std::move(encode));
}

StatusOr<std::unique_ptr<Mixture>> OpenJobMixture(const JobSpec& spec, const ModelConfig& config,
                                                  const std::vector<JobSpec::DataSource>& sources,
                                                  Mixture::Mode mode, const DataSplit& split,
                                                  std::unique_ptr<Tokenizer>* tokenizer,
                                                  const std::function<bool()>& stop_requested) {
  std::vector<MixtureSource> parts;
  for (const JobSpec::DataSource& source : sources) {
    auto data = OpenJobSource(spec, config, source, split, tokenizer, stop_requested);
    if (!data.ok())
      return data.status().code() == Status::Code::kCancelled
                 ? data.status()
                 : data.status().WithContext(spec.file + ": " + source.key);
    parts.push_back({std::move(*data), source.weight, source.epochs, source.key});
  }
  return Mixture::Create(std::move(parts), mode);
}

namespace {

// The device a job runs on (resources.device): cuda needs a CUDA build and a
// visible device; auto takes one when there is. A model the CUDA kernels
// refuse is named now, with the fix, not at its first forward.
StatusOr<std::shared_ptr<Backend>> ChooseBackend(const JobSpec& spec, const ModelConfig& config) {
  const std::string& f = spec.file;
  if (spec.resources.device == DeviceRequest::kCuda)
    FT_RETURN_IF_ERROR(CheckCudaTakesModel(spec, config, "cuda"));
  FT_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, CreateBackend(DeviceKind::kCpu));
  if (spec.resources.device != DeviceRequest::kCpu) {
    auto cuda = CreateBackend(DeviceKind::kCuda);
    if (cuda.ok()) {
      FT_RETURN_IF_ERROR(CheckCudaTakesModel(
          spec, config, std::string(EnumName(spec.resources.device)) + " found a CUDA device"));
      backend = std::move(*cuda);
    } else if (spec.resources.device == DeviceRequest::kCuda) {
      return cuda.status().WithContext(f + ": resources.device: cuda");
    }
  }
  return backend;
}

// FSDP's gathers (frozen weights per layer, the optimizer's ranges) on the job's collective.
auto GatherOn(Collective* collective) {
  return [collective](const void* mine, int64_t bytes, void* out) {
    return collective->AllGather(mine, bytes, out).ok();  // a failure stays with the collective
  };
}

}  // namespace

Status Trainer::BuildModel(const ModelConfig& config, std::shared_ptr<Backend> backend) {
  const JobSpec& spec = spec_;
  const std::string& f = spec.file;
  const int world = ranks_->world();
  const bool fsdp = world > 1 && spec.distributed.strategy == DistributedStrategy::kFsdp;
  FT_RETURN_IF_ERROR(backend->SetAttentionRoute(AttentionRequest(spec.train.attention)).WithContext(f));
  ModelOptions options = JobModelOptions(spec, backend);
  Collective* collective = ranks_.get();
  auto all_gather = GatherOn(collective);
  if (fsdp) options.shard = {collective->rank(), world, all_gather};
  model_ = std::make_unique<Model>(config, options);
  FT_RETURN_IF_ERROR(LoadHfWeights(spec.model.path, model_.get()));
  model_->RoundWeightsToComputeDType();
  if (options.dtype == ComputeDType::kF16) loss_scale_ = spec.train.loss_scale_init;
  if (spec.adapter.type == AdapterType::kFull) {
    FT_RETURN_IF_ERROR(model_->EnableFullTraining());
  } else {
    LoraSpec lora{spec.adapter.r,       spec.adapter.alpha,          spec.adapter.rslora,
                  spec.adapter.dropout, spec.adapter.target_modules, static_cast<uint64_t>(spec.train.seed)};
    FT_RETURN_IF_ERROR(model_->EnableLora(lora));
    if (!spec.adapter.init.empty()) {
      FT_RETURN_IF_ERROR(LoadPeftAdapter(spec.adapter.init, model_.get()).WithContext(f + ": adapter.init"));
    }
  }
  if (fsdp) model_->ShardFrozenWeights();
  return Status::OK();
}

Status Trainer::OpenData(const ModelConfig& config) {
  const JobSpec& spec = spec_;
  const std::string& f = spec.file;
  const DataSplit train_split{spec.data.val_fraction, false};
  FT_ASSIGN_OR_RETURN(data_, OpenJobMixture(spec, config, spec.data.train_sources, Mixture::Mode::kInterleave,
                                            train_split, &tokenizer_, StopRequested()));
  for (int k = 0; k < data_->sources(); ++k) {
    const Dataset& source = data_->source(k);
    inputs_.Add(data_->key(k), source.path(), source.stamp(), source.sha256());
  }
  FT_ASSIGN_OR_RETURN(reference_, StoredReference(data_->source(0), spec.data.train));
  if (JobHasEval(spec)) {
    // data.val_fraction: the held-out rows of the training sources, read whole like data.eval.
    const bool held = spec.data.val_fraction > 0;
    auto eval = OpenJobMixture(spec, config, held ? spec.data.train_sources : spec.data.eval_sources,
                               Mixture::Mode::kConcatenate, {spec.data.val_fraction, held}, &tokenizer_,
                               StopRequested());
    if (!eval.ok()) return eval.status().WithContext(f + (held ? ": data.val_fraction" : ": data.eval"));
    eval_data_ = std::move(*eval);
    if (!held) {
      for (int k = 0; k < eval_data_->sources(); ++k) {
        const Dataset& source = eval_data_->source(k);
        inputs_.Add(eval_data_->key(k), source.path(), source.stamp(), source.sha256());
      }
    }
    FT_ASSIGN_OR_RETURN(eval_reference_,
                        StoredReference(eval_data_->source(0), held ? spec.data.train : spec.data.eval));
    int64_t rows = eval_data_->size();
    if (spec.train.eval_max_batches > 0)
      rows = std::min(rows, spec.train.eval_max_batches * plan_.micro_batch);
    if (eval_data_->CountTargets(0, rows, false, 0) == 0) {
      return Status::InvalidArgument(f + ": data.eval: the evaluated rows of " + spec.data.eval +
                                     " have no target tokens (see train.eval_max_batches)");
    }
  }
  const int64_t steps_per_epoch =
      (data_->size() + spec.train.global_batch_size - 1) / spec.train.global_batch_size;
  total_steps_ = spec.train.max_steps > 0 ? spec.train.max_steps : spec.train.epochs * steps_per_epoch;
  objective_ = MakeObjective(spec, reference_.get(), eval_reference_.get());
  return Status::OK();
}

StatusOr<std::unique_ptr<ReferenceLogProbs>> Trainer::StoredReference(const Dataset& data,
                                                                      const std::string& path) {
  const JobSpec& spec = spec_;
  if (spec.train.objective != TrainObjective::kDpo || spec.adapter.type != AdapterType::kFull)
    return std::unique_ptr<ReferenceLogProbs>();
  // What the values depend on: the data and its encoding, the model's files (hashes; the weights'
  // stamps), the compute dtype and the device kind; not the other data file.
  std::string key = "data=" + data.sha256() + ";encoding=" + data.cache_key() +
                    ";seq_len=" + std::to_string(data.seq_len()) + data.holdout_key() +
                    ";dtype=" + std::string(EnumName(spec.model.dtype)) +
                    ";device=" + std::string(DeviceKindName(model_->backend().kind()));
  for (const auto& [input, sha] : inputs_.Hashes())
    if (input.rfind("data.train", 0) != 0 && input.rfind("data.eval", 0) != 0) key += ";" + input + "=" + sha;
  auto weights = HfWeightFiles(spec.model.path);
  for (const std::string& file : weights.ok() ? *weights : std::vector<std::string>{}) {
    FT_ASSIGN_OR_RETURN(const FileStamp stamp, StampFile(file));
    key += ";" + fs::path(file).filename().string() + "=" + std::to_string(stamp.size) + "@" +
           std::to_string(stamp.mtime_ns);
  }
  return ReferenceLogProbs::LoadOrCompute(*model_, data, path, key, leader(), StopRequested());
}

void Trainer::BuildOptimizer(std::shared_ptr<Backend> backend) {
  const JobSpec& spec = spec_;
  const int world = ranks_->world();
  const bool fsdp = world > 1 && spec.distributed.strategy == DistributedStrategy::kFsdp;
  Collective* collective = ranks_.get();
  auto all_gather = GatherOn(collective);
  const OptimizerConfig oc = JobOptimizerConfig(spec);
  OptimizerSharding optimizer_shard;
  if (fsdp) optimizer_shard = {collective->rank(), world, all_gather};
  optimizer_ =
      std::make_unique<AdamWOptimizer>(model_->TrainableParams(), oc, backend,
                                       spec.train.optimizer == OptimizerKind::kPagedAdamW, optimizer_shard);
  int64_t trainable = 0;
  for (const TrainableParam& p : model_->TrainableParams()) trainable += p.numel;
  if (ExactGradientSum(spec)) grad_sum_ = std::make_unique<ExactSum<float>>(trainable);
  if (grad_sum_ || world > 1) {
    grad_host_ = backend->AllocHost(trainable * static_cast<int64_t>(sizeof(float)), MemCategory::kGradients);
  }
}

std::function<bool()> Trainer::StopRequested() const {
  if (!control_) return {};
  TrainControl* control = control_;
  return [control] {
    const std::optional<ControlRequest> request = control->Pending();
    return request && request->stop;
  };
}

Status Trainer::WatchInputs() {
  const JobSpec& spec = spec_;
  const fs::path model(spec.model.path);
  // Before anything is read. A file that is missing now is left to its reader's error.
  auto watch = [&](const std::string& key, const fs::path& path, bool hash) -> Status {
    if (std::error_code ec; !fs::is_regular_file(path, ec)) return Status::OK();
    return inputs_.Watch(key, path.string(), hash).WithContext(spec.file + ": " + key);
  };
  FT_RETURN_IF_ERROR(watch("model.path (config.json)", model / "config.json", true));
  // Weights: stamps only (hashing gigabytes would delay every start); a moved stamp fails the run.
  auto weights = HfWeightFiles(spec.model.path);
  for (const std::string& file : weights.ok() ? *weights : std::vector<std::string>{}) {
    const bool index = fs::path(file).extension() == ".json";
    FT_RETURN_IF_ERROR(watch("model.path (" + fs::path(file).filename().string() + ")", file, index));
  }
  std::vector<std::string> tokenizer_files;
  if (spec.data.format != DataFormat::kTokens) tokenizer_files = {"tokenizer.json", "tokenizer_config.json"};
  if (spec.output.merge) {  // merged/ gets copies (CopyTokenizerFiles)
    tokenizer_files = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                       "tokenizer.model", "generation_config.json"};
  }
  for (const std::string& name : tokenizer_files) {
    FT_RETURN_IF_ERROR(watch("model.path (" + name + ")", model / name, true));
  }
  if (!spec.data.chat_template.empty()) {
    FT_RETURN_IF_ERROR(watch("data.chat_template", spec.data.chat_template, true));
  }
  return Status::OK();
}

Status Trainer::CheckInputs() { return inputs_.Check().WithContext(spec_.file); }

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const JobSpec& spec, std::unique_ptr<Collective> ranks,
                                                   TrainControl* control) {
  std::unique_ptr<Trainer> tr(new Trainer());
  tr->spec_ = spec;
  tr->ranks_ = ranks ? std::move(ranks) : SingleRank();
  tr->control_ = control;
  FT_RETURN_IF_ERROR(tr->WatchInputs());
  // Choices that do not combine (full with nf4, cpu_offload or multi-rank fsdp) were refused by
  // ParseJobSpec (engine/job/job_spec.cc), at submit; the model refuses them again for a spec built in code.
  FT_ASSIGN_OR_RETURN(ModelConfig config, ReadHfConfig(spec.model.path));
  FT_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, ChooseBackend(spec, config));
  FT_ASSIGN_OR_RETURN(auto memory, backend->MemoryInfo());  // {free, total} bytes of the device
  FT_ASSIGN_OR_RETURN(tr->plan_, ChooseBatchPlan(spec, config, memory.first, tr->ranks_->world()));
  FT_RETURN_IF_ERROR(CheckJobTakesModel(spec, config));
  FT_RETURN_IF_ERROR(tr->BuildModel(config, backend));
  FT_RETURN_IF_ERROR(tr->OpenData(config));
  tr->BuildOptimizer(backend);
  tr->eval_progress_ = FreshEvalProgress(spec);
  FT_RETURN_IF_ERROR(tr->CheckInputs());  // nothing changed while it was loaded
  FT_RETURN_IF_ERROR(
      backend->Synchronize().WithContext(spec.file + ": loading the model onto " + backend->Describe()));
  FT_LOG(INFO) << "training on " << backend->Describe();
  return tr;
}

Status Trainer::Step(StepMetrics* m, bool* interrupted) {
  if (interrupted) *interrupted = false;
  const auto start = std::chrono::steady_clock::now();
  const double copy_wait_before = model_->backend().copy_stats().wait_seconds;
  const double gather_before = model_->gather_seconds();
  const int64_t global = spec_.train.global_batch_size;
  const bool shuffle = spec_.data.shuffle;
  const uint64_t seed = static_cast<uint64_t>(spec_.train.seed);
  const int64_t tokens = data_->CountTargets(cursor_, global, shuffle, seed);
  if (tokens == 0) return Status::InvalidArgument(spec_.data.train + ": a global batch has no target tokens");
  // The step's sums are divided by this: target tokens (SFT) or pairs (DPO).
  const int64_t normaliser = objective_->Normaliser(*data_, cursor_, global, shuffle, seed);
  const std::vector<std::string> sum_names = objective_->SumNames();
  model_->ZeroGrads();
  WaitForFold();  // a step abandoned mid-way (StopMidStep) may have left one running
  if (grad_sum_) grad_sum_->Clear();
  ExactSum<double> loss(static_cast<int64_t>(sum_names.size()));  // every reduced scalar, order-independently
  // Under fp16 the loss gradient is multiplied by the loss scale so that small gradients
  // survive fp16's range; they are unscaled before clipping (UpdateLossScale, docs/ENGINE.md).
  const float grad_scale = static_cast<float>(loss_scale_ / static_cast<double>(normaliser));
  for (int64_t a = 0; a < plan_.accumulation; ++a) {
    if (a > 0 && interrupted && StopMidStep(a)) {
      *interrupted = true;  // nothing was applied: the state is still at the last step boundary
      return Status::OK();
    }
    const auto micro_start = std::chrono::steady_clock::now();
    const int64_t first = cursor_ + (ranks_->rank() * plan_.accumulation + a) * plan_.micro_batch;
    FT_ASSIGN_OR_RETURN(MicroBatch mb, data_->MakeBatch(first, plan_.micro_batch, shuffle, seed));
    FT_ASSIGN_OR_RETURN(const std::vector<double> micro_sums, objective_->MicroStep(*model_, mb, grad_scale));
    loss.Add(micro_sums.data());
    if (grad_sum_ && !OneTermGradientSum()) FoldGradients();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - micro_start).count();
    micro_seconds_ = micro_seconds_ == 0 ? t : 0.8 * micro_seconds_ + 0.2 * t;
  }
  FT_RETURN_IF_ERROR(CheckInputs());  // the step read what the run started with, or nothing is applied
  const auto reduce_start = std::chrono::steady_clock::now();
  std::vector<double> sums(sum_names.size(), 0.0);
  FT_RETURN_IF_ERROR(SumGradients(&loss, sums.data()));
  const double loss_sum = sums[0];
  const double reduce_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - reduce_start).count();
  const int64_t update = optimizer_->step();
  if (grad_hook_) grad_hook_(update + 1);
  // The schedule counts applied updates (a step skipped for fp16 overflow does not advance it).
  const double lr = spec_.train.lr * LrMultiplier(spec_.train.lr_schedule, optimizer_->updates(),
                                                  spec_.train.warmup_steps, total_steps_);
  const double scale = loss_scale_;
  const double norm = optimizer_->GradNorm() / scale;
  const bool fp16 = spec_.model.dtype == ComputeDType::kF16;
  const bool skipped = fp16 && !std::isfinite(norm);  // fp16's overflow: skipped by design, not divergence
  if (!skipped) {
    FT_RETURN_IF_ERROR(
        RequireFinite(spec_, update + 1, "the loss", loss_sum / static_cast<double>(normaliser)));
    FT_RETURN_IF_ERROR(RequireFinite(spec_, update + 1, "the gradient norm", norm));
  }
  if (skipped) {
    optimizer_->SkipStep();
  } else {
    FT_RETURN_IF_ERROR(
        optimizer_->ClipAndStep(norm, lr, 1.0 / scale).WithContext(spec_.file + ": optimizer"));
  }
  UpdateLossScale(skipped);
  FT_RETURN_IF_ERROR(model_->backend().Synchronize().WithContext(spec_.file + ": training step on " +
                                                                 model_->backend().Describe()));
  cursor_ += global;
  tokens_seen_ += tokens;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *m = StepMetrics{update + 1, loss_sum / static_cast<double>(normaliser),
                   lr,         norm,
                   tokens,     static_cast<double>(tokens) / std::max(secs, 1e-9),
                   secs,       GlobalMemoryTracker().peak_total()};
  m->tokens_seen = tokens_seen_;
  m->loss_scale = scale;
  m->skipped = skipped;
  m->copy_wait_seconds = model_->backend().copy_stats().wait_seconds - copy_wait_before;
  m->allreduce_seconds = ranks_->world() > 1 ? reduce_seconds : 0.0;
  m->gather_seconds = model_->gather_seconds() - gather_before;
  for (size_t k = 1; k < sum_names.size(); ++k)
    m->objective_metrics[sum_names[k]] = sums[k] / static_cast<double>(normaliser);
  if (data_->sources() > 1) {  // the mixture as realised: each source's share of the rows so far
    const std::vector<int64_t> positions = data_->Positions(cursor_);
    for (int k = 0; k < std::min(data_->sources(), kReportedSourceShares); ++k) {
      m->objective_metrics["data_share/" + std::to_string(k)] =
          static_cast<double>(positions[k]) / static_cast<double>(cursor_);
    }
  }
  for (int c = 0; c < static_cast<int>(MemCategory::kCount); ++c) {
    m->peak_by_category[MemCategoryName(static_cast<MemCategory>(c))] =
        GlobalMemoryTracker().peak(static_cast<MemCategory>(c));
  }
  return Status::OK();
}

static_assert(ExactSum<float>::kWireBytesPerElement == kExactSumBytesPerValue,
              "the planner's cost of an exact sum is ExactSum's");

bool Trainer::StopMidStep(int64_t done) {
  // (With several ranks the step always completes: one rank alone cannot abandon it.)
  if (!control_ || ranks_->world() > 1) return false;
  // A stop request mid-accumulation: finish the step only if the deadline allows.
  auto req = control_->Pending();
  if (!req || !req->stop) return false;
  const double left = std::chrono::duration<double>(req->deadline - std::chrono::steady_clock::now()).count();
  const double need = static_cast<double>(plan_.accumulation - done) * micro_seconds_ +
                      (writer_ ? writer_->last_seconds() : 0.0);
  return need > left;
}

void Trainer::CopyGradients(bool to_host) {
  int64_t at = 0;
  for (const TrainableParam& p : model_->TrainableParams()) {
    if (to_host) {
      model_->backend().CopyToHost(grad_host_.data() + at, p.grad,
                                   p.numel * static_cast<int64_t>(sizeof(float)));
    } else {
      model_->Upload(p.grad, grad_host_.data() + at, p.numel);
    }
    at += p.numel;
  }
}

bool Trainer::OneTermGradientSum() const {
  return grad_sum_ != nullptr && ranks_->world() == 1 && plan_.accumulation == 1;
}

void Trainer::MakeZerosPositive() {
  int64_t largest = 0;
  for (const TrainableParam& p : optimizer_->params()) largest = std::max(largest, p.numel);
  if (zeros_.size() < largest) zeros_ = model_->backend().Alloc(largest, MemCategory::kWorkspace);
  // x + (+0) is x, and +0 for x = -0 (IEEE round to nearest).
  for (const TrainableParam& p : optimizer_->params())
    model_->backend().AddBias(p.grad, zeros_.data(), 1, p.numel);
}

void Trainer::FoldGradients() {
  WaitForFold();  // the last micro-batch's fold has read grad_host_
  CopyGradients(/*to_host=*/true);
  model_->ZeroGrads();
  fold_ = std::async(std::launch::async, [this] { grad_sum_->Add(grad_host_.data()); });
}

void Trainer::WaitForFold() {
  if (fold_.valid()) fold_.get();
}

Status Trainer::SumGradients(ExactSum<double>* loss, double* loss_sum) {
  WaitForFold();
  FT_RETURN_IF_ERROR(loss->AllReduce(ranks_.get()).WithContext(spec_.file + ": loss"));
  loss->Round(loss_sum);
  if (OneTermGradientSum()) {
    MakeZerosPositive();
    return Status::OK();
  }
  if (grad_sum_) {
    FT_RETURN_IF_ERROR(grad_sum_->AllReduce(ranks_.get()).WithContext(spec_.file + ": gradients"));
    grad_sum_->Round(grad_host_.data());
  } else if (ranks_->world() > 1) {
    // One flat host buffer for every gradient: one all-reduce per step (DDP's bucket is the whole
    // set: LoRA gradients are small), through host memory whatever the backend.
    CopyGradients(/*to_host=*/true);
    FT_RETURN_IF_ERROR(
        ranks_->AllReduceSum(grad_host_.data(), grad_host_.size()).WithContext(spec_.file + ": gradients"));
  } else {
    return Status::OK();  // one rank, fp32 sums: the gradients are where backward left them
  }
  CopyGradients(/*to_host=*/false);
  return Status::OK();
}

Status Trainer::Agree(std::vector<double>* flags) {
  if (ranks_->world() == 1) return Status::OK();
  FT_RETURN_IF_ERROR(ranks_->AllReduceSum(flags->data(), static_cast<int64_t>(flags->size()))
                         .WithContext(spec_.file + ": agreeing on stop and checkpoint requests"));
  for (double& f : *flags) f = f > 0 ? 1 : 0;
  return Status::OK();
}

void Trainer::UpdateLossScale(bool overflow) {
  if (spec_.model.dtype != ComputeDType::kF16)
    return;  // the scale stays 1: nothing can overflow fp32 this way
  if (overflow) {
    loss_scale_ *= 0.5;
    growth_tracker_ = 0;
    FT_LOG(WARN) << "step " << optimizer_->step()
                 << ": fp16 gradients overflowed; update skipped, loss scale " << loss_scale_ * 2 << " -> "
                 << loss_scale_;
    return;
  }
  if (++growth_tracker_ >= spec_.train.loss_scale_growth_interval) {
    if (std::isfinite(loss_scale_ * 2)) loss_scale_ *= 2;
    growth_tracker_ = 0;
  }
}

Status Trainer::Evaluate(EvalMetrics* m, bool* interrupted) {
  if (interrupted) *interrupted = false;
  if (!eval_data_) return Status::FailedPrecondition(spec_.file + ": data.eval is not set");
  const auto start = std::chrono::steady_clock::now();
  const int64_t rows = eval_data_->size(), micro = plan_.micro_batch;
  int64_t batches = (rows + micro - 1) / micro;
  if (spec_.train.eval_max_batches > 0) batches = std::min(batches, spec_.train.eval_max_batches);
  // Several ranks: rank r evaluates batches r, r + world, ...; the sums are all-reduced.
  // Sharded weights are gathered per layer by every rank together, so then every rank runs
  // the same number of forwards (a rank past the last batch runs one it does not count).
  const int world = ranks_->world();
  const int64_t rounds = (batches + world - 1) / world;
  const int64_t end = model_->sharded() ? rounds * world : batches;
  const std::vector<std::string> names = objective_->SumNames();
  ExactSum<double> sums(static_cast<int64_t>(names.size()));  // the same bits however the batches fall
  int64_t counts[2] = {0, 0};                                 // the normaliser, target tokens
  for (int64_t b = ranks_->rank(); b < end; b += world) {
    if (b > ranks_->rank() && control_ && interrupted && world == 1) {
      if (auto req = control_->Pending(); req && req->stop) {
        *interrupted = true;  // a stop needs the time more than an evaluation does
        return Status::OK();
      }
    }
    const int64_t first = (b < batches ? b : 0) * micro;
    FT_ASSIGN_OR_RETURN(MicroBatch mb, eval_data_->MakeBatch(first, std::min(micro, rows - first),
                                                             /*shuffle=*/false, /*seed=*/0));
    FT_ASSIGN_OR_RETURN(Objective::EvalSums e, objective_->EvalStep(*model_, mb));
    if (b >= batches) continue;  // only to join the gathers
    sums.Add(e.sums.data());
    counts[0] += e.count;
    counts[1] += e.tokens;
  }
  FT_RETURN_IF_ERROR(sums.AllReduce(ranks_.get()).WithContext(spec_.data.eval + ": evaluation"));
  FT_RETURN_IF_ERROR(ranks_->AllReduceSum(counts, 2).WithContext(spec_.data.eval + ": evaluation"));
  std::vector<double> total(names.size(), 0.0);
  sums.Round(total.data());
  if (counts[1] == 0)
    return Status::InvalidArgument(spec_.data.eval + ": the evaluated rows have no target tokens");
  *m = EvalMetrics{optimizer_->step(), total[0] / static_cast<double>(counts[0]), counts[1], batches,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  for (size_t k = 1; k < names.size(); ++k)
    m->objective_metrics["eval_" + names[k]] = total[k] / static_cast<double>(counts[0]);
  return Status::OK();
}

std::string Trainer::checkpoint_root() const { return (fs::path(spec_.output.dir) / "checkpoints").string(); }

CheckpointContents Trainer::Capture(const std::string& reason) {
  CheckpointContents c;
  TrainerState& st = c.state;
  st.step = optimizer_->step();
  st.skipped_steps = optimizer_->skipped();
  st.loss_scale = loss_scale_;
  st.loss_scale_growth_tracker = growth_tracker_;
  st.cursor = cursor_;
  st.source_positions = data_->Positions(cursor_);
  st.tokens_seen = tokens_seen_;
  st.micro_batch = plan_.micro_batch;
  st.accumulation = plan_.accumulation;
  st.world = plan_.world;
  st.job_math = JobMathKeys(spec_, data_->sha256());
  st.job_hash = JobHash(spec_, data_->sha256());
  st.inputs = inputs_.Hashes();
  st.epoch = owner_->epoch();
  st.last_checkpoint_seconds = writer_ ? writer_->last_seconds() : 0.0;
  const CheckpointCost cost = MeasuredCost();
  st.mean_checkpoint_seconds = cost.recent_seconds;
  st.fixed_checkpoint_seconds = cost.fixed_seconds;
  st.recent_fixed_seconds = RecentFixed();
  st.checkpoints_since_probe = auto_since_fixed_;
  st.back_to_back = BackToBack(st.step);
  st.reason = reason;
  const bool automatic = reason == kAutoReason || reason == kAutoProbeReason;
  st.interval_seconds = automatic ? auto_interval_s_ : 0.0;
  st.mtbf_seconds = automatic ? (mtbf_seconds_ > 0 ? mtbf_seconds_ : kPriorMtbfSeconds) : 0.0;
  st.evaluation = eval_progress_;
  const auto& params = optimizer_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    const TrainableParam& p = params[i];
    c.model.push_back({p.name, p.shape, model_->Download(p.data, p.numel)});
    c.optimizer.push_back({p.name + ".exp_avg", p.shape, optimizer_->Moment(i, 0)});
    c.optimizer.push_back({p.name + ".exp_avg_sq", p.shape, optimizer_->Moment(i, 1)});
  }
  if (model_->full_training()) {
    c.model_config_json = HfConfigJson(model_->config());
  } else {
    c.adapter_config_json = PeftAdapterConfigJson(*model_->lora_spec(), spec_.model.path);
  }
  return c;
}

Status Trainer::Restore(const CheckpointContents& c, const std::string& from) {
  // C for checkpoint.every auto until writes are measured.
  restored_mean_c_ = c.state.mean_checkpoint_seconds;
  restored_fixed_ = c.state.recent_fixed_seconds;
  auto_since_fixed_ = c.state.checkpoints_since_probe;
  std::map<std::string, std::string> now = JobMathKeys(spec_, data_->sha256());
  // Checkpoints made before the data was identified by content name it by its size.
  now["data.train (size in bytes)"] = std::to_string(data_->file_bytes());
  for (const auto& [key, saved] : c.state.job_math) {
    auto it = now.find(key);
    const std::string current = it == now.end() ? "(unset)" : it->second;
    if (current != saved) {
      return Status::InvalidArgument(
          spec_.file + ": " + key + " is '" + current + "' but checkpoint " + from + " was trained with '" +
          saved +
          "'; changing it would change the training math. Restore the old value, or "
          "start a new run with another output.dir");
    }
  }
  FT_RETURN_IF_ERROR(CheckRestoredInputs(c.state, from));
  FT_RETURN_IF_ERROR(UploadWeights(c, from, /*moments=*/true));
  optimizer_->set_step(c.state.step, c.state.skipped_steps);
  // The evaluations' verdicts go on from the checkpoint's (fresh when it tracked another metric or none).
  if (c.state.evaluation.metric == eval_progress_.metric) eval_progress_ = c.state.evaluation;
  if (spec_.model.dtype == ComputeDType::kF16) {
    loss_scale_ = c.state.loss_scale;
    growth_tracker_ = c.state.loss_scale_growth_tracker;
  }
  cursor_ = c.state.cursor;
  if (!c.state.source_positions.empty() && c.state.source_positions != data_->Positions(cursor_)) {
    return Status::InvalidArgument(
        spec_.file + ": data.train: checkpoint " + from +
        " was written at other positions in the data's sources than its cursor gives "
        "now (the mixture changed); submit a new job for new data");
  }
  tokens_seen_ = c.state.tokens_seen;
  LogResumeGuarantee(c.state);
  return Status::OK();
}

Status Trainer::UploadWeights(const CheckpointContents& c, const std::string& from, bool moments) {
  const auto& params = optimizer_->params();
  std::map<std::string, const HostTensor*> by_name;
  for (const HostTensor& t : c.model) by_name[t.name] = &t;
  for (const HostTensor& t : c.optimizer) by_name[t.name] = &t;
  auto find = [&](const std::string& name, const std::vector<int64_t>& shape) -> StatusOr<const float*> {
    auto it = by_name.find(name);
    if (it == by_name.end()) return Status::Corruption(from + ": tensor '" + name + "' missing");
    if (it->second->shape != shape)
      return Status::Corruption(from + ": tensor '" + name + "' has the wrong shape");
    return it->second->data.data();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const TrainableParam& p = params[i];
    FT_ASSIGN_OR_RETURN(const float* values, find(p.name, p.shape));
    if (moments) {
      FT_ASSIGN_OR_RETURN(const float* m, find(p.name + ".exp_avg", p.shape));
      FT_ASSIGN_OR_RETURN(const float* v, find(p.name + ".exp_avg_sq", p.shape));
      optimizer_->SetMoment(i, 0, m);
      optimizer_->SetMoment(i, 1, v);
    }
    model_->Upload(p.data, values, p.numel);
  }
  return Status::OK();
}

Status Trainer::CheckRestoredInputs(const TrainerState& saved, const std::string& from) const {
  // Only what both know: a checkpoint written before inputs were recorded names none.
  const std::map<std::string, std::string> now = inputs_.Hashes();
  for (const auto& [key, sha] : saved.inputs) {
    auto it = now.find(key);
    if (it == now.end() || it->second == sha) continue;
    return Status::InvalidArgument(spec_.file + ": " + key + " has SHA-256 " + it->second +
                                   " but checkpoint " + from + " was trained on SHA-256 " + sha +
                                   "; resuming would train on a mix of old and new inputs: restore the file "
                                   "or submit a new job");
  }
  return Status::OK();
}

void Trainer::LogResumeGuarantee(const TrainerState& saved) const {
  const std::string was = "micro-batch " + std::to_string(saved.micro_batch) + " x accumulation " +
                          std::to_string(saved.accumulation) + " x world " + std::to_string(saved.world);
  const std::string now = "micro-batch " + std::to_string(plan_.micro_batch) + " x accumulation " +
                          std::to_string(plan_.accumulation) + " x world " + std::to_string(plan_.world);
  const std::string plan =
      was == now ? "batch plan unchanged (" + now + ")" : "batch plan " + was + " -> " + now;
  if (saved.micro_batch != plan_.micro_batch) {
    FT_LOG(INFO) << plan << ": another micro-batch size changes the GEMMs' sums, so training "
                 << "continues within 1e-6 of the uninterrupted run, not byte for byte";
  } else if (grad_sum_) {
    FT_LOG(INFO) << plan << ": same micro-batch size and exact gradient sums, so training continues "
                 << "byte for byte as the uninterrupted run would";
  } else {
    FT_LOG(INFO) << plan << ": train.gradient_sum is float, so a new split of the batch continues "
                 << "within 1e-6 of the uninterrupted run (byte for byte only at the same split)";
  }
}

void Trainer::set_fencing(const std::string& job_id, int64_t epoch) {
  owner_ = std::make_unique<OutputOwner>(spec_.output.dir, job_id, epoch);
}

std::string Trainer::ChooseResumePoint(const std::string& committed) {
  std::vector<std::string> skipped;
  auto newest = FindNewestValidCheckpoint(checkpoint_root(), &skipped);
  for (const std::string& why : skipped) {
    FT_LOG(ERROR) << "DAMAGED CHECKPOINT, falling back to an older one: " << why;
    std::fprintf(stderr, "ft-train: WARNING: damaged checkpoint skipped: %s\n", why.c_str());
  }
  Status committed_ok = Status::NotFound("no committed checkpoint");
  if (!committed.empty()) committed_ok = VerifyCheckpoint(committed);
  std::string dir, kind, note;
  if (newest.ok() && (!committed_ok.ok() || fs::path(newest->dir) != fs::path(committed))) {
    dir = newest->dir;
    if (committed.empty()) {
      kind = "resume";
      note = "resuming from " + dir + ", the newest verified checkpoint";
    } else if (committed_ok.ok()) {
      kind = "resume_ahead";
      note = "resuming from " + dir + ", a verified checkpoint ahead of the committed " + committed;
    } else {
      kind = "resume_fallback";
      note = "committed checkpoint unusable (" + committed_ok.message() + "); resuming from " + dir +
             ", the newest verified checkpoint";
    }
  } else if (committed_ok.ok()) {
    dir = committed;
  } else if (!committed.empty() || !skipped.empty()) {
    kind = "restart_from_zero";
    note = "no valid checkpoint left" +
           (committed.empty() ? "" : " (committed: " + committed_ok.message() + ")") +
           "; starting from step 0";
  }
  // Starting over is always loud; which checkpoint a fenced attempt chose is its ftd's event.
  if (kind == "restart_from_zero") {
    std::fprintf(stderr, "ft-train: WARNING: %s\n", note.c_str());
  } else if (!note.empty() && owner_->fenced()) {
    std::fprintf(stderr, "ft-train: %s\n", note.c_str());
  }
  if (!note.empty() && owner_->fenced()) {
    MetricsLine line = MetricsEvent(MetricsLine::Kind::kResume, 0, note);  // the step is set when written
    line.resume_kind = kind;
    line.dir = dir;
    resume_note_ = line;
  }
  return dir;
}

Status Trainer::ResumeIfPossible(const std::string& resume_dir) {
  // Fenced: ftd's committed checkpoint or a newer verified one. Plain runs:
  // the --resume directory as given, else the newest verified checkpoint.
  // Several ranks: rank 0 chooses, every rank loads the same one.
  std::string dir = resume_dir;
  if (leader()) {
    if (owner_->fenced()) {
      committed_dir_ = resume_dir;
      dir = ChooseResumePoint(resume_dir);
    } else if (dir.empty()) {
      dir = ChooseResumePoint("");
    }
  }
  if (ranks_->world() > 1) {
    FT_RETURN_IF_ERROR(ranks_->Barrier(kRankZeroPhase));  // rank 0 verifies checkpoints meanwhile
    int64_t size = static_cast<int64_t>(dir.size());
    FT_RETURN_IF_ERROR(ranks_->Broadcast(&size, sizeof(size), 0));
    dir.resize(static_cast<size_t>(size));
    if (size > 0) {
      FT_RETURN_IF_ERROR(ranks_->Broadcast(dir.data(), size, 0).WithContext("the checkpoint to resume from"));
    }
  }
  if (dir.empty()) return Status::OK();
  FT_ASSIGN_OR_RETURN(CheckpointContents c, ReadCheckpoint(dir));
  FT_RETURN_IF_ERROR(Restore(c, dir));
  FT_LOG(INFO) << "resumed from " << dir << " (step " << c.state.step << ", " << c.state.cursor
               << " sequences consumed)";
  std::fprintf(stderr, "ft-train: resumed from %s at step %lld\n", dir.c_str(),
               static_cast<long long>(c.state.step));
  return Status::OK();
}

Status Trainer::OpenMetrics() {
  OutputOwner* owner = owner_.get();
  metrics_ =
      std::make_unique<MetricsLog>((fs::path(spec_.output.dir) / "metrics.jsonl").string(),
                                   [owner]() { return owner->fenced() ? owner->Check() : Status::OK(); },
                                   owner_->fenced() ? owner_->epoch() : 0);
  // Keep the lines of steps the restored state includes; drop what a killed run logged past it.
  return metrics_->Open(steps_done());
}

Status Trainer::CheckpointNow(const std::string& reason, bool wait) {
  // Sharded optimizer state: every rank's moments to every rank first (every rank calls this).
  FT_RETURN_IF_ERROR(optimizer_->GatherMoments().WithContext(spec_.file + ": checkpoint"));
  if (!leader()) return Status::OK();  // the replicas are identical: rank 0 writes for all
  if (!writer_) {
    writer_ = std::make_unique<CheckpointWriter>(checkpoint_root());
    writer_->Seed(restored_mean_c_, restored_fixed_);
  }
  Retention retention;
  retention.keep = spec_.checkpoint.keep;
  // Read when the prune runs (a commit may arrive while the checkpoint is written).
  retention.committed = [this] {
    const std::string forwarded = control_ ? control_->committed_dir() : "";
    return forwarded.empty() ? committed_dir_ : forwarded;
  };
  retention.epoch = owner_->epoch();
  if (spec_.checkpoint.keep_best && eval_progress_.best_step > 0) {  // kept beside the newest `keep`
    retention.protect.push_back(
        (fs::path(checkpoint_root()) / CheckpointName(eval_progress_.best_step)).string());
  }
  OutputOwner* owner = owner_.get();
  retention.fence = [owner] { return owner->Check(); };
  FT_RETURN_IF_ERROR(CheckInputs());  // a checkpoint never holds a mix of old and new inputs
  CheckpointContents contents = Capture(reason);
  FT_RETURN_IF_ERROR(RequireFiniteWeights(spec_, contents));  // every checkpoint, the final one too
  last_written_step_ = contents.state.step;
  FT_RETURN_IF_ERROR(writer_->Submit(std::move(contents), std::move(retention)));
  if (wait) FT_RETURN_IF_ERROR(writer_->Wait());
  return LogCompletedCheckpoints();
}

Status Trainer::LogCompletedCheckpoints() {
  if (!writer_) return Status::OK();
  for (const CheckpointWriter::Completed& c : writer_->TakeCompleted()) {
    MetricsLine line = MetricsEvent(MetricsLine::Kind::kCheckpoint, c.step, c.reason);
    line.dir = c.dir;
    line.checkpoint_seconds = c.seconds;
    line.interval_seconds = c.interval_seconds;
    line.mtbf_seconds = c.mtbf_seconds;
    line.back_to_back = c.back_to_back;
    FT_RETURN_IF_ERROR(Log(line).WithContext("the event line of checkpoint " + c.dir));
  }
  return Status::OK();
}

Status Trainer::Log(const MetricsLine& line) {
  if (!leader()) return Status::OK();
  if (!metrics_) return Status::FailedPrecondition(spec_.output.dir + "/metrics.jsonl: not open yet");
  return metrics_->Write(line);
}

StatusOr<bool> Trainer::AlreadyComplete() {
  const std::string hash = JobHash(spec_, data_->sha256());
  auto done = VerifyCompletion(spec_.output.dir, hash, /*checksums=*/true);
  // Every step trained, or as many as early stopping let it (the stop is in the job's math).
  if (done.ok() && owner_->fenced() && (done->steps == total_steps_ || !done->stop_reason.empty())) {
    std::fprintf(stderr, "ft-train: already complete at step %lld (COMPLETE.json of epoch %lld)\n",
                 static_cast<long long>(done->steps), static_cast<long long>(done->epoch));
    return true;
  }
  if (done.status().IsNotFound()) return false;
  // Another job's record, damaged outputs, or a plain run that trains again: not complete any more.
  FT_RETURN_IF_ERROR(owner_->Check());
  FT_RETURN_IF_ERROR(RemoveCompletion(spec_.output.dir));
  return false;
}

Status Trainer::EvaluateIfDue(int64_t step) {
  // Every rank evaluates its share (Evaluate); rank 0 logs.
  const int64_t every = spec_.train.eval_every_steps;
  if (!eval_data_ || !(step == total_steps_ || (every > 0 && step % every == 0))) return Status::OK();
  EvalMetrics e;
  bool interrupted = false;
  FT_RETURN_IF_ERROR(Evaluate(&e, &interrupted));
  if (interrupted) {
    FT_LOG(WARN) << "evaluation at step " << step << " abandoned for a stop request";
    return Status::OK();
  }
  MetricsLine line;
  line.kind = MetricsLine::Kind::kEval;
  line.step = e.step;
  line.eval_loss = e.loss;
  line.eval_tokens = e.tokens;
  line.eval_seconds = e.seconds;
  line.objective_metrics = e.objective_metrics;
  FT_RETURN_IF_ERROR(Log(line));
  std::fprintf(stderr, "eval at step %" PRId64 ": loss %.4f over %" PRId64 " tokens (%.2f s)\n", e.step,
               e.loss, e.tokens, e.seconds);
  return ActOnEvaluation(e);
}

Status Trainer::ActOnEvaluation(const EvalMetrics& e) {
  if (!TracksEvaluations(spec_)) return Status::OK();
  auto value = EvalMetricValue(JudgedMetric(spec_), e.loss, e.objective_metrics);
  if (!value.ok()) return value.status().WithContext(spec_.file);
  const EvalVerdict verdict = RecordEvaluation(spec_, e.step, total_steps_, *value, &eval_progress_);
  best_checkpoint_due_ = verdict.best && spec_.checkpoint.keep_best;
  if (verdict.best) {
    std::fprintf(stderr, "eval at step %" PRId64 ": best %s so far (%.6g)\n", e.step,
                 eval_progress_.metric.c_str(), *value);
  }
  return Status::OK();
}

Status Trainer::EvaluateMissedStep() {
  const int64_t step = steps_done(), every = spec_.train.eval_every_steps;
  if (!TracksEvaluations(spec_) || step == 0 || eval_progress_.last_step >= step ||
      !eval_progress_.stop_reason.empty() || !(step == total_steps_ || (every > 0 && step % every == 0))) {
    return Status::OK();
  }
  FT_LOG(INFO) << "evaluating step " << step << " again: its evaluation was abandoned before the checkpoint";
  FT_RETURN_IF_ERROR(EvaluateIfDue(step));
  best_checkpoint_due_ = false;  // the resumed checkpoint holds this step's state already
  return Status::OK();
}

Status Trainer::LogEarlyStop() {
  const std::string& why = eval_progress_.stop_reason;
  std::fprintf(stderr, "ft-train: stopped at step %lld of %lld: %s\n", static_cast<long long>(steps_done()),
               static_cast<long long>(total_steps_), why.c_str());
  return Log(MetricsEvent(MetricsLine::Kind::kEarlyStop, steps_done(), why));
}

StatusOr<int64_t> Trainer::LoadBestWeights() {
  const int64_t best = eval_progress_.best_step;
  if (spec_.output.adapter_from != AdapterFrom::kBest || best == steps_done()) return 0;
  if (best <= 0) {
    FT_LOG(WARN) << "output.adapter_from: best: no evaluation gave a finite " << eval_progress_.metric
                 << "; the outputs are the last step's";
    return 0;
  }
  const std::string dir = (fs::path(checkpoint_root()) / CheckpointName(best)).string();
  auto best_checkpoint = ReadCheckpoint(dir);
  if (!best_checkpoint.ok()) {
    return best_checkpoint.status().WithContext(spec_.file +
                                                ": output.adapter_from: best: the checkpoint of step " +
                                                std::to_string(best) + " (checkpoint.keep_best)");
  }
  FT_RETURN_IF_ERROR(UploadWeights(*best_checkpoint, dir, /*moments=*/false));
  std::fprintf(stderr, "ft-train: outputs from the best checkpoint, step %lld (%s %.6g)\n",
               static_cast<long long>(best), eval_progress_.metric.c_str(), eval_progress_.best_value);
  return best;
}

StatusOr<RunOutcome> Trainer::Run(const std::string& resume_dir) {
  StatusOr<RunOutcome> outcome = RunSteps(resume_dir);
  // A superseded run leaves the directory to its new owner: not even a metrics line.
  if (!outcome.ok() && metrics_ && metrics_->is_open() && !outcome.status().IsAborted()) {
    // The worker and the dashboard read why a run failed from the metrics too; the run has failed
    // already, so a failure to say so is only logged (the exit code and stderr still carry it).
    const MetricsLine line =
        MetricsEvent(MetricsLine::Kind::kFailed, steps_done(), outcome.status().ToString());
    if (Status logged = Log(line); !logged.ok()) FT_LOG(ERROR) << logged.ToString();
  }
  return outcome;
}

MetricsLine Trainer::StepLine(const StepMetrics& m) const {
  MetricsLine line;
  line.kind = MetricsLine::Kind::kStep;
  line.step = m.step;
  line.loss = m.loss;
  line.lr = m.lr;
  line.grad_norm = m.skipped ? std::numeric_limits<double>::quiet_NaN() : m.grad_norm;  // written as null
  line.tokens = m.tokens;
  line.tokens_seen = m.tokens_seen;
  line.tokens_per_s = m.tokens_per_s;
  line.step_seconds = m.step_seconds;
  line.time_ms = WallNowMs();  // written right after the step: goodput's timeline (daemon/goodput.h)
  line.copy_wait_seconds = m.copy_wait_seconds;
  line.peak_bytes = m.peak_bytes;
  line.peak_bytes_by_category = m.peak_by_category;
  line.checkpoint_seconds = writer_ ? writer_->last_seconds() : 0;
  line.world = ranks_->world();
  line.allreduce_seconds = m.allreduce_seconds;
  line.gather_seconds = m.gather_seconds;
  line.sharded = model_->sharded();
  line.fp16 = spec_.model.dtype == ComputeDType::kF16;
  line.loss_scale = m.loss_scale;
  line.skipped = m.skipped;
  line.objective_metrics = m.objective_metrics;
  return line;
}

StatusOr<bool> Trainer::ClaimOutput() {
  std::vector<double> complete = {0};
  if (leader()) {  // rank 0 owns output.dir
    // The user's own output.dir being a file is bad input; anything below it is the filesystem's state.
    if (std::error_code ec; fs::exists(spec_.output.dir, ec) && !fs::is_directory(spec_.output.dir, ec)) {
      return Status::InvalidArgument(spec_.file + ": output.dir: " + spec_.output.dir +
                                     ": exists and is not a directory; name a directory");
    }
    FT_RETURN_IF_ERROR(CreateDirectoriesConfined(spec_.output.dir).WithContext(spec_.file + ": output.dir"));
    FT_RETURN_IF_ERROR(owner_->Claim());
    FT_ASSIGN_OR_RETURN(bool done, AlreadyComplete());
    complete[0] = done ? 1 : 0;
  }
  // Also where ranks that loaded the model faster wait for the slower ones.
  FT_RETURN_IF_ERROR(ranks_->Barrier(kRankZeroPhase));
  FT_RETURN_IF_ERROR(Agree(&complete));
  return complete[0] > 0;
}

Status Trainer::StartLog(const std::string& resume_dir) {
  FT_RETURN_IF_ERROR(ResumeIfPossible(resume_dir));
  if (leader()) {
    FT_RETURN_IF_ERROR(owner_->Check());
    FT_RETURN_IF_ERROR(OpenMetrics());
  }
  if (resume_note_) {
    resume_note_->step = steps_done();
    FT_RETURN_IF_ERROR(Log(*resume_note_));
  }
  FT_LOG(INFO) << "training " << spec_.model.path << ": steps " << steps_done() + 1 << ".." << total_steps_
               << ", micro-batch " << plan_.micro_batch << " x accumulation " << plan_.accumulation
               << " x world " << plan_.world
               << (plan_.world > 1 ? (model_->sharded() ? " (FSDP, rank " : " (DDP, rank ") : "")
               << (plan_.world > 1 ? std::to_string(ranks_->rank()) + ")" : "");
  return Status::OK();
}

StatusOr<Trainer::Request> Trainer::HandleRequest() {
  if (!control_) return Request::kNone;
  // A request at any rank holds for all: every rank checkpoints (rank 0 writes) and stops together.
  auto req = control_->Take();
  std::vector<double> wanted = {req ? 1.0 : 0.0, req && req->stop ? 1.0 : 0.0};
  FT_RETURN_IF_ERROR(Agree(&wanted));
  if (wanted[0] == 0) return Request::kNone;
  const std::string reason = req ? req->reason : "a request at another rank";
  FT_RETURN_IF_ERROR(CheckpointNow(reason, /*wait=*/true));
  FT_RETURN_IF_ERROR(ranks_->Barrier(kRankZeroPhase));  // rank 0 wrote it
  if (wanted[1] == 0) return Request::kCheckpointed;
  FT_RETURN_IF_ERROR(Log(MetricsEvent(MetricsLine::Kind::kPreempted, steps_done(), reason)));
  std::fprintf(stderr, "ft-train: stopped after checkpoint at step %lld (%s)\n",
               static_cast<long long>(steps_done()), reason.c_str());
  return Request::kStop;
}

StatusOr<bool> Trainer::CheckpointDue(int64_t step, std::chrono::steady_clock::time_point last_checkpoint) {
  const JobSpec::Checkpoint& c = spec_.checkpoint;
  const bool automatic = c.every == CheckpointEvery::kAuto;
  const bool by_steps = !automatic && c.every_steps > 0 && step % c.every_steps == 0;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_checkpoint).count();
  std::vector<double> due = {0.0};
  if (automatic) {
    FT_ASSIGN_OR_RETURN(const bool passed, AutoIntervalPassed(step, seconds));
    due[0] = passed ? 1.0 : 0.0;
  } else {
    due[0] = c.every_minutes > 0 && seconds / 60.0 >= c.every_minutes ? 1.0 : 0.0;
  }
  if (automatic || c.every_minutes > 0) FT_RETURN_IF_ERROR(Agree(&due));  // the ranks' clocks differ
  FT_RETURN_IF_ERROR(LogCompletedCheckpoints());
  const bool best = std::exchange(best_checkpoint_due_, false);  // keep_best: this step is the best so far
  if (step >= total_steps_) return false;                        // Finish writes the last step's
  if (!by_steps && due[0] == 0) {
    if (best) FT_RETURN_IF_ERROR(CheckpointNow(kBestReason, /*wait=*/!c.async));
    return best;
  }
  const bool back_to_back = BackToBack(step);  // rank 0's view
  FT_RETURN_IF_ERROR(CheckpointNow(automatic  ? (probe_due_ ? kAutoProbeReason : kAutoReason)
                                   : by_steps ? "every_steps"
                                              : "every_minutes",
                                   /*wait=*/!c.async));
  if (automatic) AfterAutoCheckpoint(back_to_back);
  return true;
}

void Trainer::AfterAutoCheckpoint(bool back_to_back) {
  if (!leader()) return;
  if (back_to_back) {
    auto_since_fixed_ = 0;
    probe_due_ = false;
    return;
  }
  ++auto_since_fixed_;
  probe_due_ = ProbeDue(auto_since_fixed_, static_cast<int64_t>(RecentFixed().size()));
}

std::vector<double> Trainer::RecentFixed() { return writer_ ? writer_->recent_fixed() : restored_fixed_; }

CheckpointCost Trainer::MeasuredCost() {
  return {MedianSeconds(RecentFixed()), writer_ ? writer_->mean_seconds() : restored_mean_c_};
}

StatusOr<bool> Trainer::AutoIntervalPassed(int64_t step, double seconds) {
  // Rank 0 decides (it measures C: its writer writes); the others vote no and follow through Agree.
  if (!leader()) return false;
  // C unmeasured while the first checkpoint is still being written: its cost is known once it
  // lands, so wait for it rather than read "not measured" as "due now" and queue another.
  if (writer_ && writer_->mean_seconds() <= 0) FT_RETURN_IF_ERROR(writer_->Wait());
  // C: the fixed part of the recent writes (back to back; their median: one fsync can be slow);
  // after a resume, the resumed checkpoint's stand in for the writes not yet measured.
  const CheckpointCost cost = MeasuredCost();
  const double c = cost.c();
  const CheckpointInterval interval =
      ChooseCheckpointInterval(cost, mtbf_seconds_, spec_.checkpoint.min_minutes,
                               spec_.checkpoint.max_minutes, spec_.checkpoint.async);
  // Noted when it first applies and when it moves by more than a tenth (C is measured anew each time).
  auto_interval_s_ = interval.seconds;
  if (noted_interval_s_ < 0 || std::fabs(interval.seconds - noted_interval_s_) > 0.1 * noted_interval_s_) {
    noted_interval_s_ = interval.seconds;
    FT_LOG(INFO) << "checkpoint.every auto: " << interval.why;
    MetricsLine line = MetricsEvent(MetricsLine::Kind::kInterval, step, interval.why);
    line.interval_seconds = interval.seconds;
    line.checkpoint_seconds = c;
    line.mtbf_seconds = mtbf_seconds_ > 0 ? mtbf_seconds_ : kPriorMtbfSeconds;
    FT_RETURN_IF_ERROR(Log(line));
  }
  return probe_due_ || seconds >= interval.seconds;
}

Status Trainer::Finish() {
  // Rank 0 decides (its writer may still be finishing one); every rank takes part in the checkpoint.
  if (leader() && writer_) FT_RETURN_IF_ERROR(writer_->Wait());
  std::vector<double> final_needed = {leader() &&
                                              (ListCheckpoints(checkpoint_root()).empty() ||
                                               ListCheckpoints(checkpoint_root()).front().step < steps_done())
                                          ? 1.0
                                          : 0.0};
  FT_RETURN_IF_ERROR(Agree(&final_needed));
  if (final_needed[0] > 0) {
    FT_RETURN_IF_ERROR(CheckpointNow("final", /*wait=*/true));
  } else if (writer_) {
    FT_RETURN_IF_ERROR(writer_->Wait());
    FT_RETURN_IF_ERROR(LogCompletedCheckpoints());
  }
  return WriteOutputs();
}

StatusOr<RunOutcome> Trainer::RunSteps(const std::string& resume_dir) {
  FT_ASSIGN_OR_RETURN(const bool complete, ClaimOutput());
  if (complete) return RunOutcome::kFinished;
  FT_RETURN_IF_ERROR(StartLog(resume_dir));
  FT_RETURN_IF_ERROR(EvaluateMissedStep());
  auto last_checkpoint = std::chrono::steady_clock::now();
  while (steps_done() < total_steps_ && eval_progress_.stop_reason.empty()) {
    FT_ASSIGN_OR_RETURN(const Request request, HandleRequest());
    if (request == Request::kStop) return RunOutcome::kPreempted;
    if (request == Request::kCheckpointed) {
      last_checkpoint = std::chrono::steady_clock::now();
      continue;
    }
    StepMetrics m;
    bool interrupted = false;
    FT_RETURN_IF_ERROR(Step(&m, &interrupted));
    if (interrupted) continue;  // the stop request is handled at the top of the loop
    FT_RETURN_IF_ERROR(Log(StepLine(m)));
    std::fprintf(stderr,
                 "step %" PRId64 "/%" PRId64
                 "  loss %.4f  lr %.3e  grad_norm %.3f  %.0f tok/s  peak %.1f MiB\n",
                 m.step, total_steps_, m.loss, m.lr, m.grad_norm, m.tokens_per_s,
                 static_cast<double>(m.peak_bytes) / (1 << 20));
    FT_RETURN_IF_ERROR(EvaluateIfDue(m.step));
    if (!eval_progress_.stop_reason.empty()) break;  // early stopping: the final checkpoint is this step's
    FT_ASSIGN_OR_RETURN(const bool checkpointed, CheckpointDue(m.step, last_checkpoint));
    if (checkpointed) last_checkpoint = std::chrono::steady_clock::now();
  }
  if (!eval_progress_.stop_reason.empty()) FT_RETURN_IF_ERROR(LogEarlyStop());
  FT_RETURN_IF_ERROR(Finish());
  return RunOutcome::kFinished;
}

namespace {
// Writes into <final>.tmp.e<epoch>.<pid> with `write`, then swaps it into
// place, checking ownership before the write and before the swap.
Status WriteDirAtomically(OutputOwner& owner, const fs::path& final_dir,
                          const std::function<Status(const std::string&)>& write) {
  FT_RETURN_IF_ERROR(owner.Check());
  const fs::path tmp =
      final_dir.string() + ".tmp.e" + std::to_string(owner.epoch()) + "." + std::to_string(::getpid());
  FT_RETURN_IF_ERROR(RemoveAllConfined(tmp.string()));
  FT_RETURN_IF_ERROR(write(tmp.string()));
  FT_RETURN_IF_ERROR(SyncDirectory(tmp.string()));
  if (Status owned = owner.Check(); !owned.ok()) {
    (void)RemoveAllConfined(tmp.string());
    return owned;
  }
  FT_RETURN_IF_ERROR(RemoveAllConfined(final_dir.string()));
  return RenameDurably(tmp.string(), final_dir.string());
}
}  // namespace

Status Trainer::WriteOutputs() {
  if (!leader()) return Status::OK();
  FT_ASSIGN_OR_RETURN(const int64_t adapter_step, LoadBestWeights());  // output.adapter_from: best
  const fs::path out(spec_.output.dir);
  std::vector<std::string> written;  // what COMPLETE.json records
  if (model_->full_training()) {
    DType dtype = model_->config().torch_dtype == "bfloat16" ? DType::kBF16 : DType::kF32;
    FT_RETURN_IF_ERROR(WriteDirAtomically(
        *owner_, out / "model", [&](const std::string& d) { return SaveHfModel(d, *model_, dtype); }));
    written.push_back("model");
  } else {
    FT_RETURN_IF_ERROR(WriteDirAtomically(*owner_, out / "adapter", [&](const std::string& d) {
      return SavePeftAdapter(d, *model_, spec_.model.path);
    }));
    written.push_back("adapter");
  }
  if (spec_.output.merge && !model_->full_training()) {
    // Merge into a copy so the training model keeps its adapters. A job that offloads its
    // frozen weights has no room for a whole model on the device: it merges on the host.
    ModelOptions merge_options = model_->options();
    merge_options.shard = {};  // rank 0 merges alone, from the files
    if (merge_options.cpu_offload) {
      merge_options.cpu_offload = merge_options.offload_activations = false;
      merge_options.backend = CpuBackendInstance();
    }
    try {
      FT_RETURN_IF_ERROR(WriteMerged(merge_options));
    } catch (const std::bad_alloc&) {
      return Status::ResourceExhausted(
          spec_.file + ": output.merge: the merged model does not fit in memory on " +
          merge_options.backend->Describe() + "; the adapter is written (" + (out / "adapter").string() +
          "): set output.merge: false and merge elsewhere");
    }
    written.push_back("merged");
  }
  FT_RETURN_IF_ERROR(owner_->Check());
  // The outputs (merged/ read the model again) came from the inputs the run began with.
  FT_RETURN_IF_ERROR(CheckInputs());
  CompletionRecord record{
      owner_->job_id(), JobHash(spec_, data_->sha256()), owner_->epoch(), steps_done(), {}};
  record.stop_reason = eval_progress_.stop_reason;
  record.adapter_step = adapter_step;
  return WriteCompletion(spec_.output.dir, std::move(record), written);
}

Status Trainer::WriteMerged(const ModelOptions& options) {
  const fs::path out(spec_.output.dir);
  Model merged(model_->config(), options);
  FT_RETURN_IF_ERROR(LoadHfWeights(spec_.model.path, &merged));
  FT_RETURN_IF_ERROR(merged.EnableLora(*model_->lora_spec()));
  FT_RETURN_IF_ERROR(LoadPeftAdapter((out / "adapter").string(), &merged));
  merged.MergeLora();
  return WriteDirAtomically(*owner_, out / "merged", [&](const std::string& d) {
    FT_RETURN_IF_ERROR(SaveHfModel(d, merged, DType::kF32));
    return CopyTokenizerFiles(spec_.model.path, d);  // a complete model directory (ft-train generate)
  });
}

}  // namespace ft
