// Goodput end to end (issue #31, acceptance 2 and 3): one LoRA job on a
// loopback cluster with a 3 s lease goes through a dozen node kills (kill -9
// of the worker running it and its trainer, at varied points: right after a
// committed checkpoint, steps past one, before any new one, while the attempt
// is still starting) and three ftd restarts (one while an attempt trains, two
// between a kill and the next attempt's first step). The test keeps its own
// timeline: the kills it caused, and every epoch's step ends, step times and
// checkpoints from the job's metrics.jsonl, read whenever no trainer writes it
// (a resumed trainer drops the lines of the steps it redoes). From that
// timeline and the attempts' start and end (only ftd knows them) it splits
// the device time itself, by daemon/goodput.h's definitions, and ftd's figures
// must agree within 2% of the device time in every category, the same after
// one more restart of ftd (they come from SQLite). Recovery times (loss known
// → next first step) are printed (count, p50, max) and checked against the
// test's own. The job still ends SUCCEEDED with the adapter bytes of an
// uninterrupted run. Money (issue #44): the workers have prices (their own
// --price, or ftd's --pool-price for pool "spot"), and ftd's cost of the job
// must equal the test's own account (its split of each attempt at its
// worker's price) within 1%.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
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
using Clock = std::chrono::steady_clock;

constexpr int64_t kLeaseMs = 3000;
constexpr int64_t kSteps = 400;
constexpr int64_t kEvery = 10;
// Where each kill lands in its attempt (see KillPoint), one per preemption.
enum class Point { kAfterCheckpoint, kPastCheckpoint, kBeforeCheckpoint, kStarting };
const std::vector<Point> kKills = {
    Point::kAfterCheckpoint, Point::kPastCheckpoint,  Point::kBeforeCheckpoint, Point::kPastCheckpoint,
    Point::kStarting,        Point::kAfterCheckpoint, Point::kPastCheckpoint,   Point::kBeforeCheckpoint,
    Point::kAfterCheckpoint, Point::kStarting,        Point::kPastCheckpoint,   Point::kAfterCheckpoint};
constexpr size_t kRestartWhileTraining = 2;          // ftd restarted before this kill, mid-attempt
const std::set<size_t> kRestartAfterKill = {6, 10};  // ftd restarted right after these kills

const pb::Attempt* Last(const pb::Job& j) {
  return j.attempts_size() > 0 ? &j.attempts(j.attempts_size() - 1) : nullptr;
}

void RestartDaemon(Cluster& c) {
  c.daemon().Signal(SIGKILL);
  c.daemon().Wait();
  c.StartDaemon();
}

// The test's own timeline of the job, from its metrics.jsonl.
struct Timeline {
  struct Step {
    double start_ms = 0, end_ms = 0;  // end: the trainer's time_ms; start: end - step_seconds
  };
  std::map<int64_t, std::map<int64_t, Step>> steps;   // epoch → step → its times
  std::set<std::pair<int64_t, int64_t>> checkpoints;  // (epoch, step) of each checkpoint line

  // Adds the file's lines (read while no trainer runs: the next one truncates the lost steps).
  void Read(const std::string& path) {
    std::istringstream in(Slurp(path));
    for (std::string text; std::getline(in, text);) {
      auto line = ParseMetricsLine(text);
      if (!line.ok() || line->epoch <= 0) continue;
      if (line->kind == MetricsLine::Kind::kCheckpoint) checkpoints.insert({line->epoch, line->step});
      if (line->kind != MetricsLine::Kind::kStep || line->time_ms <= 0) continue;
      const auto end = static_cast<double>(line->time_ms);
      steps[line->epoch].emplace(line->step, Step{end - 1000.0 * line->step_seconds, end});
    }
  }
  const std::map<int64_t, Step>* Of(int64_t epoch) const {
    auto it = steps.find(epoch);
    return it == steps.end() || it->second.empty() ? nullptr : &it->second;
  }
};

// Device-seconds of one attempt, or of all of them.
struct Split {
  double restart = 0, productive = 0, checkpoint = 0, lost = 0;
  double total() const { return restart + productive + checkpoint + lost; }
};

struct Account {
  Split device;
  std::vector<Split> attempts;  // in number order
  double queue = 0;
  std::vector<double> recovery;
};

// The step the first later attempt that trained resumed from: the last step of attempt `i` that survived.
int64_t SurvivingThrough(const pb::Job& j, int i, const Timeline& t) {
  for (int k = i + 1; k < j.attempts_size(); ++k) {
    if (const auto* s = t.Of(j.attempts(k).epoch())) return s->begin()->first - 1;
  }
  return INT64_MAX;
}

// One attempt's device time by daemon/goodput.h's definitions, from the test's timeline: restart
// until its first step began; productive to the end of its last step that survived (through
// `survives`), less the gaps after checkpointed steps (checkpoint); after that, lost (a killed
// attempt) or checkpoint (the final one).
Split SplitAttempt(const pb::Attempt& a, const Timeline& t, int64_t survives, bool killed) {
  const auto t0 = static_cast<double>(a.started_ms()), t1 = static_cast<double>(a.ended_ms());
  const auto* steps = t.Of(a.epoch());
  if (steps == nullptr) return {(t1 - t0) / 1000, 0, 0, 0};
  const auto clamp = [&](double ms) { return std::min(t1, std::max(t0, ms)); };
  const double first_start = clamp(steps->begin()->second.start_ms);
  double surviving_end = first_start, waits = 0;
  for (auto it = steps->begin(); it != steps->end() && it->first <= survives; ++it) {
    surviving_end = std::max(surviving_end, clamp(it->second.end_ms));
    auto next = std::next(it);
    if (next != steps->end() && next->first <= survives && t.checkpoints.count({a.epoch(), it->first})) {
      waits += std::max(0.0, clamp(next->second.start_ms) - clamp(it->second.end_ms));
    }
  }
  const double tail = t1 - surviving_end;
  return {(first_start - t0) / 1000, (surviving_end - first_start - waits) / 1000,
          (waits + (killed ? 0 : tail)) / 1000, (killed ? tail : 0) / 1000};
}

// The whole job: every attempt split, the queue wait (created → first start, each end → the next
// start) and the recovery of each kill (ftd knew of the loss → the first step after it). With
// `ftd_survival` an attempt's steps survive through end_step - steps_lost (what ftd's own figures
// use: a diagnostic only) instead of through the step the next attempt resumed from.
Account Compute(const pb::Job& j, const Timeline& t, const std::set<int64_t>& killed, bool ftd_survival) {
  Account acc;
  int64_t queued_since = j.created_ms();
  double recovering_since = -1;  // the end of the killed attempt not yet followed by a step
  for (int i = 0; i < j.attempts_size(); ++i) {
    const pb::Attempt& a = j.attempts(i);
    acc.queue += static_cast<double>(std::max<int64_t>(0, a.started_ms() - queued_since)) / 1000;
    queued_since = a.ended_ms();
    const bool was_killed = killed.count(a.epoch()) > 0;
    EXPECT_TRUE(was_killed || i + 1 == j.attempts_size())
        << "attempt " << a.number() << " ended without a kill: " << a.reason();
    const int64_t survives = ftd_survival ? (was_killed ? a.end_step() - a.steps_lost() : a.end_step())
                                          : SurvivingThrough(j, i, t);
    const Split s = SplitAttempt(a, t, survives, was_killed);
    acc.attempts.push_back(s);
    acc.device = {acc.device.restart + s.restart, acc.device.productive + s.productive,
                  acc.device.checkpoint + s.checkpoint, acc.device.lost + s.lost};
    if (const auto* steps = t.Of(a.epoch()); steps != nullptr && recovering_since >= 0) {
      acc.recovery.push_back((steps->begin()->second.end_ms - recovering_since) / 1000);
      recovering_since = -1;
    }
    if (was_killed && recovering_since < 0) recovering_since = static_cast<double>(a.ended_ms());
  }
  return acc;
}

Split FromSplit(const pb::GoodputSplit& g) {
  return {g.restart_s(), g.productive_s(), g.checkpoint_s(), g.lost_s()};
}

Account FromDaemon(const pb::Job& j) {
  Account acc;
  acc.device = FromSplit(j.goodput().device());
  for (const pb::Attempt& a : j.attempts()) acc.attempts.push_back(FromSplit(a.goodput()));
  acc.queue = j.goodput().queue_s();
  acc.recovery.assign(j.goodput().recovery_s().begin(), j.goodput().recovery_s().end());
  return acc;
}

void Print(const char* who, const Account& a) {
  const Split& d = a.device;
  std::printf(
      "%-9s device %7.2f s: productive %7.2f  checkpoint %6.2f  restart %6.2f  lost %6.2f  | queue %6.2f"
      "  goodput %.3f\n",
      who, d.total(), d.productive, d.checkpoint, d.restart, d.lost, a.queue,
      d.total() > 0 ? d.productive / d.total() : 1.0);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

// Money (issue #44, acceptance 3): workers w1, w3, w5 ... are in pool "spot", which ftd prices at
// kSpotPrice per device-hour over their own --price; the others keep their own, 1.0 to 2.0.
constexpr double kSpotPrice = 0.9;
bool InSpot(int n) { return n % 2 == 1; }
double OwnPrice(int n) { return 1.0 + 0.5 * (n % 3); }
std::vector<std::string> PriceFlags(int n) {
  std::vector<std::string> flags = {"--price", std::to_string(OwnPrice(n))};
  if (InSpot(n)) flags.insert(flags.end(), {"--pool", "spot"});
  return flags;
}
double PriceOf(const std::string& worker) {
  const int n = std::atoi(worker.c_str() + 1);  // "w7" -> 7
  return InSpot(n) ? kSpotPrice : OwnPrice(n);
}

// ftd's costs against the test's own: each attempt's device-seconds, split by the test's timeline,
// at the price the test gave its worker. In all within 1%; by category within the 2% of the
// device time that the goodput split itself is held to.
void ExpectCostsAgree(const pb::Job& j, const Account& test) {
  Split cost;
  for (int i = 0; i < j.attempts_size() && i < static_cast<int>(test.attempts.size()); ++i) {
    const pb::Attempt& a = j.attempts(i);
    const double per_s = PriceOf(a.worker_id()) / 3600;
    EXPECT_DOUBLE_EQ(a.price(), PriceOf(a.worker_id()))
        << "attempt " << a.number() << " on " << a.worker_id();
    const Split& s = test.attempts[static_cast<size_t>(i)];
    cost = {cost.restart + s.restart * per_s, cost.productive + s.productive * per_s,
            cost.checkpoint + s.checkpoint * per_s, cost.lost + s.lost * per_s};
  }
  const pb::CostSplit& ftd = j.goodput().cost();
  std::printf("cost      ftd %.6f (productive %.6f, checkpoint %.6f, restart %.6f, lost %.6f)\n", ftd.total(),
              ftd.productive(), ftd.checkpoint(), ftd.restart(), ftd.lost());
  std::printf("cost      test %.6f (productive %.6f, checkpoint %.6f, restart %.6f, lost %.6f)\n",
              cost.total(), cost.productive, cost.checkpoint, cost.restart, cost.lost);
  ASSERT_GT(cost.total(), 0);
  EXPECT_NEAR(ftd.total(), cost.total(), 0.01 * cost.total()) << "the job's cost";
  const double tolerance = 0.02 * cost.total();
  EXPECT_NEAR(ftd.productive(), cost.productive, tolerance) << "productive";
  EXPECT_NEAR(ftd.checkpoint(), cost.checkpoint, tolerance) << "checkpoint";
  EXPECT_NEAR(ftd.restart(), cost.restart, tolerance) << "restart";
  EXPECT_NEAR(ftd.lost(), cost.lost, tolerance) << "lost";
}

void ExpectAgree(const Account& ftd, const Account& test) {
  const double tolerance = 0.02 * test.device.total();
  EXPECT_NEAR(ftd.device.productive, test.device.productive, tolerance) << "productive";
  EXPECT_NEAR(ftd.device.checkpoint, test.device.checkpoint, tolerance) << "checkpoint";
  EXPECT_NEAR(ftd.device.restart, test.device.restart, tolerance) << "restart";
  EXPECT_NEAR(ftd.device.lost, test.device.lost, tolerance) << "lost";
  EXPECT_NEAR(ftd.queue, test.queue, tolerance) << "queue";
  ASSERT_EQ(ftd.recovery.size(), test.recovery.size()) << "one recovery per kill followed by a step";
  for (size_t r = 0; r < ftd.recovery.size(); ++r) {
    EXPECT_GE(ftd.recovery[r], 0) << "recovery " << r;
    EXPECT_NEAR(ftd.recovery[r], test.recovery[r], 0.01) << "recovery " << r;
  }
}

// Whether the running attempt has reached the kill point `p` (by its own progress as ftd saw it:
// the job's steps_done may still be the previous attempt's).
bool KillPoint(const pb::Job& j, Point p, int64_t k) {
  const pb::Attempt& a = *Last(j);
  const bool checkpointed = j.committed_step() > a.start_step();  // one of its own is committed
  switch (p) {
    case Point::kAfterCheckpoint: return checkpointed;
    case Point::kPastCheckpoint: return checkpointed && a.end_step() >= j.committed_step() + 1 + k % 8;
    case Point::kBeforeCheckpoint: return a.end_step() >= a.start_step() + 2 + k % 5;
    case Point::kStarting: return true;
  }
  return true;
}

struct Kill {
  int64_t epoch = 0, at_ms = 0;
  std::string worker;
};

std::string Describe(const pb::Job& j, const std::vector<Kill>& kills) {
  std::ostringstream out;
  out << j.id() << ": state " << j.state() << ", reason " << j.reason() << "\n";
  for (const pb::Attempt& a : j.attempts()) {
    out << "  #" << a.number() << " e" << a.epoch() << " " << a.worker_id() << " outcome " << a.outcome()
        << " steps " << a.start_step() << ".." << a.end_step() << " lost " << a.steps_lost() << " "
        << a.reason() << "\n";
  }
  for (const Kill& k : kills) out << "  kill e" << k.epoch << " " << k.worker << " at " << k.at_ms << "\n";
  return out.str();
}

// Prints each attempt: ftd's split over the test's, when the test killed it and when ftd knew.
void PrintAttempts(const pb::Job& j, const Account& ftd, const Account& test, const Timeline& t,
                   const std::vector<Kill>& kills) {
  for (int i = 0; i < j.attempts_size(); ++i) {
    const pb::Attempt& a = j.attempts(i);
    const auto* steps = t.Of(a.epoch());
    std::printf("  #%-2lld e%-2lld %-4s steps %3lld..%3lld (file: %3lld..%3lld) lost %2lld",
                static_cast<long long>(a.number()), static_cast<long long>(a.epoch()), a.worker_id().c_str(),
                static_cast<long long>(a.start_step()), static_cast<long long>(a.end_step()),
                static_cast<long long>(steps ? steps->begin()->first : 0),
                static_cast<long long>(steps ? steps->rbegin()->first : 0),
                static_cast<long long>(a.steps_lost()));
    auto kill = std::find_if(kills.begin(), kills.end(), [&](const Kill& k) { return k.epoch == a.epoch(); });
    if (kill != kills.end())
      std::printf(", killed, ftd knew %.2f s later", static_cast<double>(a.ended_ms() - kill->at_ms) / 1000);
    std::printf("\n");
    for (const auto& [who, s] : {std::pair{"ftd", ftd.attempts[i]}, std::pair{"test", test.attempts[i]}}) {
      std::printf("      %-4s restart %5.2f productive %6.2f checkpoint %5.2f lost %5.2f\n", who, s.restart,
                  s.productive, s.checkpoint, s.lost);
    }
  }
}

// What the test caused and saw, as the run goes.
struct Preemptions {
  Cluster& c;
  std::string id;
  Timeline timeline;
  std::set<int64_t> killed;  // epochs
  std::vector<Kill> kills;
  std::string metrics;  // the job's metrics.jsonl
};

// Kill `k`: waits for its point, kills the node running the job, reads the metrics while no
// trainer runs, starts a replacement worker (restarting ftd around it when asked).
void Preempt(Preemptions& r, size_t k) {
  Cluster& c = r.c;
  const auto at_point = [&](const pb::Job& j) {
    return j.state() == pb::RUNNING && Last(j)->outcome() == pb::ATTEMPT_RUNNING &&
           !r.killed.count(Last(j)->epoch()) && KillPoint(j, kKills[k], static_cast<int64_t>(k));
  };
  if (k == kRestartWhileTraining) {
    const auto training = [&](const pb::Job& j) {
      return j.state() == pb::RUNNING && !r.killed.count(Last(j)->epoch()) &&
             Last(j)->end_step() > Last(j)->start_step();
    };
    ASSERT_TRUE(training(c.WaitFor(r.id, training, 120'000))) << "no attempt trained before ftd's restart";
    RestartDaemon(c);
  }
  pb::Job j = c.WaitFor(r.id, at_point, 120'000);
  ASSERT_TRUE(at_point(j)) << "kill " << k << ": the job is " << (Done(j) ? "done: make it longer" : "stuck")
                           << "\n"
                           << Describe(j, r.kills);
  r.metrics = j.output_dir() + "/metrics.jsonl";
  const Kill kill{Last(j)->epoch(), 0, Last(j)->worker_id()};
  c.KillNode(kill.worker);
  r.kills.push_back(kill);
  r.kills.back().at_ms = WallNowMs();
  r.killed.insert(kill.epoch);
  r.timeline.Read(r.metrics);
  // Read before any next attempt existed: no trainer has truncated the killed one's lines.
  j = c.WaitFor(
      r.id, [](const pb::Job& j) { return j.attempts_size() > 0; }, 20'000);
  ASSERT_GT(j.attempts_size(), 0) << "ftd did not answer";
  ASSERT_EQ(Last(j)->epoch(), kill.epoch) << "a next attempt began before the test read the metrics";
  const bool restart = kRestartAfterKill.count(k) > 0;
  if (restart) {
    c.daemon().Signal(SIGKILL);
    c.daemon().Wait();
  }
  c.StartWorker("w" + std::to_string(k + 3), PriceFlags(static_cast<int>(k) + 3));
  if (restart) c.StartDaemon();
  const auto* steps = r.timeline.Of(kill.epoch);
  std::printf("kill %zu: e%lld on %s after step %lld (ftd had seen %lld, committed %lld)%s\n", k + 1,
              static_cast<long long>(kill.epoch), kill.worker.c_str(),
              static_cast<long long>(steps ? steps->rbegin()->first : 0),
              static_cast<long long>(Last(j)->end_step()), static_cast<long long>(j.committed_step()),
              restart ? ", then ftd restarted" : "");
}

TEST(E2EGoodput, TwelvePreemptionsAndDaemonRestartsAccountedAsTheTestsOwnTimeline) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const auto began = Clock::now();
  Cluster c("goodput", ClusterOptions{.lease_ms = kLeaseMs, .daemon_args = {"--pool-price", "spot=0.9"}});
  const std::string job = c.WriteJob("goodput", kSteps, kEvery, "", /*dropout=*/0.1);
  auto [reference, reference_out] = c.StartReference(job);  // alongside: the cluster mostly waits on leases
  c.StartWorker("w1", PriceFlags(1));
  c.StartWorker("w2", PriceFlags(2));
  Preemptions r{c, c.Submit(job), {}, {}, {}, ""};
  for (size_t k = 0; k < kKills.size(); ++k) {
    Preempt(r, k);
    if (HasFatalFailure()) return;
  }
  const std::string& id = r.id;
  const Timeline& timeline = r.timeline;
  const std::vector<Kill>& kills = r.kills;
  const std::set<int64_t>& killed = r.killed;
  pb::Job j = c.WaitFor(id, Done, 180'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << Describe(j, kills);
  r.timeline.Read(r.metrics);
  EXPECT_EQ(j.failures(), 0) << Describe(j, kills);
  EXPECT_EQ(j.preemptions(), static_cast<int64_t>(kKills.size())) << Describe(j, kills);
  for (const Kill& k : kills) {
    const auto* steps = timeline.Of(k.epoch);
    if (steps == nullptr) continue;
    EXPECT_LE(steps->rbegin()->second.end_ms, k.at_ms) << "a step of e" << k.epoch << " after its kill";
  }

  const Account test = Compute(j, timeline, killed, false), ftd = FromDaemon(j);
  PrintAttempts(j, ftd, test, timeline, kills);
  Print("ftd", ftd);
  Print("test", test);
  Print("test/ftd*", Compute(j, timeline, killed, true));  // * survival by end_step - steps_lost
  std::printf("recovery (loss known -> next first step, lease %.1f s): %zu, p50 %.2f s, max %.2f s\n",
              kLeaseMs / 1000.0, ftd.recovery.size(), Percentile(ftd.recovery, 0.5),
              ftd.recovery.empty() ? 0.0 : *std::max_element(ftd.recovery.begin(), ftd.recovery.end()));
  for (size_t i = 0; i < ftd.recovery.size() && i < test.recovery.size(); ++i) {
    std::printf("  recovery %zu: ftd %.3f s, test %.3f s\n", i + 1, ftd.recovery[i], test.recovery[i]);
  }
  ExpectAgree(ftd, test);
  ExpectCostsAgree(j, test);
  EXPECT_NEAR(j.goodput().goodput(), ftd.device.productive / ftd.device.total(), 1e-9);
  const auto starting = static_cast<size_t>(std::count(kKills.begin(), kKills.end(), Point::kStarting));
  EXPECT_GE(ftd.recovery.size(), kKills.size() - starting) << "only kills while starting may have no step";

  // The same figures from a restarted ftd: they are derived from SQLite.
  RestartDaemon(c);
  const pb::Job again = c.WaitFor(
      id, [](const pb::Job& j) { return j.attempts_size() > 0; }, 20'000);
  const Account after = FromDaemon(again);
  Print("again", after);
  EXPECT_DOUBLE_EQ(after.device.productive, ftd.device.productive);
  EXPECT_DOUBLE_EQ(after.device.checkpoint, ftd.device.checkpoint);
  EXPECT_DOUBLE_EQ(after.device.restart, ftd.device.restart);
  EXPECT_DOUBLE_EQ(after.device.lost, ftd.device.lost);
  EXPECT_DOUBLE_EQ(after.queue, ftd.queue);
  EXPECT_EQ(after.recovery, ftd.recovery);
  EXPECT_DOUBLE_EQ(again.goodput().cost().total(), j.goodput().cost().total()) << "prices come from SQLite";

  // Per worker: each attempt's split was stored when it ended; over the workers they add up to the
  // job's (every attempt has ended, each on one worker).
  auto workers = c.client().Workers();
  ASSERT_TRUE(workers.ok()) << workers.status().ToString();
  Split on_workers;
  for (const pb::WorkerInfo& w : workers->workers()) {
    const Split s = FromSplit(w.goodput());
    on_workers = {on_workers.restart + s.restart, on_workers.productive + s.productive,
                  on_workers.checkpoint + s.checkpoint, on_workers.lost + s.lost};
    EXPECT_EQ(w.pool(), InSpot(std::atoi(w.id().c_str() + 1)) ? "spot" : "default");
    EXPECT_DOUBLE_EQ(w.price(), PriceOf(w.id()));
  }
  Print("workers", Account{on_workers, {}, 0, {}});
  const double tolerance = 0.02 * ftd.device.total();
  EXPECT_NEAR(on_workers.productive, ftd.device.productive, tolerance);
  EXPECT_NEAR(on_workers.checkpoint, ftd.device.checkpoint, tolerance);
  EXPECT_NEAR(on_workers.restart, ftd.device.restart, tolerance);
  EXPECT_NEAR(on_workers.lost, ftd.device.lost, tolerance);

  ASSERT_EQ(reference.Wait(), 0) << Slurp(reference.log);
  EXPECT_EQ(Slurp(j.output_dir() + "/adapter/adapter_model.safetensors"),
            Slurp(reference_out + "/adapter/adapter_model.safetensors"))
      << "the adapter differs from the uninterrupted run\n"
      << Describe(j, kills);
  std::printf("ran %.0f s\n", std::chrono::duration<double>(Clock::now() - began).count());
}

}  // namespace
}  // namespace ft::e2e
