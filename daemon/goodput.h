// Goodput (issue #31): where a job's device time went, derived from what
// ftd keeps in SQLite (attempts, each step's metrics point, committed
// checkpoints), so the figures survive a restart of ftd and need no state
// of their own.
//
// Each attempt's device time, (end - start) × its ranks, is split so the
// parts add up to it exactly:
//   restart     start → its first step began (loading, resume, rendezvous);
//   productive  first step began → the end of its last step whose work
//               survived (at or before the committed step when it ended),
//               less the checkpoint waits in between;
//   checkpoint  the gaps after steps at which a checkpoint was taken (the
//               step loop waited for the capture), and the tail of an
//               attempt that ended by itself (final checkpoint and outputs);
//   lost        the tail of an attempt that was lost or failed: steps redone
//               later, the step in flight, and the time until ftd knew.
// A step's start is its end (the trainer's clock, MetricPoint.time_ms) less
// its step_seconds. Queue wait (created → first start, and each end → the
// next start) is the job's wall time without a device, apart from the rest.
// Recovery time of a preemption: its attempt's end (ftd's detection of the
// loss, or the stop the worker reported) → the end of the next attempt's
// first step.
//
// Clocks: attempt start/end are ftd's, step ends the trainer's; on one host
// (or NTP-synced hosts) they agree to milliseconds.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/store.h"

namespace ft {

// GoodputSplit (device-seconds by category) is defined in daemon/store.h: ended attempts keep theirs.

struct JobGoodput {
  GoodputSplit device;                 // every attempt's
  std::vector<GoodputSplit> attempts;  // by attempt, in number order
  CostSplit cost;                      // every attempt's split at its price (AttemptRow::price)
  double queue_s = 0;                  // wall seconds queued
  // Per preempted attempt with a next attempt that has trained a step: seconds to recover.
  std::vector<double> recovery_s;
  std::vector<int64_t> recovery_after;  // the preempted attempt's number, per recovery
  // Attempts a cloud preemption notice reached, and of them those that lost no step (the
  // checkpoint made it in time).
  int64_t notices = 0, notices_caught = 0;
  // Attempts the scheduler stopped for another job (AttemptRow::preempted_for), of the preempted.
  int64_t scheduler_preemptions = 0;
  // productive ÷ device total (1 when there is no device time yet).
  double goodput() const { return device.goodput(); }
};

// The job's goodput at `now_ms` (a running attempt counts up to now, a queued
// job's wait too). `attempts` in number order; `metrics` the job's rows (any
// order); `checkpoints` its committed checkpoints.
JobGoodput ComputeGoodput(const JobRow& job, const std::vector<AttemptRow>& attempts,
                          const std::vector<MetricRow>& metrics,
                          const std::vector<CheckpointRow>& checkpoints, int64_t now_ms);

// One attempt's split, as ComputeGoodput gives it (`metrics` may hold other epochs' rows).
GoodputSplit AttemptGoodput(const AttemptRow& a, const std::vector<MetricRow>& metrics,
                            const std::vector<CheckpointRow>& checkpoints, int64_t now_ms);

}  // namespace ft
