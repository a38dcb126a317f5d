// Goodput from stored attempts, metrics and checkpoints (daemon/goodput.h).
#include "daemon/goodput.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

namespace ft {
namespace {

struct StepTime {
  int64_t step = 0;
  double start_ms = 0, end_ms = 0;
};

// The steps an epoch reported, by step, each with its start and end (ms).
std::map<int64_t, std::vector<StepTime>> StepsByEpoch(const std::vector<MetricRow>& metrics) {
  std::map<int64_t, std::vector<StepTime>> by_epoch;
  for (const MetricRow& m : metrics) {
    if (m.time_ms <= 0 || m.eval_only) continue;
    const double seconds = std::isfinite(m.step_seconds) ? m.step_seconds : 0.0;
    const auto end = static_cast<double>(m.time_ms);
    by_epoch[m.epoch].push_back({m.step, end - 1000.0 * seconds, end});
  }
  for (auto& [epoch, steps] : by_epoch) {
    std::sort(steps.begin(), steps.end(),
              [](const StepTime& a, const StepTime& b) { return a.step < b.step; });
  }
  return by_epoch;
}

// Whether the attempt ended by its own report (finished, or stopped after its checkpoint), so
// that its tail after the last step was the final checkpoint and outputs rather than lost time.
bool EndedByItself(const AttemptRow& a) {
  if (a.lost || a.steps_lost > 0) return false;
  return a.outcome == AttemptOutcomeCode::kFinished || a.outcome == AttemptOutcomeCode::kPreempted ||
         a.outcome == AttemptOutcomeCode::kCancelled;
}

// The step the attempt's work survives through: every step while it runs or once it finished;
// else the newest checkpoint committed by its end (its last progress report may lag behind
// both its steps and its checkpoints).
int64_t SurvivesThrough(const AttemptRow& a, const std::vector<CheckpointRow>& checkpoints) {
  if (a.outcome == AttemptOutcomeCode::kRunning || a.outcome == AttemptOutcomeCode::kFinished)
    return INT64_MAX;
  int64_t step = 0;
  for (const CheckpointRow& c : checkpoints)
    if (c.committed_ms <= a.ended_ms) step = std::max(step, c.step);
  return step;
}

std::set<std::pair<int64_t, int64_t>> Checkpointed(const std::vector<CheckpointRow>& checkpoints) {
  std::set<std::pair<int64_t, int64_t>> out;
  for (const CheckpointRow& c : checkpoints) out.insert({c.epoch, c.step});
  return out;
}

// One attempt's device time, split; `first_step_end_ms` receives its first step's end (0: none).
GoodputSplit SplitAttempt(const AttemptRow& a, const std::vector<StepTime>& steps,
                          const std::set<std::pair<int64_t, int64_t>>& checkpointed, int64_t survives,
                          int64_t now_ms, double* first_step_end_ms) {
  const auto t0 = static_cast<double>(a.started_ms);
  const double t1 =
      std::max(t0, static_cast<double>(a.outcome == AttemptOutcomeCode::kRunning ? now_ms : a.ended_ms));
  const double ranks = static_cast<double>(std::max<int64_t>(1, a.world));
  GoodputSplit s;
  *first_step_end_ms = steps.empty() ? 0 : steps.front().end_ms;
  if (steps.empty()) {
    s.restart_s = (t1 - t0) / 1000.0 * ranks;  // it never trained a step: all of it was starting
    return s;
  }
  const auto clamp = [t0, t1](double t) { return std::min(t1, std::max(t0, t)); };
  const double first_start = clamp(steps.front().start_ms);
  double surviving_end = first_start, waits = 0;
  for (size_t i = 0; i < steps.size() && steps[i].step <= survives; ++i) {
    surviving_end = std::max(surviving_end, clamp(steps[i].end_ms));
    // The gap after a checkpointed step (to the next step's start) is the loop's checkpoint wait.
    if (i + 1 < steps.size() && steps[i + 1].step <= survives &&
        checkpointed.count({a.epoch, steps[i].step})) {
      waits += std::max(0.0, clamp(steps[i + 1].start_ms) - clamp(steps[i].end_ms));
    }
  }
  waits = std::min(waits, surviving_end - first_start);
  // The tail after the last surviving step: a running attempt's step in flight (productive
  // until it ends), a clean end's final save, or a lost or failed attempt's lost time.
  const double tail = t1 - surviving_end;
  const bool running = a.outcome == AttemptOutcomeCode::kRunning;
  const bool clean = !running && EndedByItself(a);
  s.restart_s = (first_start - t0) / 1000.0 * ranks;
  s.productive_s = (surviving_end - first_start - waits + (running ? tail : 0)) / 1000.0 * ranks;
  s.checkpoint_s = (waits + (clean ? tail : 0)) / 1000.0 * ranks;
  s.lost_s = (running || clean ? 0 : tail) / 1000.0 * ranks;
  return s;
}

}  // namespace

JobGoodput ComputeGoodput(const JobRow& job, const std::vector<AttemptRow>& attempts,
                          const std::vector<MetricRow>& metrics,
                          const std::vector<CheckpointRow>& checkpoints, int64_t now_ms) {
  JobGoodput g;
  const auto steps = StepsByEpoch(metrics);
  const auto checkpointed = Checkpointed(checkpoints);
  int64_t queued_since = job.created_ms;
  const AttemptRow* preempted = nullptr;  // the previous attempt, when it was preempted
  for (const AttemptRow& a : attempts) {
    g.queue_s += static_cast<double>(std::max<int64_t>(0, a.started_ms - queued_since)) / 1000.0;
    const auto it = steps.find(a.epoch);
    double first_step_end_ms = 0;
    const GoodputSplit s =
        SplitAttempt(a, it == steps.end() ? std::vector<StepTime>() : it->second, checkpointed,
                     SurvivesThrough(a, checkpoints), now_ms, &first_step_end_ms);
    g.attempts.push_back(s);
    g.device.Add(s);
    g.cost.Add(CostSplit::Priced(s, a.price));
    if (a.outcome == AttemptOutcomeCode::kPreempted && !a.preempted_for.empty()) ++g.scheduler_preemptions;
    if (a.notice_ms > 0 && a.outcome != AttemptOutcomeCode::kRunning) {
      ++g.notices;
      g.notices_caught += a.steps_lost == 0 ? 1 : 0;
    }
    if (preempted != nullptr && first_step_end_ms > 0) {
      g.recovery_s.push_back((first_step_end_ms - static_cast<double>(preempted->ended_ms)) / 1000.0);
      g.recovery_after.push_back(preempted->number);
    }
    // An attempt without a step keeps the recovery open for the next one.
    if (first_step_end_ms > 0 || a.outcome != AttemptOutcomeCode::kPreempted) preempted = nullptr;
    if (a.outcome == AttemptOutcomeCode::kPreempted && preempted == nullptr) preempted = &a;
    queued_since = a.outcome == AttemptOutcomeCode::kRunning ? INT64_MAX : a.ended_ms;
  }
  if (job.state == JobStateCode::kQueued && queued_since != INT64_MAX) {
    g.queue_s += static_cast<double>(std::max<int64_t>(0, now_ms - queued_since)) / 1000.0;
  }
  return g;
}

GoodputSplit AttemptGoodput(const AttemptRow& a, const std::vector<MetricRow>& metrics,
                            const std::vector<CheckpointRow>& checkpoints, int64_t now_ms) {
  const auto steps = StepsByEpoch(metrics);
  const auto it = steps.find(a.epoch);
  double first_step_end_ms = 0;
  return SplitAttempt(a, it == steps.end() ? std::vector<StepTime>() : it->second, Checkpointed(checkpoints),
                      SurvivesThrough(a, checkpoints), now_ms, &first_step_end_ms);
}

}  // namespace ft
