// The daemon's SQLite store: every query, durability across close/reopen and
// SIGKILL, schema migration, sticky I/O errors (through a failing VFS), and
// submit throughput.
#include "daemon/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace ft {
namespace {

namespace fs = std::filesystem;

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const ::ft::Status st_ = (expr);                          \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_.ToString(); \
  } while (0)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSERT_OK_AND_ASSIGN_IMPL_(FT_CONCAT_(so_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)                   \
  auto tmp = (expr);                                                 \
  ASSERT_TRUE(tmp.ok()) << #expr << ": " << tmp.status().ToString(); \
  lhs = std::move(tmp).value()

std::unique_ptr<Store> OpenStore(const std::string& path) {
  auto store = Store::Open(path);
  if (!store.ok()) {
    ADD_FAILURE() << store.status().ToString();
    return nullptr;
  }
  return std::move(store).value();
}

JobRow NewJob(const std::string& name, int64_t created_ms = 0, const std::string& request_id = "") {
  JobRow j;
  j.name = name;
  j.spec_yaml = "model: {path: /m}\n";
  j.spec_dir = "/specs";
  j.client_request_id = request_id;
  j.created_ms = created_ms;
  j.device = "auto";
  return j;
}

std::vector<std::string> Ids(const std::vector<JobRow>& jobs) {
  std::vector<std::string> ids;
  for (const JobRow& j : jobs) ids.push_back(j.id);
  return ids;
}

// Each test gets a fresh directory and a store on "ftd.db" in it.
class StoreTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(testing::TempDir()) / ("store_test-" + std::to_string(getpid())) /
            testing::UnitTest::GetInstance()->current_test_info()->name())
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = dir_ + "/ftd.db";
    store_ = OpenStore(path_);
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
    std::error_code ignored;
    fs::remove(fs::path(dir_).parent_path(), ignored);  // once empty
  }
  void Reopen() {
    store_.reset();
    store_ = OpenStore(path_);
    ASSERT_NE(store_, nullptr);
  }

  std::string dir_, path_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, CreateGetListWithStateFiltersAndOrdering) {
  // Created out of time order: listing is by created_ms, not by id.
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(NewJob("a", 3000), nullptr));
  ASSERT_OK_AND_ASSIGN(JobRow b, store_->CreateJob(NewJob("b", 1000), nullptr));
  ASSERT_OK_AND_ASSIGN(JobRow c, store_->CreateJob(NewJob("c", 2000), nullptr));
  EXPECT_EQ(a.id, "j-000001");
  EXPECT_EQ(b.id, "j-000002");
  EXPECT_EQ(c.id, "j-000003");
  EXPECT_EQ(a.state, JobStateCode::kQueued);
  EXPECT_EQ(a.updated_ms, 3000);

  ASSERT_OK_AND_ASSIGN(JobRow got, store_->GetJob(b.id));
  EXPECT_EQ(got.name, "b");
  EXPECT_EQ(got.spec_yaml, "model: {path: /m}\n");
  EXPECT_EQ(got.spec_dir, "/specs");
  EXPECT_EQ(got.device, "auto");
  EXPECT_EQ(got.max_failures, 3);
  EXPECT_TRUE(store_->GetJob("j-999999").status().IsNotFound());

  // Every mutable field round-trips; a NaN loss too (SQLite stores it as NULL).
  c.state = JobStateCode::kRunning;
  c.reason = "placed on w1";
  c.priority = 7;
  c.updated_ms = 5000;
  c.total_steps = 100;
  c.steps_done = 42;
  c.last_loss = std::nan("");
  c.tokens_per_s = 1234.5;
  c.preemptions = 2;
  c.failures = 1;
  c.max_failures = 5;
  c.output_dir = "/out/c";
  c.not_before_ms = 6000;
  c.gpus = 2;
  c.device = "cuda";
  ASSERT_OK(store_->UpdateJob(c));
  ASSERT_OK_AND_ASSIGN(got, store_->GetJob(c.id));
  EXPECT_EQ(got.state, JobStateCode::kRunning);
  EXPECT_EQ(got.reason, "placed on w1");
  EXPECT_EQ(got.priority, 7);
  EXPECT_EQ(got.created_ms, 2000);
  EXPECT_EQ(got.updated_ms, 5000);
  EXPECT_EQ(got.total_steps, 100);
  EXPECT_EQ(got.steps_done, 42);
  EXPECT_TRUE(std::isnan(got.last_loss));
  EXPECT_EQ(got.tokens_per_s, 1234.5);
  EXPECT_EQ(got.preemptions, 2);
  EXPECT_EQ(got.failures, 1);
  EXPECT_EQ(got.max_failures, 5);
  EXPECT_EQ(got.output_dir, "/out/c");
  EXPECT_EQ(got.not_before_ms, 6000);
  EXPECT_EQ(got.gpus, 2);
  EXPECT_EQ(got.device, "cuda");
  a.state = JobStateCode::kSucceeded;
  ASSERT_OK(store_->UpdateJob(a));

  JobRow ghost = NewJob("ghost");
  ghost.id = "j-000404";
  EXPECT_TRUE(store_->UpdateJob(ghost).IsNotFound());

  using S = JobStateCode;
  auto list = [&](std::vector<S> states, int64_t limit = 0) {
    auto jobs = store_->ListJobs(states, limit);
    EXPECT_TRUE(jobs.ok()) << jobs.status().ToString();
    return jobs.ok() ? Ids(*jobs) : std::vector<std::string>{};
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(list({}), (V{b.id, c.id, a.id}));
  EXPECT_EQ(list({}, 2), (V{b.id, c.id}));
  EXPECT_EQ(list({S::kQueued}), (V{b.id}));
  EXPECT_EQ(list({S::kRunning, S::kSucceeded}), (V{c.id, a.id}));
  EXPECT_EQ(list({S::kSucceeded, S::kRunning, S::kSucceeded}), (V{c.id, a.id}));
  EXPECT_EQ(list({S::kFailed}), V{});
  // Equal created_ms: submission order breaks the tie.
  ASSERT_OK_AND_ASSIGN(JobRow d, store_->CreateJob(NewJob("d", 1000), nullptr));
  EXPECT_EQ(list({S::kQueued}), (V{b.id, d.id}));
}

TEST_F(StoreTest, IdempotentSubmitByClientRequestId) {
  bool duplicate = true;
  ASSERT_OK_AND_ASSIGN(JobRow first, store_->CreateJob(NewJob("x", 1000, "req-1"), &duplicate));
  EXPECT_FALSE(duplicate);
  // A retry, even with a different body, returns the original job.
  ASSERT_OK_AND_ASSIGN(JobRow again, store_->CreateJob(NewJob("x-retry", 2000, "req-1"), &duplicate));
  EXPECT_TRUE(duplicate);
  EXPECT_EQ(again.id, first.id);
  EXPECT_EQ(again.name, "x");
  EXPECT_EQ(again.created_ms, 1000);
  ASSERT_OK_AND_ASSIGN(JobRow other, store_->CreateJob(NewJob("y", 3000, "req-2"), &duplicate));
  EXPECT_FALSE(duplicate);
  EXPECT_NE(other.id, first.id);
  // No request id: never a duplicate.
  ASSERT_OK_AND_ASSIGN(JobRow n1, store_->CreateJob(NewJob("n"), &duplicate));
  EXPECT_FALSE(duplicate);
  ASSERT_OK_AND_ASSIGN(JobRow n2, store_->CreateJob(NewJob("n"), &duplicate));
  EXPECT_FALSE(duplicate);
  EXPECT_NE(n1.id, n2.id);
  EXPECT_GT(n1.created_ms, 0);  // defaulted to the wall clock

  ASSERT_OK_AND_ASSIGN(auto jobs, store_->ListJobs({}));
  EXPECT_EQ(jobs.size(), 4u);
  // Exactly one "queued" event for the job submitted twice.
  ASSERT_OK_AND_ASSIGN(auto events, store_->ListEvents(first.id, 0, 0));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, "queued");
  EXPECT_EQ(events[0].time_ms, 1000);
}

TEST_F(StoreTest, EpochsIncreasePerJobAndAttemptsListInOrder) {
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(NewJob("a"), nullptr));
  ASSERT_OK_AND_ASSIGN(JobRow b, store_->CreateJob(NewJob("b"), nullptr));
  ASSERT_OK_AND_ASSIGN(AttemptRow a1, store_->StartAttempt(a.id, "w1", 0, 2, 4, 1, 100));
  ASSERT_OK_AND_ASSIGN(AttemptRow b1, store_->StartAttempt(b.id, "w2", 0, 1, 8, 1, 110));
  ASSERT_OK(store_->EndAttempt(a.id, a1.epoch, AttemptOutcomeCode::kPreempted, "spot reclaim", 30, 5, 200));
  // A two-rank attempt: rank 0 on w3, rank 1 on device 1 of "w 4" (ids may hold spaces).
  ASSERT_OK_AND_ASSIGN(AttemptRow a2,
                       store_->StartAttempt(a.id, "w3", 25, 4, 2, 2, 300, {{"w3", 0}, {"w 4", 1}}));
  EXPECT_EQ(a1.number, 1);
  EXPECT_EQ(a1.epoch, 1);
  EXPECT_EQ(b1.number, 1);
  EXPECT_EQ(b1.epoch, 1);  // epochs are per job
  EXPECT_EQ(a2.number, 2);
  EXPECT_EQ(a2.epoch, 2);
  EXPECT_EQ(a2.outcome, AttemptOutcomeCode::kRunning);
  EXPECT_EQ(a2.start_step, 25);
  EXPECT_EQ(a2.end_step, 25);

  ASSERT_OK_AND_ASSIGN(auto attempts, store_->ListAttempts(a.id));
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].epoch, 1);
  EXPECT_EQ(attempts[0].worker_id, "w1");
  EXPECT_EQ(attempts[0].micro_batch, 2);
  EXPECT_EQ(attempts[0].accumulation, 4);
  EXPECT_EQ(attempts[0].started_ms, 100);
  EXPECT_EQ(attempts[1].epoch, 2);
  EXPECT_EQ(attempts[1].worker_id, "w3");
  EXPECT_EQ(attempts[1].world, 2);
  EXPECT_EQ(attempts[1].started_ms, 300);
  EXPECT_EQ(attempts[1].ranks, (std::vector<RankSlot>{{"w3", 0}, {"w 4", 1}}));
  EXPECT_EQ(attempts[1].Workers(), (std::vector<std::string>{"w3", "w 4"}));
  EXPECT_TRUE(attempts[0].ranks.empty()) << "one rank: on worker_id";
  EXPECT_EQ(attempts[0].Workers(), (std::vector<std::string>{"w1"}));

  ASSERT_OK_AND_ASSIGN(auto running, store_->RunningAttempts());
  ASSERT_EQ(running.size(), 2u);
  EXPECT_EQ(running[0].job_id, a.id);
  EXPECT_EQ(running[0].epoch, 2);
  EXPECT_EQ(running[1].job_id, b.id);

  // An unknown job is NotFound, and that is not a sticky failure.
  EXPECT_TRUE(store_->StartAttempt("j-000404", "w1", 0, 1, 1, 1, 0).status().IsNotFound());
  ASSERT_OK(store_->CreateJob(NewJob("c"), nullptr).status());
}

TEST_F(StoreTest, EndAttemptUpdatesOutcomeReasonStepsLostAndLoss) {
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(NewJob("a"), nullptr));
  ASSERT_OK_AND_ASSIGN(AttemptRow a1, store_->StartAttempt(a.id, "w1", 10, 2, 4, 1, 100));
  ASSERT_OK(store_->RecordProgress(ProgressRow{.job_id = a.id, .epoch = a1.epoch, .step = 17}));
  ASSERT_OK_AND_ASSIGN(auto attempts, store_->ListAttempts(a.id));
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].end_step, 17);
  EXPECT_EQ(attempts[0].outcome, AttemptOutcomeCode::kRunning);

  ASSERT_OK(store_->EndAttempt(a.id, a1.epoch, AttemptOutcomeCode::kFailed, "CUDA OOM", 19, 4, 500));
  ASSERT_OK_AND_ASSIGN(attempts, store_->ListAttempts(a.id));
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].outcome, AttemptOutcomeCode::kFailed);
  EXPECT_EQ(attempts[0].reason, "CUDA OOM");
  EXPECT_EQ(attempts[0].end_step, 19);
  EXPECT_EQ(attempts[0].steps_lost, 4);
  EXPECT_EQ(attempts[0].ended_ms, 500);
  EXPECT_EQ(attempts[0].start_step, 10);
  ASSERT_OK_AND_ASSIGN(auto running, store_->RunningAttempts());
  EXPECT_TRUE(running.empty());

  EXPECT_FALSE(attempts[0].lost);
  // An attempt ftd ends for a loss keeps that (goodput counts its tail as lost), across a reopen.
  ASSERT_OK_AND_ASSIGN(AttemptRow a2, store_->StartAttempt(a.id, "w1", 15, 2, 4, 1, 600));
  ASSERT_OK(
      store_->EndAttempt(a.id, a2.epoch, AttemptOutcomeCode::kPreempted, "lease", 16, 1, 700, /*lost=*/true));
  ASSERT_OK(store_->AddCheckpoint({a.id, a2.epoch, 15, "/c15", "sha", 0.5, 650}));
  ASSERT_OK(store_->AddCheckpoint({a.id, a1.epoch, 12, "/c12", "sha", 0.25, 300}));
  Reopen();
  ASSERT_OK_AND_ASSIGN(attempts, store_->ListAttempts(a.id));
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_FALSE(attempts[0].lost);
  EXPECT_TRUE(attempts[1].lost);
  ASSERT_OK_AND_ASSIGN(auto checkpoints, store_->ListCheckpointRows(a.id));
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[0].step, 12) << "by step";
  EXPECT_EQ(checkpoints[1].epoch, a2.epoch);
  EXPECT_EQ(checkpoints[1].committed_ms, 650);

  EXPECT_TRUE(store_->EndAttempt(a.id, 9, AttemptOutcomeCode::kFinished, "", 0, 0, 0).IsNotFound());
  EXPECT_TRUE(store_->RecordProgress(ProgressRow{.job_id = a.id, .epoch = 9, .step = 1}).IsNotFound());
  ASSERT_OK(
      store_->RecordProgress(ProgressRow{.job_id = a.id, .epoch = a1.epoch, .step = 20}));  // still writable
}

// Worker pools and stored goodput splits (schema 8): each attempt keeps the pool it started in
// and, once ended, its split; EndedAttemptTotals sums seconds, preemptions and splits by pool or
// by worker, skipping running attempts, a lost one's seconds up to its last sign of life; an
// attempt ended without a split counts as none.
TEST_F(StoreTest, EndedAttemptsAreTotalledByPoolAndByWorkerWithTheirGoodput) {
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(NewJob("a"), nullptr));
  ASSERT_OK_AND_ASSIGN(AttemptRow a1, store_->StartAttempt(a.id, "w1", 0, 1, 1, 1, 1'000, {}, "spot"));
  EXPECT_EQ(a1.pool, "spot");
  const GoodputSplit s1{.productive_s = 6, .checkpoint_s = 0.5, .restart_s = 1, .lost_s = 2.5};
  ASSERT_OK(store_->EndAttempt(a.id, a1.epoch, AttemptOutcomeCode::kPreempted, "lease", 5, 2, 11'000, true, 0,
                               &s1, /*seen_ms=*/9'000));  // lost: last heard at 9 s
  ASSERT_OK_AND_ASSIGN(AttemptRow a2, store_->StartAttempt(a.id, "w2", 3, 1, 1, 1, 12'000, {}, "spot"));
  const GoodputSplit s2{.productive_s = 3, .checkpoint_s = 0, .restart_s = 1, .lost_s = 0};
  ASSERT_OK(
      store_->EndAttempt(a.id, a2.epoch, AttemptOutcomeCode::kFinished, "", 9, 0, 16'000, false, 0, &s2));
  ASSERT_OK_AND_ASSIGN(AttemptRow a3, store_->StartAttempt(a.id, "w1", 9, 1, 1, 1, 20'000, {}, "ondemand"));
  ASSERT_OK(
      store_->EndAttempt(a.id, a3.epoch, AttemptOutcomeCode::kFailed, "bug", 9, 0, 22'000));  // no split
  ASSERT_OK(
      store_->StartAttempt(a.id, "w3", 9, 1, 1, 1, 30'000, {}, "spot").status());  // running: not counted
  ASSERT_OK(store_->UpsertWorker(WorkerRow{.id = "w1", .pool = "spot"}));
  Reopen();
  ASSERT_OK_AND_ASSIGN(auto by_pool, store_->EndedAttemptTotals(Store::AttemptGroup::kPool));
  ASSERT_EQ(by_pool.size(), 2u);
  const Store::AttemptTotals& spot = by_pool["spot"];
  EXPECT_EQ(spot.seconds, 12.0) << "8 s alive (lost) + 4 s";
  EXPECT_EQ(spot.preemptions, 1);
  EXPECT_EQ(spot.attempts, 2);
  EXPECT_EQ(spot.device.productive_s, 9);
  EXPECT_EQ(spot.device.checkpoint_s, 0.5);
  EXPECT_EQ(spot.device.restart_s, 2);
  EXPECT_EQ(spot.device.lost_s, 2.5);
  EXPECT_EQ(by_pool["ondemand"].seconds, 2.0);
  EXPECT_EQ(by_pool["ondemand"].device.total_s(), 0) << "ended without a split";
  ASSERT_OK_AND_ASSIGN(auto by_worker, store_->EndedAttemptTotals(Store::AttemptGroup::kWorker));
  EXPECT_EQ(by_worker["w1"].device.productive_s, 6);
  EXPECT_EQ(by_worker["w1"].attempts, 2);
  EXPECT_EQ(by_worker["w2"].device.productive_s, 3);
  EXPECT_EQ(by_worker.count("w3"), 0u);
  ASSERT_OK_AND_ASSIGN(auto attempts, store_->ListAttempts(a.id));
  EXPECT_EQ(attempts[2].pool, "ondemand");
  ASSERT_OK_AND_ASSIGN(auto workers, store_->ListWorkers());
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].pool, "spot");
}

TEST_F(StoreTest, LatestCheckpointPicksTheHighestStep) {
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(NewJob("a"), nullptr));
  ASSERT_OK_AND_ASSIGN(JobRow b, store_->CreateJob(NewJob("b"), nullptr));
  EXPECT_TRUE(store_->LatestCheckpoint(a.id).status().IsNotFound());
  auto ckpt = [](const std::string& job, int64_t epoch, int64_t step) {
    return CheckpointRow{.job_id = job,
                         .epoch = epoch,
                         .step = step,
                         .dir = "/ck/" + job + "/" + std::to_string(step),
                         .manifest_sha256 = "sha" + std::to_string(step),
                         .write_seconds = 0.25,
                         .committed_ms = step * 10};
  };
  ASSERT_OK(store_->AddCheckpoint(ckpt(a.id, 1, 10)));
  ASSERT_OK(store_->AddCheckpoint(ckpt(a.id, 1, 30)));
  ASSERT_OK(store_->AddCheckpoint(ckpt(a.id, 2, 20)));  // a later epoch, but an earlier step
  ASSERT_OK(store_->AddCheckpoint(ckpt(a.id, 1, 30)));  // a retried commit: idempotent
  ASSERT_OK(store_->AddCheckpoint(ckpt(b.id, 1, 99)));
  ASSERT_OK_AND_ASSIGN(CheckpointRow latest, store_->LatestCheckpoint(a.id));
  EXPECT_EQ(latest.step, 30);
  EXPECT_EQ(latest.epoch, 1);
  EXPECT_EQ(latest.dir, "/ck/" + a.id + "/30");
  EXPECT_EQ(latest.manifest_sha256, "sha30");
  EXPECT_EQ(latest.write_seconds, 0.25);
  EXPECT_EQ(latest.committed_ms, 300);
  // The same step from a later epoch wins.
  ASSERT_OK(store_->AddCheckpoint(ckpt(a.id, 3, 30)));
  ASSERT_OK_AND_ASSIGN(latest, store_->LatestCheckpoint(a.id));
  EXPECT_EQ(latest.epoch, 3);
  EXPECT_TRUE(store_->AddCheckpoint(ckpt("j-000404", 1, 1)).IsNotFound());
  ASSERT_OK(store_->AddCheckpoint(ckpt(b.id, 1, 100)));  // not sticky
}

TEST_F(StoreTest, WorkerUpsertReplacesDevices) {
  WorkerRow w{.id = "w1",
              .hostname = "gpu-1",
              .version = "0.1",
              .last_seen_ms = 10,
              .slot_end_ms = 99,
              .alive = true};
  w.devices = {
      {.index = 1, .kind = "cuda", .name = "H100", .total_bytes = 80, .free_bytes = 70, .used_bytes = 10},
      {.index = 0, .kind = "cuda", .name = "H100", .total_bytes = 80, .free_bytes = 60, .used_bytes = 20}};
  ASSERT_OK(store_->UpsertWorker(w));
  ASSERT_OK(store_->UpsertWorker(WorkerRow{.id = "w0", .hostname = "cpu-box", .version = "0.1"}));
  ASSERT_OK_AND_ASSIGN(auto workers, store_->ListWorkers());
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].id, "w0");
  EXPECT_TRUE(workers[0].devices.empty());
  EXPECT_FALSE(workers[0].alive);
  EXPECT_EQ(workers[1].hostname, "gpu-1");
  EXPECT_TRUE(workers[1].alive);
  EXPECT_EQ(workers[1].slot_end_ms, 99);
  ASSERT_EQ(workers[1].devices.size(), 2u);
  EXPECT_EQ(workers[1].devices[0].index, 0);
  EXPECT_EQ(workers[1].devices[0].free_bytes, 60);
  EXPECT_EQ(workers[1].devices[1].index, 1);

  // A re-registration with one device replaces both.
  w.version = "0.2";
  w.devices = {{.index = 3, .kind = "cpu", .name = "Xeon", .total_bytes = 512}};
  ASSERT_OK(store_->UpsertWorker(w));
  ASSERT_OK(store_->SetWorkerAlive("w1", false, 77));
  ASSERT_OK_AND_ASSIGN(workers, store_->ListWorkers());
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[1].version, "0.2");
  EXPECT_FALSE(workers[1].alive);
  EXPECT_EQ(workers[1].last_seen_ms, 77);
  ASSERT_EQ(workers[1].devices.size(), 1u);
  EXPECT_EQ(workers[1].devices[0].index, 3);
  EXPECT_EQ(workers[1].devices[0].name, "Xeon");
  EXPECT_EQ(workers[1].devices[0].total_bytes, 512);

  EXPECT_TRUE(store_->SetWorkerAlive("w9", true, 1).IsNotFound());
  w.devices = {{.index = 0}, {.index = 0}};
  EXPECT_TRUE(store_->UpsertWorker(w).IsInvalidArgument());
  ASSERT_OK(store_->SetWorkerAlive("w1", true, 78));  // not sticky
}

TEST_F(StoreTest, EventsGetIncreasingSeqAndListByJobAndAfterSeq) {
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(NewJob("a", 1), nullptr));  // event "queued"
  ASSERT_OK_AND_ASSIGN(JobRow b, store_->CreateJob(NewJob("b", 2), nullptr));  // event "queued"
  std::vector<int64_t> seqs;
  for (int i = 0; i < 6; ++i) {
    const std::string& job = i % 2 == 0 ? a.id : b.id;
    ASSERT_OK_AND_ASSIGN(int64_t seq, store_->AddEvent(EventRow{.time_ms = 10 + i,
                                                                .job_id = job,
                                                                .worker_id = "w1",
                                                                .kind = "progress",
                                                                .message = "m" + std::to_string(i),
                                                                .step = i}));
    if (!seqs.empty()) {
      EXPECT_GT(seq, seqs.back());
    }
    seqs.push_back(seq);
  }
  ASSERT_OK_AND_ASSIGN(int64_t global, store_->AddEvent(EventRow{.time_ms = 99, .kind = "worker_joined"}));
  EXPECT_GT(global, seqs.back());

  ASSERT_OK_AND_ASSIGN(auto events, store_->ListEvents(a.id, 0, 0));
  ASSERT_EQ(events.size(), 4u);  // queued + 3 progress
  EXPECT_EQ(events[0].kind, "queued");
  EXPECT_EQ(events[1].seq, seqs[0]);
  EXPECT_EQ(events[1].message, "m0");
  EXPECT_EQ(events[1].worker_id, "w1");
  EXPECT_EQ(events[1].time_ms, 10);
  EXPECT_EQ(events[3].seq, seqs[4]);
  EXPECT_EQ(events[3].step, 4);

  ASSERT_OK_AND_ASSIGN(events, store_->ListEvents(a.id, seqs[0], 0));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].seq, seqs[2]);
  ASSERT_OK_AND_ASSIGN(events, store_->ListEvents(a.id, seqs[0], 1));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq, seqs[2]);

  // Every job's, in seq order.
  ASSERT_OK_AND_ASSIGN(events, store_->ListEvents("", 0, 0));
  ASSERT_EQ(events.size(), 9u);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_GT(events[i].seq, events[i - 1].seq);
  EXPECT_EQ(events.back().kind, "worker_joined");
  EXPECT_EQ(events.back().job_id, "");
  ASSERT_OK_AND_ASSIGN(events, store_->ListEvents("", seqs[5], 0));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq, global);
}

TEST_F(StoreTest, MetricsBatchInsertAndQuery) {
  std::vector<MetricRow> rows;
  for (int64_t step = 1; step <= 200; ++step) {
    rows.push_back(MetricRow{.job_id = "j-000001",
                             .epoch = 1,
                             .step = step,
                             .loss = 10.0 / step,
                             .lr = 1e-4,
                             .grad_norm = 0.5,
                             .tokens_per_s = 900,
                             .peak_bytes = 1 << 20,
                             .time_ms = 1000 + step});
  }
  rows.push_back(MetricRow{.job_id = "j-000002", .epoch = 1, .step = 5, .loss = std::nan("")});
  ASSERT_OK(store_->AddMetrics(rows));
  ASSERT_OK(store_->AddMetrics({}));

  ASSERT_OK_AND_ASSIGN(auto got, store_->ListMetrics("j-000001", 0, 0));
  ASSERT_EQ(got.size(), 200u);
  EXPECT_EQ(got[0].step, 1);
  EXPECT_EQ(got[0].loss, 10.0);
  EXPECT_EQ(got[199].step, 200);
  EXPECT_EQ(got[199].time_ms, 1200);
  EXPECT_EQ(got[199].peak_bytes, 1 << 20);
  ASSERT_OK_AND_ASSIGN(got, store_->ListMetrics("j-000001", 150, 10));
  ASSERT_EQ(got.size(), 10u);
  EXPECT_EQ(got[0].step, 151);
  EXPECT_EQ(got[9].step, 160);
  ASSERT_OK_AND_ASSIGN(got, store_->ListMetrics("j-000002", 0, 0));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(std::isnan(got[0].loss));

  // A resumed attempt re-reports steps 199..201: one row per (step, epoch),
  // and a resent row replaces its twin.
  std::vector<MetricRow> resumed;
  for (int64_t step = 199; step <= 201; ++step) {
    resumed.push_back(MetricRow{.job_id = "j-000001", .epoch = 2, .step = step, .loss = 1.0});
  }
  ASSERT_OK(store_->AddMetrics(resumed));
  ASSERT_OK(store_->AddMetrics(resumed));
  ASSERT_OK_AND_ASSIGN(got, store_->ListMetrics("j-000001", 198, 0));
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].step, 199);
  EXPECT_EQ(got[0].epoch, 1);
  EXPECT_EQ(got[1].step, 199);
  EXPECT_EQ(got[1].epoch, 2);
  EXPECT_EQ(got[4].step, 201);
}

TEST_F(StoreTest, EvalLossMergesIntoItsStepWhicheverArrivesFirst) {
  const MetricRow train{.job_id = "j-000001",
                        .epoch = 1,
                        .step = 10,
                        .loss = 2.5,
                        .lr = 1e-4,
                        .grad_norm = 0.5,
                        .tokens_per_s = 900,
                        .peak_bytes = 1 << 20,
                        .time_ms = 5000,
                        .tokens_seen = 40960,
                        .step_seconds = 0.25,
                        .copy_wait_seconds = 0.0625};
  MetricRow eval{.job_id = "j-000001", .epoch = 1, .step = 10, .time_ms = 6000};
  eval.eval_loss = 2.75;
  eval.eval_only = true;

  // Step first, then its evaluation: the training fields and time stay, eval_loss is added.
  std::vector<MetricRow> stored;
  ASSERT_OK(store_->AddMetrics({train, MetricRow{.job_id = "j-000001", .epoch = 1, .step = 11, .loss = 2.0}},
                               &stored));
  ASSERT_EQ(stored.size(), 2u);
  EXPECT_TRUE(std::isnan(stored[0].eval_loss)) << "no evaluation yet: NULL";
  ASSERT_OK(store_->AddMetrics({eval}, &stored));
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].loss, 2.5) << "the merged row, as published to watchers";
  EXPECT_EQ(stored[0].eval_loss, 2.75);
  ASSERT_OK_AND_ASSIGN(auto got, store_->ListMetrics("j-000001", 0, 0));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].loss, 2.5);
  EXPECT_EQ(got[0].lr, 1e-4);
  EXPECT_EQ(got[0].peak_bytes, 1 << 20);
  EXPECT_EQ(got[0].time_ms, 5000);
  EXPECT_EQ(got[0].tokens_seen, 40960) << "the evaluation keeps the step's token count";
  EXPECT_EQ(got[0].step_seconds, 0.25) << "and its timing";
  EXPECT_EQ(got[0].copy_wait_seconds, 0.0625);
  EXPECT_EQ(got[0].eval_loss, 2.75);
  EXPECT_TRUE(std::isnan(got[1].eval_loss));
  EXPECT_EQ(got[1].tokens_seen, 0) << "not reported";
  EXPECT_TRUE(std::isnan(got[1].step_seconds)) << "not reported: NULL";
  EXPECT_TRUE(std::isnan(got[1].copy_wait_seconds));

  // The step re-sent (a reconnect) keeps its evaluation.
  ASSERT_OK(store_->AddMetrics({train}));
  ASSERT_OK_AND_ASSIGN(got, store_->ListMetrics("j-000001", 9, 1));
  EXPECT_EQ(got[0].eval_loss, 2.75);

  // Evaluation first (its step's line was dropped in transit): a row with no training
  // fields until the step arrives, then both.
  eval.step = 20;
  ASSERT_OK(store_->AddMetrics({eval}));
  ASSERT_OK_AND_ASSIGN(got, store_->ListMetrics("j-000001", 19, 1));
  EXPECT_TRUE(std::isnan(got[0].loss));
  EXPECT_EQ(got[0].eval_loss, 2.75);
  MetricRow late = train;
  late.step = 20;
  ASSERT_OK(store_->AddMetrics({late}));
  ASSERT_OK_AND_ASSIGN(got, store_->ListMetrics("j-000001", 19, 1));
  EXPECT_EQ(got[0].loss, 2.5);
  EXPECT_EQ(got[0].tokens_seen, 40960);
  EXPECT_EQ(got[0].eval_loss, 2.75);
}

// A DPO step's metrics (TRL's rewards and log-probabilities) come back as they went in, with its
// evaluation's merged in; names a trainer should not have written (case, spaces, braces, quotes,
// a leading digit, too long) are dropped, and at most kMaxObjectiveMetrics are kept.
TEST_F(StoreTest, ObjectiveMetricsRoundTripAndOnlyValidNamesUpToTheCapAreKept) {
  const std::map<std::string, double> dpo = {{"rewards/chosen", 1.5},    {"rewards/rejected", -0.5},
                                             {"rewards/margins", 2.0},   {"rewards/accuracies", 0.75},
                                             {"logps/chosen", -30.25},   {"logps/rejected", -41.0},
                                             {"kl.mean_2", std::nan("")}};
  std::map<std::string, double> sent = dpo;
  for (const std::string& bad :
       std::vector<std::string>{"Rewards/Chosen", "rewards chosen", "x{job=\"a\"}", "9lives", "", "/lead",
                                "é", std::string(kMaxObjectiveMetricName + 1, 'a')}) {
    sent[bad] = 7;
  }
  sent[std::string(kMaxObjectiveMetricName, 'z')] = 8;  // the longest name kept
  MetricRow step{.job_id = "j-000001", .epoch = 1, .step = 5, .loss = 0.6, .time_ms = 1000};
  step.objective_metrics = sent;
  std::vector<MetricRow> stored;
  ASSERT_OK(store_->AddMetrics({step, MetricRow{.job_id = "j-000002", .epoch = 1, .step = 5, .loss = 2.0}},
                               &stored));
  std::map<std::string, double> want = dpo;
  want[std::string(kMaxObjectiveMetricName, 'z')] = 8;
  ASSERT_EQ(stored.size(), 2u);
  const auto expect_kept = [&](const std::map<std::string, double>& got) {
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, value] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      if (std::isnan(value)) {
        EXPECT_TRUE(std::isnan(got.at(name))) << name << ": NaN is stored as null and read back as NaN";
      } else {
        EXPECT_EQ(got.at(name), value) << name;
      }
    }
  };
  expect_kept(stored[0].objective_metrics);
  EXPECT_TRUE(stored[1].objective_metrics.empty()) << "an SFT step has none";
  ASSERT_OK_AND_ASSIGN(auto got, store_->ListMetrics("j-000001", 0, 0));
  ASSERT_EQ(got.size(), 1u);
  expect_kept(got[0].objective_metrics);

  // Its evaluation's metrics (TRL's eval_ names) merge in by name, and the step re-sent (a
  // reconnect) keeps them; an evaluation without any keeps the step's.
  MetricRow eval{.job_id = "j-000001", .epoch = 1, .step = 5, .time_ms = 1100};
  eval.eval_loss = 0.7;
  eval.eval_only = true;
  eval.objective_metrics = {{"eval_rewards/margins", 1.25}, {"Eval Bad", 3}};
  ASSERT_OK(store_->AddMetrics({eval}, &stored));
  want["eval_rewards/margins"] = 1.25;
  expect_kept(stored[0].objective_metrics);
  ASSERT_OK(store_->AddMetrics({step}));
  eval.objective_metrics.clear();
  ASSERT_OK(store_->AddMetrics({eval}));
  ASSERT_OK_AND_ASSIGN(got, store_->ListMetrics("j-000001", 0, 0));
  expect_kept(got[0].objective_metrics);
  EXPECT_EQ(got[0].eval_loss, 0.7);

  // Many valid names: the first kMaxObjectiveMetrics in name order.
  MetricRow flood{.job_id = "j-000003", .epoch = 1, .step = 1, .loss = 1.0};
  for (int i = 0; i < 100; ++i) flood.objective_metrics["m" + std::to_string(1000 + i)] = i;
  ASSERT_OK(store_->AddMetrics({flood}, &stored));
  ASSERT_EQ(stored[0].objective_metrics.size(), kMaxObjectiveMetrics);
  EXPECT_EQ(stored[0].objective_metrics.begin()->first, "m1000");
  EXPECT_EQ(stored[0].objective_metrics.rbegin()->first,
            "m" + std::to_string(1000 + kMaxObjectiveMetrics - 1));
  // Merged rows are bounded too: evaluations with other names never grow the row past the cap.
  MetricRow more{.job_id = "j-000003", .epoch = 1, .step = 1, .eval_only = true};
  for (int i = 0; i < 100; ++i) more.objective_metrics["a" + std::to_string(1000 + i)] = i;
  ASSERT_OK(store_->AddMetrics({more, more}, &stored));
  EXPECT_EQ(stored[1].objective_metrics.size(), kMaxObjectiveMetrics);
}

// The newest step's objective metrics of a job (ftctl status) and of every job that has not
// ended (/metrics): the highest step, and at that step the newest epoch (a resumed attempt).
TEST_F(StoreTest, LatestObjectiveMetricsAreTheHighestStepsAndOnlyLiveJobsAreListed) {
  ASSERT_OK_AND_ASSIGN(JobRow dpo, store_->CreateJob(NewJob("dpo"), nullptr));
  ASSERT_OK_AND_ASSIGN(JobRow sft, store_->CreateJob(NewJob("sft"), nullptr));
  ASSERT_OK_AND_ASSIGN(JobRow done, store_->CreateJob(NewJob("done"), nullptr));
  const auto margin = [](const std::string& job, int64_t epoch, int64_t step, double m) {
    MetricRow r{.job_id = job, .epoch = epoch, .step = step, .loss = 0.5};
    r.objective_metrics = {{"rewards/margins", m}};
    return r;
  };
  ASSERT_OK(
      store_->AddMetrics({margin(dpo.id, 1, 1, 0.1), margin(dpo.id, 1, 3, 0.3), margin(dpo.id, 1, 2, 0.2),
                          margin(dpo.id, 2, 3, 0.35), margin(done.id, 1, 9, 9.0),
                          MetricRow{.job_id = sft.id, .epoch = 1, .step = 4, .loss = 2.0}}));
  // A later eval-only point at a higher step carries none: the newest with metrics is kept.
  MetricRow eval{.job_id = dpo.id, .epoch = 2, .step = 4};
  eval.eval_loss = 0.4;
  eval.eval_only = true;
  ASSERT_OK(store_->AddMetrics({eval}));
  ASSERT_OK_AND_ASSIGN(auto latest, store_->LatestObjectiveMetrics(dpo.id));
  EXPECT_EQ(latest, (std::map<std::string, double>{{"rewards/margins", 0.35}}));
  ASSERT_OK_AND_ASSIGN(latest, store_->LatestObjectiveMetrics(sft.id));
  EXPECT_TRUE(latest.empty());
  ASSERT_OK_AND_ASSIGN(latest, store_->LatestObjectiveMetrics("j-999999"));
  EXPECT_TRUE(latest.empty());

  done.state = JobStateCode::kSucceeded;
  ASSERT_OK(store_->UpdateJob(done));
  ASSERT_OK_AND_ASSIGN(auto live, store_->LiveObjectiveMetrics());
  ASSERT_EQ(live.size(), 1u) << "the SFT job has none and the ended job is left out";
  EXPECT_EQ(live[dpo.id], (std::map<std::string, double>{{"rewards/margins", 0.35}}));
  ASSERT_OK_AND_ASSIGN(latest, store_->LatestObjectiveMetrics(done.id));
  EXPECT_EQ(latest.at("rewards/margins"), 9.0) << "an ended job's are still read for ftctl status";
}

TEST_F(StoreTest, CloseAndReopenKeepsEverything) {
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(NewJob("a", 1, "req-a"), nullptr));
  ASSERT_OK_AND_ASSIGN(JobRow b, store_->CreateJob(NewJob("b", 2), nullptr));
  b.state = JobStateCode::kPreempted;
  b.steps_done = 12;
  ASSERT_OK(store_->UpdateJob(b));
  ASSERT_OK_AND_ASSIGN(AttemptRow at, store_->StartAttempt(a.id, "w1", 0, 1, 1, 1, 5));
  ASSERT_OK(store_->AddCheckpoint(CheckpointRow{.job_id = a.id, .epoch = at.epoch, .step = 8, .dir = "/ck"}));
  ASSERT_OK(store_->UpsertWorker(WorkerRow{.id = "w1", .devices = {{.index = 0, .name = "H100"}}}));
  ASSERT_OK(store_->AddEvent(EventRow{.job_id = a.id, .kind = "placed"}).status());
  ASSERT_OK(store_->AddMetrics({MetricRow{.job_id = a.id, .epoch = 1, .step = 1, .loss = 2.5}}));

  Reopen();
  EXPECT_EQ(store_->schema_version(), 15);
  ASSERT_OK_AND_ASSIGN(auto jobs, store_->ListJobs({}));
  EXPECT_EQ(Ids(jobs), (std::vector<std::string>{a.id, b.id}));
  ASSERT_OK_AND_ASSIGN(JobRow got_b, store_->GetJob(b.id));
  EXPECT_EQ(got_b.state, JobStateCode::kPreempted);
  EXPECT_EQ(got_b.steps_done, 12);
  ASSERT_OK_AND_ASSIGN(auto running, store_->RunningAttempts());
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].epoch, at.epoch);
  ASSERT_OK_AND_ASSIGN(CheckpointRow ck, store_->LatestCheckpoint(a.id));
  EXPECT_EQ(ck.step, 8);
  ASSERT_OK_AND_ASSIGN(auto workers, store_->ListWorkers());
  ASSERT_EQ(workers.size(), 1u);
  ASSERT_EQ(workers[0].devices.size(), 1u);
  EXPECT_EQ(workers[0].devices[0].name, "H100");
  ASSERT_OK_AND_ASSIGN(auto events, store_->ListEvents(a.id, 0, 0));
  EXPECT_EQ(events.size(), 2u);
  ASSERT_OK_AND_ASSIGN(auto metrics, store_->ListMetrics(a.id, 0, 0));
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].loss, 2.5);

  // The id counter and the idempotency key survive too.
  bool duplicate = false;
  ASSERT_OK_AND_ASSIGN(JobRow again, store_->CreateJob(NewJob("a", 1, "req-a"), &duplicate));
  EXPECT_TRUE(duplicate);
  EXPECT_EQ(again.id, a.id);
  ASSERT_OK_AND_ASSIGN(JobRow c, store_->CreateJob(NewJob("c"), nullptr));
  EXPECT_EQ(c.id, "j-000003");
}

// Reads lines ("j-000001\n") from `fd` until EOF or `want` lines.
void ReadIds(int fd, size_t want, std::string* buf, std::vector<std::string>* ids) {
  char chunk[4096];
  while (ids->size() < want) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n <= 0) return;
    buf->append(chunk, n);
    size_t nl;
    while ((nl = buf->find('\n')) != std::string::npos) {
      ids->push_back(buf->substr(0, nl));
      buf->erase(0, nl + 1);
    }
  }
}

// Forks a child that opens the database at `path` (the parent must have
// closed its own) and runs `body` with it and the write end of a pipe, then
// exits 0 (2 when the database does not open). Returns the child's pid and,
// in *fd, the pipe's read end.
pid_t ForkDatabaseOwner(const std::string& path, int* fd, const std::function<void(Store&, int)>& body) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto store = Store::Open(path);
    if (!store.ok()) _exit(2);
    body(**store, fds[1]);
    _exit(0);
  }
  close(fds[1]);
  *fd = fds[0];
  return pid;
}

// Writes `line` to `fd` whole, or ends the (child) process with 4.
void WriteLineOrExit(int fd, const std::string& line) {
  if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(4);
}

TEST_F(StoreTest, SigkillMidwayKeepsEveryAcknowledgedJob) {
  store_.reset();  // the child owns the database
  int fd = -1;
  // Child: submit forever, reporting each id once CreateJob returned OK.
  const pid_t pid = ForkDatabaseOwner(path_, &fd, [](Store& store, int out) {
    for (int i = 0;; ++i) {
      auto job =
          store.CreateJob(NewJob("crash-" + std::to_string(i), 0, "req-" + std::to_string(i)), nullptr);
      if (!job.ok()) _exit(3);
      WriteLineOrExit(out, job->id + "\n");
    }
  });
  ASSERT_GE(pid, 0);
  std::string buf;
  std::vector<std::string> acked;
  ReadIds(fd, 60, &buf, &acked);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ReadIds(fd, SIZE_MAX, &buf, &acked);  // what it acknowledged before dying
  close(fd);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited with " << WEXITSTATUS(wstatus);
  ASSERT_GE(acked.size(), 60u);

  Reopen();
  for (const std::string& id : acked) {
    ASSERT_OK(store_->GetJob(id).status());
    ASSERT_OK_AND_ASSIGN(auto events, store_->ListEvents(id, 0, 0));
    EXPECT_EQ(events.size(), 1u) << id;
  }
  // At most one more: committed, then killed before it was reported.
  ASSERT_OK_AND_ASSIGN(auto jobs, store_->ListJobs({}));
  EXPECT_GE(jobs.size(), acked.size());
  EXPECT_LE(jobs.size(), acked.size() + 1);
  std::printf("child acknowledged %zu jobs before SIGKILL; %zu on reopen\n", acked.size(), jobs.size());
}

// The database's -wal (or -shm) deleted under a running store, as an
// operator's cleanup script or a backup tool would: the child store goes on
// committing, then ends without closing (as kill -9 would). Every job it
// acknowledged is in the database on reopen: the first commit after the
// deletion is saved into the main file before it is acknowledged, later ones
// are refused naming the file until Recover has reopened the database, and
// what is acknowledged after that is durable too.
TEST_F(StoreTest, DeletedWalStopsAcknowledgingAndLosesNoAcknowledgedSubmit) {
  for (const std::string suffix : {"-wal", "-shm"}) {
    SCOPED_TRACE(suffix);
    store_.reset();  // the child owns the database
    int fd = -1;
    const std::string file = path_ + suffix;
    const pid_t pid = ForkDatabaseOwner(path_, &fd, [&](Store& store, int out) {
      auto submit = [&](const std::string& name) {
        auto job = store.CreateJob(NewJob(name, 0, "req-" + name), nullptr);
        WriteLineOrExit(out, (job.ok() ? "ack " + job->id : "refused " + job.status().ToString()) + "\n");
      };
      for (int i = 0; i < 5; ++i) submit("before-" + suffix + std::to_string(i));
      if (unlink(file.c_str()) != 0) _exit(5);
      for (int i = 0; i < 3; ++i) submit("after-" + suffix + std::to_string(i));
      WriteLineOrExit(out, "recover " + store.Recover().ToString() + "\n");
      submit("recovered-" + suffix);
      WriteLineOrExit(out, std::string("files ") + (fs::exists(file) ? "present" : "missing") + "\n");
    });  // exits without closing the database: nothing is checkpointed at close
    ASSERT_GE(pid, 0);
    std::string buf;
    std::vector<std::string> lines;
    ReadIds(fd, SIZE_MAX, &buf, &lines);
    close(fd);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
    ASSERT_EQ(lines.size(), 11u) << ::testing::PrintToString(lines);
    std::vector<std::string> acked;
    for (const std::string& l : lines)
      if (l.rfind("ack ", 0) == 0) acked.push_back(l.substr(4));
    EXPECT_EQ(acked.size(), 7u) << "five before, one saved at the deletion, one after recovery: "
                                << ::testing::PrintToString(lines);
    EXPECT_THAT(lines[6], ::testing::HasSubstr("refused IOError: " + path_ + ": " + file +
                                               " was deleted or replaced while ftd had the database open"));
    EXPECT_THAT(lines[6], ::testing::HasSubstr("copied everything it had committed into " + path_));
    EXPECT_EQ(lines[8], "recover OK");
    EXPECT_EQ(lines[10], "files present") << "the reopened database has its own " << suffix;
    Reopen();
    for (const std::string& id : acked) EXPECT_TRUE(store_->GetJob(id).ok()) << id << " was acknowledged";
    ASSERT_OK(store_->CheckFiles());
  }
}

// The database file itself deleted under a running store: it cannot be
// reopened, so the store writes what it holds to a copy beside the path, names
// it with the fix, and refuses writes; the copy holds every acknowledged job.
TEST_F(StoreTest, ADeletedDatabaseFileIsSavedToACopyAndWritesAreRefused) {
  std::vector<std::string> acked;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(JobRow j, store_->CreateJob(NewJob("kept-" + std::to_string(i)), nullptr));
    acked.push_back(j.id);
  }
  ASSERT_TRUE(fs::remove(path_));
  const Status files = store_->CheckFiles();
  ASSERT_TRUE(files.IsIOError()) << files.ToString();
  EXPECT_THAT(files.message(), ::testing::HasSubstr(path_ + " was deleted or replaced"));
  EXPECT_THAT(files.message(), ::testing::HasSubstr("stop ftd, move that file to " + path_));
  EXPECT_FALSE(store_->CreateJob(NewJob("refused"), nullptr).ok());
  EXPECT_FALSE(store_->Recover().ok()) << "no reopening without the file";
  std::string copy;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.path().filename().string().rfind("ftd.db.saved-", 0) == 0) copy = e.path().string();
  ASSERT_FALSE(copy.empty()) << files.message();
  EXPECT_THAT(files.message(), ::testing::HasSubstr(copy));
  store_.reset();
  fs::rename(copy, path_);
  for (const char* suffix : {"-wal", "-shm"}) fs::remove(path_ + suffix);
  Reopen();
  for (const std::string& id : acked) EXPECT_TRUE(store_->GetJob(id).ok()) << id;
}

// Disk full on ftd's data dir, made with RLIMIT_FSIZE (EFBIG, what a full
// filesystem's ENOSPC looks like to SQLite): the write that does not fit fails
// with a clear IOError, every job acknowledged before it is on disk, and once
// the limit is lifted Recover succeeds and writes work again on the same
// Store. (That Recover fails while the disk is full is shown by e2e_test's
// full data dir: a file-size limit leaves the WAL room to be reused.)
TEST_F(StoreTest, DiskFullRefusesTheWriteKeepsEveryAcknowledgedJobAndRecovers) {
  store_.reset();  // the child owns the database
  int fd = -1;
  const std::string path = path_;
  const pid_t pid = ForkDatabaseOwner(path_, &fd, [&path](Store& store, int out) {
    signal(SIGXFSZ, SIG_IGN);  // as ftd does: the write fails instead of killing the process
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    const rlim_t unlimited = limit.rlim_cur;
    limit.rlim_cur = static_cast<rlim_t>(std::filesystem::file_size(path) + 256 * 1024);
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(5);
    for (int i = 0; i < 1'000'000; ++i) {
      auto job = store.CreateJob(NewJob("full-" + std::to_string(i), 0, "req-" + std::to_string(i)), nullptr);
      if (job.ok()) {
        WriteLineOrExit(out, job->id + "\n");
        continue;
      }
      WriteLineOrExit(out, "error: " + job.status().ToString() + "\n");
      WriteLineOrExit(out, "sticky: " + store.sticky_error().ToString() + "\n");
      limit.rlim_cur = unlimited;  // space again
      if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(6);
      WriteLineOrExit(out, "recovered: " + store.Recover().ToString() + "\n");
      auto after = store.CreateJob(NewJob("after", 0, "req-after"), nullptr);
      WriteLineOrExit(out, "after: " + (after.ok() ? after->id : after.status().ToString()) + "\n");
      return;
    }
    _exit(3);  // never full
  });
  ASSERT_GE(pid, 0);
  std::string buf;
  std::vector<std::string> lines;
  ReadIds(fd, SIZE_MAX, &buf, &lines);
  close(fd);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  ASSERT_GE(lines.size(), 5u);
  const std::vector<std::string> tail(lines.end() - 4, lines.end());
  lines.resize(lines.size() - 4);
  EXPECT_THAT(tail[0], ::testing::HasSubstr("IOError")) << tail[0];
  EXPECT_EQ(tail[1], "sticky: " + tail[0].substr(7)) << "the failed write makes the store sticky";
  EXPECT_EQ(tail[2], "recovered: OK");
  ASSERT_THAT(tail[3], ::testing::StartsWith("after: ")) << tail[3];
  const std::string after = tail[3].substr(7);
  std::printf("acknowledged %zu jobs before the disk was full; then %s\n", lines.size(), tail[0].c_str());

  Reopen();
  for (const std::string& id : lines) EXPECT_TRUE(store_->GetJob(id).ok()) << id;
  EXPECT_TRUE(store_->GetJob(after).ok()) << tail[3];
  ASSERT_OK_AND_ASSIGN(auto jobs, store_->ListJobs({}));
  EXPECT_EQ(jobs.size(), lines.size() + 1) << "the refused write left nothing behind";
}

// Gives this (child) process a user and mount namespace of its own and
// bind-mounts `dir` onto itself there, so it can remount it read-only and back
// without privileges. Returns 0, or the failing step's errno.
int PrivateBindMount(const std::string& dir) {
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return errno;
  auto write = [](const char* file, const std::string& text) {
    FILE* f = std::fopen(file, "w");
    const bool ok = f != nullptr && std::fputs(text.c_str(), f) >= 0;
    return (f == nullptr || std::fclose(f) != 0 || !ok) ? (errno ? errno : EIO) : 0;
  };
  if (int e = write("/proc/self/setgroups", "deny"); e != 0) return e;
  if (int e = write("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1"); e != 0) return e;
  if (int e = write("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"); e != 0) return e;
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return errno;
  if (mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) != 0) return errno;
  return 0;
}

// Remounts the bind mount of `dir` read-only or read-write, keeping the flags
// it has (the kernel refuses to drop nosuid/nodev/noexec in a user namespace).
int RemountBind(const std::string& dir, bool read_only) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return errno;
  unsigned long flags = MS_REMOUNT | MS_BIND | (read_only ? MS_RDONLY : 0);
  const std::pair<unsigned long, unsigned long> kept[] = {
      {ST_NOSUID, MS_NOSUID},   {ST_NODEV, MS_NODEV},           {ST_NOEXEC, MS_NOEXEC},
      {ST_NOATIME, MS_NOATIME}, {ST_NODIRATIME, MS_NODIRATIME}, {ST_RELATIME, MS_RELATIME}};
  for (const auto& [st_flag, ms_flag] : kept) {
    if (st.f_flag & st_flag) flags |= ms_flag;
  }
  return mount(nullptr, dir.c_str(), nullptr, flags, nullptr) == 0 ? 0 : errno;
}

// ftd's data dir is read-only when ftd starts (a volume that came back
// read-only; Linux refuses to remount a filesystem read-only under a process
// that has files open for writing, so this is how an operator meets it):
// the store opens and reads, writes fail with a clear IOError and make it
// sticky-failed, Recover fails until the directory is writable again and then
// succeeds; every acknowledged job is kept.
TEST_F(StoreTest, ReadOnlyDataDirRefusesWritesKeepsEveryJobAndRecovers) {
  std::vector<std::string> acked;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(JobRow job, store_->CreateJob(NewJob("ro-" + std::to_string(i)), nullptr));
    acked.push_back(job.id);
  }
  store_.reset();  // ftd stops
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const int out = fds[1];
    if (int e = PrivateBindMount(dir); e != 0) {
      WriteLineOrExit(out, std::string("namespace: ") + std::strerror(e) + "\n");
      _exit(0);
    }
    if (int e = RemountBind(dir, true); e != 0) {
      WriteLineOrExit(out, std::string("remount: ") + std::strerror(e) + "\n");
      _exit(7);
    }
    auto store = Store::Open(path_);  // and starts again on the read-only directory
    if (!store.ok()) {
      WriteLineOrExit(out, "open: " + store.status().ToString() + "\n");
      _exit(9);
    }
    auto refused = (*store)->CreateJob(NewJob("refused", 0, "req-refused"), nullptr);
    WriteLineOrExit(out, "refused: " + refused.status().ToString() + "\n");
    auto read = (*store)->ListJobs({});
    WriteLineOrExit(out,
                    "read: " + (read.ok() ? std::to_string(read->size()) : read.status().ToString()) + "\n");
    WriteLineOrExit(out, "still read-only: " + (*store)->Recover().ToString() + "\n");
    if (RemountBind(dir, false) != 0) _exit(8);
    WriteLineOrExit(out, "recovered: " + (*store)->Recover().ToString() + "\n");
    auto after = (*store)->CreateJob(NewJob("after", 0, "req-after"), nullptr);
    WriteLineOrExit(out, "after: " + (after.ok() ? after->id : after.status().ToString()) + "\n");
    _exit(0);
  }
  close(fds[1]);
  std::string buf;
  std::vector<std::string> lines;
  ReadIds(fds[0], SIZE_MAX, &buf, &lines);
  close(fds[0]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
      << "child status " << wstatus << ": " << ::testing::PrintToString(lines);
  ASSERT_FALSE(lines.empty());
  // Namespaces are what makes this test need no privileges; a kernel or
  // container that refuses them (sysctl kernel.unprivileged_userns_clone=0,
  // a seccomp profile) cannot run it.
  if (lines[0].rfind("namespace: ", 0) == 0) GTEST_SKIP() << "no user namespace here: " << lines[0];
  ASSERT_EQ(lines.size(), 5u) << ::testing::PrintToString(lines);
  EXPECT_THAT(lines[0], ::testing::HasSubstr("IOError")) << lines[0];
  EXPECT_THAT(lines[0], ::testing::HasSubstr("read-only")) << lines[0];
  EXPECT_THAT(lines[0], ::testing::HasSubstr(path_)) << "the error names the database";
  EXPECT_EQ(lines[1], "read: 3") << "reads keep working";
  EXPECT_THAT(lines[2], ::testing::HasSubstr("IOError")) << lines[2];
  EXPECT_EQ(lines[3], "recovered: OK");
  ASSERT_THAT(lines[4], ::testing::StartsWith("after: ")) << lines[4];
  Reopen();
  for (const std::string& id : acked) EXPECT_TRUE(store_->GetJob(id).ok()) << id;
  EXPECT_TRUE(store_->GetJob(lines[4].substr(7)).ok()) << lines[4];
  ASSERT_OK_AND_ASSIGN(auto jobs, store_->ListJobs({}));
  EXPECT_EQ(jobs.size(), 4u) << "the refused write left nothing behind";
}

// Opens `path` with plain SQLite and returns PRAGMA `name` (-1 on error).
std::string RawPragma(const std::string& path, const std::string& name) {
  sqlite3* db = nullptr;
  std::string value = "error";
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, ("PRAGMA " + name).c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return value;
}

bool RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  bool ok = sqlite3_open(path.c_str(), &db) == SQLITE_OK &&
            sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
  sqlite3_close(db);
  return ok;
}

TEST_F(StoreTest, VersionZeroDatabaseIsMigratedToTheLatest) {
  // A database that exists at user_version 0 with none of our tables.
  const std::string old_path = dir_ + "/old.db";
  ASSERT_TRUE(RawExec(old_path, "CREATE TABLE unrelated (x); INSERT INTO unrelated VALUES (1);"));
  ASSERT_EQ(RawPragma(old_path, "user_version"), "0");
  {
    auto store = OpenStore(old_path);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->schema_version(), 15);
    ASSERT_OK_AND_ASSIGN(JobRow j, store->CreateJob(NewJob("x"), nullptr));
    EXPECT_EQ(j.id, "j-000001");
  }
  EXPECT_EQ(RawPragma(old_path, "user_version"), "15");
  EXPECT_EQ(RawPragma(old_path, "journal_mode"), "wal");
  EXPECT_EQ(RawPragma(old_path, "integrity_check"), "ok");

  // Reopening at the latest version runs no migration (it would fail: tables exist).
  auto again = OpenStore(old_path);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->schema_version(), 15);
  again.reset();

  // A database from a newer ftd is refused, naming the path.
  const std::string new_path = dir_ + "/new.db";
  ASSERT_TRUE(RawExec(new_path, "PRAGMA user_version = 1000;"));
  auto newer = Store::Open(new_path);
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.status().code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(newer.status().message().find(new_path), std::string::npos) << newer.status().ToString();

  // Not a database, or an unreachable path: IOError naming the path.
  const std::string junk = dir_ + "/junk.db";
  std::FILE* f = std::fopen(junk.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("this is not an SQLite database, not at all, not even a little bit\n", f);
  std::fclose(f);
  auto bad = Store::Open(junk);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsIOError()) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find(junk), std::string::npos) << bad.status().ToString();
  auto missing = Store::Open(dir_ + "/no/such/dir/ftd.db");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsIOError()) << missing.status().ToString();
}

// ---- a VFS that fails writes on demand
//
// It is the default VFS with xWrite and xSync swapped for versions that fail
// while g_fail_writes is set: a real I/O error surfacing through SQLite, as
// a full or dying disk would give (root ignores permission bits, so chmod
// cannot provoke one).
std::atomic<bool> g_fail_writes{false};
sqlite3_vfs* g_real_vfs = nullptr;
sqlite3_vfs g_faulty_vfs;

// The unix VFS gives the database and its WAL different io_methods tables:
// each real table gets a faulty twin.
struct MethodsPair {
  const sqlite3_io_methods* real = nullptr;
  sqlite3_io_methods faulty;
};
MethodsPair g_methods[8];

const sqlite3_io_methods* RealMethods(const sqlite3_file* f) {
  for (const MethodsPair& p : g_methods) {
    if (&p.faulty == f->pMethods) return p.real;
  }
  std::abort();
}

int FaultyWrite(sqlite3_file* f, const void* data, int n, sqlite3_int64 offset) {
  return g_fail_writes ? SQLITE_IOERR_WRITE : RealMethods(f)->xWrite(f, data, n, offset);
}

int FaultySync(sqlite3_file* f, int flags) {
  return g_fail_writes ? SQLITE_IOERR_FSYNC : RealMethods(f)->xSync(f, flags);
}

// Opens with the real VFS into the same sqlite3_file, then swaps its methods.
int FaultyOpen(sqlite3_vfs*, const char* name, sqlite3_file* file, int flags, int* out_flags) {
  int rc = g_real_vfs->xOpen(g_real_vfs, name, file, flags, out_flags);
  if (file->pMethods == nullptr) return rc;
  for (MethodsPair& p : g_methods) {
    if (p.real == nullptr) {
      p.real = file->pMethods;
      p.faulty = *file->pMethods;
      p.faulty.xWrite = FaultyWrite;
      p.faulty.xSync = FaultySync;
    }
    if (p.real == file->pMethods) {
      file->pMethods = &p.faulty;
      return rc;
    }
  }
  std::abort();  // more kinds of files than g_methods has room for
}

// Opens `path` through the faulty VFS (the default VFS while Store::Open runs).
std::unique_ptr<Store> OpenFaulty(const std::string& path) {
  if (g_real_vfs == nullptr) {
    g_real_vfs = sqlite3_vfs_find(nullptr);
    g_faulty_vfs = *g_real_vfs;
    g_faulty_vfs.zName = "ft_faulty";
    g_faulty_vfs.pNext = nullptr;
    g_faulty_vfs.xOpen = FaultyOpen;
  }
  sqlite3_vfs_register(&g_faulty_vfs, /*makeDflt=*/1);
  auto store = OpenStore(path);
  sqlite3_vfs_register(g_real_vfs, /*makeDflt=*/1);
  return store;
}

TEST_F(StoreTest, FailedWriteMakesTheStoreStickyFailed) {
  store_.reset();
  store_ = OpenFaulty(path_);
  ASSERT_NE(store_, nullptr);
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(NewJob("a"), nullptr));

  g_fail_writes = true;
  auto failed = store_->CreateJob(NewJob("b"), nullptr);
  g_fail_writes = false;
  ASSERT_FALSE(failed.ok());
  const Status error = failed.status();
  EXPECT_TRUE(error.IsIOError()) << error.ToString();
  EXPECT_EQ(error.message().rfind(path_ + ": create job: ", 0), 0u) << error.ToString();
  std::printf("injected failure: %s\n", error.ToString().c_str());

  // The disk is healthy again, but every later write returns the same error.
  EXPECT_EQ(store_->CreateJob(NewJob("c"), nullptr).status(), error);
  EXPECT_EQ(store_->UpdateJob(a), error);
  EXPECT_EQ(store_->AddEvent(EventRow{.kind = "x"}).status(), error);
  EXPECT_EQ(store_->AddMetrics({MetricRow{.job_id = a.id}}), error);
  EXPECT_EQ(store_->StartAttempt(a.id, "w", 0, 1, 1, 1, 0).status(), error);
  EXPECT_EQ(store_->UpsertWorker(WorkerRow{.id = "w"}), error);
  // Reads still work.
  ASSERT_OK_AND_ASSIGN(JobRow got, store_->GetJob(a.id));
  EXPECT_EQ(got.name, "a");
  ASSERT_OK_AND_ASSIGN(auto jobs, store_->ListJobs({}));
  EXPECT_EQ(jobs.size(), 1u);

  // A fresh Store (ftd restarting) works again; the failed submit never happened.
  Reopen();
  ASSERT_OK_AND_ASSIGN(jobs, store_->ListJobs({}));
  EXPECT_EQ(Ids(jobs), std::vector<std::string>{a.id});
  ASSERT_OK_AND_ASSIGN(JobRow d, store_->CreateJob(NewJob("d"), nullptr));
  EXPECT_EQ(d.id, "j-000002");
}

TEST_F(StoreTest, ConcurrentSubmitsGetDistinctIds) {
  constexpr int kThreads = 4, kPerThread = 25;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto job = store_->CreateJob(NewJob("t"), nullptr);
        if (job.ok()) ids[t].push_back(job->id);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<std::string> all;
  for (const auto& v : ids) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
  ASSERT_OK_AND_ASSIGN(auto jobs, store_->ListJobs({}));
  EXPECT_EQ(jobs.size(), all.size());
}

TEST_F(StoreTest, SubmitThroughputBenchmark) {
  constexpr int kJobs = 500;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_OK(store_->CreateJob(NewJob("bench", 0, "bench-" + std::to_string(i)), nullptr).status());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ BENCH    ] %d sequential durable CreateJob in %.3f s: %.0f jobs/s (%s)\n", kJobs, seconds,
              kJobs / seconds, dir_.c_str());
}

// The key attempt credentials derive from (daemon/daemon.h): made once from the first candidate,
// kept across a reopen, never replaced by a later candidate.
TEST_F(StoreTest, ATeamsQuotaAndWeightAreReplacedInPlaceAndSurviveAReopen) {
  ASSERT_OK_AND_ASSIGN(auto none, store_->ListTeams());
  EXPECT_TRUE(none.empty());
  ASSERT_OK(store_->SetTeam(TeamRow{.name = "vision", .quota_devices = 4, .weight = 2, .updated_ms = 1}));
  ASSERT_OK(store_->SetTeam(TeamRow{.name = "nlp", .quota_devices = -1, .weight = 1, .updated_ms = 2}));
  ASSERT_OK(store_->SetTeam(TeamRow{.name = "vision", .quota_devices = 8, .weight = 0.5, .updated_ms = 3}));
  Reopen();
  ASSERT_OK_AND_ASSIGN(auto teams, store_->ListTeams());
  ASSERT_EQ(teams.size(), 2u);
  EXPECT_EQ(teams[0].name, "nlp");
  EXPECT_EQ(teams[0].quota_devices, -1);
  EXPECT_EQ(teams[1].name, "vision");
  EXPECT_EQ(teams[1].quota_devices, 8);
  EXPECT_DOUBLE_EQ(teams[1].weight, 0.5);
  EXPECT_EQ(teams[1].updated_ms, 3);
}

// Money and team limits (schema 13): an attempt keeps its price (and, schema 15, the job the
// scheduler stopped it for), a worker the price it reported, a
// team its cap on queued jobs and its budget (or none); EndedSpendByTeam sums the ended attempts'
// device-seconds (world x wall) at their prices by their job's team, and EndedAttemptTotals the
// same split by category; UsageSpans lists the attempts that ran after a time, running ones too.
TEST_F(StoreTest, PricesBudgetsAndUsageSpansSurviveAReopen) {
  JobRow nlp_job = NewJob("a");
  nlp_job.team = "nlp";
  ASSERT_OK_AND_ASSIGN(JobRow a, store_->CreateJob(nlp_job, nullptr));
  ASSERT_OK_AND_ASSIGN(AttemptRow a1, store_->StartAttempt(a.id, "w1", 0, 1, 1, 2, 1'000,
                                                           {{"w1", 0}, {"w2", 0}}, "spot", 3.6));
  EXPECT_DOUBLE_EQ(a1.price, 3.6);
  const GoodputSplit split{.productive_s = 10, .checkpoint_s = 2, .restart_s = 4, .lost_s = 4};
  ASSERT_OK(store_->EndAttempt(a.id, a1.epoch, AttemptOutcomeCode::kPreempted, "x", 5, 0, 11'000, false, 0,
                               &split));  // 10 s x 2 ranks x $3.60/h = $0.02
  ASSERT_OK_AND_ASSIGN(AttemptRow a2, store_->StartAttempt(a.id, "w1", 5, 1, 1, 1, 20'000, {}, "spot", 7.2));
  ASSERT_OK(store_->UpsertWorker(WorkerRow{.id = "w1", .pool = "spot", .price = 1.25}));
  ASSERT_OK(store_->MarkPreemptedFor(a.id, a2.epoch, "j-000009"));
  EXPECT_TRUE(store_->MarkPreemptedFor(a.id, 99, "j-000009").IsNotFound());
  ASSERT_OK(store_->SetTeam(TeamRow{.name = "nlp", .max_queued = 5, .budget = 100, .updated_ms = 1}));
  ASSERT_OK(store_->SetTeam(TeamRow{.name = "vision", .updated_ms = 1}));
  Reopen();
  ASSERT_OK_AND_ASSIGN(auto attempts, store_->ListAttempts(a.id));
  EXPECT_DOUBLE_EQ(attempts[0].price, 3.6);
  EXPECT_DOUBLE_EQ(attempts[1].price, 7.2);
  EXPECT_EQ(attempts[0].preempted_for, "");
  EXPECT_EQ(attempts[1].preempted_for, "j-000009") << "whom the scheduler stopped it for";
  ASSERT_OK_AND_ASSIGN(auto workers, store_->ListWorkers());
  EXPECT_DOUBLE_EQ(workers[0].price, 1.25);
  ASSERT_OK_AND_ASSIGN(auto teams, store_->ListTeams());
  EXPECT_EQ(teams[0].max_queued, 5);
  EXPECT_EQ(teams[0].budget, std::optional<double>(100));
  EXPECT_EQ(teams[1].max_queued, -1);
  EXPECT_FALSE(teams[1].budget.has_value());
  ASSERT_OK_AND_ASSIGN(auto spend, store_->EndedSpendByTeam());
  EXPECT_NEAR(spend["nlp"], 0.02, 1e-12) << "the running attempt is not in it";
  ASSERT_OK_AND_ASSIGN(auto by_pool, store_->EndedAttemptTotals(Store::AttemptGroup::kPool));
  EXPECT_NEAR(by_pool["spot"].cost.productive, 0.01, 1e-12);
  EXPECT_NEAR(by_pool["spot"].cost.total(), 0.02, 1e-12);
  ASSERT_OK_AND_ASSIGN(auto spans, store_->UsageSpans(5'000));
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].team, "nlp");
  EXPECT_EQ(spans[0].devices + spans[1].devices, 3);
  ASSERT_OK_AND_ASSIGN(auto recent, store_->UsageSpans(15'000));
  ASSERT_EQ(recent.size(), 1u) << "only the running one ran after 15 s";
  EXPECT_EQ(recent[0].ended_ms, 0);
  EXPECT_EQ(recent[0].started_ms, 20'000);
}

// Webhooks' outbox (schema 14): a new webhook starts at the newest event; a delivery is queued
// once however often it is offered, its cursor only moves forward, and a removed webhook takes
// its deliveries with it and gets no more.
TEST_F(StoreTest, AWebhookDeliveryIsQueuedOnceAndItsCursorOnlyMovesForward) {
  ASSERT_OK_AND_ASSIGN(JobRow job, store_->CreateJob(NewJob("a"), nullptr));  // its "queued" event
  ASSERT_OK_AND_ASSIGN(auto events, store_->ListEvents("", 0, 0));
  ASSERT_OK_AND_ASSIGN(
      WebhookRow hook,
      store_->AddWebhook(WebhookRow{.id = "wh-1", .url = "http://x/", .events = "failed", .secret = "s"}));
  EXPECT_EQ(hook.cursor, events.back().seq);
  EXPECT_EQ(store_->AddWebhook(WebhookRow{.id = "wh-1"}).status().code(), Status::Code::kFailedPrecondition);
  const WebhookDeliveryRow d{.webhook_id = "wh-1", .event_seq = 7, .body = "{}", .next_ms = 100};
  ASSERT_OK(store_->QueueWebhookDeliveries({d}, {{"wh-1", 9}}));
  ASSERT_OK(store_->QueueWebhookDeliveries({d}, {{"wh-1", 8}}));  // offered again, an older cursor
  Reopen();
  ASSERT_OK_AND_ASSIGN(auto hooks, store_->ListWebhooks());
  ASSERT_EQ(hooks.size(), 1u);
  EXPECT_EQ(hooks[0].cursor, 9);
  EXPECT_EQ(hooks[0].secret, "s");
  ASSERT_OK_AND_ASSIGN(auto due, store_->DueWebhookDeliveries(99, 0));
  EXPECT_TRUE(due.empty());
  ASSERT_OK_AND_ASSIGN(due, store_->DueWebhookDeliveries(100, 0));
  ASSERT_EQ(due.size(), 1u);
  due[0].attempts = 1;
  due[0].next_ms = 500;
  due[0].last_error = "HTTP 500";
  ASSERT_OK(store_->RetryWebhookDelivery(due[0]));
  ASSERT_OK_AND_ASSIGN(due, store_->DueWebhookDeliveries(500, 0));
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].last_error, "HTTP 500");
  ASSERT_OK_AND_ASSIGN(auto pending, store_->PendingWebhookDeliveries());
  EXPECT_EQ(pending, (std::map<std::string, int64_t>{{"wh-1", 1}}));
  ASSERT_OK(store_->RemoveWebhook("wh-1"));
  EXPECT_TRUE(store_->RemoveWebhook("wh-1").IsNotFound());
  ASSERT_OK(store_->QueueWebhookDeliveries({d}, {{"wh-1", 10}}));  // a removed webhook gets nothing
  ASSERT_OK_AND_ASSIGN(pending, store_->PendingWebhookDeliveries());
  EXPECT_TRUE(pending.empty());
  (void)job;
}

TEST_F(StoreTest, TheAttemptKeyIsMadeOnceAndSurvivesAReopen) {
  EXPECT_TRUE(store_->AttemptKey("").status().IsNotFound());
  ASSERT_OK_AND_ASSIGN(std::string key, store_->AttemptKey("first-candidate"));
  EXPECT_EQ(key, "first-candidate");
  Reopen();
  ASSERT_OK_AND_ASSIGN(std::string again, store_->AttemptKey("second-candidate"));
  EXPECT_EQ(again, "first-candidate");
  ASSERT_OK_AND_ASSIGN(again, store_->AttemptKey(""));
  EXPECT_EQ(again, "first-candidate");
}

TEST_F(StoreTest, AFailedHeartbeatWriteLeavesTheConnectionFsyncing) {
  ASSERT_OK_AND_ASSIGN(int level, store_->SynchronousLevel());
  EXPECT_EQ(level, 2);  // FULL
  // Relaxed writes that fail (an unknown job) roll back inside
  // their transaction; the connection must come back to FULL regardless.
  EXPECT_TRUE(store_->RecordProgress(ProgressRow{.job_id = "j-999999", .epoch = 1, .step = 3}).IsNotFound());
  ASSERT_OK_AND_ASSIGN(level, store_->SynchronousLevel());
  EXPECT_EQ(level, 2);
  // And after a relaxed write that succeeds.
  ASSERT_OK(store_->UpsertWorker(WorkerRow{.id = "w1"}));
  ASSERT_OK(store_->TouchWorkers({{"nobody", 1}, {"w1", 5}}));  // an unknown id is skipped
  ASSERT_OK_AND_ASSIGN(level, store_->SynchronousLevel());
  EXPECT_EQ(level, 2);
  ASSERT_OK_AND_ASSIGN(auto workers, store_->ListWorkers());
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].last_seen_ms, 5);
  EXPECT_TRUE(workers[0].alive);
}

}  // namespace
}  // namespace ft
