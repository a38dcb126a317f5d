// Evaluation on data.eval: the loss equals an independent forward over the
// held-out sequences, training is bit-identical with and without it, an
// evaluation after a resume equals the uninterrupted run's, and the job keys
// are validated.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file_util.h"
#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"
#include "engine/job/job_spec.h"
#include "engine/train/trainer.h"
#include "tests/support/temp_dir.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kSteps = 8;
constexpr int64_t kEvalEvery = 3;  // evaluations at 3, 6 and 8 (the last step)

// A random tiny Llama shared by the tests of this file (made once).
const std::string& ModelDir() {
  static const std::string dir = [] {
    std::string d = (fs::path(testing::TempDir()) / "eval-model").lexically_normal().string();
    fs::remove_all(d);
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, 7);
    EXPECT_TRUE(SaveHfModel(d, model, DType::kF32).ok());
    return d;
  }();
  return dir;
}

// A fresh folder with the tiny example split 80/16 into train.jsonl and eval.jsonl.
std::string FreshDir(const std::string& name) {
  const std::string d = testing_support::FreshDir(name);
  std::ifstream in(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl");
  std::ofstream train(d + "/train.jsonl"), eval(d + "/eval.jsonl");
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) (n < 80 ? train : eval) << line << "\n";
  return d;
}

// LoRA with dropout and shuffling, micro-batches of 2 (an eval set of 16 rows is 8 of them).
JobSpec Job(const std::string& dir, const std::string& data_extra, const std::string& train_extra) {
  std::ostringstream yaml;
  yaml << "model: {path: " << ModelDir() << ", dtype: fp32}\n"
       << "adapter: {type: lora, r: 8, alpha: 16, dropout: 0.1}\n"
       << "data: {train: train.jsonl, format: tokens, seq_len: 64, packing: false, shuffle: true"
       << data_extra << "}\n"
       << "train:\n  max_steps: " << kSteps
       << "\n  global_batch_size: 8\n  micro_batch_size: 2\n  lr: 1.0e-2\n  warmup_steps: 2\n"
       << train_extra << "checkpoint: {every_steps: 4, every_minutes: 0, keep: 3}\n"
       << "output: {dir: out}\n";
  auto spec = ParseJobSpec(yaml.str(), dir + "/job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

JobSpec EvalJob(const std::string& dir) {
  return Job(dir, ", eval: eval.jsonl", "  eval_every_steps: " + std::to_string(kEvalEvery) + "\n");
}

struct Lines {
  std::vector<nlohmann::json> steps, evals;
};

Lines ReadMetrics(const std::string& dir) {
  Lines out;
  std::ifstream in(dir + "/out/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) {
      out.evals.push_back(j);
    } else if (!j.contains("event")) {
      out.steps.push_back(j);
    }
  }
  return out;
}

// Runs `spec` to the end in-process.
void RunToEnd(const JobSpec& spec) {
  auto trainer = Trainer::Create(spec);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  auto outcome = (*trainer)->Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  EXPECT_EQ(*outcome, RunOutcome::kFinished);
}

// The uninterrupted run with evaluation (made once).
const std::string& ReferenceDir() {
  static const std::string dir = [] {
    std::string d = FreshDir("reference");
    RunToEnd(EvalJob(d));
    return d;
  }();
  return dir;
}

TEST(EvalTest, EvalLinesAtTheCadenceAndTheLastStep) {
  const Lines m = ReadMetrics(ReferenceDir());
  ASSERT_EQ(m.steps.size(), static_cast<size_t>(kSteps));
  std::vector<int64_t> steps;
  for (const auto& e : m.evals) {
    steps.push_back(e["step"].get<int64_t>());
    EXPECT_GT(e["eval_tokens"].get<int64_t>(), 0);
    EXPECT_TRUE(e.contains("eval_seconds"));
    std::printf("step %lld: eval_loss %.6f over %lld tokens\n", static_cast<long long>(steps.back()),
                e["eval_loss"].get<double>(), static_cast<long long>(e["eval_tokens"].get<int64_t>()));
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 6, 8}));
}

TEST(EvalTest, EvalLossEqualsMeanCrossEntropyOfAPlainForwardWithoutDropout) {
  const std::string dir = ReferenceDir();
  const Lines m = ReadMetrics(dir);
  ASSERT_FALSE(m.evals.empty());
  const nlohmann::json& last = m.evals.back();
  ASSERT_EQ(last["step"].get<int64_t>(), kSteps);

  // Independent: base + the final adapter, dropout off, one eval sequence at a time.
  Model model(*ReadHfConfig(ModelDir()), {});
  ASSERT_TRUE(LoadHfWeights(ModelDir(), &model).ok());
  auto lora = ReadPeftAdapterConfig(dir + "/out/adapter");
  ASSERT_TRUE(lora.ok()) << lora.status().ToString();
  EXPECT_EQ(lora->dropout, 0.1);
  lora->dropout = 0;  // evaluation: no dropout
  ASSERT_TRUE(model.EnableLora(*lora).ok());
  ASSERT_TRUE(LoadPeftAdapter(dir + "/out/adapter", &model).ok());
  const int64_t vocab = model.config().vocab_size;
  auto eval = Dataset::Open({dir + "/eval.jsonl", 64, false, false, "", /*use_cache=*/false},
                            [vocab](const std::string& line, const std::string& where) {
                              return ParseTokensRecord(line, where, vocab);
                            });
  ASSERT_TRUE(eval.ok()) << eval.status().ToString();
  double loss_sum = 0;
  int64_t tokens = 0;
  for (int64_t row = 0; row < (*eval)->size(); ++row) {
    auto mb = (*eval)->MakeBatch(row, 1, false, 0);
    ASSERT_TRUE(mb.ok());
    const LossResult r = model.Forward(*mb, nullptr);
    loss_sum += r.loss_sum;
    tokens += r.tokens;
  }
  const double want = loss_sum / static_cast<double>(tokens), got = last["eval_loss"].get<double>();
  std::printf("eval_loss %.9f, plain forward %.9f over %lld tokens (rel diff %.2e)\n", got, want,
              static_cast<long long>(tokens), std::fabs(got - want) / want);
  EXPECT_EQ(last["eval_tokens"].get<int64_t>(), tokens);
  EXPECT_NEAR(got, want, 1e-6 * want);

  // The same forward with the training dropout gives another loss: the check above can tell.
  lora->dropout = 0.1;
  Model dropped(*ReadHfConfig(ModelDir()), {});
  ASSERT_TRUE(LoadHfWeights(ModelDir(), &dropped).ok());
  ASSERT_TRUE(dropped.EnableLora(*lora).ok());
  ASSERT_TRUE(LoadPeftAdapter(dir + "/out/adapter", &dropped).ok());
  auto mb = (*eval)->MakeBatch(0, (*eval)->size(), false, 0);
  ASSERT_TRUE(mb.ok());
  const LossResult with_dropout = dropped.Forward(*mb, nullptr);
  EXPECT_GT(std::fabs(with_dropout.loss_sum / static_cast<double>(with_dropout.tokens) - want), 1e-4 * want);
}

TEST(EvalTest, TrainingIsBitIdenticalWithAndWithoutEval) {
  const std::string plain = FreshDir("no-eval");
  RunToEnd(Job(plain, "", ""));
  const Lines with = ReadMetrics(ReferenceDir()), without = ReadMetrics(plain);
  EXPECT_TRUE(without.evals.empty());
  ASSERT_EQ(with.steps.size(), without.steps.size());
  for (size_t i = 0; i < with.steps.size(); ++i) {
    EXPECT_EQ(with.steps[i]["loss"].get<double>(), without.steps[i]["loss"].get<double>())
        << "step " << i + 1;
    EXPECT_EQ(with.steps[i]["grad_norm"].get<double>(), without.steps[i]["grad_norm"].get<double>())
        << "step " << i + 1;
  }
  const std::string a = *ReadFileToString(ReferenceDir() + "/out/adapter/adapter_model.safetensors");
  const std::string b = *ReadFileToString(plain + "/out/adapter/adapter_model.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "final adapter bytes differ with evaluation on";
}

TEST(EvalTest, EvalAfterResumeEqualsTheUninterruptedRun) {
  // Stop after step 5 (a checkpoint "stop" request at the next boundary), then resume in a new trainer.
  const std::string dir = FreshDir("resumed");
  const JobSpec spec = EvalJob(dir);
  {
    auto first = Trainer::Create(spec);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    TrainControl control;
    (*first)->set_control(&control);
    (*first)->set_grad_hook([&](int64_t step) {
      if (step == 5) control.Post({true, std::chrono::steady_clock::now() + std::chrono::hours(1), "test"});
    });
    auto outcome = (*first)->Run();
    ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
    ASSERT_EQ(*outcome, RunOutcome::kPreempted);
    EXPECT_EQ((*first)->steps_done(), 5);
  }
  RunToEnd(spec);
  const Lines resumed = ReadMetrics(dir), reference = ReadMetrics(ReferenceDir());
  ASSERT_EQ(resumed.evals.size(), reference.evals.size());
  for (size_t i = 0; i < resumed.evals.size(); ++i) {
    EXPECT_EQ(resumed.evals[i]["step"], reference.evals[i]["step"]);
    EXPECT_EQ(resumed.evals[i]["eval_loss"].get<double>(), reference.evals[i]["eval_loss"].get<double>())
        << "eval at step " << resumed.evals[i]["step"];
    EXPECT_EQ(resumed.evals[i]["eval_tokens"], reference.evals[i]["eval_tokens"]);
  }
}

TEST(EvalTest, MaxBatchesBoundsTheEvaluatedRows) {
  const std::string dir = FreshDir("max-batches");
  auto trainer = Trainer::Create(Job(dir, ", eval: eval.jsonl", "  eval_max_batches: 1\n"));
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  ASSERT_NE((*trainer)->eval_data(), nullptr);
  EvalMetrics e;
  ASSERT_TRUE((*trainer)->Evaluate(&e).ok());
  EXPECT_EQ(e.batches, 1);
  EXPECT_EQ(e.step, 0);
  EXPECT_EQ(e.tokens, (*trainer)->eval_data()->CountTargets(0, 2, false, 0)) << "one micro-batch of 2 rows";
}

TEST(EvalTest, APendingStopAbandonsTheEvaluation) {
  const std::string dir = FreshDir("stop");
  auto trainer = Trainer::Create(EvalJob(dir));
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  TrainControl control;
  (*trainer)->set_control(&control);
  EvalMetrics e;
  bool interrupted = true;
  ASSERT_TRUE((*trainer)->Evaluate(&e, &interrupted).ok());
  EXPECT_FALSE(interrupted);
  EXPECT_EQ(e.batches, 8) << "16 rows in micro-batches of 2";
  control.Post({true, std::chrono::steady_clock::now() + std::chrono::seconds(30), "slot end"});
  EvalMetrics stopped;
  ASSERT_TRUE((*trainer)->Evaluate(&stopped, &interrupted).ok());
  EXPECT_TRUE(interrupted);
  EXPECT_EQ(stopped.batches, 0) << "nothing reported";
  EXPECT_TRUE(control.Pending().has_value()) << "the stop stays for the training loop";
}

TEST(EvalTest, EvalEveryStepsDefaultsToTheCheckpointCadence) {
  const std::string dir = FreshDir("default");
  EXPECT_EQ(Job(dir, ", eval: eval.jsonl", "").train.eval_every_steps, 4);
  EXPECT_EQ(Job(dir, "", "").train.eval_every_steps, 0);
  EXPECT_EQ(EvalJob(dir).train.eval_every_steps, kEvalEvery);
}

TEST(EvalTest, EvalKeysNeedAnEvalFileAndAreNamedWhenWrong) {
  const std::string base =
      "model: {path: m}\ndata: {train: t.jsonl}\noutput: {dir: o}\ntrain:\n  max_steps: 2\n";
  auto no_file = ParseJobSpec(base + "  eval_every_steps: 5\n", "/j/job.yaml");
  ASSERT_FALSE(no_file.ok());
  EXPECT_THAT(no_file.status().message(),
              HasSubstr("/j/job.yaml:6:21: train.eval_every_steps: needs data.eval"));
  auto negative = ParseJobSpec(base + "  eval_max_batches: -1\n", "/j/job.yaml");
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(),
              HasSubstr("train.eval_max_batches: must be an integer in [0, 1000000000] (0 = all), got -1"));
  auto typo = ParseJobSpec(base + "  eval_every_step: 5\n", "/j/job.yaml");
  ASSERT_FALSE(typo.ok());
  EXPECT_THAT(typo.status().message(), HasSubstr("eval_every_steps"));
}

}  // namespace
}  // namespace ft
