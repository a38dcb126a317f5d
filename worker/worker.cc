#include "worker/worker.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "engine/job/job_spec.h"
#include "worker/slot_end.h"

namespace ft::worker {

namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

constexpr auto kSupersedeWait = std::chrono::seconds(10);  // for a killed older epoch to exit

pb::AttemptOutcome ToProto(AttemptOutcome o) {
  switch (o) {
    case AttemptOutcome::kFinished: return pb::ATTEMPT_FINISHED;
    case AttemptOutcome::kPreempted: return pb::ATTEMPT_PREEMPTED;
    case AttemptOutcome::kFailed: return pb::ATTEMPT_FAILED;
    case AttemptOutcome::kSuperseded: return pb::ATTEMPT_SUPERSEDED;
    case AttemptOutcome::kEnvironment: return pb::ATTEMPT_ENVIRONMENT;
    case AttemptOutcome::kRankLost: return pb::ATTEMPT_RANK_LOST;
    case AttemptOutcome::kBadInput: return pb::ATTEMPT_BAD_INPUT;
  }
  return pb::ATTEMPT_FAILED;
}

void AddDevices(const std::vector<Device>& devices, google::protobuf::RepeatedPtrField<pb::Device>* out) {
  for (const Device& d : devices) {
    pb::Device* p = out->Add();
    p->set_index(d.index);
    p->set_kind(DeviceKindName(d.kind));
    p->set_name(d.name);
    p->set_total_bytes(d.total_bytes);
    p->set_free_bytes(d.free_bytes);
    p->set_used_bytes(d.used_bytes);
  }
}

// The ft-train pids of running attempts: the CPU device's used memory is theirs.
std::vector<pid_t> TrainerPids(const std::vector<std::shared_ptr<Attempt>>& running) {
  std::vector<pid_t> pids;
  for (const auto& a : running) pids.push_back(a->pid());
  return pids;
}

}  // namespace

Worker::Worker(WorkerOptions options)
    : options_(std::move(options)), devices_(options_.devices), journal_(options_.work_dir + "/journal") {}

Worker::~Worker() {
  std::map<Key, Entry> attempts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    attempts.swap(attempts_);
  }
  for (auto& [key, entry] : attempts) entry.attempt->Kill();
  // The attempts' destructors join their threads.
}

Status Worker::Init(std::chrono::milliseconds lock_wait) {
  std::error_code ec;
  fs::create_directories(options_.work_dir, ec);
  if (ec) return Status::IOError(options_.work_dir + ": cannot create the work dir: " + ec.message());
  FT_ASSIGN_OR_RETURN(work_dir_lock_, WorkDirLock::Acquire(options_.work_dir, lock_wait));
  FT_ASSIGN_OR_RETURN(instance_, LoadOrCreateInstance(options_.work_dir));
  std::lock_guard<std::mutex> lock(devices_mu_);
  FT_RETURN_IF_ERROR(devices_.Init());
  for (const Device& d : devices_.Current({})) {
    FT_LOG(INFO) << "device " << DeviceKindName(d.kind) << ":" << d.index << " " << d.name << ", "
                 << d.total_bytes / (1 << 20) << " MiB total, " << d.free_bytes / (1 << 20) << " MiB free";
  }
  return Status::OK();
}

void Worker::Send(pb::WorkerMessage m) {
  if (sink_ != nullptr) sink_->Send(std::move(m));
}

std::vector<std::shared_ptr<Attempt>> Worker::Running() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Attempt>> out;
  for (const auto& [key, entry] : attempts_)
    if (!entry.exited) out.push_back(entry.attempt);
  return out;
}

size_t Worker::running() const { return Running().size(); }

std::vector<std::shared_ptr<Attempt>> Worker::RanksOf(const std::string& job_id, int64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Attempt>> out;
  for (const auto& [key, entry] : attempts_) {
    if (std::get<0>(key) == job_id && std::get<1>(key) == epoch && !entry.exited)
      out.push_back(entry.attempt);
  }
  return out;
}

// ---------------------------------------------------------------- session delegate

namespace {
// The node's host memory into a Register or Heartbeat (left 0 when it cannot be read).
template <typename Message>
void SetHostMemory(Message* m) {
  if (StatusOr<HostMemory> h = ReadHostMemory(); h.ok()) {
    m->set_host_total_bytes(h->total_bytes);
    m->set_host_free_bytes(h->free_bytes);
  }
}
}  // namespace

pb::Register Worker::MakeRegister() {
  pb::Register r;
  r.set_worker_id(options_.id);
  r.set_hostname(options_.hostname);
  r.set_version(options_.version);
  r.set_slot_end_ms(options_.slot_end_ms);
  const std::vector<std::shared_ptr<Attempt>> running = Running();
  {
    std::lock_guard<std::mutex> lock(devices_mu_);
    AddDevices(devices_.Current(TrainerPids(running)), r.mutable_devices());
  }
  SetHostMemory(&r);
  for (const auto& a : running) {
    pb::RunningAttempt* ra = r.add_running();
    ra->set_job_id(a->spec().job_id);
    ra->set_epoch(a->spec().epoch);
    ra->set_step(a->progress().step);
    ra->set_rank(a->spec().rank);
    ra->set_credential(a->spec().credential);
  }
  r.set_address(options_.address.empty() ? options_.hostname : options_.address);
  r.set_rendezvous_port_first(options_.rendezvous_port_first);
  r.set_rendezvous_port_count(options_.rendezvous_port_count);
  r.set_pool(options_.pool);
  r.set_price(options_.price);
  r.set_instance(instance_);
  std::lock_guard<std::mutex> lock(mu_);
  journaled_in_register_.clear();
  for (pb::AttemptExited& e : journal_.Entries()) {
    journaled_in_register_.emplace_back(e.job_id(), e.epoch(), e.rank());
    *r.add_exited() = std::move(e);
  }
  return r;
}

void Worker::OnRegistered() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [job, epoch, rank] : journaled_in_register_) journal_.Forget(job, epoch, rank);
  journaled_in_register_.clear();
}

pb::Heartbeat Worker::MakeHeartbeat() {
  pb::Heartbeat h;
  h.set_slot_end_ms(options_.slot_end_ms);
  h.set_notice_ms(notice_ms_.load());
  const std::vector<std::shared_ptr<Attempt>> running = Running();
  {
    std::lock_guard<std::mutex> lock(devices_mu_);
    AddDevices(devices_.Current(TrainerPids(running)), h.mutable_devices());
  }
  SetHostMemory(&h);
  for (const auto& a : running) {
    if (!a->follows_metrics()) continue;  // rank 0's attempt reports the job's progress
    const AttemptProgress p = a->progress();
    pb::Progress* out = h.add_progress();
    out->set_job_id(a->spec().job_id);
    out->set_epoch(a->spec().epoch);
    out->set_step(p.step);
    out->set_total_steps(p.total_steps);
    out->set_loss(p.loss);
    out->set_tokens_per_s(p.tokens_per_s);
    out->set_credential(a->spec().credential);
  }
  return h;
}

void Worker::OnCommand(const pb::DaemonCommand& command) {
  switch (command.cmd_case()) {
    case pb::DaemonCommand::kStart: HandleStart(command.start()); break;
    case pb::DaemonCommand::kCheckpointNow: HandleCheckpointNow(command.checkpoint_now()); break;
    case pb::DaemonCommand::kRefused: HandleRefused(command.refused()); break;
    case pb::DaemonCommand::kAccepted: HandleAccepted(command.accepted()); break;
    default: FT_LOG(DEBUG) << "ignoring daemon command " << command.cmd_case(); break;
  }
}

// ---------------------------------------------------------------- commands

std::string Worker::StartRefusal(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return "worker is stopping (" + stop_reason_ + ")";
  if (slot_closed_ || SlotEndReached(now_ms, options_.slot_end_ms, max_checkpoint_seconds_)) {
    slot_closed_ = true;
    return "slot ends too soon";
  }
  return "";
}

void Worker::Reject(const pb::StartAttempt& s, const std::string& reason) {
  FT_LOG(WARN) << "not starting " << s.job_id() << " e" << s.epoch() << " rank " << s.rank() << ": "
               << reason;
  pb::WorkerMessage m;
  pb::AttemptExited* e = m.mutable_exited();
  e->set_job_id(s.job_id());
  e->set_epoch(s.epoch());
  e->set_rank(s.rank());
  e->set_credential(s.credential());
  e->set_outcome(pb::ATTEMPT_PREEMPTED);
  e->set_reason(reason);
  Send(std::move(m));
}

std::vector<std::pair<Worker::Key, std::shared_ptr<Attempt>>> Worker::Retire(
    const std::string& job_id, const std::function<bool(int64_t)>& epoch_matches) {
  std::vector<std::pair<Key, std::shared_ptr<Attempt>>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = attempts_.begin(); it != attempts_.end();) {
    if (std::get<0>(it->first) == job_id && epoch_matches(std::get<1>(it->first))) {
      out.emplace_back(it->first, it->second.attempt);
      retired_.push_back(it->second.attempt);
      it = attempts_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void Worker::SupersedeOlder(const std::string& job_id, int64_t epoch) {
  const auto older = Retire(job_id, [epoch](int64_t e) { return e < epoch; });
  for (auto& [key, attempt] : older) {
    FT_LOG(WARN) << "attempt " << std::get<0>(key) << " e" << std::get<1>(key) << " superseded by e" << epoch
                 << ": killing it";
    attempt->Kill();
    if (sink_ != nullptr) sink_->DropQueued(std::get<0>(key), std::get<1>(key));
  }
  idle_cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + kSupersedeWait;
  for (auto& [key, attempt] : older) {
    while (!attempt->done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

StatusOr<AttemptSpec> Worker::PrepareAttempt(const pb::StartAttempt& s) {
  AttemptSpec spec;
  spec.job_id = s.job_id();
  spec.epoch = s.epoch();
  spec.credential = s.credential();
  spec.ft_train = options_.ft_train;
  spec.job_file =
      (fs::path(options_.work_dir) / (AttemptFileStem(s.job_id(), s.epoch(), s.rank()) + ".yaml")).string();
  spec.resume_checkpoint = s.resume_checkpoint();
  spec.allowed_roots.assign(s.allowed_roots().begin(), s.allowed_roots().end());
  spec.stop_grace_s = options_.stop_grace_s;
  spec.kill_grace_s = options_.kill_grace_s;
  spec.total_steps = s.total_steps();
  spec.mtbf_seconds = s.mtbf_seconds();
  spec.start_step = s.start_step();
  spec.poll_interval = options_.poll_interval;
  spec.world = static_cast<int>(std::max<int64_t>(1, s.plan().world()));
  if (spec.world > 1) {
    if (s.rendezvous().empty()) {
      return Status::InvalidArgument("rank " + std::to_string(s.rank()) + " of a " +
                                     std::to_string(spec.world) + "-rank attempt has no rendezvous address");
    }
    spec.rank = s.rank();
    spec.rendezvous = s.rendezvous();
    spec.dist_host = s.dist_host();
    RankLaunch launch = LaunchOfRank(s.device_index());
    spec.env = std::move(launch.env);
    spec.dist_backend = std::move(launch.dist_backend);
  }
  FT_RETURN_IF_ERROR(WriteFileDurably(spec.job_file, s.spec_yaml()));
  // output.dir travels once, in the job's YAML (ftd resolved it to an absolute path).
  FT_ASSIGN_OR_RETURN(JobSpec job, ParseJobSpec(s.spec_yaml(), spec.job_file));
  spec.output_dir = job.output.dir;
  if (spec.total_steps <= 0) spec.total_steps = job.train.max_steps;  // older daemons: the spec's own
  return spec;
}

RankLaunch Worker::LaunchOfRank(int device_index) {
  const std::vector<pid_t> trainers = TrainerPids(Running());  // while any runs, GPUs are not re-queried
  std::lock_guard<std::mutex> lock(devices_mu_);
  return RankLaunchOn(devices_.Current(trainers), device_index, std::getenv("CUDA_VISIBLE_DEVICES"),
                      std::getenv("OMP_NUM_THREADS"), std::thread::hardware_concurrency());
}

void Worker::HandleStart(const pb::StartAttempt& s) {
  Reap();
  std::lock_guard<std::mutex> start_lock(start_mu_);
  if (std::string why = StartRefusal(WallNowMs()); !why.empty()) return Reject(s, why);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, entry] : attempts_) {
      const auto& [job, epoch, rank] = key;
      if (job != s.job_id() || epoch < s.epoch() || (epoch == s.epoch() && rank != s.rank())) continue;
      FT_LOG(INFO) << "StartAttempt " << s.job_id() << " e" << s.epoch() << " rank " << s.rank()
                   << " ignored: e" << epoch << " rank " << rank << " is already here";
      return;
    }
  }
  SupersedeOlder(s.job_id(), s.epoch());
  auto spec = PrepareAttempt(s);
  StatusOr<std::unique_ptr<Attempt>> attempt = spec.ok() ? Attempt::Start(*spec, this) : spec.status();
  if (!attempt.ok()) {
    FT_LOG(ERROR) << "cannot start " << s.job_id() << " e" << s.epoch() << ": "
                  << attempt.status().ToString();
    pb::WorkerMessage m;
    pb::AttemptExited* e = m.mutable_exited();
    e->set_job_id(s.job_id());
    e->set_epoch(s.epoch());
    e->set_rank(s.rank());
    e->set_credential(s.credential());
    e->set_outcome(pb::ATTEMPT_FAILED);
    e->set_exit_code(-1);
    e->set_reason("cannot start ft-train: " + attempt.status().ToString());
    return Send(std::move(m));
  }
  std::lock_guard<std::mutex> lock(mu_);
  attempts_[{s.job_id(), s.epoch(), s.rank()}].attempt = std::move(*attempt);
}

void Worker::HandleCheckpointNow(const pb::CheckpointNow& c) {
  const std::vector<std::shared_ptr<Attempt>> ranks = RanksOf(c.job_id(), c.epoch());
  if (ranks.empty()) {
    FT_LOG(WARN) << "CheckpointNow for " << c.job_id() << " e" << c.epoch() << ", which is not running here";
    return;
  }
  const double deadline_s =
      c.deadline_ms() > 0 ? static_cast<double>(c.deadline_ms()) / 1000.0 : options_.stop_grace_s;
  const std::string cmd = c.stop() ? "stop" : "checkpoint";
  const std::string reason = c.reason().empty() ? "requested by the daemon" : c.reason();
  FT_LOG(INFO) << cmd << " " << c.job_id() << " e" << c.epoch() << " within " << deadline_s
               << " s: " << reason;
  for (const auto& attempt : ranks) {
    if (Status s = attempt->Control(cmd, deadline_s, reason); !s.ok()) FT_LOG(WARN) << s.ToString();
  }
}

void Worker::HandleAccepted(const pb::CheckpointAccepted& c) {
  // Rank 0 keeps the checkpoints. Ended meanwhile: the next attempt gets the commit as its --resume.
  for (const auto& attempt : RanksOf(c.job_id(), c.epoch())) {
    if (!attempt->follows_metrics()) continue;
    if (Status s = attempt->NotifyCommitted(c.step(), c.dir()); !s.ok()) FT_LOG(DEBUG) << s.ToString();
  }
}

void Worker::HandleRefused(const pb::Refused& r) {
  const auto ranks = Retire(r.job_id(), [&](int64_t e) { return e == r.epoch(); });
  if (sink_ != nullptr) sink_->DropQueued(r.job_id(), r.epoch());
  if (ranks.empty()) return;
  FT_LOG(WARN) << "attempt " << r.job_id() << " e" << r.epoch() << " refused by the daemon (" << r.reason()
               << "): killing it";
  for (const auto& [key, attempt] : ranks) attempt->Kill();
  idle_cv_.notify_all();
}

// ---------------------------------------------------------------- attempt reports

void Worker::OnMetrics(const AttemptSpec& a, const std::vector<MetricsLine>& steps, int64_t time_ms) {
  pb::WorkerMessage m;
  pb::MetricsReport* r = m.mutable_metrics();
  r->set_job_id(a.job_id);
  r->set_epoch(a.epoch);
  r->set_credential(a.credential);
  for (const MetricsLine& s : steps) {
    pb::MetricPoint* p = r->add_points();
    p->set_step(s.step);
    p->set_time_ms(s.time_ms > 0 ? s.time_ms : time_ms);  // the trainer's step end, when it wrote one
    p->set_epoch(a.epoch);
    p->mutable_objective_metrics()->insert(s.objective_metrics.begin(), s.objective_metrics.end());
    if (s.kind == MetricsLine::Kind::kEval) {  // the daemon merges it into the step's point
      p->set_eval_loss(s.eval_loss);
      p->set_eval_only(true);
      continue;
    }
    p->set_loss(s.loss);
    p->set_lr(s.lr);
    p->set_grad_norm(s.grad_norm);
    p->set_tokens_per_s(s.tokens_per_s);
    p->set_peak_bytes(s.peak_bytes);
    p->set_tokens_seen(s.tokens_seen);
    if (s.step_seconds > 0) {  // older trainers do not report them
      p->set_step_seconds(s.step_seconds);
      p->set_copy_wait_seconds(s.copy_wait_seconds);
    }
  }
  Send(std::move(m));
}

void Worker::OnLog(const AttemptSpec& a, const std::string& text) {
  pb::WorkerMessage m;
  m.mutable_log()->set_job_id(a.job_id);
  m.mutable_log()->set_epoch(a.epoch);
  m.mutable_log()->set_rank(a.rank);
  m.mutable_log()->set_credential(a.credential);
  m.mutable_log()->set_text(text);
  Send(std::move(m));
}

void Worker::OnCheckpoint(const AttemptSpec& a, const CommittedCheckpoint& c) {
  FT_LOG(INFO) << "attempt " << a.job_id << " e" << a.epoch << ": checkpoint at step " << c.step << " in "
               << c.dir << " (" << c.write_seconds << " s)";
  {
    std::lock_guard<std::mutex> lock(mu_);
    max_checkpoint_seconds_ = std::max(max_checkpoint_seconds_, c.write_seconds);
  }
  pb::WorkerMessage m;
  pb::CheckpointCommitted* r = m.mutable_checkpoint();
  r->set_job_id(a.job_id);
  r->set_epoch(a.epoch);
  r->set_step(c.step);
  r->set_dir(c.dir);
  r->set_manifest_sha256(c.manifest_sha256);
  r->set_write_seconds(c.write_seconds);
  r->set_credential(a.credential);
  Send(std::move(m));
}

void Worker::OnNote(const AttemptSpec& a, const AttemptNote& n) {
  pb::WorkerMessage m;
  pb::AttemptNote* r = m.mutable_note();
  r->set_job_id(a.job_id);
  r->set_epoch(a.epoch);
  r->set_kind(n.kind);
  r->set_message(n.message);
  r->set_step(n.step);
  r->set_dir(n.dir);
  r->set_credential(a.credential);
  Send(std::move(m));
}

void Worker::OnExit(const AttemptSpec& a, const AttemptExit& e) {
  pb::WorkerMessage m;
  pb::AttemptExited* r = m.mutable_exited();
  r->set_job_id(a.job_id);
  r->set_epoch(a.epoch);
  r->set_rank(a.rank);
  r->set_credential(a.credential);
  r->set_outcome(ToProto(e.outcome));
  r->set_exit_code(e.exit_code);
  r->set_reason(e.reason);
  r->set_step(e.step);
  r->set_notice_ms(notice_ms_.load());
  {
    // Journaled first: a restart before the daemon has it replays it in the next Register.
    std::lock_guard<std::mutex> lock(mu_);
    if (Status s = journal_.Record(*r); !s.ok()) FT_LOG(WARN) << s.ToString();
  }
  Send(std::move(m));  // before it leaves Register's running list: the daemon sees the exit either way
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = attempts_.find({a.job_id, a.epoch, a.rank});
    if (it != attempts_.end()) it->second.exited = true;
  }
  idle_cv_.notify_all();
}

// ---------------------------------------------------------------- stopping

void Worker::StopAll(const std::string& reason, double deadline_s) {
  std::lock_guard<std::mutex> start_lock(start_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    stop_reason_ = reason;
  }
  for (const auto& a : Running()) {
    FT_LOG(WARN) << "stopping " << a->spec().job_id << " e" << a->spec().epoch << " within " << deadline_s
                 << " s: " << reason;
    if (Status s = a->Control("stop", deadline_s, reason); !s.ok()) FT_LOG(WARN) << s.ToString();
  }
}

void Worker::CheckSlotEnd(int64_t now_ms) {
  if (options_.slot_end_ms <= 0) return;
  std::lock_guard<std::mutex> start_lock(start_mu_);
  const double left_s = std::max(1.0, static_cast<double>(options_.slot_end_ms - now_ms) / 1000.0);
  for (const auto& a : Running()) {
    const AttemptProgress p = a->progress();
    if (p.stop_sent || !SlotEndReached(now_ms, options_.slot_end_ms, p.checkpoint_seconds)) continue;
    FT_LOG(WARN) << "slot ends in " << left_s << " s: stopping " << a->spec().job_id << " e"
                 << a->spec().epoch;
    if (Status s = a->Control("stop", left_s, "slot end"); !s.ok()) FT_LOG(WARN) << s.ToString();
    std::lock_guard<std::mutex> lock(mu_);
    slot_closed_ = true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!slot_closed_ && SlotEndReached(now_ms, options_.slot_end_ms, max_checkpoint_seconds_)) {
    FT_LOG(WARN) << "slot ends in " << left_s << " s: no new attempts";
    slot_closed_ = true;
  }
}

bool Worker::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [this] {
    for (const auto& [key, entry] : attempts_)
      if (!entry.exited) return false;
    return true;
  });
}

void Worker::KillRemaining(const std::string& reason) {
  for (const auto& a : Running()) {
    FT_LOG(ERROR) << "attempt " << a->spec().job_id << " e" << a->spec().epoch << ": " << reason;
    a->Abort(reason);
  }
}

void Worker::Reap() {
  std::vector<std::shared_ptr<Attempt>> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = attempts_.begin(); it != attempts_.end();) {
      if (it->second.exited && it->second.attempt->done()) {
        done.push_back(it->second.attempt);
        it = attempts_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = retired_.begin(); it != retired_.end();) {
      if ((*it)->done()) {
        done.push_back(*it);
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // `done` is destroyed here, outside the lock: the destructors join the attempts' threads.
}

}  // namespace ft::worker
