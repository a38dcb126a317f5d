#include "engine/job/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/file_util.h"
#include "common/yaml_config.h"
#include "engine/job/data_fields.h"
#include "engine/model/model_config.h"

namespace ft {

namespace fs = std::filesystem;

namespace {

// InvalidArgument "<file:line:col>: <key>: <what>" unless ok.
Status Require(bool ok, const YamlMap& m, const std::string& key, const std::string& what) {
  if (ok) return Status::OK();
  return Status::InvalidArgument(m.Where(key) + ": " + m.KeyPath(key) + ": " + what);
}

// The largest step count any step-valued key may hold (max_steps, warmup_steps,
// every_steps, ...): a billion steps is decades at one step a second, and the
// bound keeps every product of steps and batches far inside int64.
constexpr int64_t kMaxSteps = 1'000'000'000;

// Reads the choice `key` (when present) through E's table: its names, in the
// table's order, make the "'x' is not one of a | b (did you mean ...)" error.
template <typename E>
Status GetChoice(const YamlMap& m, const std::string& key, E* out) {
  std::string text(EnumName(*out));
  FT_RETURN_IF_ERROR(m.GetEnum(key, EnumNameList<E>(), &text));
  FT_ASSIGN_OR_RETURN(*out, ParseEnum<E>(text));
  return Status::OK();
}

// Reads the integer `key` (when present) and requires it in [lo, hi].
Status GetInt(const YamlMap& m, const std::string& key, int64_t lo, int64_t hi, int64_t* out,
              const std::string& meaning = "") {
  FT_RETURN_IF_ERROR(m.Get(key, out));
  return Require(*out >= lo && *out <= hi, m, key,
                 "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + meaning +
                     ", got " + std::to_string(*out));
}

// Reads the finite number `key` (when present) and requires it in [lo, hi]
// (`open_low`: in (lo, hi]).
Status GetNumber(const YamlMap& m, const std::string& key, double lo, double hi, bool open_low, double* out,
                 const std::string& meaning = "") {
  FT_RETURN_IF_ERROR(m.Get(key, out));
  char range[96];
  std::snprintf(range, sizeof(range), "%s%g, %g]", open_low ? "(" : "[", lo, hi);
  char got[48];
  std::snprintf(got, sizeof(got), "%g", *out);
  return Require((open_low ? *out > lo : *out >= lo) && *out <= hi, m, key,
                 std::string("must be a number in ") + range + meaning + ", got " + got);
}

std::string Resolve(const std::string& base_dir, const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

// Reads section `name` with `fn` when present, after checking its keys.
template <typename Fn>
Status Section(const YamlMap& root, const std::string& name, const std::vector<std::string>& keys, Fn fn) {
  if (!root.Has(name)) return Status::OK();
  FT_ASSIGN_OR_RETURN(YamlMap m, root.Child(name));
  FT_RETURN_IF_ERROR(m.CheckKnownKeys(keys));
  return fn(m);
}

Status ParseModel(const YamlMap& m, JobSpec::Model* s) {
  FT_RETURN_IF_ERROR(m.Get("path", &s->path, /*required=*/true));
  FT_RETURN_IF_ERROR(GetChoice(m, "quantization", &s->quantization));
  FT_RETURN_IF_ERROR(m.Get("double_quant", &s->double_quant));
  return GetChoice(m, "dtype", &s->dtype);
}

Status ParseAdapter(const YamlMap& m, JobSpec::Adapter* s) {
  FT_RETURN_IF_ERROR(GetChoice(m, "type", &s->type));
  FT_RETURN_IF_ERROR(m.Get("r", &s->r));
  FT_RETURN_IF_ERROR(Require(s->r > 0 && s->r <= 65536, m, "r", "must be an integer in [1, 65536]"));
  FT_RETURN_IF_ERROR(GetNumber(m, "alpha", 0, 1e6, true, &s->alpha, " (the LoRA scale is alpha / r)"));
  FT_RETURN_IF_ERROR(m.Get("dropout", &s->dropout));
  FT_RETURN_IF_ERROR(Require(s->dropout >= 0 && s->dropout < 1, m, "dropout", "must be in [0, 1)"));
  FT_RETURN_IF_ERROR(m.Get("rslora", &s->rslora));
  FT_RETURN_IF_ERROR(m.Get("target_modules", &s->target_modules));
  // Any family's module names (engine/model/model_config.h); whether the model has each is
  // checked when it is read.
  std::vector<std::string> known = AllModuleNames();
  known.emplace_back(kAllLinear);
  std::string listed;
  for (const std::string& name : known) listed += " " + name;
  for (const auto& t : s->target_modules) {
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      std::string hint = ClosestMatch(t, known);
      return Status::InvalidArgument(
          m.Where("target_modules") + ": adapter.target_modules: unknown module '" + t + "'" +
          (hint.empty() ? "" : " (did you mean '" + hint + "'?)") + "; known:" + listed);
    }
  }
  FT_RETURN_IF_ERROR(
      Require(!s->target_modules.empty(), m, "target_modules", "must name at least one module"));
  return m.Get("init", &s->init);
}

// A source's field mapping (data.train[i].fields): the preset `sharegpt`, or a map from the
// format's keys to the row's, with `roles` mapping the row's role values to the format's.
Status ParseFields(const YamlMap& m, JobSpec::DataSource* s) {
  if (!m.Has("fields")) return Status::OK();
  const FormatFields& format = FieldsOf(s->format);
  std::string preset;
  if (m.Get("fields", &preset).ok()) {
    FT_RETURN_IF_ERROR(Require(preset == "sharegpt" && s->format == DataFormat::kChat, m, "fields",
                               "the preset is 'sharegpt' (with format: chat), or a map such as "
                               "{messages: conversations, role: from, content: value}"));
    s->keys = {{"messages", "conversations"}, {"role", "from"}, {"content", "value"}};
    s->roles = {{"human", "user"}, {"gpt", "assistant"}, {"system", "system"}};
    return Status::OK();
  }
  FT_ASSIGN_OR_RETURN(YamlMap fields, m.Child("fields"));
  auto known = [&](std::string_view key) {
    auto in = [&](const auto& list) { return std::find(list.begin(), list.end(), key) != list.end(); };
    return !key.empty() && (in(format.keys) || (format.messages && in(kMessageKeys)));
  };
  for (auto it = fields.node().begin(); it != fields.node().end(); ++it) {
    const std::string key = it->first.Scalar();
    if (key == "roles" && format.messages) {
      FT_ASSIGN_OR_RETURN(YamlMap roles, fields.Child("roles"));
      for (auto r = roles.node().begin(); r != roles.node().end(); ++r) {
        std::string role;
        FT_RETURN_IF_ERROR(roles.Get(r->first.Scalar(), &role));
        FT_RETURN_IF_ERROR(
            Require(std::find(kMessageRoles.begin(), kMessageRoles.end(), role) != kMessageRoles.end(), roles,
                    r->first.Scalar(), "maps a role value to system, user, assistant or tool"));
        s->roles[r->first.Scalar()] = role;
      }
      continue;
    }
    std::string listed;
    for (std::string_view k : format.keys) listed += k.empty() ? "" : " " + std::string(k);
    if (format.messages) listed += " role content roles";
    FT_RETURN_IF_ERROR(Require(known(key), fields, key,
                               "is not a key of format " + std::string(EnumName(s->format)) +
                                   " (a mapping renames the format's keys:" + listed + ")"));
    std::string row_key;
    FT_RETURN_IF_ERROR(fields.Get(key, &row_key));
    FT_RETURN_IF_ERROR(Require(!row_key.empty(), fields, key, "names the row's key; it is empty"));
    s->keys[key] = row_key;
  }
  return Status::OK();
}

// One map of a data.train or data.eval list.
Status ParseSource(const YamlMap& m, DataFormat format, bool eval, JobSpec::DataSource* s) {
  FT_RETURN_IF_ERROR(
      eval ? m.CheckKnownKeys({"path", "format", "fields", "chat_template"})
           : m.CheckKnownKeys({"path", "format", "weight", "epochs", "fields", "chat_template"}));
  s->key = m.KeyPath("");
  FT_RETURN_IF_ERROR(m.Get("path", &s->path, /*required=*/true));
  FT_RETURN_IF_ERROR(Require(!s->path.empty(), m, "path", "names a JSONL file; it is empty"));
  s->format = format;
  FT_RETURN_IF_ERROR(GetChoice(m, "format", &s->format));
  FT_RETURN_IF_ERROR(Require(m.Has("weight") + m.Has("epochs") < 2, m, "epochs",
                             "a source takes weight or epochs, not both"));
  s->weight = m.Has("epochs") ? 0 : 1;
  if (m.Has("weight")) {
    FT_RETURN_IF_ERROR(
        GetNumber(m, "weight", 0, 1e6, true, &s->weight, " (shares are normalised over the list)"));
  }
  if (m.Has("epochs")) {
    FT_RETURN_IF_ERROR(GetNumber(m, "epochs", 0, 1e6, true, &s->epochs, " (passes per pass of the mixture)"));
  }
  FT_RETURN_IF_ERROR(m.Get("chat_template", &s->chat_template));
  return ParseFields(m, s);
}

// data.train or data.eval: a path, or a list of sources (at most kMaxDataSources).
constexpr size_t kMaxDataSources = 64;
Status ParseSources(const YamlMap& m, const std::string& key, DataFormat format,
                    std::vector<JobSpec::DataSource>* out) {
  if (!m.IsList(key)) {
    JobSpec::DataSource one;
    FT_RETURN_IF_ERROR(m.Get(key, &one.path, /*required=*/key == "train"));
    if (one.path.empty()) return Status::OK();
    one.format = format;
    one.key = m.KeyPath(key);
    out->push_back(std::move(one));
    return Status::OK();
  }
  FT_ASSIGN_OR_RETURN(std::vector<YamlMap> items, m.ChildList(key));
  FT_RETURN_IF_ERROR(Require(!items.empty() && items.size() <= kMaxDataSources, m, key,
                             "lists 1 to " + std::to_string(kMaxDataSources) + " sources"));
  int weighted = 0;
  for (const YamlMap& item : items) {
    out->emplace_back();
    FT_RETURN_IF_ERROR(ParseSource(item, format, key == "eval", &out->back()));
    weighted += item.Has("weight") ? 1 : 0;
  }
  const bool all_or_none = weighted == 0 || weighted == static_cast<int>(items.size());
  FT_RETURN_IF_ERROR(Require(all_or_none, m, key,
                             "give every source a weight, or none (then each counts by epochs, default 1)"));
  if (weighted == 0) {
    for (JobSpec::DataSource& s : *out) s.epochs = s.epochs > 0 ? s.epochs : 1, s.weight = 0;
  }
  return Status::OK();
}

Status ParseData(const YamlMap& m, JobSpec::Data* s) {
  FT_RETURN_IF_ERROR(GetChoice(m, "format", &s->format));
  FT_RETURN_IF_ERROR(ParseSources(m, "train", s->format, &s->train_sources));
  s->train = s->train_sources.front().path;
  FT_RETURN_IF_ERROR(m.Get("seq_len", &s->seq_len));
  FT_RETURN_IF_ERROR(Require(s->seq_len >= 2 && s->seq_len <= (int64_t{1} << 24), m, "seq_len",
                             "must be an integer in [2, 16777216]"));
  FT_RETURN_IF_ERROR(m.Get("packing", &s->packing));
  FT_RETURN_IF_ERROR(m.Get("shuffle", &s->shuffle));
  FT_RETURN_IF_ERROR(m.Get("skip_bad_lines", &s->skip_bad_lines));
  FT_RETURN_IF_ERROR(m.Get("chat_template", &s->chat_template));
  if (m.Has("chat_template_vars")) {
    FT_ASSIGN_OR_RETURN(YamlMap vars, m.Child("chat_template_vars"));
    for (auto it = vars.node().begin(); it != vars.node().end(); ++it) {
      if (!it->second.IsScalar()) {
        return Status::InvalidArgument(vars.Where(it->first.Scalar()) + ": data.chat_template_vars." +
                                       it->first.Scalar() +
                                       ": expected a scalar (string, number, true/false)");
      }
      s->chat_template_vars[it->first.Scalar()] = it->second.Scalar();
    }
  }
  FT_RETURN_IF_ERROR(
      GetInt(m, "max_prompt_len", 0, int64_t{1} << 24, &s->max_prompt_len, " (0 = seq_len / 2)"));
  FT_RETURN_IF_ERROR(ParseSources(m, "eval", s->format, &s->eval_sources));
  if (!s->eval_sources.empty()) s->eval = s->eval_sources.front().path;
  FT_RETURN_IF_ERROR(GetNumber(m, "val_fraction", 0, 0.5, false, &s->val_fraction,
                               " (the share of training rows held out for evaluation)"));
  return Require(s->val_fraction == 0 || s->eval_sources.empty(), m, "val_fraction",
                 "holds out training rows as the eval set, but data.eval names one: keep one of the two");
}

// "auto" or a positive integer.
Status GetAutoInt(const YamlMap& m, const std::string& key, int64_t* out) {
  std::string text;
  if (m.Get(key, &text).ok() && text == "auto") {
    *out = 0;
    return Status::OK();
  }
  FT_RETURN_IF_ERROR(m.Get(key, out).ok()
                         ? Status::OK()
                         : Status::InvalidArgument(m.Where(key) + ": " + m.KeyPath(key) +
                                                   ": expected 'auto' or a positive integer"));
  return Require(!m.Has(key) || (*out > 0 && *out <= (int64_t{1} << 24)), m, key,
                 "must be 'auto' or an integer in [1, 16777216]");
}

// The keys of the train section.
// clang-format off
const std::vector<std::string> kTrainKeys = {
    "max_steps", "epochs", "global_batch_size", "micro_batch_size", "gradient_accumulation",
    "lr", "lr_schedule", "warmup_steps", "weight_decay", "max_grad_norm",
    "adam_beta1", "adam_beta2", "adam_eps", "optimizer", "seed",
    "activation_checkpointing", "cpu_offload", "attention", "gradient_sum",
    "eval_every_steps", "eval_max_batches", "loss_scale_init", "loss_scale_growth_interval",
    "objective", "dpo", "early_stopping"};
// clang-format on

// train.early_stopping: {metric, patience, min_delta}; what it needs (evaluation, DPO's metrics)
// is checked with the whole job (CheckEvalDecisions).
Status ParseEarlyStopping(const YamlMap& train, JobSpec::Train::EarlyStopping* s) {
  if (!train.Has("early_stopping")) return Status::OK();
  FT_ASSIGN_OR_RETURN(YamlMap m, train.Child("early_stopping"));
  FT_RETURN_IF_ERROR(m.CheckKnownKeys({"metric", "patience", "min_delta"}));
  s->enabled = true;
  FT_RETURN_IF_ERROR(GetChoice(m, "metric", &s->metric));
  if (!m.Has("patience")) {
    return Status::InvalidArgument(m.Where() + ": train.early_stopping.patience: required: how many " +
                                   "evaluations in a row without an improvement of more than min_delta " +
                                   "end the run (e.g. patience: 3)");
  }
  FT_RETURN_IF_ERROR(GetInt(m, "patience", 1, 1'000'000, &s->patience,
                            " (evaluations in a row without an improvement of more than min_delta)"));
  return GetNumber(m, "min_delta", 0, 1e9, false, &s->min_delta,
                   " (the smallest change of the metric that counts as an improvement)");
}

Status ParseTrain(const YamlMap& m, JobSpec::Train* s) {
  FT_RETURN_IF_ERROR(GetInt(m, "max_steps", 0, kMaxSteps, &s->max_steps));
  FT_RETURN_IF_ERROR(GetInt(m, "epochs", 0, 1'000'000, &s->epochs));
  FT_RETURN_IF_ERROR(m.Get("global_batch_size", &s->global_batch_size));
  FT_RETURN_IF_ERROR(Require(s->global_batch_size > 0 && s->global_batch_size <= (int64_t{1} << 24), m,
                             "global_batch_size", "must be an integer in [1, 16777216]"));
  FT_RETURN_IF_ERROR(GetAutoInt(m, "micro_batch_size", &s->micro_batch_size));
  FT_RETURN_IF_ERROR(GetAutoInt(m, "gradient_accumulation", &s->gradient_accumulation));
  // AdamW moves every weight by about lr per step whatever the gradient's size: fine-tuning uses
  // 1e-6..1e-2, and past 1 each step moves the weights farther than their own scale.
  FT_RETURN_IF_ERROR(GetNumber(m, "lr", 0, 1, false, &s->lr, " (typical: 1e-5 to 1e-3)"));
  FT_RETURN_IF_ERROR(GetChoice(m, "lr_schedule", &s->lr_schedule));
  FT_RETURN_IF_ERROR(GetInt(m, "warmup_steps", 0, kMaxSteps, &s->warmup_steps));
  // Decoupled decay shrinks each weight by lr * weight_decay per step: at most 1 (lr <= 1) never flips it.
  FT_RETURN_IF_ERROR(GetNumber(m, "weight_decay", 0, 1, false, &s->weight_decay, " (typical: 0 to 0.1)"));
  FT_RETURN_IF_ERROR(m.Get("max_grad_norm", &s->max_grad_norm));
  FT_RETURN_IF_ERROR(m.Get("adam_beta1", &s->adam_beta1));
  FT_RETURN_IF_ERROR(m.Get("adam_beta2", &s->adam_beta2));
  // The update divides by sqrt(v) + eps: 0 would divide zero by zero.
  FT_RETURN_IF_ERROR(GetNumber(m, "adam_eps", 0, 1, true, &s->adam_eps, " (typical: 1e-8)"));
  FT_RETURN_IF_ERROR(Require(s->adam_beta1 >= 0 && s->adam_beta1 < 1, m, "adam_beta1", "must be in [0, 1)"));
  FT_RETURN_IF_ERROR(Require(s->adam_beta2 >= 0 && s->adam_beta2 < 1, m, "adam_beta2", "must be in [0, 1)"));
  FT_RETURN_IF_ERROR(GetChoice(m, "optimizer", &s->optimizer));
  FT_RETURN_IF_ERROR(m.Get("seed", &s->seed));
  FT_RETURN_IF_ERROR(GetChoice(m, "activation_checkpointing", &s->activation_checkpointing));
  FT_RETURN_IF_ERROR(m.Get("cpu_offload", &s->cpu_offload));
  FT_RETURN_IF_ERROR(GetInt(m, "eval_every_steps", 0, kMaxSteps, &s->eval_every_steps));
  FT_RETURN_IF_ERROR(GetInt(m, "eval_max_batches", 0, kMaxSteps, &s->eval_max_batches, " (0 = all)"));
  FT_RETURN_IF_ERROR(m.Get("loss_scale_init", &s->loss_scale_init));
  FT_RETURN_IF_ERROR(Require(s->loss_scale_init >= 1 && s->loss_scale_init <= 1e30, m, "loss_scale_init",
                             "must be in [1, 1e30] (65536 is torch's default)"));
  FT_RETURN_IF_ERROR(GetInt(m, "loss_scale_growth_interval", 1, kMaxSteps, &s->loss_scale_growth_interval,
                            " (good steps before the scale doubles)"));
  FT_RETURN_IF_ERROR(GetChoice(m, "gradient_sum", &s->gradient_sum));
  FT_RETURN_IF_ERROR(GetChoice(m, "objective", &s->objective));
  if (m.Has("dpo")) {
    FT_ASSIGN_OR_RETURN(YamlMap dpo, m.Child("dpo"));
    FT_RETURN_IF_ERROR(dpo.CheckKnownKeys({"beta", "loss", "label_smoothing", "rpo_alpha"}));
    FT_RETURN_IF_ERROR(GetNumber(dpo, "beta", 0, 1e3, true, &s->dpo.beta, " (TRL's default: 0.1)"));
    FT_RETURN_IF_ERROR(GetChoice(dpo, "loss", &s->dpo.loss));
    FT_RETURN_IF_ERROR(GetNumber(dpo, "label_smoothing", 0, 0.5, false, &s->dpo.label_smoothing,
                                 " (the assumed rate of flipped labels; 0 = none)"));
    FT_RETURN_IF_ERROR(Require(s->dpo.label_smoothing < 0.5, dpo, "label_smoothing", "must be below 0.5"));
    FT_RETURN_IF_ERROR(Require(s->dpo.label_smoothing == 0 || s->dpo.loss == DpoLoss::kSigmoid, dpo,
                               "label_smoothing", "applies to loss: sigmoid only"));
    FT_RETURN_IF_ERROR(GetNumber(dpo, "rpo_alpha", 0, 1e3, false, &s->dpo.rpo_alpha,
                                 " (the weight of the chosen response's token NLL; 0 = off)"));
  }
  FT_RETURN_IF_ERROR(ParseEarlyStopping(m, &s->early_stopping));
  return GetChoice(m, "attention", &s->attention);
}

// Every source of a job holds pairs (format: preference) or none does; a source's own
// chat_template needs a format that renders messages; a full fine-tune's DPO reference is stored
// per data file, for a single one.
Status CheckSourceFormats(const YamlMap& data, const JobSpec& spec) {
  const bool pairs = spec.data.format == DataFormat::kPreference;
  for (const auto* sources : {&spec.data.train_sources, &spec.data.eval_sources}) {
    for (const JobSpec::DataSource& s : *sources) {
      const std::string where =
          data.Where(s.key.substr(5, s.key.find('[') - 5)) + ": " + s.key;  // data.<key>
      if ((s.format == DataFormat::kPreference) != pairs) {
        return Status::InvalidArgument(where + ".format: " + std::string(EnumName(s.format)) +
                                       (pairs ? " in a job of preference pairs; every source holds pairs"
                                              : ": preference pairs mix with no other format; use them in "
                                                "a train.objective: dpo job of their own"));
      }
      if (!s.chat_template.empty() && !FieldsOf(s.format).messages) {
        return Status::InvalidArgument(where + ".chat_template: format " + std::string(EnumName(s.format)) +
                                       " renders no messages; remove the key");
      }
    }
  }
  if (pairs && spec.adapter.type == AdapterType::kFull &&
      (spec.data.train_sources.size() > 1 || spec.data.eval_sources.size() > 1)) {
    const char* key = spec.data.train_sources.size() > 1 ? "train" : "eval";
    return Status::InvalidArgument(data.Where(key) + ": data." + key +
                                   ": a full fine-tune's DPO reference is stored per data file; "
                                   "give one file (or use adapter.type: lora)");
  }
  return Status::OK();
}

// train.objective: dpo and data.format: preference go together (the reference: the adapter switched
// off, or a full fine-tune's stored log-probabilities); pairs are rows of their own (no packing).
Status CheckObjective(const YamlMap& root, JobSpec* spec) {
  FT_ASSIGN_OR_RETURN(YamlMap train, root.Child("train"));
  FT_ASSIGN_OR_RETURN(YamlMap data, root.Child("data"));
  const bool dpo = spec->train.objective == TrainObjective::kDpo;
  const bool pairs = spec->data.format == DataFormat::kPreference;
  FT_RETURN_IF_ERROR(CheckSourceFormats(data, *spec));
  if (dpo != pairs) {
    return Status::InvalidArgument(dpo ? train.Where("objective") +
                                             ": train.objective: dpo needs data.format: "
                                             "preference (prompt, chosen, rejected)"
                                       : data.Where("format") +
                                             ": data.format: preference holds pairs for "
                                             "train.objective: dpo; set it");
  }
  if (!dpo) {
    for (const auto& [section, key] : {std::pair{&train, "dpo"}, std::pair{&data, "max_prompt_len"}}) {
      if (section->Has(key)) {
        return Status::InvalidArgument(section->Where(key) + ": " + key +
                                       " is used by train.objective: dpo only; remove it");
      }
    }
    return Status::OK();
  }
  if (spec->data.packing && data.Has("packing")) {
    return Status::InvalidArgument(data.Where("packing") +
                                   ": data.packing: preference pairs are rows of "
                                   "their own; set packing: false");
  }
  spec->data.packing = false;
  if (spec->data.max_prompt_len == 0) spec->data.max_prompt_len = spec->data.seq_len / 2;
  if (spec->data.max_prompt_len >= spec->data.seq_len) {
    return Status::InvalidArgument(data.Where("max_prompt_len") + ": data.max_prompt_len (" +
                                   std::to_string(spec->data.max_prompt_len) + ") must be below seq_len (" +
                                   std::to_string(spec->data.seq_len) + ") to leave room for the responses");
  }
  return Status::OK();
}

// The evaluation keys need data.eval; eval_every_steps defaults to checkpoint.every_steps.
Status ResolveEval(const YamlMap& root, JobSpec* spec) {
  FT_ASSIGN_OR_RETURN(YamlMap train, root.Child("train"));
  for (const char* key : {"eval_every_steps", "eval_max_batches"}) {
    if (!JobHasEval(*spec) && train.Has(key)) {
      return Status::InvalidArgument(train.Where(key) + ": train." + key +
                                     ": needs data.eval (a held-out file in the data.format of data.train); "
                                     "set data.eval or remove the key");
    }
  }
  for (const char* key : {"loss_scale_init", "loss_scale_growth_interval"}) {
    if (spec->model.dtype != ComputeDType::kF16 && train.Has(key)) {
      return Status::InvalidArgument(
          train.Where(key) + ": train." + key +
          ": loss scaling is used only with model.dtype: fp16 (this job trains in " +
          std::string(EnumName(spec->model.dtype)) + "); remove the key or set model.dtype: fp16");
    }
  }
  if (!JobHasEval(*spec)) {
    spec->train.eval_every_steps = 0;
  } else if (!train.Has("eval_every_steps")) {
    spec->train.eval_every_steps = std::max<int64_t>(0, spec->checkpoint.every_steps);
  }
  return Status::OK();
}

// What acts on evaluations (train.early_stopping, checkpoint.keep_best, output.adapter_from: best)
// needs evaluations before the last step, and a metric the objective reports.
Status CheckEvalDecisions(const YamlMap& root, const JobSpec& spec) {
  const std::string needs = "needs an evaluation set: set data.eval (a held-out file) or data.val_fraction";
  if (spec.train.early_stopping.enabled) {
    FT_ASSIGN_OR_RETURN(YamlMap train, root.Child("train"));
    FT_RETURN_IF_ERROR(Require(JobHasEval(spec), train, "early_stopping", needs));
    FT_RETURN_IF_ERROR(Require(spec.train.eval_every_steps > 0, train, "early_stopping",
                               "evaluations come only at the last step (train.eval_every_steps: 0); "
                               "set eval_every_steps to how often the run is evaluated"));
    const EvalMetric metric = spec.train.early_stopping.metric;
    FT_ASSIGN_OR_RETURN(YamlMap stopping, train.Child("early_stopping"));
    FT_RETURN_IF_ERROR(Require(
        !EvalMetricNeedsDpo(metric) || spec.train.objective == TrainObjective::kDpo, stopping, "metric",
        std::string(EnumName(metric)) + " is reported by train.objective: dpo only; use metric: eval_loss"));
  }
  if (spec.checkpoint.keep_best) {
    FT_ASSIGN_OR_RETURN(YamlMap checkpoint, root.Child("checkpoint"));
    FT_RETURN_IF_ERROR(Require(JobHasEval(spec), checkpoint, "keep_best", needs));
  }
  if (spec.output.adapter_from == AdapterFrom::kBest && !spec.checkpoint.keep_best) {
    FT_ASSIGN_OR_RETURN(YamlMap output, root.Child("output"));
    return Require(false, output, "adapter_from",
                   "best is the checkpoint checkpoint.keep_best keeps; set checkpoint.keep_best: true");
  }
  return Status::OK();
}

Status ParseCheckpoint(const YamlMap& m, JobSpec::Checkpoint* s) {
  FT_RETURN_IF_ERROR(GetInt(m, "every_steps", 0, kMaxSteps, &s->every_steps, " (0 = not by steps)"));
  FT_RETURN_IF_ERROR(GetNumber(m, "every_minutes", 0, 1e6, false, &s->every_minutes, " (0 = not by time)"));
  FT_RETURN_IF_ERROR(GetChoice(m, "every", &s->every));
  FT_RETURN_IF_ERROR(
      GetNumber(m, "min_minutes", 0, 1e6, false, &s->min_minutes, " (0 = as often as every step)"));
  FT_RETURN_IF_ERROR(GetNumber(m, "max_minutes", 0, 1e6, true, &s->max_minutes, " (the longest interval)"));
  FT_RETURN_IF_ERROR(
      Require(s->min_minutes <= s->max_minutes, m, "min_minutes", "must not exceed checkpoint.max_minutes"));
  for (const char* key : {"every_steps", "every_minutes"}) {
    FT_RETURN_IF_ERROR(Require(s->every == CheckpointEvery::kFixed || !m.Has(key), m, key,
                               "is not used with checkpoint.every: auto; remove it, or remove every: auto"));
  }
  for (const char* key : {"min_minutes", "max_minutes"}) {
    FT_RETURN_IF_ERROR(Require(s->every == CheckpointEvery::kAuto || !m.Has(key), m, key,
                               "bounds checkpoint.every: auto only; add every: auto, or remove it"));
  }
  FT_RETURN_IF_ERROR(m.Get("async", &s->async));
  FT_RETURN_IF_ERROR(m.Get("keep_best", &s->keep_best));
  return GetInt(m, "keep", 1, 1'000'000, &s->keep, " (checkpoints kept)");
}

Status ParseResources(const YamlMap& m, JobSpec::Resources* s) {
  FT_RETURN_IF_ERROR(m.Get("gpus", &s->gpus));
  FT_RETURN_IF_ERROR(
      Require(s->gpus >= 1 && s->gpus <= 65536, m, "gpus", "must be an integer in [1, 65536]"));
  s->min_gpus = s->gpus;
  FT_RETURN_IF_ERROR(m.Get("min_gpus", &s->min_gpus));
  FT_RETURN_IF_ERROR(
      Require(s->min_gpus >= 1 && s->min_gpus <= s->gpus, m, "min_gpus",
              "must be an integer in [1, resources.gpus] (the fewest ranks an attempt may start "
              "with; leave it out for a fixed world size)"));
  FT_RETURN_IF_ERROR(GetChoice(m, "device", &s->device));
  FT_RETURN_IF_ERROR(GetInt(m, "priority", -1'000'000, 1'000'000, &s->priority, " (higher runs first)"));
  return GetInt(m, "max_failures", 0, 1000, &s->max_failures, " (failed attempts before the job fails)");
}

// Whether `world` ranks split the global batch into whole micro-batches each.
bool SplitsEvenly(const JobSpec& spec, int64_t world) {
  return world > 0 && BatchSplitUnits(spec) % world == 0;
}

Status CheckBatchPlan(const YamlMap& train, const JobSpec& spec) {
  const auto& t = spec.train;
  if (t.max_steps == 0 && t.epochs == 0) {
    return Status::InvalidArgument(train.Where() + ": train: set max_steps or epochs");
  }
  if (t.micro_batch_size > 0 && t.global_batch_size % t.micro_batch_size != 0) {
    return Status::InvalidArgument(train.Where("micro_batch_size") + ": train.micro_batch_size (" +
                                   std::to_string(t.micro_batch_size) + ") must divide global_batch_size (" +
                                   std::to_string(t.global_batch_size) + ")");
  }
  if (spec.resources.min_gpus < spec.resources.gpus) {
    if (t.gradient_accumulation > 0) {
      return Status::InvalidArgument(train.Where("gradient_accumulation") +
                                     ": train.gradient_accumulation is fixed, but resources.min_gpus (" +
                                     std::to_string(spec.resources.min_gpus) + ") < gpus (" +
                                     std::to_string(spec.resources.gpus) +
                                     ") lets the number of ranks change between attempts: set "
                                     "gradient_accumulation: auto (ftd picks it for each world size)");
    }
    bool any = false;
    for (int64_t w = spec.resources.min_gpus; w <= spec.resources.gpus && !any; ++w)
      any = SplitsEvenly(spec, w);
    if (!any) {
      return Status::InvalidArgument(train.Where("global_batch_size") + ": train.global_batch_size (" +
                                     std::to_string(t.global_batch_size) +
                                     ") cannot be split into whole micro-batches over any number of ranks in "
                                     "resources.min_gpus..gpus; choose a global_batch_size divisible by one");
    }
  }
  int64_t product = 0;  // micro x accumulation x gpus, overflow-checked
  const bool overflow = __builtin_mul_overflow(t.micro_batch_size, t.gradient_accumulation, &product) ||
                        __builtin_mul_overflow(product, spec.resources.gpus, &product);
  if (t.micro_batch_size > 0 && t.gradient_accumulation > 0 && (overflow || product != t.global_batch_size)) {
    return Status::InvalidArgument(train.Where("gradient_accumulation") + ": train: micro_batch_size (" +
                                   std::to_string(t.micro_batch_size) + ") x gradient_accumulation (" +
                                   std::to_string(t.gradient_accumulation) + ") x resources.gpus (" +
                                   std::to_string(spec.resources.gpus) + ") must equal global_batch_size (" +
                                   std::to_string(t.global_batch_size) + "); set one of them to auto");
  }
  return Status::OK();
}

// A combination of choices no trainer runs: refused at parse time, so ftctl
// and ftd refuse it at submit with the key's file:line, not a trainer at start.
struct RefusedCombination {
  bool (*refused)(const JobSpec&);
  const char* section;  // where the key the message names lives
  const char* key;
  const char* message;  // after "<file:line:col>: "
};

constexpr RefusedCombination kRefusedCombinations[] = {
    {[](const JobSpec& s) {
       return s.model.quantization == Quantization::kNf4 && s.adapter.type == AdapterType::kFull;
     },
     "model", "quantization",
     "model.quantization: nf4 freezes the base weights, so it needs adapter.type: lora (QLoRA); "
     "use quantization: none for a full fine-tune"},
    {[](const JobSpec& s) { return s.train.cpu_offload && s.adapter.type == AdapterType::kFull; }, "train",
     "cpu_offload",
     "train.cpu_offload keeps the frozen base weights in host memory, but adapter.type: full trains them; "
     "use adapter.type: lora, or cpu_offload: false"},
    {[](const JobSpec& s) {
       return s.distributed.strategy == DistributedStrategy::kFsdp && s.resources.gpus > 1 &&
              s.adapter.type == AdapterType::kFull;
     },
     "distributed", "strategy",
     "distributed.strategy: fsdp shards the frozen base weights and the optimizer of LoRA/QLoRA; "
     "a full fine-tune is not sharded yet: use strategy: ddp (or resources.gpus: 1)"},
    {[](const JobSpec& s) {
       return s.train.attention == AttentionKind::kCudnn && s.resources.device == DeviceRequest::kCpu;
     },
     "train", "attention",
     "train.attention: cudnn runs cuDNN's attention on a CUDA device, but resources.device is cpu; "
     "use attention: flash (or auto), or device: cuda"},
    {[](const JobSpec& s) {
       return s.train.attention == AttentionKind::kCudnn && s.model.dtype == ComputeDType::kF32;
     },
     "train", "attention",
     "train.attention: cudnn takes bf16 or fp16 tensors, but model.dtype is fp32; "
     "use dtype: bf16, or attention: flash"},
};

Status CheckCombinations(const YamlMap& root, const JobSpec& spec) {
  for (const RefusedCombination& c : kRefusedCombinations) {
    if (!c.refused(spec)) continue;
    StatusOr<YamlMap> section = root.Child(c.section);
    const std::string where = section.ok() ? section->Where(c.key) : root.Where();
    return Status::InvalidArgument(where + ": " + c.message);
  }
  return Status::OK();
}

// InvalidArgument: the job file `file` has `bytes`, over kMaxJobSpecBytes.
Status JobFileTooBig(const std::string& file, uint64_t bytes) {
  return Status::InvalidArgument(file + ": " + std::to_string(bytes) +
                                 " bytes; a job.yaml may have at most " +
                                 std::to_string(kMaxJobSpecBytes >> 10) +
                                 " KiB (put data in files named by data.train, not in the job)");
}

// The text of job file `file`, refused unread when it is larger than kMaxJobSpecBytes.
StatusOr<std::string> ReadJobFile(const std::string& file) {
  std::error_code ec;
  if (const uint64_t size = fs::file_size(file, ec); !ec && size > kMaxJobSpecBytes) {
    return JobFileTooBig(file, size);
  }
  return ReadFileToString(file, kMaxJobSpecBytes);
}

}  // namespace

StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& file) {
  if (yaml_text.size() > kMaxJobSpecBytes) return JobFileTooBig(file, yaml_text.size());
  FT_ASSIGN_OR_RETURN(YamlMap root, YamlMap::Parse(yaml_text, file));
  FT_RETURN_IF_ERROR(root.CheckKnownKeys(
      {"name", "model", "adapter", "data", "train", "checkpoint", "resources", "distributed", "output"}));
  JobSpec spec;
  spec.file = file;
  FT_RETURN_IF_ERROR(root.Get("name", &spec.name));
  for (const char* required : {"model", "data", "train", "output"}) {
    if (!root.Has(required)) {
      return Status::InvalidArgument(file + ": missing required section '" + required + "'");
    }
  }
  FT_RETURN_IF_ERROR(Section(root, "model", {"path", "quantization", "double_quant", "dtype"},
                             [&](const YamlMap& m) { return ParseModel(m, &spec.model); }));
  FT_RETURN_IF_ERROR(Section(root, "adapter",
                             {"type", "r", "alpha", "dropout", "rslora", "target_modules", "init"},
                             [&](const YamlMap& m) { return ParseAdapter(m, &spec.adapter); }));
  FT_RETURN_IF_ERROR(
      Section(root, "data",
              {"train", "format", "seq_len", "packing", "shuffle", "skip_bad_lines", "chat_template",
               "chat_template_vars", "eval", "max_prompt_len", "val_fraction"},
              [&](const YamlMap& m) { return ParseData(m, &spec.data); }));
  FT_RETURN_IF_ERROR(
      Section(root, "train", kTrainKeys, [&](const YamlMap& m) { return ParseTrain(m, &spec.train); }));
  FT_RETURN_IF_ERROR(Section(
      root, "checkpoint",
      {"every_steps", "every_minutes", "keep", "every", "min_minutes", "max_minutes", "async", "keep_best"},
      [&](const YamlMap& m) { return ParseCheckpoint(m, &spec.checkpoint); }));
  FT_RETURN_IF_ERROR(Section(root, "resources", {"gpus", "min_gpus", "device", "priority", "max_failures"},
                             [&](const YamlMap& m) { return ParseResources(m, &spec.resources); }));
  FT_RETURN_IF_ERROR(Section(root, "distributed", {"strategy"}, [&](const YamlMap& m) {
    return GetChoice(m, "strategy", &spec.distributed.strategy);
  }));
  FT_RETURN_IF_ERROR(Section(root, "output", {"dir", "merge", "adapter_from"}, [&](const YamlMap& m) {
    FT_RETURN_IF_ERROR(m.Get("dir", &spec.output.dir, /*required=*/true));
    FT_RETURN_IF_ERROR(GetChoice(m, "adapter_from", &spec.output.adapter_from));
    return m.Get("merge", &spec.output.merge);
  }));
  FT_RETURN_IF_ERROR(CheckBatchPlan(*root.Child("train"), spec));
  FT_RETURN_IF_ERROR(ResolveEval(root, &spec));
  FT_RETURN_IF_ERROR(CheckObjective(root, &spec));
  FT_RETURN_IF_ERROR(CheckEvalDecisions(root, spec));
  FT_RETURN_IF_ERROR(CheckCombinations(root, spec));
  const std::string base = fs::path(file).parent_path().string();
  spec.model.path = Resolve(base, spec.model.path);
  spec.adapter.init = Resolve(base, spec.adapter.init);
  for (auto* sources : {&spec.data.train_sources, &spec.data.eval_sources}) {
    for (JobSpec::DataSource& source : *sources) {
      source.path = Resolve(base, source.path);
      source.chat_template = Resolve(base, source.chat_template);
    }
  }
  spec.data.train = Resolve(base, spec.data.train);
  spec.data.eval = Resolve(base, spec.data.eval);
  spec.data.chat_template = Resolve(base, spec.data.chat_template);
  spec.output.dir = Resolve(base, spec.output.dir);
  return spec;
}

int64_t BatchSplitUnits(const JobSpec& spec) {
  const JobSpec::Train& t = spec.train;
  return t.micro_batch_size > 0 ? t.global_batch_size / t.micro_batch_size : t.global_batch_size;
}

bool AllowedWorld(const JobSpec& spec, int64_t world) {
  const JobSpec::Resources& r = spec.resources;
  return world == r.gpus || (world >= r.min_gpus && world < r.gpus && SplitsEvenly(spec, world));
}

bool JobHasEval(const JobSpec& spec) { return !spec.data.eval_sources.empty() || spec.data.val_fraction > 0; }

bool ExactGradientSum(const JobSpec& spec) {
  if (spec.train.gradient_sum == GradientSum::kAuto) return spec.adapter.type != AdapterType::kFull;
  return spec.train.gradient_sum == GradientSum::kExact;
}

std::vector<std::pair<std::string, std::string>> JobInputPaths(const JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> paths = {{"model.path", spec.model.path}};
  for (const auto* sources : {&spec.data.train_sources, &spec.data.eval_sources}) {
    for (const JobSpec::DataSource& source : *sources) {
      const bool listed = source.key.back() == ']';  // "data.train[1]": a map with its own keys
      paths.emplace_back(listed ? source.key + ".path" : source.key, source.path);
      if (listed) paths.emplace_back(source.key + ".chat_template", source.chat_template);
    }
  }
  paths.emplace_back("data.chat_template", spec.data.chat_template);
  paths.emplace_back("adapter.init", spec.adapter.init);
  return paths;
}

StatusOr<JobSpec> LoadJobSpec(const std::string& file) {
  FT_ASSIGN_OR_RETURN(std::string text, ReadJobFile(file));
  return ParseJobSpec(text, file);
}

namespace {

// Sets `value` at `path` ("data.train", "data.train[2].path") in `root`.
void SetYamlPath(YAML::Node root, const std::string& path, const std::string& value) {
  YAML::Node node = root;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const size_t bracket = part.find('[');
    if (bracket != std::string::npos) {
      const size_t index = std::stoul(part.substr(bracket + 1));
      node.reset(node[part.substr(0, bracket)][index]);  // (Node's = would assign the value)
    } else if (dot == std::string::npos) {
      node[part] = value;
      return;
    } else {
      node.reset(node[part]);
    }
    start = dot + 1;
  }
}

// The override an error of the merged job comes from ("" when none): its
// message, after "file:line:col: ", starts with the override's key path
// ("train.lr: ...") or names the key as unknown in the override's section.
std::string OverrideBehind(const std::string& rest, const std::vector<std::string>& overrides) {
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {  // the last one applied wins
    const std::string key = it->substr(0, it->find('='));
    if (rest.rfind(key + ":", 0) == 0 || rest.rfind(key + " ", 0) == 0) return *it;
    // Any key on the override's path may be the unknown one ("trian" of trian.lr).
    std::string section = "the top level";
    size_t start = 0;
    while (true) {
      const size_t dot = key.find('.', start);
      const std::string segment =
          key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (rest.rfind("unknown key '" + segment + "' in " + section, 0) == 0) return *it;
      if (dot == std::string::npos) break;
      section = key.substr(0, dot);
      start = dot + 1;
    }
  }
  return "";
}

}  // namespace

StatusOr<MergedJob> ParseJobWithOverrides(const std::string& yaml_text, const std::string& file,
                                          const std::vector<std::string>& overrides) {
  if (overrides.empty()) {
    FT_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(yaml_text, file));
    return MergedJob{std::move(spec), yaml_text};
  }
  FT_ASSIGN_OR_RETURN(std::string merged, ApplyYamlOverrides(yaml_text, file, overrides));
  StatusOr<JobSpec> spec = ParseJobSpec(merged, file);
  if (spec.ok()) return MergedJob{std::move(*spec), std::move(merged)};
  // The message without its "file:line:col: " (lines differ between the file and the merged text).
  auto rest_of = [&](const std::string& message) {
    if (message.rfind(file + ":", 0) != 0) return message;
    const size_t after = message.find(": ", file.size());
    return after == std::string::npos ? message : message.substr(after + 2);
  };
  const std::string rest = rest_of(spec.status().message());
  // The file's own error, with its own line, when it has one the overrides do not fix.
  StatusOr<JobSpec> own = ParseJobSpec(yaml_text, file);
  if (!own.ok() && rest_of(own.status().message()) == rest) return own.status();
  const std::string behind = OverrideBehind(rest, overrides);
  if (!behind.empty()) return Status::InvalidArgument("--set " + behind + ": " + rest);
  return Status::InvalidArgument(file + " with the --set overrides: " + rest);
}

StatusOr<MergedJob> LoadJobWithOverrides(const std::string& file, const std::vector<std::string>& overrides) {
  FT_ASSIGN_OR_RETURN(std::string text, ReadJobFile(file));
  return ParseJobWithOverrides(text, file, overrides);
}

std::string ResolvedJobYaml(const JobSpec& spec, const std::string& yaml, int64_t micro_batch,
                            int64_t accumulation, int64_t world) {
  YAML::Node root = YAML::Load(yaml);
  for (const auto& [key, path] : JobInputPaths(spec)) {  // every "a.b" or "a.b[i].c", absolute
    if (path.empty()) continue;
    SetYamlPath(root, key, path);
  }
  root["output"]["dir"] = spec.output.dir;
  root["train"]["micro_batch_size"] = micro_batch;
  root["train"]["gradient_accumulation"] = accumulation;
  root["resources"]["gpus"] = world;
  root["resources"].remove("min_gpus");
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ft
