// ft-train as a user runs it: make-model, run a job, then check what it wrote
// (metrics.jsonl, a PEFT adapter, merged weights) and how it fails on bad input.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/data/dataset.h"
#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"
#include "engine/io/safetensors.h"
#include "engine/model/model_config.h"
#include "tests/support/ft_train.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

struct CliResult {
  int exit_code = -1;
  std::string err;  // with stdout too, for FtTrainOutput
};

// Runs ft-train with the space-separated `args`; stderr lands in <dir>/stderr.txt.
CliResult FtTrain(const std::string& args, const std::string& dir) {
  std::ofstream(dir + "/stderr.txt", std::ios::trunc).flush();
  std::vector<std::string> argv;
  std::istringstream in(args);
  for (std::string a; in >> a;) argv.push_back(a);
  const int code = testing_support::WaitExit(testing_support::Spawn(dir, argv));
  return {code, testing_support::Slurp(dir + "/stderr.txt")};
}

// As FtTrain, with stdout in the log too (for commands that print results: plan).
CliResult FtTrainOutput(const std::string& args, const std::string& dir) {
  std::vector<std::string> argv = {FT_TRAIN_BIN};
  std::istringstream in(args);
  for (std::string a; in >> a;) argv.push_back(a);
  const std::string log = dir + "/output.txt";
  const int code = testing_support::Spawn(argv, {.log = log}).Wait();
  return {code, testing_support::Slurp(log)};
}

class FtTrainCliTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(testing::TempDir()) / "ft-train-cli").lexically_normal().string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", dir_ + "/data.jsonl");
  }
  void WriteJob(const std::string& extra_train = "") {
    std::ofstream(dir_ + "/job.yaml")
        << "model: {path: model, dtype: fp32}\n"
           "adapter: {type: lora, r: 8, alpha: 16}\n"
           "data: {train: data.jsonl, format: tokens, seq_len: 64, packing: false}\n"
           "train:\n  max_steps: 30\n  global_batch_size: 8\n  lr: 1.0e-2\n"
           "  warmup_steps: 3\n"
        << extra_train << "output: {dir: out, merge: true}\n";
  }
  // Logits of out/merged vs the base model (loaded with `base_options`) plus
  // out/adapter, on the first two sequences of data.jsonl: they must agree to
  // 1e-5 of the largest logit.
  void ExpectMergedEqualsBasePlusAdapter(const ModelOptions& base_options, const char* what) {
    const ModelConfig mc = *ReadHfConfig(dir_ + "/model");
    auto data = Dataset::Open({dir_ + "/data.jsonl", 64, false, false, "", false},
                              [&](const std::string& line, const std::string& where) {
                                return ParseTokensRecord(line, where, mc.vocab_size);
                              });
    ASSERT_TRUE(data.ok());
    auto batch = (*data)->MakeBatch(0, 2, false, 0);
    ASSERT_TRUE(batch.ok());
    Model base(mc, base_options);
    ASSERT_TRUE(LoadHfWeights(dir_ + "/model", &base).ok());
    auto spec = ReadPeftAdapterConfig(dir_ + "/out/adapter");
    ASSERT_TRUE(spec.ok());
    ASSERT_TRUE(base.EnableLora(*spec).ok());
    ASSERT_TRUE(LoadPeftAdapter(dir_ + "/out/adapter", &base).ok());
    Model merged(*ReadHfConfig(dir_ + "/out/merged"), {});
    ASSERT_TRUE(LoadHfWeights(dir_ + "/out/merged", &merged).ok());
    std::vector<float> want, got;
    base.Forward(*batch, &want);
    merged.Forward(*batch, &got);
    ASSERT_EQ(got.size(), want.size());
    double maxdiff = 0, maxref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      maxdiff = std::max(maxdiff, static_cast<double>(std::fabs(got[i] - want[i])));
      maxref = std::max(maxref, static_cast<double>(std::fabs(want[i])));
    }
    std::printf("%s: maxdiff %.3e (max |logit| %.3f)\n", what, maxdiff, maxref);
    EXPECT_LE(maxdiff, 1e-5 * maxref);
  }
  std::string dir_;
};

TEST_F(FtTrainCliTest, TrainsWithFallingLossAndWritesPeftAdapterAndMergedModel) {
  CliResult make = FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_);
  ASSERT_EQ(make.exit_code, 0) << make.err;
  WriteJob();
  CliResult run = FtTrain("run " + dir_ + "/job.yaml", dir_);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("step 30/30  loss"));

  // metrics.jsonl: one object per optimizer step with the promised fields.
  std::ifstream metrics(dir_ + "/out/metrics.jsonl");
  std::vector<nlohmann::json> steps;
  std::vector<nlohmann::json> events;
  for (std::string line; std::getline(metrics, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    (j.contains("event") ? events : steps).push_back(j);
  }
  ASSERT_EQ(steps.size(), 30u);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["event"], "checkpoint");
  EXPECT_EQ(events[0]["reason"], "final");
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "peak_bytes"}) {
      EXPECT_TRUE(steps[i].contains(key)) << key;
    }
    EXPECT_GT(steps[i]["peak_bytes"].get<int64_t>(), 0);
    // tokens_seen: the run's target tokens so far, this step's included.
    const int64_t before = i ? steps[i - 1]["tokens_seen"].get<int64_t>() : 0;
    EXPECT_EQ(steps[i]["tokens_seen"].get<int64_t>(), before + steps[i]["tokens"].get<int64_t>()) << i;
  }
  EXPECT_EQ(steps[0]["lr"].get<double>(), 0.0) << "HF warmup: update 0 uses lr * 0";
  const double first = steps[0]["loss"].get<double>(), last = steps.back()["loss"].get<double>();
  std::printf("loss %.4f -> %.4f\n", first, last);
  EXPECT_LT(last, 0.5 * first) << "loss did not fall";

  // The adapter: PEFT's config and key layout.
  std::ifstream cfg_in(dir_ + "/out/adapter/adapter_config.json");
  nlohmann::json cfg = nlohmann::json::parse(cfg_in);
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
  EXPECT_EQ(cfg["r"], 8);
  EXPECT_EQ(cfg["lora_alpha"], 16.0);
  EXPECT_EQ(cfg["use_rslora"], false);
  EXPECT_EQ(cfg["bias"], "none");
  EXPECT_EQ(cfg["target_modules"].size(), 7u);  // all-linear, resolved to the model's names
  auto adapter = SafetensorsFile::Open(dir_ + "/out/adapter/adapter_model.safetensors");
  ASSERT_TRUE(adapter.ok());
  ModelConfig mc = *ReadHfConfig(dir_ + "/model");
  EXPECT_EQ((*adapter)->tensors().size(), static_cast<size_t>(mc.num_layers * 7 * 2));
  const TensorInfo* qa = (*adapter)->Find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  const TensorInfo* db = (*adapter)->Find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  ASSERT_NE(qa, nullptr);
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(qa->shape, (std::vector<int64_t>{8, mc.hidden_size}));
  EXPECT_EQ(db->shape, (std::vector<int64_t>{mc.hidden_size, 8}));
  EXPECT_EQ(qa->dtype, DType::kF32);

  // Merged weights reload and give the same logits as base + adapter.
  ExpectMergedEqualsBasePlusAdapter({}, "merged vs base+adapter logits");
}

TEST_F(FtTrainCliTest, QloraMergeWritesTheDequantizedBasePlusAdapter) {
  // merge: true on an NF4 model used to crash writing merged/ (its linears had no float buffer).
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  std::ofstream(dir_ + "/job.yaml")
      << "model: {path: model, dtype: fp32, quantization: nf4}\n"
         "adapter: {type: lora, r: 8, alpha: 16}\n"
         "data: {train: data.jsonl, format: tokens, seq_len: 64, packing: false}\n"
         "train: {max_steps: 6, global_batch_size: 8, lr: 1.0e-2}\n"
         "output: {dir: out, merge: true}\n";
  CliResult run = FtTrain("run " + dir_ + "/job.yaml", dir_);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // The reference: the NF4 base (what the adapter trained on) with the adapter.
  ModelOptions nf4;
  nf4.nf4 = true;
  ExpectMergedEqualsBasePlusAdapter(nf4, "QLoRA merged vs NF4 base+adapter logits");
}

// Each family with a layout of its own (Phi-3's fused projections, Gemma 2's soft-caps and
// alternating windows): trained with the default target_modules (all-linear), its PEFT adapter lists the
// family's modules, and the merged model is that family's config.json and tensor names (fused
// tensors kept fused) and gives base + adapter's logits.
TEST_F(FtTrainCliTest, EachFamilysMergeKeepsItsOwnLayoutAndEqualsBasePlusAdapter) {
  for (const std::string preset : {"tiny-phi3", "tiny-gemma2"}) {
    SCOPED_TRACE(preset);
    fs::remove_all(dir_ + "/model");
    fs::remove_all(dir_ + "/out");
    ASSERT_EQ(FtTrain("make-model --preset " + preset + " --out " + dir_ + "/model", dir_).exit_code, 0);
    std::ofstream(dir_ + "/job.yaml")
        << "model: {path: model, dtype: fp32}\n"
           "adapter: {type: lora, r: 8, alpha: 16}\n"
           "data: {train: data.jsonl, format: tokens, seq_len: 64, packing: false}\n"
           "train: {max_steps: 4, global_batch_size: 8, lr: 1.0e-2}\n"
           "output: {dir: out, merge: true}\n";
    CliResult run = FtTrain("run " + dir_ + "/job.yaml", dir_);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const ModelConfig base = *ReadHfConfig(dir_ + "/model");
    auto adapter = ReadPeftAdapterConfig(dir_ + "/out/adapter");
    ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();
    EXPECT_EQ(adapter->target_modules, ModuleNames(base));
    auto merged = ReadHfConfig(dir_ + "/out/merged");
    ASSERT_TRUE(merged.ok()) << merged.status().ToString();
    EXPECT_EQ(merged->model_type, base.model_type);
    EXPECT_EQ(*merged, base);
    auto weights = SafetensorsFile::Open(dir_ + "/out/merged/model.safetensors");
    ASSERT_TRUE(weights.ok()) << weights.status().ToString();
    const std::string first = "model.layers.0." + ModulePath(base, ModuleKind::kQ) + ".weight";
    ASSERT_NE((*weights)->Find(first), nullptr) << first;
    EXPECT_EQ((*weights)->Find(first)->shape,
              (std::vector<int64_t>{ModuleShape(base, ModuleKind::kQ).out, base.hidden_size}));
    if (base.fused_projections) {
      EXPECT_EQ((*weights)->Find("model.layers.0.self_attn.k_proj.weight"), nullptr) << "kept fused";
      EXPECT_NE((*weights)->Find("model.layers.1.mlp.gate_up_proj.weight"), nullptr);
    }
    ExpectMergedEqualsBasePlusAdapter({}, "merged vs base+adapter logits");
  }
}

TEST_F(FtTrainCliTest, HeldOutEvalLossIsLoggedAndFalls) {
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  // The last 16 examples are held out.
  std::ifstream all(dir_ + "/data.jsonl");
  std::ofstream train(dir_ + "/train.jsonl"), held_out(dir_ + "/eval.jsonl");
  int n = 0;
  for (std::string line; std::getline(all, line); ++n) (n < 80 ? train : held_out) << line << "\n";
  train.close();
  held_out.close();
  std::ofstream(dir_ + "/job.yaml")
      << "model: {path: model, dtype: fp32}\n"
         "adapter: {type: lora, r: 8, alpha: 16}\n"
         "data: {train: train.jsonl, eval: eval.jsonl, format: tokens, seq_len: 64, packing: false}\n"
         "train:\n  max_steps: 30\n  global_batch_size: 8\n  lr: 1.0e-2\n  warmup_steps: 3\n"
         "  eval_every_steps: 10\n"
         "output: {dir: out}\n";
  CliResult run = FtTrain("run " + dir_ + "/job.yaml", dir_);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("eval at step 30: loss"));

  std::ifstream metrics(dir_ + "/out/metrics.jsonl");
  std::vector<nlohmann::json> evals;
  int64_t last_step_line = 0;
  for (std::string line; std::getline(metrics, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) {
      EXPECT_EQ(j["step"].get<int64_t>(), last_step_line) << "an eval line follows its step's line";
      evals.push_back(j);
    } else if (!j.contains("event")) {
      last_step_line = j["step"].get<int64_t>();
    }
  }
  ASSERT_EQ(evals.size(), 3u);
  for (size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(evals[i]["step"].get<int64_t>(), static_cast<int64_t>(10 * (i + 1)));
    EXPECT_GT(evals[i]["eval_tokens"].get<int64_t>(), 0);
    std::printf("step %d: eval_loss %.4f\n", static_cast<int>(10 * (i + 1)),
                evals[i]["eval_loss"].get<double>());
  }
  EXPECT_LT(evals[1]["eval_loss"].get<double>(), evals[0]["eval_loss"].get<double>());
  EXPECT_LT(evals[2]["eval_loss"].get<double>(), evals[1]["eval_loss"].get<double>());
}

// checkpoint.every auto (engine/job/checkpoint_interval.h): the first checkpoint comes after the
// first step (min_minutes 0) to measure C; then sqrt(2·C·M) decides. With a vanishing M every
// step is due; with a huge one, max_minutes bounds it and nothing more comes before the final
// checkpoint (the run is far shorter). Each run writes the interval and why in metrics.jsonl.
TEST_F(FtTrainCliTest, CheckpointEveryAutoFollowsMeasuredCostAndTheGivenMeanTimeBetweenPreemptions) {
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  WriteJob("  micro_batch_size: 8\ncheckpoint: {every: auto, max_minutes: 30, keep: 100}\n");
  auto auto_checkpoints = [&](const std::string& mtbf) {
    fs::remove_all(dir_ + "/out");
    CliResult run = FtTrain("run " + dir_ + "/job.yaml --mtbf-seconds " + mtbf, dir_);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    std::vector<int64_t> steps;
    std::istringstream in(testing_support::Slurp(dir_ + "/out/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      const std::string reason = j.value("reason", "");
      if (j.value("event", "") == "checkpoint" && (reason == "every_auto" || reason == "every_auto_probe")) {
        steps.push_back(j["step"].get<int64_t>());
      }
    }
    return steps;
  };
  std::vector<int64_t> every = auto_checkpoints("1e-12");
  EXPECT_EQ(every.size(), 29u) << "every step but the last (the final checkpoint covers it)";
  const std::string metrics = testing_support::Slurp(dir_ + "/out/metrics.jsonl");
  EXPECT_THAT(metrics, HasSubstr("\"event\":\"interval\""));
  EXPECT_THAT(metrics, HasSubstr("C not measured yet: first checkpoint after 0.0 min"));
  EXPECT_THAT(metrics, HasSubstr("M = 0.0 min -> every 0.00 min"));
  EXPECT_EQ(auto_checkpoints("1e9"), (std::vector<int64_t>{1, 2}))
      << "step 1 measures C, step 2 (a probe, back to back) its fixed part; then 30 min";
  EXPECT_THAT(testing_support::Slurp(dir_ + "/out/metrics.jsonl"), HasSubstr("(checkpoint.max_minutes)"));
}

// checkpoint.async false: the step loop waits for each periodic checkpoint (its event line comes
// before the next step's), and checkpoint.every auto's C is the fixed part of the writes: the mean
// of the last 16 back-to-back ones (written the step after the previous checkpoint; a probe
// follows the first), and before there is one the mean of the last 16. Each interval line's C is
// that mean of the checkpoint lines before it, and its interval sqrt(2·C·M), the interval each
// automatic checkpoint line records. M = 1 µs: an interval below one step's time (every step)
// whatever the disk: sqrt(2·C·M) < 1.5 ms for any C under a second (M = 5 ms was not, on a CI disk
// whose fsync took tens of milliseconds).
TEST_F(FtTrainCliTest, SynchronousCheckpointsAndTheAutoIntervalFromBackToBackWrites) {
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  WriteJob("  micro_batch_size: 8\ncheckpoint: {every: auto, async: false, keep: 2}\n");
  constexpr double kM = 1e-6;
  CliResult run = FtTrain("run " + dir_ + "/job.yaml --mtbf-seconds 1e-6", dir_);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<double> writes, fixed;
  int64_t checkpointed = -1, intervals = 0, auto_checked = 0;
  const auto recent_mean = [](const std::vector<double>& v) {
    const size_t n = std::min<size_t>(v.size(), 16);
    double mean = 0;
    for (size_t i = v.size() - n; i < v.size(); ++i) mean += v[i] / static_cast<double>(n);
    return mean;
  };
  const auto last16 = [](const std::vector<double>& v) {
    return std::vector<double>(v.end() - static_cast<ptrdiff_t>(std::min<size_t>(v.size(), 16)), v.end());
  };
  const auto recent_median = [&](const std::vector<double>& v) {  // of the last 16: the fixed part
    std::vector<double> r = last16(v);
    std::sort(r.begin(), r.end());
    return r.size() % 2 == 1 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
  };
  const auto c = [&] { return fixed.empty() ? recent_mean(writes) : recent_median(fixed); };
  std::map<int64_t, std::string> reasons;
  std::istringstream in(testing_support::Slurp(dir_ + "/out/metrics.jsonl"));
  for (std::string text; std::getline(in, text);) {
    auto j = nlohmann::json::parse(text);
    const std::string event = j.value("event", "");
    const int64_t step = j["step"].get<int64_t>();
    if (event == "checkpoint") {
      const std::string reason = j.value("reason", "");
      if ((reason == "every_auto" || reason == "every_auto_probe") && !writes.empty()) {
        EXPECT_NEAR(j["interval_seconds"].get<double>(), std::sqrt(2 * c() * kM), 1e-9) << text;
        EXPECT_EQ(j["mtbf_seconds"].get<double>(), kM) << text;
        ++auto_checked;
      }
      EXPECT_EQ(j.value("back_to_back", false), reasons.count(step - 1) == 1)
          << "back to back: the step after the previous checkpoint; " << text;
      reasons[step] = reason;
      writes.push_back(j["checkpoint_seconds"].get<double>());
      if (j.value("back_to_back", false)) fixed.push_back(writes.back());
      checkpointed = step;
    } else if (event == "interval" && !writes.empty()) {
      ++intervals;
      EXPECT_NEAR(j["checkpoint_seconds"].get<double>(), c(), 1e-9 * c()) << text;
      EXPECT_NEAR(j["interval_seconds"].get<double>(), std::sqrt(2 * c() * kM), 1e-9) << text;
      EXPECT_EQ(j["mtbf_seconds"].get<double>(), kM);
      EXPECT_THAT(j["why"].get<std::string>(), HasSubstr("checkpoint.async false, the step waits")) << text;
    } else if (event.empty() && checkpointed >= 0 && !j.contains("eval_loss")) {
      EXPECT_EQ(checkpointed, step - 1)
          << "the checkpoint after step " << checkpointed << " was written before step " << step << " began";
      checkpointed = -1;
    }
  }
  EXPECT_EQ(reasons[1], "every_auto") << "the first measures C";
  EXPECT_EQ(reasons[2], "every_auto_probe") << "the probe the step after measures its fixed part";
  EXPECT_GE(fixed.size(), 20u) << "every step from then on: each write back to back";
  EXPECT_GE(intervals, 1) << "the interval is noted with its C";
  // The final checkpoint keeps the mean of the writes before it and the back-to-back ones
  // themselves (their median is C): a resumed run's C until it measures.
  ASSERT_GE(writes.size(), 2u);
  writes.pop_back();  // the final checkpoint's own write
  fixed.pop_back();   // (back to back too: every step is checkpointed)
  const auto state = nlohmann::json::parse(
      testing_support::Slurp(dir_ + "/out/checkpoints/step-00000030/trainer_state.json"));
  EXPECT_NEAR(state["mean_checkpoint_seconds"].get<double>(), recent_mean(writes), 1e-12);
  EXPECT_NEAR(state["fixed_checkpoint_seconds"].get<double>(), recent_median(fixed), 1e-12);
  EXPECT_EQ(state["recent_fixed_seconds"].get<std::vector<double>>(), last16(fixed));
  EXPECT_GE(auto_checked, 5) << "automatic checkpoints after the first, each at sqrt(2·C·M)";
}

TEST_F(FtTrainCliTest, BadJobExitsTwoNamingFileAndLine) {
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  WriteJob("  learning_rate: 3\n");
  CliResult run = FtTrain("run " + dir_ + "/job.yaml", dir_);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr(dir_ + "/job.yaml:9:3: unknown key 'learning_rate' in train"));
  EXPECT_FALSE(fs::exists(dir_ + "/out/metrics.jsonl"));
}

// `ft-train tokenize --job` indexes every source (leaving the index a run reuses) and prints each
// source's rows and the share it realises over the job's rows; a bad source is named.
TEST_F(FtTrainCliTest, TokenizeAJobShowsEachSourcesRealisedShare) {
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  WriteJob();
  testing_support::UseMixture(dir_ + "/job.yaml");
  CliResult report = FtTrainOutput("tokenize --job " + dir_ + "/job.yaml --set train.max_steps=500", dir_);
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_THAT(report.err, HasSubstr("500 steps x 8 rows = 4000 rows trained"));
  EXPECT_THAT(report.err, testing::ContainsRegex("data.train\\[0\\] +96 +96 .* 60.01% +60.02%"));
  EXPECT_THAT(report.err, testing::ContainsRegex("data.train\\[2\\] +40 +40 .* 9.99% +9.97%"));
  EXPECT_TRUE(fs::exists(dir_ + "/b.jsonl.ftidx")) << "the run reuses the index";
  std::ofstream(dir_ + "/c.jsonl", std::ios::app) << "{\"input_ids\": \"x\"}\n";
  CliResult bad = FtTrainOutput("tokenize --job " + dir_ + "/job.yaml", dir_);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("data.train[2]: "));
  EXPECT_THAT(bad.err, HasSubstr("c.jsonl:41"));
}

TEST_F(FtTrainCliTest, SetOverridesTheJobAndErrorsNameTheOverride) {
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  WriteJob();
  CliResult bad = FtTrain("run " + dir_ + "/job.yaml --set train.lr=fast", dir_);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--set train.lr=fast: train.lr: expected a number, got 'fast'"));
  CliResult plan = FtTrainOutput(
      "plan " + dir_ + "/job.yaml --set data.seq_len=32 --set train.gradient_sum=float --device-memory 1GiB",
      dir_);
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.err, HasSubstr("memory at micro-batch"));
  EXPECT_THAT(plan.err, Not(HasSubstr("host memory"))) << "no technique, no host bytes";
  EXPECT_THAT(plan.err, HasSubstr("gradient sums: fp32 (in order), 16384 values; one rank: no all-reduce"));
  // LoRA's default: exact sums, their host bytes (17 + 4 per value) and the all-reduce's payload.
  CliResult exact = FtTrainOutput("plan " + dir_ + "/job.yaml --world 2 --device-memory 1GiB", dir_);
  EXPECT_EQ(exact.exit_code, 0) << exact.err;
  EXPECT_THAT(exact.err, HasSubstr("  gradient sum    336.0 KiB\n"));
  EXPECT_THAT(exact.err,
              HasSubstr("gradient sums: exact (the same bits at any world size), 16384 values; each "
                        "step all-reduces 272.0 KiB across 2 ranks (fp32: 64.0 KiB)"));
  // With the memory techniques the plan states host bytes beside the device's.
  CliResult offload =
      FtTrainOutput("plan " + dir_ +
                        "/job.yaml --set train.cpu_offload=true --set train.optimizer=paged_adamw "
                        "--set train.activation_checkpointing=offload --device-memory 1GiB",
                    dir_);
  ASSERT_EQ(offload.exit_code, 0) << offload.err;
  EXPECT_THAT(offload.err, HasSubstr("activation checkpointing offload, cpu_offload, paged_adamw"));
  EXPECT_THAT(offload.err, HasSubstr("host memory (techniques, exact gradient sums):"));
  CliResult run = FtTrain("run " + dir_ + "/job.yaml --set train.max_steps=5 --set output.merge=false", dir_);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(testing_support::StepLines(dir_ + "/out").size(), 5u) << "max_steps 30 in the file, 5 by --set";
  EXPECT_FALSE(fs::exists(dir_ + "/out/merged")) << "output.merge overridden";
}

// A fixed micro-batch is checked against the device like an auto one: before
// the check, ft-train skipped the planner and ran into std::bad_alloc (rc 134)
// on a job that `ft-train plan` said does not fit. The CPU device's capacity
// is FT_GUARDED_DEVICE_MEMORY (MiB) on the guarded backend, MemAvailable
// otherwise: 64 MiB here, where micro-batch 8 at seq_len 2048 needs 146 MiB.
TEST_F(FtTrainCliTest, AFixedMicroBatchThatDoesNotFitIsRefusedWithThePlanAndTheFix) {
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  // tiny-llama's context is 512 positions; this model takes the 2048 the plan below is sized for.
  ModelConfig long_context = *ReadHfConfig(dir_ + "/model");
  long_context.max_position_embeddings = 2048;
  std::ofstream(dir_ + "/model/config.json") << HfConfigJson(long_context);
  WriteJob("  micro_batch_size: 8\n");
  const std::vector<std::string> set = {"--set", "data.seq_len=2048", "--set", "resources.device=cpu"};
  auto ft_train = [&](const std::string& command, const std::string& log) {
    std::vector<std::string> argv = {FT_TRAIN_BIN, command, dir_ + "/job.yaml"};
    argv.insert(argv.end(), set.begin(), set.end());
    if (command == "plan") argv.insert(argv.end(), {"--device-memory", "64MiB"});
    const int code =
        testing_support::Spawn(argv, {.log = log, .env = {"FT_GUARDED_DEVICE_MEMORY=64"}}).Wait();
    return CliResult{code, testing_support::Slurp(log)};
  };
  CliResult plan = ft_train("plan", dir_ + "/plan.txt");
  EXPECT_EQ(plan.exit_code, 1) << plan.err;
  EXPECT_THAT(plan.err, HasSubstr("does NOT fit: micro_batch_size 8 needs 133.6 MiB"));
  CliResult run = ft_train("run", dir_ + "/run.txt");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_THAT(run.err,
              HasSubstr("ft-train: ResourceExhausted: " + dir_ +
                        "/job.yaml: train.micro_batch_size: micro-batch 8 needs 133.6 MiB (weights "));
  EXPECT_THAT(run.err, HasSubstr("but the device offers 64.0 MiB; set micro_batch_size: 2 (the largest that "
                                 "fits, 34.0 MiB) or micro_batch_size: auto"));
  EXPECT_FALSE(fs::exists(dir_ + "/out/metrics.jsonl")) << "refused before training";
  // The suggested fix runs.
  CliResult fixed =
      FtTrain("run " + dir_ + "/job.yaml --set data.seq_len=2048 --set train.micro_batch_size=2 " +
                  "--set train.max_steps=1 --set output.merge=false --set resources.device=cpu",
              dir_);
  EXPECT_EQ(fixed.exit_code, 0) << fixed.err;
}

// tiny-llama's heads are 16 wide; the CUDA attention kernels take 64, 128 or 256.
// Refused before anything is loaded (so on any machine, GPU or not), naming
// the model, the head dim and the fix; before the check a CUDA run died on a
// failed synchronisation while it loaded the model.
TEST_F(FtTrainCliTest, AModelTheCudaKernelsRefuseIsNamedBeforeItLoads) {
  ASSERT_EQ(FtTrain("make-model --preset tiny-llama --out " + dir_ + "/model", dir_).exit_code, 0);
  WriteJob();
  CliResult run = FtTrain("run " + dir_ + "/job.yaml --set resources.device=cuda", dir_);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr(dir_ + "/job.yaml: resources.device: cuda, but model.path " + dir_ +
                                 "/model (config.json) has head_dim 16: the cuda attention kernels take "
                                 "head dim 64 or 128 or 256; use resources.device: cpu"));
  EXPECT_FALSE(fs::exists(dir_ + "/out/metrics.jsonl"));
  CliResult gen = FtTrain("generate --model " + dir_ + "/model --prompt hi --device cuda", dir_);
  EXPECT_EQ(gen.exit_code, 2);
  EXPECT_THAT(gen.err, HasSubstr("--device cuda: " + dir_ +
                                 "/model (config.json) has head_dim 16: the cuda attention kernels take "
                                 "head dim 64 or 128 or 256; use --device cpu"));
}

// Runs ft-train with `args` (output to `log`); its exit code and its peak resident memory (KiB,
// wait4's ru_maxrss of that child alone).
std::pair<int, long> RunMeasured(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {FT_TRAIN_BIN};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return {-1, 0};
  int status = 0;
  struct rusage usage {};
  if (wait4(pid, &status, 0, &usage) != pid) return {-1, 0};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), usage.ru_maxrss};
}

// make-model writes each tensor as it makes it: the bytes RandomInitModel + SaveHfModel write
// from a whole model in memory, in a few chunks of memory whatever the model's size (the 8B
// shape's 32 GB of fp32 took two minutes of every GPU session).
TEST_F(FtTrainCliTest, MakeModelStreamsTheBytesOfTheInMemoryModel) {
  long tiny_kib = 0;  // ft-train's own footprint (its libraries), making a model of 0.3 MB
  for (const auto& [flag, dtype] : {std::pair{"bf16", DType::kBF16}, std::pair{"f32", DType::kF32}}) {
    const std::string streamed = dir_ + "/streamed-" + flag, whole = dir_ + "/whole-" + flag;
    const auto [code, kib] = RunMeasured(
        {"make-model", "--preset", "tiny-llama", "--seed", "7", "--dtype", flag, "--out", streamed},
        dir_ + "/tiny.log");
    ASSERT_EQ(code, 0) << testing_support::Slurp(dir_ + "/tiny.log");
    tiny_kib = std::max(tiny_kib, kib);
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, 7);
    ASSERT_TRUE(SaveHfModel(whole, model, dtype).ok());
    for (const char* file : {"/config.json", "/model.safetensors"}) {
      EXPECT_EQ(testing_support::Slurp(streamed + file), testing_support::Slurp(whole + file))
          << flag << file;
    }
  }
  // ~207M parameters (828 MB in fp32, 414 MB written as bf16): the process grows beyond its footprint
  // making the tiny model by less than an eighth of the fp32 model, where holding it took all of it.
  std::ofstream(dir_ + "/config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
          "intermediate_size": 2816, "num_hidden_layers": 12, "num_attention_heads": 16,
          "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 2048,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";
  const auto [code, peak_kib] = RunMeasured(
      {"make-model", "--config", dir_ + "/config.json", "--out", dir_ + "/big", "--dtype", "bf16"},
      dir_ + "/big.log");
  ASSERT_EQ(code, 0) << testing_support::Slurp(dir_ + "/big.log");
  const int64_t params = 2 * int64_t{32000} * 1024 + 1024 +
                         12 * (2 * 1024 + 2 * 1024 * 1024 + 2 * 512 * 1024 + 3 * int64_t{2816} * 1024);
  const int64_t file_bytes = static_cast<int64_t>(fs::file_size(dir_ + "/big/model.safetensors"));
  EXPECT_GT(file_bytes, 2 * params);
  std::printf(
      "make-model of %lld parameters: peak RSS %.1f MiB, %.1f MiB for the tiny model (fp32 model %.1f "
      "MiB)\n",
      static_cast<long long>(params), peak_kib / 1024.0, tiny_kib / 1024.0, 4.0 * params / (1 << 20));
#if !defined(FT_SANITIZED)  // ASan's quarantine keeps freed chunks resident: no bound there
  EXPECT_LT(int64_t{peak_kib - tiny_kib} * 1024, params / 2);  // an eighth of its fp32 bytes
#endif
}

TEST_F(FtTrainCliTest, MissingModelIsNamed) {
  WriteJob();
  CliResult run = FtTrain("run " + dir_ + "/job.yaml", dir_);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr(dir_ + "/model/config.json: cannot open file"));
}

}  // namespace
}  // namespace ft
