#include "daemon/prometheus.h"

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "daemon/json_views.h"
#include "engine/job/checkpoint_interval.h"

namespace ft {

namespace {

namespace pb = ftune::v1;

// A number as Prometheus reads it (shortest exact form; no locale).
std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

void Family(std::string* out, const std::string& name, const std::string& type, const std::string& help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// One sample per goodput category; `head` is the metric name and the labels before category, e.g.
// `ftune_pool_goodput_seconds_total{pool="spot",`.
void CategorySamples(std::string* out, const std::string& head, double productive, double checkpoint,
                     double restart, double lost) {
  for (const auto& [category, value] : std::vector<std::pair<const char*, double>>{
           {"productive", productive}, {"checkpoint", checkpoint}, {"restart", restart}, {"lost", lost}}) {
    *out += head + "category=\"" + category + "\"} " + Num(value) + "\n";
  }
}
void GoodputSamples(std::string* out, const std::string& head, const GoodputSplit& s) {
  CategorySamples(out, head, s.productive_s, s.checkpoint_s, s.restart_s, s.lost_s);
}

// Money (daemon_money.cc): each pool's ended attempts' cost by category, each team's spend and budget.
Status MoneySamples(std::string* out, Daemon& daemon,
                    const std::map<std::string, Store::AttemptTotals>& pools) {
  Family(out, "ftune_pool_cost_total", "counter",
         "What the attempts ended in a worker pool cost (device-seconds at each attempt's price per "
         "device-hour), by goodput category.");
  for (const auto& [pool, history] : pools) {
    const CostSplit& c = history.cost;
    CategorySamples(out, "ftune_pool_cost_total{pool=\"" + pool + "\",", c.productive, c.checkpoint,
                    c.restart, c.lost);
  }
  FT_ASSIGN_OR_RETURN(const std::vector<TeamInfo> teams, daemon.ListTeams());
  Family(out, "ftune_team_spend", "gauge",
         "What a team's jobs' attempts cost so far (running ones up to now).");
  for (const TeamInfo& t : teams)
    *out += "ftune_team_spend{team=\"" + PrometheusLabelValue(t.name) + "\"} " + Num(t.spend) + "\n";
  Family(out, "ftune_team_budget", "gauge",
         "A team's budget (teams with one): no new job once spend reaches it.");
  for (const TeamInfo& t : teams)
    if (t.budget)
      *out += "ftune_team_budget{team=\"" + PrometheusLabelValue(t.name) + "\"} " + Num(*t.budget) + "\n";
  return Status::OK();
}

// The newest objective metrics of each job that has not ended, one gauge sample per name.
Status ObjectiveSamples(std::string* out, Daemon& daemon) {
  FT_ASSIGN_OR_RETURN(const auto jobs, daemon.store().LiveObjectiveMetrics());
  Family(out, "ftune_job_objective_metric", "gauge",
         "The training objective's own means at the newest step of each job that has not ended (DPO: "
         "rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen, "
         "logps/rejected).");
  for (const auto& [job, metrics] : jobs) {
    for (const auto& [name, value] : metrics) {
      *out += "ftune_job_objective_metric{job=\"" + PrometheusLabelValue(job) + "\",name=\"" +
              PrometheusLabelValue(name) + "\"} " + (std::isnan(value) ? "NaN" : Num(value)) + "\n";
    }
  }
  return Status::OK();
}

}  // namespace

std::string PrometheusLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string PrometheusHistogram(const std::string& name, const std::string& help, const LatencyHistogram& h,
                                double min_le, double max_le) {
  std::string out;
  Family(&out, name, "histogram", help);
  int64_t cumulative = 0;
  // Every 10th edge: half-decades (1, 3.162, 10, 31.62 ... of a unit), exact
  // bucket boundaries, printed rounded so the `le` labels are stable strings.
  for (int b = 0; b < LatencyHistogram::kBuckets; ++b) {
    cumulative += h.bucket_count(b);
    const double le = LatencyHistogram::UpperEdge(b);
    if (b == LatencyHistogram::kBuckets - 1 || (b + 1) % 10 != 0 || le < min_le * 0.999 ||
        le > max_le * 1.001) {
      continue;
    }
    char label[32];
    std::snprintf(label, sizeof(label), "%.4g", le);
    out += name + "_bucket{le=\"" + label + "\"} " + std::to_string(cumulative) + "\n";
  }
  // +Inf and _count from the same bucket reads, so buckets stay monotonic
  // while Record runs concurrently.
  const int64_t count = cumulative;
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count) + "\n";
  out += name + "_sum " + Num(h.sum_seconds()) + "\n";
  out += name + "_count " + std::to_string(count) + "\n";
  return out;
}

namespace {

// ftune_webhook_deliveries_total{result} (daemon/webhook_sender.h).
void WebhookSamples(std::string* out, Daemon& daemon) {
  const WebhookCounters& c = daemon.webhook_counters();
  Family(out, "ftune_webhook_deliveries_total", "counter",
         "Webhook delivery attempts since ftd started: delivered (2xx), failed (retried or given up), and "
         "deliveries given up after the last attempt (each also an event on the job).");
  *out += "ftune_webhook_deliveries_total{result=\"delivered\"} " + std::to_string(c.delivered.load()) + "\n";
  *out += "ftune_webhook_deliveries_total{result=\"failed\"} " + std::to_string(c.failed.load()) + "\n";
  *out += "ftune_webhook_deliveries_total{result=\"given_up\"} " + std::to_string(c.given_up.load()) + "\n";
}

}  // namespace

StatusOr<std::string> RenderPrometheus(Daemon& daemon) {
  FT_ASSIGN_OR_RETURN(StoreTotals totals, daemon.store().Totals());
  FT_ASSIGN_OR_RETURN(pb::ListWorkersReply workers, daemon.ListWorkers());
  std::string out;
  Family(&out, "ftune_jobs", "gauge", "Jobs by state.");
  for (const auto& [state, n] : totals.jobs_by_state) {
    out += "ftune_jobs{state=\"" + JobStateName(static_cast<pb::JobState>(static_cast<int>(state))) + "\"} " +
           std::to_string(n) + "\n";
  }
  Family(&out, "ftune_attempts_total", "counter", "Attempts started, over all jobs.");
  out += "ftune_attempts_total " + std::to_string(totals.attempts) + "\n";
  Family(&out, "ftune_preemptions_total", "counter",
         "Attempts preempted (signal, notice, slot end, lost worker), over all jobs.");
  out += "ftune_preemptions_total " + std::to_string(totals.preemptions) + "\n";
  Family(&out, "ftune_failures_total", "counter", "Attempts failed (counted against max_failures).");
  out += "ftune_failures_total " + std::to_string(totals.failures) + "\n";

  int64_t alive = 0, lost = 0;
  std::string memory;
  for (const pb::WorkerInfo& w : workers.workers()) {
    (w.alive() ? alive : lost) += 1;
    const std::string worker = PrometheusLabelValue(w.id());
    for (const pb::Device& d : w.devices()) {
      const std::string labels =
          "{worker=\"" + worker + "\",device=\"" + std::to_string(d.index()) + "\",kind=\"";
      memory += "ftune_device_memory_bytes" + labels + "used\"} " + std::to_string(d.used_bytes()) + "\n";
      memory += "ftune_device_memory_bytes" + labels + "total\"} " + std::to_string(d.total_bytes()) + "\n";
    }
  }
  Family(&out, "ftune_workers", "gauge", "Known workers, alive or lost (lease expired).");
  out += "ftune_workers{state=\"alive\"} " + std::to_string(alive) + "\n";
  out += "ftune_workers{state=\"lost\"} " + std::to_string(lost) + "\n";
  Family(&out, "ftune_device_memory_bytes", "gauge", "Device memory as the newest heartbeat reported it.");
  out += memory;

  Family(&out, "ftune_daemon_errors_total", "counter",
         "Failures ftd handled without failing a job (each also logged), by what failed.");
  for (const DaemonErrorInfo& e : DaemonErrorTable()) {
    out += "ftune_daemon_errors_total{what=\"" + std::string(e.name) + "\"} " +
           std::to_string(daemon.error_count(e.error)) + "\n";
  }

  Family(&out, "ftune_daemon_stall_seconds_total", "counter",
         "ftd's own stalls (its lock held too long), credited to every worker's lease.");
  out +=
      "ftune_daemon_stall_seconds_total " + Num(static_cast<double>(daemon.stall_ms_total()) / 1000.0) + "\n";

  Family(&out, "ftune_goodput_seconds_total", "counter",
         "Device-seconds of the attempts ended since ftd started, by what they bought (productive, "
         "checkpoint, restart, lost; docs/OPERATIONS.md, Goodput).");
  GoodputSamples(&out, "ftune_goodput_seconds_total{", daemon.goodput_total());
  Family(&out, "ftune_pool_mtbf_seconds", "gauge",
         "Mean time between preemptions over a worker pool's attempt history: checkpoint.every auto's M.");
  std::map<std::string, Store::AttemptTotals> pools = daemon.attempt_history();
  for (const auto& [pool, alive] : daemon.live_pools()) pools.try_emplace(pool);  // the prior, until one ends
  for (const auto& [pool, history] : pools) {
    out += "ftune_pool_mtbf_seconds{pool=\"" + pool + "\"} " +
           Num(MeanTimeBetweenPreemptions(history.seconds, history.preemptions)) + "\n";
  }
  Family(&out, "ftune_pool_goodput_seconds_total", "counter",
         "Device-seconds of the attempts ended in a worker pool, by goodput category (from SQLite).");
  for (const auto& [pool, history] : pools) {
    GoodputSamples(&out, "ftune_pool_goodput_seconds_total{pool=\"" + pool + "\",", history.device);
  }
  FT_RETURN_IF_ERROR(MoneySamples(&out, daemon, pools));
  FT_RETURN_IF_ERROR(ObjectiveSamples(&out, daemon));
  WebhookSamples(&out, daemon);
  out += PrometheusHistogram("ftune_checkpoint_duration_seconds", "Checkpoint write time, as committed.",
                             daemon.checkpoint_seconds(), 0.01, 1000);
  out += PrometheusHistogram("ftune_recovery_seconds",
                             "Time from a worker loss or preemption to the job's next trained step.",
                             daemon.recovery_seconds(), 0.1, 1000);
  out += PrometheusHistogram("ftune_scheduler_tick_seconds", "Time of one scheduler tick.",
                             daemon.tick_latency(), 1e-5, 10);
  out += PrometheusHistogram("ftune_worker_message_seconds", "Time to handle one worker message.",
                             daemon.message_latency(), 1e-5, 10);
  return out;
}

}  // namespace ft
