// A multi-rank job end to end: ftd gang-places its two ranks on two workers
// (real ftd, ft-worker and ft-train processes; Gloo over loopback), a node is
// killed mid-run, every rank of the attempt stops, the job waits until two
// devices are free again, resumes from its committed checkpoint and ends with
// the adapter bytes of an uninterrupted one-rank run (exact gradient sums,
// issue #30: the world size does not change a bit). An elastic job resumes at
// world 1 and then 4 with those bytes too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "tests/e2e/cluster.h"
#include "tests/support/free_port.h"

namespace ft::e2e {
namespace {

namespace pb = ftune::v1;
using ::testing::HasSubstr;
using testing_support::FreeLoopbackPort;

std::string Adapter(const std::string& out) { return Slurp(out + "/adapter/adapter_model.safetensors"); }

// A worker that can hold ranks: reachable on loopback, rendezvous ports of its own (a range, so
// that an epoch whose port another process took moves to another one).
Proc& StartRankWorker(Cluster& c, const std::string& id) {
  const int port = FreeLoopbackPort();
  return c.StartWorker(id, {"--address", "127.0.0.1", "--rendezvous-ports",
                            std::to_string(port) + "-" + std::to_string(port + 9)});
}

// The same job trained by one ft-train alone (resources.gpus 1), uninterrupted: the reference.
std::string RunOneRankReference(Cluster& c, const std::string& job_yaml) {
  std::string text = Slurp(job_yaml);
  text.replace(text.find("gpus: 2"), 7, "gpus: 1");
  const std::string one = job_yaml.substr(0, job_yaml.size() - 5) + "-one-rank.yaml";
  std::ofstream(one) << text;
  return c.RunReference(one);
}

TEST(E2EGang, TwoRanksOnTwoWorkersSurviveANodeKillAndMatchTheUninterruptedRun) {
  Cluster c("gang");
  const std::string job = c.WriteJob("gang", 120, 10, "resources: {device: cpu, gpus: 2}\n", /*dropout=*/0.1);
  StartRankWorker(c, "w1");
  const std::string id = c.Submit(job);
  // More ranks than the cluster has devices: it waits, saying so.
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.reason().find("needs 2 cpu devices") != std::string::npos; },
      10'000);
  EXPECT_EQ(j.state(), pb::QUEUED);
  EXPECT_THAT(j.reason(), HasSubstr("needs 2 cpu devices (one per rank); the idle workers offer 1"));

  StartRankWorker(c, "w2");
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.committed_step() >= 20; }, 120'000);
  ASSERT_EQ(j.state(), pb::RUNNING) << j.reason() << "\n" << Slurp(c.dir() + "/worker-w1.log");
  ASSERT_EQ(j.attempts_size(), 1);
  ASSERT_EQ(j.attempts(0).ranks_size(), 2);
  std::set<std::string> gang = {j.attempts(0).ranks(0).worker_id(), j.attempts(0).ranks(1).worker_id()};
  EXPECT_EQ(gang, (std::set<std::string>{"w1", "w2"})) << "one rank on each worker";
  EXPECT_EQ(j.plan().world(), 2);
  // ftctl status lists the ranks and their devices' memory.
  const std::string status_log = c.dir() + "/ftctl-status.log";
  Proc status = Spawn({FTCTL_BIN, "--addr", c.address(), "status", id}, {.log = status_log});
  ASSERT_EQ(status.Wait(), 0) << Slurp(status_log);
  EXPECT_THAT(Slurp(status_log), HasSubstr("rank 1 on"));
  EXPECT_THAT(Slurp(status_log), HasSubstr("cpu:0"));

  // The node of rank 1 dies: rank 0 loses its peer at once, the lease tells ftd.
  const std::string victim = j.attempts(0).ranks(1).worker_id();
  const std::string survivor = j.attempts(0).ranks(0).worker_id();
  c.KillNode(victim);
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.state() == pb::QUEUED; }, c.lease_ms() + 15'000);
  ASSERT_EQ(j.state(), pb::QUEUED) << j.reason();
  EXPECT_EQ(j.attempts(0).outcome(), pb::ATTEMPT_PREEMPTED) << j.attempts(0).reason();
  // Rank 0 was stopped too: no trainer of the first attempt is left on the survivor.
  const std::string pattern = c.dir() + "[/]w-" + survivor + "/.*-e1\\.yaml";
  for (int i = 0; i < 100 && std::system(("pgrep -f '" + pattern + "' >/dev/null").c_str()) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(std::system(("pgrep -f '" + pattern + "' >/dev/null").c_str()), 0) << "rank 0 still runs";
  // One device is not enough: it waits for a second one.
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.reason().find("needs 2 cpu devices") != std::string::npos; },
      10'000);
  EXPECT_EQ(j.state(), pb::QUEUED) << j.reason();

  StartRankWorker(c, victim);
  j = c.WaitFor(id, Done, 240'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason() << "\n"
                                      << Slurp(c.dir() + "/worker-" + survivor + ".log");
  EXPECT_EQ(j.failures(), 0);
  EXPECT_GE(j.preemptions(), 1);
  EXPECT_GE(j.attempts_size(), 2);
  EXPECT_EQ(j.attempts(j.attempts_size() - 1).ranks_size(), 2);
  EXPECT_LE(j.attempts(0).steps_lost(), 10) << "at most one checkpoint interval";
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(RunOneRankReference(c, job)))
      << "the resumed 2-rank run differs from an uninterrupted one-rank run";
}

// Polls ftd until every worker in `ids` is alive with `devices` devices.
void WaitForWorkers(Cluster& c, const std::set<std::string>& ids, int devices) {
  for (int i = 0; i < 600; ++i) {
    auto reply = c.client().Workers();
    size_t ready = 0;
    if (reply.ok()) {
      for (const pb::WorkerInfo& w : reply->workers()) {
        ready += ids.count(w.id()) && w.alive() && w.devices_size() == devices ? 1 : 0;
      }
    }
    if (ready == ids.size()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  FAIL() << "workers did not register";
}

// Issue #30 through ftd: an elastic job (resources.gpus 4, min_gpus 1) starts on the two devices
// there are (world 2, gang-placed across two workers); its rank 1's node is killed and it resumes
// on the one device left (world 1); that node is killed too, and it resumes on two new workers
// with two devices each (world 4). Same micro-batch size and exact gradient sums throughout: the
// final adapter has the bytes of an uninterrupted one-rank ft-train run, and each resumed
// attempt's log says it continues byte for byte.
TEST(E2EGang, AnElasticJobResumesAtWorldOneThenFourWithTheBytesOfOneRank) {
  Cluster c("elastic");
  const std::string job =
      c.WriteJob("elastic", 160, 10, "resources: {device: cpu, gpus: 4, min_gpus: 1}\n", /*dropout=*/0.1);
  StartRankWorker(c, "w1");
  StartRankWorker(c, "w2");
  WaitForWorkers(c, {"w1", "w2"}, 1);
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.committed_step() >= 20; }, 120'000);
  ASSERT_EQ(j.state(), pb::RUNNING) << j.reason() << "\n" << Slurp(c.dir() + "/worker-w1.log");
  ASSERT_EQ(j.attempts_size(), 1);
  ASSERT_EQ(j.attempts(0).ranks_size(), 2) << "the most ranks two devices allow";

  // Rank 1's node dies: the job resumes on the one device left, at world 1.
  const std::string survivor = j.attempts(0).ranks(0).worker_id();
  c.KillNode(j.attempts(0).ranks(1).worker_id());
  int64_t committed = 0;
  j = c.WaitFor(
      id,
      [&](const pb::Job& j) {
        if (j.attempts_size() == 2 && j.state() == pb::RUNNING) {
          if (committed == 0) committed = j.committed_step();
          return j.committed_step() >= committed + 20;
        }
        return false;
      },
      c.lease_ms() + 120'000);
  ASSERT_EQ(j.attempts_size(), 2) << j.reason();
  EXPECT_EQ(j.attempts(0).outcome(), pb::ATTEMPT_PREEMPTED) << j.attempts(0).reason();
  EXPECT_EQ(j.attempts(1).worker_id(), survivor);
  EXPECT_LE(j.attempts(1).ranks_size(), 1) << "world 1";
  EXPECT_EQ(j.plan().world(), 1);

  // Held still while two workers with two devices each come; then its node dies as well.
  c.SignalTrainers(survivor, SIGSTOP);
  for (const char* w : {"w3", "w4"}) {
    const int port = FreeLoopbackPort();
    c.StartWorker(w, {"--cpu-devices", "2", "--address", "127.0.0.1", "--rendezvous-ports",
                      std::to_string(port) + "-" + std::to_string(port + 9)});
  }
  WaitForWorkers(c, {"w3", "w4"}, 2);
  c.KillNode(survivor);
  j = c.WaitFor(id, Done, 240'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason() << "\n" << Slurp(c.dir() + "/worker-w3.log");
  ASSERT_EQ(j.attempts_size(), 3);
  EXPECT_EQ(j.attempts(2).ranks_size(), 4) << "world 4 on the two new workers";
  EXPECT_EQ(j.failures(), 0);
  const std::string log = Slurp(c.data_dir() + "/logs/" + id + ".log");
  EXPECT_THAT(log,
              HasSubstr("x world 2 -> micro-batch 2 x accumulation 4 x world 1: same micro-batch size and "
                        "exact gradient sums, so training continues byte for byte"));
  EXPECT_THAT(log,
              HasSubstr("x world 1 -> micro-batch 2 x accumulation 1 x world 4: same micro-batch size and "
                        "exact gradient sums, so training continues byte for byte"));
  std::string text = Slurp(job);
  text.replace(text.find("gpus: 4, min_gpus: 1"), 20, "gpus: 1");
  const std::string one = job.substr(0, job.size() - 5) + "-one-rank.yaml";
  std::ofstream(one) << text;
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(c.RunReference(one)))
      << "the run at world 2, 1 and 4 differs from an uninterrupted one-rank run";
}

TEST(E2EGang, OneWorkerWithTwoCpuDevicesRunsBothRanks) {
  Cluster c("gang-one");
  const std::string job = c.WriteJob("pair", 30, 10, "resources: {device: cpu, gpus: 2}\n");
  const int port = FreeLoopbackPort();
  c.StartWorker("w1", {"--cpu-devices", "2", "--address", "127.0.0.1", "--rendezvous-ports",
                       std::to_string(port) + "-" + std::to_string(port + 9)});
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(id, Done, 120'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason() << "\n" << Slurp(c.dir() + "/worker-w1.log");
  ASSERT_EQ(j.attempts_size(), 1);
  ASSERT_EQ(j.attempts(0).ranks_size(), 2);
  EXPECT_EQ(j.attempts(0).ranks(0).worker_id(), "w1");
  EXPECT_EQ(j.attempts(0).ranks(1).worker_id(), "w1");
  EXPECT_NE(j.attempts(0).ranks(0).device_index(), j.attempts(0).ranks(1).device_index());
  // Rank 1's output reaches the job's log, marked as its own.
  EXPECT_THAT(Slurp(c.data_dir() + "/logs/" + id + ".log"), HasSubstr("[rank 1] "));
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(RunOneRankReference(c, job))) << "the same bytes as one rank";
}

}  // namespace
}  // namespace ft::e2e
