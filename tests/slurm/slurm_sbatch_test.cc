// deploy/slurm/ftune-worker.sbatch as shipped, run by a real slurmctld and
// slurmd (tests/slurm/slurm_cluster.h; Debian's Slurm 22.05, which does not
// set SLURM_JOB_END_TIME, so the script's squeue fallback is what gives
// ft-worker its slot end). ftd runs outside Slurm (tests/e2e/cluster.h); every
// ft-worker comes from sbatch, with overrides only through sbatch options and
// the environment (CPU only, a short --time, a shorter --stop-grace).
//
// Two CPU LoRA jobs of one spec, sized to about a minute of training here,
// go through four ends of an allocation, each of which must lose no step:
//  1. time limit: a 1-minute allocation whose end ft-worker knows only from
//     squeue (Slurm's --signal off): the trainer checkpoints and stops before
//     the end, Slurm's time limit ends the allocation, the next one resumes;
//  2. signal backstop: the end hidden from ft-worker, Slurm's end brought to
//     180 s away so the script's own `--signal=B:USR1@180` is due: SIGUSR1
//     alone saves the work and the allocation completes (exit 0);
//  3. scancel mid-step: SIGTERM, a checkpoint within KillWait;
//  4. the node drained under a running allocation, then `scontrol requeue`:
//     the allocation waits while the node is drained and runs again after it
//     is resumed.
// Both jobs then finish with adapters byte-identical to an uninterrupted
// ft-train run of the same spec.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/cluster.h"
#include "tests/slurm/slurm_cluster.h"

namespace ft::slurm_test {
namespace {

namespace pb = ftune::v1;
using e2e::Cluster;
using e2e::Done;
using ::testing::HasSubstr;
using testing_support::Slurp;
using testing_support::TempPath;

constexpr char kScript[] = FT_SOURCE_DIR "/deploy/slurm/ftune-worker.sbatch";
constexpr int64_t kKillWaitMs = 30'000;  // slurm_cluster.cc's KillWait
// Each job's length, in seconds of training here with three ft-train side by
// side: the cases need both jobs running until about 50 s after they are
// submitted (the 1-minute allocation's stop point; the chain's requeue after
// a signal that comes within 30 s). Calibration alone cannot promise that (a
// CI run whose load eased after it trained 1.5x faster and finished the
// time-limit job before its slot end), so a Pacer also holds each job to
// this length at the most.
constexpr double kTrainSeconds = 70;

// The job's n-th attempt (from 0); an empty one when it has not that many.
pb::Attempt Nth(const pb::Job& j, int n) { return n < j.attempts_size() ? j.attempts(n) : pb::Attempt(); }

std::string Adapter(const std::string& out) { return Slurp(out + "/adapter/adapter_model.safetensors"); }

// Step lines in an output dir's metrics.jsonl.
int CountSteps(const std::string& out) {
  const std::string text = Slurp(out + "/metrics.jsonl");
  int n = 0;
  for (size_t at = 0; (at = text.find("\"step_seconds\"", at)) != std::string::npos; ++at) ++n;
  return n;
}

// Steps of the test's job that take about `seconds` here while three
// ft-train run side by side (the test's two jobs and their reference),
// measured on three short runs of the same job started together (each from
// its 20th step to its exit; the fastest counts).
int64_t StepsForSeconds(Cluster& c, double seconds) {
  constexpr int kSteps = 100, kFrom = 20, kRuns = 3;
  using Clock = std::chrono::steady_clock;
  struct Run {
    testing_support::Proc proc;
    std::string out;
    Clock::time_point from{}, end{};
  };
  std::vector<Run> runs;
  for (int i = 0; i < kRuns; ++i) {
    auto [proc, out] = c.StartReference(c.WriteJob("calibrate" + std::to_string(i), kSteps, 1000));
    runs.push_back({proc, out});
  }
  for (int done = 0; done < kRuns; std::this_thread::sleep_for(std::chrono::milliseconds(5))) {
    for (Run& r : runs) {
      if (r.from == Clock::time_point{} && CountSteps(r.out) >= kFrom) r.from = Clock::now();
      if (r.end != Clock::time_point{}) continue;
      const int rc = r.proc.WaitFor(std::chrono::milliseconds(0));
      if (rc > 0) throw std::runtime_error("calibration run failed: " + Slurp(r.proc.log));
      if (rc == 0) r.end = Clock::now(), ++done;
    }
  }
  double per_step = 1e9;  // the fastest run's
  for (const Run& r : runs) {
    if (r.from == Clock::time_point{}) continue;  // it never showed its 20th step
    per_step = std::min(per_step, std::chrono::duration<double>(r.end - r.from).count() / (kSteps - kFrom));
  }
  if (per_step >= 1e9) throw std::runtime_error("calibration runs wrote no steps");
  return static_cast<int64_t>(seconds / per_step);
}

// The arguments of a running process (from /proc); empty once it is gone.
std::vector<std::string> Cmdline(const std::string& pid) {
  const std::string raw = Slurp("/proc/" + pid + "/cmdline");
  std::vector<std::string> args;
  for (size_t at = 0; at < raw.size();) {
    const size_t end = raw.find('\0', at);
    args.push_back(raw.substr(at, end == std::string::npos ? std::string::npos : end - at));
    at = end == std::string::npos ? raw.size() : end + 1;
  }
  return args;
}

// Holds jobs to at most `steps` steps in `seconds` from when they are paced:
// while a job's metrics.jsonl shows it ahead of that pace, every ft-train of
// the job (`--job-id ID` on its command line) is stopped (SIGSTOP), and it is
// continued (SIGCONT) as soon as it is not. A machine faster than the
// calibration said then cannot end a job before the cases that need it
// running are over; a slower one only makes the job later. The stops last
// about a step, so a trainer still checkpoints as soon as it is asked to.
// Everything stopped is continued when pacing ends or the Pacer goes.
class Pacer {
 public:
  Pacer(int64_t steps, double seconds) : steps_per_s_(steps / seconds) {}
  ~Pacer() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    for (auto& [id, job] : jobs_) Signal(id, SIGCONT);
  }

  // Paces the job from now on; `out` is its output dir.
  void Pace(const std::string& id, const std::string& out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_[id] = Job{out + "/metrics.jsonl", std::chrono::steady_clock::now()};
    }
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  int64_t stops() const { return stops_; }

 private:
  struct Job {
    std::string metrics;
    std::chrono::steady_clock::time_point from;
    int64_t steps = 0;
    std::streamoff read = 0;  // bytes of metrics counted
    bool stopped = false;
  };

  void Loop() {
    while (!done_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [id, job] : jobs_) Step(id, job);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void Step(const std::string& id, Job& job) {
    std::ifstream in(job.metrics, std::ios::binary);
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    if (size < job.read) job.read = 0, job.steps = 0;  // a new file
    if (size > job.read) {
      in.seekg(job.read);
      std::string chunk(static_cast<size_t>(size - job.read), '\0');
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const size_t whole = chunk.rfind('\n');  // count whole lines only
      if (whole != std::string::npos) {
        for (size_t at = 0; (at = chunk.find("\"step_seconds\"", at)) < whole; ++at) ++job.steps;
        job.read += static_cast<std::streamoff>(whole + 1);
      }
    }
    const double allowed =
        steps_per_s_ * std::chrono::duration<double>(std::chrono::steady_clock::now() - job.from).count();
    const bool ahead = job.steps > allowed;
    if (ahead) Signal(id, SIGSTOP);  // also a trainer that started since the last stop
    if (ahead && !job.stopped) ++stops_;
    if (!ahead && job.stopped) Signal(id, SIGCONT);
    job.stopped = ahead;
  }

  // Sends `sig` to every ft-train of the job.
  static void Signal(const std::string& id, int sig) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string pid = entry.path().filename();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::vector<std::string> args = Cmdline(pid);
      for (size_t i = 1; i + 1 < args.size(); ++i) {
        if (args[i] == "--job-id" && args[i + 1] == id && args[0] == FT_TRAIN_BIN) {
          ::kill(std::stoi(pid), sig);
          break;
        }
      }
    }
  }

  const double steps_per_s_;
  std::mutex mu_;
  std::map<std::string, Job> jobs_;
  std::atomic<bool> done_{false};
  std::atomic<int64_t> stops_{0};
  std::thread thread_;
};

// Slurm allocations of the shipped script, each an ft-worker of the cluster's ftd.
class SbatchWorkers {
 public:
  SbatchWorkers(SlurmCluster& slurm, Cluster& c) : slurm_(slurm), c_(c) {
    env_ = {{"FTUNE_DAEMON", c.address()},
            {"FTUNE_WORKER_TOKEN_FILE", slurm.dir() + "/no-token"},  // ftd here takes no token
            {"FTUNE_STOP_GRACE", "10"},
            {"TMPDIR", slurm.dir() + "/tmp"},  // the script's --work-dir
            {"FT_WORKER", WORKER_BIN},
            {"FT_WORKER_EXTRA", std::string("--ft-train ") + FT_TRAIN_BIN + " --cpu-memory 4GiB"}};
  }

  // sbatch of the script: CPU only (no GPU, one CPU, little memory), then `options`,
  // with `env` added to the environment the job gets. The Slurm job id.
  std::string Start(const std::vector<std::string>& options,
                    const std::map<std::string, std::string>& env = {}) {
    std::map<std::string, std::string> all = env_;
    for (const auto& [k, v] : env) all[k] = v;
    std::string exports = "--export=ALL";
    for (const auto& [k, v] : all) exports += "," + k + "=" + v;
    std::vector<std::string> argv = {"--chdir=" + slurm_.dir(), "--gpus-per-task=0", "--cpus-per-task=1",
                                     "--mem=256M"};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back(exports);
    return slurm_.Sbatch(argv, kScript);
  }

  static std::string WorkerId(const std::string& slurm_job) {
    return "slurm-" + slurm_job + "-" + ShortHostname();
  }
  static std::string SlurmJobOf(const std::string& worker_id) {
    std::smatch m;
    return std::regex_search(worker_id, m, std::regex("^slurm-([0-9]+)-")) ? m[1].str() : "";
  }
  std::string Log(const std::string& slurm_job) const {
    return Slurp(slurm_.dir() + "/ftune-worker-" + slurm_job + ".log");
  }

  // Waits until the allocation's ft-worker is registered with ftd and alive.
  pb::WorkerInfo WaitRegistered(const std::string& slurm_job, int64_t timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      auto workers = c_.client().Workers();
      if (workers.ok()) {
        for (const auto& w : workers->workers()) {
          if (w.id() == WorkerId(slurm_job) && w.alive()) return w;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("no ft-worker registered from Slurm job " + slurm_job + ":\n" + Log(slurm_job));
  }

 private:
  SlurmCluster& slurm_;
  Cluster& c_;
  std::map<std::string, std::string> env_;
};

class Timeline {
 public:
  void Note(const std::string& what) {
    std::printf("[%6.1f s] %s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(), what.c_str());
    std::fflush(stdout);
  }
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// The job running, `steps` past its resume point.
pb::Job RunningWithProgress(Cluster& c, const std::string& id, int64_t steps) {
  return c.WaitFor(
      id,
      [steps](const pb::Job& j) {
        return j.state() == pb::RUNNING && !j.worker_id().empty() &&
               j.steps_done() >= j.committed_step() + steps;
      },
      60'000);
}

std::string Describe(const pb::Attempt& a) {
  return "attempt " + std::to_string(a.number()) + " on " + a.worker_id() + ": steps " +
         std::to_string(a.start_step()) + ".." + std::to_string(a.end_step()) + ", lost " +
         std::to_string(a.steps_lost()) + " (" + a.reason() + ")";
}

// What the cases below share: the cluster, Slurm, the allocations, the
// timeline, the job that moves from allocation to allocation, steps lost per case.
struct Chain {
  Cluster& c;
  SlurmCluster& slurm;
  SbatchWorkers& sbatch;
  Timeline& t;
  std::string id;
  std::map<std::string, int64_t> lost;
};

// 2. The signal backstop, end hidden (allocation `signal_alloc`): the job's first preemption.
void SignalBackstop(Chain& x, const std::string& signal_alloc) {
  ASSERT_EQ(RunningWithProgress(x.c, x.id, 5).state(), pb::RUNNING);
  x.slurm.Run({"scontrol", "update", "JobId=" + signal_alloc, "EndTime=now+180"});
  const int64_t signal_end_ms = x.slurm.Job(signal_alloc).end_s * 1000;
  x.t.Note("allocation " + signal_alloc +
           " now ends in 180 s: the script's USR1@180 is due at slurmctld's next check");
  pb::Job j = x.c.WaitFor(
      x.id, [](const pb::Job& j) { return j.preemptions() >= 1; }, 45'000);
  ASSERT_EQ(j.preemptions(), 1) << "no SIGUSR1 stop: " << x.sbatch.Log(signal_alloc);
  x.t.Note("signal: " + Describe(Nth(j, 0)));
  EXPECT_THAT(Nth(j, 0).reason(), HasSubstr("SIGUSR1"));
  EXPECT_EQ(Nth(j, 0).worker_id(), SbatchWorkers::WorkerId(signal_alloc));
  EXPECT_EQ(Nth(j, 0).steps_lost(), 0);
  EXPECT_LT(Nth(j, 0).ended_ms(), signal_end_ms - 120'000) << "stopped by the signal, not at the end";
  x.lost["signal"] = Nth(j, 0).steps_lost();
  SlurmJob s = x.slurm.WaitForJob(
      signal_alloc, [](const SlurmJob& s) { return s.state == "COMPLETED"; }, 30'000);
  EXPECT_EQ(s.state, "COMPLETED") << s.raw;
  EXPECT_EQ(s.exit_code, "0:0") << "ft-worker exits 0 on SIGUSR1";
  x.sbatch.Start({"--time=10"});
}

// 3. scancel mid-step.
void ScancelMidStep(Chain& x) {
  pb::Job j = RunningWithProgress(x.c, x.id, 10);
  ASSERT_EQ(j.state(), pb::RUNNING);
  const std::string cancelled = SbatchWorkers::SlurmJobOf(j.worker_id());
  const int64_t cancel_ms = WallNowMs();
  x.slurm.Run({"scancel", cancelled});
  j = x.c.WaitFor(
      x.id, [](const pb::Job& j) { return j.preemptions() >= 2; }, kKillWaitMs + 10'000);
  ASSERT_EQ(j.preemptions(), 2) << x.sbatch.Log(cancelled);
  x.t.Note("scancel " + cancelled + ": " + Describe(Nth(j, 1)));
  EXPECT_THAT(Nth(j, 1).reason(), HasSubstr("SIGTERM"));
  EXPECT_EQ(Nth(j, 1).steps_lost(), 0);
  EXPECT_LT(Nth(j, 1).ended_ms() - cancel_ms, kKillWaitMs) << "checkpointed within KillWait";
  x.lost["scancel"] = Nth(j, 1).steps_lost();
  EXPECT_EQ(x.slurm
                .WaitForJob(
                    cancelled, [](const SlurmJob& s) { return s.state == "CANCELLED"; }, 30'000)
                .state,
            "CANCELLED");
  x.sbatch.Start({"--time=10"});
}

// 4. The node drained under a running allocation, then scontrol requeue.
void DrainThenRequeue(Chain& x) {
  pb::Job j = RunningWithProgress(x.c, x.id, 10);
  ASSERT_EQ(j.state(), pb::RUNNING);
  const std::string requeued = SbatchWorkers::SlurmJobOf(j.worker_id());
  x.slurm.DrainNode("ftune-test");
  const int64_t drained_at = j.steps_done();
  j = x.c.WaitFor(
      x.id, [&](const pb::Job& j) { return j.steps_done() >= drained_at + 10; }, 30'000);
  EXPECT_EQ(j.preemptions(), 2) << "draining the node does not stop a running allocation";
  x.slurm.Run({"scontrol", "requeue", requeued});
  j = x.c.WaitFor(
      x.id, [](const pb::Job& j) { return j.preemptions() >= 3; }, kKillWaitMs + 10'000);
  ASSERT_EQ(j.preemptions(), 3) << x.sbatch.Log(requeued);
  x.t.Note("drain + requeue " + requeued + ": " + Describe(Nth(j, 2)));
  EXPECT_EQ(Nth(j, 2).steps_lost(), 0);
  x.lost["requeue + drain"] = Nth(j, 2).steps_lost();
  SlurmJob s = x.slurm.WaitForJob(
      requeued, [](const SlurmJob& s) { return s.state == "PENDING"; }, 30'000);
  EXPECT_EQ(s.state, "PENDING") << s.raw;
  EXPECT_THAT(x.slurm.NodeState(), HasSubstr("DRAIN"));
  x.slurm.ResumeNode();
  s = x.slurm.WaitForJob(
      requeued, [](const SlurmJob& s) { return s.state == "RUNNING"; }, 60'000);
  EXPECT_EQ(s.state, "RUNNING") << s.raw;
  EXPECT_EQ(s.restarts, 1);
  x.sbatch.WaitRegistered(requeued, 60'000);
  const std::string requeued_log = x.sbatch.Log(requeued);
  EXPECT_THAT(requeued_log, HasSubstr("ft-worker stopped (SIGTERM)"))
      << "the first run's log is kept (--open-mode=append)";
  x.t.Note("node resumed: allocation " + requeued + " runs again (restart " + std::to_string(s.restarts) +
           ")");
}

TEST(SlurmSqueueEndTime, ShippedSbatchLosesNoStepAtTimeLimitSignalScancelRequeueAndDrain) {
  if (const std::string missing = MissingForSlurm(); !missing.empty()) {
    GTEST_SKIP()
        << "needs " << missing
        << ": deploy/install-deps.sh installs slurmctld, slurmd, slurm-client and munge; run as root";
  }
  Timeline t;
  // A 10 s lease: on a loaded 2-core machine a worker can go unheard for 3 s
  // (the e2e tests' lease), which would requeue its job without a checkpoint.
  Cluster c("sbatch", e2e::ClusterOptions{.lease_ms = 10'000});
  SlurmCluster slurm(TempPath("slurm"));  // stopped first: its workers report to ftd as they go
  t.Note("slurmctld, slurmd, munged and ftd up");
  const int64_t steps = StepsForSeconds(c, kTrainSeconds);
  t.Note("jobs of " + std::to_string(steps) + " steps (" + std::to_string(kTrainSeconds) +
         " s of ft-train here)");
  const std::string spec_a = c.WriteJob("a", steps, 1'000'000), spec_b = c.WriteJob("b", steps, 1'000'000);
  auto [reference, reference_out] = c.StartReference(spec_a);  // both specs train the same
  const std::string hide_end = slurm.dir() + "/hide-end-time.sh";
  std::ofstream(hide_end)
      << "#!/bin/sh\n# ft-worker with the slot end hidden: only Slurm's --signal saves the work.\n"
      << "unset SLURM_JOB_END_TIME\nexec " << WORKER_BIN << " \"$@\"\n";
  chmod(hide_end.c_str(), 0755);

  SbatchWorkers sbatch(slurm, c);
  // 1: a 1-minute allocation; --signal at 0 s never fires, so only the end
  // time (from squeue: a user's SLURM_TIME_FORMAT must not change it) stops the trainer.
  const std::string limit_alloc =
      sbatch.Start({"--time=1", "--signal=B:USR1@0"}, {{"SLURM_TIME_FORMAT", "%s"}});
  // 2: the script's own --signal=B:USR1@180; ft-worker never learns the end.
  const std::string signal_alloc = sbatch.Start({"--time=5"}, {{"FT_WORKER", hide_end}});
  const pb::WorkerInfo limit_worker = sbatch.WaitRegistered(limit_alloc, 60'000);
  const pb::WorkerInfo signal_worker = sbatch.WaitRegistered(signal_alloc, 60'000);
  const SlurmJob limit_job = slurm.Job(limit_alloc);
  t.Note("allocations " + limit_alloc + " (time limit) and " + signal_alloc + " (signal) registered");
  EXPECT_EQ(limit_worker.slot_end_ms(), limit_job.end_s * 1000)
      << "ft-worker's slot end is not Slurm's EndTime (the script's squeue fallback)\n"
      << limit_job.raw << "\n"
      << sbatch.Log(limit_alloc);
  EXPECT_EQ(signal_worker.slot_end_ms(), 0) << "the end should be hidden from this worker";

  Pacer pacer(steps, kTrainSeconds);
  const std::string a = c.Submit(spec_a), b = c.Submit(spec_b);
  pacer.Pace(a, c.dir() + "/job/out-a");
  pacer.Pace(b, c.dir() + "/job/out-b");
  for (const std::string& id : {a, b}) {
    ASSERT_EQ(c.WaitFor(
                   id, [](const pb::Job& j) { return j.state() == pb::RUNNING; }, 60'000)
                  .state(),
              pb::RUNNING);
  }
  const bool a_on_limit = c.client().Get(a)->worker_id() == SbatchWorkers::WorkerId(limit_alloc);
  const std::string limit_id = a_on_limit ? a : b, chain_id = a_on_limit ? b : a;
  ASSERT_EQ(c.client().Get(chain_id)->worker_id(), SbatchWorkers::WorkerId(signal_alloc));
  // One allocation more than the jobs need from here on: after each end below
  // a new one is submitted, so a stopped job always finds a worker.
  sbatch.Start({"--time=10"});

  Chain chain{c, slurm, sbatch, t, chain_id, {}};
  SignalBackstop(chain, signal_alloc);  // case 2
  if (HasFatalFailure()) return;
  ScancelMidStep(chain);  // case 3
  if (HasFatalFailure()) return;
  DrainThenRequeue(chain);  // case 4
  if (HasFatalFailure()) return;
  std::map<std::string, int64_t>& lost = chain.lost;

  // ---- 1. The time limit, end from squeue (the stop point came while the cases above ran).
  pb::Job j = c.WaitFor(
      limit_id, [](const pb::Job& j) { return j.preemptions() >= 1; }, 90'000);
  ASSERT_EQ(j.preemptions(), 1) << sbatch.Log(limit_alloc);
  t.Note("time limit: " + Describe(Nth(j, 0)));
  EXPECT_THAT(Nth(j, 0).reason(), HasSubstr("slot end"));
  EXPECT_EQ(Nth(j, 0).worker_id(), SbatchWorkers::WorkerId(limit_alloc));
  EXPECT_EQ(Nth(j, 0).steps_lost(), 0);
  EXPECT_GT(Nth(j, 0).end_step(), 0);
  EXPECT_LT(Nth(j, 0).ended_ms(), limit_job.end_s * 1000) << "stopped before the allocation's end";
  EXPECT_GT(Nth(j, 0).ended_ms(), limit_job.end_s * 1000 - 30'000) << "it used its slot";
  lost["time limit"] = Nth(j, 0).steps_lost();
  sbatch.Start({"--time=10"});

  // ---- Both jobs finish, with nothing lost, as an uninterrupted run would.
  ASSERT_EQ(reference.Wait(), 0) << Slurp(reference.log);
  for (const std::string& id : {limit_id, chain_id}) {
    j = c.WaitFor(id, Done, 180'000);
    ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
    for (const auto& attempt : j.attempts()) EXPECT_EQ(attempt.steps_lost(), 0) << Describe(attempt);
    EXPECT_EQ(Adapter(j.output_dir()), Adapter(reference_out)) << id << ": adapter differs from ft-train's";
    t.Note(id + " succeeded after " + std::to_string(j.attempts_size()) +
           " attempts, adapter byte-identical");
  }
  SlurmJob s = slurm.WaitForJob(
      limit_alloc, [](const SlurmJob& s) { return s.state == "TIMEOUT"; }, 60'000);
  EXPECT_EQ(s.state, "TIMEOUT") << "Slurm's time limit ends allocation " << limit_alloc << ": " << s.raw;
  EXPECT_THAT(sbatch.Log(limit_alloc), HasSubstr("ft-worker stopped (SIGTERM)"));
  for (const auto& [what, n] : lost) t.Note(what + ": steps lost " + std::to_string(n));
  t.Note("the pacer stopped a job ahead of its pace " + std::to_string(pacer.stops()) + " times");
  t.Note("done");
}

}  // namespace
}  // namespace ft::slurm_test
