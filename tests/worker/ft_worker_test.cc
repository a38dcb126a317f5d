// The ft-worker binary against a fake daemon (and a fake metadata server):
// flags, Register, a real ft-train attempt stopped by SIGTERM, an AWS notice,
// and the slot end (refusing starts, stopping a running attempt).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/process.h"
#include "tests/worker/fake_daemon.h"
#include "tests/worker/fake_http_server.h"
#include "tests/worker/process_gone.h"

namespace ft::worker {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using testing_util::Count;
using testing_util::FakeDaemon;
using testing_util::FakeDaemonServer;
using testing_util::FakeHttpServer;
using testing_util::GoneWithin;
using Messages = std::vector<pb::WorkerMessage>;
using ::testing::HasSubstr;

int RunStatus(const std::string& args) {
  const std::string cmd = std::string(FT_WORKER_BIN) + " " + args + " >/dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// One ft-worker process (stderr to `log`), killed at the end of the test.
class WorkerProcess {
 public:
  WorkerProcess(const std::vector<std::string>& args, const std::string& log,
                std::vector<std::string> env = {})
      : proc_(testing_support::Spawn(
            Argv(args), {.log = log, .env = std::move(env), .stdout_to_log = false, .truncate_log = true})) {}
  void Signal(int signo) { proc_->Signal(signo); }
  // The exit code (128 + the signal that killed it), or -1 when it did not exit in time.
  int Wait(std::chrono::seconds timeout) { return proc_->WaitFor(timeout); }
  bool Running() { return proc_->Alive(); }
  std::string Log() { return proc_->Log(); }

 private:
  static std::vector<std::string> Argv(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {FT_WORKER_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  testing_support::ScopedProc proc_;
};

bool HasRegister(const Messages& ms) {
  return Count(ms, [](const pb::WorkerMessage& m) { return m.has_register_(); }) > 0;
}

const pb::AttemptExited* FindExit(const Messages& ms, const std::string& job) {
  for (const auto& m : ms)
    if (m.has_exited() && m.exited().job_id() == job) return &m.exited();
  return nullptr;
}

class FtWorkerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = (fs::path(testing::TempDir()) / "ft-worker-bin").lexically_normal().string();
    fs::remove_all(root_);
    fs::create_directories(root_);
    fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", root_ + "/data.jsonl");
    const std::string cmd = std::string(FT_TRAIN_BIN) + " make-model --preset tiny-llama --out " + root_ +
                            "/model 2> " + root_ + "/make-model.txt";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }

  std::vector<std::string> Args(const FakeDaemonServer& server, const std::string& name) {
    return {"--daemon",     server.address(), "--token",     "tok",        "--id",
            "w-" + name,    "--ft-train",     FT_TRAIN_BIN,  "--work-dir", root_ + "/" + name + "-work",
            "--cpu-memory", "8GiB",           "--log-level", "debug"};
  }

  pb::DaemonCommand Start(const std::string& job, int64_t epoch, int64_t steps) {
    const std::string out = root_ + "/" + job + "-out";
    std::ostringstream yaml;
    yaml << "model: {path: " << root_ << "/model, dtype: fp32}\n"
         << "adapter: {type: lora, r: 8, alpha: 16}\n"
         << "data: {train: " << root_ << "/data.jsonl, format: tokens, seq_len: 64, packing: false}\n"
         << "train: {max_steps: " << steps << ", global_batch_size: 8, lr: 1.0e-2}\n"
         << "checkpoint: {every_steps: 5, keep: 2}\n"
         << "output: {dir: " << out << "}\n";
    pb::DaemonCommand c;
    pb::StartAttempt* s = c.mutable_start();
    s->set_job_id(job);
    s->set_epoch(epoch);
    s->set_spec_yaml(yaml.str());
    s->set_total_steps(steps);
    return c;
  }

  static std::string root_;
};

std::string FtWorkerTest::root_;

TEST_F(FtWorkerTest, BadFlagsExitTwo) {
  EXPECT_EQ(RunStatus(""), 2);  // --daemon is required
  EXPECT_EQ(RunStatus("--daemon no-port"), 2);
  EXPECT_EQ(RunStatus("--daemon 127.0.0.1:1 --cpu-memory lots"), 2);
  EXPECT_EQ(RunStatus("--daemon 127.0.0.1:1 --slot-end soon"), 2);
  EXPECT_EQ(RunStatus("--daemon 127.0.0.1:1 --ft-train /no/such/ft-train"), 2);
  EXPECT_EQ(RunStatus("--daemon 127.0.0.1:1 --no-such-flag"), 2);
  EXPECT_EQ(RunStatus("--help"), 0);
}

TEST_F(FtWorkerTest, SigtermStopsTheAttemptAfterACheckpointReportsAndExitsZero) {
  FakeDaemon daemon(/*heartbeat_ms=*/100);
  FakeDaemonServer server(&daemon);
  WorkerProcess worker(Args(server, "sigterm"), root_ + "/sigterm.log");
  ASSERT_TRUE(daemon.WaitFor(HasRegister)) << worker.Log();
  const pb::Register reg = daemon.messages()[0].register_();
  EXPECT_EQ(reg.worker_id(), "w-sigterm");
  EXPECT_FALSE(reg.version().empty());
  EXPECT_EQ(daemon.authorization(), "Bearer tok");
  ASSERT_EQ(reg.devices_size(), 1);
  EXPECT_EQ(reg.devices(0).kind(), "cpu");
  EXPECT_EQ(reg.devices(0).total_bytes(), int64_t{8} << 30);

  daemon.Push(Start("j-sig", 3, 100000));
  ASSERT_TRUE(daemon.WaitFor(
      [](const Messages& ms) {
        return Count(ms, [](const pb::WorkerMessage& m) {
                 return m.has_heartbeat() && m.heartbeat().progress_size() == 1 &&
                        m.heartbeat().progress(0).step() > 0;
               }) > 0;
      },
      std::chrono::seconds(120)))
      << worker.Log();
  EXPECT_TRUE(fs::exists(root_ + "/sigterm-work/j-sig-e3.yaml"));
  worker.Signal(SIGTERM);
  EXPECT_EQ(worker.Wait(std::chrono::seconds(90)), 0) << worker.Log();

  const Messages ms = daemon.messages();
  const pb::AttemptExited* exit = FindExit(ms, "j-sig");
  ASSERT_NE(exit, nullptr) << worker.Log();
  EXPECT_EQ(exit->epoch(), 3);
  EXPECT_EQ(exit->outcome(), pb::ATTEMPT_PREEMPTED) << exit->reason();
  EXPECT_EQ(exit->reason(), "SIGTERM");
  EXPECT_EQ(exit->exit_code(), 3);
  EXPECT_GT(exit->step(), 0);
  const pb::CheckpointCommitted* last = nullptr;
  for (const auto& m : ms)
    if (m.has_checkpoint()) last = &m.checkpoint();
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->step(), exit->step());
  EXPECT_EQ(last->manifest_sha256().size(), 64u);
  EXPECT_GT(Count(ms, [](const pb::WorkerMessage& m) { return m.has_metrics(); }), 0);
  EXPECT_GT(Count(ms, [](const pb::WorkerMessage& m) { return m.has_log(); }), 0);
}

TEST_F(FtWorkerTest, AnExitReportSurvivesAWorkerRestartThroughItsJournal) {
  FakeDaemon daemon(/*heartbeat_ms=*/100);
  FakeDaemonServer server(&daemon);
  auto worker = std::make_unique<WorkerProcess>(Args(server, "journal"), root_ + "/journal.log");
  ASSERT_TRUE(daemon.WaitFor(HasRegister)) << worker->Log();
  daemon.Push(Start("j-done", 4, 6));
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) { return FindExit(ms, "j-done") != nullptr; },
                             std::chrono::seconds(120)))
      << worker->Log();
  const std::string entry = root_ + "/journal-work/journal/j-done-e4.exit";
  EXPECT_TRUE(fs::exists(entry)) << "journaled before it was sent";
  // The worker dies before the daemon could act on the report: the restarted one replays it.
  worker->Signal(SIGKILL);
  worker->Wait(std::chrono::seconds(10));
  daemon.Clear();
  worker = std::make_unique<WorkerProcess>(Args(server, "journal"), root_ + "/journal2.log");
  ASSERT_TRUE(daemon.WaitFor(HasRegister)) << worker->Log();
  const pb::Register reg = daemon.messages()[0].register_();
  ASSERT_EQ(reg.exited_size(), 1);
  EXPECT_EQ(reg.exited(0).job_id(), "j-done");
  EXPECT_EQ(reg.exited(0).epoch(), 4);
  EXPECT_EQ(reg.exited(0).outcome(), pb::ATTEMPT_FINISHED);
  EXPECT_EQ(reg.exited(0).step(), 6);
  // Acknowledged by Registered: forgotten.
  for (int i = 0; i < 100 && fs::exists(entry); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(fs::exists(entry));
}

TEST_F(FtWorkerTest, AwsNoticeStopsTheWorker) {
  std::atomic<int> polls{0};
  FakeHttpServer aws([&](const FakeHttpServer::Request&) -> std::pair<int, std::string> {
    return ++polls < 4
               ? std::pair<int, std::string>{404, ""}
               : std::pair<int, std::string>{200, R"({"action":"terminate","time":"2099-01-01T00:00:00Z"})"};
  });
  FakeDaemon daemon;
  FakeDaemonServer server(&daemon);
  std::vector<std::string> args = Args(server, "aws");
  args.insert(args.end(), {"--aws-metadata-url", aws.url(), "--notice-poll-ms", "50", "--gcp-metadata-url",
                           "http://127.0.0.1:1"});  // unreachable: logged, never fatal
  WorkerProcess worker(args, root_ + "/aws.log");
  EXPECT_EQ(worker.Wait(std::chrono::seconds(30)), 0) << worker.Log();
  EXPECT_GE(polls.load(), 4);
  EXPECT_THAT(worker.Log(), HasSubstr("AWS spot interruption"));
}

TEST_F(FtWorkerTest, SlotEndStopsTheRunningAttemptAndRefusesNewOnes) {
  FakeDaemon daemon(/*heartbeat_ms=*/100);
  FakeDaemonServer server(&daemon);
  const int64_t now_s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const int64_t end_s = now_s + 16;
  WorkerProcess worker(Args(server, "slot"), root_ + "/slot.log",
                       {"SLURM_JOB_END_TIME=" + std::to_string(end_s)});
  ASSERT_TRUE(daemon.WaitFor(HasRegister)) << worker.Log();
  EXPECT_EQ(daemon.messages()[0].register_().slot_end_ms(), end_s * 1000);
  daemon.Push(Start("j-slot", 1, 100000));
  // Stopped ~10 s before the end (less once a checkpoint was measured), after a checkpoint.
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) { return FindExit(ms, "j-slot") != nullptr; },
                             std::chrono::seconds(60)))
      << worker.Log();
  const pb::AttemptExited exit = *FindExit(daemon.messages(), "j-slot");
  EXPECT_EQ(exit.outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_EQ(exit.reason(), "slot end");
  EXPECT_GT(exit.step(), 0);

  // The worker stays, but starts nothing more.
  daemon.Push(Start("j-late", 1, 10));
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) { return FindExit(ms, "j-late") != nullptr; }))
      << worker.Log();
  const pb::AttemptExited late = *FindExit(daemon.messages(), "j-late");
  EXPECT_EQ(late.outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_EQ(late.reason(), "slot ends too soon");
  EXPECT_TRUE(worker.Running());
  worker.Signal(SIGTERM);
  EXPECT_EQ(worker.Wait(std::chrono::seconds(30)), 0) << worker.Log();
}

// A trainer stuck outside its step loop (here: one that ignores SIGTERM and
// the control channel, with a child of its own) is stopped by the daemon
// (a cancel's CheckpointNow): the worker SIGKILLs its process group at the
// stop's deadline plus the 5 s kill grace, reports the attempt ended, and
// runs the next job (a real ft-train) to the end.
TEST_F(FtWorkerTest, StopOfAStuckTrainerKillsItsProcessGroupAtTheDeadlineAndTheWorkerRunsTheNextJob) {
  const std::string script = root_ + "/stuck-or-real-ft-train.sh", pid_file = root_ + "/stuck-child.pid";
  fs::remove(pid_file);
  std::ofstream(script)
      << "#!/bin/sh\ncase \"$2\" in */j-stuck-*)\n  trap '' TERM\n  sleep 100000 &\n  echo $! > " << pid_file
      << ".tmp && mv " << pid_file << ".tmp " << pid_file << "\n  wait\nesac\nexec " << FT_TRAIN_BIN
      << " \"$@\"\n";
  fs::permissions(script, fs::perms::owner_all);
  FakeDaemon daemon(/*heartbeat_ms=*/100);
  FakeDaemonServer server(&daemon);
  std::vector<std::string> args = Args(server, "stuck");
  *(std::find(args.begin(), args.end(), "--ft-train") + 1) = script;
  WorkerProcess worker(args, root_ + "/stuck.log");
  ASSERT_TRUE(daemon.WaitFor(HasRegister)) << worker.Log();
  daemon.Push(Start("j-stuck", 1, 100000));
  for (int i = 0; i < 3000 && !fs::exists(pid_file); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(pid_file)) << worker.Log();
  pid_t child = 0;
  std::ifstream(pid_file) >> child;
  ASSERT_GT(child, 0);

  pb::DaemonCommand stop;
  stop.mutable_checkpoint_now()->set_job_id("j-stuck");
  stop.mutable_checkpoint_now()->set_epoch(1);
  stop.mutable_checkpoint_now()->set_stop(true);
  stop.mutable_checkpoint_now()->set_deadline_ms(500);
  stop.mutable_checkpoint_now()->set_reason("cancelled");
  const auto sent = std::chrono::steady_clock::now();
  daemon.Push(stop);
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) { return FindExit(ms, "j-stuck") != nullptr; },
                             std::chrono::seconds(30)))
      << "the stuck trainer outlived its stop's deadline\n"
      << worker.Log();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  std::printf("stuck trainer reported ended %.2f s after the stop (deadline 0.5 s + 5 s grace)\n", took);
  EXPECT_GE(took, 5.0);
  EXPECT_LT(took, 15.0);
  const pb::AttemptExited exit = *FindExit(daemon.messages(), "j-stuck");
  EXPECT_EQ(exit.outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_EQ(exit.exit_code(), 128 + SIGKILL);
  EXPECT_THAT(exit.reason(), HasSubstr("cancelled: killed (SIGKILL to its process group)"));
  EXPECT_TRUE(GoneWithin(child, std::chrono::seconds(5))) << "the trainer's child outlived it";

  // The same worker is free: the next job runs to the end.
  daemon.Push(Start("j-next", 1, 3));
  ASSERT_TRUE(daemon.WaitFor([](const Messages& ms) { return FindExit(ms, "j-next") != nullptr; },
                             std::chrono::seconds(120)))
      << worker.Log();
  const pb::AttemptExited next = *FindExit(daemon.messages(), "j-next");
  EXPECT_EQ(next.outcome(), pb::ATTEMPT_FINISHED) << next.reason();
  EXPECT_EQ(next.step(), 3);
}

}  // namespace
}  // namespace ft::worker
