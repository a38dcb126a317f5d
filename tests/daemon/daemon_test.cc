// The daemon's core on simulated time: placement, leases, fencing, slot ends,
// priorities and restart, with fake worker sessions (no gRPC, no processes).
#include "daemon/daemon.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <thread>
#include <tuple>

#include "common/file_util.h"
#include "daemon/webhook_sender.h"
#include "engine/io/hf_model.h"
#include "engine/job/checkpoint_interval.h"
#include "engine/job/completion.h"
#include "engine/job/job_spec.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "tests/support/certificate.h"
#include "tests/support/temp_dir.h"
#include "tests/support/webhook_receiver.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The attempt credentials ftd handed out in this test, by (job, epoch, rank): what a real worker
// echoes in its reports (cleared by each test's SetUp).
std::map<std::tuple<std::string, int64_t, int>, std::string> g_credentials;
std::string Cred(const std::string& job, int64_t epoch, int rank = 0) {
  return g_credentials[{job, epoch, rank}];
}

class FakeSink : public WorkerSink {
 public:
  void Send(const pb::DaemonCommand& cmd) override {
    if (cmd.has_start()) {
      g_credentials[{cmd.start().job_id(), cmd.start().epoch(), cmd.start().rank()}] =
          cmd.start().credential();
    }
    commands.push_back(cmd);
  }
  std::vector<pb::DaemonCommand> commands;
  int Count(pb::DaemonCommand::CmdCase c) const {
    return static_cast<int>(
        std::count_if(commands.begin(), commands.end(), [&](auto& x) { return x.cmd_case() == c; }));
  }
  const pb::DaemonCommand* Last(pb::DaemonCommand::CmdCase c) const {
    for (auto it = commands.rbegin(); it != commands.rend(); ++it) {
      if (it->cmd_case() == c) return &*it;
    }
    return nullptr;
  }
};

class DaemonTest : public testing::Test {
 protected:
  void SetUp() override {
    g_credentials.clear();
    dir_ = testing_support::FreshDir(testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ + "/job");
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, 1);
    ASSERT_TRUE(SaveHfModel(dir_ + "/job/model", model, DType::kF32).ok());
    std::ofstream(dir_ + "/job/data.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";
    Reopen();
  }
  void Reopen(std::vector<std::string> allowed_roots = {}) {
    daemon_.reset();
    auto store = Store::Open(dir_ + "/ftd.sqlite");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    DaemonOptions o;
    o.data_dir = dir_ + "/data";
    o.requeue_backoff_ms = 1000;
    o.allowed_roots = std::move(allowed_roots);
    if (lease_ms_ > 0) o.lease_ms = lease_ms_;
    if (min_runtime_ms_ >= 0) o.min_runtime_ms = min_runtime_ms_;
    o.pool_prices = pool_prices_;
    o.tick_ms = tick_ms_;
    if (stall_min_ms_ >= 0) o.stall_min_ms = stall_min_ms_;
    daemon_ = std::make_unique<Daemon>(std::move(*store), &clock_, o);
  }
  // The test's job, writing `out_dir`.
  pb::SubmitRequest Request(const std::string& out_dir, int priority = 0, const std::string& extra = "",
                            const std::string& train_extra = "") {
    pb::SubmitRequest req;
    req.set_spec_yaml(
        "name: t\nmodel: {path: model, dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n"
        "data: {train: data.jsonl, format: tokens, seq_len: 64}\n"
        "train: {max_steps: 10, global_batch_size: 4" +
        train_extra + "}\nresources: {priority: " + std::to_string(priority) + "}\noutput: {dir: " + out_dir +
        "}\n" + extra);
    req.set_spec_dir(dir_ + "/job");
    return req;
  }
  std::string Submit(int priority = 0, const std::string& extra = "", const std::string& train_extra = "",
                     const Actor& by = {}) {
    auto r = daemon_->Submit(Request(OutputDir(), priority, extra, train_extra), by);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r->job().id();
  }
  void Register(const std::string& id, FakeSink* sink, int64_t memory = int64_t{8} << 30,
                int64_t slot_end = 0, std::vector<std::pair<std::string, int64_t>> running = {},
                std::vector<pb::AttemptExited> exited = {}, const std::string& pool = "", double price = 0) {
    pb::Register reg;
    reg.set_worker_id(id);
    reg.set_pool(pool);
    reg.set_price(price);
    reg.set_slot_end_ms(slot_end);
    pb::Device* d = reg.add_devices();
    d->set_kind("cpu");
    d->set_total_bytes(memory);
    d->set_free_bytes(memory);
    for (auto& [job, epoch] : running) {
      auto* a = reg.add_running();
      a->set_job_id(job);
      a->set_epoch(epoch);
      a->set_credential(Cred(job, epoch));
    }
    for (auto& e : exited) *reg.add_exited() = std::move(e);
    ASSERT_TRUE(daemon_->OnRegister(reg, sink).ok());
  }
  void Heartbeat(const std::string& worker, FakeSink* sink, const std::string& job, int64_t epoch,
                 int64_t step) {
    pb::WorkerMessage m;
    auto* p = m.mutable_heartbeat()->add_progress();
    p->set_job_id(job);
    p->set_epoch(epoch);
    p->set_step(step);
    p->set_credential(Cred(job, epoch));
    daemon_->OnWorkerMessage(worker, sink, m);
  }
  void Exit(const std::string& worker, FakeSink* sink, const std::string& job, int64_t epoch,
            pb::AttemptOutcome o, int64_t step) {
    pb::WorkerMessage m;
    auto* e = m.mutable_exited();
    e->set_job_id(job);
    e->set_epoch(epoch);
    e->set_credential(Cred(job, epoch));
    e->set_outcome(o);
    e->set_step(step);
    e->set_reason("test");
    daemon_->OnWorkerMessage(worker, sink, m);
  }
  pb::Job Job(const std::string& id) { return *daemon_->GetJob(id); }
  // The next job's output.dir (one job per directory): "out" for the test's first, then out-2, out-3...
  std::string OutputDir() { return ++submits_ == 1 ? "out" : "out-" + std::to_string(submits_); }
  // A 3 s lease, a job running on w1, w2 idle: what the stall tests start from. The job's id.
  std::string RunningOnW1WithW2Idle(FakeSink* w1, FakeSink* w2) {
    lease_ms_ = 3'000;
    Reopen();
    const std::string id = Submit();
    Register("w1", w1);
    daemon_->Tick();
    Register("w2", w2);  // idle
    EXPECT_EQ(Job(id).state(), pb::RUNNING);
    return id;
  }
  // After a stall of ftd: every worker alive, job `id` still running, nothing preempted or refused.
  void ExpectNoWorkerLost(const std::string& id, const FakeSink& w1) {
    auto workers = daemon_->ListWorkers();
    ASSERT_TRUE(workers.ok());
    for (const auto& w : workers->workers()) EXPECT_TRUE(w.alive()) << w.id();
    EXPECT_EQ(Job(id).state(), pb::RUNNING);
    EXPECT_EQ(Job(id).preemptions(), 0);
    EXPECT_EQ(w1.Count(pb::DaemonCommand::kRefused), 0);
  }

  std::string dir_;
  int64_t lease_ms_ = 0;                       // 0: DaemonOptions' default
  int64_t min_runtime_ms_ = -1;                // -1: DaemonOptions' default
  std::map<std::string, double> pool_prices_;  // ftd --pool-price
  int64_t tick_ms_ = 0;                        // DaemonOptions::tick_ms (0: no tick is late)
  int submits_ = 0;                            // jobs submitted so far (OutputDir)
  int64_t stall_min_ms_ = -1;                  // -1: DaemonOptions' default
  FakeClock clock_;
  std::unique_ptr<Daemon> daemon_;
};

// A one-tensor checkpoint of attempt epoch 1 at `step`, of the math `hash`, under `root`.
Status WriteTinyCheckpoint(const std::string& root, int64_t step, const std::string& hash,
                           const EvalProgress& evaluation = {}) {
  CheckpointContents c;
  c.state.step = step;
  c.state.job_hash = hash;
  c.state.epoch = 1;
  c.state.evaluation = evaluation;
  c.adapter_config_json = "{}";
  c.model.push_back({"w", {2}, {1, 2}});
  return WriteCheckpoint(root, c);
}

TEST_F(DaemonTest, SubmittedJobStartsOnARegisteredWorkerWithAPlan) {
  std::string id = Submit();
  daemon_->Tick();
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_THAT(Job(id).reason(), HasSubstr("no live worker"));
  FakeSink w1;
  Register("w1", &w1);
  daemon_->Tick();
  ASSERT_EQ(w1.Count(pb::DaemonCommand::kStart), 1);
  const pb::StartAttempt& s = w1.Last(pb::DaemonCommand::kStart)->start();
  EXPECT_EQ(s.job_id(), id);
  EXPECT_EQ(s.epoch(), 1);
  EXPECT_EQ(s.plan().micro_batch() * s.plan().accumulation(), 4);
  EXPECT_THAT(s.spec_yaml(), HasSubstr("micro_batch_size: " + std::to_string(s.plan().micro_batch())));
  EXPECT_THAT(s.spec_yaml(), HasSubstr(dir_ + "/job/model"));
  EXPECT_EQ(Job(id).state(), pb::RUNNING);
  Exit("w1", &w1, id, 1, pb::ATTEMPT_FINISHED, 10);
  EXPECT_EQ(Job(id).state(), pb::SUCCEEDED);
}

TEST_F(DaemonTest, LostLeaseRequeuesAndTheOldEpochIsFencedOff) {
  std::string id = Submit();
  FakeSink w1, w2;
  Register("w1", &w1);
  daemon_->Tick();
  Heartbeat("w1", &w1, id, 1, 4);
  clock_.Advance(10'001);  // the default lease is 10 s
  Register("w2", &w2);
  daemon_->Tick();
  pb::Job j = Job(id);
  EXPECT_EQ(j.state(), pb::QUEUED);
  EXPECT_EQ(j.preemptions(), 1);
  EXPECT_EQ(j.failures(), 0);
  ASSERT_EQ(j.attempts_size(), 1);
  EXPECT_EQ(j.attempts(0).outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("lease expired"));
  EXPECT_EQ(w2.Count(pb::DaemonCommand::kStart), 0) << "requeue backoff";
  clock_.Advance(1'001);
  daemon_->Tick();
  ASSERT_EQ(w2.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_EQ(w2.Last(pb::DaemonCommand::kStart)->start().epoch(), 2);
  // w1 thaws: its progress, checkpoint and exit for epoch 1 are refused and change nothing.
  Heartbeat("w1", &w1, id, 1, 9);
  EXPECT_EQ(w1.Count(pb::DaemonCommand::kRefused), 1);
  pb::WorkerMessage ckpt;
  ckpt.mutable_checkpoint()->set_job_id(id);
  ckpt.mutable_checkpoint()->set_epoch(1);
  ckpt.mutable_checkpoint()->set_step(9);
  daemon_->OnWorkerMessage("w1", &w1, ckpt);
  Exit("w1", &w1, id, 1, pb::ATTEMPT_FINISHED, 10);
  j = Job(id);
  EXPECT_EQ(j.state(), pb::RUNNING);
  EXPECT_EQ(j.committed_step(), 0);
  EXPECT_EQ(j.worker_id(), "w2");
}

TEST_F(DaemonTest, HigherPriorityStartsFirstAndAJobThatDoesNotFitSaysWhy) {
  std::string low = Submit(0), high = Submit(5);
  FakeSink small, big;
  Register("small", &small, 1 << 20);  // 1 MiB: nothing fits
  daemon_->Tick();
  EXPECT_EQ(small.Count(pb::DaemonCommand::kStart), 0);
  EXPECT_THAT(Job(high).reason(), HasSubstr("does not fit: needs"));
  Register("big", &big);
  daemon_->Tick();
  ASSERT_EQ(big.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_EQ(big.Last(pb::DaemonCommand::kStart)->start().job_id(), high);
  EXPECT_EQ(Job(low).state(), pb::QUEUED);
  EXPECT_THAT(Job(low).reason(), HasSubstr("waits"));
}

// A job using memory techniques needs host memory beside the device: on a GPU
// worker whose host has too little free it waits saying so, and starts once a
// heartbeat reports enough; the workers list shows the host memory.
TEST_F(DaemonTest, AJobUsingMemoryTechniquesWaitsForHostMemory) {
  const std::string id = Submit(0, "", ", cpu_offload: true, optimizer: paged_adamw");
  FakeSink gpu;
  pb::Register reg;
  reg.set_worker_id("gpu");
  pb::Device* d = reg.add_devices();
  d->set_kind("cuda");
  d->set_total_bytes(int64_t{80} << 30);
  d->set_free_bytes(int64_t{80} << 30);
  reg.set_host_total_bytes(int64_t{64} << 30);
  reg.set_host_free_bytes(1024);  // 1 KiB: the offloaded weights and moments do not fit
  ASSERT_TRUE(daemon_->OnRegister(reg, &gpu).ok());
  daemon_->Tick();
  EXPECT_EQ(gpu.Count(pb::DaemonCommand::kStart), 0);
  EXPECT_THAT(Job(id).reason(), HasSubstr("of host memory for its memory techniques"));
  auto workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->workers(0).host_total_bytes(), int64_t{64} << 30);
  EXPECT_EQ(workers->workers(0).host_free_bytes(), 1024);

  pb::WorkerMessage m;
  m.mutable_heartbeat()->set_host_total_bytes(int64_t{64} << 30);
  m.mutable_heartbeat()->set_host_free_bytes(int64_t{32} << 30);
  daemon_->OnWorkerMessage("gpu", &gpu, m);
  daemon_->Tick();
  ASSERT_EQ(gpu.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_EQ(gpu.Last(pb::DaemonCommand::kStart)->start().job_id(), id);
}

// A gang member: `devices` CPU devices, an address and rendezvous ports.
void RegisterForRanks(Daemon* daemon, const std::string& id, FakeSink* sink, int devices, bool ports = true) {
  pb::Register reg;
  reg.set_worker_id(id);
  reg.set_address("10.0.0." + id.substr(1));
  if (ports) {
    reg.set_rendezvous_port_first(30000);
    reg.set_rendezvous_port_count(10);
  }
  for (int i = 0; i < devices; ++i) {
    pb::Device* d = reg.add_devices();
    d->set_index(i);
    d->set_kind("cpu");
    d->set_total_bytes(int64_t{8} << 30);
    d->set_free_bytes(int64_t{8} << 30);
  }
  ASSERT_TRUE(daemon->OnRegister(reg, sink).ok());
}

void RankExit(Daemon* daemon, const std::string& worker, FakeSink* sink, const std::string& job,
              int64_t epoch, int rank, pb::AttemptOutcome o, int64_t step) {
  pb::WorkerMessage m;
  auto* e = m.mutable_exited();
  e->set_job_id(job);
  e->set_epoch(epoch);
  e->set_rank(rank);
  e->set_credential(Cred(job, epoch, rank));
  e->set_outcome(o);
  e->set_step(step);
  e->set_reason("rank test");
  daemon->OnWorkerMessage(worker, sink, m);
}

int PortOf(const std::string& host_port) {
  return std::atoi(host_port.substr(host_port.rfind(':') + 1).c_str());
}

StatusOr<pb::SubmitReply> SubmitRanks(Daemon* daemon, const std::string& dir, int ranks,
                                      const std::string& strategy = "ddp") {
  static int submitted = 0;  // each job an output.dir of its own
  pb::SubmitRequest req;
  req.set_spec_yaml(
      "name: t\nmodel: {path: model, dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n"
      "data: {train: data.jsonl, format: tokens, seq_len: 64}\n"
      "train: {max_steps: 10, global_batch_size: 4, micro_batch_size: 1}\nresources: {device: cpu, gpus: " +
      std::to_string(ranks) + "}\ndistributed: {strategy: " + strategy + "}\noutput: {dir: out-ranks-" +
      std::to_string(++submitted) + "}\n");
  req.set_spec_dir(dir + "/job");
  return daemon->Submit(req);
}

// A two-rank job and two one-device workers for it ("w1", "w2"); the job's id ("" if refused).
std::string SubmitGangOfTwo(Daemon* daemon, const std::string& dir, FakeSink* w1, FakeSink* w2) {
  auto submitted = SubmitRanks(daemon, dir, 2);
  EXPECT_TRUE(submitted.ok()) << submitted.status().ToString();
  RegisterForRanks(daemon, "w1", w1, 1);
  RegisterForRanks(daemon, "w2", w2, 1);
  return submitted.ok() ? submitted->job().id() : "";
}

TEST_F(DaemonTest, AGangIsPlacedWholeAcrossWorkersOrWaitsSayingWhy) {
  // FSDP's ranks are placed like DDP's, by their per-rank memory.
  auto fsdp = SubmitRanks(daemon_.get(), dir_, 2, "fsdp");
  ASSERT_TRUE(fsdp.ok()) << fsdp.status().ToString();
  ASSERT_TRUE(daemon_->Cancel(fsdp->job().id()).ok());
  auto submitted = SubmitRanks(daemon_.get(), dir_, 2);
  ASSERT_TRUE(submitted.ok()) << submitted.status().ToString();
  const std::string id = submitted->job().id();
  FakeSink w1, w2, w3;
  RegisterForRanks(daemon_.get(), "w1", &w1, 1);
  daemon_->Tick();
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_THAT(Job(id).reason(), HasSubstr("needs 2 cpu devices (one per rank); the idle workers offer 1"));
  EXPECT_EQ(w1.Count(pb::DaemonCommand::kStart), 0) << "all ranks start or none";
  // A worker without rendezvous ports may hold rank 1, not rank 0.
  RegisterForRanks(daemon_.get(), "w2", &w2, 1, /*ports=*/false);
  daemon_->Tick();
  ASSERT_EQ(w1.Count(pb::DaemonCommand::kStart), 1);
  ASSERT_EQ(w2.Count(pb::DaemonCommand::kStart), 1);
  const pb::StartAttempt& r0 = w1.Last(pb::DaemonCommand::kStart)->start();
  const pb::StartAttempt& r1 = w2.Last(pb::DaemonCommand::kStart)->start();
  EXPECT_EQ(r0.rank(), 0);
  EXPECT_EQ(r1.rank(), 1);
  EXPECT_EQ(r0.epoch(), r1.epoch());
  EXPECT_THAT(r0.rendezvous(), ::testing::StartsWith("10.0.0.1:")) << "rank 0's worker";
  EXPECT_GE(PortOf(r0.rendezvous()), 30000) << "a port of its range";
  EXPECT_LT(PortOf(r0.rendezvous()), 30010);
  EXPECT_EQ(r1.rendezvous(), r0.rendezvous());
  EXPECT_EQ(r0.dist_host(), "10.0.0.1");
  EXPECT_EQ(r1.dist_host(), "10.0.0.2");
  EXPECT_EQ(r0.plan().world(), 2);
  EXPECT_EQ(r0.plan().micro_batch() * r0.plan().accumulation() * 2, 4) << "the global batch is kept";
  pb::Job j = Job(id);
  EXPECT_EQ(j.state(), pb::RUNNING);
  ASSERT_EQ(j.attempts(0).ranks_size(), 2);
  EXPECT_EQ(j.attempts(0).ranks(1).worker_id(), "w2");
  // Both workers are taken: another job waits.
  auto other = SubmitRanks(daemon_.get(), dir_, 1);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  daemon_->Tick();
  EXPECT_THAT(Job(other->job().id()).reason(), HasSubstr("every worker is busy"));
  // One worker with two devices takes a whole gang.
  RegisterForRanks(daemon_.get(), "w3", &w3, 2);
  auto pair = SubmitRanks(daemon_.get(), dir_, 2);
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  daemon_->Tick();
  EXPECT_EQ(w3.Count(pb::DaemonCommand::kStart), 1) << "the one-rank job";
  RankExit(daemon_.get(), "w3", &w3, other->job().id(), 1, 0, pb::ATTEMPT_FINISHED, 10);
  daemon_->Tick();
  ASSERT_EQ(w3.Count(pb::DaemonCommand::kStart), 3);
  EXPECT_EQ(w3.commands[w3.commands.size() - 2].start().device_index(), 0);
  EXPECT_EQ(w3.commands.back().start().device_index(), 1);
  EXPECT_THAT(w3.commands.back().start().rendezvous(), ::testing::StartsWith("10.0.0.3:"));
  EXPECT_EQ(Job(pair->job().id()).state(), pb::RUNNING);
}

TEST_F(DaemonTest, AGangEndsOnItsFirstDecisiveReportAndItsOtherRanksAreStopped) {
  FakeSink w1, w2;
  const std::string id = SubmitGangOfTwo(daemon_.get(), dir_, &w1, &w2);
  ASSERT_FALSE(id.empty());
  auto epoch_on = [&](FakeSink& w) { return w.Last(pb::DaemonCommand::kStart)->start().epoch(); };
  auto refused = [&](const FakeSink& w, int64_t epoch) {
    return std::count_if(w.commands.begin(), w.commands.end(), [&](const pb::DaemonCommand& c) {
      return c.has_refused() && c.refused().job_id() == id && c.refused().epoch() == epoch;
    });
  };
  auto restart = [&] {
    const int port = PortOf(w1.Last(pb::DaemonCommand::kStart)->start().rendezvous());
    clock_.Advance(60'000);
    Heartbeat("w1", &w1, "", 0, 0);
    Heartbeat("w2", &w2, "", 0, 0);
    daemon_->Tick();
    ASSERT_EQ(epoch_on(w1), epoch_on(w2));
    EXPECT_NE(PortOf(w1.Last(pb::DaemonCommand::kStart)->start().rendezvous()), port)
        << "each epoch's rendezvous on another port";
  };
  daemon_->Tick();
  // 1. A rank that lost its peer waits for the others' word; its peer's failure decides.
  int64_t e = epoch_on(w1);
  RankExit(daemon_.get(), "w1", &w1, id, e, 0, pb::ATTEMPT_RANK_LOST, 3);
  EXPECT_EQ(Job(id).state(), pb::RUNNING);
  RankExit(daemon_.get(), "w2", &w2, id, e, 1, pb::ATTEMPT_FAILED, 3);
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_EQ(Job(id).failures(), 1);
  EXPECT_THAT(Job(id).attempts(0).reason(), HasSubstr("rank 1 on w2"));
  // 2. Every rank lost the others: the ranks never reached each other (environment, not counted).
  restart();
  e = epoch_on(w1);
  RankExit(daemon_.get(), "w2", &w2, id, e, 1, pb::ATTEMPT_RANK_LOST, 0);
  RankExit(daemon_.get(), "w1", &w1, id, e, 0, pb::ATTEMPT_RANK_LOST, 0);
  EXPECT_EQ(Job(id).attempts(1).outcome(), pb::ATTEMPT_ENVIRONMENT);
  EXPECT_THAT(Job(id).attempts(1).reason(), HasSubstr("every rank lost the others"));
  EXPECT_EQ(Job(id).failures(), 1);
  // 3. A node is lost (lease): the attempt is preempted and the surviving rank refused.
  restart();
  e = epoch_on(w1);
  clock_.Advance(6'000);
  Heartbeat("w1", &w1, id, e, 5);
  clock_.Advance(5'000);  // w2 silent for 11 s: past the 10 s lease
  daemon_->Tick();
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_EQ(Job(id).attempts(2).outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_THAT(Job(id).attempts(2).reason(), HasSubstr("worker w2 lost"));
  EXPECT_EQ(refused(w1, e), 1);
  EXPECT_EQ(Job(id).failures(), 1);
  // 4. A rank stops after a checkpoint but rank 0 never says so: after two leases the attempt ends.
  RegisterForRanks(daemon_.get(), "w2", &w2, 1);
  restart();
  e = epoch_on(w1);
  RankExit(daemon_.get(), "w2", &w2, id, e, 1, pb::ATTEMPT_PREEMPTED, 4);
  for (int i = 0; i < 21; ++i) {
    EXPECT_EQ(Job(id).state(), pb::RUNNING) << "rank 0 gets two leases to follow";
    clock_.Advance(1'000);
    Heartbeat("w1", &w1, id, e, 4);
    Heartbeat("w2", &w2, "", 0, 0);
    daemon_->Tick();
  }
  EXPECT_EQ(Job(id).attempts(3).outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_THAT(Job(id).attempts(3).reason(), HasSubstr("did not end within 20 s"));
  EXPECT_EQ(refused(w1, e), 1);
  EXPECT_EQ(refused(w2, e), 0) << "its rank had ended";
  // 5. Rank 0 finishing decides: the job succeeded, rank 1 (still running) is stopped.
  restart();
  e = epoch_on(w1);
  RankExit(daemon_.get(), "w1", &w1, id, e, 0, pb::ATTEMPT_FINISHED, 10);
  EXPECT_EQ(Job(id).state(), pb::SUCCEEDED);
  EXPECT_EQ(refused(w2, e), 1);
  EXPECT_EQ(refused(w1, e), 0);
  EXPECT_EQ(Job(id).failures(), 1);
}

TEST_F(DaemonTest, AfterARestartAGangIsReattachedRankByRankAndAMissingRankEndsIt) {
  FakeSink w1, w2;
  const std::string id = SubmitGangOfTwo(daemon_.get(), dir_, &w1, &w2);
  ASSERT_FALSE(id.empty());
  daemon_->Tick();
  ASSERT_EQ(w2.Count(pb::DaemonCommand::kStart), 1);
  Reopen();  // ftd restarted: the gang comes back from the store
  auto reregister = [&](const std::string& worker, FakeSink* sink, std::vector<int> ranks) {
    pb::Register reg;
    reg.set_worker_id(worker);
    reg.set_rendezvous_port_first(30000);
    reg.set_rendezvous_port_count(10);
    reg.add_devices()->set_kind("cpu");
    for (int r : ranks) {
      auto* a = reg.add_running();
      a->set_job_id(id);
      a->set_epoch(1);
      a->set_rank(r);
      a->set_credential(Cred(id, 1, r));
    }
    ASSERT_TRUE(daemon_->OnRegister(reg, sink).ok());
  };
  FakeSink w1_again, w2_again;
  reregister("w1", &w1_again, {0});
  daemon_->Tick();
  EXPECT_EQ(Job(id).state(), pb::RUNNING) << "rank 1's worker has a lease to come back";
  EXPECT_EQ(Job(id).attempts(0).ranks_size(), 2);
  reregister("w2", &w2_again, {});  // back, without its rank
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_THAT(Job(id).attempts(0).reason(), HasSubstr("worker restarted without rank 1"));
  ASSERT_EQ(w1_again.Count(pb::DaemonCommand::kRefused), 1) << "rank 0 is stopped";
  EXPECT_EQ(w1_again.Last(pb::DaemonCommand::kRefused)->refused().epoch(), 1);
  EXPECT_EQ(Job(id).failures(), 0);
}

TEST_F(DaemonTest, FailuresHaveABudgetButPreemptionsDoNot) {
  std::string id = Submit(0, "");
  FakeSink w;
  Register("w", &w);
  for (int i = 0; i < 6; ++i) {  // preemptions: unlimited
    daemon_->Tick();
    const int64_t epoch = w.Last(pb::DaemonCommand::kStart)->start().epoch();
    Exit("w", &w, id, epoch, pb::ATTEMPT_PREEMPTED, 1);
    clock_.Advance(2'000);
  }
  EXPECT_EQ(Job(id).preemptions(), 6);
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  for (int i = 0; i < 4; ++i) {  // max_failures 3: the fourth failure ends it
    clock_.Advance(120'000);
    Heartbeat("w", &w, "", 0, 0);  // keeps the lease
    daemon_->Tick();
    const int64_t epoch = w.Last(pb::DaemonCommand::kStart)->start().epoch();
    Exit("w", &w, id, epoch, pb::ATTEMPT_FAILED, 1);
  }
  EXPECT_EQ(Job(id).state(), pb::FAILED);
  EXPECT_EQ(Job(id).failures(), 4);
}

TEST_F(DaemonTest, BadInputFailsTheJobOnceWithTheReasonInsteadOfRetrying) {
  // A data file gone after submit, a value out of range: ft-train exits 2 and another attempt would
  // fail the same way, so the first one decides, whatever max_failures (3) says.
  std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  ASSERT_EQ(w.Count(pb::DaemonCommand::kStart), 1);
  const int64_t epoch = w.Last(pb::DaemonCommand::kStart)->start().epoch();
  Exit("w", &w, id, epoch, pb::ATTEMPT_BAD_INPUT, 1);
  EXPECT_EQ(Job(id).state(), pb::FAILED);
  EXPECT_EQ(Job(id).attempts_size(), 1);
  EXPECT_THAT(Job(id).reason(), HasSubstr("bad input"));
  clock_.Advance(600'000);
  Heartbeat("w", &w, "", 0, 0);
  daemon_->Tick();
  EXPECT_EQ(w.Count(pb::DaemonCommand::kStart), 1) << "never started again";
}

TEST_F(DaemonTest, EnvironmentFailuresBackOffAndNeverExhaustMaxFailures) {
  std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  int64_t last_wait = 0;
  for (int i = 0; i < 8; ++i) {  // max_failures 3, but an I/O error is not the job's fault
    Heartbeat("w", &w, "", 0, 0);
    daemon_->Tick();
    const int64_t epoch = w.Last(pb::DaemonCommand::kStart)->start().epoch();
    Exit("w", &w, id, epoch, pb::ATTEMPT_ENVIRONMENT, 1);
    EXPECT_EQ(Job(id).state(), pb::QUEUED);
    EXPECT_THAT(Job(id).reason(), HasSubstr("environment error"));
    // It does not start again before its backoff, which grows.
    int64_t waited = 0;
    while (w.Last(pb::DaemonCommand::kStart)->start().epoch() == epoch && waited < 600'000) {
      clock_.Advance(500);
      waited += 500;
      Heartbeat("w", &w, "", 0, 0);
      daemon_->Tick();
    }
    EXPECT_GE(waited, last_wait);
    last_wait = waited;
  }
  EXPECT_EQ(Job(id).failures(), 0);
  EXPECT_GE(last_wait, 60'000) << "the backoff doubles";
  EXPECT_LE(last_wait, 301'000) << "up to 5 minutes";
  // A superseded attempt counts as nothing either.
  const int64_t epoch = w.Last(pb::DaemonCommand::kStart)->start().epoch();
  Exit("w", &w, id, epoch, pb::ATTEMPT_SUPERSEDED, 1);
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_EQ(Job(id).failures(), 0);
  EXPECT_EQ(Job(id).preemptions(), 0);
  EXPECT_EQ(Job(id).attempts(Job(id).attempts_size() - 1).outcome(), pb::ATTEMPT_SUPERSEDED);
}

TEST_F(DaemonTest, ACommitIsAcknowledgedSoTheTrainerKeepsIt) {
  std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  const std::string ckpt = dir_ + "/job/out/checkpoints/step-00000004";
  fs::create_directories(ckpt);
  std::ofstream(ckpt + "/MANIFEST.json") << "{}";
  pb::WorkerMessage m;
  m.mutable_checkpoint()->set_job_id(id);
  m.mutable_checkpoint()->set_epoch(1);
  m.mutable_checkpoint()->set_step(4);
  m.mutable_checkpoint()->set_dir(ckpt);
  m.mutable_checkpoint()->set_manifest_sha256(*Sha256File(ckpt + "/MANIFEST.json"));
  m.mutable_checkpoint()->set_credential(Cred(id, 1));
  daemon_->OnWorkerMessage("w", &w, m);
  EXPECT_EQ(Job(id).committed_step(), 4);
  ASSERT_EQ(w.Count(pb::DaemonCommand::kAccepted), 1);
  EXPECT_EQ(w.Last(pb::DaemonCommand::kAccepted)->accepted().dir(), ckpt);
  EXPECT_EQ(w.Last(pb::DaemonCommand::kAccepted)->accepted().epoch(), 1);
  // How the attempt resumed becomes a job event.
  pb::WorkerMessage note;
  note.mutable_note()->set_job_id(id);
  note.mutable_note()->set_epoch(1);
  note.mutable_note()->set_kind("resume_fallback");
  note.mutable_note()->set_message("committed checkpoint unusable");
  note.mutable_note()->set_credential(Cred(id, 1));
  daemon_->OnWorkerMessage("w", &w, note);
  auto events = daemon_->ListEvents([&] {
    pb::ListEventsRequest r;
    r.set_job_id(id);
    return r;
  }());
  ASSERT_TRUE(events.ok());
  bool seen = false;
  for (const auto& e : events->events()) seen |= e.kind() == "resume_fallback";
  EXPECT_TRUE(seen);
}

// A finished trainer's output, as ft-train leaves it (COMPLETE.json last).
void WriteCompletedOutput(const std::string& spec_dir, const std::string& spec_yaml) {
  auto spec = ParseJobSpec(spec_yaml, spec_dir + "/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  fs::create_directories(spec->output.dir + "/adapter");
  std::ofstream(spec->output.dir + "/adapter/adapter_model.safetensors") << "weights";
  ASSERT_TRUE(WriteCompletion(spec->output.dir, {"j", JobHash(*spec), 1, 10, {}}, {"adapter"}).ok());
}

TEST_F(DaemonTest, ALostAttemptWhoseRunCompletedMakesTheJobSucceedWithoutRerunning) {
  std::string id = Submit();
  FakeSink w1, w2;
  Register("w1", &w1);
  daemon_->Tick();
  Heartbeat("w1", &w1, id, 1, 9);
  // The trainer finished and wrote its outputs; the worker died before reporting it.
  WriteCompletedOutput(dir_ + "/job", Job(id).spec_yaml());
  clock_.Advance(10'001);
  Register("w2", &w2);
  daemon_->Tick();
  pb::Job j = Job(id);
  EXPECT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  EXPECT_EQ(j.steps_done(), 10);
  EXPECT_EQ(j.failures(), 0);
  EXPECT_EQ(w2.Count(pb::DaemonCommand::kStart), 0) << "nothing re-run";
}

TEST_F(DaemonTest, ACompletedOutputOfOtherDataOfTheSameSizeIsNotCalledComplete) {
  // The data file was rewritten in place with the same byte size after that run: its output is stale.
  std::string id = Submit();
  FakeSink w1, w2;
  Register("w1", &w1);
  daemon_->Tick();
  Heartbeat("w1", &w1, id, 1, 9);
  WriteCompletedOutput(dir_ + "/job", Job(id).spec_yaml());
  std::ofstream(dir_ + "/job/data.jsonl", std::ios::trunc) << "{\"input_ids\": [1, 2, 4]}\n";
  clock_.Advance(10'001);
  Register("w2", &w2);
  daemon_->Tick();
  pb::Job j = Job(id);
  EXPECT_NE(j.state(), pb::SUCCEEDED) << "a stale adapter was returned as this job's";
  EXPECT_EQ(j.state(), pb::QUEUED) << j.reason();
}

TEST_F(DaemonTest, ALostAttemptsNewerCheckpointBecomesTheResumePoint) {
  std::string id = Submit();
  FakeSink w1, w2;
  Register("w1", &w1);
  daemon_->Tick();
  auto spec = ParseJobSpec(Job(id).spec_yaml(), dir_ + "/job/job.yaml");
  ASSERT_TRUE(spec.ok());
  // A checkpoint of this job at step 6 whose commit never reached ftd, and one of other math at 8.
  for (auto [step, hash] : std::vector<std::pair<int64_t, std::string>>{{6, JobHash(*spec)}, {8, "other"}}) {
    ASSERT_TRUE(WriteTinyCheckpoint(spec->output.dir + "/checkpoints", step, hash).ok());
  }
  clock_.Advance(10'001);
  Register("w2", &w2);
  daemon_->Tick();
  pb::Job j = Job(id);
  EXPECT_EQ(j.state(), pb::QUEUED);
  EXPECT_EQ(j.committed_step(), 6) << "the newest checkpoint of this job's math";
  clock_.Advance(1'001);
  daemon_->Tick();
  ASSERT_EQ(w2.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_THAT(w2.Last(pb::DaemonCommand::kStart)->start().resume_checkpoint(), HasSubstr("step-00000006"));
  EXPECT_EQ(w2.Last(pb::DaemonCommand::kStart)->start().start_step(), 6) << "progress starts there, not at 0";
}

// A trainer told to stop checkpoints and exits while ftd restarts: its worker replays the exit from
// its journal in its Register, ahead of the checkpoint reports still queued behind it (they follow
// the registration; e2e_chaos_test saw a scheduler stop "lose" 36 steps so). ftd takes the stop's
// checkpoint from output.dir: the attempt loses no step and the job resumes where it stopped.
TEST_F(DaemonTest, AnExitReplayedAheadOfItsCheckpointReportsResumesWhereTheAttemptStopped) {
  const std::string id = Submit();
  FakeSink w1, again;
  Register("w1", &w1);
  daemon_->Tick();
  ASSERT_EQ(w1.Count(pb::DaemonCommand::kStart), 1);
  auto spec = ParseJobSpec(Job(id).spec_yaml(), dir_ + "/job/job.yaml");
  ASSERT_TRUE(spec.ok());
  ASSERT_TRUE(WriteTinyCheckpoint(spec->output.dir + "/checkpoints", 7, JobHash(*spec)).ok());
  Reopen();
  pb::AttemptExited e;
  e.set_job_id(id);
  e.set_epoch(1);
  e.set_credential(Cred(id, 1));
  e.set_outcome(pb::ATTEMPT_PREEMPTED);
  e.set_step(7);
  e.set_reason("preempted: job j-000009 of a higher priority class needs its devices");
  Register("w1", &again, int64_t{8} << 30, 0, {}, {e});
  const pb::Job j = Job(id);
  EXPECT_EQ(j.state(), pb::QUEUED);
  EXPECT_EQ(j.committed_step(), 7) << "the stop's checkpoint is the resume point";
  ASSERT_EQ(j.attempts_size(), 1);
  EXPECT_EQ(j.attempts(0).steps_lost(), 0);
  EXPECT_EQ(j.attempts(0).outcome(), pb::ATTEMPT_PREEMPTED);
}

// A run that early stopping ended succeeds with the trainer's reason, whether its worker reported the
// exit or ftd found its COMPLETE.json after losing the attempt: ftctl status shows the job's reason.
TEST_F(DaemonTest, ARunThatStoppedEarlySucceedsSayingWhyReportedOrReconciled) {
  const std::string why =
      "early stopping: eval_loss did not improve by more than 0 for 3 evaluations; "
      "best 2.9129 at step 6";
  FakeSink w1, w2;
  Register("w1", &w1);
  const std::string reported = Submit();
  daemon_->Tick();
  pb::WorkerMessage m;
  pb::AttemptExited* e = m.mutable_exited();
  e->set_job_id(reported);
  e->set_epoch(1);
  e->set_credential(Cred(reported, 1));
  e->set_outcome(pb::ATTEMPT_FINISHED);
  e->set_step(8);
  e->set_reason(why);
  daemon_->OnWorkerMessage("w1", &w1, m);
  EXPECT_EQ(Job(reported).state(), pb::SUCCEEDED);
  EXPECT_EQ(Job(reported).reason(), why);
  EXPECT_EQ(Job(reported).steps_done(), 8);

  const std::string lost = Submit();
  daemon_->Tick();
  Heartbeat("w1", &w1, lost, 1, 7);
  auto spec = ParseJobSpec(Job(lost).spec_yaml(), dir_ + "/job/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  fs::create_directories(spec->output.dir + "/adapter");
  std::ofstream(spec->output.dir + "/adapter/adapter_model.safetensors") << "weights";
  CompletionRecord record{"j", JobHash(*spec), 1, 8, {}};
  record.stop_reason = why;
  ASSERT_TRUE(WriteCompletion(spec->output.dir, record, {"adapter"}).ok());
  clock_.Advance(10'001);
  Register("w2", &w2);
  daemon_->Tick();
  pb::Job j = Job(lost);
  EXPECT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  EXPECT_THAT(j.reason(), StartsWith(why));
  EXPECT_EQ(j.steps_done(), 8);
}

// checkpoint.keep_best leaves the best checkpoint behind the newest: ftd's reconciliation of a lost
// attempt moves the resume point to the newest (never back to the best), leaves the best in place
// and says which it is.
TEST_F(DaemonTest, ReconcilingALostAttemptResumesFromTheNewestAndKeepsTheBestCheckpoint) {
  std::string id = Submit();
  FakeSink w1, w2;
  Register("w1", &w1);
  daemon_->Tick();
  auto spec = ParseJobSpec(Job(id).spec_yaml(), dir_ + "/job/job.yaml");
  ASSERT_TRUE(spec.ok());
  const std::string root = spec->output.dir + "/checkpoints";
  for (int64_t step : {4, 8}) {  // the best evaluation was step 4's; step 8 is the newest
    ASSERT_TRUE(
        WriteTinyCheckpoint(root, step, JobHash(*spec), {"eval_loss", step, 4, 1.25, step == 8 ? 2 : 0, ""})
            .ok());
  }
  clock_.Advance(10'001);
  Register("w2", &w2);
  daemon_->Tick();
  EXPECT_EQ(Job(id).committed_step(), 8) << "the resume point is the newest checkpoint";
  EXPECT_TRUE(fs::exists(root + "/step-00000004/MANIFEST.json")) << "the best checkpoint is kept";
  auto best = BestCheckpoint(root);
  ASSERT_TRUE(best.ok()) << best.status().ToString();
  EXPECT_EQ(best->step, 4);
  auto events = daemon_->ListEvents([&] {
    pb::ListEventsRequest r;
    r.set_job_id(id);
    return r;
  }());
  ASSERT_TRUE(events.ok());
  std::string reconciled;
  for (const auto& e : events->events())
    if (e.kind() == "reconciled") reconciled = e.message();
  EXPECT_THAT(reconciled, HasSubstr("resume point moved to step 8"));
  EXPECT_THAT(reconciled, HasSubstr("the best checkpoint (step 4, eval_loss 1.25) stays beside it"));
}

// checkpoint.every auto's M (engine/job/checkpoint_interval.h): the first attempt gets the
// 1-hour prior; after a worker last heard 20 s into its attempt is found lost at 30 s, the next
// gets 20 s (that attempt's time alive over its one preemption), also from a restarted ftd, which
// reads the history from SQLite. The lost attempt's time until ftd knew, without a step, is
// restart overhead in the job's goodput.
TEST_F(DaemonTest, EachAttemptCarriesTheMeanTimeBetweenPreemptionsAndGoodputSplitsItsTime) {
  std::string id = Submit();
  FakeSink w1, w2, w3;
  Register("w1", &w1);
  daemon_->Tick();
  ASSERT_EQ(w1.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_EQ(w1.Last(pb::DaemonCommand::kStart)->start().mtbf_seconds(), kPriorMtbfSeconds);
  clock_.Advance(20'000);
  Heartbeat("w1", &w1, id, 1, 0);
  clock_.Advance(10'001);  // the lease (10 s) passes: w1 is lost 30.001 s after the start
  Register("w2", &w2);
  daemon_->Tick();
  pb::Job j = Job(id);
  ASSERT_EQ(j.preemptions(), 1) << j.reason();
  EXPECT_NEAR(j.attempts(0).goodput().restart_s(), 30.001, 1e-9) << "no step: all of it was starting";
  EXPECT_EQ(j.attempts(0).goodput().lost_s(), 0);
  EXPECT_NEAR(j.goodput().device().restart_s(), 30.001, 1e-9);
  EXPECT_EQ(j.goodput().goodput(), 0) << "nothing productive yet";
  EXPECT_NEAR(daemon_->goodput_total().restart_s, 30.001, 1e-9) << "/metrics' counter";
  const Store::AttemptTotals history = daemon_->attempt_history()["default"];
  EXPECT_NEAR(MeanTimeBetweenPreemptions(history.seconds, history.preemptions), 20.0, 1e-9)
      << "/metrics' gauge: until its last heartbeat";
  EXPECT_NEAR(history.device.restart_s, 30.001, 1e-9) << "the pool's goodput";
  Reopen();  // ftd restarts: M comes from the attempts table
  Register("w3", &w3);
  clock_.Advance(1'001);
  daemon_->Tick();
  const pb::DaemonCommand* start = w3.Last(pb::DaemonCommand::kStart);
  if (start == nullptr) start = w2.Last(pb::DaemonCommand::kStart);
  ASSERT_NE(start, nullptr);
  EXPECT_NEAR(start->start().mtbf_seconds(), 20.0, 1e-9);
  EXPECT_NEAR(Job(id).goodput().queue_s(), 1.001, 1e-9) << "lost at 30.001 s, started again 1.001 s later";
}

// M is kept per worker pool (ft-worker --pool): a loss in pool "spot" sets the next spot attempt's
// M to that attempt's time alive, while an attempt started in pool "ondemand" keeps the prior; the
// pools' histories come back from SQLite after a restart. A malformed pool name is refused.
TEST_F(DaemonTest, MeanTimeBetweenPreemptionsIsKeptPerWorkerPool) {
  const std::string id = Submit();
  Submit();
  FakeSink w1, w2, w3;
  Register("w1", &w1, int64_t{8} << 30, 0, {}, {}, "spot");
  daemon_->Tick();
  ASSERT_EQ(w1.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_EQ(w1.Last(pb::DaemonCommand::kStart)->start().mtbf_seconds(), kPriorMtbfSeconds);
  clock_.Advance(30'000);
  Heartbeat("w1", &w1, id, 1, 0);  // last heard 30 s after the start
  clock_.Advance(10'001);          // then nothing for its lease (10 s): lost
  Register("w2", &w2, int64_t{8} << 30, 0, {}, {}, "ondemand");
  Register("w3", &w3, int64_t{8} << 30, 0, {}, {}, "spot");
  daemon_->Tick();
  clock_.Advance(1'001);  // the requeue backoff
  daemon_->Tick();
  ASSERT_EQ(w2.Count(pb::DaemonCommand::kStart), 1);
  ASSERT_EQ(w3.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_EQ(w2.Last(pb::DaemonCommand::kStart)->start().mtbf_seconds(), kPriorMtbfSeconds)
      << "no preemption in pool ondemand";
  EXPECT_NEAR(w3.Last(pb::DaemonCommand::kStart)->start().mtbf_seconds(), 30.0, 1e-9) << "pool spot's loss";
  auto history = daemon_->attempt_history();
  EXPECT_EQ(history["spot"].preemptions, 1);
  EXPECT_EQ(history["spot"].attempts, 1);
  EXPECT_EQ(history["ondemand"].attempts, 0) << "no attempt has ended there";
  Reopen();
  history = daemon_->attempt_history();
  EXPECT_EQ(history["spot"].preemptions, 1) << "from SQLite";
  EXPECT_NEAR(history["spot"].seconds, 30.0, 1e-9) << "alive until its last heartbeat";
  EXPECT_NEAR(history["spot"].device.restart_s, 40.001, 1e-9) << "its stored split: until ftd knew";

  pb::Register bad;
  bad.set_worker_id("w4");
  bad.set_pool("spot pool/../x");
  FakeSink w4;
  const Status refused = daemon_->OnRegister(bad, &w4);
  EXPECT_TRUE(refused.IsInvalidArgument()) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("ft-worker --pool"));
}

// Notice catch rate: a notice that reached the worker (its heartbeat or its exit report) is kept
// with the attempt it ended; caught when no step was lost. Attempt 1 stops at once after its
// notice (nothing lost: caught); attempt 2's node is lost after the notice with 5 steps done since
// the last checkpoint (not caught). Both survive a restart of ftd.
TEST_F(DaemonTest, PreemptionNoticesAreKeptWithTheirAttemptsAndCountedCaughtWhenNothingWasLost) {
  std::string id = Submit();
  FakeSink w1;
  Register("w1", &w1);
  daemon_->Tick();
  pb::WorkerMessage exit;
  pb::AttemptExited* e = exit.mutable_exited();
  e->set_job_id(id);
  e->set_epoch(1);
  e->set_outcome(pb::ATTEMPT_PREEMPTED);
  e->set_reason("GCP preemption");
  e->set_credential(Cred(id, 1));
  e->set_notice_ms(clock_.WallMs() - 5);
  daemon_->OnWorkerMessage("w1", &w1, exit);
  clock_.Advance(1'001);
  daemon_->Tick();
  ASSERT_EQ(w1.Count(pb::DaemonCommand::kStart), 2) << "the next attempt, on the same worker";
  pb::WorkerMessage hb;
  auto* p = hb.mutable_heartbeat()->add_progress();
  p->set_job_id(id);
  p->set_epoch(2);
  p->set_step(5);
  p->set_credential(Cred(id, 2));
  hb.mutable_heartbeat()->set_notice_ms(clock_.WallMs());
  daemon_->OnWorkerMessage("w1", &w1, hb);
  clock_.Advance(10'001);  // w1 is lost before it reports anything more
  daemon_->Tick();
  Reopen();
  pb::Job j = Job(id);
  ASSERT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(j.attempts(1).steps_lost(), 5);
  EXPECT_EQ(j.goodput().notices(), 2);
  EXPECT_EQ(j.goodput().notices_caught(), 1);
}

TEST_F(DaemonTest, AnExitReplayedFromTheWorkersJournalEndsTheAttemptAsItEnded) {
  std::string id = Submit();
  FakeSink w, again;
  Register("w", &w);
  daemon_->Tick();
  Heartbeat("w", &w, id, 1, 9);
  // The worker restarted before its exit report reached ftd; its Register carries the journal.
  pb::AttemptExited e;
  e.set_job_id(id);
  e.set_epoch(1);
  e.set_outcome(pb::ATTEMPT_FINISHED);
  e.set_step(10);
  e.set_credential(Cred(id, 1));
  Register("w", &again, int64_t{8} << 30, 0, {}, {e});
  pb::Job j = Job(id);
  EXPECT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  EXPECT_EQ(j.preemptions(), 0) << "not treated as lost";
  EXPECT_EQ(j.attempts(0).outcome(), pb::ATTEMPT_FINISHED);
  // Replayed again (a second restart): already known, changes nothing.
  Register("w", &again, int64_t{8} << 30, 0, {}, {e});
  EXPECT_EQ(Job(id).state(), pb::SUCCEEDED);
}

TEST_F(DaemonTest, SlotEndStopsWithACheckpointAndShortSlotsGetNoWork) {
  std::string id = Submit();
  FakeSink w;
  Register("w", &w, int64_t{8} << 30, clock_.WallMs() + 30'000);  // slot shorter than min_slot (60 s)
  daemon_->Tick();
  EXPECT_EQ(w.Count(pb::DaemonCommand::kStart), 0);
  EXPECT_THAT(Job(id).reason(), HasSubstr("slot ends"));
  FakeSink v;
  Register("v", &v, int64_t{8} << 30, clock_.WallMs() + 120'000);
  daemon_->Tick();
  ASSERT_EQ(v.Count(pb::DaemonCommand::kStart), 1) << Job(id).reason();
  // No checkpoint measured yet: the time is estimated from the job's size
  // (about 1 s for this tiny adapter), so the stop comes at about
  // end - (1.5 x 1 s + 5 s margin) = end - 6.5 s.
  clock_.Advance(110'000);  // 10 s left: not yet
  Heartbeat("v", &v, id, 1, 3);
  daemon_->Tick();
  EXPECT_EQ(v.Count(pb::DaemonCommand::kCheckpointNow), 0);
  clock_.Advance(4'000);  // 6 s left
  Heartbeat("v", &v, id, 1, 4);
  daemon_->Tick();
  ASSERT_EQ(v.Count(pb::DaemonCommand::kCheckpointNow), 1);
  const pb::CheckpointNow& c = v.Last(pb::DaemonCommand::kCheckpointNow)->checkpoint_now();
  EXPECT_TRUE(c.stop());
  EXPECT_EQ(c.reason(), "slot end");
}

TEST_F(DaemonTest, AnUrgentJobPreemptsTheLowestClassThroughACheckpointStopAndTakesItsWorker) {
  min_runtime_ms_ = 35'000;  // reached 5 s after the urgent job's first pass: before the 10 s full pass
  Reopen();
  const std::string low = Submit(0);
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  ASSERT_EQ(w.Count(pb::DaemonCommand::kStart), 1);
  clock_.Advance(30'000);
  Heartbeat("w", &w, low, 1, 3);
  const std::string urgent = Submit(10);
  daemon_->Tick();
  EXPECT_EQ(w.Count(pb::DaemonCommand::kCheckpointNow), 0) << "younger than min_runtime: never preempted";
  clock_.Advance(5'000);  // min_runtime reached: a pass runs then, though no input changed
  daemon_->Tick();
  ASSERT_EQ(w.Count(pb::DaemonCommand::kCheckpointNow), 1) << Job(urgent).reason();
  const pb::CheckpointNow& c = w.Last(pb::DaemonCommand::kCheckpointNow)->checkpoint_now();
  EXPECT_TRUE(c.stop());
  EXPECT_EQ(c.job_id(), low);
  EXPECT_THAT(c.reason(), HasSubstr("preempted: job " + urgent + " of a higher priority class"));
  EXPECT_THAT(Job(urgent).reason(), HasSubstr("preempting"));
  daemon_->Tick();
  EXPECT_EQ(w.Count(pb::DaemonCommand::kCheckpointNow), 1) << "chosen once while it stops";
  // The trainer checkpoints and exits: the victim requeues, the urgent job takes the worker.
  Exit("w", &w, low, 1, pb::ATTEMPT_PREEMPTED, 4);
  EXPECT_EQ(Job(low).state(), pb::QUEUED);
  clock_.Advance(1'000);
  daemon_->Tick();
  ASSERT_EQ(w.Count(pb::DaemonCommand::kStart), 2);
  EXPECT_EQ(w.Last(pb::DaemonCommand::kStart)->start().job_id(), urgent);
  // A scheduler preemption is not the pool's: the next start's M counts none.
  EXPECT_THAT(daemon_->ListEvents({})->events().rbegin()->message(), HasSubstr("from 0 in"));
  EXPECT_EQ(Job(low).preemptions(), 1);
  EXPECT_EQ(Job(low).goodput().scheduler_preemptions(), 1) << "counted apart from node losses";
  Reopen();  // the attempt keeps whom it was stopped for: the pool's history from SQLite agrees
  EXPECT_EQ(daemon_->attempt_history()["default"].preemptions, 0);
  EXPECT_EQ(Job(low).goodput().scheduler_preemptions(), 1);
}

TEST_F(DaemonTest, ATeamBelowItsQuotaReclaimsTheDeviceAnotherTeamBorrowed) {
  min_runtime_ms_ = 0;
  Reopen();
  ASSERT_TRUE(daemon_->SetTeam({"admin", ""}, "vision", {.quota_devices = 1}).ok());
  ASSERT_TRUE(daemon_->SetTeam({"admin", ""}, "nlp", {.quota_devices = 1}).ok());
  FakeSink w1, w2;
  Register("w1", &w1);
  Register("w2", &w2);
  const Actor nlp{"nina", "nlp"}, vision{"victor", "vision"};
  const std::string first = Submit(0, "", "", nlp);
  const std::string second = Submit(0, "", "", nlp);
  daemon_->Tick();
  ASSERT_EQ(w1.Count(pb::DaemonCommand::kStart) + w2.Count(pb::DaemonCommand::kStart), 2)
      << "nlp borrows vision's idle device";
  auto teams = daemon_->ListTeams();
  ASSERT_TRUE(teams.ok()) << teams.status().ToString();
  ASSERT_EQ(teams->size(), 2u);
  EXPECT_EQ((*teams)[0].name, "nlp");
  EXPECT_EQ((*teams)[0].running_devices, 2);
  EXPECT_EQ((*teams)[0].borrowed_devices, 1);
  const std::string mine = Submit(0, "", "", vision);
  clock_.Advance(1'000);
  daemon_->Tick();
  // The borrowed job (the second placed) is stopped for vision's; nlp's nominal one keeps running.
  const int stops = w1.Count(pb::DaemonCommand::kCheckpointNow) + w2.Count(pb::DaemonCommand::kCheckpointNow);
  ASSERT_EQ(stops, 1) << Job(mine).reason();
  FakeSink& victim_worker = w1.Count(pb::DaemonCommand::kCheckpointNow) ? w1 : w2;
  const pb::CheckpointNow& c = victim_worker.Last(pb::DaemonCommand::kCheckpointNow)->checkpoint_now();
  EXPECT_THAT(c.reason(), HasSubstr("team vision reclaims the devices it lent"));
  const std::string victim = c.job_id();
  EXPECT_TRUE(victim == first || victim == second);
  Exit(&victim_worker == &w1 ? "w1" : "w2", &victim_worker, victim, 1, pb::ATTEMPT_PREEMPTED, 2);
  clock_.Advance(1'000);
  daemon_->Tick();
  EXPECT_EQ(victim_worker.Last(pb::DaemonCommand::kStart)->start().job_id(), mine);
  EXPECT_EQ(Job(victim).state(), pb::QUEUED);
}

// Money (issue #44): an attempt is priced when it starts at its worker's price per device-hour
// (ftd's --pool-price for the worker's pool over the worker's own --price); a job's cost is its
// attempts' device-seconds at those prices, split like its goodput; a team's spend is its jobs'
// (running ones up to now) and comes back from SQLite after a restart. Once the spend reaches the
// team's budget its users' submits are refused, naming the spend, the budget and the fix; another
// team is not affected, and a raised budget admits them again.
TEST_F(DaemonTest, AttemptsArePricedWhenTheyStartAndATeamPastItsBudgetCannotSubmit) {
  pool_prices_ = {{"ondemand", 3.0}};
  Reopen();
  const Actor nina{"nina", "nlp"}, victor{"victor", "vision"};
  ASSERT_TRUE(daemon_->SetTeam({"admin", ""}, "nlp", {.budget = 2.0}).ok());
  const std::string a = Submit(0, "", "", nina);
  const std::string b = Submit(0, "", "", nina);
  FakeSink w1, w2;
  Register("w1", &w1, int64_t{8} << 30, 0, {}, {}, "spot", 1.5);      // its own price
  Register("w2", &w2, int64_t{8} << 30, 0, {}, {}, "ondemand", 1.0);  // the pool's price wins
  daemon_->Tick();
  ASSERT_EQ(w1.Count(pb::DaemonCommand::kStart) + w2.Count(pb::DaemonCommand::kStart), 2);
  const std::string on_w1 = w1.Last(pb::DaemonCommand::kStart)->start().job_id();
  const std::string on_w2 = on_w1 == a ? b : a;
  const auto pass = [&](int64_t ms) {
    clock_.Advance(ms);
    Heartbeat("w1", &w1, on_w1, 1, 0);
    Heartbeat("w2", &w2, on_w2, 1, 0);
  };
  pass(1'200'000);  // 20 minutes: $0.50 on w1, $1.00 on w2
  EXPECT_DOUBLE_EQ(Job(on_w1).attempts(0).price(), 1.5);
  EXPECT_DOUBLE_EQ(Job(on_w2).attempts(0).price(), 3.0);
  EXPECT_NEAR(Job(on_w1).goodput().cost().total(), 0.5, 1e-9);
  EXPECT_NEAR(Job(on_w2).goodput().cost().total(), 1.0, 1e-9);
  EXPECT_NEAR(Job(on_w2).goodput().cost().restart(), 1.0, 1e-9) << "no step yet: all of it starting";
  const auto nlp_team = [&]() {
    auto teams = daemon_->ListTeams();
    EXPECT_TRUE(teams.ok()) << teams.status().ToString();
    for (const TeamInfo& t : *teams)
      if (t.name == "nlp") return t;
    return TeamInfo{};
  };
  EXPECT_NEAR(nlp_team().spend, 1.5, 1e-9);
  EXPECT_EQ(nlp_team().budget, std::optional<double>(2.0));
  Submit(0, "", "", nina);  // $1.50 of $2.00: admitted
  pass(600'000);            // 10 minutes more: $2.25
  const pb::SubmitRequest req = Request("out-budget");
  auto refused = daemon_->Submit(req, nina);
  ASSERT_TRUE(refused.status().code() == Status::Code::kFailedPrecondition) << refused.status().ToString();
  EXPECT_THAT(refused.status().message(), HasSubstr("team nlp has spent $2.25 of its budget of $2.00"));
  EXPECT_THAT(refused.status().message(), HasSubstr("ftctl admin team set nlp --budget"));
  Submit(0, "", "", victor);  // vision has no budget
  Exit("w1", &w1, on_w1, 1, pb::ATTEMPT_FINISHED, 10);
  Exit("w2", &w2, on_w2, 1, pb::ATTEMPT_FINISHED, 10);
  EXPECT_NEAR(daemon_->attempt_history()["spot"].cost.total(), 0.75, 1e-9) << "the pool's cost";
  Reopen();  // ftd restarts: the ended attempts' costs come from the attempts table
  EXPECT_NEAR(nlp_team().spend, 2.25, 1e-9);
  EXPECT_NEAR(Job(on_w1).goodput().cost().total(), 0.75, 1e-9);
  EXPECT_NEAR(Job(on_w2).goodput().cost().total(), 1.5, 1e-9);
  EXPECT_TRUE(daemon_->Submit(req, nina).status().code() == Status::Code::kFailedPrecondition)
      << "still past the budget";
  ASSERT_TRUE(daemon_->SetTeam({"admin", ""}, "nlp", {.budget = 5.0}).ok());
  EXPECT_TRUE(daemon_->Submit(req, nina).ok()) << "the raised budget admits it";
}

// A team's cap on queued jobs (ftctl admin team set --max-queued): a submit past it is refused with
// the cap and the fix, other teams are not affected, and a queued job that ends makes room.
TEST_F(DaemonTest, ATeamsCapOnQueuedJobsRefusesTheSubmitPastIt) {
  const Actor nina{"nina", "nlp"}, victor{"victor", "vision"};
  ASSERT_TRUE(daemon_->SetTeam({"admin", ""}, "nlp", {.max_queued = 2}).ok());
  const std::string first = Submit(0, "", "", nina);
  Submit(0, "", "", nina);
  const pb::SubmitRequest req = Request("out-capped");
  auto refused = daemon_->Submit(req, nina);
  ASSERT_TRUE(refused.status().code() == Status::Code::kFailedPrecondition) << refused.status().ToString();
  EXPECT_THAT(refused.status().message(), HasSubstr("team nlp has 2 jobs queued, its cap"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--max-queued"));
  Submit(0, "", "", victor);
  ASSERT_TRUE(daemon_->Cancel(first, nina).ok());
  EXPECT_TRUE(daemon_->Submit(req, nina).ok()) << "the cancelled job made room";
}

// The teams' fair-share usage survives a restart of ftd: it is rebuilt from the attempts' spans in
// SQLite (each device-second decayed since), so a team that used the cluster is not treated as new.
TEST_F(DaemonTest, TeamUsageIsRebuiltFromTheAttemptsWhenFtdRestarts) {
  const Actor nina{"nina", "nlp"};
  const std::string id = Submit(0, "", "", nina);
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  ASSERT_EQ(w.Count(pb::DaemonCommand::kStart), 1);
  clock_.Advance(1'800'000);
  Heartbeat("w", &w, id, 1, 0);
  Exit("w", &w, id, 1, pb::ATTEMPT_FINISHED, 10);
  clock_.Advance(600'000);
  const auto usage = [&]() {
    auto teams = daemon_->ListTeams();
    EXPECT_TRUE(teams.ok());
    for (const TeamInfo& t : *teams)
      if (t.name == "nlp") return t.usage_device_seconds;
    return -1.0;
  };
  const double before = usage();
  // 1,800 device-seconds with a 1 h half life, read 10 minutes after they ended.
  EXPECT_NEAR(before, 3600 / std::numbers::ln2 * (1 - std::exp2(-0.5)) * std::exp2(-1.0 / 6), 1e-6);
  Reopen();
  EXPECT_NEAR(usage(), before, 1e-6 * before);
}

TEST_F(DaemonTest, RestartReattachesRunningAttemptsWithoutDuplicates) {
  std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  ASSERT_EQ(w.Count(pb::DaemonCommand::kStart), 1);
  Reopen();  // ftd killed and restarted: the store is all that survives
  FakeSink w_again;
  Register("w", &w_again, int64_t{8} << 30, 0, {{id, 1}});
  daemon_->Tick();
  EXPECT_EQ(w_again.Count(pb::DaemonCommand::kStart), 0) << "no duplicate attempt";
  pb::Job j = Job(id);
  EXPECT_EQ(j.state(), pb::RUNNING);
  EXPECT_EQ(j.attempts_size(), 1);
  Exit("w", &w_again, id, 1, pb::ATTEMPT_FINISHED, 10);
  EXPECT_EQ(Job(id).state(), pb::SUCCEEDED);
}

TEST_F(DaemonTest, RestartRequeuesAttemptsWhoseWorkerNeverReturns) {
  std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  Reopen();
  clock_.Advance(10'001);
  daemon_->Tick();
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_EQ(Job(id).preemptions(), 1);
}

TEST_F(DaemonTest, BadSpecIsRejectedWithLineAndNothingIsQueued) {
  pb::SubmitRequest req;
  req.set_spec_yaml(
      "model: {path: model}\ndata: {train: data.jsonl}\ntrain: {max_steps: 1, lr: fast}\noutput: {dir: o}\n");
  req.set_spec_dir(dir_ + "/job");
  auto r = daemon_->Submit(req);
  ASSERT_TRUE(r.status().IsInvalidArgument());
  EXPECT_THAT(r.status().message(), HasSubstr("job.yaml:3:"));
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 0);
}

// train.early_stopping needs evaluations: ftd refuses a job without an evaluation set at submit,
// with the key's file:line (issue #45), and queues nothing.
TEST_F(DaemonTest, EarlyStoppingWithoutAnEvaluationSetIsRefusedAtSubmitWithLine) {
  pb::SubmitRequest req;
  req.set_spec_yaml(
      "model: {path: model}\ndata: {train: data.jsonl}\n"
      "train: {max_steps: 4, early_stopping: {patience: 2}}\noutput: {dir: o}\n");
  req.set_spec_dir(dir_ + "/job");
  auto r = daemon_->Submit(req);
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("job.yaml:3:"));
  EXPECT_THAT(r.status().message(), HasSubstr("train.early_stopping: needs an evaluation set"));
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 0);
}

TEST_F(DaemonTest, SubmitIsIdempotentByRequestId) {
  pb::SubmitRequest req;
  req.set_spec_yaml(
      "model: {path: model}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\ntrain: {max_steps: 1, "
      "global_batch_size: 1}\noutput: {dir: o}\n");
  req.set_spec_dir(dir_ + "/job");
  req.set_client_request_id("abc");
  auto a = daemon_->Submit(req), b = daemon_->Submit(req);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->job().id(), b->job().id());
  EXPECT_TRUE(b->duplicate());
}

// A job whose output.dir is `out` (relative to the job's folder), named `name`, `steps` long.
StatusOr<pb::SubmitReply> SubmitWithOutput(Daemon& daemon, const std::string& dir, const std::string& name,
                                           const std::string& out, int steps = 1,
                                           const std::string& request_id = "") {
  pb::SubmitRequest req;
  req.set_spec_yaml(
      "name: " + name +
      "\nmodel: {path: model}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\ntrain: {max_steps: " +
      std::to_string(steps) + ", global_batch_size: 1}\noutput: {dir: " + out + "}\n");
  req.set_spec_dir(dir + "/job");
  req.set_client_request_id(request_id);
  return daemon.Submit(req);
}

// Issue #41: the same job.yaml submitted twice with other settings was accepted, and the
// second trainer took the first's directory. One output.dir per job, whatever the first
// job's state, however the path is spelled (a trailing "/", "..", a symlink), after a restart.
TEST_F(DaemonTest, TwoJobsCannotShareAnOutputDir) {
  auto first = SubmitWithOutput(*daemon_, dir_, "first", "shared", 10);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string id = first->job().id();
  ASSERT_TRUE(daemon_->Cancel(id).ok());  // ended jobs keep their directory too
  fs::create_directories(dir_ + "/job/shared");
  fs::create_directory_symlink(dir_ + "/job/shared", dir_ + "/job/alias");
  for (const std::string spelled : {"shared", "shared/", "model/../shared", "alias"}) {
    auto second = SubmitWithOutput(*daemon_, dir_, "second", spelled, 20);
    ASSERT_TRUE(second.status().IsInvalidArgument()) << spelled << ": " << second.status().ToString();
    EXPECT_THAT(second.status().message(), StartsWith(dir_ + "/job/job.yaml: output.dir: '"));
    EXPECT_THAT(second.status().message(), HasSubstr("is also the output.dir of job " + id + " ('first')"));
    EXPECT_THAT(second.status().message(), HasSubstr("choose another output.dir"));
  }
  Reopen();  // the index is rebuilt from the store
  auto after_restart = SubmitWithOutput(*daemon_, dir_, "second", "shared", 20);
  EXPECT_TRUE(after_restart.status().IsInvalidArgument()) << after_restart.status().ToString();
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 1);
  EXPECT_TRUE(SubmitWithOutput(*daemon_, dir_, "second", "shared-2", 20).ok()) << "a directory of its own";
}

// Issue #41: a third job whose output.dir lay inside the first one's checkpoints/ was accepted
// and wrote its files there. A directory inside another job's, or holding another job's, is refused.
TEST_F(DaemonTest, AnOutputDirInsideAnotherJobsCheckpointsIsRefused) {
  auto first = SubmitWithOutput(*daemon_, dir_, "first", "runs/a");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string id = first->job().id(), a = dir_ + "/job/runs/a";
  auto inside = SubmitWithOutput(*daemon_, dir_, "third", "runs/a/checkpoints/x");
  ASSERT_TRUE(inside.status().IsInvalidArgument()) << inside.status().ToString();
  EXPECT_THAT(inside.status().message(), HasSubstr("lies inside " + a + ", the output.dir of job " + id));
  auto holding = SubmitWithOutput(*daemon_, dir_, "fourth", "runs");
  ASSERT_TRUE(holding.status().IsInvalidArgument()) << holding.status().ToString();
  EXPECT_THAT(holding.status().message(), HasSubstr("contains " + a + ", the output.dir of job " + id));
  EXPECT_TRUE(SubmitWithOutput(*daemon_, dir_, "sibling", "runs/ab").ok()) << "a name prefix is not a parent";
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 2);
}

// The rule leaves the idempotent resubmit alone: the same client_request_id gets the job it
// made (its own output.dir is no conflict), before and after a restart.
TEST_F(DaemonTest, ResubmittingTheSameJobIsStillIdempotent) {
  auto a = SubmitWithOutput(*daemon_, dir_, "once", "o", 1, "req-1");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = SubmitWithOutput(*daemon_, dir_, "once", "o", 1, "req-1");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(b->duplicate());
  EXPECT_EQ(b->job().id(), a->job().id());
  Reopen();
  auto c = SubmitWithOutput(*daemon_, dir_, "once", "o", 1, "req-1");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->job().id(), a->job().id());
  auto other = SubmitWithOutput(*daemon_, dir_, "once", "o", 1, "req-2");
  EXPECT_TRUE(other.status().IsInvalidArgument()) << "another request is another job";
}

// Submits are committed in batches (one transaction): two of one batch with one output.dir
// conflict too; the second is refused naming the first, which is queued.
TEST_F(DaemonTest, TwoJobsOfOneBatchCannotShareAnOutputDir) {
  std::atomic<bool> held{false}, in_commit{false}, release{false};
  daemon_->store().SetCommitHookForTest([&] {
    if (held.exchange(true)) return;  // only the first commit waits
    in_commit = true;
    while (!release) std::this_thread::yield();
  });
  std::thread blocker([&] { EXPECT_TRUE(SubmitWithOutput(*daemon_, dir_, "blocker", "blocker").ok()); });
  while (!in_commit) std::this_thread::yield();
  StatusOr<pb::SubmitReply> twins[2] = {Status::Internal("not run"), Status::Internal("not run")};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      twins[i] =
          SubmitWithOutput(*daemon_, dir_, "twin" + std::to_string(i), "twin", 1, "r" + std::to_string(i));
    });
  }
  while (daemon_->submits_queued() < 3) std::this_thread::yield();  // both wait behind the blocker: one batch
  release = true;
  blocker.join();
  for (auto& t : threads) t.join();
  daemon_->store().SetCommitHookForTest(nullptr);
  ASSERT_NE(twins[0].ok(), twins[1].ok())
      << twins[0].status().ToString() << " / " << twins[1].status().ToString();
  const auto& won = twins[0].ok() ? twins[0] : twins[1];
  const auto& lost = twins[0].ok() ? twins[1] : twins[0];
  EXPECT_TRUE(lost.status().IsInvalidArgument()) << lost.status().ToString();
  EXPECT_THAT(lost.status().message(), HasSubstr("is also the output.dir of job " + won->job().id() + " ('" +
                                                 won->job().name() + "')"));
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 2);
}

TEST_F(DaemonTest, PathsOutsideTheAllowedRootsAreRefusedNamingTheField) {
  Reopen({dir_ + "/job"});
  EXPECT_FALSE(Submit().empty());  // everything under job/
  auto submit = [&](const std::string& yaml) {
    pb::SubmitRequest req;
    req.set_spec_yaml(yaml);
    req.set_spec_dir(dir_ + "/job");
    return daemon_->Submit(req);
  };
  const std::string rest = "train: {max_steps: 1, global_batch_size: 1}\n";
  // ".." leaves the root.
  auto r = submit("model: {path: model}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\n" + rest +
                  "output: {dir: ../elsewhere}\n");
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("job.yaml: output.dir: '"));
  EXPECT_THAT(r.status().message(), HasSubstr("--allowed-root"));
  // An absolute path elsewhere.
  r = submit("model: {path: /etc}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\n" + rest +
             "output: {dir: o}\n");
  ASSERT_TRUE(r.status().IsInvalidArgument());
  EXPECT_THAT(r.status().message(), HasSubstr("model.path: '/etc'"));
  // A symlink inside the root that points outside it.
  fs::create_directories(dir_ + "/outside");
  std::ofstream(dir_ + "/outside/data.jsonl") << "{\"input_ids\": [1, 2]}\n";
  fs::create_directory_symlink(dir_ + "/outside", dir_ + "/job/link");
  r = submit("model: {path: model}\ndata: {train: link/data.jsonl, format: tokens}\n" + rest +
             "output: {dir: o}\n");
  ASSERT_TRUE(r.status().IsInvalidArgument());
  EXPECT_THAT(r.status().message(), HasSubstr("data.train"));
  // A root that is only a string prefix of the path is not its parent.
  fs::create_directories(dir_ + "/job2");
  r = submit("model: {path: model}\ndata: {train: ../job2/d.jsonl, format: tokens}\n" + rest +
             "output: {dir: o}\n");
  ASSERT_TRUE(r.status().IsInvalidArgument());
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 1);
}

// A cuda job whose model the CUDA kernels cannot run (tiny-llama's heads are 16 wide; the
// attention takes 64, 128 or 256) is refused at submission with the reason and the fix, instead
// of failing on a worker; a cpu (or auto) job of the same model is accepted.
TEST_F(DaemonTest, ACudaJobOfAModelTheKernelsRefuseIsRefusedAtSubmission) {
  auto submit = [&](const std::string& device) {
    pb::SubmitRequest req;
    req.set_spec_yaml(
        "model: {path: model}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\ntrain: {max_steps: 1, "
        "global_batch_size: 1}\noutput: {dir: o-" +
        device + "}\nresources: {device: " + device + "}\n");
    req.set_spec_dir(dir_ + "/job");
    return daemon_->Submit(req);
  };
  auto refused = submit("cuda");
  ASSERT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  EXPECT_EQ(refused.status().message(),
            dir_ + "/job/job.yaml: resources.device: cuda, but model.path " + dir_ +
                "/job/model (config.json) has head_dim 16: the cuda attention kernels take head dim 64 "
                "or 128 or 256; use resources.device: cpu");
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 0);
  EXPECT_TRUE(submit("cpu").ok());
  EXPECT_TRUE(submit("auto").ok());
}

// A seq_len past the model's sliding_window was refused at submission while the attention did not
// apply the window; it does now (kernels/cpu/attention.cc), so such a job is queued like any other.
TEST_F(DaemonTest, ASeqLenPastTheModelsSlidingWindowIsAccepted) {
  std::string config = *ReadFileToString(dir_ + "/job/model/config.json");
  config.insert(config.find('{') + 1, "\"use_sliding_window\": true, \"sliding_window\": 32,");
  fs::create_directories(dir_ + "/job/windowed");
  std::ofstream(dir_ + "/job/windowed/config.json") << config;
  auto submit = [&](int seq_len) {
    pb::SubmitRequest req;
    req.set_spec_yaml("model: {path: windowed}\ndata: {train: data.jsonl, format: tokens, seq_len: " +
                      std::to_string(seq_len) +
                      "}\ntrain: {max_steps: 1, global_batch_size: 1}\noutput: {dir: o-" +
                      std::to_string(seq_len) + "}\n");
    req.set_spec_dir(dir_ + "/job");
    return daemon_->Submit(req);
  };
  auto past_window = submit(64);
  EXPECT_TRUE(past_window.ok()) << past_window.status().ToString();
  EXPECT_TRUE(submit(32).ok());
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 2);
}

// Choices no trainer combines (a full fine-tune of NF4 weights, of offloaded weights, or sharded
// over ranks by fsdp) used to be queued and fail when a trainer started (Trainer::Create); ftd now
// refuses them at submission with the job file's line, and queues nothing.
TEST_F(DaemonTest, FullFineTuneCombinationsAreRefusedAtSubmissionWithFileLine) {
  auto submit = [&](const std::string& model, const std::string& train, const std::string& rest) {
    pb::SubmitRequest req;
    req.set_spec_yaml("model: {path: model" + model +
                      "}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\ntrain: {max_steps: 1, "
                      "global_batch_size: 2" +
                      train + "}\noutput: {dir: o}\n" + rest);
    req.set_spec_dir(dir_ + "/job");
    return daemon_->Submit(req);
  };
  const std::string file = dir_ + "/job/job.yaml", full = "adapter: {type: full}\n";
  struct Case {
    std::string model, train, rest, line, says;
  };
  for (const Case& c : std::vector<Case>{
           {", quantization: nf4", "", full, ":1:", "model.quantization: nf4 freezes the base weights"},
           {"", ", cpu_offload: true", full, ":3:", "train.cpu_offload keeps the frozen base weights"},
           {"", "", full + "resources: {gpus: 2}\ndistributed: {strategy: fsdp}\n",
            ":7:", "distributed.strategy: fsdp shards the frozen base weights"}}) {
    auto refused = submit(c.model, c.train, c.rest);
    ASSERT_TRUE(refused.status().IsInvalidArgument()) << c.says << ": " << refused.status().ToString();
    EXPECT_THAT(refused.status().message(), StartsWith(file + c.line));
    EXPECT_THAT(refused.status().message(), HasSubstr(c.says));
  }
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 0);
  EXPECT_TRUE(submit("", "", full).ok());  // a full fine-tune alone is queued
}

TEST_F(DaemonTest, ConcurrentSubmitsAreGroupCommittedWithDistinctIdsAndAllQueued) {
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::set<std::string> ids;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        pb::SubmitRequest req;
        req.set_spec_dir(dir_ + "/job");
        // Every thread also resubmits request ids another thread uses: one job per id (and per output.dir).
        const std::string request = "r" + std::to_string((t % 4) * kEach + i);
        req.set_spec_yaml(
            "model: {path: model}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\ntrain: "
            "{max_steps: 1, "
            "global_batch_size: 1}\noutput: {dir: o-" +
            request + "}\n");
        req.set_client_request_id(request);
        auto r = daemon_->Submit(req);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(r->job().id());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ids.size(), 4u * kEach);
  EXPECT_EQ(daemon_->ListJobs({})->jobs_size(), 4 * kEach);
  // All of them are the scheduler's input: a worker gets the oldest.
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  ASSERT_EQ(w.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_EQ(w.Last(pb::DaemonCommand::kStart)->start().job_id(), "j-000001");
  Reopen();  // and after a restart, from the store
  FakeSink w2;
  Register("w2", &w2);
  daemon_->Tick();
  ASSERT_EQ(w2.Count(pb::DaemonCommand::kStart), 1);
  EXPECT_EQ(w2.Last(pb::DaemonCommand::kStart)->start().job_id(), "j-000002");
}

// The kinds of a job's events, oldest first.
std::vector<std::string> EventKinds(Daemon& daemon, const std::string& job_id) {
  pb::ListEventsRequest r;
  r.set_job_id(job_id);
  auto events = daemon.ListEvents(r);
  EXPECT_TRUE(events.ok()) << events.status().ToString();
  std::vector<std::string> kinds;
  if (events.ok()) {
    for (const auto& e : events->events()) kinds.push_back(e.kind());
  }
  return kinds;
}

TEST_F(DaemonTest, AWorkersLogThatCannotBeAppendedIsCountedAndSaidOnce) {
  const std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  ASSERT_EQ(Job(id).state(), pb::RUNNING);
  // A directory where the log file belongs: the append fails (also as root).
  const std::string log = *daemon_->LogPath(id);
  fs::create_directories(log);
  pb::WorkerMessage m;
  m.mutable_log()->set_job_id(id);
  m.mutable_log()->set_epoch(1);
  m.mutable_log()->set_text("step 1\n");
  m.mutable_log()->set_credential(Cred(id, 1));
  daemon_->OnWorkerMessage("w", &w, m);
  daemon_->OnWorkerMessage("w", &w, m);
  EXPECT_EQ(daemon_->error_count(DaemonError::kLogWrite), 2);
  const auto kinds = EventKinds(*daemon_, id);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "log_write_failed"), 1);
  // Writable again: the lines land and the next failure is said again.
  fs::remove(log);
  daemon_->OnWorkerMessage("w", &w, m);
  EXPECT_EQ(daemon_->error_count(DaemonError::kLogWrite), 2);
  std::ifstream in(log);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "step 1\n");
}

TEST_F(DaemonTest, AJobWhoseStoredSpecNoLongerParsesFailsAtStartInsteadOfWaitingForever) {
  const std::string id = Submit();
  {
    // The row changed behind ftd's back (a damaged or hand-edited database).
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/ftd.sqlite").c_str(), &db), SQLITE_OK);
    const std::string sql = "UPDATE jobs SET spec_yaml = 'name: [' WHERE id = '" + id + "'";
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  EXPECT_EQ(w.Count(pb::DaemonCommand::kStart), 0);
  EXPECT_EQ(Job(id).state(), pb::FAILED);
  EXPECT_THAT(Job(id).reason(), HasSubstr("cannot start"));
  const auto kinds = EventKinds(*daemon_, id);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "failed"), 1);
}

TEST_F(DaemonTest, ARunningJobWhosePlanInputNoLongerLoadsAfterARestartIsCountedAndKeepsRunning) {
  const std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  ASSERT_EQ(Job(id).state(), pb::RUNNING);
  fs::remove(dir_ + "/job/model/config.json");
  Reopen();
  ASSERT_TRUE(daemon_->startup_status().ok());
  EXPECT_EQ(daemon_->error_count(DaemonError::kPlanInput), 1);
  EXPECT_EQ(Job(id).state(), pb::RUNNING);  // the attempt is not the daemon's to end for this
  EXPECT_FALSE(daemon_->PredictedBytes(id).ok());
}

// Incremental scheduling: a tick runs a pass only when what the last pass read has changed (a
// job queued, a worker's memory, a worker gone or come), else it costs a digest of the inputs.
TEST_F(DaemonTest, ATickSchedulesOnlyWhenItsInputsChanged) {
  FakeSink w;
  Register("w", &w, int64_t{1} << 20);  // 1 MiB: the job fits nowhere
  const std::string id = Submit();
  daemon_->Tick();
  const int64_t passes = daemon_->scheduling_passes();
  EXPECT_GE(passes, 1);
  EXPECT_THAT(Job(id).reason(), HasSubstr("does not fit"));
  for (int i = 0; i < 3; ++i) {
    pb::WorkerMessage same;  // a heartbeat reporting what the worker reported before
    pb::Device* d = same.mutable_heartbeat()->add_devices();
    d->set_kind("cpu");
    d->set_total_bytes(int64_t{1} << 20);
    d->set_free_bytes(int64_t{1} << 20);
    daemon_->OnWorkerMessage("w", &w, same);
    daemon_->Tick();
  }
  EXPECT_EQ(daemon_->scheduling_passes(), passes) << "nothing changed: no pass";
  Register("w", &w);  // now 8 GiB free: the worker's memory changed
  daemon_->Tick();
  EXPECT_EQ(daemon_->scheduling_passes(), passes + 1);
  EXPECT_EQ(Job(id).state(), pb::RUNNING);
  const std::string second = Submit();  // a job queued
  daemon_->Tick();
  EXPECT_EQ(daemon_->scheduling_passes(), passes + 2);
  EXPECT_THAT(Job(second).reason(), HasSubstr("every worker is busy"));
  daemon_->Tick();
  EXPECT_EQ(daemon_->scheduling_passes(), passes + 2);
  // A time a pass depends on: at most kFullPassMs after the last, a pass runs anyway.
  clock_.Advance(Daemon::kFullPassMs);
  Heartbeat("w", &w, id, 1, 1);  // (keeps the lease)
  daemon_->Tick();
  EXPECT_EQ(daemon_->scheduling_passes(), passes + 3);
}

TEST_F(DaemonTest, ADaemonStallLongerThanTheLeaseCostsNoWorkerItsLease) {
  FakeSink w1, w2;
  const std::string id = RunningOnW1WithW2Idle(&w1, &w2);
  ASSERT_EQ(Job(id).state(), pb::RUNNING);
  // w1's heartbeat waits 5 s in ftd's database commit, under ftd's lock: no
  // other message could be handled meanwhile.
  bool stalled = false;
  daemon_->store().SetCommitHookForTest([&] {
    if (!stalled) clock_.Advance(5'000);
    stalled = true;
  });
  Heartbeat("w1", &w1, id, 1, 3);
  daemon_->store().SetCommitHookForTest(nullptr);
  ASSERT_TRUE(stalled);
  daemon_->Tick();
  ExpectNoWorkerLost(id, w1);
  EXPECT_GE(daemon_->stall_ms_total(), 5'000);
  // The credit is ftd's stall only: silence beyond it still expires the leases.
  clock_.Advance(3'500);
  daemon_->Tick();
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_EQ(Job(id).preemptions(), 1);
}

TEST_F(DaemonTest, AMessageThatArrivedAndWaitsForTheDaemonKeepsItsWorkersLease) {
  // Many short holds of ftd's lock (none a stall on its own) can keep a heartbeat that has
  // arrived waiting past the lease; the transport stamped its arrival, so the wait is ftd's.
  lease_ms_ = 3'000;
  Reopen();
  const std::string id = Submit();
  FakeSink w1;
  Register("w1", &w1);
  daemon_->Tick();
  ASSERT_EQ(Job(id).state(), pb::RUNNING);
  clock_.Advance(2'500);
  w1.arrived_mono_ms = daemon_->MonotonicMs();  // a heartbeat reached ftd, not yet handled
  clock_.Advance(2'000);                        // 4.5 s since w1's last handled message
  daemon_->Tick();
  EXPECT_EQ(Job(id).state(), pb::RUNNING);
  EXPECT_EQ(Job(id).preemptions(), 0);
  // A worker that is silent past the lease from its last arrival is lost all the same.
  clock_.Advance(1'500);
  daemon_->Tick();
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_EQ(Job(id).preemptions(), 1);
}

// ftd itself stalled (descheduled, SIGSTOP, swap): the tick thread runs 5 s late, longer than the
// lease, while no lock was held. Workers heard just before lose nothing: the tick's lateness is
// ftd's stall, credited to every lease; silence past the credit still expires them.
TEST_F(DaemonTest, ATickRunningLateLongerThanTheLeaseCostsNoWorkerItsLease) {
  tick_ms_ = 200;
  FakeSink w1, w2;
  const std::string id = RunningOnW1WithW2Idle(&w1, &w2);
  ASSERT_EQ(Job(id).state(), pb::RUNNING);
  clock_.Advance(200);
  Heartbeat("w1", &w1, id, 1, 3);
  daemon_->Tick();  // on time
  const int64_t credited = daemon_->stall_ms_total();
  clock_.Advance(5'000);  // the next tick was due 200 ms after the last: 4.8 s late
  daemon_->Tick();
  ExpectNoWorkerLost(id, w1);
  EXPECT_GE(daemon_->stall_ms_total() - credited, 4'800);
  // Ticks on time from now on: silence past the lease beyond the credit expires it.
  int64_t silent_ms = 0;
  while (Job(id).state() == pb::RUNNING && silent_ms < 10'000) {
    clock_.Advance(200);
    silent_ms += 200;
    daemon_->Tick();
  }
  EXPECT_EQ(Job(id).state(), pb::QUEUED);
  EXPECT_EQ(Job(id).preemptions(), 1);
  EXPECT_GT(silent_ms, 3'000 - 200);  // 200 ms of the 5 s were the worker's own silence
  EXPECT_LE(silent_ms, 3'000);
}

// A heartbeat like the worker's previous one (same devices, no progress) with no device-memory
// sample due.
pb::WorkerMessage QuietHeartbeat(int64_t free_bytes = int64_t{8} << 30) {
  pb::WorkerMessage m;
  pb::Device* d = m.mutable_heartbeat()->add_devices();
  d->set_kind("cpu");
  d->set_total_bytes(int64_t{8} << 30);
  d->set_free_bytes(free_bytes);
  return m;
}

// The hot path: a heartbeat that changes nothing ftd keeps is handled without the daemon's lock,
// and still keeps its worker's lease, for as long as the worker sends it.
TEST_F(DaemonTest, IdenticalHeartbeatsKeepTheLeaseWithoutTheDaemonsLock) {
  lease_ms_ = 1'200;  // shorter than the memory sample's period: the quiet heartbeats alone keep it
  Reopen();
  FakeSink w;
  Register("w", &w);
  daemon_->OnWorkerMessage("w", &w, QuietHeartbeat());  // applied under the lock: the reference
  const int64_t locked = daemon_->message_latency().count() - daemon_->quiet_heartbeats();
  const int64_t memory_sample_ms = daemon_->options().memory_sample_ms;
  constexpr int64_t kHeartbeats = 25;  // every 500 ms: eight leases and more
  for (int64_t i = 0; i < kHeartbeats; ++i) {
    clock_.Advance(500);
    daemon_->OnWorkerMessage("w", &w, QuietHeartbeat());
    daemon_->Tick();
  }
  auto workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_TRUE(workers->workers(0).alive());
  auto events = daemon_->ListEvents(pb::ListEventsRequest());
  ASSERT_TRUE(events.ok());
  for (const pb::Event& e : events->events()) EXPECT_NE(e.kind(), "worker_lost") << e.message();
  // The store's last-seen time is the quiet heartbeats' (FlushSeen).
  EXPECT_EQ(workers->workers(0).last_heartbeat_ms(), clock_.WallMs());
  // Every heartbeat but the device-memory samples (one per memory_sample_ms) was quiet.
  const int64_t samples = kHeartbeats * 500 / memory_sample_ms;
  ASSERT_GT(samples, 0);
  EXPECT_EQ(daemon_->quiet_heartbeats(), kHeartbeats - samples);
  EXPECT_EQ(daemon_->message_latency().count() - daemon_->quiet_heartbeats(), locked + samples);
}

// What ftd keeps changes: the heartbeat takes the locked path and is applied.
TEST_F(DaemonTest, AHeartbeatThatChangesSomethingIsAppliedUnderTheLock) {
  FakeSink w;
  Register("w", &w);
  const std::string id = Submit();
  daemon_->Tick();
  ASSERT_EQ(Job(id).state(), pb::RUNNING);
  daemon_->OnWorkerMessage("w", &w, QuietHeartbeat());
  daemon_->OnWorkerMessage("w", &w, QuietHeartbeat());
  ASSERT_EQ(daemon_->quiet_heartbeats(), 1);
  daemon_->OnWorkerMessage("w", &w, QuietHeartbeat(int64_t{5} << 30));  // memory changed
  EXPECT_EQ(daemon_->quiet_heartbeats(), 1);
  auto workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->workers(0).devices_size(), 1);
  EXPECT_EQ(workers->workers(0).devices(0).free_bytes(), int64_t{5} << 30);
  Heartbeat("w", &w, id, 1, 7);  // progress
  EXPECT_EQ(daemon_->quiet_heartbeats(), 1);
  EXPECT_EQ(Job(id).steps_done(), 7);
  // A registration changes the session's facts: the same heartbeat is applied again.
  daemon_->OnWorkerMessage("w", &w, QuietHeartbeat(int64_t{5} << 30));
  daemon_->OnWorkerMessage("w", &w, QuietHeartbeat(int64_t{5} << 30));
  ASSERT_EQ(daemon_->quiet_heartbeats(), 2);
  Register("w", &w, int64_t{16} << 30, 0, {{id, 1}});
  daemon_->OnWorkerMessage("w", &w, QuietHeartbeat(int64_t{5} << 30));
  EXPECT_EQ(daemon_->quiet_heartbeats(), 2);
  workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->workers(0).devices(0).free_bytes(), int64_t{5} << 30);
}

// A worker declared lost whose next heartbeat is the same as before: it takes the locked path
// and announces the worker back (the lost lease disarmed its quiet path).
TEST_F(DaemonTest, AQuietHeartbeatAfterTheWorkerWasLostAnnouncesItBack) {
  lease_ms_ = 3'000;
  Reopen();
  FakeSink w;
  Register("w", &w);
  pb::WorkerMessage same;  // no devices: no memory sample is ever due
  same.mutable_heartbeat()->set_slot_end_ms(clock_.WallMs() + 3'600'000);
  daemon_->OnWorkerMessage("w", &w, same);
  clock_.Advance(1'000);
  daemon_->OnWorkerMessage("w", &w, same);
  ASSERT_EQ(daemon_->quiet_heartbeats(), 1);
  clock_.Advance(3'500);
  daemon_->Tick();
  auto workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_FALSE(workers->workers(0).alive());
  daemon_->OnWorkerMessage("w", &w, same);
  EXPECT_EQ(daemon_->quiet_heartbeats(), 1);
  workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_TRUE(workers->workers(0).alive());
  auto events = daemon_->ListEvents(pb::ListEventsRequest());
  ASSERT_TRUE(events.ok());
  std::vector<std::string> kinds;
  for (const pb::Event& e : events->events()) kinds.push_back(e.kind() + ": " + e.message());
  EXPECT_THAT(kinds, testing::Contains("worker_joined: worker w is back"));
  // And the next one is quiet again.
  clock_.Advance(500);
  daemon_->OnWorkerMessage("w", &w, same);
  EXPECT_EQ(daemon_->quiet_heartbeats(), 2);
}

// ---- webhooks (issue #44, point 5): scope and filter, stalls, dead receivers, retries. The sender
// runs on the real clock (its retries wait real milliseconds); the daemon on the fake one.

// A webhook sender on the daemon's store, polling every 20 ms.
std::unique_ptr<WebhookSender> StartSender(Daemon& daemon, const Clock& clock, WebhookSenderOptions o = {}) {
  o.poll_ms = 20;
  auto sender = std::make_unique<WebhookSender>(
      &daemon.store(), &clock, o,
      [&daemon](const std::string& job, const std::string& kind, const std::string& message, int64_t step) {
        daemon.RecordEvent(job, kind, message, step);
      },
      &daemon.webhook_counters());
  EXPECT_TRUE(sender->Start().ok());
  return sender;
}

// Whether the sender has considered every event stored so far and has no delivery left to make.
bool OutboxDrained(Daemon& daemon) {
  auto events = daemon.store().ListEvents("", 0, 0);
  auto hooks = daemon.store().ListWebhooks();
  auto pending = daemon.store().PendingWebhookDeliveries();
  if (!events.ok() || !hooks.ok() || !pending.ok() || !pending->empty()) return false;
  const int64_t newest = events->empty() ? 0 : events->back().seq;
  return std::all_of(hooks->begin(), hooks->end(), [&](const WebhookRow& h) { return h.cursor >= newest; });
}

WebhookRow Hook(const std::string& url, const std::string& events, const std::string& team = "",
                const std::string& user = "") {
  return WebhookRow{
      .url = url, .events = events, .team = team, .user = user, .secret = "test-secret-0123456789"};
}

// The body's field `key` ("" when absent).
std::string Field(const testing_support::WebhookPost& p, const std::string& key) {
  const nlohmann::json j = nlohmann::json::parse(p.body, nullptr, false);
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

TEST_F(DaemonTest, AWebhookFiresOnlyForItsTeamsOrUsersJobsAndTheKindsItSubscribes) {
  testing_support::WebhookReceiver receiver;
  const Actor admin{"root", ""};
  ASSERT_TRUE(daemon_->AddWebhook(admin, Hook(receiver.url("/red"), "succeeded,failed", "red")).ok());
  ASSERT_TRUE(daemon_->AddWebhook(admin, Hook(receiver.url("/blue"), "succeeded", "blue")).ok());
  ASSERT_TRUE(daemon_->AddWebhook(admin, Hook(receiver.url("/bob"), "failed", "", "bob")).ok());
  ASSERT_TRUE(daemon_->AddWebhook(admin, Hook(receiver.url("/all"), "cancelled")).ok());
  EXPECT_FALSE(daemon_->AddWebhook(admin, Hook(receiver.url(), "succeeded", "red", "bob")).ok())
      << "two scopes";
  EXPECT_FALSE(daemon_->AddWebhook(admin, Hook("ftp://x/", "succeeded")).ok());
  EXPECT_FALSE(daemon_->AddWebhook(admin, Hook(receiver.url(), "finished")).ok());
  const std::string a = Submit(0, "", "", {"alice", "red"});
  const std::string b = Submit(0, "", "", {"bob", "blue"});
  const std::string c = Submit(0, "", "", {"carol", "red"});
  FakeSink w1, w2, w3;
  Register("w1", &w1);
  Register("w2", &w2);
  Register("w3", &w3);
  daemon_->Tick();
  ASSERT_EQ(Job(a).state(), pb::RUNNING);
  ASSERT_EQ(Job(b).state(), pb::RUNNING);
  const std::pair<std::string, FakeSink*> workers[] = {{"w1", &w1}, {"w2", &w2}, {"w3", &w3}};
  for (const auto& [worker, sink] : workers) {
    const pb::StartAttempt& s = sink->Last(pb::DaemonCommand::kStart)->start();
    if (s.job_id() == a) Exit(worker, sink, a, 1, pb::ATTEMPT_FINISHED, 10);
    if (s.job_id() == b) Exit(worker, sink, b, 1, pb::ATTEMPT_BAD_INPUT, 1);
  }
  ASSERT_TRUE(daemon_->Cancel(c, admin).ok());
  SystemClock real;
  auto sender = StartSender(*daemon_, real);
  ASSERT_TRUE(receiver.WaitFor([&](auto&) { return OutboxDrained(*daemon_); }, 20'000));
  std::multiset<std::string> got;
  for (const auto& p : receiver.posts()) {
    got.insert(p.target + " " + Field(p, "job_id") + " " + Field(p, "kind"));
    EXPECT_TRUE(testing_support::ValidWebhookSignature("test-secret-0123456789", p.body, p.signature));
    EXPECT_EQ(Field(p, "id"), p.event_id);
    EXPECT_THAT(Field(p, "text"), HasSubstr("ftune: job " + Field(p, "job_id")));
  }
  EXPECT_EQ(got, (std::multiset<std::string>{"/red " + a + " succeeded", "/bob " + b + " failed",
                                             "/all " + c + " cancelled"}));
  auto events = daemon_->ListEvents(pb::ListEventsRequest());
  ASSERT_TRUE(events.ok());
  int added = 0;
  for (const pb::Event& e : events->events()) added += e.kind() == "webhook_added";
  EXPECT_EQ(added, 4) << "each change is an event naming the user";
}

TEST_F(DaemonTest, AJobWhoseStepsStopWhileItsWorkerHeartbeatsIsStalledOnceAndItsWebhookFires) {
  stall_min_ms_ = 5'000;
  Reopen();
  testing_support::WebhookReceiver receiver;
  ASSERT_TRUE(daemon_->AddWebhook({"root", ""}, Hook(receiver.url(), "stalled")).ok());
  const std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  ASSERT_EQ(Job(id).state(), pb::RUNNING);
  const auto beat = [&](int64_t step, int seconds) {  // one heartbeat a second, each ticking
    for (int i = 0; i < seconds; ++i) {
      clock_.Advance(1'000);
      Heartbeat("w", &w, id, 1, step);
      daemon_->Tick();
    }
  };
  for (int64_t step = 0; step <= 5; ++step) beat(step, 1);  // one step a second: bound max(5 s, 10 x 1 s)
  const auto stalls = [&] {
    auto events = daemon_->ListEvents(pb::ListEventsRequest());
    EXPECT_TRUE(events.ok());
    int n = 0;
    for (const pb::Event& e : events->events()) n += e.kind() == "stalled";
    return n;
  };
  beat(5, 9);
  EXPECT_EQ(stalls(), 0) << "9 s without a step is within 10 x the step interval";
  beat(5, 2);
  EXPECT_EQ(stalls(), 1);
  beat(5, 30);
  EXPECT_EQ(stalls(), 1) << "evented once per stall";
  EXPECT_EQ(Job(id).state(), pb::RUNNING) << "its worker kept the lease";
  beat(6, 1);  // progress again, then a second stall
  beat(6, 11);
  EXPECT_EQ(stalls(), 2);
  SystemClock real;
  auto sender = StartSender(*daemon_, real);
  ASSERT_TRUE(receiver.WaitFor([&](auto&) { return OutboxDrained(*daemon_); }, 20'000));
  const auto posts = receiver.posts();
  ASSERT_EQ(posts.size(), 2u);
  for (const auto& p : posts) {
    EXPECT_EQ(Field(p, "kind"), "stalled");
    EXPECT_EQ(Field(p, "job_id"), id);
    EXPECT_THAT(Field(p, "message"), HasSubstr("no step for"));
  }
}

TEST_F(DaemonTest, DeadWebhookReceiversNeverDelayTheTickAndJobsArePlaced) {
  testing_support::SilentPort silent;
  const std::string kinds = "succeeded,failed,preempted,cancelled,stalled";
  ASSERT_TRUE(
      daemon_->AddWebhook({}, Hook("http://127.0.0.1:" + std::to_string(silent.port()) + "/", kinds)).ok());
  ASSERT_TRUE(
      daemon_
          ->AddWebhook(
              {}, Hook("http://127.0.0.1:" + std::to_string(testing_support::RefusingPort()) + "/", kinds))
          .ok());
  testing_support::WebhookReceiver healthy;  // beside them
  ASSERT_TRUE(daemon_->AddWebhook({}, Hook(healthy.url(), "succeeded")).ok());
  std::vector<std::unique_ptr<FakeSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    sinks.push_back(std::make_unique<FakeSink>());
    Register("w" + std::to_string(i), sinks.back().get());
  }
  // Each round: a job submitted, placed by a tick, and finished (a `succeeded` for every webhook).
  const auto rounds = [&](int n) {
    std::vector<double> ms;
    for (int r = 0; r < n; ++r) {
      const std::string id = Submit();
      clock_.Advance(200);
      const auto start = std::chrono::steady_clock::now();
      daemon_->Tick();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      const pb::Job j = Job(id);
      EXPECT_EQ(j.state(), pb::RUNNING) << "round " << r;
      if (j.state() != pb::RUNNING) continue;
      FakeSink* sink = sinks[std::stoi(j.worker_id().substr(1))].get();
      Exit(j.worker_id(), sink, id, 1, pb::ATTEMPT_FINISHED, 10);
    }
    return ms;
  };
  // Blocks of rounds without a sender and with one, in turn (so the machine's load weighs on both
  // alike), then with one until a request to the silent receiver has timed out: ticks ran while
  // one hung.
  std::vector<double> alone, dead;
  const auto add = [](std::vector<double>* to, const std::vector<double>& more) {
    to->insert(to->end(), more.begin(), more.end());
  };
  SystemClock real;
  const WebhookSenderOptions o{.timeout_ms = 1'000, .backoff_ms = 50, .max_backoff_ms = 100};
  for (int block = 0; block < 6; ++block) {
    add(&alone, rounds(5));
    auto sender = StartSender(*daemon_, real, o);
    add(&dead, rounds(5));
  }
  auto sender = StartSender(*daemon_, real, o);
  const auto silent_timed_out = [&] {
    auto rows = daemon_->store().DueWebhookDeliveries(std::numeric_limits<int64_t>::max(), 0);
    return rows.ok() && std::any_of(rows->begin(), rows->end(), [](const WebhookDeliveryRow& d) {
             return d.last_error.find("timed out after 1000 ms") != std::string::npos;
           });
  };
  while (!silent_timed_out()) add(&dead, rounds(5));
  std::sort(alone.begin(), alone.end());
  std::sort(dead.begin(), dead.end());
  const double alone_median = alone[alone.size() / 2], dead_median = dead[dead.size() / 2];
  std::printf(
      "tick median: %.2f ms without webhooks (%zu ticks), %.2f ms with two dead receivers (%zu); max %.2f "
      "ms\n",
      alone_median, alone.size(), dead_median, dead.size(), dead.back());
  EXPECT_LT(dead_median, 3 * alone_median + 5) << "ticks slowed by dead receivers";
  EXPECT_LT(dead.back(), 900) << "a tick waited for the silent receiver (its requests take 1000 ms)";
  // The live receiver gets every one of its deliveries (a stopped sender's one in flight may come
  // twice): a dead one holds back only its own.
  const size_t jobs = alone.size() + dead.size();
  const auto distinct = [](const std::vector<testing_support::WebhookPost>& posts) {
    std::set<std::string> ids;
    for (const auto& p : posts) ids.insert(p.event_id);
    return ids.size();
  };
  EXPECT_TRUE(healthy.WaitFor([&](const auto& posts) { return distinct(posts) == jobs; }, 20'000))
      << distinct(healthy.posts()) << " of " << jobs;
}

TEST_F(DaemonTest, AWebhookAnswering500IsRetriedWithBackoffAndGivenUpAfterItsLastAttempt) {
  // The first two posts of each delivery answer 500, then 200; the other receiver always 500.
  testing_support::WebhookReceiver flaky([](const auto&, int n) { return n <= 2 ? 500 : 200; });
  testing_support::WebhookReceiver broken([](const auto&, int) { return 500; });
  ASSERT_TRUE(daemon_->AddWebhook({}, Hook(flaky.url(), "succeeded")).ok());
  ASSERT_TRUE(daemon_->AddWebhook({}, Hook(broken.url(), "succeeded")).ok());
  const std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  Exit("w", &w, id, 1, pb::ATTEMPT_FINISHED, 10);
  ASSERT_EQ(Job(id).state(), pb::SUCCEEDED);
  SystemClock real;
  auto sender = StartSender(*daemon_, real, {.backoff_ms = 20, .max_backoff_ms = 40, .max_attempts = 4});
  ASSERT_TRUE(flaky.WaitFor([&](auto&) { return OutboxDrained(*daemon_); }, 20'000));
  ASSERT_EQ(flaky.posts().size(), 3u) << "two 500s, then delivered";
  EXPECT_EQ(flaky.Count(flaky.posts()[0].event_id), 3) << "one delivery id across its retries";
  EXPECT_EQ(flaky.posts()[0].body, flaky.posts()[2].body) << "the same signed body";
  EXPECT_EQ(broken.posts().size(), 4u) << "max_attempts";
  EXPECT_EQ(daemon_->webhook_counters().delivered.load(), 1);
  EXPECT_EQ(daemon_->webhook_counters().given_up.load(), 1);
  EXPECT_EQ(daemon_->webhook_counters().failed.load(), 2 + 4);
  auto events = daemon_->ListEvents(pb::ListEventsRequest());
  ASSERT_TRUE(events.ok());
  std::string given_up;
  for (const pb::Event& e : events->events())
    if (e.kind() == "webhook_given_up") given_up = e.job_id() + ": " + e.message();
  EXPECT_THAT(given_up, HasSubstr(id + ": webhook wh-"));
  EXPECT_THAT(given_up, HasSubstr("after 4 attempts; last: HTTP 500"));
}

// https:// receivers: the certificate must chain to the trusted CAs (here --webhook-ca's bundle,
// else the system's store) and name the URL's host.
TEST_F(DaemonTest, AnHttpsWebhookIsDeliveredOnlyToAReceiverWhoseCertificateVerifiesForItsHost) {
  const std::string certs = dir_ + "/certs";
  ASSERT_EQ(testing_support::MakeSelfSignedCertificate(certs, "127.0.0.1", "IP:127.0.0.1"), "");
  testing_support::WebhookReceiver receiver(nullptr, certs + "/cert.pem", certs + "/key.pem");
  ASSERT_TRUE(daemon_->AddWebhook({}, Hook(receiver.url("/ip"), "succeeded")).ok());
  ASSERT_TRUE(daemon_->AddWebhook({}, Hook(receiver.url("/name", "localhost"), "succeeded")).ok());
  const std::string id = Submit();
  FakeSink w;
  Register("w", &w);
  daemon_->Tick();
  Exit("w", &w, id, 1, pb::ATTEMPT_FINISHED, 10);
  SystemClock real;
  auto trusting = StartSender(*daemon_, real, {.backoff_ms = 60'000, .ca_file = certs + "/cert.pem"});
  const auto failed_handshakes = [&] {
    auto rows = daemon_->store().DueWebhookDeliveries(std::numeric_limits<int64_t>::max(), 0);
    int n = 0;
    for (const WebhookDeliveryRow& d : rows.ok() ? *rows : std::vector<WebhookDeliveryRow>{})
      n += d.last_error.find("TLS handshake with") != std::string::npos;
    return n;
  };
  const auto pending = [&] {
    auto rows = daemon_->store().DueWebhookDeliveries(std::numeric_limits<int64_t>::max(), 0);
    return rows.ok() ? rows->size() : size_t{0};
  };
  // Delivered to 127.0.0.1 (its row gone), refused for localhost (its row waits for a retry).
  ASSERT_TRUE(receiver.WaitFor(
      [&](const auto& posts) { return posts.size() == 1 && failed_handshakes() == 1 && pending() == 1; },
      20'000));
  EXPECT_EQ(receiver.posts()[0].target, "/ip") << "the certificate names 127.0.0.1, not localhost";
  trusting.reset();
  // The system's store does not trust the test's own certificate.
  ASSERT_TRUE(daemon_->AddWebhook({}, Hook(receiver.url("/system"), "succeeded")).ok());
  const std::string other = Submit();
  daemon_->Tick();
  Exit("w", &w, other, 1, pb::ATTEMPT_FINISHED, 10);
  auto system = StartSender(*daemon_, real, {.backoff_ms = 60'000});
  // The new job's three deliveries and the first job's one to localhost: none verifies.
  ASSERT_TRUE(receiver.WaitFor([&](const auto&) { return failed_handshakes() == 4; }, 20'000));
  EXPECT_EQ(receiver.posts().size(), 1u);
}

}  // namespace
}  // namespace ft
