// The daemon's construction, client API (submit, cancel, queries), job state
// tracking, attempt ends and the tick. Worker sessions: daemon_sessions.cc;
// gangs: daemon_gangs.cc; placement: daemon_placement.cc; events and
// subscriptions: daemon_events.cc.
#include "daemon/daemon.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "common/ids.h"
#include "common/logging.h"
#include "daemon/daemon_internal.h"
#include "engine/job/checkpoint_state.h"
#include "engine/job/completion.h"
#include "engine/job/hf_config.h"
#include "engine/job/job_hash.h"
#include "engine/job/job_spec.h"

namespace ft {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

namespace {

pb::JobState ToProtoState(JobStateCode s) { return static_cast<pb::JobState>(static_cast<int>(s)); }

pb::AttemptOutcome ToProtoOutcome(AttemptOutcomeCode o) {
  return static_cast<pb::AttemptOutcome>(static_cast<int>(o));
}

// "; the best checkpoint (step 10, eval_loss 1.25) stays beside it" when `resumed` (the state of
// the checkpoint at `step` a job resumes from) records a best evaluation at another step
// (checkpoint.keep_best: the trainer's retention keeps it; resuming from the newest never drops it).
std::string BestCheckpointNote(const TrainerState& resumed, int64_t step) {
  const EvalProgress& e = resumed.evaluation;
  if (e.best_step <= 0 || e.best_step == step) return "";
  char value[32];
  std::snprintf(value, sizeof(value), "%.6g", e.best_value);
  return "; the best checkpoint (step " + std::to_string(e.best_step) + ", " + e.metric + " " + value +
         ") stays beside it";
}

// OK when every path of `spec` lies under one of `roots` (none = anywhere);
// else InvalidArgument naming the file, the field and the roots. Symlinks and
// ".." are resolved first, so neither can leave a root.
Status CheckPathRoots(const JobSpec& spec, const std::vector<std::string>& roots, const std::string& file) {
  if (roots.empty()) return Status::OK();
  auto under = [&](const std::string& path) {
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(path, ec);
    if (ec || p.empty()) return false;  // cannot tell where it leads: refuse
    for (const std::string& root : roots) {
      const fs::path r = fs::weakly_canonical(root, ec);
      if (ec || r.empty() || !r.is_absolute()) continue;  // ftd checks its roots at startup
      if (PathIsBeneath(p.string(), r.string())) return true;
    }
    return false;
  };
  auto fields = JobInputPaths(spec);
  fields.emplace_back("output.dir", spec.output.dir);
  for (const auto& [field, path] : fields) {
    if (path.empty() || under(path)) continue;
    std::string list;
    for (const std::string& r : roots) list += (list.empty() ? "" : ", ") + r;
    return Status::InvalidArgument(file + ": " + field + ": '" + path +
                                   "' is outside the directories this ftd allows (" + list +
                                   "); move it under one of them or ask the operator to add --allowed-root");
  }
  return Status::OK();
}

// OK when the job's files can be what they claim: output.dir a directory (or
// absent) that neither lies in nor holds ftd's data dir; the data files and
// the chat template existing regular files. Else InvalidArgument naming the
// file, the key and the fix, so the job is refused at submit instead of
// failing (or being retried) once it runs.
Status CheckJobFiles(const JobSpec& spec, const std::string& data_dir, const std::string& file) {
  std::error_code ec;
  const std::string& out = spec.output.dir;
  if (out.empty())
    return Status::InvalidArgument(file + ": output.dir: is empty; name a directory for the outputs");
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) {
    return Status::InvalidArgument(file + ": output.dir: '" + out +
                                   "' exists and is not a directory; name a directory (new or existing)");
  }
  const std::string o = fs::weakly_canonical(out, ec).string(),
                    d = fs::weakly_canonical(data_dir, ec).string();
  if (!data_dir.empty() && !d.empty() && (PathIsBeneath(o, d) || PathIsBeneath(d, o))) {
    return Status::InvalidArgument(file + ": output.dir: '" + out + "' overlaps ftd's data dir " + data_dir +
                                   "; put the outputs elsewhere");
  }
  for (const auto& [key, path] : JobInputPaths(spec)) {  // the data files and templates: regular files
    if (path.empty() || key == "model.path" || key == "adapter.init") continue;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) {
      return Status::InvalidArgument(file + ": " + key + ": '" + path + "' does not exist; fix the path");
    }
    if (!fs::is_regular_file(st)) {
      return Status::InvalidArgument(file + ": " + key + ": '" + path +
                                     "' is not a regular file (a directory, FIFO or device); name a file");
    }
  }
  return Status::OK();
}

// A refusal because the database cannot be written (disk full, read-only, or
// one of its files deleted or replaced under ftd: `files_replaced`):
// Unavailable, naming the cause, what was not done and the fix.
Status NotWritable(const Status& cause, const std::string& what, bool files_replaced) {
  const std::string fix = files_replaced
                              ? "; ftd reopens its database within seconds and accepts work again (submit "
                                "again then); nothing it acknowledged was lost"
                              : "; free space in ftd's --data-dir (or make it writable again): ftd notices "
                                "within seconds and accepts work again; nothing it acknowledged was lost";
  return Status::Unavailable("ftd cannot write its database, so " + what + ": " +
                             std::string(cause.message()) + fix);
}

}  // namespace

namespace daemon_internal {

// How a worker's exit report ends an attempt (RANK_LOST only where the gang's other ranks say nothing).
AttemptOutcomeCode ToOutcomeCode(pb::AttemptOutcome o) {
  static const std::map<pb::AttemptOutcome, AttemptOutcomeCode> kCodes = {
      {pb::ATTEMPT_FINISHED, AttemptOutcomeCode::kFinished},
      {pb::ATTEMPT_PREEMPTED, AttemptOutcomeCode::kPreempted},
      {pb::ATTEMPT_SUPERSEDED, AttemptOutcomeCode::kSuperseded},
      {pb::ATTEMPT_ENVIRONMENT, AttemptOutcomeCode::kEnvironment},
      {pb::ATTEMPT_BAD_INPUT, AttemptOutcomeCode::kBadInput},
      {pb::ATTEMPT_RANK_LOST, AttemptOutcomeCode::kPreempted},
  };
  auto it = kCodes.find(o);
  return it == kCodes.end() ? AttemptOutcomeCode::kFailed : it->second;
}

// A stored job's spec, parsed as at submit (relative paths against its spec_dir).
StatusOr<JobSpec> StoredSpec(const JobRow& job) {
  return ParseJobSpec(job.spec_yaml,
                      (fs::path(job.spec_dir.empty() ? "." : job.spec_dir) / "job.yaml").string());
}

// What the scheduler needs to place a job.
JobView MakeJobView(const JobRow& job, const JobSpec& spec, const ModelConfig& model) {
  JobView view;
  view.id = job.id;
  view.priority = job.priority;
  view.created_ms = job.created_ms;
  view.team = job.team;
  view.gpus = spec.resources.gpus;
  view.min_gpus = spec.resources.min_gpus;
  view.batch_units = BatchSplitUnits(spec);
  view.device = spec.resources.device;
  view.plan = PlanRequestFromJob(spec, model, DeviceKind::kCpu, spec.resources.gpus);
  view.fixed_micro_batch = FixedMicroBatch(spec, spec.resources.gpus);
  view.not_before_ms = job.not_before_ms;
  view.min_bytes_cpu = MinBytesPerDevice(view, DeviceKind::kCpu);
  view.min_bytes_cuda = MinBytesPerDevice(view, DeviceKind::kCuda);
  return view;
}

}  // namespace daemon_internal

using daemon_internal::kCancelStopMs;
using daemon_internal::MakeJobView;
using daemon_internal::StoredSpec;
using daemon_internal::ToProtoEvent;

const std::array<DaemonErrorInfo, static_cast<size_t>(DaemonError::kCount)>& DaemonErrorTable() {
  static const std::array<DaemonErrorInfo, static_cast<size_t>(DaemonError::kCount)> kTable = {{
      {DaemonError::kLogWrite, "log_write", "a worker's log lines could not be appended to logs/<job>.log"},
      {DaemonError::kPlanInput, "plan_input", "a running job's spec or model did not load after a restart"},
  }};
  return kTable;
}

Daemon::Daemon(std::unique_ptr<Store> store, const Clock* clock, DaemonOptions options)
    : store_(std::move(store)), clock_(clock), options_(std::move(options)) {
  Held lock(this);
  startup_ = LoadState();
  if (startup_.ok() && !options_.data_dir.empty())
    fs::create_directories(fs::path(options_.data_dir) / "logs");
}

Status Daemon::LoadState() {
  // checkpoint.every auto's M and the pools' goodput.
  FT_ASSIGN_OR_RETURN(history_, store_->EndedAttemptTotals(Store::AttemptGroup::kPool));
  FT_ASSIGN_OR_RETURN(worker_totals_, store_->EndedAttemptTotals(Store::AttemptGroup::kWorker));
  FT_ASSIGN_OR_RETURN(ended_spend_, store_->EndedSpendByTeam());
  // Attempts that were running when ftd stopped: their workers get one lease to reconnect.
  FT_ASSIGN_OR_RETURN(std::vector<AttemptRow> running, store_->RunningAttempts());
  for (const AttemptRow& a : running) {
    for (const std::string& worker : a.Workers()) {
      Session& s = sessions_[worker];
      s.alive = true;
      Heard(s);
      s.running_job = a.job_id;
      s.running_epoch = a.epoch;
    }
    TrackGang(a);
    int64_t& current = running_epoch_[a.job_id];
    current = std::max(current, a.epoch);  // a crash may have left an older one marked running
    running_meta_[a.job_id] = RunningMeta::Of(a, /*borrowed=*/false);  // not kept: counted nominal
    // Its planning input (slot-end checkpoint estimates, predicted memory). Without it the
    // attempt still runs; what needs the input falls back (10 s estimate) or says why.
    auto job = store_->GetJob(a.job_id);
    const Status planned = job.ok() ? EnsurePlanInput(*job) : job.status();
    if (!planned.ok()) {
      Count(DaemonError::kPlanInput);
      FT_LOG(ERROR)
          << "job " << a.job_id << " (epoch " << a.epoch
          << ") runs, but its planning input does not load: " << planned.ToString()
          << "; its slot-end stop uses a 10 s checkpoint estimate and its predicted memory is unknown";
    }
  }
  FT_ASSIGN_OR_RETURN(std::vector<TeamRow> teams, store_->ListTeams());
  team_policies_.clear();
  team_limits_.clear();
  for (const TeamRow& t : teams) {
    team_policies_[t.name] = {.quota_devices = t.quota_devices, .weight = t.weight};
    team_limits_[t.name] = {.max_queued = t.max_queued, .budget = t.budget};
  }
  FT_RETURN_IF_ERROR(RebuildTeamUsage());
  FT_ASSIGN_OR_RETURN(std::vector<JobRow> queued, store_->ListJobs({JobStateCode::kQueued}, 0));
  for (const JobRow& j : queued) TrackState(j);
  // One job per output.dir: every job's, whatever its state.
  FT_ASSIGN_OR_RETURN(auto dirs, store_->ListOutputDirs());
  output_dirs_.Clear();
  for (const auto& [id, dir] : dirs) output_dirs_.Add(OutputDirKey(dir), id);
  return Status::OK();
}

void Daemon::ReloadFromStore() {
  queued_.clear();
  waiting_.clear();
  ++queue_version_;
  running_epoch_.clear();
  gangs_.clear();
  for (auto& [id, s] : sessions_) {
    s.running_job.clear();
    s.running_epoch = 0;
    s.stop_sent = false;
  }
  if (Status s = LoadState(); !s.ok()) {
    FT_LOG(ERROR) << "store: reload after recovery: " << s.ToString();
    return;
  }
  pb::DaemonCommand cmd;
  cmd.mutable_reregister()->set_reason("ftd's database is writable again; register to reconcile");
  for (auto& [id, s] : sessions_) {
    if (s.sink != nullptr) s.sink->Send(cmd);
  }
}

void Daemon::Unqueue(const std::string& job_id) {
  auto view = plan_inputs_.find(job_id);
  if (view == plan_inputs_.end()) return;
  queued_.erase(&view->second);
  waiting_.erase(&view->second);
  ++queue_version_;
}

void Daemon::TrackState(const JobRow& job) {
  if (job.state != JobStateCode::kQueued) {
    Unqueue(job.id);
    if (job.state != JobStateCode::kRunning) interrupted_mono_.erase(job.id);
    if (job.state != JobStateCode::kRunning) plan_inputs_.erase(job.id);
    return;
  }
  Status s = EnsurePlanInput(job);
  if (!s.ok()) {
    // Its spec or model no longer loads (e.g. after a restart): it can never be placed.
    FailUnrunnable(job, "cannot plan: " + s.message());
    return;
  }
  JobView& view = plan_inputs_[job.id];
  queued_.erase(&view);  // (re)inserted at its place in the queue order
  view.priority = job.priority;
  view.created_ms = job.created_ms;
  view.not_before_ms = job.not_before_ms;
  queued_.insert(&view);
  ++queue_version_;
}

void Daemon::FailUnrunnable(const JobRow& job, const std::string& reason) {
  JobRow failed = job;
  failed.state = JobStateCode::kFailed;
  failed.reason = reason;
  failed.updated_ms = clock_->WallMs();
  Check(store_->UpdateJob(failed), "fail unrunnable job");
  Event(job.id, "", "failed", failed.reason, 0);
  TrackState(failed);
  PublishJob(job.id);
}

void Daemon::Check(const Status& s, const char* what) {
  if (s.ok()) return;
  // A sticky-failed store fails every heartbeat's write with the same IOError: log it once.
  if (s.IsIOError() && s.message() == last_store_error_) return;
  last_store_error_ = std::string(s.message());
  FT_LOG(ERROR) << "store: " << what << ": " << s.ToString();
}

StatusOr<std::string> Daemon::LogPath(const std::string& job_id) const {
  FT_RETURN_IF_ERROR(CheckJobId(job_id, "job_id"));
  return (fs::path(options_.data_dir) / "logs" / (job_id + ".log")).string();
}

// ------------------------------------------------------------------ client API

StatusOr<pb::SubmitReply> Daemon::Submit(const pb::SubmitRequest& req, const Actor& by) {
  const std::string file = (fs::path(req.spec_dir().empty() ? "." : req.spec_dir()) / "job.yaml").string();
  FT_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(req.spec_yaml(), file));
  FT_RETURN_IF_ERROR(CheckPathRoots(spec, options_.allowed_roots, file));
  FT_RETURN_IF_ERROR(CheckJobFiles(spec, options_.data_dir, file));
  FT_ASSIGN_OR_RETURN(ModelConfig model, ReadHfConfig(spec.model.path));  // bounded: no FIFO, no /dev/zero
  if (spec.resources.device == DeviceRequest::kCuda) {
    FT_RETURN_IF_ERROR(CheckCudaTakesModel(spec, model, "cuda"));
  }
  FT_RETURN_IF_ERROR(CheckJobTakesModel(spec, model));
  if (spec.train.max_steps <= 0) {
    return Status::InvalidArgument(file +
                                   ": train.max_steps: ftd needs max_steps (epochs are not planned yet)");
  }
  JobRow row;
  row.name = spec.name;
  row.priority = spec.resources.priority;
  row.spec_yaml = req.spec_yaml();
  row.spec_dir = req.spec_dir();
  row.client_request_id = req.client_request_id();
  row.created_ms = row.updated_ms = clock_->WallMs();
  row.total_steps = spec.train.max_steps;
  row.max_failures = spec.resources.max_failures;
  row.output_dir = spec.output.dir;
  row.gpus = spec.resources.gpus;
  row.device = EnumName(spec.resources.device);
  row.submitted_by = by.user;
  row.team = by.team;
  PendingSubmit me{row, MakeJobView(row, spec, model), file, OutputDirKey(spec.output.dir)};
  std::unique_lock<std::mutex> lock(submit_mu_);
  submit_queue_.push_back(&me);
  submit_cv_.wait(lock, [&] { return me.done || submit_queue_.front() == &me; });
  if (!me.done) {
    // First in line: commit everyone queued behind, in one transaction.
    std::vector<PendingSubmit*> batch(submit_queue_.begin(), submit_queue_.end());
    lock.unlock();
    CommitSubmits(batch);
    lock.lock();
    for (size_t i = 0; i < batch.size(); ++i) submit_queue_.pop_front();
    for (PendingSubmit* p : batch) p->done = true;
    submit_cv_.notify_all();
  }
  if (!me.status.ok()) return me.status;
  return me.reply;
}

Status Daemon::OutputDirTaken(const PendingSubmit& p, const std::string& other_dir, const std::string& id,
                              const std::string& name) {
  const std::string how = p.output_key == other_dir ? "is also the output.dir"
                          : PathIsBeneath(p.output_key, other_dir)
                              ? "lies inside " + other_dir + ", the output.dir"
                              : "contains " + other_dir + ", the output.dir";
  return Status::InvalidArgument(
      p.file + ": output.dir: '" + p.row.output_dir + "' " + how + " of job " + id +
      (name.empty() ? "" : " ('" + name + "')") +
      ": two jobs in one directory overwrite each other's checkpoints and outputs; "
      "choose another output.dir for this job");
}

std::vector<Daemon::PendingSubmit*> Daemon::AdmitOutputDirs(
    const std::vector<PendingSubmit*>& batch, std::map<PendingSubmit*, PendingSubmit*>* siblings) {
  std::vector<PendingSubmit*> admitted;
  OutputDirs in_batch;  // the admitted ones' dirs → their index in `admitted`
  auto same_request = [](const std::string& a, const std::string& b) { return !a.empty() && a == b; };
  for (PendingSubmit* p : batch) {
    OutputDirs::Overlap o;
    if (output_dirs_.FindOverlap(p->output_key, &o)) {
      auto other = store_->GetJob(o.owner);
      // The same job again (its client_request_id): the store answers with the job it has.
      if (!other.ok() || !same_request(other->client_request_id, p->row.client_request_id)) {
        p->status = OutputDirTaken(*p, o.dir, o.owner, other.ok() ? other->name : "");
        continue;
      }
    } else if (in_batch.FindOverlap(p->output_key, &o)) {
      PendingSubmit* sibling = admitted[std::stoul(o.owner)];
      if (!same_request(sibling->row.client_request_id, p->row.client_request_id)) {
        (*siblings)[p] = sibling;  // refused once the sibling has its id
        continue;
      }
    }
    in_batch.Add(p->output_key, std::to_string(admitted.size()));
    admitted.push_back(p);
  }
  return admitted;
}

void Daemon::CommitSubmits(const std::vector<PendingSubmit*>& batch) {
  {
    Held lock(this);
    std::map<PendingSubmit*, PendingSubmit*> siblings;
    // A store that refuses writes refuses them all, saying why (before any other reason).
    const std::vector<PendingSubmit*> admitted =
        store_->sticky_error().ok() ? AdmitOutputDirs(AdmitTeamLimits(batch), &siblings) : batch;
    std::vector<JobRow> rows;
    for (PendingSubmit* p : admitted) rows.push_back(p->row);
    std::vector<bool> duplicate;
    StatusOr<std::vector<JobRow>> created = std::vector<JobRow>();
    if (!rows.empty()) created = store_->CreateJobs(std::move(rows), &duplicate);
    for (size_t i = 0; i < admitted.size(); ++i) {
      PendingSubmit& p = *admitted[i];
      if (!created.ok()) {
        p.status = created.status().IsIOError()
                       ? NotWritable(created.status(), "the job was not submitted", store_->files_replaced())
                       : created.status();
        continue;
      }
      const JobRow& job = (*created)[i];
      if (!duplicate[i]) {
        output_dirs_.Add(p.output_key, job.id);
        p.view.id = job.id;
        p.view.placement_class = placement_classes_.Of(p.view);
        plan_inputs_[job.id] = p.view;
        TrackState(job);
        PublishStoredEvents(job.id);  // "queued", written with the job
        PublishJob(job.id);
      }
      auto proto = ToProto(job);
      if (!proto.ok()) {
        p.status = proto.status();
        continue;
      }
      *p.reply.mutable_job() = std::move(*proto);
      p.reply.set_duplicate(duplicate[i]);
    }
    for (auto& [refused, sibling] : siblings) {
      refused->status = sibling->status.ok() ? OutputDirTaken(*refused, sibling->output_key,
                                                              sibling->reply.job().id(), sibling->row.name)
                                             : sibling->status;
    }
    ReleaseAndPublish(lock);
  }
}

StatusOr<pb::Job> Daemon::ToProto(const JobRow& j) {
  pb::Job out;
  out.set_id(j.id);
  out.set_name(j.name);
  out.set_state(ToProtoState(j.state));
  out.set_reason(j.reason);
  if (auto view = plan_inputs_.find(j.id); j.state == JobStateCode::kQueued && view != plan_inputs_.end()) {
    if (auto waiting = waiting_.find(&view->second); waiting != waiting_.end()) {
      out.set_reason(FormatWaitReason(waiting->second));
    }
  }
  out.set_priority(j.priority);
  out.set_spec_yaml(j.spec_yaml);
  out.set_created_ms(j.created_ms);
  out.set_updated_ms(j.updated_ms);
  out.set_steps_done(j.steps_done);
  out.set_total_steps(j.total_steps);
  out.set_last_loss(j.last_loss);
  out.set_tokens_per_s(j.tokens_per_s);
  out.set_preemptions(j.preemptions);
  out.set_failures(j.failures);
  out.set_output_dir(j.output_dir);
  out.set_submitted_by(j.submitted_by);
  out.set_team(j.team);
  auto ckpt = store_->LatestCheckpoint(j.id);
  if (ckpt.ok()) out.set_committed_step(ckpt->step);
  FT_ASSIGN_OR_RETURN(auto attempts, store_->ListAttempts(j.id));
  for (const AttemptRow& a : attempts) {
    pb::Attempt* p = out.add_attempts();
    p->set_number(a.number);
    p->set_epoch(a.epoch);
    p->set_worker_id(a.worker_id);
    p->set_outcome(ToProtoOutcome(a.outcome));
    p->set_reason(a.reason);
    p->set_started_ms(a.started_ms);
    p->set_ended_ms(a.ended_ms);
    p->set_start_step(a.start_step);
    p->set_end_step(a.end_step);
    p->set_steps_lost(a.steps_lost);
    p->set_price(a.price);
    for (size_t r = 0; r < a.ranks.size(); ++r) {
      pb::AttemptRank* rank = p->add_ranks();
      rank->set_rank(static_cast<int32_t>(r));
      rank->set_worker_id(a.ranks[r].worker_id);
      rank->set_device_index(a.ranks[r].device);
    }
    out.mutable_plan()->set_micro_batch(a.micro_batch);
    out.mutable_plan()->set_accumulation(a.accumulation);
    out.mutable_plan()->set_world(a.world);
    if (a.outcome == AttemptOutcomeCode::kRunning) out.set_worker_id(a.worker_id);
  }
  return out;
}

StatusOr<JobGoodput> Daemon::GoodputOf(const JobRow& job) {
  FT_ASSIGN_OR_RETURN(auto attempts, store_->ListAttempts(job.id));
  FT_ASSIGN_OR_RETURN(auto metrics, store_->ListMetrics(job.id, 0, 0));
  FT_ASSIGN_OR_RETURN(auto checkpoints, store_->ListCheckpointRows(job.id));
  return ComputeGoodput(job, attempts, metrics, checkpoints, clock_->WallMs());
}

namespace {
void SetSplit(const GoodputSplit& s, pb::GoodputSplit* out) {
  out->set_productive_s(s.productive_s);
  out->set_checkpoint_s(s.checkpoint_s);
  out->set_restart_s(s.restart_s);
  out->set_lost_s(s.lost_s);
}
void SetCost(const CostSplit& c, pb::CostSplit* out) {
  out->set_productive(c.productive);
  out->set_checkpoint(c.checkpoint);
  out->set_restart(c.restart);
  out->set_lost(c.lost);
  out->set_total(c.total());
}
}  // namespace

Status Daemon::AddGoodput(const JobRow& job, pb::Job* out) {
  FT_ASSIGN_OR_RETURN(const JobGoodput g, GoodputOf(job));
  pb::Goodput* p = out->mutable_goodput();
  SetSplit(g.device, p->mutable_device());
  SetCost(g.cost, p->mutable_cost());
  p->set_goodput(g.goodput());
  p->set_queue_s(g.queue_s);
  p->set_notices(g.notices);
  p->set_notices_caught(g.notices_caught);
  p->set_scheduler_preemptions(g.scheduler_preemptions);
  for (double r : g.recovery_s) p->add_recovery_s(r);
  for (int64_t a : g.recovery_after) p->add_recovery_after(a);
  for (int i = 0; i < out->attempts_size() && i < static_cast<int>(g.attempts.size()); ++i) {
    pb::Attempt* a = out->mutable_attempts(i);
    SetSplit(g.attempts[static_cast<size_t>(i)], a->mutable_goodput());
    SetCost(CostSplit::Priced(g.attempts[static_cast<size_t>(i)], a->price()), a->mutable_cost());
  }
  return Status::OK();
}

StatusOr<pb::Job> Daemon::GetJob(const std::string& id) {
  JobRow j;
  pb::Job out;
  {
    Held lock(this);
    FT_ASSIGN_OR_RETURN(j, store_->GetJob(id));
    FT_ASSIGN_OR_RETURN(out, ToProto(j));
  }
  // Goodput reads only the store (its own lock): a long step history never holds the daemon's.
  FT_RETURN_IF_ERROR(AddGoodput(j, &out));
  FT_ASSIGN_OR_RETURN(const auto objective, store_->LatestObjectiveMetrics(id));
  out.mutable_objective_metrics()->insert(objective.begin(), objective.end());
  return out;
}

StatusOr<pb::ListJobsReply> Daemon::ListJobs(const pb::ListJobsRequest& req, const TeamScope& team) {
  std::vector<JobStateCode> states;
  for (int s : req.states()) states.push_back(static_cast<JobStateCode>(s));
  std::vector<JobRow> jobs;
  pb::ListJobsReply reply;
  {
    Held lock(this);
    FT_ASSIGN_OR_RETURN(jobs, store_->ListJobs(states, req.limit(), team));
    for (const JobRow& j : jobs) {
      FT_ASSIGN_OR_RETURN(*reply.add_jobs(), ToProto(j));
    }
  }
  if (!req.with_goodput()) return reply;
  for (size_t i = 0; i < jobs.size(); ++i) {  // outside the daemon's lock, as in GetJob
    FT_RETURN_IF_ERROR(AddGoodput(jobs[i], reply.mutable_jobs(static_cast<int>(i))));
  }
  return reply;
}

StatusOr<std::vector<pb::Job>> Daemon::ListJobsNewest(const std::vector<JobStateCode>& states,
                                                      const std::string& contains, int64_t limit,
                                                      const TeamScope& team) {
  Held lock(this);
  FT_ASSIGN_OR_RETURN(auto jobs, store_->ListJobsNewest(states, contains, limit, 0, team));
  std::vector<pb::Job> out;
  out.reserve(jobs.size());
  for (const JobRow& j : jobs) {
    FT_ASSIGN_OR_RETURN(out.emplace_back(), ToProto(j));
  }
  return out;
}

StatusOr<pb::Job> Daemon::Cancel(const std::string& id, const Actor& by) {
  pb::Job out;
  {
    Held lock(this);
    FT_ASSIGN_OR_RETURN(JobRow j, store_->GetJob(id));
    if (j.state == JobStateCode::kSucceeded || j.state == JobStateCode::kFailed ||
        j.state == JobStateCode::kCancelled) {
      return Status::FailedPrecondition("job " + id + " has already ended");
    }
    if (j.state == JobStateCode::kRunning) {
      for (auto& [wid, s] : sessions_) {
        if (s.running_job != id || !s.sink) continue;
        SendStop(s, kCancelStopMs, "cancelled");
      }
    }
    j.state = JobStateCode::kCancelled;
    j.reason = by.user.empty() ? "cancelled by the user" : "cancelled by " + by.user;
    j.updated_ms = clock_->WallMs();
    FT_RETURN_IF_ERROR(store_->UpdateJob(j));
    TrackState(j);
    Event(id, "", "cancelled", j.reason, j.steps_done);
    PublishJob(id);
    FT_ASSIGN_OR_RETURN(out, ToProto(j));
    ReleaseAndPublish(lock);
  }
  return out;
}

std::map<std::string, int64_t> Daemon::live_pools() {
  Held lock(this);
  std::map<std::string, int64_t> out;
  for (const auto& [id, s] : sessions_)
    if (s.alive) ++out[s.pool];
  return out;
}

StatusOr<pb::ListWorkersReply> Daemon::ListWorkers() {
  Held lock(this);
  FT_ASSIGN_OR_RETURN(auto workers, store_->ListWorkers());
  pb::ListWorkersReply reply;
  for (const WorkerRow& w : workers) {
    pb::WorkerInfo* info = reply.add_workers();
    info->set_id(w.id);
    info->set_pool(w.pool);
    info->set_price(PriceIn(w.pool, w.price));
    if (auto t = worker_totals_.find(w.id); t != worker_totals_.end()) {
      SetSplit(t->second.device, info->mutable_goodput());
    }
    info->set_hostname(w.hostname);
    info->set_version(w.version);
    info->set_last_heartbeat_ms(w.last_seen_ms);
    info->set_slot_end_ms(w.slot_end_ms);
    auto it = sessions_.find(w.id);
    info->set_alive(it != sessions_.end() && it->second.alive);
    if (it != sessions_.end()) {
      info->set_running_job_id(it->second.running_job);
      info->set_host_total_bytes(it->second.host_total_bytes);
      info->set_host_free_bytes(it->second.host_free_bytes);
    }
    // A live worker's devices as it last reported them (memory in use now), else as registered.
    const bool live = it != sessions_.end() && it->second.alive && !it->second.devices.empty();
    for (const DeviceRow& d : live ? it->second.devices : w.devices) {
      pb::Device* p = info->add_devices();
      p->set_index(d.index);
      p->set_kind(d.kind);
      p->set_name(d.name);
      p->set_total_bytes(d.total_bytes);
      p->set_free_bytes(d.free_bytes);
      p->set_used_bytes(d.used_bytes);
    }
  }
  return reply;
}

StatusOr<pb::ListEventsReply> Daemon::ListEvents(const pb::ListEventsRequest& req, const TeamScope& team) {
  FT_ASSIGN_OR_RETURN(auto events, store_->ListEvents(req.job_id(), req.after_seq(), req.limit(), team));
  pb::ListEventsReply reply;
  for (const EventRow& e : events) *reply.add_events() = ToProtoEvent(e);
  return reply;
}

// ------------------------------------------------------------------ attempt ends

void Daemon::EndLostAttempt(const std::string& job_id, int64_t epoch, const std::string& reason,
                            int64_t step) {
  auto job = store_->GetJob(job_id);
  if (!job.ok())
    return EndRunning(job_id, epoch, AttemptOutcomeCode::kPreempted, reason, step, /*lost=*/true);
  auto spec = StoredSpec(*job);
  if (!spec.ok())
    return EndRunning(job_id, epoch, AttemptOutcomeCode::kPreempted, reason, step, /*lost=*/true);
  // The data's content is in the hash (read once per file version: about 0.2 s per 200 MB, see
  // JobMathKeys); the outputs' sizes, not checksums: this runs under the daemon's lock, and the
  // trainer checks SHA-256s.
  const std::string hash = JobHash(*spec);
  if (auto done = VerifyCompletion(spec->output.dir, hash, /*checksums=*/false); done.ok()) {
    Event(job_id, "", "reconciled",
          reason + "; " + spec->output.dir + "/COMPLETE.json shows the run finished (epoch " +
              std::to_string(done->epoch) + ", " + std::to_string(done->steps) + " steps)",
          done->steps);
    // A run that early stopping ended says so, as its worker's report would have.
    return EndRunning(job_id, epoch, AttemptOutcomeCode::kFinished,
                      done->stop_reason.empty() ? "finished (reconciled from output.dir)"
                                                : done->stop_reason + " (reconciled from output.dir)",
                      done->steps);
  }
  AdoptCheckpointAhead(job_id, spec->output.dir, hash, reason);
  EndRunning(job_id, epoch, AttemptOutcomeCode::kPreempted, reason, step, /*lost=*/true);
}

void Daemon::AdoptCheckpointAhead(const std::string& job_id, const std::string& output_dir,
                                  const std::string& hash, const std::string& reason) {
  auto committed = store_->LatestCheckpoint(job_id);
  const int64_t committed_step = committed.ok() ? committed->step : 0;
  for (const CheckpointEntry& c : ListCheckpoints((fs::path(output_dir) / "checkpoints").string())) {
    if (c.step <= committed_step) break;
    auto state = ReadCheckpointState(c.dir);
    auto sha = Sha256File((fs::path(c.dir) / "MANIFEST.json").string());
    if (!state.ok() || !sha.ok() || state->job_hash != hash) continue;
    Check(store_->AddCheckpoint(
              {job_id, state->epoch, c.step, c.dir, *sha, state->last_checkpoint_seconds, clock_->WallMs()}),
          "reconciled checkpoint");
    Event(job_id, "", "reconciled",
          reason + "; resume point moved to step " + std::to_string(c.step) + " (" + c.dir +
              ", found in output.dir)" + BestCheckpointNote(*state, c.step),
          c.step);
    return;
  }
}

void Daemon::AdoptCheckpointsBeforeReplayedExit(const pb::AttemptExited& e) {
  if (e.outcome() == pb::ATTEMPT_FINISHED) return;  // the job ends: it needs no resume point
  auto job = store_->GetJob(e.job_id());
  if (!job.ok()) return;
  auto spec = StoredSpec(*job);
  if (!spec.ok()) return;
  AdoptCheckpointAhead(
      e.job_id(), spec->output.dir, JobHash(*spec),
      "exit of epoch " + std::to_string(e.epoch()) + " replayed before its checkpoint reports");
}

int64_t Daemon::StoreAttemptEnd(const std::string& job_id, int64_t epoch, AttemptOutcomeCode outcome,
                                const std::string& reason, int64_t committed, bool lost, int64_t* exit_step) {
  auto attempts = store_->ListAttempts(job_id);
  const AttemptRow* running = nullptr;
  if (attempts.ok()) {
    for (const AttemptRow& a : *attempts)
      if (a.epoch == epoch && a.outcome == AttemptOutcomeCode::kRunning) running = &a;
  }
  // This attempt's step rows: its last progress report may lag the steps the worker forwarded.
  auto rows = store_->ListMetrics(job_id, running != nullptr ? running->start_step : committed, 0);
  if (rows.ok()) {
    for (const MetricRow& r : *rows)
      if (r.epoch == epoch && !r.eval_only) *exit_step = std::max(*exit_step, r.step);
  }
  const int64_t steps_lost = std::max<int64_t>(0, *exit_step - committed);
  int64_t notice_ms = 0;
  if (auto n = notices_.find(job_id); n != notices_.end()) {
    notice_ms = n->second;
    notices_.erase(n);
  }
  const int64_t now = clock_->WallMs();
  AttemptRow ended = running != nullptr ? *running : AttemptRow{};
  ended.outcome = outcome;
  ended.ended_ms = now;
  ended.end_step = *exit_step;
  ended.steps_lost = outcome == AttemptOutcomeCode::kFinished ? 0 : steps_lost;
  ended.lost = lost;
  ended.notice_ms = notice_ms;
  // Its goodput split, final now (its steps and the checkpoints committed by its end are known).
  auto checkpoints = store_->ListCheckpointRows(job_id);
  std::optional<GoodputSplit> split;
  if (running != nullptr && rows.ok() && checkpoints.ok())
    split = AttemptGoodput(ended, *rows, *checkpoints, now);
  // A lost attempt was alive until its worker's last message: M counts it until then, not until ftd knew.
  int64_t seen = now;
  if (auto s = sessions_.find(ended.worker_id);
      lost && s != sessions_.end() && s->second.last_message_mono > 0) {
    seen =
        std::max(ended.started_ms, now - std::max<int64_t>(0, MonotonicMs() - s->second.last_message_mono));
  }
  const Status stored = store_->EndAttempt(job_id, epoch, outcome, reason, ended.end_step, ended.steps_lost,
                                           now, lost, notice_ms, split ? &*split : nullptr, seen);
  Check(stored, "end attempt");
  if (running == nullptr || !stored.ok()) return steps_lost;
  // Its pool's history (checkpoint.every auto's M, the pool's goodput), its worker's totals (as
  // the store would sum them) and /metrics' counters.
  Store::AttemptTotals totals{
      .seconds = static_cast<double>(std::max<int64_t>(0, seen - ended.started_ms)) / 1000.0,
      // A stop the scheduler asked for is no preemption of the pool's (checkpoint.every auto's M).
      .preemptions = outcome == AttemptOutcomeCode::kPreempted && !StoppedForAnotherJob(job_id) ? 1 : 0,
      .attempts = 1,
      .device = split.value_or(GoodputSplit{}),
      .cost = CostSplit::Priced(split.value_or(GoodputSplit{}), ended.price)};
  history_[ended.pool].Add(totals);
  if (ended.price > 0) {  // its team's spend, as Store::EndedSpendByTeam sums it
    auto job = store_->GetJob(job_id);
    if (job.ok()) ended_spend_[job->team] += ended.DeviceSeconds(now) * ended.price / 3600.0;
  }
  worker_totals_[ended.worker_id].Add(totals);
  goodput_total_.Add(totals.device);
  return steps_lost;
}

void Daemon::EndRunning(const std::string& job_id, int64_t epoch, AttemptOutcomeCode outcome,
                        const std::string& reason, int64_t exit_step, bool lost) {
  auto j = store_->GetJob(job_id);
  if (!j.ok()) return;
  // A cancelled job's attempt stopped because the user asked: no preemption (M, goodput).
  if (j->state == JobStateCode::kCancelled && outcome == AttemptOutcomeCode::kPreempted) {
    outcome = AttemptOutcomeCode::kCancelled;
  }
  auto ckpt = store_->LatestCheckpoint(job_id);
  const int64_t committed = ckpt.ok() ? ckpt->step : 0;
  const int64_t steps_lost = StoreAttemptEnd(job_id, epoch, outcome, reason, committed, lost, &exit_step);
  auto current = running_epoch_.find(job_id);
  if (current == running_epoch_.end() || current->second != epoch) {
    // A superseded attempt (e.g. one left marked running by a crash between
    // its start and the job's update): end its row, leave the job alone.
    return;
  }
  running_epoch_.erase(current);
  running_meta_.erase(job_id);
  AccrueTeamUsage();  // its team's usage counts it until now, and no further
  ReleaseGang(job_id, epoch, reason);
  const int64_t now = clock_->WallMs();
  j->updated_ms = now;
  if (j->state == JobStateCode::kCancelled) {
    Event(job_id, "", "stopped", "cancelled attempt stopped at step " + std::to_string(exit_step), exit_step);
  } else if (outcome == AttemptOutcomeCode::kFinished) {
    j->state = JobStateCode::kSucceeded;
    j->reason = reason;  // "" unless the run ended early (train.early_stopping): ftctl status says why
    j->steps_done = exit_step;
    Event(job_id, "", "succeeded",
          "finished " + std::to_string(exit_step) + " steps" + (reason.empty() ? "" : "; " + reason),
          exit_step);
  } else if (outcome == AttemptOutcomeCode::kPreempted) {
    j->state = JobStateCode::kQueued;
    j->preemptions += 1;
    j->reason = "preempted: " + reason + "; resumes from step " + std::to_string(committed);
    j->not_before_ms = now + options_.requeue_backoff_ms;
    interrupted_mono_[job_id] = clock_->MonotonicMs();
    Event(job_id, "", "preempted",
          reason + " (resumes from step " + std::to_string(committed) + ", " + std::to_string(steps_lost) +
              " steps lost)",
          exit_step);
  } else if (outcome == AttemptOutcomeCode::kSuperseded) {
    // Its directory has a newer owner (an epoch ftd no longer knows of): run again, counting nothing.
    j->state = JobStateCode::kQueued;
    j->reason = "superseded: " + reason;
    j->not_before_ms = now + options_.requeue_backoff_ms;
    Event(job_id, "", "superseded", reason, exit_step);
  } else if (outcome == AttemptOutcomeCode::kEnvironment) {
    // Not the job's fault: retried with a growing backoff, never counted against max_failures.
    int64_t in_a_row = 0;
    if (auto attempts = store_->ListAttempts(job_id); attempts.ok()) {
      for (auto a = attempts->rbegin(); a != attempts->rend(); ++a) {
        if (a->outcome != AttemptOutcomeCode::kEnvironment) break;
        ++in_a_row;
      }
    }
    j->state = JobStateCode::kQueued;
    j->reason = "environment error (" + reason + "); retrying";
    j->not_before_ms =
        now + std::min<int64_t>(options_.requeue_backoff_ms << std::min<int64_t>(in_a_row, 8), 300'000);
    Event(job_id, "", "attempt_environment", reason, exit_step);
  } else if (outcome == AttemptOutcomeCode::kBadInput) {
    // Deterministic: another attempt would fail the same way, so the first one decides.
    j->failures += 1;
    j->state = JobStateCode::kFailed;
    j->reason = "bad input: " + reason;
    Event(job_id, "", "failed", j->reason, exit_step);
  } else {
    j->failures += 1;
    if (j->failures > j->max_failures) {
      j->state = JobStateCode::kFailed;
      j->reason = "failed " + std::to_string(j->failures) + " times; last: " + reason;
      Event(job_id, "", "failed", j->reason, exit_step);
    } else {
      j->state = JobStateCode::kQueued;
      j->reason = "attempt failed (" + reason + "); retrying";
      j->not_before_ms =
          now + options_.requeue_backoff_ms * (int64_t{1} << std::min<int64_t>(j->failures, 6));
      Event(job_id, "", "attempt_failed", reason, exit_step);
    }
  }
  Check(store_->UpdateJob(*j), "update job");
  TrackState(*j);
  PublishJob(job_id);
}

// ------------------------------------------------------------------ the tick

void Daemon::Tick() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t start_mono =
      clock_->MonotonicMs();  // before the lock: a wait for it is a stall of its holder
  {
    Held lock(this);
    CreditTickLateness(start_mono);
    if (RetryStore()) {
      FlushSeen();
      ExpireLeases();
      ExpireGangs();
      StopForSlotEnds();
      CheckStalls();
      ScheduleQueued();
    }
    ReleaseAndPublish(lock);
  }
  last_tick_end_mono_ = clock_->MonotonicMs();
  tick_latency_.Record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void Daemon::CreditTickLateness(int64_t start_mono) {
  const int64_t previous = last_tick_start_mono_.exchange(start_mono);
  if (options_.tick_ms <= 0 || previous == 0) return;
  // Due a period after the previous tick started, or when it ended if it ran longer (its own
  // hold of the lock is credited by Held, not again here).
  const int64_t late = start_mono - std::max(previous + options_.tick_ms, last_tick_end_mono_.load());
  if (late <= options_.stall_credit_after_ms) return;
  stall_credit_ms_ += late;
  FT_LOG(WARN) << "ftd stalled: its tick ran " << late
               << " ms late (the process was descheduled, stopped or swapping); every worker's lease is "
                  "extended by as much";
}

void Daemon::FlushSeen() {
  std::vector<std::pair<std::string, int64_t>> seen;
  for (auto& [id, s] : sessions_) {
    if (s.sink) AbsorbQuiet(s, false);  // the quiet heartbeats' times too
    if (s.seen_wall_ms == 0) continue;
    seen.emplace_back(id, s.seen_wall_ms);
    s.seen_wall_ms = 0;
  }
  Check(store_->TouchWorkers(seen), "workers alive");
}

Status Daemon::Ready() {
  (void)store_->CheckFiles();  // a deleted or replaced -wal or -shm makes the store sticky-failed
  return store_->sticky_error();
}

bool Daemon::RetryStore() {
  (void)store_->CheckFiles();  // each tick: what a deleted -wal holds is saved within a tick
  const Status sticky = store_->sticky_error();
  if (sticky.ok()) return true;
  if (store_retry_mono_ == 0) Check(sticky, "refusing writes");  // once, before the first retry
  const int64_t now = clock_->MonotonicMs();
  if (store_retry_mono_ != 0 && now - store_retry_mono_ < options_.store_retry_ms) return false;
  store_retry_mono_ = now;
  const Status recovered = store_->Recover();
  if (!recovered.ok()) {
    Check(recovered, "still not writable");
    return false;
  }
  FT_LOG(WARN) << "store: writable again; reloading state and asking workers to register again";
  last_store_error_.clear();
  store_retry_mono_ = 0;
  ReloadFromStore();
  Event("", "", "store_recovered", "ftd's database is writable again", 0);
  return true;
}

}  // namespace ft
