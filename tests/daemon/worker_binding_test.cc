// Attempts bound to their worker (issue #41), through ftd's real gRPC Workers
// service with clients holding the valid worker token: another registered
// worker's forged exit, preemption, progress, metrics, logs and running claim
// for an attempt it was not given are refused with an event naming it, and the
// real worker's attempt and session are untouched (it finishes and is free for
// the next job); a wrong or missing attempt credential is refused even from the
// right worker; a checkpoint outside the job's output.dir (a path elsewhere,
// "..", a symlink out) is refused; a worker reporting more than 64 devices is
// refused.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "common/file_util.h"
#include "daemon/daemon.h"
#include "daemon/grpc_service.h"
#include "engine/io/hf_model.h"
#include "proto/ftune.grpc.pb.h"
#include "tests/daemon/tiny_job.h"
#include "tests/support/temp_dir.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kWorkerToken[] = "worker-token";
constexpr auto kWait = std::chrono::seconds(20);

bool IsStart(const pb::DaemonCommand& c) { return c.has_start(); }
bool IsRefused(const pb::DaemonCommand& c) { return c.has_refused(); }
bool IsAccepted(const pb::DaemonCommand& c) { return c.has_accepted(); }

// One worker's session over gRPC: registers, sends, and waits for the daemon's commands.
class WorkerClient {
 public:
  WorkerClient(pb::Workers::Stub* stub, const std::string& id, int64_t memory = int64_t{8} << 30,
               int devices = 1) {
    ctx_.AddMetadata("authorization", std::string("Bearer ") + kWorkerToken);
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream_ = stub->Session(&ctx_);
    pb::WorkerMessage reg;
    reg.mutable_register_()->set_worker_id(id);
    reg.mutable_register_()->set_hostname("host-" + id);
    reg.mutable_register_()->set_instance("instance-of-" + id);
    for (int i = 0; i < devices; ++i) {
      pb::Device* d = reg.mutable_register_()->add_devices();
      d->set_index(i);
      d->set_kind("cpu");
      d->set_total_bytes(memory);
      d->set_free_bytes(memory);
    }
    EXPECT_TRUE(stream_->Write(reg));
    reader_ = std::thread([this] {
      pb::DaemonCommand c;
      while (stream_->Read(&c)) {
        std::lock_guard<std::mutex> lock(mu_);
        commands_.push_back(c);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      cv_.notify_all();
    });
  }
  ~WorkerClient() {
    ctx_.TryCancel();
    reader_.join();
  }
  void Send(const pb::WorkerMessage& m) { ASSERT_TRUE(stream_->Write(m)); }
  // The first command (from the `from`th on) that satisfies `pred`; nullopt after kWait or the stream's end.
  std::optional<pb::DaemonCommand> WaitFor(const std::function<bool(const pb::DaemonCommand&)>& pred,
                                           size_t from = 0) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<pb::DaemonCommand> found;
    cv_.wait_for(lock, kWait, [&] {
      for (size_t i = from; i < commands_.size(); ++i) {
        if (pred(commands_[i])) {
          found = commands_[i];
          return true;
        }
      }
      return ended_;
    });
    return found;
  }
  std::vector<pb::DaemonCommand> commands() {
    std::lock_guard<std::mutex> lock(mu_);
    return {commands_.begin(), commands_.end()};
  }
  // Whether `n` Refused commands came (within kWait).
  bool WaitForRefusals(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWait, [&] {
      return static_cast<size_t>(std::count_if(commands_.begin(), commands_.end(), IsRefused)) >= n;
    });
  }
  // How the stream ended (after the daemon finished it).
  grpc::Status Finish() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kWait, [&] { return ended_; });
    lock.unlock();
    return stream_->Finish();
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::WorkerMessage, pb::DaemonCommand>> stream_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<pb::DaemonCommand> commands_;  // GUARDED_BY(mu_)
  bool ended_ = false;                      // GUARDED_BY(mu_)
};

// A daemon with one job, served over gRPC with a worker token; w1 (the real worker) runs the job,
// w2 (registered with the same token, 1 MiB: no job fits it) is the forger.
class WorkerBindingTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::FreshDir(testing::UnitTest::GetInstance()->current_test_info()->name());
    testing_support::WriteTinyJobDir(dir_);
    if (HasFatalFailure()) return;
    auto store = Store::Open(dir_ + "/ftd.sqlite");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    DaemonOptions o;
    o.data_dir = dir_ + "/data";
    daemon_ = std::make_unique<Daemon>(std::move(*store), &clock_, o);
    job_ = Submit("one");
    workers_ = MakeWorkersService(daemon_.get(), {.worker_token = kWorkerToken});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(workers_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ && port > 0);
    stub_ = pb::Workers::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
    w1_ = std::make_unique<WorkerClient>(stub_.get(), "w1");
    ASSERT_TRUE(w1_->WaitFor([](const pb::DaemonCommand& c) { return c.has_registered(); }));
    w2_ = std::make_unique<WorkerClient>(stub_.get(), "w2", int64_t{1} << 20);
    ASSERT_TRUE(w2_->WaitFor([](const pb::DaemonCommand& c) { return c.has_registered(); }));
    daemon_->Tick();
    auto start = w1_->WaitFor(IsStart);
    ASSERT_TRUE(start) << "the job was not started on w1";
    start_ = start->start();
    ASSERT_EQ(start_.job_id(), job_);
    ASSERT_EQ(start_.credential().size(), 64u) << "an unguessable credential, not the epoch";
  }

  void TearDown() override {
    w1_.reset();
    w2_.reset();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  std::string Submit(const std::string& name) { return testing_support::SubmitTinyJob(*daemon_, dir_, name); }

  pb::WorkerMessage Exit(pb::AttemptOutcome outcome, const std::string& credential) {
    pb::WorkerMessage m;
    pb::AttemptExited* e = m.mutable_exited();
    e->set_job_id(job_);
    e->set_epoch(start_.epoch());
    e->set_outcome(outcome);
    e->set_step(10);
    e->set_reason("forged");
    e->set_credential(credential);
    return m;
  }
  // A checkpoint directory with a manifest, and its commit report from rank 0 (the real credential).
  pb::WorkerMessage Checkpoint(const std::string& dir, int64_t step) {
    fs::create_directories(dir);
    std::ofstream(dir + "/MANIFEST.json") << "{\"step\": " << step << "}";
    pb::WorkerMessage m;
    pb::CheckpointCommitted* c = m.mutable_checkpoint();
    c->set_job_id(job_);
    c->set_epoch(start_.epoch());
    c->set_step(step);
    c->set_dir(dir);
    c->set_manifest_sha256(*Sha256File(dir + "/MANIFEST.json"));
    c->set_credential(start_.credential());
    return m;
  }
  std::string OutputDir() { return dir_ + "/job/out-one"; }
  // w1 commits a real checkpoint and waits for ftd's acceptance: every message w1 sent before it
  // was handled (one stream is handled in order), and w1 was told nothing else meanwhile.
  void SyncW1(int64_t step) {
    const size_t before = w1_->commands().size();
    w1_->Send(Checkpoint(OutputDir() + "/checkpoints/step-" + std::to_string(step), step));
    ASSERT_TRUE(w1_->WaitFor(IsAccepted, before)) << "w1's real checkpoint was not accepted";
  }
  // The refusal events recorded for worker `id`.
  std::vector<std::string> Refusals(const std::string& id) {
    std::vector<std::string> out;
    auto events = daemon_->ListEvents(pb::ListEventsRequest());
    if (!events.ok()) return out;
    for (const pb::Event& e : events->events()) {
      if (e.kind() == "refused" && e.worker_id() == id) out.push_back(e.message());
    }
    return out;
  }
  pb::Job Job(const std::string& id) { return *daemon_->GetJob(id); }
  // Whether job `id` reaches `state` within kWait (a worker's message is handled on gRPC's thread).
  bool WaitForState(const std::string& id, pb::JobState state) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (Job(id).state() != state) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  void ExpectW1StillRunsTheJob() {
    EXPECT_EQ(Job(job_).state(), pb::RUNNING) << Job(job_).reason();
    auto workers = daemon_->ListWorkers();
    ASSERT_TRUE(workers.ok());
    for (const auto& w : workers->workers()) {
      EXPECT_EQ(w.running_job_id(), w.id() == "w1" ? job_ : "") << w.id();
    }
    for (const auto& c : w1_->commands())
      EXPECT_FALSE(c.has_refused()) << "the real trainer was told to stop";
  }

  std::string dir_;
  SystemClock clock_;
  std::unique_ptr<Daemon> daemon_;
  std::string job_;
  std::unique_ptr<pb::Workers::CallbackService> workers_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Workers::Stub> stub_;
  std::unique_ptr<WorkerClient> w1_, w2_;
  pb::StartAttempt start_;
};

TEST_F(WorkerBindingTest, AnotherWorkersForgedFinishedExitIsRefusedAndTheRealAttemptRunsOn) {
  // Even with the right credential (say it leaked): the attempt is w1's, not w2's.
  for (const std::string& credential : {std::string(), start_.credential()}) {
    const size_t before = w2_->commands().size();
    w2_->Send(Exit(pb::ATTEMPT_FINISHED, credential));
    auto refused = w2_->WaitFor(IsRefused, before);
    ASSERT_TRUE(refused) << "the forger was not told";
    EXPECT_THAT(refused->refused().reason(), HasSubstr("runs on worker 'w1'"));
    EXPECT_THAT(refused->refused().reason(), Not(HasSubstr(start_.credential())));
  }
  ExpectW1StillRunsTheJob();
  const auto refusals = Refusals("w2");
  ASSERT_EQ(refusals.size(), 2u);
  EXPECT_THAT(refusals[0], HasSubstr("exit report (ATTEMPT_FINISHED)"));
  EXPECT_THAT(refusals[0], HasSubstr("from worker 'w2' refused"));
  for (const auto& r : refusals) EXPECT_THAT(r, Not(HasSubstr(start_.credential())));
  // The real worker's exit still ends the attempt as it ended.
  w1_->Send(Exit(pb::ATTEMPT_FINISHED, start_.credential()));
  EXPECT_TRUE(WaitForState(job_, pb::SUCCEEDED)) << Job(job_).reason();
}

TEST_F(WorkerBindingTest, AForgedPreemptionLeavesTheRealWorkerFreeForItsNextJobAfterItFinishes) {
  w2_->Send(Exit(pb::ATTEMPT_PREEMPTED, start_.credential()));
  ASSERT_TRUE(w2_->WaitFor(IsRefused));
  ExpectW1StillRunsTheJob();
  EXPECT_EQ(Job(job_).preemptions(), 0);
  w1_->Send(Exit(pb::ATTEMPT_FINISHED, start_.credential()));
  ASSERT_TRUE(WaitForState(job_, pb::SUCCEEDED)) << Job(job_).reason();
  // w1 is free: the next job (which fits only w1) starts there.
  const std::string next = Submit("two");
  const size_t before = w1_->commands().size();
  daemon_->Tick();
  auto start = w1_->WaitFor(IsStart, before);
  ASSERT_TRUE(start) << "w1 stayed busy";
  EXPECT_EQ(start->start().job_id(), next);
}

TEST_F(WorkerBindingTest, AnotherWorkersForgedProgressMetricsLogsAndNotesAreRefused) {
  const std::string log = *daemon_->LogPath(job_);
  pb::WorkerMessage metrics;
  metrics.mutable_metrics()->set_job_id(job_);
  metrics.mutable_metrics()->set_epoch(start_.epoch());
  metrics.mutable_metrics()->set_credential(start_.credential());
  metrics.mutable_metrics()->add_points()->set_step(99999);
  metrics.mutable_metrics()->mutable_points(0)->set_loss(1e-9);
  pb::WorkerMessage line;
  line.mutable_log()->set_job_id(job_);
  line.mutable_log()->set_epoch(start_.epoch());
  line.mutable_log()->set_credential(start_.credential());
  line.mutable_log()->set_text("\x1b]0;pwned\x07 injected\n");
  pb::WorkerMessage progress;
  pb::Progress* p = progress.mutable_heartbeat()->add_progress();
  p->set_job_id(job_);
  p->set_epoch(start_.epoch());
  p->set_step(99999);
  p->set_loss(1e-9);
  p->set_credential(start_.credential());
  pb::WorkerMessage note;
  note.mutable_note()->set_job_id(job_);
  note.mutable_note()->set_epoch(start_.epoch());
  note.mutable_note()->set_kind("succeeded");
  note.mutable_note()->set_credential(start_.credential());
  for (const pb::WorkerMessage& m : {metrics, line, progress, note}) w2_->Send(m);
  ASSERT_TRUE(w2_->WaitForRefusals(4)) << "the forger was not told of each";
  const pb::Job j = Job(job_);
  EXPECT_EQ(j.steps_done(), 0);
  EXPECT_NE(j.last_loss(), 1e-9);
  auto stored = daemon_->store().ListMetrics(job_, 0, 0);
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(stored->empty()) << "forged metrics were stored";
  std::ifstream in(log);
  EXPECT_THAT(std::string(std::istreambuf_iterator<char>(in), {}), Not(HasSubstr("injected")));
  const auto refusals = Refusals("w2");
  EXPECT_EQ(refusals.size(), 4u) << testing::PrintToString(refusals);
  auto kinds = daemon_->ListEvents(pb::ListEventsRequest());
  for (const pb::Event& e : kinds->events()) EXPECT_NE(e.kind(), "succeeded");
  ExpectW1StillRunsTheJob();
}

TEST_F(WorkerBindingTest, AForgedRunningClaimInARegistrationIsRefusedAndChangesNothing) {
  // A worker registering on a fresh id claims w1's attempt as running here, and replays an exit of it.
  auto forger = [&] {
    pb::WorkerMessage reg;
    pb::Register* r = reg.mutable_register_();
    r->set_worker_id("w4");
    r->set_instance("forger");
    pb::RunningAttempt* a = r->add_running();
    a->set_job_id(job_);
    a->set_epoch(start_.epoch());
    a->set_credential(start_.credential());
    pb::AttemptExited* e = r->add_exited();
    *e = Exit(pb::ATTEMPT_FAILED, start_.credential()).exited();
    return reg;
  }();
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Bearer ") + kWorkerToken);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub_->Session(&ctx);
  ASSERT_TRUE(stream->Write(forger));
  pb::DaemonCommand cmd;
  bool refused = false, registered = false;
  while (!(refused && registered) && stream->Read(&cmd)) {
    refused |= cmd.has_refused();
    registered |= cmd.has_registered();
  }
  EXPECT_TRUE(refused && registered);
  ctx.TryCancel();
  ExpectW1StillRunsTheJob();
  EXPECT_EQ(Job(job_).failures(), 0);
  const auto refusals = Refusals("w4");
  ASSERT_EQ(refusals.size(), 2u) << testing::PrintToString(refusals);
  EXPECT_THAT(refusals[0], HasSubstr("journaled exit"));
  EXPECT_THAT(refusals[1], HasSubstr("running attempt"));
}

TEST_F(WorkerBindingTest, AWrongOrMissingCredentialIsRefusedEvenFromTheRightWorker) {
  std::string wrong = start_.credential();
  wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
  w1_->Send(Exit(pb::ATTEMPT_FINISHED, wrong));
  w1_->Send(Exit(pb::ATTEMPT_FAILED, ""));
  pb::WorkerMessage ckpt = Checkpoint(OutputDir() + "/checkpoints/step-3", 3);
  ckpt.mutable_checkpoint()->set_credential(wrong);
  w1_->Send(ckpt);
  SyncW1(4);
  ExpectW1StillRunsTheJob();  // and w1 was not told to stop: a Refused would kill its real trainer
  EXPECT_EQ(Job(job_).committed_step(), 4);
  const auto refusals = Refusals("w1");
  ASSERT_EQ(refusals.size(), 3u) << testing::PrintToString(refusals);
  EXPECT_THAT(refusals[0], HasSubstr("credential is wrong"));
  EXPECT_THAT(refusals[1], HasSubstr("carries no attempt credential"));
  EXPECT_THAT(refusals[2], HasSubstr("checkpoint step 3"));
}

TEST_F(WorkerBindingTest, ACheckpointOutsideTheJobsOutputDirIsRefusedNamingTheWorker) {
  const std::string elsewhere = dir_ + "/elsewhere";
  fs::create_directories(OutputDir() + "/checkpoints");
  fs::create_directories(elsewhere + "/step-7");
  fs::create_symlink(elsewhere + "/step-7", OutputDir() + "/checkpoints/step-7");
  w1_->Send(Checkpoint(elsewhere + "/step-5", 5));                                // another directory
  w1_->Send(Checkpoint(OutputDir() + "/checkpoints/../../elsewhere/step-6", 6));  // ".." out
  w1_->Send(Checkpoint(OutputDir() + "/checkpoints/step-7", 7));                  // a symlink out
  w1_->Send(Checkpoint(dir_ + "/job/out-one-sibling/step-8", 8));                 // a prefix, not inside
  SyncW1(2);
  EXPECT_EQ(Job(job_).committed_step(), 2);
  const auto refusals = Refusals("w1");
  ASSERT_EQ(refusals.size(), 4u) << testing::PrintToString(refusals);
  for (const auto& r : refusals) {
    EXPECT_THAT(r, HasSubstr("from worker 'w1' refused"));
    EXPECT_THAT(r, HasSubstr("does not lie in the job's output.dir"));
  }
  ExpectW1StillRunsTheJob();
}

TEST_F(WorkerBindingTest, AWorkerReportingMoreThan64DevicesIsRefused) {
  WorkerClient many(stub_.get(), "many", int64_t{1} << 30, 100);
  const grpc::Status why = many.Finish();
  EXPECT_EQ(why.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << why.error_message();
  EXPECT_THAT(why.error_message(), HasSubstr("worker 'many' reports 100 devices (at most 64 per worker)"));
  // A heartbeat of a registered worker listing as many is ignored (the registered devices stand).
  pb::WorkerMessage hb;
  for (int i = 0; i < 100; ++i) {
    pb::Device* d = hb.mutable_heartbeat()->add_devices();
    d->set_index(i);
    d->set_kind("cpu");
  }
  w1_->Send(hb);
  SyncW1(1);
  auto workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  for (const auto& w : workers->workers()) EXPECT_LE(w.devices_size(), 1) << w.id();
}

}  // namespace
}  // namespace ft
