#include "daemon/daemon.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/untrusted_text.h"
#include "engine/io/hf_model.h"
#include "engine/train/checkpoint.h"
#include "engine/train/completion.h"
#include "engine/train/job_spec.h"
#include "engine/train/trainer.h"

namespace ft {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

namespace {

// A cancelled trainer has 10 s to checkpoint and stop; its worker SIGKILLs its process group when
// it still runs 5 s (ft-worker's kill grace) after that, so it is gone within 15 s and the worker is
// free (worker/attempt.h), even when it is stuck outside its step loop.
constexpr int64_t kCancelStopMs = 10'000;

pb::JobState ToProtoState(JobStateCode s) { return static_cast<pb::JobState>(static_cast<int>(s)); }
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

pb::AttemptOutcome ToProtoOutcome(AttemptOutcomeCode o) {
  return static_cast<pb::AttemptOutcome>(static_cast<int>(o));
}

// A stored job's spec, parsed as at submit (relative paths against its spec_dir).
StatusOr<JobSpec> StoredSpec(const JobRow& job) {
  return ParseJobSpec(job.spec_yaml,
                      (fs::path(job.spec_dir.empty() ? "." : job.spec_dir) / "job.yaml").string());
}

// The job's YAML with every path absolute and the batch plan fixed, for the worker.
std::string ResolvedSpec(const JobSpec& spec, const std::string& yaml, const BatchPlanChoice& plan) {
  YAML::Node root = YAML::Load(yaml);
  root["model"]["path"] = spec.model.path;
  root["data"]["train"] = spec.data.train;
  if (!spec.data.eval.empty()) root["data"]["eval"] = spec.data.eval;
  if (!spec.adapter.init.empty()) root["adapter"]["init"] = spec.adapter.init;
  if (!spec.data.chat_template.empty()) root["data"]["chat_template"] = spec.data.chat_template;
  root["output"]["dir"] = spec.output.dir;
  root["train"]["micro_batch_size"] = plan.micro_batch;
  root["train"]["gradient_accumulation"] = plan.accumulation;
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
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
  const std::pair<const char*, std::string> files[] = {{"data.train", spec.data.train},
                                                       {"data.eval", spec.data.eval},
                                                       {"data.chat_template", spec.data.chat_template}};
  for (const auto& [key, path] : files) {
    if (path.empty()) continue;
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

DeviceRow ToDeviceRow(const pb::Device& d) {
  return {d.index(), d.kind(), d.name(), d.total_bytes(), d.free_bytes(), d.used_bytes()};
}

pb::Event ToProtoEvent(const EventRow& e) {
  pb::Event p;
  p.set_seq(e.seq);
  p.set_time_ms(e.time_ms);
  p.set_job_id(e.job_id);
  p.set_worker_id(e.worker_id);
  p.set_kind(e.kind);
  p.set_message(e.message);
  p.set_step(e.step);
  return p;
}

// A refusal because the database cannot be written (disk full, read-only):
// Unavailable, naming the cause, what was not done and the fix.
Status NotWritable(const Status& cause, const std::string& what) {
  return Status::Unavailable("ftd cannot write its database, so " + what + ": " +
                             std::string(cause.message()) +
                             "; free space in ftd's --data-dir (or make it writable again): ftd notices "
                             "within seconds and accepts work again; nothing it acknowledged was lost");
}

// What the scheduler needs to place a job.
JobView MakeJobView(const JobRow& job, const JobSpec& spec, const ModelConfig& model) {
  JobView view;
  view.id = job.id;
  view.priority = job.priority;
  view.created_ms = job.created_ms;
  view.gpus = spec.resources.gpus;
  view.device = spec.resources.device;
  view.plan = PlanRequestFromJob(spec, model, "cpu", spec.resources.gpus);
  view.fixed_micro_batch = FixedMicroBatch(spec, spec.resources.gpus);
  view.not_before_ms = job.not_before_ms;
  view.min_bytes_cpu = MinBytesPerDevice(view, "cpu");
  view.min_bytes_cuda = MinBytesPerDevice(view, "cuda");
  return view;
}

}  // namespace

Daemon::Daemon(std::unique_ptr<Store> store, const Clock* clock, DaemonOptions options)
    : store_(std::move(store)), clock_(clock), options_(std::move(options)) {
  std::lock_guard<std::mutex> lock(mu_);
  startup_ = LoadState();
  if (startup_.ok() && !options_.data_dir.empty())
    fs::create_directories(fs::path(options_.data_dir) / "logs");
}

Status Daemon::LoadState() {
  // Attempts that were running when ftd stopped: their workers get one lease to reconnect.
  FT_ASSIGN_OR_RETURN(std::vector<AttemptRow> running, store_->RunningAttempts());
  for (const AttemptRow& a : running) {
    for (const std::string& worker : a.Workers()) {
      Session& s = sessions_[worker];
      s.alive = true;
      s.last_message_mono = clock_->MonotonicMs();
      s.running_job = a.job_id;
      s.running_epoch = a.epoch;
    }
    TrackGang(a);
    int64_t& current = running_epoch_[a.job_id];
    current = std::max(current, a.epoch);  // a crash may have left an older one marked running
    // Its planning input (slot-end checkpoint estimates, predicted memory).
    if (auto job = store_->GetJob(a.job_id); job.ok()) (void)EnsurePlanInput(*job);
  }
  FT_ASSIGN_OR_RETURN(std::vector<JobRow> queued, store_->ListJobs({JobStateCode::kQueued}, 0));
  for (const JobRow& j : queued) TrackState(j);
  return Status::OK();
}

void Daemon::ReloadFromStore() {
  queued_.clear();
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

void Daemon::TrackState(const JobRow& job) {
  if (job.state != JobStateCode::kQueued) {
    queued_.erase(job.id);
    waiting_.erase(job.id);
    if (job.state != JobStateCode::kRunning) interrupted_mono_.erase(job.id);
    if (job.state != JobStateCode::kRunning) plan_inputs_.erase(job.id);
    return;
  }
  Status s = EnsurePlanInput(job);
  if (!s.ok()) {
    // Its spec or model no longer loads (e.g. after a restart): it can never be placed.
    JobRow failed = job;
    failed.state = JobStateCode::kFailed;
    failed.reason = "cannot plan: " + s.message();
    Check(store_->UpdateJob(failed), "fail unplannable job");
    Event(job.id, "", "failed", failed.reason, 0);
    queued_.erase(job.id);
    return;
  }
  plan_inputs_[job.id].not_before_ms = job.not_before_ms;
  queued_.insert(job.id);
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

StatusOr<pb::SubmitReply> Daemon::Submit(const pb::SubmitRequest& req) {
  const std::string file = (fs::path(req.spec_dir().empty() ? "." : req.spec_dir()) / "job.yaml").string();
  FT_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(req.spec_yaml(), file));
  FT_RETURN_IF_ERROR(CheckPathRoots(spec, options_.allowed_roots, file));
  FT_RETURN_IF_ERROR(CheckJobFiles(spec, options_.data_dir, file));
  FT_ASSIGN_OR_RETURN(ModelConfig model, ReadHfConfig(spec.model.path));  // bounded: no FIFO, no /dev/zero
  if (spec.resources.device == "cuda") FT_RETURN_IF_ERROR(CheckCudaTakesModel(spec, model, "cuda"));
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
  row.device = spec.resources.device;
  PendingSubmit me{row, MakeJobView(row, spec, model)};
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

void Daemon::CommitSubmits(const std::vector<PendingSubmit*>& batch) {
  std::vector<JobRow> rows;
  for (PendingSubmit* p : batch) rows.push_back(p->row);
  {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<bool> duplicate;
    auto created = store_->CreateJobs(std::move(rows), &duplicate);
    for (size_t i = 0; i < batch.size(); ++i) {
      PendingSubmit& p = *batch[i];
      if (!created.ok()) {
        p.status = created.status().IsIOError() ? NotWritable(created.status(), "the job was not submitted")
                                                : created.status();
        continue;
      }
      const JobRow& job = (*created)[i];
      if (!duplicate[i]) {
        p.view.id = job.id;
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
    ReleaseAndPublish(lock);
  }
}

StatusOr<pb::Job> Daemon::ToProto(const JobRow& j) {
  pb::Job out;
  out.set_id(j.id);
  out.set_name(j.name);
  out.set_state(ToProtoState(j.state));
  auto waiting = waiting_.find(j.id);
  out.set_reason(j.state == JobStateCode::kQueued && waiting != waiting_.end() ? waiting->second : j.reason);
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

StatusOr<pb::Job> Daemon::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(JobRow j, store_->GetJob(id));
  return ToProto(j);
}

StatusOr<pb::ListJobsReply> Daemon::ListJobs(const pb::ListJobsRequest& req) {
  std::vector<JobStateCode> states;
  for (int s : req.states()) states.push_back(static_cast<JobStateCode>(s));
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(auto jobs, store_->ListJobs(states, req.limit()));
  pb::ListJobsReply reply;
  for (const JobRow& j : jobs) {
    FT_ASSIGN_OR_RETURN(*reply.add_jobs(), ToProto(j));
  }
  return reply;
}

StatusOr<std::vector<pb::Job>> Daemon::ListJobsNewest(const std::vector<JobStateCode>& states,
                                                      const std::string& contains, int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(auto jobs, store_->ListJobsNewest(states, contains, limit));
  std::vector<pb::Job> out;
  out.reserve(jobs.size());
  for (const JobRow& j : jobs) {
    FT_ASSIGN_OR_RETURN(out.emplace_back(), ToProto(j));
  }
  return out;
}

StatusOr<pb::Job> Daemon::Cancel(const std::string& id) {
  pb::Job out;
  {
    std::unique_lock<std::mutex> lock(mu_);
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
    j.reason = "cancelled by the user";
    j.updated_ms = clock_->WallMs();
    FT_RETURN_IF_ERROR(store_->UpdateJob(j));
    TrackState(j);
    Event(id, "", "cancelled", "cancelled by the user", j.steps_done);
    PublishJob(id);
    FT_ASSIGN_OR_RETURN(out, ToProto(j));
    ReleaseAndPublish(lock);
  }
  return out;
}

StatusOr<pb::ListWorkersReply> Daemon::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(auto workers, store_->ListWorkers());
  pb::ListWorkersReply reply;
  for (const WorkerRow& w : workers) {
    pb::WorkerInfo* info = reply.add_workers();
    info->set_id(w.id);
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

StatusOr<pb::ListEventsReply> Daemon::ListEvents(const pb::ListEventsRequest& req) {
  FT_ASSIGN_OR_RETURN(auto events, store_->ListEvents(req.job_id(), req.after_seq(), req.limit()));
  pb::ListEventsReply reply;
  for (const EventRow& e : events) *reply.add_events() = ToProtoEvent(e);
  return reply;
}

// ------------------------------------------------------------------ subscriptions

void Daemon::ReleaseAndPublish(std::unique_lock<std::mutex>& lock) {
  std::vector<pb::JobUpdate> updates;
  updates.swap(pending_updates_);
  // Taken before mu_ is released: updates made under mu_ by two threads reach
  // subscribers in the order they were made (event seqs never go backwards).
  std::lock_guard<std::mutex> publishing(publish_mu_);
  lock.unlock();
  for (const auto& u : updates) Publish(u.job_id(), u);
}

int64_t Daemon::Subscribe(const std::string& job_id, std::function<void(const pb::JobUpdate&)> fn) {
  std::lock_guard<std::mutex> lock(subs_mu_);
  const int64_t id = next_subscriber_++;
  subscribers_[id] = {job_id, std::move(fn)};
  return id;
}

void Daemon::Unsubscribe(int64_t id) {
  std::lock_guard<std::mutex> lock(subs_mu_);
  subscribers_.erase(id);
}

bool Daemon::HasSubscribers() {
  std::lock_guard<std::mutex> lock(subs_mu_);
  return !subscribers_.empty();
}

void Daemon::Publish(const std::string& job_id, const pb::JobUpdate& update) {
  std::lock_guard<std::mutex> lock(subs_mu_);
  for (auto& [id, s] : subscribers_) {
    if (s.job_id.empty() || s.job_id == job_id) s.fn(update);
  }
}

void Daemon::PublishJob(const std::string& job_id) {
  if (!HasSubscribers()) return;  // nobody watches: skip building the summary
  auto j = store_->GetJob(job_id);
  if (!j.ok()) return;
  auto p = ToProto(*j);
  if (!p.ok()) return;
  pb::JobUpdate u;
  u.set_job_id(job_id);
  *u.mutable_job() = *p;
  pending_updates_.push_back(u);
}

void Daemon::Event(const std::string& job_id, const std::string& worker_id, const std::string& kind,
                   const std::string& message, int64_t step) {
  EventRow e{0, clock_->WallMs(), job_id, worker_id, kind, message, step};
  auto seq = store_->AddEvent(e);
  Check(seq.status(), "add event");
  FT_LOG(INFO) << "event " << kind << (job_id.empty() ? "" : " job " + job_id)
               << (worker_id.empty() ? "" : " worker " + worker_id) << ": " << message;
  e.seq = seq.ok() ? *seq : 0;
  pb::JobUpdate u;
  u.set_job_id(job_id);
  *u.mutable_event() = ToProtoEvent(e);
  pending_updates_.push_back(u);
}

void Daemon::PublishStoredEvents(const std::string& job_id) {
  if (!HasSubscribers()) return;
  auto events = store_->ListEvents(job_id, 0, 0);
  if (!events.ok()) return;
  for (const EventRow& e : *events) {
    pb::JobUpdate u;
    u.set_job_id(job_id);
    *u.mutable_event() = ToProtoEvent(e);
    pending_updates_.push_back(u);
  }
}

// ------------------------------------------------------------------ worker sessions

void Daemon::SendStop(Session& s, int64_t deadline_ms, const std::string& reason) {
  pb::DaemonCommand cmd;
  pb::CheckpointNow* c = cmd.mutable_checkpoint_now();
  c->set_job_id(s.running_job);
  c->set_epoch(s.running_epoch);
  c->set_deadline_ms(deadline_ms);
  c->set_stop(true);
  c->set_reason(reason);
  s.sink->Send(cmd);
}

void Daemon::Refuse(WorkerSink* sink, const std::string& job_id, int64_t epoch, const std::string& why) {
  if (!sink) return;
  pb::DaemonCommand cmd;
  cmd.mutable_refused()->set_job_id(job_id);
  cmd.mutable_refused()->set_epoch(epoch);
  cmd.mutable_refused()->set_reason(why);
  sink->Send(cmd);
}

bool Daemon::IsCurrent(const std::string& job_id, int64_t epoch) {
  auto it = running_epoch_.find(job_id);
  return it != running_epoch_.end() && it->second == epoch;
}

Status Daemon::OnRegister(const pb::Register& reg, WorkerSink* sink) {
  if (reg.worker_id().empty()) return Status::InvalidArgument("register: worker_id is empty");
  {
    std::unique_lock<std::mutex> lock(mu_);
    const std::string implausible =
        ImplausibleMemory(reg.worker_id(), reg.devices(), reg.host_total_bytes(), reg.host_free_bytes());
    if (!implausible.empty()) {
      Event("", reg.worker_id(), "worker_refused", "registration refused: " + implausible, 0);
      ReleaseAndPublish(lock);
      return Status::InvalidArgument(
          "register: " + implausible +
          "; fix what the worker reports (ft-worker --cpu-memory, the device driver)");
    }
    Session& s = sessions_[reg.worker_id()];
    WorkerSink* const previous = s.sink;  // another session still holding this id, if any
    const bool was_alive = s.alive;
    s.sink = sink;
    s.alive = true;
    s.draining = false;
    s.stop_sent = false;
    s.last_message_mono = clock_->MonotonicMs();
    s.slot_end_ms = reg.slot_end_ms();
    s.host_total_bytes = reg.host_total_bytes();
    s.host_free_bytes = reg.host_free_bytes();
    s.address = reg.address().empty() ? reg.hostname() : reg.address();
    s.rendezvous_port_first = reg.rendezvous_port_first();
    s.rendezvous_port_count = reg.rendezvous_port_count();
    WorkerRow row;
    row.id = reg.worker_id();
    row.hostname = reg.hostname();
    row.version = reg.version();
    row.last_seen_ms = clock_->WallMs();
    row.slot_end_ms = reg.slot_end_ms();
    row.alive = true;
    for (const pb::Device& d : reg.devices()) row.devices.push_back(ToDeviceRow(d));
    s.devices = row.devices;
    if (Status upserted = store_->UpsertWorker(row); !upserted.ok()) {
      // E.g. two devices with one index: the worker must fix what it reports.
      s.sink = nullptr;
      s.alive = was_alive;
      return upserted;
    }
    if (previous != nullptr && previous != sink) {
      // The newer session takes over (a restarted worker may reconnect before
      // its old stream is seen dead); the older one is told why it ends.
      const std::string why = "worker id '" + EscapeControlChars(reg.worker_id(), 128) +
                              "' was registered by a newer session (hostname '" +
                              EscapeControlChars(reg.hostname(), 128) +
                              "'), which replaces this one; if two ft-worker processes share this --id, give "
                              "each its own";
      previous->Evict(why);
      Event("", reg.worker_id(), "worker_replaced", why, 0);
    }
    if (!was_alive)
      Event("", reg.worker_id(), "worker_joined", "worker " + reg.worker_id() + " registered", 0);
    // Exits the worker journaled before it restarted: how those attempts really ended.
    for (const pb::AttemptExited& e : reg.exited()) {
      if (!IsCurrent(e.job_id(), e.epoch())) continue;  // already known (or superseded)
      Event(e.job_id(), reg.worker_id(), "replayed",
            "exit of epoch " + std::to_string(e.epoch()) + " replayed from the worker's journal", e.step());
      OnExited(reg.worker_id(), s, e);
    }
    // Reattach what the worker still runs (each rank of a gang here); refuse what was superseded.
    std::set<std::string> reported;
    std::set<std::pair<std::string, int>> reported_ranks;
    for (const pb::RunningAttempt& a : reg.running()) {
      if (IsCurrent(a.job_id(), a.epoch())) {
        s.running_job = a.job_id();
        s.running_epoch = a.epoch();
        reported_ranks.insert({a.job_id(), a.rank()});
        if (!reported.insert(a.job_id()).second) continue;  // another rank of a gang already reattached
        Event(a.job_id(), reg.worker_id(), "reattached",
              "attempt epoch " + std::to_string(a.epoch()) + " reattached after reconnect", a.step());
        // A cancel (or slot-end stop) sent while the worker was away never reached it.
        auto job = store_->GetJob(a.job_id());
        if (job.ok() && job->state == JobStateCode::kCancelled) {
          SendStop(s, kCancelStopMs, "cancelled");
          s.stop_sent = true;
        }
      } else {
        Refuse(sink, a.job_id(), a.epoch(), "epoch " + std::to_string(a.epoch()) + " is superseded");
      }
    }
    // What the store thinks runs here but the worker no longer has is lost.
    auto running = store_->RunningAttempts();
    if (running.ok()) {
      for (const AttemptRow& a : *running) {
        auto gang = gangs_.find(a.job_id);
        const bool tracked = gang != gangs_.end() && gang->second.epoch == a.epoch;
        const size_t ranks = std::max<size_t>(1, a.ranks.size());
        for (size_t r = 0; r < ranks; ++r) {
          const std::string& worker = a.ranks.empty() ? a.worker_id : a.ranks[r].worker_id;
          if (worker != reg.worker_id() || reported_ranks.count({a.job_id, static_cast<int>(r)})) continue;
          if (tracked && gang->second.ended[r] >= 0) continue;  // its exit is known
          EndLostAttempt(a.job_id, a.epoch,
                         a.ranks.empty() ? "worker restarted without the attempt"
                                         : "worker restarted without rank " + std::to_string(r),
                         a.end_step);
          break;
        }
      }
    }
    if (s.running_job.empty() || !reported.count(s.running_job)) {
      s.running_job.clear();
      s.running_epoch = 0;
    }
    pb::DaemonCommand cmd;
    cmd.mutable_registered()->set_lease_ms(options_.lease_ms);
    cmd.mutable_registered()->set_heartbeat_ms(options_.heartbeat_ms);
    sink->Send(cmd);
    ReleaseAndPublish(lock);
  }
  return Status::OK();
}

void Daemon::OnDisconnect(const std::string& worker_id, WorkerSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(worker_id);
  if (it != sessions_.end() && it->second.sink == sink) it->second.sink = nullptr;
}

void Daemon::OnWorkerMessage(const std::string& worker_id, WorkerSink* sink, const pb::WorkerMessage& msg) {
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = sessions_.find(worker_id);
    if (it == sessions_.end() || it->second.sink != sink) return;  // a stale session
    Session& s = it->second;
    if (!s.alive) {
      // Its lease expired: everything it reports about earlier attempts is refused below.
      s.alive = true;
      Event("", worker_id, "worker_joined", "worker " + worker_id + " is back", 0);
    }
    s.last_message_mono = clock_->MonotonicMs();
    switch (msg.msg_case()) {
      case pb::WorkerMessage::kHeartbeat: OnHeartbeat(worker_id, s, msg.heartbeat()); break;
      case pb::WorkerMessage::kCheckpoint: OnCheckpoint(worker_id, s, msg.checkpoint()); break;
      case pb::WorkerMessage::kExited: OnExited(worker_id, s, msg.exited()); break;
      case pb::WorkerMessage::kMetrics: OnMetrics(sink, msg.metrics()); break;
      case pb::WorkerMessage::kLog: OnLog(sink, msg.log()); break;
      case pb::WorkerMessage::kNote: OnNote(worker_id, sink, msg.note()); break;
      default: break;
    }
    ReleaseAndPublish(lock);
  }
  message_latency_.Record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void Daemon::OnHeartbeat(const std::string& worker_id, Session& s, const pb::Heartbeat& hb) {
  const std::string implausible =
      ImplausibleMemory(worker_id, hb.devices(), hb.host_total_bytes(), hb.host_free_bytes());
  if (implausible != s.memory_problem && !implausible.empty()) {
    Event("", worker_id, "memory_refused", implausible + "; the report is ignored (the last good one stands)",
          0);
  }
  s.memory_problem = implausible;
  if (hb.devices_size() > 0 && implausible.empty()) {
    s.devices.clear();
    for (const pb::Device& d : hb.devices()) s.devices.push_back(ToDeviceRow(d));
  }
  if (hb.slot_end_ms() > 0) s.slot_end_ms = hb.slot_end_ms();
  if (hb.host_total_bytes() > 0 && implausible.empty()) {
    s.host_total_bytes = hb.host_total_bytes();
    s.host_free_bytes = hb.host_free_bytes();
  }
  Check(store_->TouchWorker(worker_id, clock_->WallMs()), "worker alive");
  RecordDeviceMemory(worker_id, s, hb);
  for (const pb::Progress& p : hb.progress()) {
    if (!IsCurrent(p.job_id(), p.epoch())) {
      Refuse(s.sink, p.job_id(), p.epoch(), "epoch " + std::to_string(p.epoch()) + " is superseded");
      continue;
    }
    Check(store_->RecordProgress({p.job_id(), p.epoch(), p.step(), p.total_steps(), p.loss(),
                                  p.tokens_per_s(), clock_->WallMs()}),
          "progress");
  }
}

void Daemon::RecordDeviceMemory(const std::string& worker_id, Session& s, const pb::Heartbeat& hb) {
  const int64_t now = clock_->MonotonicMs();
  if (hb.devices_size() == 0 || !s.memory_problem.empty() ||
      now - s.last_memory_sample_mono < options_.memory_sample_ms) {
    return;
  }
  s.last_memory_sample_mono = now;
  // OnHeartbeat has just taken them into s.devices.
  Check(store_->RecordDeviceMemory(worker_id, s.running_job, clock_->WallMs(), s.devices), "device memory");
}

std::string Daemon::ImplausibleMemory(const std::string& worker_id,
                                      const google::protobuf::RepeatedPtrField<pb::Device>& devices,
                                      int64_t host_total, int64_t host_free) {
  constexpr int64_t kPiB = int64_t{1} << 50;
  const std::string worker = "worker '" + EscapeControlChars(worker_id, 128) + "'";
  for (const pb::Device& d : devices) {
    const std::string device = worker + " device " + EscapeControlChars(d.kind(), 32) + ":" +
                               std::to_string(d.index()) + " reports ";
    if (d.total_bytes() < 0 || d.total_bytes() > kPiB) {
      return device + "total_bytes " + std::to_string(d.total_bytes()) + " (must be 0..1 PiB)";
    }
    if (d.free_bytes() < 0 || d.free_bytes() > d.total_bytes()) {
      return device + "free_bytes " + std::to_string(d.free_bytes()) + " (must be 0..total_bytes " +
             std::to_string(d.total_bytes()) + ")";
    }
    if (d.used_bytes() < 0 || d.used_bytes() > kPiB) {
      return device + "used_bytes " + std::to_string(d.used_bytes()) + " (must be 0..1 PiB)";
    }
  }
  if (host_total < 0 || host_total > kPiB || host_free < 0 || (host_total > 0 && host_free > host_total)) {
    return worker + " reports host memory free " + std::to_string(host_free) + " of total " +
           std::to_string(host_total) + " (must be 0 <= free <= total <= 1 PiB)";
  }
  return "";
}

StatusOr<int64_t> Daemon::PredictedBytes(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(JobRow job, store_->GetJob(job_id));
  FT_ASSIGN_OR_RETURN(auto attempts, store_->ListAttempts(job_id));
  if (attempts.empty() || attempts.back().micro_batch <= 0) return int64_t{0};
  FT_RETURN_IF_ERROR(EnsurePlanInput(job));
  PlanRequest plan = plan_inputs_[job_id].plan;
  auto session = sessions_.find(attempts.back().worker_id);
  if (session != sessions_.end() && !session->second.devices.empty()) {
    plan.device = session->second.devices.front().kind;
  }
  plan.world = std::max<int64_t>(1, attempts.back().world);
  return PredictMemory(plan, attempts.back().micro_batch).total();
}

void Daemon::OnCheckpoint(const std::string& worker_id, Session& s, const pb::CheckpointCommitted& c) {
  if (!IsCurrent(c.job_id(), c.epoch())) {
    Refuse(s.sink, c.job_id(), c.epoch(),
           "checkpoint from superseded epoch " + std::to_string(c.epoch()) + " refused");
    Event(
        c.job_id(), worker_id, "refused",
        "checkpoint step " + std::to_string(c.step()) + " from superseded epoch " + std::to_string(c.epoch()),
        c.step());
    return;
  }
  // The manifest on the shared filesystem must be the one the worker saw.
  auto sha = Sha256File((fs::path(c.dir()) / "MANIFEST.json").string());
  if (!sha.ok()) {
    // checkpoint.keep rotated it away before the report arrived: a newer one follows.
    FT_LOG(DEBUG) << "checkpoint " << c.dir() << " gone before its commit (retention)";
    return;
  }
  if (*sha != c.manifest_sha256()) {
    Event(c.job_id(), worker_id, "refused", "checkpoint " + c.dir() + " does not verify", c.step());
    return;
  }
  CheckpointRow row{c.job_id(),          c.epoch(),         c.step(),        c.dir(),
                    c.manifest_sha256(), c.write_seconds(), clock_->WallMs()};
  if (Status added = store_->AddCheckpoint(row); !added.ok()) {
    // Not committed, so not accepted either: the trainer's retention must keep
    // the resume point ftd has. The worker sends it again after reconnecting.
    Check(added, "add checkpoint");
    return;
  }
  s.checkpoint_seconds = c.write_seconds();
  checkpoint_seconds_.Record(c.write_seconds());
  Event(c.job_id(), worker_id, "checkpoint", "checkpoint committed at step " + std::to_string(c.step()),
        c.step());
  // The trainer's retention keeps what ftd committed.
  pb::DaemonCommand accepted;
  accepted.mutable_accepted()->set_job_id(c.job_id());
  accepted.mutable_accepted()->set_epoch(c.epoch());
  accepted.mutable_accepted()->set_step(c.step());
  accepted.mutable_accepted()->set_dir(c.dir());
  if (s.sink) s.sink->Send(accepted);
  PublishJob(c.job_id());
}

void Daemon::OnNote(const std::string& worker_id, WorkerSink* sink, const pb::AttemptNote& n) {
  if (!IsCurrent(n.job_id(), n.epoch())) {
    Refuse(sink, n.job_id(), n.epoch(), "note from superseded epoch");
    return;
  }
  Event(n.job_id(), worker_id, n.kind(), n.message(), n.step());
}

void Daemon::EndLostAttempt(const std::string& job_id, int64_t epoch, const std::string& reason,
                            int64_t step) {
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return EndRunning(job_id, epoch, AttemptOutcomeCode::kPreempted, reason, step);
  auto spec = StoredSpec(*job);
  if (!spec.ok()) return EndRunning(job_id, epoch, AttemptOutcomeCode::kPreempted, reason, step);
  // The data's content is in the hash (read once per file version: about 0.2 s per 200 MB, see
  // JobMathKeys); the outputs' sizes, not checksums: this runs under the daemon's lock, and the
  // trainer checks SHA-256s.
  const std::string hash = JobHash(*spec);
  if (auto done = VerifyCompletion(spec->output.dir, hash, /*checksums=*/false); done.ok()) {
    Event(job_id, "", "reconciled",
          reason + "; " + spec->output.dir + "/COMPLETE.json shows the run finished (epoch " +
              std::to_string(done->epoch) + ", " + std::to_string(done->steps) + " steps)",
          done->steps);
    return EndRunning(job_id, epoch, AttemptOutcomeCode::kFinished, "finished (reconciled from output.dir)",
                      done->steps);
  }
  auto committed = store_->LatestCheckpoint(job_id);
  const int64_t committed_step = committed.ok() ? committed->step : 0;
  for (const CheckpointEntry& c : ListCheckpoints((fs::path(spec->output.dir) / "checkpoints").string())) {
    if (c.step <= committed_step) break;
    auto state = ReadCheckpointState(c.dir);
    auto sha = Sha256File((fs::path(c.dir) / "MANIFEST.json").string());
    if (!state.ok() || !sha.ok() || state->job_hash != hash) continue;
    Check(store_->AddCheckpoint(
              {job_id, state->epoch, c.step, c.dir, *sha, state->last_checkpoint_seconds, clock_->WallMs()}),
          "reconciled checkpoint");
    Event(job_id, "", "reconciled",
          reason + "; resume point moved to step " + std::to_string(c.step) + " (" + c.dir +
              ", found in output.dir)",
          c.step);
    break;
  }
  EndRunning(job_id, epoch, AttemptOutcomeCode::kPreempted, reason, step);
}

void Daemon::OnExited(const std::string& worker_id, Session& s, const pb::AttemptExited& e) {
  if (!IsCurrent(e.job_id(), e.epoch())) {
    Event(e.job_id(), worker_id, "refused", "exit report of superseded epoch " + std::to_string(e.epoch()),
          e.step());
    return;
  }
  if (auto gang = gangs_.find(e.job_id()); gang != gangs_.end() && gang->second.epoch == e.epoch()) {
    return OnRankExited(worker_id, s, gang->second, e);
  }
  AttemptOutcomeCode outcome = ToOutcomeCode(e.outcome());
  EndRunning(e.job_id(), e.epoch(), outcome, e.reason(), e.step());
  if (s.running_job == e.job_id()) {
    s.running_job.clear();
    s.running_epoch = 0;
  }
}

void Daemon::OnRankExited(const std::string& worker_id, Session& s, Gang& g, const pb::AttemptExited& e) {
  const int rank = e.rank();
  if (rank < 0 || static_cast<size_t>(rank) >= g.workers.size() || g.workers[rank] != worker_id) {
    Event(e.job_id(), worker_id, "refused",
          "exit report of rank " + std::to_string(rank) + ", which does not run on " + worker_id, e.step());
    return;
  }
  if (g.ended[rank] >= 0) return;  // already known (a journal replay)
  g.ended[rank] = e.outcome();
  const std::string why = "rank " + std::to_string(rank) + " on " + worker_id + ": " +
                          (e.reason().empty() ? pb::AttemptOutcome_Name(e.outcome()) : e.reason());
  if (g.first_end_mono == 0) {
    g.first_end_mono = clock_->MonotonicMs();
    g.first_reason = why;
  }
  Event(e.job_id(), worker_id, "rank_exited", pb::AttemptOutcome_Name(e.outcome()) + ": " + why, e.step());
  bool still_here = false;
  for (size_t r = 0; r < g.workers.size(); ++r) still_here |= g.workers[r] == worker_id && g.ended[r] < 0;
  if (!still_here && s.running_job == e.job_id()) {
    s.running_job.clear();
    s.running_epoch = 0;
  }
  const std::string job_id = e.job_id();
  const int64_t epoch = e.epoch();
  switch (e.outcome()) {
    case pb::ATTEMPT_FAILED:
    case pb::ATTEMPT_SUPERSEDED:
    case pb::ATTEMPT_ENVIRONMENT:
    case pb::ATTEMPT_BAD_INPUT:
      // This rank's own failure decides the attempt; the others stop.
      return EndRunning(job_id, epoch, ToOutcomeCode(e.outcome()), why, e.step());
    case pb::ATTEMPT_FINISHED:
    case pb::ATTEMPT_PREEMPTED:
      // Rank 0 wrote the outputs or the checkpoint; the others' exits follow its word.
      if (rank == 0) return EndRunning(job_id, epoch, ToOutcomeCode(e.outcome()), e.reason(), e.step());
      break;
    default: break;
  }
  if (std::find(g.ended.begin(), g.ended.end(), -1) != g.ended.end()) return;  // wait for the others
  // Every rank ended without a decisive report.
  const bool all_lost_peers =
      std::all_of(g.ended.begin(), g.ended.end(), [](int o) { return o == pb::ATTEMPT_RANK_LOST; });
  if (all_lost_peers) {
    return EndRunning(job_id, epoch, AttemptOutcomeCode::kEnvironment,
                      "every rank lost the others (" + g.first_reason + ")", e.step());
  }
  EndLostAttempt(job_id, epoch, g.first_reason, e.step());
}

void Daemon::ExpireGangs() {
  const int64_t now = clock_->MonotonicMs();
  std::vector<std::pair<std::string, Gang>> late;
  for (const auto& [job_id, g] : gangs_) {
    if (g.first_end_mono > 0 && now - g.first_end_mono > 2 * options_.lease_ms) late.emplace_back(job_id, g);
  }
  for (const auto& [job_id, g] : late) {
    int64_t step = 0;
    if (auto a = store_->ListAttempts(job_id); a.ok() && !a->empty()) step = a->back().end_step;
    EndLostAttempt(job_id, g.epoch,
                   g.first_reason + "; the other ranks did not end within " +
                       std::to_string(2 * options_.lease_ms / 1000) + " s",
                   step);
  }
}

void Daemon::TrackGang(const AttemptRow& a) {
  if (a.ranks.size() <= 1) return;
  Gang& g = gangs_[a.job_id];
  if (g.epoch > a.epoch) return;  // a crash may have left an older one marked running
  g = Gang{a.epoch, {}, std::vector<int>(a.ranks.size(), -1), 0, ""};
  for (const RankSlot& r : a.ranks) g.workers.push_back(r.worker_id);
}

void Daemon::ReleaseGang(const std::string& job_id, int64_t epoch, const std::string& reason) {
  auto it = gangs_.find(job_id);
  if (it == gangs_.end() || it->second.epoch != epoch) return;
  const Gang g = std::move(it->second);
  gangs_.erase(it);
  std::set<std::string> refused;
  for (size_t r = 0; r < g.workers.size(); ++r) {
    auto session = sessions_.find(g.workers[r]);
    if (session == sessions_.end()) continue;
    Session& s = session->second;
    if (g.ended[r] < 0 && refused.insert(g.workers[r]).second) {
      Refuse(s.sink, job_id, epoch, "the attempt ended (" + reason + "): stopping its other ranks");
    }
    if (s.running_job == job_id && s.running_epoch == epoch) {
      s.running_job.clear();
      s.running_epoch = 0;
    }
  }
}

void Daemon::OnMetrics(WorkerSink* sink, const pb::MetricsReport& m) {
  if (!IsCurrent(m.job_id(), m.epoch())) {
    Refuse(sink, m.job_id(), m.epoch(), "metrics from superseded epoch");
    return;
  }
  std::vector<MetricRow> rows;
  for (const pb::MetricPoint& p : m.points()) {
    MetricRow row{m.job_id(),       m.epoch(),      p.step(),
                  p.loss(),         p.lr(),         p.grad_norm(),
                  p.tokens_per_s(), p.peak_bytes(), p.time_ms() ? p.time_ms() : clock_->WallMs()};
    if (p.has_eval_loss()) row.eval_loss = p.eval_loss();
    row.eval_only = p.eval_only();
    row.tokens_seen = p.tokens_seen();
    if (p.has_step_seconds()) row.step_seconds = p.step_seconds();
    if (p.has_copy_wait_seconds()) row.copy_wait_seconds = p.copy_wait_seconds();
    rows.push_back(row);
  }
  std::vector<MetricRow> stored;
  const Status added = store_->AddMetrics(rows, &stored);
  Check(added, "add metrics");
  if (!added.ok()) return;
  // Watchers get each step's point as stored: an evaluation arrives merged into its step.
  for (const MetricRow& r : stored) {
    pb::JobUpdate u;
    u.set_job_id(m.job_id());
    pb::MetricPoint* p = u.mutable_metric();
    p->set_step(r.step);
    p->set_loss(r.loss);
    p->set_lr(r.lr);
    p->set_grad_norm(r.grad_norm);
    p->set_tokens_per_s(r.tokens_per_s);
    p->set_peak_bytes(r.peak_bytes);
    p->set_time_ms(r.time_ms);
    p->set_epoch(r.epoch);
    p->set_tokens_seen(r.tokens_seen);
    if (!std::isnan(r.eval_loss)) p->set_eval_loss(r.eval_loss);
    if (!std::isnan(r.step_seconds)) p->set_step_seconds(r.step_seconds);
    if (!std::isnan(r.copy_wait_seconds)) p->set_copy_wait_seconds(r.copy_wait_seconds);
    pending_updates_.push_back(std::move(u));
  }
}

void Daemon::OnLog(WorkerSink* sink, const pb::LogReport& l) {
  if (!IsCurrent(l.job_id(), l.epoch())) {
    Refuse(sink, l.job_id(), l.epoch(), "logs from superseded epoch");
    return;
  }
  auto path = LogPath(l.job_id());
  if (options_.data_dir.empty() || !path.ok()) return;
  std::ofstream(*path, std::ios::app) << l.text();
}

void Daemon::EndRunning(const std::string& job_id, int64_t epoch, AttemptOutcomeCode outcome,
                        const std::string& reason, int64_t exit_step) {
  auto j = store_->GetJob(job_id);
  if (!j.ok()) return;
  auto ckpt = store_->LatestCheckpoint(job_id);
  const int64_t committed = ckpt.ok() ? ckpt->step : 0;
  const int64_t lost = std::max<int64_t>(0, exit_step - committed);
  Check(store_->EndAttempt(job_id, epoch, outcome, reason, exit_step,
                           outcome == AttemptOutcomeCode::kFinished ? 0 : lost, clock_->WallMs()),
        "end attempt");
  auto current = running_epoch_.find(job_id);
  if (current == running_epoch_.end() || current->second != epoch) {
    // A superseded attempt (e.g. one left marked running by a crash between
    // its start and the job's update): end its row, leave the job alone.
    return;
  }
  running_epoch_.erase(current);
  ReleaseGang(job_id, epoch, reason);
  const int64_t now = clock_->WallMs();
  j->updated_ms = now;
  if (j->state == JobStateCode::kCancelled) {
    Event(job_id, "", "stopped", "cancelled attempt stopped at step " + std::to_string(exit_step), exit_step);
  } else if (outcome == AttemptOutcomeCode::kFinished) {
    j->state = JobStateCode::kSucceeded;
    j->reason = "";
    j->steps_done = exit_step;
    Event(job_id, "", "succeeded", "finished " + std::to_string(exit_step) + " steps", exit_step);
  } else if (outcome == AttemptOutcomeCode::kPreempted) {
    j->state = JobStateCode::kQueued;
    j->preemptions += 1;
    j->reason = "preempted: " + reason + "; resumes from step " + std::to_string(committed);
    j->not_before_ms = now + options_.requeue_backoff_ms;
    interrupted_mono_[job_id] = clock_->MonotonicMs();
    Event(job_id, "", "preempted",
          reason + " (resumes from step " + std::to_string(committed) + ", " + std::to_string(lost) +
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
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (RetryStore()) {
      ExpireLeases();
      ExpireGangs();
      StopForSlotEnds();
      ScheduleQueued();
    }
    ReleaseAndPublish(lock);
  }
  tick_latency_.Record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

bool Daemon::RetryStore() {
  if (store_->sticky_error().ok()) return true;
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

void Daemon::ExpireLeases() {
  const int64_t now = clock_->MonotonicMs();
  for (auto& [id, s] : sessions_) {
    if (!s.alive || now - s.last_message_mono <= options_.lease_ms) continue;
    s.alive = false;
    Check(store_->SetWorkerAlive(id, false, clock_->WallMs()), "worker lost");
    Event(
        "", id, "worker_lost",
        "no message from worker " + id + " for " + std::to_string((now - s.last_message_mono) / 1000) + " s",
        0);
    if (!s.running_job.empty()) {
      auto a = store_->ListAttempts(s.running_job);
      int64_t step = 0;
      if (a.ok() && !a->empty()) step = a->back().end_step;
      EndLostAttempt(s.running_job, s.running_epoch, "worker " + id + " lost (lease expired)", step);
      s.running_job.clear();
      s.running_epoch = 0;
    }
  }
}

void Daemon::StopForSlotEnds() {
  const int64_t now = clock_->WallMs();
  for (auto& [id, s] : sessions_) {
    if (!s.alive || !s.sink || s.slot_end_ms <= 0 || s.running_job.empty() || s.stop_sent) continue;
    const double ckpt_s =
        s.checkpoint_seconds > 0 ? s.checkpoint_seconds : EstimateCheckpointSeconds(s.running_job);
    const int64_t ckpt_ms = static_cast<int64_t>(1.5 * ckpt_s * 1000);
    if (now < s.slot_end_ms - ckpt_ms - options_.checkpoint_margin_ms) continue;
    SendStop(s, std::max<int64_t>(1000, s.slot_end_ms - now), "slot end");
    s.stop_sent = true;
    s.draining = true;
    Event(s.running_job, id, "slot_end", "worker " + id + "'s slot ends: checkpoint and stop", 0);
  }
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
  plan_inputs_[job.id] = MakeJobView(job, spec, model);
  return Status::OK();
}

void Daemon::ScheduleQueued() {
  if (queued_.empty()) return;
  std::vector<const JobView*> jobs;
  jobs.reserve(queued_.size());
  for (const std::string& id : queued_) jobs.push_back(&plan_inputs_.at(id));
  std::vector<WorkerView> workers;
  for (const auto& [id, s] : sessions_) {
    std::vector<DeviceView> devices;
    for (const DeviceRow& d : s.devices) devices.push_back({d.kind, d.index, d.total_bytes, d.free_bytes});
    workers.push_back({id, s.alive && s.sink != nullptr, !s.running_job.empty(), s.draining, s.slot_end_ms,
                       std::move(devices), s.host_free_bytes, s.rendezvous_port_count > 0});
  }
  ScheduleResult result = Schedule(jobs, workers, clock_->WallMs(), {options_.min_slot_ms});
  for (const Placement& p : result.placements) {
    auto job = store_->GetJob(p.job_id);
    if (job.ok()) StartOn(*job, p);
    Check(job.status(), "load job to start");
  }
  for (const auto& [job_id, why] : result.waiting) {
    // Why a job waits is recomputed every tick: kept in memory, not fsynced.
    if (waiting_[job_id] == why) continue;
    waiting_[job_id] = why;
    PublishJob(job_id);
  }
}

void Daemon::StartOn(const JobRow& job, const Placement& p) {
  auto spec = StoredSpec(job);
  if (!spec.ok()) return;
  auto ckpt = store_->LatestCheckpoint(job.id);
  const int64_t start_step = ckpt.ok() ? ckpt->step : 0;
  const bool gang = p.ranks.size() > 1;
  auto attempt = store_->StartAttempt(job.id, p.worker_id, start_step, p.plan.micro_batch,
                                      p.plan.accumulation, p.plan.world, clock_->WallMs(), p.ranks);
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
  waiting_.erase(job.id);
  if (auto it = interrupted_mono_.find(job.id); it != interrupted_mono_.end()) {
    recovery_seconds_.Record(static_cast<double>(clock_->MonotonicMs() - it->second) / 1000.0);
    interrupted_mono_.erase(it);
  }
  pb::DaemonCommand cmd;
  pb::StartAttempt* start = cmd.mutable_start();
  start->set_job_id(job.id);
  start->set_epoch(attempt->epoch);
  start->set_spec_yaml(ResolvedSpec(*spec, job.spec_yaml, p.plan));
  start->mutable_plan()->set_micro_batch(p.plan.micro_batch);
  start->mutable_plan()->set_accumulation(p.plan.accumulation);
  start->mutable_plan()->set_world(p.plan.world);
  if (ckpt.ok()) start->set_resume_checkpoint(ckpt->dir);
  start->set_output_dir(spec->output.dir);
  for (const std::string& root : options_.allowed_roots) start->add_allowed_roots(root);
  start->set_total_steps(job.total_steps);
  start->set_start_step(start_step);
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
    s.sink->Send(cmd);
  }
  Event(job.id, p.worker_id, attempt->number == 1 ? "started" : "resumed",
        (attempt->number == 1 ? "started" : "resumed from step " + std::to_string(start_step)) + " on " +
            where + " (" + p.device_kind + ", micro-batch " + std::to_string(p.plan.micro_batch) + " x " +
            std::to_string(p.plan.accumulation) +
            (gang ? " x " + std::to_string(p.plan.world) + " ranks" : "") + ", epoch " +
            std::to_string(attempt->epoch) + ")",
        start_step);
  PublishJob(job.id);
}

}  // namespace ft
