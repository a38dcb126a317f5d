// Values that would corrupt a result silently are refused or stop the run:
// non-finite and out-of-range numbers in job.yaml and config.json, a repeated
// job key, a run whose loss, gradients or weights stop being finite, and a
// data file that changed under the same size (the job's math hash).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/file_util.h"
#include "engine/io/hf_model.h"
#include "engine/job/job_spec.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A valid job with `section`'s `key: value` set (the section's line is line 4).
StatusOr<JobSpec> JobWith(const std::string& section, const std::string& key, const std::string& value) {
  const bool steps = key == "max_steps" || key == "epochs";
  std::map<std::string, std::string> sections = {{"adapter", ""},
                                                 {"train", steps ? "global_batch_size: 8" : "max_steps: 4"},
                                                 {"checkpoint", ""},
                                                 {"resources", ""}};
  std::string& s = sections.at(section);
  s += (s.empty() ? "" : ", ") + key + ": " + value;
  std::string yaml = "model: {path: m}\ndata: {train: d.jsonl}\noutput: {dir: o}\n";
  for (const auto& [name, keys] : sections) yaml += name + ": {" + keys + "}\n";
  return ParseJobSpec(yaml, "/j/job.yaml");
}

TEST(JobSpecValuesTest, NonFiniteNumbersAreRefusedWithFileLineAndKey) {
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"train", "lr"},         {"train", "weight_decay"},      {"train", "adam_eps"},
      {"train", "adam_beta1"}, {"train", "max_grad_norm"},     {"adapter", "alpha"},
      {"adapter", "dropout"},  {"checkpoint", "every_minutes"}};
  for (const auto& [section, key] : keys) {
    for (const char* value : {".inf", "-.inf", ".nan"}) {
      auto spec = JobWith(section, key, value);
      ASSERT_FALSE(spec.ok()) << section << "." << key << ": " << value << " was accepted";
      EXPECT_THAT(spec.status().message(), HasSubstr("/j/job.yaml:"));
      EXPECT_THAT(spec.status().message(), HasSubstr(section + "." + key + ": '" + value +
                                                     "' is not a finite number; write a finite"));
    }
  }
}

TEST(JobSpecValuesTest, OutOfRangeValuesNameTheKeyAndTheRange) {
  struct Case {
    std::string section, key, value, message;
  };
  const std::vector<Case> cases = {
      {"train", "lr", "1e308", "train.lr: must be a number in [0, 1] (typical: 1e-5 to 1e-3), got 1e+308"},
      {"train", "lr", "2", "train.lr: must be a number in [0, 1]"},
      {"train", "warmup_steps", "9223372036854775807",
       "train.warmup_steps: must be an integer in [0, 1000000000], got 9223372036854775807"},
      {"train", "max_steps", "9223372036854775807", "train.max_steps: must be an integer in [0, 1000000000]"},
      {"train", "epochs", "4611686018427387904", "train.epochs: must be an integer in [0, 1000000]"},
      {"train", "weight_decay", "-0.1", "train.weight_decay: must be a number in [0, 1]"},
      {"train", "adam_eps", "0", "train.adam_eps: must be a number in (0, 1]"},
      {"train", "loss_scale_growth_interval", "0",
       "train.loss_scale_growth_interval: must be an integer in [1,"},
      {"adapter", "alpha", "0", "adapter.alpha: must be a number in (0, 1e+06]"},
      {"checkpoint", "every_steps", "-5",
       "checkpoint.every_steps: must be an integer in [0, 1000000000] (0 = not by steps), got -5"},
      {"checkpoint", "every_minutes", "-1", "checkpoint.every_minutes: must be a number in [0, 1e+06]"},
      {"checkpoint", "keep", "0", "checkpoint.keep: must be an integer in [1, 1000000]"},
      {"resources", "max_failures", "-1",
       "resources.max_failures: must be an integer in [0, 1000] (failed attempts before the job fails), got "
       "-1"},
      {"resources", "priority", "9223372036854775807",
       "resources.priority: must be an integer in [-1000000,"},
  };
  for (const Case& c : cases) {
    auto spec = JobWith(c.section, c.key, c.value);
    ASSERT_FALSE(spec.ok()) << c.section << "." << c.key << ": " << c.value << " was accepted";
    EXPECT_THAT(spec.status().message(), HasSubstr(c.message));
  }
  // The bounds themselves and the defaults are fine.
  for (const Case& c : std::vector<Case>{{"train", "lr", "1", ""},
                                         {"train", "warmup_steps", "1000000000", ""},
                                         {"checkpoint", "every_steps", "0", ""},
                                         {"resources", "max_failures", "0", ""}}) {
    auto spec = JobWith(c.section, c.key, c.value);
    EXPECT_TRUE(spec.ok()) << c.section << "." << c.key << ": " << c.value << ": "
                           << spec.status().ToString();
  }
}

TEST(JobSpecValuesTest, ARepeatedKeyIsAnErrorNamingBothLines) {
  auto spec = ParseJobSpec(
      "model: {path: m}\ndata: {train: d.jsonl}\noutput: {dir: o}\n"
      "train:\n  max_steps: 4\n  lr: 1.0e-4\n  lr: 1.0\n",
      "/j/job.yaml");
  ASSERT_FALSE(spec.ok()) << "the second lr was silently dropped";
  EXPECT_THAT(spec.status().message(),
              HasSubstr("/j/job.yaml:7:3: train.lr: duplicate key (first at /j/job.yaml:6:3)"));
  auto section = ParseJobSpec(
      "model: {path: m}\ndata: {train: d.jsonl}\noutput: {dir: o}\ntrain: {max_steps: 4}\n"
      "output: {dir: elsewhere}\n",
      "/j/job.yaml");
  ASSERT_FALSE(section.ok());
  EXPECT_THAT(section.status().message(), HasSubstr("/j/job.yaml:5:1: output: duplicate key (first at"));
  // Through an override the file's own line is named.
  auto merged = ParseJobWithOverrides(
      "model: {path: m}\ndata: {train: d.jsonl}\noutput: {dir: o}\ntrain:\n  max_steps: 4\n  max_steps: 8\n",
      "/j/job.yaml", {"train.lr=1e-4"});
  ASSERT_FALSE(merged.ok());
  EXPECT_THAT(merged.status().message(), HasSubstr("/j/job.yaml:6:3: train.max_steps: duplicate key"));
}

const char* kConfig =
    R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, %s})";

StatusOr<ModelConfig> ConfigWith(const std::string& extra) {
  char text[1024];
  std::snprintf(text, sizeof(text), kConfig, extra.c_str());
  return ParseHfConfig(text, "/m/config.json");
}

TEST(HfConfigValuesTest, OutOfRangeNumbersAreRefusedNamingTheKey) {
  // JSON has no NaN or infinity and the parser refuses 1e999: what gets through is finite, so the
  // rule here is the range (which also keeps every norm and RoPE frequency finite).
  ASSERT_TRUE(ConfigWith(R"("rms_norm_eps": 1e-5)").ok());
  EXPECT_FALSE(ConfigWith(R"("rms_norm_eps": 1e999)").ok());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("rms_norm_eps": 1e300)", "'rms_norm_eps' must be a finite number in (0, 1], got 1e+300"},
      {R"("rope_theta": 1e300)", "'rope_theta' must be a finite number in (0, 1e+12], got 1e+300"},
      {R"("rope_theta": -5)", "'rope_theta' must be a finite number"},
      {R"("rope_scaling": {"type": "linear", "factor": 1e300})",
       "'rope_scaling.factor' must be a finite number"},
      {R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 1e300,
          "original_max_position_embeddings": 8192})",
       "'rope_scaling.high_freq_factor' must be a finite number in (0, 1e+06], got 1e+300"},
      {R"("sliding_window": -4, "use_sliding_window": true)", "'sliding_window' must be a finite number"},
  };
  for (const auto& [extra, message] : cases) {
    auto c = ConfigWith(extra);
    ASSERT_FALSE(c.ok()) << extra << " was accepted";
    EXPECT_THAT(c.status().message(), HasSubstr("/m/config.json: " + message)) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr("correct the model's config.json"));
  }
}

// A random tiny Llama shared by the tests of this file (made once).
const std::string& ModelDir() {
  static const std::string dir = [] {
    std::string d = (fs::path(testing::TempDir()) / "value-checks-model").lexically_normal().string();
    fs::remove_all(d);
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, 7);
    EXPECT_TRUE(SaveHfModel(d, model, DType::kF32).ok());
    return d;
  }();
  return dir;
}

// A fresh folder with the tiny example's data and a 6-step LoRA job checkpointing every 2 steps.
JobSpec DivergingJob(const std::string& name) {
  const std::string dir =
      (fs::path(testing::TempDir()) / ("value-checks-" + name)).lexically_normal().string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", dir + "/data.jsonl");
  std::ostringstream yaml;
  yaml << "model: {path: " << ModelDir() << ", dtype: fp32}\n"
       << "adapter: {type: lora, r: 4, alpha: 8}\n"
       << "data: {train: data.jsonl, format: tokens, seq_len: 64, packing: false}\n"
       << "train: {max_steps: 6, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-2}\n"
       << "checkpoint: {every_steps: 2, every_minutes: 0, keep: 5}\n"
       << "output: {dir: out}\n";
  auto spec = ParseJobSpec(yaml.str(), dir + "/job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

// Overwrites the first value of the first trainable tensor's weights (or gradient) with NaN.
void Poison(Model& model, bool gradient) {
  TrainableParam p = model.TrainableParams().front();
  std::vector<float> values = model.Download(gradient ? p.grad : p.data, p.numel);
  values[0] = std::numeric_limits<float>::quiet_NaN();
  model.Upload(gradient ? p.grad : p.data, values.data(), p.numel);
}

// What a diverged run must leave: no adapter, no completion record, no checkpoint past `last_good`.
void ExpectNothingWrittenAfter(const JobSpec& spec, int64_t last_good) {
  EXPECT_FALSE(fs::exists(spec.output.dir + "/adapter")) << "an adapter of a diverged run was written";
  EXPECT_FALSE(fs::exists(spec.output.dir + "/COMPLETE.json"));
  const auto checkpoints = ListCheckpoints(spec.output.dir + "/checkpoints");
  ASSERT_FALSE(checkpoints.empty());
  EXPECT_EQ(checkpoints.front().step, last_good) << "the newest checkpoint";
}

TEST(DivergenceTest, ANonFiniteGradientStopsTheRunNamingTheStep) {
  const JobSpec spec = DivergingJob("gradient");
  auto trainer = Trainer::Create(spec);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  Trainer& tr = **trainer;
  tr.set_grad_hook([&](int64_t step) {
    if (step == 4) Poison(tr.model(), /*gradient=*/true);
  });
  auto outcome = tr.Run();
  ASSERT_FALSE(outcome.ok()) << "a run with a NaN gradient finished";
  EXPECT_EQ(outcome.status().code(), Status::Code::kFailedPrecondition) << outcome.status().ToString();
  EXPECT_THAT(outcome.status().message(), HasSubstr(spec.file + ": step 4: the gradient norm is "));
  EXPECT_THAT(outcome.status().message(), HasSubstr("training diverged and stops (no adapter is written)"));
  EXPECT_EQ(tr.steps_done(), 3) << "step 4 was not applied";
  trainer->reset();  // waits for the checkpoint write in flight
  ExpectNothingWrittenAfter(spec, 2);
}

TEST(DivergenceTest, NonFiniteWeightsAreNeverCheckpointedOrWritten) {
  // The last step's weights turn NaN after its gradients were computed: the final checkpoint refuses them.
  const JobSpec spec = DivergingJob("weights");
  auto trainer = Trainer::Create(spec);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  Trainer& tr = **trainer;
  tr.set_grad_hook([&](int64_t step) {
    if (step == 6) Poison(tr.model(), /*gradient=*/false);
  });
  auto outcome = tr.Run();
  ASSERT_FALSE(outcome.ok()) << "a run with NaN weights finished";
  EXPECT_THAT(outcome.status().message(), HasSubstr(spec.file + ": step 6: a value of weight '"));
  EXPECT_THAT(outcome.status().message(), HasSubstr("training diverged"));
  trainer->reset();  // waits for the checkpoint write in flight
  ExpectNothingWrittenAfter(spec, 4);
}

TEST(JobHashTest, ADataFileRewrittenWithTheSameSizeChangesTheHash) {
  // Was: the hash took data.train's size, so ftd called a resubmitted job on new data "already
  // complete" and returned the stale adapter.
  const std::string dir = (fs::path(testing::TempDir()) / "value-checks-hash").lexically_normal().string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string data = dir + "/data.jsonl";
  std::ofstream(data) << "{\"input_ids\": [1, 2, 3]}\n";
  auto spec = ParseJobSpec(
      "model: {path: m}\ndata: {train: data.jsonl, format: tokens}\n"
      "train: {max_steps: 1}\noutput: {dir: o}\n",
      dir + "/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::string before = JobHash(*spec);
  const auto size = fs::file_size(data);
  std::ofstream(data, std::ios::trunc) << "{\"input_ids\": [1, 2, 4]}\n";  // same inode, same size
  ASSERT_EQ(fs::file_size(data), size);
  EXPECT_NE(JobHash(*spec), before) << "same size, other content, same hash";
  // What ftd computes from the file equals what the trainer computes from its Dataset's SHA-256.
  auto sha = Sha256File(data);
  ASSERT_TRUE(sha.ok());
  EXPECT_EQ(JobHash(*spec), JobHash(*spec, *sha));
  EXPECT_EQ(JobMathKeys(*spec).at("data.train (SHA-256)"), *sha);
}

}  // namespace
}  // namespace ft
