// Teams sharing a cluster end to end (issue #44, acceptance 1): ftd with users in three teams,
// three ft-workers and real ft-train LoRA jobs. Teams vision and nlp (equal weights, set with
// `ftctl admin team set`) each queue more work than the cluster holds: kJobsPerTeam jobs, alice's
// through `ftctl submit` with her token, bob's through gRPC with his. Mid-run, when every worker
// runs a job, olga of team ops submits one job of a higher priority class. The test keeps its own
// account from the attempts' timeline (ListJobs/GetJob) and checks:
//   fair share   over the contended window (from the first start until a team has no job
//                waiting), each team's device-seconds within 10% of its fair share (half of what
//                the two used: equal weights; ops's urgent job is of another class and team);
//                ListTeams's decayed usage agrees with the test's own (same half life), and
//                vision and nlp have equal shares there.
//   urgency      the urgent job's attempt starts within one checkpoint time (the longest of its
//                victim's committed checkpoints, from metrics.jsonl) plus one lease of its
//                submit. ftd's --min-runtime-ms is 1 s and the urgent job arrives once some
//                running job has run longer than that, so min runtime never holds it back.
//   no loss      every preempted attempt lost 0 steps: ftd's steps_lost, and metrics.jsonl (its
//                last step line is its end step, a checkpoint there, and the next attempt's
//                first step follows it); every job's adapter (the urgent one's too) is
//                byte-identical to an uninterrupted `ft-train run` of the same job (the jobs
//                are one job under many names: priority and name are no training input).
//   bounded wait no job waits (submit or requeue → next start, counted once all workers are up)
//                longer than the device time of every other job over the devices, plus one
//                second per attempt for each handoff (exit report, tick, start): the bound of a
//                scheduler that never leaves a device idle while a job waits.
// About 40 s alone on 2 cores (CMakeLists.txt's COST).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numbers>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/job/metrics_line.h"
#include "tests/e2e/cluster.h"

namespace ft::e2e {
namespace {

namespace pb = ftune::v1;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr int64_t kLeaseMs = 3000;
constexpr int64_t kMinRuntimeMs = 1000;
constexpr int64_t kHalfLifeMs = 600'000;
constexpr int64_t kSteps = 120;
constexpr int64_t kEvery = 10;
constexpr int kJobsPerTeam = 10;
constexpr double kHandoffS = 1.0;
const std::vector<std::string> kWorkers = {"w1", "w2", "w3"};
const std::vector<std::string> kTeams = {"vision", "nlp"};

struct Member {
  std::string name, team, token;
};

// ftctl against the cluster; its output. A non-zero exit fails the test.
std::string Ftctl(Cluster& c, const std::vector<std::string>& args, const std::string& name) {
  Proc p = testing_support::SpawnFtctl(FTCTL_BIN, c.dir(), c.address(), args, name);
  EXPECT_EQ(p.Wait(), 0) << "ftctl " << name << ":\n" << p.Log();
  return p.Log();
}

// A member of `team`, added with `ftctl admin user add` (the admin's token); its token as printed.
Member AddMember(Cluster& c, const std::string& name, const std::string& team) {
  const std::string out =
      Ftctl(c, {"--token", "root", "admin", "user", "add", name, "--team", team}, "add-" + name);
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex("(ftu_[0-9a-f]+_[0-9a-f]+)"))) << out;
  return {name, team, m.empty() ? "" : m[1].str()};
}

std::unique_ptr<JobsClient> ClientAs(Cluster& c, const std::string& token) {
  auto options = ResolveClientOptions({c.address(), token, 10'000, "", nullptr});
  if (!options.ok()) throw std::runtime_error(options.status().ToString());
  return std::make_unique<JobsClient>(*options);
}

// `job_yaml` submitted by `who` through `ftctl submit`: the id it printed.
std::string SubmitWithFtctl(Cluster& c, const Member& who, const std::string& job_yaml, int k) {
  const std::string out =
      Ftctl(c, {"--token", who.token, "submit", job_yaml}, "submit-" + who.name + std::to_string(k));
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex("(j-[0-9]+)"))) << out;
  return m.empty() ? "" : m[1].str();
}

std::string SubmitWithGrpc(JobsClient& client, const std::string& job_yaml) {
  pb::SubmitRequest req;
  req.set_spec_yaml(Slurp(job_yaml));
  req.set_spec_dir(job_yaml.substr(0, job_yaml.rfind('/')));
  auto r = client.Submit(req);
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  return r->job().id();
}

std::vector<pb::Job> AllJobs(Cluster& c) {
  auto r = c.client().List({});
  if (!r.ok()) return {};
  return {r->jobs().begin(), r->jobs().end()};
}

int64_t EndOf(const pb::Attempt& a, int64_t now_ms) { return a.ended_ms() > 0 ? a.ended_ms() : now_ms; }

// Whether `j` waits for a device at `t`: submitted, not ended, and no attempt of it holds a device.
bool Waiting(const pb::Job& j, int64_t t) {
  if (j.created_ms() > t) return false;
  if (Done(j) && j.attempts_size() > 0 && j.attempts(j.attempts_size() - 1).ended_ms() <= t) return false;
  for (const pb::Attempt& a : j.attempts()) {
    if (a.started_ms() <= t && (a.ended_ms() == 0 || t < a.ended_ms())) return false;
  }
  return true;
}

// The contended window: from the first attempt's start until the first start at which one of
// kTeams has no job waiting (the queues only shrink at starts).
std::pair<int64_t, int64_t> ContendedWindow(const std::vector<pb::Job>& jobs) {
  std::vector<int64_t> starts;
  for (const pb::Job& j : jobs) {
    for (const pb::Attempt& a : j.attempts()) starts.push_back(a.started_ms());
  }
  std::sort(starts.begin(), starts.end());
  if (starts.empty()) return {0, 0};
  for (int64_t t : starts) {
    for (const std::string& team : kTeams) {
      const bool waits = std::any_of(jobs.begin(), jobs.end(),
                                     [&](const pb::Job& j) { return j.team() == team && Waiting(j, t); });
      if (!waits) return {starts.front(), t};
    }
  }
  return {starts.front(), starts.back()};
}

// Device-seconds of `team`'s attempts within [from, to].
double DeviceSeconds(const std::vector<pb::Job>& jobs, const std::string& team, int64_t from, int64_t to) {
  double s = 0;
  for (const pb::Job& j : jobs) {
    if (j.team() != team) continue;
    for (const pb::Attempt& a : j.attempts()) {
      const int64_t begin = std::max(from, a.started_ms()), end = std::min(to, EndOf(a, to));
      s += static_cast<double>(std::max<int64_t>(0, end - begin)) / 1000 * std::max(1, a.ranks_size());
    }
  }
  return s;
}

// `team`'s usage at `at` as daemon/fair_share.h defines it: each device-second of its attempts
// halved per half life since.
double DecayedUsage(const std::vector<pb::Job>& jobs, const std::string& team, int64_t at) {
  const double h = kHalfLifeMs / 1000.0;
  double usage = 0;
  for (const pb::Job& j : jobs) {
    if (j.team() != team) continue;
    for (const pb::Attempt& a : j.attempts()) {
      const double age_start = static_cast<double>(at - a.started_ms()) / 1000;
      const double age_end = static_cast<double>(at - std::min(at, EndOf(a, at))) / 1000;
      if (age_start <= 0) continue;
      usage += h / std::numbers::ln2 * (std::exp2(-age_end / h) - std::exp2(-age_start / h));
    }
  }
  return usage;
}

std::string Describe(const std::vector<pb::Job>& jobs) {
  std::ostringstream out;
  for (const pb::Job& j : jobs) {
    out << j.id() << " " << j.name() << " (" << j.team() << ", by " << j.submitted_by() << ", priority "
        << j.priority() << "): state " << j.state() << ", created " << j.created_ms() << "\n";
    for (const pb::Attempt& a : j.attempts()) {
      out << "  #" << a.number() << " e" << a.epoch() << " " << a.worker_id() << " " << a.started_ms() << ".."
          << a.ended_ms() << " outcome " << a.outcome() << " steps " << a.start_step() << ".." << a.end_step()
          << " lost " << a.steps_lost() << " " << a.reason() << "\n";
    }
  }
  return out.str();
}

// The moment for the urgent job: at least `started` attempts began, every worker runs a job with
// 30% of its steps still to do (none frees a worker before ftd's next pass), and one of them has
// run past min runtime with 0.5 s to spare (a victim may be chosen at once).
bool UrgentMoment(Cluster& c, int started) {
  const std::vector<pb::Job> jobs = AllJobs(c);
  int attempts = 0, running = 0;
  bool stoppable = false;
  for (const pb::Job& j : jobs) {
    attempts += j.attempts_size();
    if (j.state() != pb::RUNNING || j.attempts_size() == 0) continue;
    const pb::Attempt& a = j.attempts(j.attempts_size() - 1);
    if (a.outcome() != pb::ATTEMPT_RUNNING) continue;
    ++running;
    if (j.steps_done() > kSteps * 7 / 10) return false;
    stoppable |= WallNowMs() - a.started_ms() > kMinRuntimeMs + 500;
  }
  return attempts >= started && running == static_cast<int>(kWorkers.size()) && stoppable;
}

struct Scenario {
  std::map<std::string, Member> members;
  std::vector<std::string> ids;  // vision's and nlp's, then the urgent one
  std::string urgent;
  int64_t urgent_submitted_ms = 0;
  int64_t workers_up_ms = 0;
  int64_t teams_at_ms = 0;  // when `teams` was read
  pb::ListTeamsReply teams;
};

// Users, weights and every team job (before any worker: both teams queue at once).
void SetUpTeams(Cluster& c, Scenario& r, const std::string& job_yaml) {
  for (const auto& [name, team] : {std::pair{"alice", "vision"}, {"bob", "nlp"}, {"olga", "ops"}}) {
    r.members[name] = AddMember(c, name, team);
  }
  for (const std::string& team : kTeams) {
    EXPECT_THAT(Ftctl(c, {"--token", "root", "admin", "team", "set", team, "--weight", "1"}, "team-" + team),
                HasSubstr("weight 1"));
  }
  auto bob = ClientAs(c, r.members["bob"].token);
  for (int k = 0; k < kJobsPerTeam; ++k) {
    for (const std::string who : {"alice", "bob"}) {
      const std::string yaml = c.CopyJob(job_yaml, who + std::to_string(k));
      r.ids.push_back(who == "alice" ? SubmitWithFtctl(c, r.members[who], yaml, k)
                                     : SubmitWithGrpc(*bob, yaml));
    }
  }
}

// Starts the workers and waits until ftd lists every one alive.
void StartWorkers(Cluster& c, Scenario& r) {
  for (const std::string& w : kWorkers) c.StartWorker(w);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    auto workers = c.client().Workers();
    const bool up = workers.ok() && std::count_if(workers->workers().begin(), workers->workers().end(),
                                                  [](const pb::WorkerInfo& w) { return w.alive(); }) ==
                                        static_cast<int>(kWorkers.size());
    if (up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  r.workers_up_ms = WallNowMs();
}

// Mid-run, olga submits the urgent job; waits for it to end and reads the teams while both
// teams still queue work.
void Urgent(Cluster& c, Scenario& r, const std::string& urgent_yaml) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!UrgentMoment(c, kJobsPerTeam / 2 + 3) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(UrgentMoment(c, kJobsPerTeam / 2 + 3)) << "no moment with every worker busy:\n"
                                                     << Describe(AllJobs(c));
  auto olga = ClientAs(c, r.members["olga"].token);
  r.urgent = SubmitWithGrpc(*olga, urgent_yaml);
  r.urgent_submitted_ms = WallNowMs();
  const pb::Job u = c.WaitFor(r.urgent, Done, 60'000);
  ASSERT_EQ(u.state(), pb::SUCCEEDED) << Describe(AllJobs(c));
  const int64_t before = WallNowMs();
  auto teams = c.client().ListTeams();
  ASSERT_TRUE(teams.ok()) << teams.status().ToString();
  r.teams = *teams;
  r.teams_at_ms = (before + WallNowMs()) / 2;
  r.ids.push_back(r.urgent);
}

// Each team job's submitter and team are the member who sent it (ftctl or gRPC, its own token).
void CheckSubmitters(const Scenario& r, const std::vector<pb::Job>& jobs) {
  for (const pb::Job& j : jobs) {
    const std::string who =
        j.id() == r.urgent ? "olga" : j.name().substr(0, j.name().find_first_of("0123456789"));
    ASSERT_TRUE(r.members.count(who)) << j.name();
    EXPECT_EQ(j.submitted_by(), who) << j.name();
    EXPECT_EQ(j.team(), r.members.at(who).team) << j.name();
  }
}

// (a) Each team's device-seconds over the contended window within 10% of its fair share (half of
// the two teams' device-seconds there: equal weights).
void CheckFairShare(const std::vector<pb::Job>& jobs) {
  const auto [from, to] = ContendedWindow(jobs);
  const double vision = DeviceSeconds(jobs, "vision", from, to), nlp = DeviceSeconds(jobs, "nlp", from, to);
  const double share = (vision + nlp) / 2;
  std::printf("contended window %.1f s: vision %.1f device-s, nlp %.1f device-s, fair share %.1f each\n",
              static_cast<double>(to - from) / 1000, vision, nlp, share);
  // Long enough to mean something, and contended: the two teams kept two of three devices busy.
  const double window_s = static_cast<double>(to - from) / 1000;
  EXPECT_GT(window_s, 10.0) << "too short a window to judge\n" << Describe(jobs);
  EXPECT_GT(vision + nlp, 2 * window_s) << "the window is not contended\n" << Describe(jobs);
  EXPECT_NEAR(vision, share, 0.1 * share) << Describe(jobs);
  EXPECT_NEAR(nlp, share, 0.1 * share) << Describe(jobs);
}

// ListTeams as read at `at_ms`: each team's weight and its decayed usage as the test's own
// account (the same half life); `mid_run`: vision and nlp still queue work and have equal shares.
void CheckListTeams(const pb::ListTeamsReply& reply, int64_t at_ms, bool mid_run,
                    const std::vector<pb::Job>& jobs) {
  std::map<std::string, pb::Team> teams;
  double shares = 0;
  for (const pb::Team& t : reply.teams()) {
    teams[t.name()] = t;
    shares += t.fair_share();
  }
  if (mid_run) {
    EXPECT_NEAR(shares, 1.0, 1e-9) << "the shares of the teams with work add up to 1";
  }
  for (const std::string& name : kTeams) {
    ASSERT_TRUE(teams.count(name)) << reply.DebugString();
    const pb::Team& t = teams[name];
    const double mine = DecayedUsage(jobs, name, at_ms);
    std::printf("ListTeams %s %s: usage %.2f device-s (test: %.2f), share %.3f, running %lld, queued %lld\n",
                mid_run ? "mid-run" : "at the end", name.c_str(), t.usage_device_seconds(), mine,
                t.fair_share(), static_cast<long long>(t.running_devices()),
                static_cast<long long>(t.queued_jobs()));
    EXPECT_EQ(t.weight(), 1.0);
    EXPECT_NEAR(t.usage_device_seconds(), mine, 0.02 * mine + 0.5) << name;
    if (mid_run) {
      EXPECT_GT(t.queued_jobs(), 0) << "read while " << name << " still queues work";
    }
  }
  if (mid_run) {
    EXPECT_DOUBLE_EQ(teams["vision"].fair_share(), teams["nlp"].fair_share());
  }
}

// The job's metrics.jsonl lines.
std::vector<MetricsLine> ReadMetrics(const pb::Job& j) {
  std::vector<MetricsLine> out;
  std::istringstream in(Slurp(j.output_dir() + "/metrics.jsonl"));
  for (std::string text; std::getline(in, text);) {
    if (auto line = ParseMetricsLine(text); line.ok()) out.push_back(*line);
  }
  return out;
}

// (c) A preempted attempt lost nothing: ftd's steps_lost is 0, and in metrics.jsonl its last step
// is its end step, checkpointed, and the next attempt resumed there and trained the next step.
void CheckNothingLost(const pb::Job& j, int i, const std::vector<MetricsLine>& lines) {
  const pb::Attempt& a = j.attempts(i);
  EXPECT_EQ(a.steps_lost(), 0) << j.name() << " #" << a.number();
  ASSERT_LT(i + 1, j.attempts_size()) << j.name() << " never resumed";
  const pb::Attempt& next = j.attempts(i + 1);
  EXPECT_EQ(next.start_step(), a.end_step()) << j.name() << " resumed elsewhere than where it stopped";
  int64_t last = -1, first_next = -1;
  bool checkpointed = false;
  for (const MetricsLine& m : lines) {
    if (m.kind == MetricsLine::Kind::kStep && m.epoch == a.epoch()) last = std::max(last, m.step);
    if (m.kind == MetricsLine::Kind::kStep && m.epoch == next.epoch() && first_next < 0) first_next = m.step;
    checkpointed |=
        m.kind == MetricsLine::Kind::kCheckpoint && m.epoch == a.epoch() && m.step == a.end_step();
  }
  EXPECT_EQ(last, a.end_step()) << j.name() << ": the stopped attempt's steps in metrics.jsonl";
  EXPECT_TRUE(checkpointed) << j.name() << ": no checkpoint at the stop step " << a.end_step();
  EXPECT_EQ(first_next, a.end_step() + 1) << j.name() << ": the resumed attempt redid or skipped steps";
}

// (b) and (c): the urgent job started within one checkpoint time plus one lease of its submit, by
// preempting at least one job, each of which lost no step.
void CheckPreemptions(const Scenario& r, const std::vector<pb::Job>& jobs) {
  double checkpoint_s = 0;
  int preempted = 0;
  const pb::Job* urgent = nullptr;
  for (const pb::Job& j : jobs) {
    if (j.id() == r.urgent) urgent = &j;
    const std::vector<MetricsLine> lines = ReadMetrics(j);
    for (int i = 0; i < j.attempts_size(); ++i) {
      if (j.attempts(i).outcome() != pb::ATTEMPT_PREEMPTED) continue;
      ++preempted;
      EXPECT_THAT(j.attempts(i).reason(), HasSubstr(r.urgent)) << "a preemption for another reason";
      CheckNothingLost(j, i, lines);
      for (const MetricsLine& m : lines) {
        if (m.kind == MetricsLine::Kind::kCheckpoint)
          checkpoint_s = std::max(checkpoint_s, m.checkpoint_seconds);
      }
    }
  }
  ASSERT_GE(preempted, 1) << "the urgent job preempted nothing\n" << Describe(jobs);
  ASSERT_NE(urgent, nullptr);
  ASSERT_GT(urgent->attempts_size(), 0);
  const double waited = static_cast<double>(urgent->attempts(0).started_ms() - urgent->created_ms()) / 1000;
  const double bound = checkpoint_s + kLeaseMs / 1000.0;
  std::printf(
      "urgent job: started %.2f s after its submit (bound: checkpoint %.3f s + lease %.1f s), "
      "%d attempt(s) preempted\n",
      waited, checkpoint_s, kLeaseMs / 1000.0, preempted);
  EXPECT_LE(waited, bound) << Describe(jobs);
  EXPECT_EQ(urgent->attempts_size(), 1);
}

// (d) No job waits longer than the device time of every other job over the devices, plus one
// handoff per attempt: waits count from the submit (or the workers being up) and each requeue.
void CheckWaits(const Scenario& r, const std::vector<pb::Job>& jobs) {
  double total = 0;
  int attempts = 0;
  for (const pb::Job& j : jobs) {
    total += DeviceSeconds({j}, j.team(), 0, INT64_MAX);
    attempts += j.attempts_size();
  }
  double worst = 0, worst_bound = 0;
  for (const pb::Job& j : jobs) {
    ASSERT_GT(j.attempts_size(), 0);
    double waited = 0;
    int64_t since = std::max(j.created_ms(), r.workers_up_ms);
    for (const pb::Attempt& a : j.attempts()) {
      waited += static_cast<double>(std::max<int64_t>(0, a.started_ms() - since)) / 1000;
      since = a.ended_ms();
    }
    const double others = total - DeviceSeconds({j}, j.team(), 0, INT64_MAX);
    const double bound = (others + attempts * kHandoffS) / static_cast<double>(kWorkers.size());
    EXPECT_LE(waited, bound) << j.name() << " waited too long\n" << Describe(jobs);
    if (waited > worst) std::tie(worst, worst_bound) = std::pair{waited, bound};
  }
  std::printf(
      "longest wait %.1f s (its bound %.1f s: the others' device time and a %.0f s handoff per "
      "attempt over %zu devices)\n",
      worst, worst_bound, kHandoffS, kWorkers.size());
}

TEST(E2ETeams, TwoTeamsShareFairlyAnUrgentJobPreemptsThroughACheckpointAndNothingIsLost) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const auto began = Clock::now();
  Cluster c("teams", ClusterOptions{.lease_ms = kLeaseMs,
                                    .daemon_args = {"--min-runtime-ms", std::to_string(kMinRuntimeMs),
                                                    "--fair-share-half-life-ms", std::to_string(kHalfLifeMs)},
                                    .client_token = "root",
                                    .worker_token = "workers"});
  const std::string job = c.WriteJob("team-job", kSteps, kEvery, "", /*dropout=*/0.1, /*keep=*/2);
  const std::string urgent = c.WriteJob("urgent", kSteps, kEvery, "resources: {priority: 10}\n", 0.1, 2);
  Scenario r;
  SetUpTeams(c, r, job);
  if (HasFatalFailure()) return;
  auto [reference, reference_out] = c.StartReference(job);
  StartWorkers(c, r);
  Urgent(c, r, urgent);
  if (HasFatalFailure()) return;
  for (const std::string& id : r.ids) {
    const pb::Job j = c.WaitFor(id, Done, 120'000);
    ASSERT_EQ(j.state(), pb::SUCCEEDED) << Describe(AllJobs(c));
  }
  const std::vector<pb::Job> jobs = AllJobs(c);
  ASSERT_EQ(jobs.size(), r.ids.size());
  CheckSubmitters(r, jobs);
  CheckFairShare(jobs);
  CheckListTeams(r.teams, r.teams_at_ms, true, jobs);
  const int64_t before = WallNowMs();
  auto teams = c.client().ListTeams();
  ASSERT_TRUE(teams.ok()) << teams.status().ToString();
  CheckListTeams(*teams, (before + WallNowMs()) / 2, false, jobs);
  CheckPreemptions(r, jobs);
  CheckWaits(r, jobs);
  ASSERT_EQ(reference.Wait(), 0) << Slurp(reference.log);
  const std::string expected = Slurp(reference_out + "/adapter/adapter_model.safetensors");
  ASSERT_FALSE(expected.empty());
  for (const pb::Job& j : jobs) {
    EXPECT_EQ(Slurp(j.output_dir() + "/adapter/adapter_model.safetensors"), expected)
        << j.name() << "'s adapter differs from the uninterrupted run";
  }
  std::printf("ran %.0f s\n", std::chrono::duration<double>(Clock::now() - began).count());
}

}  // namespace
}  // namespace ft::e2e
