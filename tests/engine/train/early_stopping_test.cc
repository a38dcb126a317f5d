// Evaluation a run acts on (issue #45): train.early_stopping stops a run at
// the step an uninterrupted run stops at however often it is killed (-9) and
// resumed, checkpoint.keep_best keeps the best evaluation's checkpoint through
// retention (keep: 1), and output.adapter_from: best writes that checkpoint's
// adapter; the verdict rules themselves, step by step.
#include "engine/train/early_stopping.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/job/completion.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "tests/support/ft_train.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace ::ft::testing_support;  // NOLINT: the harness is this test's vocabulary

constexpr int64_t kMaxSteps = 60;

// The shared tiny model on the example's 96 rows of token ids (80 to train on, 16 held out),
// evaluated every 2 steps at a constant lr high enough that the eval loss goes up and down:
// early stopping (patience 3) ends the run well before max_steps, and the best evaluation comes
// before the last. Checkpoints every 5 steps, keep: 1 beside the best; the adapter is the best's.
std::string WriteEarlyStoppingJob(const std::string& dir) {
  fs::create_directories(dir);
  std::ifstream in(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl");
  std::ofstream train(dir + "/train.jsonl"), eval(dir + "/eval.jsonl");
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) (n < 80 ? train : eval) << line << "\n";
  std::ofstream(dir + "/job.yaml")
      << "model: {path: " << ModelDir() << ", dtype: fp32}\n"
      << "adapter: {type: lora, r: 8, alpha: 16, dropout: 0.1}\n"
      << "data: {train: train.jsonl, format: tokens, seq_len: 64, packing: false, shuffle: true, "
         "eval: eval.jsonl}\n"
      << "train:\n  max_steps: " << kMaxSteps
      << "\n  global_batch_size: 8\n  micro_batch_size: 2\n  lr: 5.0e-2\n  lr_schedule: constant\n"
      << "  eval_every_steps: 2\n  early_stopping: {metric: eval_loss, patience: 3}\n"
      << "checkpoint: {every_steps: 5, every_minutes: 0, keep: 1, keep_best: true}\n"
      << "output: {dir: out, adapter_from: best}\n";
  return dir + "/job.yaml";
}

std::vector<int64_t> CheckpointSteps(const std::string& out) {
  std::vector<int64_t> steps;
  for (const CheckpointEntry& e : ListCheckpoints(out + "/checkpoints")) steps.push_back(e.step);
  return steps;
}

// Every tensor of a safetensors file, by name.
std::map<std::string, std::vector<float>> Tensors(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return out;
  for (const TensorInfo& t : (*file)->tensors()) {
    std::vector<float>& v = out[t.name];
    v.resize(static_cast<size_t>(t.numel()));
    EXPECT_TRUE((*file)->ReadFloat(t.name, t.shape, v.data()).ok()) << t.name;
  }
  return out;
}

// The uninterrupted run (made once): it stopped early, with the best checkpoint kept.
const std::string& ReferenceDir() {
  static const std::string dir = [] {
    const std::string d = FreshDir("reference");
    EXPECT_EQ(RunToEnd(d, WriteEarlyStoppingJob(d)), kExitFinished) << Slurp(d + "/stderr.txt");
    return d;
  }();
  return dir;
}

// Starts `job` and kills it (-9) once metrics.jsonl has a step line at or past `step`; its exit
// code (kExitFinished when it ended first).
int KillAtStep(const std::string& dir, const std::string& job, int64_t step) {
  const pid_t pid = Spawn(dir, {"run", job});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::vector<nlohmann::json> lines = StepLines(dir + "/out");
    if (!lines.empty() && lines.back()["step"].get<int64_t>() >= step) break;
    if (fs::exists(dir + "/out/COMPLETE.json")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGKILL);
  return WaitExit(pid);
}

// The best step every checkpoint records has its checkpoint beside it (retention kept it).
void ExpectBestCheckpointsKept(const std::string& out) {
  for (const CheckpointEntry& e : ListCheckpoints(out + "/checkpoints")) {
    auto state = ReadCheckpointState(e.dir);
    if (!state.ok() || state->evaluation.best_step == 0) continue;
    EXPECT_TRUE(fs::exists(out + "/checkpoints/" + CheckpointName(state->evaluation.best_step)))
        << e.dir << " names step " << state->evaluation.best_step << " the best, and it is gone";
  }
}

TEST(EarlyStoppingTest, TheUninterruptedRunStopsEarlyKeepsTheBestAndWritesItsAdapter) {
  const std::string out = ReferenceDir() + "/out";
  auto done = ReadCompletion(out);
  ASSERT_TRUE(done.ok()) << done.status().ToString() << Slurp(ReferenceDir() + "/stderr.txt");
  EXPECT_LT(done->steps, kMaxSteps) << "early stopping ended the run";
  EXPECT_THAT(
      done->stop_reason,
      StartsWith("early stopping: eval_loss did not improve by more than 0 for 3 evaluations; best "));
  ASSERT_GT(done->adapter_step, 0) << "the best evaluation came before the last";
  ASSERT_LT(done->adapter_step, done->steps);
  EXPECT_THAT(done->stop_reason, HasSubstr(" at step " + std::to_string(done->adapter_step)));
  EXPECT_EQ(CheckpointSteps(out), (std::vector<int64_t>{done->steps, done->adapter_step}))
      << "keep: 1 keeps the newest, and the best beside it";
  const auto events = EventLines(out, "early_stop");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["step"], done->steps);
  EXPECT_EQ(events[0]["reason"], done->stop_reason);
  EXPECT_EQ(StepLines(out).back()["step"], done->steps) << "no step after the stop";
  const std::string best = out + "/checkpoints/" + CheckpointName(done->adapter_step);
  EXPECT_EQ(Tensors(out + "/adapter/adapter_model.safetensors"), Tensors(best + "/adapter_model.safetensors"))
      << "output.adapter_from: best writes the best checkpoint's adapter";
}

TEST(EarlyStoppingTest, KilledNineAtRandomStepsItStopsAtTheSameStepWithTheSameBytesAndKeepsTheBest) {
  auto reference = ReadCompletion(ReferenceDir() + "/out");
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  const std::string dir = FreshDir("chaos");
  const std::string job = WriteEarlyStoppingJob(dir);
  std::mt19937 rng(45);
  std::set<int64_t> targets, killed_at;
  while (targets.size() < 5)
    targets.insert(std::uniform_int_distribution<int64_t>(1, reference->steps - 1)(rng));
  for (const int64_t step : targets) {
    const int code = KillAtStep(dir, job, step);
    if (code == kExitFinished) break;
    ASSERT_EQ(code, 128 + SIGKILL) << Slurp(dir + "/stderr.txt");
    killed_at.insert(step);
    ExpectBestCheckpointsKept(dir + "/out");
  }
  EXPECT_GE(killed_at.size(), 3u);
  ASSERT_EQ(RunToEnd(dir, job), kExitFinished) << Slurp(dir + "/stderr.txt");
  auto done = ReadCompletion(dir + "/out");
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->steps, reference->steps) << "the preemptions moved the stop";
  EXPECT_EQ(done->stop_reason, reference->stop_reason);
  EXPECT_EQ(done->adapter_step, reference->adapter_step);
  EXPECT_TRUE(Slurp(dir + "/out/adapter/adapter_model.safetensors") ==
              Slurp(ReferenceDir() + "/out/adapter/adapter_model.safetensors"))
      << "the adapter differs from the uninterrupted run's";
  EXPECT_EQ(CheckpointSteps(dir + "/out"), CheckpointSteps(ReferenceDir() + "/out"));
}

// A stop request that arrives during the evaluation of the best step abandons that evaluation; the
// resumed run evaluates the step again before going on, so it decides as the uninterrupted run.
TEST(EarlyStoppingTest, AnEvaluationAbandonedForAStopIsRedoneOnResume) {
  auto reference = ReadCompletion(ReferenceDir() + "/out");
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  const std::string dir = FreshDir("abandoned");
  auto spec = LoadJobSpec(WriteEarlyStoppingJob(dir));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  {
    auto first = Trainer::Create(*spec);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    TrainControl control;
    (*first)->set_control(&control);
    (*first)->set_grad_hook([&](int64_t step) {
      if (step == reference->adapter_step) {
        control.Post({true, std::chrono::steady_clock::now() + std::chrono::hours(1), "test"});
      }
    });
    auto outcome = (*first)->Run();
    ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
    ASSERT_EQ(*outcome, RunOutcome::kPreempted);
    ASSERT_EQ((*first)->steps_done(), reference->adapter_step);
  }
  auto second = Trainer::Create(*spec);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto outcome = (*second)->Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  auto done = ReadCompletion(dir + "/out");
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->steps, reference->steps);
  EXPECT_EQ(done->adapter_step, reference->adapter_step);
  EXPECT_TRUE(Slurp(dir + "/out/adapter/adapter_model.safetensors") ==
              Slurp(ReferenceDir() + "/out/adapter/adapter_model.safetensors"))
      << "the adapter differs from the uninterrupted run's";
}

// The rules on a made-up sequence: the first evaluation is the best; a better one is the new best
// and resets the count only when better by more than min_delta; one that is not finite is never
// the best; `patience` evaluations without such an improvement stop the run, but not at its last
// step; a metric where higher is better counts the other way.
TEST(EarlyStoppingTest, VerdictsFollowTheBestValueMinDeltaAndPatience) {
  JobSpec spec;
  spec.train.early_stopping = {true, EvalMetric::kEvalLoss, /*patience=*/3, /*min_delta=*/0.1};
  struct Case {
    int64_t step;
    double value;
    bool best;
    int64_t since;
  };
  const std::vector<Case> cases = {
      {2, 3.0, true, 0},     // the first
      {4, 2.95, true, 1},    // better, by no more than min_delta
      {6, 2.8, true, 0},     // better by more
      {8, NAN, false, 1},    // not finite
      {10, 2.85, false, 2},  // worse
      {12, 2.9, false, 3},   // the third without an improvement
  };
  for (const int64_t last_step : {int64_t{12}, int64_t{100}}) {
    SCOPED_TRACE("last step " + std::to_string(last_step));
    EvalProgress p = FreshEvalProgress(spec);
    EXPECT_EQ(p.metric, "eval_loss");
    for (const Case& c : cases) {
      const EvalVerdict v = RecordEvaluation(spec, c.step, last_step, c.value, &p);
      EXPECT_EQ(v.best, c.best) << "step " << c.step;
      EXPECT_EQ(p.since_improvement, c.since) << "step " << c.step;
      EXPECT_EQ(v.stop, c.step == 12 && last_step > 12) << "step " << c.step;
    }
    EXPECT_EQ(p.best_step, 6);
    EXPECT_EQ(p.last_step, 12);
    EXPECT_EQ(p.stop_reason, last_step > 12 ? "early stopping: eval_loss did not improve by more than 0.1 "
                                              "for 3 evaluations; best 2.8 at step 6"
                                            : "");
  }
  spec.train.early_stopping.metric = EvalMetric::kEvalRewardAccuracies;
  EvalProgress p = FreshEvalProgress(spec);
  EXPECT_EQ(p.metric, "eval_rewards/accuracies");
  EXPECT_TRUE(RecordEvaluation(spec, 2, 100, 0.5, &p).best);
  EXPECT_TRUE(RecordEvaluation(spec, 4, 100, 0.75, &p).best) << "higher is better";
  EXPECT_FALSE(RecordEvaluation(spec, 6, 100, 0.6, &p).best);
  EXPECT_EQ(p.best_step, 4);
  EXPECT_EQ(EvalMetricValue(EvalMetric::kEvalRewardMargins, 1.0, {{"eval_rewards/margins", 2.5}}).value(),
            2.5);
  EXPECT_FALSE(EvalMetricValue(EvalMetric::kEvalRewardMargins, 1.0, {}).ok());
}

// The verdicts travel in trainer_state.json's "evaluation"; a checkpoint without one (an older
// build's, or a job that acts on no evaluation) reads as fresh.
TEST(EarlyStoppingTest, TheVerdictsArePartOfTheTrainerStateAndAbsentMeansFresh) {
  TrainerState s;
  s.step = 12;
  s.evaluation = {"eval_loss", 12, 6, 2.8, 3, "early stopping: ..."};
  auto back = TrainerStateFromJson(TrainerStateToJson(s), "trainer_state.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->evaluation.metric, "eval_loss");
  EXPECT_EQ(back->evaluation.last_step, 12);
  EXPECT_EQ(back->evaluation.best_step, 6);
  EXPECT_EQ(back->evaluation.best_value, 2.8);
  EXPECT_EQ(back->evaluation.since_improvement, 3);
  EXPECT_EQ(back->evaluation.stop_reason, "early stopping: ...");
  s.evaluation = {};
  const std::string plain = TrainerStateToJson(s);
  EXPECT_EQ(plain.find("\"evaluation\""), std::string::npos) << "nothing tracked: nothing written";
  auto fresh = TrainerStateFromJson(plain, "trainer_state.json");
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(fresh->evaluation.metric, "");
  EXPECT_EQ(fresh->evaluation.best_step, 0);
  EXPECT_EQ(fresh->evaluation.since_improvement, 0);
}

}  // namespace
}  // namespace ft
