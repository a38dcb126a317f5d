// An Attempt runs a real ft-train on a tiny CPU job: stop over the control
// channel (checkpoint, then PREEMPTED), resume to the end (FINISHED, only new
// steps reported), failures with the trainer's reason, Kill/Abort, and a
// stop the trainer does not honour in time (SIGKILL of its process group).
#include "worker/attempt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "tests/worker/process_gone.h"

namespace ft::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testing_util::GoneWithin;

// Records every callback, in order.
class Recorder : public AttemptListener {
 public:
  void OnMetrics(const AttemptSpec&, const std::vector<MetricsLine>& steps, int64_t time_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_GT(time_ms, 0);
    for (const MetricsLine& m : steps) {
      if (m.kind == MetricsLine::Kind::kStep) steps_.push_back(m.step);
      lines_.push_back(m);
    }
    events_.push_back("metrics");
    cv_.notify_all();
  }
  void OnLog(const AttemptSpec&, const std::string& text) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(text.back(), '\n');
    log_ += text;
  }
  void OnCheckpoint(const AttemptSpec&, const CommittedCheckpoint& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    checkpoints_.push_back(c);
    events_.push_back("checkpoint");
    cv_.notify_all();
  }
  void OnExit(const AttemptSpec&, const AttemptExit& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    exit_ = e;
    exits_++;
    events_.push_back("exit");
    cv_.notify_all();
  }

  bool WaitForStep(int64_t step, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout,
                        [&] { return (!steps_.empty() && steps_.back() >= step) || exits_ > 0; });
  }
  bool WaitForExit(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return exits_ > 0; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> steps_;      // of the step lines
  std::vector<MetricsLine> lines_;  // step and eval lines
  std::vector<CommittedCheckpoint> checkpoints_;
  std::vector<std::string> events_;
  std::string log_;
  AttemptExit exit_;
  int exits_ = 0;
};

class AttemptTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = (fs::path(testing::TempDir()) / "worker-attempt").lexically_normal().string();
    fs::remove_all(root_);
    fs::create_directories(root_);
    fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", root_ + "/data.jsonl");
    const std::string cmd = std::string(FT_TRAIN_BIN) + " make-model --preset tiny-llama --out " + root_ +
                            "/model 2> " + root_ + "/make-model.txt";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "ft-train make-model failed";
  }

  // A job with absolute paths, as the daemon sends it.
  // data_extra: more keys of the data section (", eval: ...").
  AttemptSpec Job(const std::string& name, int64_t steps, const std::string& data = "",
                  const std::string& data_extra = "") {
    const std::string out = root_ + "/" + name + "-out";
    const std::string file = root_ + "/" + name + ".yaml";
    std::ofstream(file) << "model: {path: " << root_ << "/model, dtype: fp32}\n"
                        << "adapter: {type: lora, r: 8, alpha: 16}\n"
                        << "data: {train: " << (data.empty() ? root_ + "/data.jsonl" : data)
                        << ", format: tokens, seq_len: 64, packing: false" << data_extra << "}\n"
                        << "train: {max_steps: " << steps << ", global_batch_size: 8, lr: 1.0e-2}\n"
                        << "checkpoint: {every_steps: 2, keep: 3}\n"
                        << "output: {dir: " << out << "}\n";
    AttemptSpec spec;
    spec.job_id = name;
    spec.epoch = 1;
    spec.ft_train = FT_TRAIN_BIN;
    spec.job_file = file;
    spec.output_dir = out;
    spec.total_steps = steps;
    spec.stop_grace_s = 30;
    spec.poll_interval = std::chrono::milliseconds(50);
    return spec;
  }

  static std::string root_;
};

std::string AttemptTest::root_;

TEST_F(AttemptTest, EvalLinesAreRelayedAfterTheirSteps) {
  // checkpoint.every_steps 2: evaluations at steps 2 and 4 (the default cadence and the last step).
  AttemptSpec spec = Job("eval", 4, "", ", eval: " + root_ + "/data.jsonl");
  Recorder r;
  auto attempt = Attempt::Start(spec, &r);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  ASSERT_TRUE(r.WaitForExit()) << r.log_;
  std::lock_guard<std::mutex> lock(r.mu_);
  ASSERT_EQ(r.exit_.outcome, AttemptOutcome::kFinished) << r.exit_.reason << "\n" << r.log_;
  std::vector<std::string> order;
  for (const MetricsLine& m : r.lines_) {
    order.push_back((m.kind == MetricsLine::Kind::kEval ? "eval " : "step ") + std::to_string(m.step));
    if (m.kind == MetricsLine::Kind::kEval) {
      EXPECT_GT(m.eval_loss, 0) << "step " << m.step;
      EXPECT_GT(m.eval_tokens, 0);
    }
  }
  EXPECT_EQ(order, (std::vector<std::string>{"step 1", "step 2", "eval 2", "step 3", "step 4", "eval 4"}));
  EXPECT_EQ((*attempt)->progress().step, 4);
}

// A run that train.early_stopping ends (a min_delta no evaluation can beat: the second evaluation
// stops it) finishes, and its exit carries the trainer's reason (ftd makes it the job's).
TEST_F(AttemptTest, ARunThatEarlyStoppingEndsFinishesWithItsReason) {
  AttemptSpec spec = Job("early-stop", 6, "", ", eval: " + root_ + "/data.jsonl");
  std::stringstream text;
  text << std::ifstream(spec.job_file).rdbuf();
  std::string yaml = text.str();
  const std::string train = "lr: 1.0e-2}";
  ASSERT_NE(yaml.find(train), std::string::npos);
  yaml.replace(yaml.find(train), train.size(),
               "lr: 1.0e-2, eval_every_steps: 1, early_stopping: {patience: 1, min_delta: 1000}}");
  std::ofstream(spec.job_file) << yaml;
  Recorder r;
  auto attempt = Attempt::Start(spec, &r);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  ASSERT_TRUE(r.WaitForExit()) << r.log_;
  std::lock_guard<std::mutex> lock(r.mu_);
  ASSERT_EQ(r.exit_.outcome, AttemptOutcome::kFinished) << r.exit_.reason << "\n" << r.log_;
  EXPECT_THAT(r.exit_.reason,
              MatchesRegex("early stopping: eval_loss did not improve by more than 1000 for 1 "
                           "evaluation; best [0-9.]+ at step [12]"));
  EXPECT_EQ(r.exit_.step, 2);
}

TEST_F(AttemptTest, StopOnTheControlChannelCheckpointsThenPreemptsAndResumeFinishes) {
  AttemptSpec spec = Job("stop-resume", 20);
  Recorder first;
  {
    auto attempt = Attempt::Start(spec, &first);
    ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
    ASSERT_TRUE(first.WaitForStep(1));
    ASSERT_TRUE((*attempt)->Control("stop", 30, "test stop").ok());
    ASSERT_TRUE(first.WaitForExit()) << first.log_;
    EXPECT_EQ((*attempt)->progress().step, first.exit_.step);
    EXPECT_TRUE((*attempt)->progress().stop_sent);
  }
  std::lock_guard<std::mutex> lock(first.mu_);
  ASSERT_EQ(first.exit_.outcome, AttemptOutcome::kPreempted) << first.exit_.reason << "\n" << first.log_;
  EXPECT_EQ(first.exit_.exit_code, 3);
  EXPECT_EQ(first.exit_.reason, "test stop");
  const int64_t stopped_at = first.exit_.step;
  ASSERT_GE(stopped_at, 1);
  ASSERT_LT(stopped_at, 20) << "the job finished before the stop arrived";
  EXPECT_EQ(first.events_.back(), "exit");
  ASSERT_FALSE(first.checkpoints_.empty());
  const CommittedCheckpoint& last = first.checkpoints_.back();
  EXPECT_EQ(last.step, stopped_at);  // the stop's own checkpoint
  EXPECT_TRUE(fs::path(last.dir).is_absolute()) << last.dir;
  EXPECT_TRUE(fs::exists(last.dir + "/MANIFEST.json"));
  EXPECT_THAT(last.manifest_sha256, MatchesRegex("[0-9a-f]{64}"));
  EXPECT_GE(last.write_seconds, 0.0);
  EXPECT_THAT(first.log_, HasSubstr("stopped after checkpoint"));
  for (size_t i = 0; i < first.steps_.size(); ++i) EXPECT_EQ(first.steps_[i], static_cast<int64_t>(i + 1));

  // Epoch 2 resumes from the newest checkpoint; only its own steps are reported.
  spec.epoch = 2;
  spec.start_step = stopped_at;
  Recorder second;
  auto attempt = Attempt::Start(spec, &second);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  EXPECT_GE((*attempt)->progress().step, stopped_at) << "progress starts at the committed step, not 0";
  ASSERT_TRUE(second.WaitForExit()) << second.log_;
  std::lock_guard<std::mutex> lock2(second.mu_);
  ASSERT_EQ(second.exit_.outcome, AttemptOutcome::kFinished) << second.exit_.reason << "\n" << second.log_;
  EXPECT_EQ(second.exit_.exit_code, 0);
  EXPECT_EQ(second.exit_.step, 20);
  ASSERT_FALSE(second.steps_.empty());
  EXPECT_EQ(second.steps_.front(), stopped_at + 1);
  EXPECT_EQ(second.steps_.back(), 20);
  EXPECT_EQ(static_cast<int64_t>(second.steps_.size()), 20 - stopped_at);
  ASSERT_FALSE(second.checkpoints_.empty());
  EXPECT_EQ(second.checkpoints_.back().step, 20);  // the final checkpoint
  EXPECT_THAT(second.log_, HasSubstr("resumed from"));
  EXPECT_EQ((*attempt)->progress().step, 20);
  EXPECT_EQ((*attempt)->progress().total_steps, 20);
}

TEST_F(AttemptTest, FailureCarriesTheTrainersErrorLine) {
  AttemptSpec spec = Job("bad-data", 20, root_ + "/no-such-data.jsonl");
  Recorder r;
  auto attempt = Attempt::Start(spec, &r);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  ASSERT_TRUE(r.WaitForExit());
  std::lock_guard<std::mutex> lock(r.mu_);
  EXPECT_EQ(r.exit_.outcome, AttemptOutcome::kBadInput);  // the job fails once, not max_failures times
  EXPECT_EQ(r.exit_.exit_code, 2);
  EXPECT_THAT(r.exit_.reason, HasSubstr("no-such-data.jsonl"));
  EXPECT_THAT(r.exit_.reason, ::testing::Not(HasSubstr("ft-train: ")));
}

TEST_F(AttemptTest, KillReportsNothingMore) {
  AttemptSpec spec = Job("kill", 100000);
  Recorder r;
  auto attempt = Attempt::Start(spec, &r);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  ASSERT_TRUE(r.WaitForStep(1));
  (*attempt)->Kill();
  size_t events = 0;
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    events = r.events_.size();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!(*attempt)->done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE((*attempt)->done());
  std::lock_guard<std::mutex> lock(r.mu_);
  EXPECT_EQ(r.events_.size(), events);
  EXPECT_EQ(r.exits_, 0);
  EXPECT_FALSE((*attempt)->Control("stop", 1, "too late").ok());
}

TEST_F(AttemptTest, AbortReportsPreemptedWithTheReason) {
  AttemptSpec spec = Job("abort", 100000);
  Recorder r;
  auto attempt = Attempt::Start(spec, &r);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  ASSERT_TRUE(r.WaitForStep(1));
  (*attempt)->Abort("SIGTERM: no checkpoint in time");
  ASSERT_TRUE(r.WaitForExit());
  std::lock_guard<std::mutex> lock(r.mu_);
  EXPECT_EQ(r.exit_.outcome, AttemptOutcome::kPreempted);
  EXPECT_EQ(r.exit_.exit_code, 128 + 9);
  EXPECT_EQ(r.exit_.reason, "SIGTERM: no checkpoint in time");
  EXPECT_GE(r.exit_.step, 1);
}

// One rank of a multi-rank attempt is started with its world, rank, rendezvous, address and the
// backend its worker chose (--dist-backend nccl on GPUs), and the environment of its device.
TEST_F(AttemptTest, ARankIsStartedWithItsRendezvousAndBackend) {
  const std::string script = root_ + "/args-trainer.sh", args = root_ + "/args.txt";
  std::ofstream(script) << "#!/bin/sh\necho \"$@\" CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES > " << args
                        << ".tmp\nmv " << args << ".tmp " << args << "\nexit 3\n";
  fs::permissions(script, fs::perms::owner_all);
  AttemptSpec spec = Job("ranked", 20);
  spec.ft_train = script;
  spec.world = 2;
  spec.rank = 1;
  spec.rendezvous = "10.0.0.1:29400";
  spec.dist_host = "10.0.0.2";
  spec.dist_backend = "nccl";
  spec.env = {"CUDA_VISIBLE_DEVICES=6"};
  Recorder r;
  auto attempt = Attempt::Start(spec, &r);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  ASSERT_TRUE(r.WaitForExit(std::chrono::seconds(30))) << r.log_;
  std::string line;
  std::getline(std::ifstream(args), line);
  EXPECT_NE(
      line.find("--world 2 --rank 1 --rendezvous 10.0.0.1:29400 --dist-host 10.0.0.2 --dist-backend nccl"),
      std::string::npos)
      << line;
  EXPECT_NE(line.find("CUDA_VISIBLE_DEVICES=6"), std::string::npos) << line;
}

// A "trainer" that ignores SIGTERM and the control channel and has a child of
// its own (a grandchild of the worker) that would keep the output pipe open:
// the stop's deadline passes, then kill_grace_s, then the whole process group
// is SIGKILLed and the exit is reported, with the stop's reason.
TEST_F(AttemptTest, StopNotHonouredByItsDeadlineKillsTheWholeProcessGroup) {
  const std::string script = root_ + "/stuck-trainer.sh", pid_file = root_ + "/stuck-grandchild.pid";
  fs::remove(pid_file);
  std::ofstream(script) << "#!/bin/sh\ntrap '' TERM\nsleep 100000 &\necho $! > " << pid_file << ".tmp\nmv "
                        << pid_file << ".tmp " << pid_file << "\nwait\n";
  fs::permissions(script, fs::perms::owner_all);
  AttemptSpec spec = Job("stuck", 20);
  spec.ft_train = script;
  spec.kill_grace_s = 0.5;
  Recorder r;
  auto attempt = Attempt::Start(spec, &r);
  ASSERT_TRUE(attempt.ok()) << attempt.status().ToString();
  const auto started = std::chrono::steady_clock::now();
  while (!fs::exists(pid_file) && std::chrono::steady_clock::now() < started + std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(fs::exists(pid_file)) << r.log_;
  pid_t grandchild = 0;
  std::ifstream(pid_file) >> grandchild;
  ASSERT_GT(grandchild, 0);
  const pid_t trainer = (*attempt)->pid();
  const auto stop = std::chrono::steady_clock::now();
  ASSERT_TRUE((*attempt)->Control("stop", 0.5, "cancelled").ok());
  ASSERT_TRUE(r.WaitForExit(std::chrono::seconds(30))) << "a stuck trainer outlived its stop";
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - stop).count();
  EXPECT_GE(took, 1.0) << "killed before the deadline + grace";
  EXPECT_LT(took, 10.0);
  EXPECT_TRUE(GoneWithin(trainer, std::chrono::seconds(5)));
  EXPECT_TRUE(GoneWithin(grandchild, std::chrono::seconds(5))) << "the process group's other member lives on";
  std::lock_guard<std::mutex> lock(r.mu_);
  EXPECT_EQ(r.exit_.outcome, AttemptOutcome::kPreempted);
  EXPECT_EQ(r.exit_.exit_code, 128 + 9);
  EXPECT_THAT(r.exit_.reason, HasSubstr("cancelled: killed (SIGKILL to its process group)"));
  EXPECT_THAT(r.exit_.reason, HasSubstr("did not stop within 1 s"));
}

TEST_F(AttemptTest, MissingBinaryIsNotFound) {
  AttemptSpec spec = Job("missing", 20);
  spec.ft_train = root_ + "/no-ft-train";
  Recorder r;
  auto attempt = Attempt::Start(spec, &r);
  EXPECT_TRUE(attempt.status().IsNotFound()) << attempt.status().ToString();
  EXPECT_EQ(r.exits_, 0);
}

}  // namespace
}  // namespace ft::worker
