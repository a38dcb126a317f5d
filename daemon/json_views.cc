#include "daemon/json_views.h"

#include <cmath>
#include <map>
#include <set>

#include "engine/job/checkpoint_interval.h"

namespace ft {

namespace pb = ftune::v1;
using nlohmann::json;

namespace {

// NaN and infinities are not JSON: null.
json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json Spark(const std::vector<double>& points) {
  json out = json::array();
  for (double v : points) out.push_back(Number(v));
  return out;
}

// Seconds left at the running attempt's observed step rate, or null.
json Eta(const pb::Job& job) {
  if (job.state() != pb::RUNNING || job.total_steps() <= 0) return nullptr;
  for (const pb::Attempt& a : job.attempts()) {
    if (a.outcome() != pb::ATTEMPT_RUNNING) continue;
    const int64_t steps = job.steps_done() - a.start_step();
    const int64_t elapsed_ms = job.updated_ms() - a.started_ms();
    if (steps <= 0 || elapsed_ms <= 0) return nullptr;
    const double per_step_s = static_cast<double>(elapsed_ms) / 1000.0 / static_cast<double>(steps);
    return std::max<int64_t>(0, job.total_steps() - job.steps_done()) * per_step_s;
  }
  return nullptr;
}

json SplitJson(const pb::GoodputSplit& s) {
  return {{"productive_s", Number(s.productive_s())},
          {"checkpoint_s", Number(s.checkpoint_s())},
          {"restart_s", Number(s.restart_s())},
          {"lost_s", Number(s.lost_s())}};
}

json CostJson(const pb::CostSplit& c) {
  return {{"productive", Number(c.productive())},
          {"checkpoint", Number(c.checkpoint())},
          {"restart", Number(c.restart())},
          {"lost", Number(c.lost())},
          {"total", Number(c.total())}};
}

json GoodputJson(const pb::Goodput& g) {
  json out = SplitJson(g.device());
  out["cost"] = CostJson(g.cost());
  out["goodput"] = Number(g.goodput());
  out["queue_s"] = Number(g.queue_s());
  out["recovery_s"] = Spark({g.recovery_s().begin(), g.recovery_s().end()});
  out["recovery_after"] = std::vector<int64_t>(g.recovery_after().begin(), g.recovery_after().end());
  out["notices"] = g.notices();
  out["notices_caught"] = g.notices_caught();
  out["scheduler_preemptions"] = g.scheduler_preemptions();
  return out;
}

// A step's objective metrics (a proto map or a std::map) as a JSON object by name.
template <typename Map>
json ObjectiveJson(const Map& metrics) {
  json out = json::object();
  for (const auto& kv : metrics) out[kv.first] = Number(kv.second);
  return out;
}

}  // namespace

json JobSummaryJson(const pb::Job& job, const std::vector<double>& loss_spark) {
  return {
      {"id", job.id()},
      {"name", job.name()},
      {"state", JobStateName(job.state())},
      {"reason", job.reason()},
      {"priority", job.priority()},
      {"created_ms", job.created_ms()},
      {"updated_ms", job.updated_ms()},
      {"steps_done", job.steps_done()},
      {"total_steps", job.total_steps()},
      {"last_loss", Number(job.last_loss())},
      {"tokens_per_s", Number(job.tokens_per_s())},
      {"committed_step", job.committed_step()},
      {"preemptions", job.preemptions()},
      {"failures", job.failures()},
      {"attempts", job.attempts_size()},
      {"worker_id", job.worker_id()},
      {"submitted_by", job.submitted_by()},
      {"team", job.team()},
      {"eta_s", Eta(job)},
      {"loss_spark", Spark(loss_spark)},
  };
}

json JobDetailJson(const pb::Job& job, const std::vector<AttemptRow>& attempts,
                   const std::vector<double>& loss_spark, int64_t predicted_bytes) {
  json out = JobSummaryJson(job, loss_spark);
  std::map<int64_t, const pb::Attempt*> proto_of;  // attempt number → its goodput split and cost
  for (const pb::Attempt& a : job.attempts()) proto_of[a.number()] = &a;
  json list = json::array();
  for (const AttemptRow& a : attempts) {
    auto found = proto_of.find(a.number);
    const pb::Attempt& p = found == proto_of.end() ? pb::Attempt::default_instance() : *found->second;
    json ranks = json::array();
    for (size_t r = 0; r < a.ranks.size(); ++r) {
      ranks.push_back({{"rank", r}, {"worker_id", a.ranks[r].worker_id}, {"device", a.ranks[r].device}});
    }
    list.push_back({
        {"number", a.number},
        {"epoch", a.epoch},
        {"worker_id", a.worker_id},
        {"outcome", AttemptOutcomeName(static_cast<pb::AttemptOutcome>(static_cast<int>(a.outcome)))},
        {"reason", a.reason},
        {"started_ms", a.started_ms},
        {"ended_ms", a.ended_ms},
        {"start_step", a.start_step},
        {"end_step", a.end_step},
        {"steps_lost", a.steps_lost},
        {"micro_batch", a.micro_batch},
        {"accumulation", a.accumulation},
        {"world", a.world},
        {"ranks", std::move(ranks)},
        {"goodput", SplitJson(p.goodput())},
        {"price", a.price},
        {"cost", CostJson(p.cost())},
    });
  }
  out["attempts_list"] = std::move(list);
  out["spec_yaml"] = job.spec_yaml();
  out["output_dir"] = job.output_dir();
  out["plan"] = attempts.empty() ? json(nullptr)
                                 : json{{"micro_batch", attempts.back().micro_batch},
                                        {"accumulation", attempts.back().accumulation},
                                        {"world", attempts.back().world}};
  out["predicted_bytes"] = predicted_bytes;
  out["goodput"] = GoodputJson(job.goodput());
  out["objective_metrics"] = ObjectiveJson(job.objective_metrics());
  return out;
}

json EventJson(const pb::Event& e) {
  return {{"seq", e.seq()},   {"time_ms", e.time_ms()}, {"job_id", e.job_id()}, {"worker_id", e.worker_id()},
          {"kind", e.kind()}, {"message", e.message()}, {"step", e.step()}};
}

json EventJson(const EventRow& e) {
  return {{"seq", e.seq},   {"time_ms", e.time_ms}, {"job_id", e.job_id}, {"worker_id", e.worker_id},
          {"kind", e.kind}, {"message", e.message}, {"step", e.step}};
}

json MetricJson(const pb::MetricPoint& p, const std::string& job_id) {
  json out = {
      {"step", p.step()},
      {"epoch", p.epoch()},
      {"time_ms", p.time_ms()},
      {"loss", Number(p.loss())},
      {"lr", Number(p.lr())},
      {"grad_norm", Number(p.grad_norm())},
      {"tokens_per_s", Number(p.tokens_per_s())},
      {"peak_bytes", p.peak_bytes()},
      {"tokens", p.tokens_seen() > 0 ? json(p.tokens_seen()) : json(nullptr)},
      {"step_seconds", p.has_step_seconds() ? Number(p.step_seconds()) : json(nullptr)},
      {"copy_wait_seconds", p.has_copy_wait_seconds() ? Number(p.copy_wait_seconds()) : json(nullptr)},
      {"eval_loss", p.has_eval_loss() ? Number(p.eval_loss()) : json(nullptr)},
      {"objective_metrics", ObjectiveJson(p.objective_metrics())}};
  if (!job_id.empty()) out["job_id"] = job_id;
  return out;
}

json MetricJson(const MetricRow& m) {
  return {{"step", m.step},
          {"epoch", m.epoch},
          {"time_ms", m.time_ms},
          {"loss", Number(m.loss)},
          {"lr", Number(m.lr)},
          {"grad_norm", Number(m.grad_norm)},
          {"tokens_per_s", Number(m.tokens_per_s)},
          {"peak_bytes", m.peak_bytes},
          {"tokens", m.tokens_seen > 0 ? json(m.tokens_seen) : json(nullptr)},
          {"step_seconds", Number(m.step_seconds)},
          {"copy_wait_seconds", Number(m.copy_wait_seconds)},
          {"eval_loss", Number(m.eval_loss)},
          {"objective_metrics", ObjectiveJson(m.objective_metrics)}};
}

json DeviceMemoryJson(const DeviceMemoryRow& d) {
  return {{"time_ms", d.time_ms},
          {"worker_id", d.worker_id},
          {"device", d.device},
          {"used_bytes", d.used_bytes},
          {"total_bytes", d.total_bytes}};
}

json WorkerJson(const pb::WorkerInfo& w) {
  json devices = json::array();
  for (const pb::Device& d : w.devices()) {
    devices.push_back({{"index", d.index()},
                       {"kind", d.kind()},
                       {"name", d.name()},
                       {"total_bytes", d.total_bytes()},
                       {"free_bytes", d.free_bytes()},
                       {"used_bytes", d.used_bytes()}});
  }
  return {{"id", w.id()},
          {"hostname", w.hostname()},
          {"version", w.version()},
          {"alive", w.alive()},
          {"last_heartbeat_ms", w.last_heartbeat_ms()},
          {"slot_end_ms", w.slot_end_ms()},
          {"running_job_id", w.running_job_id()},
          {"host_total_bytes", w.host_total_bytes()},
          {"host_free_bytes", w.host_free_bytes()},
          {"pool", w.pool()},
          {"price", w.price()},
          {"goodput", SplitJson(w.goodput())},
          {"devices", std::move(devices)}};
}

json PoolJson(const std::string& name, const Store::AttemptTotals& history, int64_t workers_alive) {
  const double per_hour =
      history.seconds > 0 ? static_cast<double>(history.preemptions) / (history.seconds / 3600.0) : 0.0;
  const GoodputSplit& d = history.device;
  return {{"pool", name},
          {"workers_alive", workers_alive},
          {"attempts", history.attempts},
          {"attempt_seconds", history.seconds},
          {"preemptions", history.preemptions},
          {"preemptions_per_hour", per_hour},
          {"mtbf_s", MeanTimeBetweenPreemptions(history.seconds, history.preemptions)},
          {"mtbf_is_prior", history.preemptions == 0},
          {"goodput",
           {{"productive_s", d.productive_s},
            {"checkpoint_s", d.checkpoint_s},
            {"restart_s", d.restart_s},
            {"lost_s", d.lost_s},
            {"goodput", d.goodput()}}},
          {"cost",
           {{"productive", history.cost.productive},
            {"checkpoint", history.cost.checkpoint},
            {"restart", history.cost.restart},
            {"lost", history.cost.lost},
            {"total", history.cost.total()}}}};
}

json PoolsJson(const std::map<std::string, Store::AttemptTotals>& history,
               const std::map<std::string, int64_t>& alive) {
  std::set<std::string> names;
  for (const auto& [name, totals] : history) names.insert(name);
  for (const auto& [name, count] : alive) names.insert(name);
  json out = json::array();
  for (const std::string& name : names) {
    auto h = history.find(name);
    auto a = alive.find(name);
    out.push_back(PoolJson(name, h == history.end() ? Store::AttemptTotals{} : h->second,
                           a == alive.end() ? 0 : a->second));
  }
  return out;
}

}  // namespace ft
