// The daemon's placement: planning inputs, one scheduling pass over the
// queued jobs and starting an attempt (one rank or a gang) on its workers.
#include <algorithm>
#include <filesystem>
#include <functional>

#include "common/logging.h"
#include "daemon/daemon.h"
#include "daemon/daemon_internal.h"
#include "engine/job/checkpoint_interval.h"
#include "engine/job/hf_config.h"
#include "engine/job/job_spec.h"

namespace ft {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

using daemon_internal::MakeJobView;
using daemon_internal::StoredSpec;

StatusOr<int64_t> Daemon::PredictedBytes(const std::string& job_id) {
  Held lock(this);
  FT_ASSIGN_OR_RETURN(JobRow job, store_->GetJob(job_id));
  FT_ASSIGN_OR_RETURN(auto attempts, store_->ListAttempts(job_id));
  if (attempts.empty() || attempts.back().micro_batch <= 0) return int64_t{0};
  FT_RETURN_IF_ERROR(EnsurePlanInput(job));
  PlanRequest plan = plan_inputs_[job_id].plan;
  auto session = sessions_.find(attempts.back().worker_id);
  if (session != sessions_.end() && !session->second.devices.empty()) {
    if (auto d = DeviceViewOf(session->second.devices.front())) plan.device = d->kind;
  }
  plan.world = std::max<int64_t>(1, attempts.back().world);
  return PredictMemory(plan, attempts.back().micro_batch).total();
}

double Daemon::EstimateCheckpointSeconds(const std::string& job_id) {
  auto last = store_->LatestCheckpoint(job_id);
  if (last.ok() && last->write_seconds > 0) return last->write_seconds;
  auto view = plan_inputs_.find(job_id);
  if (view == plan_inputs_.end()) return 10.0;
  // What a checkpoint writes: the trainable weights and their Adam moments
  // (all weights in a full fine-tune), at a conservative 100 MB/s, plus 1 s.
  const MemoryBreakdown m = PredictMemory(view->second.plan, 1);
  const int64_t bytes = m.adapter + m.optimizer + (view->second.plan.full ? m.weights : 0);
  return 1.0 + static_cast<double>(bytes) / 100e6;
}

Status Daemon::EnsurePlanInput(const JobRow& job) {
  if (plan_inputs_.count(job.id)) return Status::OK();
  FT_ASSIGN_OR_RETURN(JobSpec spec, StoredSpec(job));
  FT_ASSIGN_OR_RETURN(ModelConfig model, ReadHfConfig(spec.model.path));
  JobView view = MakeJobView(job, spec, model);
  view.placement_class = placement_classes_.Of(view);
  plan_inputs_[job.id] = std::move(view);
  return Status::OK();
}

uint64_t Daemon::SchedulerInputs() const {
  // FNV-1a over every field a pass reads (WorkerView's, and the queue's version).
  uint64_t h = 1469598103934665603ULL;
  const auto mix = [&h](int64_t v) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ULL;
  };
  mix(queue_version_);
  for (const auto& [id, s] : sessions_) {
    mix(static_cast<int64_t>(reinterpret_cast<intptr_t>(&s)));  // the session (its id), stable in the map
    mix((s.alive ? 1 : 0) | (s.sink != nullptr ? 2 : 0) | (s.running_job.empty() ? 4 : 0) |
        (s.draining ? 8 : 0));
    mix(s.slot_end_ms);
    mix(s.host_free_bytes);
    mix(s.rendezvous_port_count);
    for (const DeviceRow& d : s.devices) {
      mix(static_cast<int64_t>(d.kind.size()) << 8 | (d.kind.empty() ? 0 : d.kind[0]));  // "cpu", "cuda"
      mix(d.index);
      mix(d.total_bytes);
      mix(d.free_bytes);
    }
  }
  return h;
}

int64_t Daemon::NextTimedChange(int64_t now_wall_ms, bool backing_off) const {
  int64_t next = now_wall_ms + kFullPassMs;
  // A backoff's wait reason counts its seconds down (and its end lets the job be placed): a
  // pass each second while one lasts.
  if (backing_off) next = now_wall_ms + 1000;
  for (const auto& [id, s] : sessions_) {
    const int64_t soon = s.slot_end_ms - options_.min_slot_ms;  // from then on it takes no new work
    if (s.slot_end_ms > 0 && soon > now_wall_ms) next = std::min(next, soon);
  }
  // A running job becomes preemptable once it has run min_runtime: a waiting job may take it then.
  for (const auto& [job_id, meta] : running_meta_) {
    const int64_t preemptable = meta.started_wall_ms + options_.min_runtime_ms;
    if (preemptable > now_wall_ms) next = std::min(next, preemptable);
  }
  return next;
}

void Daemon::ScheduleQueued() {
  if (queued_.empty()) return;
  // Incremental: a pass runs when what the last one read has changed (a job queued or gone, a
  // worker's availability, memory or slot), or a time it depends on has come.
  const int64_t now = clock_->WallMs();
  if (SchedulerInputs() == last_pass_inputs_ && now < next_pass_wall_ms_) return;
  if (queue_order_version_ != queue_version_) {  // in queue order; rebuilt when the queue changed
    queue_order_.assign(queued_.begin(), queued_.end());
    queue_order_version_ = queue_version_;
  }
  const std::vector<const JobView*>& jobs = queue_order_;
  std::vector<WorkerView> workers;
  for (const auto& [id, s] : sessions_) {
    std::vector<DeviceView> devices;
    for (const DeviceRow& d : s.devices) {
      if (auto view = DeviceViewOf(d)) devices.push_back(*view);
    }
    workers.push_back({id, s.alive && s.sink != nullptr, !s.running_job.empty(), s.draining, s.slot_end_ms,
                       std::move(devices), s.host_free_bytes, s.rendezvous_port_count > 0,
                       RunningViewOf(id, s)});
  }
  ScheduleResult result = Schedule(jobs, workers, now,
                                   {.min_slot_ms = options_.min_slot_ms,
                                    .fair_share_half_life_ms = options_.fair_share_half_life_ms,
                                    .min_runtime_ms = options_.min_runtime_ms},
                                   TeamsForPass());
  passes_.fetch_add(1);
  for (const Preemption& p : result.preemptions) Preempt(p);
  for (const Placement& p : result.placements) {
    auto job = store_->GetJob(p.job_id);
    if (job.ok()) StartOn(*job, p);
    Check(job.status(), "load job to start");
  }
  // The teams' usage counts the jobs just started from now on (its devices are recorded per accrual).
  if (!result.placements.empty()) AccrueTeamUsage();
  bool backing_off = false;
  for (const auto& [view, why] : result.waiting) {
    backing_off |= why.why == WaitReason::Why::kBackoff;
    // Why a job waits is recomputed every tick: kept in memory, not fsynced; published when it changes.
    auto [it, added] = waiting_.try_emplace(view, why);
    if (!added) {
      if (it->second == why) continue;
      it->second = why;
    }
    PublishJob(view->id);
  }
  last_pass_inputs_ = SchedulerInputs();  // as this pass left them (placements change both sides)
  next_pass_wall_ms_ = NextTimedChange(now, backing_off);
}

void Daemon::StartOn(const JobRow& job, const Placement& p) {
  auto spec = StoredSpec(job);
  if (!spec.ok()) {
    // Planned from the view taken at submit, but its stored spec no longer parses: it never can.
    FailUnrunnable(job, "cannot start: " + spec.status().message());
    return;
  }
  // Every rank gets a credential (HMAC under the attempt key, made once): without it, no start.
  if (StatusOr<std::string> key = Credential(job.id, 0, 0); !key.ok()) {
    Check(key.status(), "attempt key");
    return;
  }
  auto ckpt = store_->LatestCheckpoint(job.id);
  const int64_t start_step = ckpt.ok() ? ckpt->step : 0;
  const bool gang = p.ranks.size() > 1;
  const std::string pool = sessions_[p.worker_id].pool;  // rank 0's worker's
  // Its price per device-hour: the mean over its ranks of their workers' (common/money.h).
  const auto price_on = [&](const std::string& worker) {
    const Session& s = sessions_[worker];
    return PriceIn(s.pool, s.price);
  };
  double price = price_on(p.worker_id);
  if (gang) {
    price = 0;
    for (const RankSlot& r : p.ranks) price += price_on(r.worker_id);
    price /= static_cast<double>(p.ranks.size());
  }
  auto attempt =
      store_->StartAttempt(job.id, p.worker_id, start_step, p.plan.micro_batch, p.plan.accumulation,
                           p.plan.world, clock_->WallMs(), p.ranks, pool, price);
  if (!attempt.ok()) {
    Check(attempt.status(), "start attempt");
    return;
  }
  JobRow j = job;
  j.state = JobStateCode::kRunning;
  j.reason = "";
  j.updated_ms = clock_->WallMs();
  Check(store_->UpdateJob(j), "job running");
  TrackState(j);
  running_epoch_[job.id] = attempt->epoch;
  TrackGang(*attempt);
  running_meta_[job.id] = RunningMeta::Of(*attempt, p.borrowed);
  const Binding* binding = Bind(*attempt);
  pb::DaemonCommand cmd;
  pb::StartAttempt* start = cmd.mutable_start();
  start->set_job_id(job.id);
  start->set_epoch(attempt->epoch);
  start->set_spec_yaml(
      ResolvedJobYaml(*spec, job.spec_yaml, p.plan.micro_batch, p.plan.accumulation, p.plan.world));
  start->mutable_plan()->set_micro_batch(p.plan.micro_batch);
  start->mutable_plan()->set_accumulation(p.plan.accumulation);
  start->mutable_plan()->set_world(p.plan.world);
  if (ckpt.ok()) start->set_resume_checkpoint(ckpt->dir);
  for (const std::string& root : options_.allowed_roots) start->add_allowed_roots(root);
  start->set_total_steps(job.total_steps);
  start->set_start_step(start_step);
  const Store::AttemptTotals& history = history_[pool];
  const double mtbf = MeanTimeBetweenPreemptions(history.seconds, history.preemptions);
  start->set_mtbf_seconds(mtbf);
  std::string where = p.worker_id;
  if (gang) {
    // Rank 0 serves the rendezvous on a port of its worker's range: another one each epoch,
    // and jobs spread over the range (workers sharing a node should still get ranges of their own).
    const Session& first = sessions_[p.worker_id];
    const uint64_t spread = std::hash<std::string>{}(job.id) + static_cast<uint64_t>(attempt->epoch);
    const int64_t port =
        first.rendezvous_port_first +
        static_cast<int64_t>(spread % static_cast<uint64_t>(std::max(1, first.rendezvous_port_count)));
    start->set_rendezvous(first.address + ":" + std::to_string(port));
    where = std::to_string(p.ranks.size()) + " ranks on";
    for (const RankSlot& r : p.ranks) where += " " + r.worker_id;
  }
  for (size_t r = 0; r < std::max<size_t>(1, p.ranks.size()); ++r) {
    Session& s = sessions_[gang ? p.ranks[r].worker_id : p.worker_id];
    s.running_job = job.id;
    s.running_epoch = attempt->epoch;
    s.stop_sent = false;
    s.checkpoint_seconds = 0;  // measured anew for this job
    start->set_rank(static_cast<int32_t>(r));
    start->set_device_index(gang ? p.ranks[r].device : 0);
    start->set_dist_host(gang ? s.address : "");
    if (binding != nullptr && r < binding->credentials.size()) start->set_credential(binding->credentials[r]);
    s.sink->Send(cmd);
  }
  Event(job.id, p.worker_id, attempt->number == 1 ? "started" : "resumed",
        (attempt->number == 1 ? "started" : "resumed from step " + std::to_string(start_step)) + " on " +
            where + " (" + DeviceKindName(p.device_kind) + ", micro-batch " +
            std::to_string(p.plan.micro_batch) + " x " + std::to_string(p.plan.accumulation) +
            (gang ? " x " + std::to_string(p.plan.world) + " ranks" : "") + ", epoch " +
            std::to_string(attempt->epoch) + "; preemptions in pool " + pool +
            ": M = " + FormatMinutes(mtbf) + " from " + std::to_string(history.preemptions) + " in " +
            FormatMinutes(history.seconds) + " of attempts)",
        start_step);
  PublishJob(job.id);
}

}  // namespace ft
