// Prometheus text exposition (format 0.0.4) of ftd's state, for GET /metrics.
//
// What it exports (every family has HELP and TYPE; docs/HTTP_API.md lists them):
//   ftune_jobs{state}                            gauge, jobs per state (all six states, also 0)
//   ftune_attempts_total, ftune_preemptions_total, ftune_failures_total   counters
//   ftune_workers{state="alive"|"lost"}          gauge
//   ftune_device_memory_bytes{worker,device,kind="used"|"total"}  gauge, from the newest heartbeat
//   ftune_daemon_errors_total{what}              counter, per DaemonError (daemon/daemon.h)
//   ftune_daemon_stall_seconds_total             counter, ftd's stalls credited to the leases
//   ftune_webhook_deliveries_total{result}       counter, webhook attempts delivered | failed, and given_up
//   ftune_job_objective_metric{job,name}         gauge, the newest step's objective metrics (DPO's
//                                                rewards) of each job that has not ended
//   ftune_checkpoint_duration_seconds, ftune_recovery_seconds,
//   ftune_scheduler_tick_seconds, ftune_worker_message_seconds    histograms
//
// RenderPrometheus returns the text, or the store's error when it cannot be
// read. PrometheusHistogram is exposed for tests. Label values are escaped as
// the format requires (backslash, double quote, newline).
//
// Thread safety: reads the daemon through its thread-safe methods.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/daemon.h"
#include "daemon/latency.h"

namespace ft {

StatusOr<std::string> RenderPrometheus(Daemon& daemon);

// One histogram family `name` from `h`, with cumulative buckets at the
// histogram's own bucket edges between `min_le` and `max_le` seconds, +Inf,
// _sum and _count.
std::string PrometheusHistogram(const std::string& name, const std::string& help, const LatencyHistogram& h,
                                double min_le, double max_le);

// A label value escaped for the text format.
std::string PrometheusLabelValue(const std::string& value);

}  // namespace ft
