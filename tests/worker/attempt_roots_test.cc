// ftd's allowed roots reach the trainer through the worker (StartAttempt's
// allowed_roots → AttemptSpec → ft-train --allowed-root): a job whose
// output.dir/checkpoints is a symlink out of the root fails with the reason
// naming the root, as a failure of the job, not an environment error that
// ftd would retry without end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "worker/attempt.h"

namespace ft::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ExitRecorder : public AttemptListener {
 public:
  void OnMetrics(const AttemptSpec&, const std::vector<MetricsLine>&, int64_t) override {}
  void OnLog(const AttemptSpec&, const std::string&) override {}
  void OnCheckpoint(const AttemptSpec&, const CommittedCheckpoint&) override {}
  void OnExit(const AttemptSpec&, const AttemptExit& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    exit_ = e;
    exited_ = true;
    cv_.notify_all();
  }
  bool WaitForExit() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::minutes(2), [&] { return exited_; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool exited_ = false;
  AttemptExit exit_;
};

TEST(AttemptRootsTest, CheckpointsSymlinkedOutOfFtdsRootFailTheAttemptNamingTheRoot) {
  const std::string base = testing::TempDir() + "/attempt-roots";
  fs::remove_all(base);
  const std::string root = base + "/root", outside = base + "/outside";
  fs::create_directories(root + "/out");
  fs::create_directories(outside);
  fs::create_symlink(outside, root + "/out/checkpoints");
  fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", root + "/data.jsonl");
  const std::string make = std::string(FT_TRAIN_BIN) + " make-model --preset tiny-llama --out " + root +
                           "/model 2> " + base + "/make-model.txt";
  ASSERT_EQ(std::system(make.c_str()), 0);
  std::ofstream(base + "/job.yaml") << "model: {path: " << root << "/model, dtype: fp32}\n"
                                    << "adapter: {type: lora, r: 4, alpha: 8}\n"
                                    << "data: {train: " << root
                                    << "/data.jsonl, format: tokens, seq_len: 64}\n"
                                    << "train: {max_steps: 4, global_batch_size: 4, micro_batch_size: 2}\n"
                                    << "checkpoint: {every_steps: 2, every_minutes: 0, keep: 2}\n"
                                    << "output: {dir: " << root << "/out}\n";
  AttemptSpec spec;
  spec.job_id = "j-1";
  spec.epoch = 1;
  spec.ft_train = FT_TRAIN_BIN;
  spec.job_file = base + "/job.yaml";
  spec.output_dir = root + "/out";
  spec.total_steps = 4;
  spec.allowed_roots = {root};
  ExitRecorder r;
  auto a = Attempt::Start(spec, &r);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(r.WaitForExit());
  EXPECT_EQ(r.exit_.outcome, AttemptOutcome::kBadInput) << r.exit_.reason;  // fails the job once
  EXPECT_THAT(r.exit_.reason, HasSubstr(root + "/out/checkpoints"));
  EXPECT_THAT(r.exit_.reason, HasSubstr("outside the allowed roots (" + root + ")"));
  EXPECT_TRUE(fs::is_empty(outside));
}

}  // namespace
}  // namespace ft::worker
