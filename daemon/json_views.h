// JSON shapes of the HTTP API (docs/HTTP_API.md), built from the daemon's
// protobuf messages and store rows. Shared by the JSON handlers
// (daemon/http_api.h) and the SSE stream (daemon/http_server.h) so that a
// job reads the same in a list, a detail page and a live update.
//
// Pure conversions: no I/O, no locks, never fail. NaN numbers (a diverged or
// not yet reported loss) become JSON null.
//
// Thread safety: free functions over values; safe from any thread.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/store.h"
#include "proto/ftune.pb.h"
#include "proto/names.h"

namespace ft {

// A JobSummary: the row of the jobs list. `loss_spark` is the downsampled loss
// (Store::LossSparklines). eta_s comes from the running attempt's step rate
// (steps since its start over the time to the newest progress report); null
// when the job is not running or has made no progress yet.
nlohmann::json JobSummaryJson(const ftune::v1::Job& job, const std::vector<double>& loss_spark);

// A job's detail: the summary plus attempts_list (from the store's rows, which
// carry each attempt's plan), spec_yaml, output_dir, plan (the newest
// attempt's; null before any), predicted_bytes and goodput (job.goodput(), as
// Daemon::GetJob fills it: the device-second split, goodput, queue_s and
// recovery_s). Each attempt gets its split from the job's attempt of the same
// number (zeros when the job has none). objective_metrics: the newest step's
// (job.objective_metrics(); {} for SFT).
nlohmann::json JobDetailJson(const ftune::v1::Job& job, const std::vector<AttemptRow>& attempts,
                             const std::vector<double>& loss_spark, int64_t predicted_bytes);

nlohmann::json EventJson(const ftune::v1::Event& e);
nlohmann::json EventJson(const EventRow& e);
// A metric point; with `job_id` non-empty it also carries "job_id" (the SSE
// form). "eval_loss" is the data.eval loss at that step, null when none;
// "objective_metrics" the objective's own means by name ({} for SFT; a value
// that is not finite is null).
nlohmann::json MetricJson(const ftune::v1::MetricPoint& p, const std::string& job_id);
nlohmann::json MetricJson(const MetricRow& m);
nlohmann::json DeviceMemoryJson(const DeviceMemoryRow& d);
nlohmann::json WorkerJson(const ftune::v1::WorkerInfo& w);
// Each worker pool's figures, by name, over every pool with history or a live
// worker: pool, workers_alive, and from ftd's attempt history (the attempts
// that ended in it): attempts, attempt_seconds, preemptions,
// preemptions_per_hour (0 when no attempt time), mtbf_s (checkpoint.every
// auto's M, MeanTimeBetweenPreemptions), mtbf_is_prior (no preemption yet: M
// is the prior, or the time seen without one), and goodput (device-seconds
// productive_s, checkpoint_s, restart_s, lost_s, and goodput = productive ÷
// their sum, 1 with none).
nlohmann::json PoolsJson(const std::map<std::string, Store::AttemptTotals>& history,
                         const std::map<std::string, int64_t>& alive);

}  // namespace ft
