// ft-train --allowed-root (ftd's roots, passed on by the worker): every file
// the trainer opens or writes must resolve under a root when it is opened. A
// symlink inside the root that leads out (model weights, output.dir's
// checkpoints) or a parent directory swapped for one after submit is refused
// with an error naming the path and the root, and nothing is written outside.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/train/trainer.h"
#include "tests/support/ft_train.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace ::ft::testing_support;  // NOLINT: the harness is this test's vocabulary

class ConfinementTest : public testing::Test {
 protected:
  void SetUp() override {
    base_ = TempPath(std::string("confine-") + testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    fs::create_directories(root_ + "/jobs");
    fs::create_directories(outside_);
    fs::copy(ModelDir(), root_ + "/model", fs::copy_options::recursive);
    fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", root_ + "/data.jsonl");
  }
  // The job as the worker writes it (outside the roots), every path absolute; returns its path.
  std::string WriteJob(const std::string& output_dir, int64_t steps = 4) {
    const std::string job = base_ + "/job.yaml";
    std::ofstream(job) << "model: {path: " << root_ << "/model, dtype: fp32}\n"
                       << "adapter: {type: lora, r: 4, alpha: 8}\n"
                       << "data: {train: " << root_ << "/data.jsonl, format: tokens, seq_len: 64}\n"
                       << "train: {max_steps: " << steps << ", global_batch_size: 4, micro_batch_size: 2}\n"
                       << "checkpoint: {every_steps: 2, every_minutes: 0, keep: 2}\n"
                       << "output: {dir: " << output_dir << "}\n";
    return job;
  }
  int Run(const std::string& job) { return WaitExit(Spawn(base_, {"run", job, "--allowed-root", root_})); }
  std::string Stderr() { return Slurp(base_ + "/stderr.txt"); }
  // Every file and directory under `dir`, relative.
  std::vector<std::string> Entries(const std::string& dir) {
    std::vector<std::string> v;
    for (const auto& e : fs::recursive_directory_iterator(dir)) v.push_back(fs::relative(e.path(), dir));
    return v;
  }

  std::string base_, root_, outside_;
};

TEST_F(ConfinementTest, JobEntirelyInsideTheRootTrainsAsUsual) {
  ASSERT_EQ(Run(WriteJob(root_ + "/jobs/out")), kExitFinished) << Stderr();
  EXPECT_TRUE(fs::exists(root_ + "/jobs/out/adapter/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(root_ + "/jobs/out/checkpoints"));
}

TEST_F(ConfinementTest, ModelWeightsSymlinkedOutOfTheRootAreRefused) {
  fs::copy_file(root_ + "/model/model.safetensors", outside_ + "/model.safetensors");
  fs::remove(root_ + "/model/model.safetensors");
  fs::create_symlink(outside_ + "/model.safetensors", root_ + "/model/model.safetensors");
  EXPECT_EQ(Run(WriteJob(root_ + "/jobs/out")), kExitBadInput) << Stderr();
  EXPECT_THAT(Stderr(), HasSubstr(root_ + "/model/model.safetensors: resolves to " + outside_));
  EXPECT_THAT(Stderr(), HasSubstr("outside the allowed roots (" + root_ + ")"));
}

TEST_F(ConfinementTest, CheckpointsSymlinkedOutOfTheRootAreRefusedAndNothingIsWrittenThere) {
  fs::create_directories(root_ + "/jobs/out");
  fs::create_directories(outside_ + "/ckpt");
  fs::create_symlink(outside_ + "/ckpt", root_ + "/jobs/out/checkpoints");
  EXPECT_EQ(Run(WriteJob(root_ + "/jobs/out")), kExitBadInput) << Stderr();
  EXPECT_THAT(Stderr(), HasSubstr(root_ + "/jobs/out/checkpoints"));
  EXPECT_THAT(Stderr(), HasSubstr("outside the allowed roots (" + root_ + ")"));
  EXPECT_THAT(Entries(outside_ + "/ckpt"), testing::IsEmpty());
}

TEST_F(ConfinementTest, OutputParentSwappedForASymlinkAfterSubmitIsRefused) {
  const std::string job = WriteJob(root_ + "/jobs/out");  // what ftd checked: inside the root
  fs::rename(root_ + "/jobs", outside_ + "/jobs");
  fs::create_symlink(outside_ + "/jobs", root_ + "/jobs");
  EXPECT_EQ(Run(job), kExitBadInput) << Stderr();
  EXPECT_THAT(Stderr(), HasSubstr(root_ + "/jobs/out"));
  EXPECT_THAT(Stderr(), HasSubstr("outside the allowed roots (" + root_ + ")"));
  EXPECT_THAT(Entries(outside_ + "/jobs"), testing::IsEmpty());
}

TEST_F(ConfinementTest, OutputDirThatIsAFileFailsAsBadInputNotEnvironment) {
  std::ofstream(root_ + "/jobs/out") << "a file";
  EXPECT_EQ(Run(WriteJob(root_ + "/jobs/out")), kExitBadInput) << Stderr();
  EXPECT_THAT(Stderr(), HasSubstr("output.dir: " + root_ + "/jobs/out: exists and is not a directory"));
}

TEST_F(ConfinementTest, DataFileDeletedWhileTrainingFailsAsBadInputNotEnvironment) {
  // Before: an I/O error, exit 5 ("environment"), which ftd retries without end.
  const std::string job = WriteJob(root_ + "/jobs/out", /*steps=*/100000);
  const pid_t pid = Spawn(base_, {"run", job, "--allowed-root", root_});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (StepLines(root_ + "/jobs/out").empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(StepLines(root_ + "/jobs/out").empty()) << Stderr();
  fs::remove(root_ + "/data.jsonl");
  EXPECT_EQ(WaitExit(pid), kExitBadInput) << Stderr();
  EXPECT_THAT(Stderr(), HasSubstr("data.train: '" + root_ + "/data.jsonl' no longer exists"));
}

}  // namespace
}  // namespace ft
