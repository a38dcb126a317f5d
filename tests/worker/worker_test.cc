// The Worker in-process, with a stand-in trainer (a shell script) and a
// recording sink: every report about an attempt echoes the credential of its
// StartAttempt (metrics, log lines, checkpoint, note, exit, heartbeat progress,
// Register's running list) and the journaled exit keeps it across a worker
// restart; a DPO step's objective metrics (rewards) are forwarded; the work dir
// keeps the worker's instance (the same after a restart, another for another
// work dir) and is locked against a second worker; a trainer that ignores the
// stop of a SIGTERM'd worker is SIGKILLed at the stop's deadline plus the kill
// grace, and reported.
#include "worker/worker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "engine/job/metrics_line.h"

namespace ft::worker {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kCredential(64, 'c');

class RecordingSink : public ReportSink {
 public:
  void Send(pb::WorkerMessage m) override {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back(std::move(m));
    cv_.notify_all();
  }
  void DropQueued(const std::string&, int64_t) override {}
  // Waits (up to 30 s) until `pred` holds for the messages so far.
  bool WaitFor(const std::function<bool(const std::vector<pb::WorkerMessage>&)>& pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return pred(messages_); });
  }
  std::vector<pb::WorkerMessage> messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::WorkerMessage> messages_;
};

bool Has(const std::vector<pb::WorkerMessage>& ms, pb::WorkerMessage::MsgCase c) {
  return std::any_of(ms.begin(), ms.end(), [&](const pb::WorkerMessage& m) { return m.msg_case() == c; });
}

class WorkerTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::path(testing::TempDir()) /
             ("worker-" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name())))
                .lexically_normal()
                .string();
    fs::remove_all(root_);
    fs::create_directories(root_ + "/model");
    std::ofstream(root_ + "/data.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";
  }

  WorkerOptions Options(const std::string& work_dir, const std::string& trainer) {
    WorkerOptions o;
    o.id = "w";
    o.hostname = "host";
    o.ft_train = trainer;
    o.work_dir = work_dir;
    o.kill_grace_s = 0.3;
    o.devices.cpu_memory_bytes = int64_t{1} << 30;
    o.poll_interval = std::chrono::milliseconds(20);
    return o;
  }

  // A stand-in ft-train: runs `body` (sh), with $OUT the job's output.dir and its argv in argv.txt.
  std::string Trainer(const std::string& body) {
    const std::string path = root_ + "/ft-train.sh";
    std::ofstream(path) << "#!/bin/sh\nOUT=" << root_ << "/out\nmkdir -p $OUT\necho \"$@\" > " << root_
                        << "/argv.txt\n"
                        << body;
    fs::permissions(path, fs::perms::owner_all);
    return path;
  }

  pb::DaemonCommand Start(int64_t epoch) {
    pb::DaemonCommand c;
    pb::StartAttempt* s = c.mutable_start();
    s->set_job_id("j-000001");
    s->set_epoch(epoch);
    s->set_credential(kCredential);
    s->set_total_steps(10);
    s->set_spec_yaml("model: {path: " + root_ +
                     "/model, dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n" +
                     "data: {train: " + root_ + "/data.jsonl, format: tokens, seq_len: 64}\n" +
                     "train: {max_steps: 10, global_batch_size: 4}\noutput: {dir: " + root_ + "/out}\n");
    return c;
  }

  std::string root_;
};

// The lines a trainer at step 1 writes: a step, a checkpoint (with its manifest) and a resume note.
std::string MetricsLines(const std::string& out) {
  MetricsLine step;
  step.kind = MetricsLine::Kind::kStep;
  step.step = 1;
  step.loss = 2.5;
  MetricsLine ckpt = MetricsEvent(MetricsLine::Kind::kCheckpoint, 1, "every_steps");
  ckpt.dir = out + "/checkpoints/step-00000001";
  MetricsLine note = MetricsEvent(MetricsLine::Kind::kResume, 0, "fresh start");
  note.resume_kind = "restart_from_zero";
  return FormatMetricsLine(step) + "\n" + FormatMetricsLine(ckpt) + "\n" + FormatMetricsLine(note) + "\n";
}

TEST_F(WorkerTest, EveryReportEchoesTheAttemptCredentialAndTheJournalKeepsItAcrossARestart) {
  std::ofstream(root_ + "/lines.jsonl") << MetricsLines(root_ + "/out");
  const std::string trainer = Trainer(
      "mkdir -p $OUT/checkpoints/step-00000001\necho '{}' > $OUT/checkpoints/step-00000001/MANIFEST.json\n"
      "echo 'step 1 loss 2.5'\ncat " +
      root_ + "/lines.jsonl >> $OUT/metrics.jsonl\nwhile [ ! -e " + root_ +
      "/go ]; do sleep 0.02; done\nexit 0\n");
  RecordingSink sink;
  std::string instance;
  {
    Worker worker(Options(root_ + "/work", trainer));
    ASSERT_TRUE(worker.Init().ok());
    instance = worker.instance();
    EXPECT_EQ(instance.size(), 32u);
    worker.set_sink(&sink);
    worker.OnCommand(Start(3));
    ASSERT_TRUE(sink.WaitFor([](const auto& ms) {
      return Has(ms, pb::WorkerMessage::kMetrics) && Has(ms, pb::WorkerMessage::kLog) &&
             Has(ms, pb::WorkerMessage::kCheckpoint) && Has(ms, pb::WorkerMessage::kNote);
    })) << "the stand-in trainer's reports did not all come";
    const pb::Heartbeat hb = worker.MakeHeartbeat();
    ASSERT_EQ(hb.progress_size(), 1);
    EXPECT_EQ(hb.progress(0).credential(), kCredential);
    const pb::Register reg = worker.MakeRegister();
    EXPECT_EQ(reg.instance(), instance);
    ASSERT_EQ(reg.running_size(), 1);
    EXPECT_EQ(reg.running(0).credential(), kCredential);
    std::ofstream(root_ + "/go");
    ASSERT_TRUE(sink.WaitFor([](const auto& ms) { return Has(ms, pb::WorkerMessage::kExited); }));
    EXPECT_TRUE(worker.WaitIdle(std::chrono::seconds(10)));
  }
  for (const pb::WorkerMessage& m : sink.messages()) {
    switch (m.msg_case()) {
      case pb::WorkerMessage::kMetrics: EXPECT_EQ(m.metrics().credential(), kCredential); break;
      case pb::WorkerMessage::kLog:
        EXPECT_EQ(m.log().credential(), kCredential);
        EXPECT_EQ(m.log().rank(), 0);
        break;
      case pb::WorkerMessage::kCheckpoint: EXPECT_EQ(m.checkpoint().credential(), kCredential); break;
      case pb::WorkerMessage::kNote: EXPECT_EQ(m.note().credential(), kCredential); break;
      case pb::WorkerMessage::kExited: EXPECT_EQ(m.exited().credential(), kCredential); break;
      default: ADD_FAILURE() << "unexpected message " << m.msg_case();
    }
  }
  // The trainer never sees it (its argv, its job file).
  std::ifstream argv(root_ + "/argv.txt");
  EXPECT_THAT(std::string(std::istreambuf_iterator<char>(argv), {}), Not(HasSubstr(kCredential)));

  // Restarted on the same work dir: the same instance, and the journaled exit with its credential.
  Worker restarted(Options(root_ + "/work", trainer));
  ASSERT_TRUE(restarted.Init().ok());
  EXPECT_EQ(restarted.instance(), instance);
  const pb::Register reg = restarted.MakeRegister();
  EXPECT_EQ(reg.instance(), instance);
  ASSERT_EQ(reg.exited_size(), 1);
  EXPECT_EQ(reg.exited(0).credential(), kCredential);
  EXPECT_EQ(reg.exited(0).outcome(), pb::ATTEMPT_FINISHED);
  // Another work dir is another instance.
  Worker other(Options(root_ + "/other-work", trainer));
  ASSERT_TRUE(other.Init().ok());
  EXPECT_NE(other.instance(), instance);
}

// A DPO trainer's step lines carry TRL's means as keys of their own: the worker forwards them
// as the point's objective metrics, and an evaluation line's on its eval_only point; an SFT
// step line forwards none.
TEST_F(WorkerTest, ADpoTrainersRewardsReachTheDaemonAsTheStepsObjectiveMetrics) {
  MetricsLine dpo;
  dpo.kind = MetricsLine::Kind::kStep;
  dpo.step = 1;
  dpo.loss = 0.69;
  dpo.objective_metrics = {{"rewards/chosen", 0.25},  {"rewards/rejected", -0.5},
                           {"rewards/margins", 0.75}, {"rewards/accuracies", 1.0},
                           {"logps/chosen", -48.5},   {"logps/rejected", -49.25}};
  MetricsLine eval;  // its evaluation on data.eval, with TRL's eval_ names
  eval.kind = MetricsLine::Kind::kEval;
  eval.step = 1;
  eval.eval_loss = 0.7;
  eval.objective_metrics = {{"eval_rewards/margins", 0.5}, {"eval_logps/chosen", -50.0}};
  MetricsLine sft;
  sft.kind = MetricsLine::Kind::kStep;
  sft.step = 2;
  sft.loss = 2.5;
  std::ofstream(root_ + "/lines.jsonl") << FormatMetricsLine(dpo) << "\n"
                                        << FormatMetricsLine(eval) << "\n"
                                        << FormatMetricsLine(sft) << "\n";
  const std::string trainer = Trainer("cat " + root_ + "/lines.jsonl >> $OUT/metrics.jsonl\nwhile [ ! -e " +
                                      root_ + "/go ]; do sleep 0.02; done\nexit 0\n");
  RecordingSink sink;
  Worker worker(Options(root_ + "/work", trainer));
  ASSERT_TRUE(worker.Init().ok());
  worker.set_sink(&sink);
  worker.OnCommand(Start(1));
  std::map<std::pair<int64_t, bool>, pb::MetricPoint> points;  // by (step, eval_only)
  const auto every_line = [&](const std::vector<pb::WorkerMessage>& ms) {
    points.clear();
    for (const pb::WorkerMessage& m : ms) {
      for (const pb::MetricPoint& p : m.metrics().points()) points[{p.step(), p.eval_only()}] = p;
    }
    return points.size() == 3;
  };
  ASSERT_TRUE(sink.WaitFor(every_line)) << "the three lines were not forwarded";
  std::ofstream(root_ + "/go");
  EXPECT_TRUE(worker.WaitIdle(std::chrono::seconds(10)));
  const auto metrics_of = [&](int64_t step, bool eval_only) {
    const auto& forwarded = points[{step, eval_only}].objective_metrics();
    return std::map<std::string, double>(forwarded.begin(), forwarded.end());
  };
  EXPECT_EQ(metrics_of(1, false), dpo.objective_metrics);
  EXPECT_DOUBLE_EQ((points[{1, false}].loss()), 0.69);
  EXPECT_EQ(metrics_of(1, true), eval.objective_metrics) << "the evaluation's, for ftd to merge into step 1";
  EXPECT_DOUBLE_EQ((points[{1, true}].eval_loss()), 0.7);
  EXPECT_TRUE(metrics_of(2, false).empty()) << "an SFT step has none";
}

TEST_F(WorkerTest, ASecondWorkerOnTheSameWorkDirIsRefusedNamingTheHolder) {
  const std::string trainer = Trainer("exit 0\n");
  Worker first(Options(root_ + "/work", trainer));
  ASSERT_TRUE(first.Init().ok());
  Worker second(Options(root_ + "/work", trainer));
  const Status refused = second.Init(std::chrono::milliseconds(100));
  EXPECT_EQ(refused.code(), Status::Code::kFailedPrecondition) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("in use by another ft-worker (pid " + std::to_string(getpid())));
  EXPECT_THAT(refused.message(), HasSubstr("--work-dir"));
}

// A worker told to stop (SIGTERM: StopAll) whose trainer ignores the stop and SIGTERM (a chat
// template rendering in a long loop): the trainer's process group is SIGKILLed at the stop's
// deadline plus the kill grace, and the attempt is reported ended, so the worker can exit.
TEST_F(WorkerTest, AStoppingWorkersTrainerThatIgnoresTheStopIsKilledAfterTheDeadlineAndReported) {
  const std::string trainer =
      Trainer("trap '' TERM\ntouch " + root_ + "/started\nwhile :; do sleep 0.05; done\n");
  RecordingSink sink;
  Worker worker(Options(root_ + "/work", trainer));
  ASSERT_TRUE(worker.Init().ok());
  worker.set_sink(&sink);
  worker.OnCommand(Start(1));
  for (int i = 0; i < 1000 && !fs::exists(root_ + "/started"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(root_ + "/started"));
  const auto stopped = std::chrono::steady_clock::now();
  worker.StopAll("SIGTERM", 0.3);
  ASSERT_TRUE(worker.WaitIdle(std::chrono::seconds(20))) << "the trainer outlived its stop's deadline";
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  EXPECT_GE(took, 0.6) << "killed before the deadline (0.3 s) + grace (0.3 s)";
  ASSERT_TRUE(sink.WaitFor([](const auto& ms) { return Has(ms, pb::WorkerMessage::kExited); }));
  pb::AttemptExited exit;
  for (const auto& m : sink.messages())
    if (m.has_exited()) exit = m.exited();
  EXPECT_EQ(exit.outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_EQ(exit.exit_code(), 128 + SIGKILL);
  EXPECT_THAT(exit.reason(), HasSubstr("SIGTERM: killed (SIGKILL to its process group)"));
  EXPECT_EQ(exit.credential(), kCredential);
}

}  // namespace
}  // namespace ft::worker
