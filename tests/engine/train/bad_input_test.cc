// Bad inputs users hit: each gives a clear error naming the file and the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/data/dataset.h"
#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"
#include "engine/io/safetensors.h"
#include "engine/job/job_spec.h"
#include "engine/job/planner.h"
#include "engine/train/trainer.h"
#include "tests/support/temp_dir.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_support::FreshDir;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A valid tiny model directory.
std::string MakeModelDir(const std::string& name) {
  std::string dir = FreshDir(name);
  Model model(*PresetModelConfig("tiny-llama"), {});
  RandomInitModel(&model, 7);
  EXPECT_TRUE(SaveHfModel(dir, model, DType::kF32).ok());
  return dir;
}

TEST(HfModelBadInputTest, MissingConfigKeyNamesFileAndKey) {
  auto c = ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "intermediate_size": 8,
                             "num_hidden_layers": 1, "num_attention_heads": 2})",
                         "/m/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "/m/config.json: missing required key 'hidden_size'");
}

TEST(HfModelBadInputTest, WrongTypeAndUnsupportedValuesAreNamed) {
  auto c = ParseHfConfig(R"({"model_type": "llama", "vocab_size": "many"})", "c.json");
  EXPECT_THAT(c.status().message(), HasSubstr("c.json: key 'vocab_size' has the wrong type"));
  auto gpt = ParseHfConfig(R"({"model_type": "gpt2"})", "c.json");
  EXPECT_THAT(gpt.status().message(), HasSubstr("model_type 'gpt2' is not supported"));
  auto heads =
      ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 12, "intermediate_size": 8,
                                 "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 2})",
                    "c.json");
  EXPECT_THAT(heads.status().message(), HasSubstr("must be a multiple of num_key_value_heads"));
  auto rope =
      ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
                                "num_hidden_layers": 1, "num_attention_heads": 2,
                                "rope_scaling": {"rope_type": "yarn", "factor": 4}})",
                    "c.json");
  EXPECT_THAT(rope.status().message(), HasSubstr("rope_scaling type 'yarn' is not supported"));
}

TEST(HfModelBadInputTest, ShapeMismatchNamesTensorAndShapes) {
  std::string dir = MakeModelDir("shape");
  // Claim a larger hidden size than the weights have.
  ModelConfig c = *ReadHfConfig(dir);
  c.intermediate_size = 256;
  WriteFile(dir + "/config.json", HfConfigJson(c));
  Model model(*ReadHfConfig(dir), {});
  Status s = LoadHfWeights(dir, &model);
  ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(s.message(),
              HasSubstr(dir + "/model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has "
                              "shape [128, 64] but the model config needs [256, 64]"));
}

TEST(HfModelBadInputTest, WrongDtypeIsRejected) {
  std::string dir = FreshDir("dtype");
  std::vector<int32_t> ints(4, 1);
  // Hand-write a safetensors file with an I32 tensor.
  std::string header = R"({"w":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}})";
  while (header.size() % 8) header += ' ';
  uint64_t n = header.size();
  std::ofstream out(dir + "/x.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out.write(reinterpret_cast<const char*>(ints.data()), 16);
  out.close();
  auto f = SafetensorsFile::Open(dir + "/x.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::vector<float> buf(4);
  Status s = (*f)->ReadFloat("w", {4}, buf.data());
  EXPECT_THAT(s.message(),
              HasSubstr("x.safetensors: tensor 'w' has dtype I32; expected F32, F16, BF16 or F64"));
}

TEST(HfModelBadInputTest, TruncatedSafetensorsIsCorruption) {
  std::string dir = MakeModelDir("trunc");
  const std::string file = dir + "/model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  auto f = SafetensorsFile::Open(file);
  ASSERT_TRUE(f.status().IsCorruption()) << f.status().ToString();
  EXPECT_THAT(f.status().message(), HasSubstr(file));
  EXPECT_THAT(f.status().message(), HasSubstr("truncated file?"));
  fs::resize_file(file, 5);
  EXPECT_THAT(SafetensorsFile::Open(file).status().message(),
              HasSubstr("too short for a safetensors header"));
  WriteFile(file, std::string("\xff\xff\xff\xff\x00\x00\x00\x00garbage", 15));
  EXPECT_TRUE(SafetensorsFile::Open(file).status().IsCorruption());
}

TEST(HfModelBadInputTest, MissingTensorAndMissingFile) {
  std::string dir = MakeModelDir("missing");
  ModelConfig c = *ReadHfConfig(dir);
  c.num_layers = 3;  // weights hold two layers
  Model model(c, {});
  Status s = LoadHfWeights(dir, &model);
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_THAT(s.message(), HasSubstr("tensor 'model.layers.2.input_layernorm.weight' is missing"));
  EXPECT_TRUE(ReadHfConfig(dir + "/nope").status().IsNotFound());
}

TEST(HfModelBadInputTest, RoundTripPreservesWeightsBitForBit) {
  std::string dir = MakeModelDir("roundtrip");
  Model a(*ReadHfConfig(dir), {});
  ASSERT_TRUE(LoadHfWeights(dir, &a).ok());
  std::string dir2 = FreshDir("roundtrip2");
  ASSERT_TRUE(SaveHfModel(dir2, a, DType::kF32).ok());
  Model b(*ReadHfConfig(dir2), {});
  ASSERT_TRUE(LoadHfWeights(dir2, &b).ok());
  auto wa = a.NamedWeights(), wb = b.NamedWeights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(a.Download(wa[i].data, wa[i].numel()), b.Download(wb[i].data, wb[i].numel())) << wa[i].name;
  }
}

constexpr const char* kJob = R"(model:
  path: m
data:
  train: d.jsonl
  format: tokens
train:
  max_steps: 3
  global_batch_size: 4
output:
  dir: out
)";

TEST(JobSpecBadInputTest, ValidJobResolvesPathsAgainstItsFolder) {
  auto spec = ParseJobSpec(kJob, "/jobs/a/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->model.path, "/jobs/a/m");
  EXPECT_EQ(spec->data.train, "/jobs/a/d.jsonl");
  EXPECT_EQ(spec->output.dir, "/jobs/a/out");
  EXPECT_EQ(spec->train.micro_batch_size, 0);  // auto
}

// A seq_len past the model's max_position_embeddings trained positions the model never saw; it is
// refused where ftd's Submit and ft-train check the model (CheckJobTakesModel), unless the
// config.json does not say (a family that omits the key: nothing to check against).
TEST(JobSpecBadInputTest, ASeqLenPastMaxPositionEmbeddingsIsRefusedUnlessTheConfigOmitsIt) {
  const std::string config =
      R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2)";
  auto job = [](int64_t seq_len) {
    return ParseJobWithOverrides(kJob, "/jobs/a/job.yaml", {"data.seq_len=" + std::to_string(seq_len)})->spec;
  };
  const ModelConfig with_key =
      *ParseHfConfig(config + R"(, "max_position_embeddings": 512})", "/jobs/a/m/config.json");
  Status refused = CheckJobTakesModel(job(1024), with_key);
  ASSERT_TRUE(refused.IsInvalidArgument()) << refused.ToString();
  EXPECT_EQ(refused.message(),
            "/jobs/a/job.yaml: data.seq_len 1024 exceeds model.path /jobs/a/m (config.json) "
            "max_position_embeddings 512, the longest sequence the model takes; use seq_len <= 512 or a "
            "model with a longer context");
  EXPECT_TRUE(CheckJobTakesModel(job(512), with_key).ok());
  const ModelConfig without_key = *ParseHfConfig(config + "}", "/jobs/a/m/config.json");
  EXPECT_TRUE(CheckJobTakesModel(job(1024), without_key).ok()) << "nothing to check against";
  // ft-train refuses it before loading the model (tiny-llama's context is 512).
  const std::string dir = testing_support::FreshDir("long-seq");
  Model model(*PresetModelConfig("tiny-llama"), {});
  RandomInitModel(&model, 7);
  ASSERT_TRUE(SaveHfModel(dir + "/m", model, DType::kF32).ok());
  auto trainer = Trainer::Create(ParseJobWithOverrides(kJob, dir + "/job.yaml", {"data.seq_len=1024"})->spec);
  ASSERT_TRUE(trainer.status().IsInvalidArgument()) << trainer.status().ToString();
  EXPECT_THAT(trainer.status().message(), HasSubstr("data.seq_len 1024 exceeds model.path " + dir + "/m"));
}

TEST(JobSpecBadInputTest, UnknownKeysGetLineAndSuggestion) {
  auto spec = ParseJobSpec(std::string(kJob) + "  learning_rat: 3\n", "job.yaml");
  // "learning_rat" lands under output (the last mapping).
  EXPECT_THAT(spec.status().message(), HasSubstr("job.yaml:11:3: unknown key 'learning_rat' in output"));
  auto top = ParseJobSpec(std::string(kJob) + "trian:\n  lr: 1\n", "job.yaml");
  EXPECT_THAT(top.status().message(),
              HasSubstr("job.yaml:11:1: unknown key 'trian' in the top level (did you mean 'train'?)"));
  auto sec = ParseJobSpec(R"(model: {path: m}
data: {train: d}
train: {max_steps: 1, global_batch_size: 4, max_step: 3}
output: {dir: o}
)",
                          "job.yaml");
  EXPECT_THAT(sec.status().message(),
              HasSubstr("unknown key 'max_step' in train (did you mean 'max_steps'?)"));
}

TEST(JobSpecBadInputTest, AnOversizedJobIsRefusedBeforeParsing) {
  const std::string huge = std::string(kJob) + "# " + std::string(kMaxJobSpecBytes, 'x') + "\n";
  auto spec = ParseJobSpec(huge, "job.yaml");
  EXPECT_THAT(spec.status().message(), HasSubstr("job.yaml: "));
  EXPECT_THAT(spec.status().message(), HasSubstr("at most 256 KiB"));
  EXPECT_TRUE(ParseJobSpec(std::string(kJob) + "# " + std::string(1000, 'x') + "\n", "job.yaml").ok());
}

TEST(JobSpecBadInputTest, WrongTypesAndValuesNameTheKey) {
  auto lr = ParseJobSpec(R"(model: {path: m}
data: {train: d}
train: {max_steps: 1, global_batch_size: 4, lr: fast}
output: {dir: o}
)",
                         "job.yaml");
  EXPECT_THAT(lr.status().message(), HasSubstr("job.yaml:3:49: train.lr: expected a number, got 'fast'"));
  auto dtype = ParseJobSpec(R"(model: {path: m, dtype: bf17}
data: {train: d}
train: {max_steps: 1, global_batch_size: 4}
output: {dir: o}
)",
                            "job.yaml");
  EXPECT_THAT(dtype.status().message(), HasSubstr("model.dtype: 'bf17' is not one of fp32 | bf16 | fp16"));
  auto job = [](const std::string& dtype, const std::string& train_extra) {
    return ParseJobSpec("model: {path: m, dtype: " + dtype +
                            "}\ndata: {train: d}\ntrain: {max_steps: 1, global_batch_size: 4, " +
                            train_extra + "}\noutput: {dir: o}\n",
                        "job.yaml");
  };
  EXPECT_THAT(
      job("bf16", "loss_scale_init: 1024").status().message(),
      HasSubstr("train.loss_scale_init: loss scaling is used only with model.dtype: fp16 (this job trains in "
                "bf16)"));
  EXPECT_THAT(job("fp16", "loss_scale_init: 0.5").status().message(),
              HasSubstr("train.loss_scale_init: must be in [1, 1e30]"));
  auto fp16 = job("fp16", "loss_scale_init: 1024, loss_scale_growth_interval: 100");
  ASSERT_TRUE(fp16.ok()) << fp16.status().ToString();
  EXPECT_EQ(fp16->train.loss_scale_init, 1024);
  EXPECT_EQ(fp16->train.loss_scale_growth_interval, 100);
  auto mods = ParseJobSpec(R"(model: {path: m}
adapter: {target_modules: [q_prj]}
data: {train: d}
train: {max_steps: 1, global_batch_size: 4}
output: {dir: o}
)",
                           "job.yaml");
  EXPECT_THAT(mods.status().message(), HasSubstr("unknown module 'q_prj' (did you mean 'q_proj'?)"));
  auto plan = ParseJobSpec(R"(model: {path: m}
data: {train: d}
train: {max_steps: 1, global_batch_size: 8, micro_batch_size: 2, gradient_accumulation: 3}
output: {dir: o}
)",
                           "job.yaml");
  EXPECT_THAT(plan.status().message(), HasSubstr("must equal global_batch_size (8)"));
  auto missing = ParseJobSpec("model: {path: m}\ndata: {train: d}\ntrain: {max_steps: 1}\n", "job.yaml");
  EXPECT_THAT(missing.status().message(), HasSubstr("job.yaml: missing required section 'output'"));
  auto no_path = ParseJobSpec(
      "model: {dtype: fp32}\ndata: {train: d}\ntrain: {max_steps: 1}\noutput: {dir: o}\n", "job.yaml");
  EXPECT_THAT(no_path.status().message(), HasSubstr("missing required key 'model.path'"));
}

StatusOr<std::unique_ptr<Dataset>> OpenTokens(const std::string& path, bool skip_bad_lines = false) {
  return Dataset::Open(
      {path, 32, false, skip_bad_lines, "", false},
      [](const std::string& line, const std::string& where) { return ParseTokensRecord(line, where, 256); });
}

TEST(TokenDataBadInputTest, BadLinesNameFileAndLine) {
  std::string dir = FreshDir("data");
  WriteFile(dir + "/d.jsonl", "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [1, 999]}\n");
  EXPECT_THAT(OpenTokens(dir + "/d.jsonl").status().message(),
              HasSubstr(dir + "/d.jsonl:2: 'input_ids'[1] = 999 is outside [0, 256)"));
  WriteFile(dir + "/e.jsonl", "{\"input_ids\": [1, 2]}\n\n{\"text\": \"hi\"}\n");
  EXPECT_THAT(OpenTokens(dir + "/e.jsonl").status().message(), HasSubstr("e.jsonl:3: missing 'input_ids'"));
  WriteFile(dir + "/f.jsonl", "{\"input_ids\": [1, 2}\n");
  EXPECT_THAT(OpenTokens(dir + "/f.jsonl").status().message(), HasSubstr("f.jsonl:1: not a JSON object"));
  EXPECT_THAT(OpenTokens(dir + "/f.jsonl").status().message(), HasSubstr("data.skip_bad_lines"));
  EXPECT_TRUE(OpenTokens(dir + "/missing.jsonl").status().IsNotFound());
}

TEST(TokenDataBadInputTest, SkipBadLinesCountsThemAndKeepsTheRest) {
  std::string dir = FreshDir("skip");
  WriteFile(dir + "/d.jsonl",
            "{\"input_ids\": [1, 2, 3]}\nnot json\n{\"input_ids\": [4, 5]}\n{\"input_ids\": [7]}\n");
  auto ds = OpenTokens(dir + "/d.jsonl", true);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ((*ds)->examples(), 2);
  EXPECT_EQ((*ds)->skipped_lines(), 2);  // bad JSON and a 1-token example
  auto mb = (*ds)->MakeBatch(1, 1, false, 0);
  ASSERT_TRUE(mb.ok());
  EXPECT_EQ(mb->ids, (std::vector<int32_t>{4, 5}));
}

TEST(PeftBadInputTest, MismatchedAdapterConfigIsNamed) {
  std::string dir = FreshDir("peft");
  WriteFile(dir + "/adapter_config.json",
            R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})");
  Model model(*PresetModelConfig("tiny-llama"), {});
  LoraSpec spec;
  spec.r = 4;
  spec.alpha = 8;
  spec.target_modules = {"q_proj"};
  ASSERT_TRUE(model.EnableLora(spec).ok());
  Status s = LoadPeftAdapter(dir, &model);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/adapter_config.json: r is 8 but the job's adapter.r is 4"));
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// --set overrides (ftctl submit, ft-train run/plan): merged into the job and
// validated like the file, errors naming the override.
const char kOverridableJob[] =
    "model: {path: m}\n"
    "adapter: {type: lora, r: 8, alpha: 16}\n"
    "data: {train: d.jsonl, format: tokens, seq_len: 64}\n"
    "train:\n  max_steps: 10\n  global_batch_size: 8\n  lr: 1.0e-3\n"
    "output: {dir: out}\n";

TEST(JobOverridesTest, NestedKeysListsAndNewSectionsMergeAndValidate) {
  auto job =
      ParseJobWithOverrides(kOverridableJob, "/j/job.yaml",
                            {"train.lr=1e-4", "data.seq_len=1024", "adapter.target_modules=[q_proj, v_proj]",
                             "checkpoint.every_steps=5", "train.lr=2e-4"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_DOUBLE_EQ(job->spec.train.lr, 2e-4) << "the last override of a key wins";
  EXPECT_EQ(job->spec.data.seq_len, 1024);
  EXPECT_EQ(job->spec.adapter.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(job->spec.checkpoint.every_steps, 5) << "a section the file lacks is created";
  EXPECT_EQ(job->spec.train.max_steps, 10) << "keys not overridden are kept";
  EXPECT_EQ(job->spec.model.path, "/j/m") << "paths still resolve against the job file";
  // The merged text is what ftd stores: it parses to the same job by itself.
  auto again = ParseJobSpec(job->yaml, "/j/job.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << job->yaml;
  EXPECT_DOUBLE_EQ(again->train.lr, 2e-4);
  EXPECT_EQ(again->adapter.target_modules, job->spec.adapter.target_modules);
  // Without overrides the text is kept byte for byte.
  EXPECT_EQ(ParseJobWithOverrides(kOverridableJob, "/j/job.yaml", {})->yaml, kOverridableJob);
}

TEST(JobOverridesTest, ErrorsNameTheOverride) {
  auto message = [](std::vector<std::string> overrides) {
    auto job = ParseJobWithOverrides(kOverridableJob, "/j/job.yaml", overrides);
    return job.ok() ? std::string("OK") : job.status().message();
  };
  EXPECT_EQ(message({"train.lr=fast"}), "--set train.lr=fast: train.lr: expected a number, got 'fast'");
  EXPECT_EQ(message({"train.lrr=1e-4"}),
            "--set train.lrr=1e-4: unknown key 'lrr' in train (did you mean 'lr'?)");
  EXPECT_THAT(message({"data.seq_len=1"}),
              HasSubstr("--set data.seq_len=1: data.seq_len: must be an integer in"));
  EXPECT_THAT(message({"trian.lr=1"}), HasSubstr("--set trian.lr=1: unknown key 'trian' in the top level"));
  EXPECT_THAT(message({"train.lr"}), HasSubstr("--set train.lr: expected KEY=VALUE"));
  EXPECT_THAT(message({"train..lr=1"}), HasSubstr("--set train..lr=1: empty key"));
  EXPECT_THAT(message({"train.lr.x=1"}), HasSubstr("--set train.lr.x=1: 'train.lr' is not a mapping"));
  EXPECT_THAT(message({"train.lr=[1"}), HasSubstr("--set train.lr=[1: the value is not YAML"));
  // An error of the file itself keeps the file's line, whatever the overrides.
  auto bad =
      ParseJobWithOverrides(std::string(kOverridableJob) + "bogus: 1\n", "/j/job.yaml", {"train.lr=1e-4"});
  EXPECT_THAT(bad.status().message(), HasSubstr("/j/job.yaml:9:1: unknown key 'bogus'"));
}

}  // namespace
}  // namespace ft
