// Daemon: teams sharing the cluster (issue #44): their quotas and weights (SetTeam, ListTeams),
// their decayed usage, what a scheduling pass sees of the running jobs, and the preemptions a pass
// decides, carried out through the slot-end path (checkpoint, exit, requeue).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "daemon/authorization.h"
#include "daemon/daemon.h"

namespace ft {

namespace {

std::string QuotaText(int64_t quota) {
  return quota < 0 ? "no quota" : "a quota of " + std::to_string(quota);
}

std::string FormatWeight(double weight) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", weight);
  return text;
}

}  // namespace

Status Daemon::CheckTeamChange(const std::string& name, const TeamChange& c) {
  FT_RETURN_IF_ERROR(CheckIdentityName(name, "team"));
  const auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("team " + name + ": " + what);
  };
  if (c.quota_devices && *c.quota_devices < -1) {
    return bad("quota_devices " + std::to_string(*c.quota_devices) +
               " is below -1: use a number of devices, or -1 for no quota");
  }
  if (c.weight && !(std::isfinite(*c.weight) && *c.weight > 0 && *c.weight <= 1e6)) {
    return bad("weight must be a number above 0 (at most 1e6)");
  }
  if (c.max_queued && *c.max_queued < -1) return bad("max_queued must be a number of jobs, or -1 for no cap");
  if (c.budget && !(std::isfinite(*c.budget) && *c.budget <= 1e12)) {
    return bad("budget must be an amount (at most 1e12), or none");
  }
  return Status::OK();
}

Status Daemon::SetTeam(const Actor& by, const std::string& name, const TeamChange& c) {
  FT_RETURN_IF_ERROR(CheckTeamChange(name, c));
  Held lock(this);
  TeamPolicy policy = team_policies_.count(name) ? team_policies_[name] : TeamPolicy{};
  TeamLimits limits = team_limits_.count(name) ? team_limits_[name] : TeamLimits{};
  if (c.quota_devices) policy.quota_devices = *c.quota_devices;
  if (c.weight) policy.weight = *c.weight;
  if (c.max_queued) limits.max_queued = *c.max_queued;
  if (c.budget) limits.budget = *c.budget < 0 ? std::nullopt : c.budget;
  FT_RETURN_IF_ERROR(store_->SetTeam(TeamRow{.name = name,
                                             .quota_devices = policy.quota_devices,
                                             .weight = policy.weight,
                                             .max_queued = limits.max_queued,
                                             .budget = limits.budget,
                                             .updated_ms = clock_->WallMs()}));
  team_policies_[name] = policy;
  team_limits_[name] = limits;
  ++queue_version_;  // the next pass reads the new policy
  Event("", "", "team_set",
        "team " + name + ": " + QuotaText(policy.quota_devices) + " devices, weight " +
            FormatWeight(policy.weight) + ", " +
            (limits.max_queued < 0 ? "no queue cap"
                                   : "at most " + std::to_string(limits.max_queued) + " queued") +
            ", " + (limits.budget ? "a budget of " + FormatWeight(*limits.budget) : "no budget") + by.By(),
        0);
  ReleaseAndPublish(lock);
  return Status::OK();
}

StatusOr<std::vector<TeamInfo>> Daemon::ListTeams() {
  Held lock(this);
  const std::map<std::string, int64_t> running = AccrueTeamUsage();
  std::map<std::string, TeamInfo> teams;
  const auto team = [&](const std::string& name) -> TeamInfo& {
    TeamInfo& t = teams[name];
    t.name = name;
    return t;
  };
  for (const auto& [name, p] : team_policies_) {
    TeamInfo& t = team(name);
    t.quota_devices = p.quota_devices;
    t.weight = p.weight;
  }
  for (const auto& [name, u] : team_usage_) team(name).usage_device_seconds = u.device_seconds;
  for (const auto& [name, limits] : team_limits_) {
    team(name).budget = limits.budget;
    team(name).max_queued = limits.max_queued;
  }
  for (const auto& [name, spent] : SpendByTeam()) team(name).spend = spent;
  for (const auto& [name, devices] : running) team(name).running_devices = devices;
  for (const auto& [job_id, meta] : running_meta_)
    if (meta.borrowed) team(TeamOf(job_id)).borrowed_devices += meta.devices();
  for (const JobView* job : queued_) team(job->team).queued_jobs += 1;
  // The shares as a scheduling pass computes them (daemon/fair_share.h).
  const FairShareInput input{.policies = team_policies_, .usage = team_usage_};
  FairShare fair(input, options_.fair_share_half_life_ms);
  for (const auto& [name, t] : teams)
    if (t.running_devices > 0 || t.queued_jobs > 0) fair.HasWork(fair.Index(name));
  std::vector<TeamInfo> out;
  for (auto& [name, t] : teams) {
    t.fair_share = fair.Share(fair.Index(name));
    out.push_back(std::move(t));
  }
  return out;
}

std::map<std::string, int64_t> Daemon::AccrueTeamUsage() {
  const int64_t now = clock_->MonotonicMs();
  const int64_t elapsed = usage_mono_ == 0 ? 0 : std::max<int64_t>(0, now - usage_mono_);
  usage_mono_ = now;
  std::map<std::string, int64_t> running;
  for (const auto& [job_id, meta] : running_meta_) running[TeamOf(job_id)] += meta.devices();
  AccrueUsage(&team_usage_, running, elapsed, options_.fair_share_half_life_ms);
  return running;
}

std::string Daemon::TeamOf(const std::string& job_id) const {
  auto view = plan_inputs_.find(job_id);
  return view != plan_inputs_.end() ? view->second.team : "";
}

Daemon::RunningMeta Daemon::RunningMeta::Of(const AttemptRow& a, bool borrowed) {
  RunningMeta meta{.borrowed = borrowed,
                   .started_wall_ms = a.started_ms,
                   .preempted_for = a.preempted_for,
                   .price = a.price};
  for (const RankSlot& r : a.ranks) meta.devices_on[r.worker_id] += 1;
  if (a.ranks.empty()) meta.devices_on[a.worker_id] = 1;  // a one-rank attempt keeps no ranks
  return meta;
}

int64_t Daemon::RunningMeta::devices() const {
  int64_t n = 0;
  for (const auto& [worker, devices] : devices_on) n += devices;
  return n;
}

Status Daemon::RebuildTeamUsage() {
  const int64_t now = clock_->WallMs(), half_life = options_.fair_share_half_life_ms;
  // Older spans have decayed below a millionth (none is older without decay).
  const int64_t since = half_life > 0 ? now - 20 * half_life : 0;
  FT_ASSIGN_OR_RETURN(const std::vector<Store::UsageSpan> spans, store_->UsageSpans(since));
  team_usage_.clear();
  usage_mono_ = 0;  // the running ones accrue from the next pass on, at the devices they hold
  for (const Store::UsageSpan& s : spans) {
    team_usage_[s.team].device_seconds +=
        SpanUsage(s.started_ms, s.ended_ms == 0 ? now : s.ended_ms, s.devices, now, half_life);
  }
  return Status::OK();
}

FairShareInput Daemon::TeamsForPass() {
  AccrueTeamUsage();
  return FairShareInput{.policies = team_policies_, .usage = team_usage_};
}

std::optional<RunningView> Daemon::RunningViewOf(const std::string& worker_id, const Session& s) const {
  if (s.running_job.empty()) return std::nullopt;
  auto meta = running_meta_.find(s.running_job);
  auto view = plan_inputs_.find(s.running_job);
  if (meta == running_meta_.end() || view == plan_inputs_.end()) return std::nullopt;  // never preempted
  auto on = meta->second.devices_on.find(worker_id);
  return RunningView{.job_id = s.running_job,
                     .team = view->second.team,
                     .priority = view->second.priority,
                     .devices = on != meta->second.devices_on.end() ? on->second : 1,
                     .borrowed = meta->second.borrowed,
                     .started_ms = meta->second.started_wall_ms,
                     .last_checkpoint_ms = meta->second.last_checkpoint_wall_ms,
                     .preempted_for = meta->second.preempted_for};
}

bool Daemon::StoppedForAnotherJob(const std::string& job_id) const {
  auto meta = running_meta_.find(job_id);
  return meta != running_meta_.end() && !meta->second.preempted_for.empty();
}

void Daemon::Preempt(const Preemption& p) {
  auto meta = running_meta_.find(p.victim_job_id);
  if (meta == running_meta_.end() || !meta->second.preempted_for.empty()) return;
  // Kept with the attempt: its preemption is the scheduler's, also for an ftd that restarts meanwhile.
  if (auto epoch = running_epoch_.find(p.victim_job_id); epoch != running_epoch_.end()) {
    Check(store_->MarkPreemptedFor(p.victim_job_id, epoch->second, p.for_job_id), "mark a preempted attempt");
  }
  meta->second.preempted_for = p.for_job_id;
  const std::string why =
      p.why == Preemption::Why::kPriority
          ? "job " + p.for_job_id + " of a higher priority class needs its devices"
          : "team " + TeamOf(p.for_job_id) + " reclaims the devices it lent (job " + p.for_job_id + ")";
  for (const std::string& worker : p.worker_ids) {
    auto s = sessions_.find(worker);
    if (s == sessions_.end() || !s->second.sink || s->second.running_job != p.victim_job_id) continue;
    SendStop(s->second, CheckpointStopMs(s->second) + options_.checkpoint_margin_ms, "preempted: " + why);
    s->second.stop_sent = true;
  }
  Event(p.victim_job_id, p.worker_ids.empty() ? "" : p.worker_ids.front(), "preempting",
        "checkpoint and stop: " + why, 0);
}

}  // namespace ft
