// job.yaml's named choices (engine/job/job_choices.h): every table drives the
// parser and the hash, docs/JOB_YAML.md lists every value, and choices a
// trainer cannot combine are refused at parse time with file:line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/job/job_hash.h"
#include "engine/job/job_spec.h"

namespace ft {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A valid job: `model` and `train` lines go under their sections, `adapter`
// lines make an adapter section, `rest` follows the required sections.
std::string Job(const std::string& model = "", const std::string& adapter = "", const std::string& train = "",
                const std::string& rest = "") {
  return "model:\n  path: /m\n" + model + (adapter.empty() ? "" : "adapter:\n" + adapter) +
         "data:\n  train: /d.jsonl\ntrain:\n  max_steps: 10\n" + train + "output:\n  dir: /o\n" + rest;
}

template <typename E>
std::vector<std::string> Names() {
  std::vector<std::string> out;
  for (const EnumEntry<E>& e : EnumTraits<E>::kTable) out.emplace_back(e.name);
  return out;
}

// Every job.yaml choice key with its table's names.
std::vector<std::pair<std::string, std::vector<std::string>>> ChoiceKeys() {
  return {{"model.quantization", Names<Quantization>()},
          {"model.dtype", Names<ComputeDType>()},
          {"adapter.type", Names<AdapterType>()},
          {"data.format", Names<DataFormat>()},
          {"train.lr_schedule", Names<LrSchedule>()},
          {"train.optimizer", Names<OptimizerKind>()},
          {"train.activation_checkpointing", Names<ActivationCheckpointing>()},
          {"train.attention", Names<AttentionKind>()},
          {"train.gradient_sum", Names<GradientSum>()},
          {"train.objective", Names<TrainObjective>()},
          {"train.dpo.loss", Names<DpoLoss>()},
          {"train.early_stopping.metric", Names<EvalMetric>()},
          {"output.adapter_from", Names<AdapterFrom>()},
          {"checkpoint.every", Names<CheckpointEvery>()},
          {"resources.device", Names<DeviceRequest>()},
          {"distributed.strategy", Names<DistributedStrategy>()}};
}

TEST(JobChoicesTest, DocsListEveryValueOfEveryChoice) {
  std::ifstream in(std::string(FT_SOURCE_DIR) + "/docs/JOB_YAML.md");
  ASSERT_TRUE(in) << "docs/JOB_YAML.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (const auto& [key, names] : ChoiceKeys()) {
    const size_t start = doc.find("### " + key + "\n");
    ASSERT_NE(start, std::string::npos) << "docs/JOB_YAML.md has no '### " << key << "' section";
    const size_t end = doc.find("\n#", start + 4);
    std::istringstream lines(doc.substr(start, end == std::string::npos ? std::string::npos : end - start));
    std::set<std::string> listed;  // the values of the section's rows "| `name` | meaning |"
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("| `", 0) == 0) listed.insert(line.substr(3, line.find('`', 3) - 3));
    }
    EXPECT_EQ(listed, std::set<std::string>(names.begin(), names.end())) << key;
  }
}

// The other keys a choice needs to parse: DPO and preference pairs go together.
std::vector<std::string> WithCompanions(const std::string& key, const std::string& name) {
  std::vector<std::string> set = {key + "=" + name};
  const bool dpo = key == "train.dpo.loss" || (key == "train.objective" && name == "dpo") ||
                   (key == "data.format" && name == "preference") ||
                   (key == "train.early_stopping.metric" && name != "eval_loss");
  if (dpo && key != "train.objective") set.push_back("train.objective=dpo");
  if (dpo && key != "data.format") set.push_back("data.format=preference");
  // Early stopping and the best checkpoint act on evaluations.
  if (key == "train.early_stopping.metric") set.push_back("train.early_stopping.patience=2");
  if (key == "output.adapter_from") set.push_back("checkpoint.keep_best=true");
  if (key == "train.early_stopping.metric" || key == "output.adapter_from")
    set.push_back("data.eval=/e.jsonl");
  return set;
}

TEST(JobChoicesTest, EveryNameOfEveryTableParsesAndOthersAreRefused) {
  for (const auto& [key, names] : ChoiceKeys()) {
    for (const std::string& name : names) {
      StatusOr<MergedJob> job = ParseJobWithOverrides(Job(), "job.yaml", WithCompanions(key, name));
      EXPECT_TRUE(job.ok()) << key << "=" << name << ": " << job.status().ToString();
    }
    StatusOr<MergedJob> bad = ParseJobWithOverrides(Job(), "job.yaml", {key + "=bogus"});
    ASSERT_FALSE(bad.ok()) << key;
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : " | ") + n;
    EXPECT_THAT(bad.status().message(), HasSubstr(key + ": 'bogus' is not one of " + list));
  }
}

// The math hash names each choice as job.yaml spells it, as it did when the
// choices were strings: the hash of every existing checkpoint stays the same.
TEST(JobChoicesTest, HashKeysSpellChoicesAsTheFileDoes) {
  StatusOr<JobSpec> spec = ParseJobSpec(
      Job("  quantization: nf4\n  dtype: fp16\n", "", "  lr_schedule: linear\n  attention: naive\n"),
      "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  spec->data.format = DataFormat::kChat;
  const std::map<std::string, std::string> keys = JobMathKeys(*spec, "sha");
  EXPECT_EQ(keys.at("model.quantization"), "nf4");
  EXPECT_EQ(keys.at("model.dtype"), "fp16");
  EXPECT_EQ(keys.at("adapter.type"), "lora");
  EXPECT_EQ(keys.at("data.format"), "chat");
  EXPECT_EQ(keys.at("train.lr_schedule"), "linear");
  EXPECT_EQ(keys.at("train.attention"), "naive");
  EXPECT_EQ(keys.at("model.double_quant"), "true");    // only with nf4
  EXPECT_EQ(keys.count("train.loss_scale_init"), 1u);  // only with fp16
  EXPECT_EQ(keys.count("adapter.r"), 1u);              // only with lora
}

// Combinations Trainer::Create refused only when a trainer started (ftctl
// and ftd accepted them): refused by the parser, at the key's file:line:col.
TEST(JobChoicesTest, FullFineTuneCombinationsAreRefusedWithFileLine) {
  struct Case {
    std::string yaml;
    std::string where;  // file:line:col of the key's value
    std::string message;
  };
  const std::vector<Case> cases = {
      {Job("  quantization: nf4\n", "  type: full\n"), "job.yaml:3:17",
       "model.quantization: nf4 freezes the base weights, so it needs adapter.type: lora (QLoRA)"},
      {Job("", "  type: full\n", "  cpu_offload: true\n"), "job.yaml:9:16",
       "train.cpu_offload keeps the frozen base weights in host memory, but adapter.type: full trains them"},
      {Job("", "  type: full\n", "", "resources:\n  gpus: 2\ndistributed:\n  strategy: fsdp\n"),
       "job.yaml:14:13",
       "distributed.strategy: fsdp shards the frozen base weights and the optimizer of LoRA"},
      {Job("", "", "  attention: cudnn\n", "resources:\n  device: cpu\n"), "job.yaml:7:14",
       "train.attention: cudnn runs cuDNN's attention on a CUDA device, but resources.device is cpu; "
       "use attention: flash (or auto), or device: cuda"},
      {Job("  dtype: fp32\n", "", "  attention: cudnn\n"), "job.yaml:8:14",
       "train.attention: cudnn takes bf16 or fp16 tensors, but model.dtype is fp32"},
  };
  for (const Case& c : cases) {
    StatusOr<JobSpec> spec = ParseJobSpec(c.yaml, "job.yaml");
    ASSERT_FALSE(spec.ok()) << c.yaml;
    EXPECT_TRUE(spec.status().IsInvalidArgument());
    EXPECT_THAT(spec.status().message(), StartsWith(c.where + ": ")) << c.yaml;
    EXPECT_THAT(spec.status().message(), HasSubstr(c.message));
  }
  // Each choice apart is accepted: fsdp with one rank, cpu_offload with LoRA, a full fine-tune alone.
  EXPECT_TRUE(
      ParseJobSpec(Job("", "", "  attention: cudnn\n", "resources:\n  device: cuda\n"), "job.yaml").ok());
  EXPECT_TRUE(
      ParseJobSpec(Job("", "  type: full\n", "", "distributed:\n  strategy: fsdp\n"), "job.yaml").ok());
  EXPECT_TRUE(ParseJobSpec(Job("", "", "  cpu_offload: true\n", "resources:\n  gpus: 2\n"), "job.yaml").ok());
  EXPECT_TRUE(ParseJobSpec(Job("  quantization: nf4\n"), "job.yaml").ok());
}

// resources.min_gpus makes a job elastic: any world in [min_gpus, gpus] that splits the global
// batch into whole micro-batches per rank is allowed (gpus itself always is); a fixed
// gradient_accumulation or a batch no allowed world splits is refused at file:line; the YAML a
// worker runs has gpus = its world and no min_gpus.
TEST(JobChoicesTest, MinGpusMakesAJobElasticOverTheWorldsThatSplitItsBatch) {
  auto rigid = ParseJobSpec(Job("", "", "", "resources:\n  gpus: 4\n"), "job.yaml");
  ASSERT_TRUE(rigid.ok()) << rigid.status().ToString();
  EXPECT_EQ(rigid->resources.min_gpus, 4) << "min_gpus defaults to gpus";
  EXPECT_TRUE(AllowedWorld(*rigid, 4));
  EXPECT_FALSE(AllowedWorld(*rigid, 2));
  const std::string elastic_yaml = Job("", "", "  global_batch_size: 8\n  micro_batch_size: 2\n",
                                       "resources:\n  gpus: 4\n  min_gpus: 1\n");
  auto elastic = ParseJobSpec(elastic_yaml, "job.yaml");
  ASSERT_TRUE(elastic.ok()) << elastic.status().ToString();
  EXPECT_EQ(elastic->resources.min_gpus, 1);
  std::vector<int64_t> allowed;
  for (int64_t w = 0; w <= 5; ++w) {
    if (AllowedWorld(*elastic, w)) allowed.push_back(w);
  }
  EXPECT_EQ(allowed, (std::vector<int64_t>{1, 2, 4})) << "4 micro-batches: 3 ranks cannot split them";
  const std::string resolved = ResolvedJobYaml(*elastic, elastic_yaml, 2, 2, 2);
  auto attempt = ParseJobSpec(resolved, "job.yaml");
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString() << "\n" << resolved;
  EXPECT_EQ(attempt->resources.gpus, 2);
  EXPECT_EQ(attempt->resources.min_gpus, 2);
  EXPECT_EQ(attempt->train.gradient_accumulation, 2);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {Job("", "", "", "resources:\n  gpus: 2\n  min_gpus: 3\n"),
       "job.yaml:11:13: resources.min_gpus: must be an integer in [1, resources.gpus]"},
      {Job("", "", "  global_batch_size: 8\n  gradient_accumulation: 2\n",
           "resources:\n  gpus: 4\n  min_gpus: 2\n"),
       "job.yaml:8:26: train.gradient_accumulation is fixed, but resources.min_gpus (2) < gpus (4)"},
      {Job("", "", "  global_batch_size: 5\n", "resources:\n  gpus: 4\n  min_gpus: 2\n"),
       "train.global_batch_size (5) cannot be split into whole micro-batches over any number of ranks"},
  };
  for (const auto& [yaml, message] : bad) {
    auto refused = ParseJobSpec(yaml, "job.yaml");
    ASSERT_FALSE(refused.ok()) << yaml;
    EXPECT_THAT(refused.status().message(), HasSubstr(message));
  }
}

// checkpoint.every auto takes its bounds and refuses the fixed keys beside it (and the bounds
// without it), naming file:line and the fix.
TEST(JobChoicesTest, CheckpointEveryAutoAndItsBounds) {
  auto spec = ParseJobSpec(
      Job("", "", "", "checkpoint:\n  every: auto\n  min_minutes: 0.5\n  max_minutes: 30\n"), "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->checkpoint.every, CheckpointEvery::kAuto);
  EXPECT_EQ(spec->checkpoint.min_minutes, 0.5);
  EXPECT_EQ(spec->checkpoint.max_minutes, 30);
  EXPECT_TRUE(spec->checkpoint.async) << "checkpoints are written in the background by default";
  auto sync = ParseJobSpec(Job("", "", "", "checkpoint:\n  async: false\n"), "job.yaml");
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_FALSE(sync->checkpoint.async);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"checkpoint:\n  every: auto\n  every_steps: 10\n",
       "job.yaml:11:16: checkpoint.every_steps: is not used with checkpoint.every: auto"},
      {"checkpoint:\n  min_minutes: 1\n",
       "job.yaml:10:16: checkpoint.min_minutes: bounds checkpoint.every: auto only"},
      {"checkpoint:\n  every: auto\n  min_minutes: 5\n  max_minutes: 1\n",
       "job.yaml:11:16: checkpoint.min_minutes: must not exceed checkpoint.max_minutes"},
      {"checkpoint:\n  every: sometimes\n", "'sometimes' is not one of fixed | auto"},
      {"checkpoint:\n  async: sometimes\n", "checkpoint.async"},
  };
  for (const auto& [rest, message] : bad) {
    auto refused = ParseJobSpec(Job("", "", "", rest), "job.yaml");
    ASSERT_FALSE(refused.ok()) << rest;
    EXPECT_THAT(refused.status().message(), HasSubstr(message));
  }
}

// train.objective: dpo and data.format: preference go together, with a LoRA adapter; the DPO keys
// are checked and refused outside DPO; max_prompt_len defaults to seq_len / 2 and packing is off.
TEST(JobChoicesTest, DpoNeedsPreferencePairsALoraAdapterAndSaneKeys) {
  const std::string dpo = "  objective: dpo\n";
  const std::string pairs = "data:\n  train: /d.jsonl\n  format: preference\n  seq_len: 64\n";
  auto job = [](const std::string& data, const std::string& train, const std::string& adapter = "") {
    return "model:\n  path: /m\n" + adapter + data + "train:\n  max_steps: 10\n" + train +
           "output:\n  dir: /o\n";
  };
  auto parsed = ParseJobSpec(job(pairs, dpo + "  dpo: {beta: 0.5, loss: ipo}\n"), "j.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->train.dpo.beta, 0.5);
  EXPECT_EQ(parsed->train.dpo.loss, DpoLoss::kIpo);
  EXPECT_EQ(parsed->data.max_prompt_len, 32);
  EXPECT_FALSE(parsed->data.packing);
  // rpo_alpha is math (a resume with another one is refused); left at 0 it leaves the hash as before.
  auto rpo = ParseJobSpec(job(pairs, dpo + "  dpo: {beta: 0.5, loss: ipo, rpo_alpha: 0.5}\n"), "j.yaml");
  ASSERT_TRUE(rpo.ok()) << rpo.status().ToString();
  EXPECT_EQ(rpo->train.dpo.rpo_alpha, 0.5);
  EXPECT_EQ(JobMathKeys(*rpo).at("train.dpo.rpo_alpha"), JobMathKeys(*rpo).at("train.dpo.beta"));
  EXPECT_EQ(JobMathKeys(*parsed).count("train.dpo.rpo_alpha"), 0u);
  // A full fine-tune takes its reference from stored log-probabilities (engine/train/reference_logprobs.h).
  EXPECT_TRUE(ParseJobSpec(job(pairs, dpo, "adapter:\n  type: full\n"), "j.yaml").ok());
  const std::string tokens = "data:\n  train: /d.jsonl\n";
  struct Bad {
    std::string text, message;
  } bad[] = {
      {job(tokens, dpo), "train.objective: dpo needs data.format: preference"},
      {job(pairs, ""), "data.format: preference holds pairs for train.objective: dpo"},
      {job(pairs, dpo + "  dpo: {loss: ipo, label_smoothing: 0.1}\n"),
       "train.dpo.label_smoothing: applies to loss: sigmoid only"},
      {job(pairs, dpo + "  dpo: {beta: 0}\n"), "train.dpo.beta"},
      {job(pairs, dpo + "  dpo: {rpo_alpha: -1}\n"), "train.dpo.rpo_alpha"},
      {job(pairs + "  max_prompt_len: 64\n", dpo), "data.max_prompt_len (64) must be below seq_len (64)"},
      {job(pairs + "  packing: true\n", dpo), "data.packing: preference pairs are rows of their own"},
      {job(tokens, "  dpo: {beta: 0.1}\n"), "dpo is used by train.objective: dpo only"},
  };
  for (const Bad& b : bad) {
    auto r = ParseJobSpec(b.text, "j.yaml");
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_THAT(r.status().message(), HasSubstr(b.message)) << b.text;
  }
}

// train.early_stopping, checkpoint.keep_best and output.adapter_from: read as written; what they
// need (an evaluation set, evaluations before the last step, a metric the objective reports,
// keep_best for adapter_from: best) is refused at the key's file:line:col with the fix; early
// stopping joins the math hash only when set, the other two never.
TEST(JobChoicesTest, EarlyStoppingAndTheBestCheckpointNeedEvaluationsAndSayWhy) {
  const std::string eval = "data:\n  train: /d.jsonl\n  eval: /e.jsonl\n";
  auto job = [](const std::string& data, const std::string& train, const std::string& rest = "") {
    return "model:\n  path: /m\n" + data + "train:\n  max_steps: 10\n" + train + "output:\n  dir: /o\n" +
           rest;
  };
  const std::string stopping = "  early_stopping:\n    patience: 2\n    min_delta: 0.01\n";
  auto parsed =
      ParseJobSpec(job(eval, stopping, "  adapter_from: best\ncheckpoint:\n  keep_best: true\n"), "j.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->train.early_stopping.enabled);
  EXPECT_EQ(parsed->train.early_stopping.metric, EvalMetric::kEvalLoss);
  EXPECT_EQ(parsed->train.early_stopping.patience, 2);
  EXPECT_EQ(parsed->train.early_stopping.min_delta, 0.01);
  EXPECT_TRUE(parsed->checkpoint.keep_best);
  EXPECT_EQ(parsed->output.adapter_from, AdapterFrom::kBest);
  const std::map<std::string, std::string> hashed = JobMathKeys(*parsed, "sha");
  EXPECT_EQ(hashed.at("train.early_stopping.patience"), "2");
  EXPECT_EQ(hashed.at("train.early_stopping.metric"), "eval_loss");
  auto plain =
      ParseJobSpec(job(eval, "", "  adapter_from: best\ncheckpoint:\n  keep_best: true\n"), "j.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  auto without = ParseJobSpec(job(eval, ""), "j.yaml");
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_EQ(JobHash(*plain, "sha"), JobHash(*without, "sha")) << "keep_best and adapter_from change no byte";
  const std::string dpo_eval = "data:\n  train: /d.jsonl\n  eval: /e.jsonl\n  format: preference\n";
  EXPECT_TRUE(ParseJobSpec(job(dpo_eval,
                               "  objective: dpo\n  early_stopping: {metric: eval_rewards/margins, "
                               "patience: 1}\n"),
                           "j.yaml")
                  .ok());
  const std::string no_eval = "data:\n  train: /d.jsonl\n";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {job(no_eval, stopping),
       "j.yaml:8:5: train.early_stopping: needs an evaluation set: set data.eval (a held-out file) or "
       "data.val_fraction"},
      {job(eval, "  eval_every_steps: 0\n" + stopping),
       "j.yaml:10:5: train.early_stopping: evaluations come only at the last step (train.eval_every_steps: "
       "0)"},
      {job(eval, "  early_stopping: {min_delta: 0.1}\n"),
       "j.yaml:8:19: train.early_stopping.patience: required"},
      {job(eval, "  early_stopping: {patience: 0}\n"),
       "train.early_stopping.patience: must be an integer in [1, 1000000]"},
      {job(eval, "  early_stopping: {patience: 2, min_delta: -1}\n"),
       "train.early_stopping.min_delta: must be a number in [0, 1e+09]"},
      {job(eval, "  early_stopping: {patience: 2, paitence: 3}\n"), "did you mean 'patience'"},
      {job(eval, "  early_stopping: {metric: eval_rewards/accuracies, patience: 2}\n"),
       "j.yaml:8:28: train.early_stopping.metric: eval_rewards/accuracies is reported by train.objective: "
       "dpo "
       "only; use metric: eval_loss"},
      {job(eval, "  early_stopping: {metric: eval_accuracy, patience: 2}\n"),
       "train.early_stopping.metric: 'eval_accuracy' is not one of eval_loss | eval_rewards/accuracies"},
      {job(no_eval, "", "checkpoint:\n  keep_best: true\n"),
       "j.yaml:10:14: checkpoint.keep_best: needs an evaluation set"},
      {job(eval, "", "  adapter_from: best\n"),
       "j.yaml:10:17: output.adapter_from: best is the checkpoint checkpoint.keep_best keeps; set "
       "checkpoint.keep_best: true"},
      {job(eval, "", "  adapter_from: first\n"), "output.adapter_from: 'first' is not one of last | best"},
  };
  for (const auto& [yaml, message] : bad) {
    auto refused = ParseJobSpec(yaml, "j.yaml");
    ASSERT_FALSE(refused.ok()) << yaml;
    EXPECT_THAT(refused.status().message(), HasSubstr(message)) << yaml;
  }
}

}  // namespace
}  // namespace ft
