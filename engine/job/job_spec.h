// job.yaml: the user-facing description of a fine-tuning job (the contract in
// shared/DESIGN.md), parsed and validated.
//
// Unknown keys are rejected with file:line and a suggestion; values of the
// wrong type or out of range name file:line:col and the key. Every named
// choice is an enum of engine/job/job_choices.h, parsed through its table.
// Choices a trainer cannot combine (adapter.type: full with nf4, cpu_offload
// or multi-rank fsdp) are refused here with file:line, so ftctl and ftd refuse
// them at submit. Relative paths
// (model.path, adapter.init, data.*, output.dir) are resolved against the
// folder that holds the job file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/job/job_choices.h"

namespace ft {

struct JobSpec {
  std::string file;  // where it was read from ("" when parsed from text)
  std::string name;

  struct Model {
    std::string path;
    Quantization quantization = Quantization::kNone;
    bool double_quant = true;
    ComputeDType dtype = ComputeDType::kBF16;
  } model;

  struct Adapter {
    AdapterType type = AdapterType::kLora;
    int64_t r = 16;
    double alpha = 32;
    double dropout = 0.0;
    bool rslora = false;
    // PEFT's all-linear (every linear of the model's family: q..down_proj, Phi-3's fused ones),
    // resolved against the model (ResolveTargetModules).
    std::vector<std::string> target_modules = {"all-linear"};
    std::string init;  // PEFT adapter directory, or ""
  } adapter;

  // One file of data.train or data.eval. data.train may be one path (one source, its keys the
  // data section's) or a list of sources, each a map (engine/data/mixture.h mixes them).
  struct DataSource {
    std::string path;
    DataFormat format = DataFormat::kText;  // unset: data.format
    // The source's share of the mixture's rows: weight (normalised over the list), or epochs
    // (passes over this source per pass of the mixture). A list uses one of the two for every
    // source; a single path is weight 1.
    double weight = 1;
    double epochs = 0;
    // Field mapping (data.train[i].fields): `keys` maps a key of the format to the row's own name
    // ("messages" -> "conversations", "role" -> "from", "instruction" -> "question"); `roles`
    // maps a row's role value to the format's ("human" -> "user"). Empty: the rows use the
    // format's names.
    std::map<std::string, std::string> keys;
    std::map<std::string, std::string> roles;
    std::string chat_template;  // a .jinja file for this source ("" = data.chat_template)
    std::string key;            // how messages name it: "data.train", "data.train[2]", "data.eval[0]"
  };

  struct Data {
    std::string train;  // the first source's path (the only one unless data.train is a list)
    std::vector<DataSource> train_sources;  // at least one after parsing
    DataFormat format = DataFormat::kText;
    int64_t seq_len = 2048;
    bool packing = true;
    bool shuffle = true;
    bool skip_bad_lines = false;  // skip and count unparsable lines instead of failing
    std::string chat_template;    // a .jinja file replacing the tokenizer's chat template ("" = the model's)
    std::map<std::string, std::string> chat_template_vars;  // extra template variables (YAML scalars)
    std::string eval;                                       // the first eval source's path ("" = none)
    std::vector<DataSource> eval_sources;                   // data.eval as a path or a list; empty = none
    // data.val_fraction: this fraction of the training rows (chosen by a hash of each row's bytes,
    // so a resume or an append never moves a row across) is held out as the eval set instead.
    double val_fraction = 0;
    // data.format: preference: a prompt longer than this keeps its last max_prompt_len tokens
    // (TRL's keep_end), then each response is cut to seq_len (must be below seq_len).
    int64_t max_prompt_len = 0;  // 0 = seq_len / 2 after parsing
  } data;

  struct Train {
    int64_t max_steps = 0;  // 0 when epochs is used
    int64_t epochs = 0;
    int64_t global_batch_size = 64;
    int64_t micro_batch_size = 0;       // 0 = auto
    int64_t gradient_accumulation = 0;  // 0 = auto
    double lr = 2e-4;
    LrSchedule lr_schedule = LrSchedule::kCosine;
    int64_t warmup_steps = 0;
    double weight_decay = 0.0;
    double max_grad_norm = 1.0;  // <= 0 disables clipping
    double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
    OptimizerKind optimizer = OptimizerKind::kAdamW;
    int64_t seed = 42;
    ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kOn;
    bool cpu_offload = false;
    AttentionKind attention = AttentionKind::kFlash;
    GradientSum gradient_sum = GradientSum::kAuto;  // ExactGradientSum() resolves auto
    // Evaluation on data.eval (mean token cross-entropy, no gradient, no dropout): every
    // eval_every_steps steps and at the last step. Unset in the file: checkpoint.every_steps when
    // data.eval is set (after parsing it is always resolved); 0 = only at the last step, or never
    // without data.eval.
    int64_t eval_every_steps = 0;
    int64_t eval_max_batches = 0;  // micro-batches of the eval set per evaluation; 0 = all
    // Dynamic loss scaling (model.dtype: fp16 only; torch.amp.GradScaler's defaults): the loss is
    // multiplied by the scale before backward; a step whose gradients overflow is skipped and the
    // scale halved; after loss_scale_growth_interval good steps in a row it doubles.
    double loss_scale_init = 65536;
    int64_t loss_scale_growth_interval = 2000;
    // What a step minimises (engine/train/objective.h); dpo needs data.format: preference and a
    // LoRA/QLoRA adapter (its reference is the model with the adapter off).
    TrainObjective objective = TrainObjective::kSft;
    struct Dpo {
      double beta = 0.1;
      DpoLoss loss = DpoLoss::kSigmoid;
      double label_smoothing = 0;  // sigmoid only; in [0, 0.5)
      // TRL's rpo_alpha (RPO): + rpo_alpha x the chosen response's mean token NLL, per pair (0 = off).
      double rpo_alpha = 0;
    } dpo;
    // train.early_stopping (engine/train/early_stopping.h): the run ends, as a success, once
    // `patience` evaluations in a row have not improved `metric` by more than min_delta. Needs an
    // evaluation set and eval_every_steps > 0.
    struct EarlyStopping {
      bool enabled = false;  // the key is set
      EvalMetric metric = EvalMetric::kEvalLoss;
      int64_t patience = 0;  // >= 1 when enabled
      double min_delta = 0;
    } early_stopping;
  } train;

  struct Checkpoint {
    int64_t every_steps = 50;
    double every_minutes = 10;
    int64_t keep = 3;
    // every: auto (engine/train/checkpoint_interval.h): the Young/Daly interval, kept within
    // [min_minutes, max_minutes]; every_steps and every_minutes are then not used.
    CheckpointEvery every = CheckpointEvery::kFixed;
    double min_minutes = 0;
    double max_minutes = 60;
    // false: the step loop waits for each periodic checkpoint to be durable (no host copy of
    // the state; C is then what each checkpoint costs the step). true: written in the
    // background while training goes on (the next checkpoint waits for the previous write).
    bool async = true;
    // The checkpoint of the best evaluation so far (by train.early_stopping.metric, eval_loss
    // without it) is written and never removed by retention: kept beside the newest `keep`.
    bool keep_best = false;
  } checkpoint;

  struct Resources {
    int64_t gpus = 1;
    // Elastic jobs: the fewest ranks an attempt may start with (default: gpus).
    // ftd starts each attempt with the most ranks in [min_gpus, gpus] it can
    // place then (AllowedWorld), so a job preempted on 4 GPUs resumes on the 2
    // left; with exact gradient sums and a fixed micro-batch the math is the
    // same at every world size (issue #30).
    int64_t min_gpus = 1;  // after parsing: gpus when the key is unset
    DeviceRequest device = DeviceRequest::kAuto;
    int64_t priority = 0;
    int64_t max_failures = 3;
  } resources;

  // Multi-rank training (resources.gpus ranks): ddp replicates the model and
  // all-reduces gradients once per optimizer step; fsdp shards the frozen
  // weights and the optimizer of LoRA/QLoRA (a full fine-tune with more than
  // one rank is refused).
  struct Distributed {
    DistributedStrategy strategy = DistributedStrategy::kDdp;
  } distributed;

  struct Output {
    std::string dir;
    bool merge = false;
    AdapterFrom adapter_from = AdapterFrom::kLast;  // best: the keep_best checkpoint's weights
  } output;
};

// The largest job.yaml accepted (ftctl, ftd and ft-train alike): a job names
// its data files, it does not hold data. Its nodes and nesting are bounded
// too (common/yaml_config.h's YamlLimits), before a tree is built.
constexpr size_t kMaxJobSpecBytes = size_t{256} << 10;

// Parses and validates job.yaml text. `file` names it in messages and anchors
// relative paths (its parent folder). InvalidArgument for text over
// kMaxJobSpecBytes, or past YamlLimits' nodes or depth, before any tree is built.
StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& file);
// Reads and parses a job file; one larger than kMaxJobSpecBytes is refused before it is read.
StatusOr<JobSpec> LoadJobSpec(const std::string& file);

// Whether the job evaluates: data.eval or data.val_fraction is set.
bool JobHasEval(const JobSpec& spec);

// The files and directories a job reads, each with its job.yaml key:
// model.path, data.train (or each data.train[i].path and .chat_template of a
// list), data.eval (likewise), data.chat_template, adapter.init (a path may
// be "" when the key is unset). output.dir, which it writes, is not among them.
std::vector<std::pair<std::string, std::string>> JobInputPaths(const JobSpec& spec);

// Whether an attempt of `spec` may run with `world` ranks: resources.gpus, or
// for an elastic job (resources.min_gpus < gpus) any world in [min_gpus, gpus]
// that splits the global batch into whole micro-batches per rank (with
// train.micro_batch_size fixed: global_batch_size / micro_batch_size divisible
// by world; with it auto: global_batch_size divisible by world).
bool AllowedWorld(const JobSpec& spec, int64_t world);
// What those worlds must divide: global_batch_size / micro_batch_size when the
// micro-batch is fixed, else global_batch_size (the scheduler's JobView::batch_units).
int64_t BatchSplitUnits(const JobSpec& spec);

// Whether train.gradient_sum is exact once auto is resolved (exact for an
// adapter, float for a full fine-tune).
bool ExactGradientSum(const JobSpec& spec);

// Job text with command-line overrides ("train.lr=1e-4", ftctl submit --set
// and ft-train run --set; common/yaml_config.h's ApplyYamlOverrides).
struct MergedJob {
  JobSpec spec;
  std::string yaml;  // the merged job.yaml text: what ftd stores and every attempt runs
};
// Validates the merged job exactly like a file. An error the overrides cause
// names the override ("--set train.lr=fast: expected a number, got 'fast'",
// "--set train.lrr=1: unknown key 'lrr' in train (did you mean 'lr'?)"); an
// error of the file itself keeps the file's line. No overrides: the text as is.
StatusOr<MergedJob> ParseJobWithOverrides(const std::string& yaml_text, const std::string& file,
                                          const std::vector<std::string>& overrides);
StatusOr<MergedJob> LoadJobWithOverrides(const std::string& file, const std::vector<std::string>& overrides);

// The job.yaml ftd hands a worker: `yaml` (the stored job text, which parsed
// as `spec`) with every path absolute, as `spec` resolved them, and the
// batch plan fixed (train.micro_batch_size, train.gradient_accumulation,
// resources.gpus = world, resources.min_gpus dropped), so every attempt runs
// exactly what was planned for it.
std::string ResolvedJobYaml(const JobSpec& spec, const std::string& yaml, int64_t micro_batch,
                            int64_t accumulation, int64_t world);

}  // namespace ft
