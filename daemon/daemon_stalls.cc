// Daemon: stalled jobs (issue #44, point 5). A running job whose worker keeps its lease but whose
// step stops advancing is evented `stalled` once (a webhook's "stalled" kind fires on it), and
// `stall_ended` when a step comes again.
//
// Expected interval: the attempt's measured time per step (from its first step advance, or the end
// of its last stall, to its newest step, as the heartbeats report them), else the one measured
// before (the attempt's before its stall, the job's previous attempt's). Bound:
// max(stall_min_ms, stall_factor × that interval), or stall_min_ms while no interval is known.
// An attempt is judged only once its step has advanced (model loading is not a stall), and not
// while ftd is stopping it (slot end, cancel, preemption: it checkpoints instead of stepping).
#include <algorithm>
#include <cstdio>

#include "daemon/daemon.h"

namespace ft {

namespace {

std::string Seconds(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms) / 1000.0);
  return text;
}

}  // namespace

void Daemon::WatchProgress(const std::string& job_id, int64_t epoch, int64_t step) {
  const int64_t now = clock_->MonotonicMs();
  StallWatch& w = stall_watch_[job_id];
  if (w.epoch != epoch) w = StallWatch{.epoch = epoch};
  if (w.last_step < 0) {  // the attempt's first report: the clock starts
    w.last_step = step;
    w.last_mono = now;
    return;
  }
  if (step <= w.last_step) return;
  if (w.stalled) {  // a new measurement starts here: the stall is no step interval
    Event(job_id, "", "stall_ended",
          "step " + std::to_string(step) + " came after " + Seconds(now - w.last_mono) + " without one",
          step);
    w.stalled = false;
    w.first_step = step;
    w.first_mono = now;
  } else if (w.first_step < 0) {  // its first advance: intervals are measured from here
    w.first_step = step;
    w.first_mono = now;
  } else {
    step_interval_ms_[job_id] = (now - w.first_mono) / (step - w.first_step);
  }
  w.last_step = step;
  w.last_mono = now;
}

int64_t Daemon::StepIntervalMs(const std::string& job_id, const StallWatch& w) const {
  if (w.first_step >= 0 && w.last_step > w.first_step) {
    return (w.last_mono - w.first_mono) / (w.last_step - w.first_step);
  }
  auto earlier = step_interval_ms_.find(job_id);
  return earlier != step_interval_ms_.end() ? earlier->second : 0;
}

void Daemon::CheckStalls() {
  const int64_t now = clock_->MonotonicMs();
  for (auto it = stall_watch_.begin(); it != stall_watch_.end();) {
    const std::string job_id = it->first;
    StallWatch& w = it->second;
    auto running = running_epoch_.find(job_id);
    if (running == running_epoch_.end() || running->second != w.epoch) {  // its attempt ended
      if (!plan_inputs_.count(job_id)) step_interval_ms_.erase(job_id);   // and so did the job
      it = stall_watch_.erase(it);
      continue;
    }
    ++it;
    if (w.stalled || w.first_step < 0 || StoppedForAnotherJob(job_id)) continue;
    const int64_t interval = StepIntervalMs(job_id, w);
    const int64_t bound = std::max(
        options_.stall_min_ms, static_cast<int64_t>(options_.stall_factor * static_cast<double>(interval)));
    if (now - w.last_mono < bound) continue;
    const bool stopping = std::any_of(sessions_.begin(), sessions_.end(), [&](const auto& s) {
      return s.second.running_job == job_id && s.second.stop_sent;
    });
    if (stopping) continue;
    w.stalled = true;
    Event(job_id, "", "stalled",
          "no step for " + Seconds(now - w.last_mono) + " after step " + std::to_string(w.last_step) +
              " (expected one every " + (interval > 0 ? Seconds(interval) : std::string("? s")) + "; bound " +
              Seconds(bound) + "); its worker still holds the lease",
          w.last_step);
  }
}

}  // namespace ft
