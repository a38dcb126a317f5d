// The inputs a run reads stay what they were when it started (issue #41):
// a data file rewritten in place under a running trainer fails the run as
// bad input naming both hashes, never a silent mix of old and new data; an
// unchanged or merely touched file trains as before; a resume on a changed
// model config is refused; and a stop requested while the data is prepared
// ends the trainer's start at once (Cancelled: exit "preempted").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/file_util.h"
#include "engine/io/hf_model.h"
#include "engine/job/job_spec.h"
#include "engine/train/trainer.h"
#include "tests/support/temp_dir.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh folder with a random tiny Llama and the tiny example's data.
std::string FreshJobDir(const std::string& name) {
  const std::string dir = testing_support::FreshDir(name);
  Model model(*PresetModelConfig("tiny-llama"), {});
  RandomInitModel(&model, 7);
  EXPECT_TRUE(SaveHfModel(dir + "/model", model, DType::kF32).ok());
  fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", dir + "/train.jsonl");
  return dir;
}

JobSpec Job(const std::string& dir, int64_t max_steps) {
  std::ostringstream yaml;
  yaml << "model: {path: model}\n"
       << "adapter: {type: lora, r: 4, alpha: 8}\n"
       << "data: {train: train.jsonl, format: tokens, seq_len: 64, packing: false, shuffle: true}\n"
       << "train: {max_steps: " << max_steps << ", global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-3}\n"
       << "checkpoint: {every_steps: 2, every_minutes: 0, keep: 3}\n"
       << "output: {dir: out}\n";
  auto spec = ParseJobSpec(yaml.str(), dir + "/job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

// Rewrites `path` in place (same inode, same size): the first "245" becomes "246".
void RewriteInPlace(const std::string& path) {
  std::string text = *ReadFileToString(path);
  const size_t at = text.find("245");
  ASSERT_NE(at, std::string::npos);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at + 2));
  f.put('6');
}

TEST(InputsTest, ADataFileRewrittenInPlaceBetweenStepsFailsTheStepNamingBothHashes) {
  const std::string dir = FreshJobDir("rewritten");
  const std::string data = dir + "/train.jsonl";
  auto trainer = Trainer::Create(Job(dir, 4));
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  StepMetrics m;
  ASSERT_TRUE((*trainer)->Step(&m).ok());
  const std::string before = *Sha256File(data);
  const uint64_t size = fs::file_size(data);
  RewriteInPlace(data);
  ASSERT_EQ(fs::file_size(data), size) << "same size: only the stamp and the contents tell";
  const std::string after = *Sha256File(data);
  Status step = (*trainer)->Step(&m);
  ASSERT_TRUE(step.IsInvalidArgument()) << step.ToString();  // bad input: never retried
  EXPECT_THAT(step.message(),
              HasSubstr(dir + "/job.yaml: data.train: " + data + " changed during the run: SHA-256 " +
                        before + " at start, " + after + " now"));
  EXPECT_THAT(step.message(), HasSubstr("restore the file or submit a new job"));
  EXPECT_EQ((*trainer)->steps_done(), 1) << "the step that read the changed file applied nothing";
}

// Through Run: the change lands mid-run (after step 2's data was read); the run fails before
// its next checkpoint and never writes COMPLETE.json, instead of finishing on a mix.
TEST(InputsTest, ARunWhoseDataChangesMidRunFailsWithoutOutputs) {
  const std::string dir = FreshJobDir("mid-run");
  auto trainer = Trainer::Create(Job(dir, 6));
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  (*trainer)->set_grad_hook([&](int64_t step) {
    if (step == 3) RewriteInPlace(dir + "/train.jsonl");
  });
  auto outcome = (*trainer)->Run();
  ASSERT_TRUE(outcome.status().IsInvalidArgument()) << outcome.status().ToString();
  EXPECT_THAT(outcome.status().message(),
              HasSubstr("data.train: " + dir + "/train.jsonl changed during the run"));
  EXPECT_FALSE(fs::exists(dir + "/out/COMPLETE.json"));
  EXPECT_FALSE(fs::exists(dir + "/out/checkpoints/step-00000004")) << "no checkpoint after the change";
  EXPECT_EQ((*trainer)->steps_done(), 3);
}

// An unchanged file trains as before; one touched (new times, same bytes) keeps training.
TEST(InputsTest, AnUnchangedOrTouchedDataFileTrainsAsBefore) {
  const std::string dir = FreshJobDir("unchanged");
  auto trainer = Trainer::Create(Job(dir, 4));
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  (*trainer)->set_grad_hook([&](int64_t step) {
    if (step == 2) fs::last_write_time(dir + "/train.jsonl", fs::file_time_type::clock::now());
  });
  auto outcome = (*trainer)->Run();
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  EXPECT_EQ(*outcome, RunOutcome::kFinished);
  EXPECT_TRUE(fs::exists(dir + "/out/COMPLETE.json"));
  EXPECT_TRUE((*trainer)->CheckInputs().ok());
}

// The checkpoint records the hashes of the inputs the run read; a resume on another config.json
// (here rms_norm_eps, which changes every forward) is refused naming both hashes.
TEST(InputsTest, AResumeOnAChangedModelConfigIsRefusedNamingBothHashes) {
  const std::string dir = FreshJobDir("resume-config");
  const std::string config = dir + "/model/config.json";
  {
    auto first = Trainer::Create(Job(dir, 2));
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_TRUE((*first)->Run().ok());
  }
  const std::string before = *Sha256File(config);
  ModelConfig changed = *ReadHfConfig(dir + "/model");
  changed.rms_norm_eps = 1e-3;
  std::ofstream(config) << HfConfigJson(changed);
  auto second = Trainer::Create(Job(dir, 4));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto outcome = (*second)->Run();
  ASSERT_TRUE(outcome.status().IsInvalidArgument()) << outcome.status().ToString();
  EXPECT_THAT(outcome.status().message(),
              HasSubstr("model.path (config.json) has SHA-256 " + *Sha256File(config) + " but checkpoint " +
                        dir + "/out/checkpoints/step-00000002 was trained on SHA-256 " + before));
}

// A stop (SIGTERM, the worker's "stop") while the data is being indexed ends Create at the next
// line with Cancelled, which ft-train exits "preempted" on, instead of after the whole file.
TEST(InputsTest, AStopWhileTheDataIsPreparedEndsCreateCancelled) {
  const std::string dir = FreshJobDir("stop-while-indexing");
  TrainControl control;
  control.Post({true, std::chrono::steady_clock::now() + std::chrono::seconds(10), "test stop"});
  auto trainer = Trainer::Create(Job(dir, 4), nullptr, &control);
  ASSERT_EQ(trainer.status().code(), Status::Code::kCancelled) << trainer.status().ToString();
  EXPECT_THAT(trainer.status().message(), HasSubstr(dir + "/train.jsonl: indexing stopped at line 1"));
  EXPECT_FALSE(fs::exists(dir + "/out")) << "nothing written";
}

}  // namespace
}  // namespace ft
