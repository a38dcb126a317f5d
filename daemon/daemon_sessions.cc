// The daemon's worker sessions: registration (reattach, replayed exits),
// messages (heartbeats, checkpoints, exits, metrics, logs, notes), leases and
// slot ends.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/money.h"
#include "common/secret.h"
#include "common/untrusted_text.h"
#include "daemon/daemon.h"
#include "daemon/daemon_internal.h"

namespace ft {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

namespace {

DeviceRow ToDeviceRow(const pb::Device& d) {
  return {d.index(), d.kind(), d.name(), d.total_bytes(), d.free_bytes(), d.used_bytes()};
}

// A worker-supplied name or path, quoted for an event or a log line.
std::string Quoted(const std::string& text) { return "'" + EscapeControlChars(text, 256) + "'"; }

// Refusal events of one session beyond this many are recorded one in kRefusalEventEvery.
constexpr int64_t kRefusalEventsInFull = 10;
constexpr int64_t kRefusalEventEvery = 1000;

}  // namespace

using daemon_internal::kCancelStopMs;
using daemon_internal::ToOutcomeCode;

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

// ---------------------------------------------------------------- binding

StatusOr<std::string> Daemon::Credential(const std::string& job_id, int64_t epoch, int rank) {
  if (attempt_key_.empty()) {
    // 256 random bits, kept only if the store has no key yet (the first attempt start ever).
    FT_ASSIGN_OR_RETURN(std::string fresh, RandomHex(32));
    FT_ASSIGN_OR_RETURN(attempt_key_, store_->AttemptKey(fresh));
  }
  return HmacSha256Hex(attempt_key_,
                       "attempt\n" + job_id + "\n" + std::to_string(epoch) + "\n" + std::to_string(rank));
}

const Daemon::Binding* Daemon::Bind(const AttemptRow& a) {
  Binding b;
  b.epoch = a.epoch;
  const size_t ranks = std::max<size_t>(1, a.ranks.size());
  for (size_t r = 0; r < ranks; ++r) {
    b.workers.push_back(a.ranks.empty() ? a.worker_id : a.ranks[r].worker_id);
    StatusOr<std::string> credential = Credential(a.job_id, a.epoch, static_cast<int>(r));
    if (!credential.ok()) {
      FT_LOG(ERROR) << "job " << a.job_id << " epoch " << a.epoch
                    << ": no attempt credential: " << credential.status().ToString();
      return nullptr;
    }
    b.credentials.push_back(std::move(*credential));
  }
  // The cache keeps the attempts that run (and some that ended; swept as it grows).
  if (bindings_.size() >= 2 * running_epoch_.size() + 64) {
    std::erase_if(bindings_, [&](const auto& kv) { return !IsCurrent(kv.first, kv.second.epoch); });
  }
  return &(bindings_[a.job_id] = std::move(b));
}

const Daemon::Binding* Daemon::BindingOf(const std::string& job_id, int64_t epoch) {
  auto it = bindings_.find(job_id);
  if (it != bindings_.end() && it->second.epoch == epoch) return &it->second;
  auto attempts = store_->ListAttempts(job_id);  // after a restart: once per running attempt
  if (!attempts.ok()) return nullptr;
  for (const AttemptRow& a : *attempts) {
    if (a.epoch == epoch) return Bind(a);
  }
  return nullptr;
}

bool Daemon::Accept(const std::string& worker_id, Session& s, const std::string& what,
                    const std::string& job_id, int64_t epoch, int rank, const std::string& credential) {
  const Binding* b = BindingOf(job_id, epoch);
  const std::string attempt = "epoch " + std::to_string(epoch) + " rank " + std::to_string(rank);
  if (b == nullptr) {  // the store cannot be read: nothing is applied, nobody is told to stop
    FT_LOG(ERROR) << what << " of job " << job_id << " " << attempt << " from worker " << Quoted(worker_id)
                  << " not applied: ftd cannot read the attempt's record";
    return false;
  }
  const bool in_attempt = std::find(b->workers.begin(), b->workers.end(), worker_id) != b->workers.end();
  std::string why;
  if (rank < 0 || static_cast<size_t>(rank) >= b->workers.size()) {
    why = "epoch " + std::to_string(epoch) + " has no rank " + std::to_string(rank);
  } else if (b->workers[rank] != worker_id) {
    why = attempt + " runs on worker " + Quoted(b->workers[rank]);
  } else if (credential.empty()) {
    why = "the report carries no attempt credential (an ft-worker older than ftd?)";
  } else if (!SecretEquals(credential, b->credentials[rank])) {
    why = "its attempt credential is wrong";
  } else {
    return true;
  }
  RefusalEvent(worker_id, s, job_id,
               what + " about " + attempt + " from worker " + Quoted(worker_id) + " refused: " + why, 0);
  // A worker of the attempt itself is not told to stop: that would stop the real trainer.
  if (!in_attempt) Refuse(s.sink, job_id, epoch, what + " refused: " + why);
  return false;
}

void Daemon::RefusalEvent(const std::string& worker_id, Session& s, const std::string& job_id,
                          const std::string& message, int64_t step) {
  const int64_t n = ++s.refusals;
  if (n > kRefusalEventsInFull && n % kRefusalEventEvery != 0) return;
  const std::string text = n <= kRefusalEventsInFull
                               ? message
                               : message + " (" + std::to_string(n) +
                                     " refusals for this worker so far; one in " +
                                     std::to_string(kRefusalEventEvery) + " is recorded)";
  Event(job_id, worker_id, "refused", text, step);  // logged with it
}

std::string Daemon::CheckpointOutsideOutput(const std::string& job_id, const std::string& dir) {
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return "its job cannot be read: " + job.status().message();
  if (job->output_dir.empty()) return "the job has no output.dir";
  const std::string where = "its dir " + Quoted(dir) + " ";
  if (dir.empty() || dir.front() != '/') return where + "is not an absolute path";
  auto confined = ConfinedPath(dir, {job->output_dir});
  if (!confined.ok()) {
    return where + "does not lie in the job's output.dir " + Quoted(job->output_dir) + " (" +
           EscapeControlChars(confined.status().message(), 1024) + ")";
  }
  return "";
}

Status Daemon::OnRegister(const pb::Register& reg, WorkerSink* sink) {
  if (reg.worker_id().empty()) return Status::InvalidArgument("register: worker_id is empty");
  if (!reg.pool().empty()) {
    FT_RETURN_IF_ERROR(CheckPoolName(reg.pool(), "register: pool (ft-worker --pool)"));
  }
  FT_RETURN_IF_ERROR(CheckPrice(reg.price(), "register: price (ft-worker --price)"));
  Held lock(this);
  const std::string implausible =
      ImplausibleMemory(reg.worker_id(), reg.devices(), reg.host_total_bytes(), reg.host_free_bytes());
  if (!implausible.empty()) {
    Event("", reg.worker_id(), "worker_refused", "registration refused: " + implausible, 0);
    ReleaseAndPublish(lock);
    return Status::InvalidArgument(
        "register: " + implausible +
        "; fix what the worker reports (ft-worker --cpu-memory, --cpu-devices, the device driver)");
  }
  Session& s = sessions_[reg.worker_id()];
  if (Status adopted = AdoptSession(reg, sink, s); !adopted.ok()) {
    ReleaseAndPublish(lock);
    return adopted;
  }
  // Exits the worker journaled before it restarted: how those attempts really ended.
  for (const pb::AttemptExited& e : reg.exited()) {
    if (!IsCurrent(e.job_id(), e.epoch())) continue;  // already known (or superseded)
    if (!Accept(reg.worker_id(), s, "journaled exit", e.job_id(), e.epoch(), e.rank(), e.credential())) {
      continue;
    }
    Event(e.job_id(), reg.worker_id(), "replayed",
          "exit of epoch " + std::to_string(e.epoch()) + " replayed from the worker's journal", e.step());
    AdoptCheckpointsBeforeReplayedExit(e);
    ApplyExit(reg.worker_id(), s, e);
  }
  std::set<std::string> reported;
  EndUnreported(reg.worker_id(), ReattachReported(reg, sink, s, &reported));
  if (s.running_job.empty() || !reported.count(s.running_job)) {
    s.running_job.clear();
    s.running_epoch = 0;
  }
  pb::DaemonCommand cmd;
  cmd.mutable_registered()->set_lease_ms(options_.lease_ms);
  cmd.mutable_registered()->set_heartbeat_ms(options_.heartbeat_ms);
  sink->Send(cmd);
  ReleaseAndPublish(lock);
  return Status::OK();
}

Status Daemon::AdoptSession(const pb::Register& reg, WorkerSink* sink, Session& s) {
  WorkerSink* const previous = s.sink;  // another session still holding this id, if any
  const bool was_alive = s.alive;
  if (was_alive && !s.instance.empty() && s.instance != reg.instance()) {
    // Another ft-worker holds this id and lives: it keeps it (the two would replace each other forever).
    const std::string why = "worker id " + Quoted(reg.worker_id()) + " is held by another ft-worker (host " +
                            Quoted(s.hostname) + ") whose session lives; this one (host " +
                            Quoted(reg.hostname()) +
                            ") is a different instance: give each ft-worker its own --id (ftd frees the id " +
                            std::to_string(options_.lease_ms / 1000) + " s after the other's last message)";
    RefusalEvent(reg.worker_id(), s, "", "registration refused: " + why, 0);
    return Status::FailedPrecondition("register: " + why);
  }
  s.instance = reg.instance();
  s.hostname = reg.hostname();
  // The session's facts change: no heartbeat is quiet until one is applied again.
  if (previous != nullptr) AbsorbQuiet(s, true);
  {
    std::lock_guard<std::mutex> quiet(sink->quiet_.mu);
    sink->quiet_.armed = false;
  }
  s.sink = sink;
  s.alive = true;
  s.draining = false;
  s.stop_sent = false;
  Heard(s);
  s.slot_end_ms = reg.slot_end_ms();
  s.host_total_bytes = reg.host_total_bytes();
  s.host_free_bytes = reg.host_free_bytes();
  s.address = reg.address().empty() ? reg.hostname() : reg.address();
  s.rendezvous_port_first = reg.rendezvous_port_first();
  s.rendezvous_port_count = reg.rendezvous_port_count();
  s.pool = reg.pool().empty() ? std::string(kDefaultPool) : reg.pool();
  s.price = reg.price();
  WorkerRow row;
  row.id = reg.worker_id();
  row.hostname = reg.hostname();
  row.version = reg.version();
  row.last_seen_ms = clock_->WallMs();
  row.slot_end_ms = reg.slot_end_ms();
  row.alive = true;
  row.pool = s.pool;
  row.price = s.price;
  for (const pb::Device& d : reg.devices()) row.devices.push_back(ToDeviceRow(d));
  s.devices = row.devices;
  if (Status upserted = store_->UpsertWorker(row); !upserted.ok()) {
    // E.g. two devices with one index: the worker must fix what it reports.
    s.sink = nullptr;
    s.alive = was_alive;
    return upserted;
  }
  if (previous != nullptr && previous != sink) {
    // The same instance's newer session takes over (a restarted worker may reconnect before its
    // old stream is seen dead); the older one is told why it ends.
    const std::string why = "worker id '" + EscapeControlChars(reg.worker_id(), 128) +
                            "' was registered by a newer session of the same ft-worker (hostname '" +
                            EscapeControlChars(reg.hostname(), 128) + "'), which replaces this one";
    previous->Evict(why);
    Event("", reg.worker_id(), "worker_replaced", why, 0);
  }
  if (!was_alive) Event("", reg.worker_id(), "worker_joined", "worker " + reg.worker_id() + " registered", 0);
  return Status::OK();
}

std::set<std::pair<std::string, int>> Daemon::ReattachReported(const pb::Register& reg, WorkerSink* sink,
                                                               Session& s, std::set<std::string>* reported) {
  std::set<std::pair<std::string, int>> reported_ranks;
  for (const pb::RunningAttempt& a : reg.running()) {
    if (!IsCurrent(a.job_id(), a.epoch())) {
      Refuse(sink, a.job_id(), a.epoch(), "epoch " + std::to_string(a.epoch()) + " is superseded");
      continue;
    }
    if (!Accept(reg.worker_id(), s, "running attempt", a.job_id(), a.epoch(), a.rank(), a.credential())) {
      continue;
    }
    s.running_job = a.job_id();
    s.running_epoch = a.epoch();
    reported_ranks.insert({a.job_id(), a.rank()});
    if (!reported->insert(a.job_id()).second) continue;  // another rank of a gang already reattached
    Event(a.job_id(), reg.worker_id(), "reattached",
          "attempt epoch " + std::to_string(a.epoch()) + " reattached after reconnect", a.step());
    // A cancel (or slot-end stop) sent while the worker was away never reached it.
    auto job = store_->GetJob(a.job_id());
    if (job.ok() && job->state == JobStateCode::kCancelled) {
      SendStop(s, kCancelStopMs, "cancelled");
      s.stop_sent = true;
    }
  }
  return reported_ranks;
}

void Daemon::EndUnreported(const std::string& worker_id,
                           const std::set<std::pair<std::string, int>>& reported_ranks) {
  auto running = store_->RunningAttempts();
  if (!running.ok()) return;
  for (const AttemptRow& a : *running) {
    auto gang = gangs_.find(a.job_id);
    const bool tracked = gang != gangs_.end() && gang->second.epoch == a.epoch;
    const size_t ranks = std::max<size_t>(1, a.ranks.size());
    for (size_t r = 0; r < ranks; ++r) {
      const std::string& worker = a.ranks.empty() ? a.worker_id : a.ranks[r].worker_id;
      if (worker != worker_id || reported_ranks.count({a.job_id, static_cast<int>(r)})) continue;
      if (tracked && gang->second.ended[r] >= 0) continue;  // its exit is known
      EndLostAttempt(a.job_id, a.epoch,
                     a.ranks.empty() ? "worker restarted without the attempt"
                                     : "worker restarted without rank " + std::to_string(r),
                     a.end_step);
      break;
    }
  }
}

void Daemon::OnDisconnect(const std::string& worker_id, WorkerSink* sink) {
  Held lock(this);
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end() || it->second.sink != sink) return;
  AbsorbQuiet(it->second, true);  // its quiet heartbeats were heard too
  it->second.sink = nullptr;
}

void Daemon::OnWorkerMessage(const std::string& worker_id, WorkerSink* sink, const pb::WorkerMessage& msg) {
  const auto start = std::chrono::steady_clock::now();
  if (TryQuietHeartbeat(sink, msg)) {
    message_latency_.Record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return;
  }
  {
    Held lock(this);
    auto it = sessions_.find(worker_id);
    if (it == sessions_.end() || it->second.sink != sink) return;  // a stale session
    Session& s = it->second;
    if (!s.alive) {
      // Its lease expired: everything it reports about earlier attempts is refused below.
      s.alive = true;
      Event("", worker_id, "worker_joined", "worker " + worker_id + " is back", 0);
    }
    Heard(s);
    switch (msg.msg_case()) {
      case pb::WorkerMessage::kHeartbeat: OnHeartbeat(worker_id, s, msg.heartbeat()); break;
      case pb::WorkerMessage::kCheckpoint: OnCheckpoint(worker_id, s, msg.checkpoint()); break;
      case pb::WorkerMessage::kExited: OnExited(worker_id, s, msg.exited()); break;
      case pb::WorkerMessage::kMetrics: OnMetrics(worker_id, s, msg.metrics()); break;
      case pb::WorkerMessage::kLog: OnLog(worker_id, s, msg.log()); break;
      case pb::WorkerMessage::kNote: OnNote(worker_id, s, msg.note()); break;
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
  if (hb.notice_ms() > 0 && !s.running_job.empty()) NoticeFor(s.running_job, hb.notice_ms());
  if (hb.host_total_bytes() > 0 && implausible.empty()) {
    s.host_total_bytes = hb.host_total_bytes();
    s.host_free_bytes = hb.host_free_bytes();
  }
  s.seen_wall_ms = clock_->WallMs();  // stored with the others' at the next tick (FlushSeen)
  RecordDeviceMemory(worker_id, s, hb);
  for (const pb::Progress& p : hb.progress()) {
    if (!IsCurrent(p.job_id(), p.epoch())) {
      Refuse(s.sink, p.job_id(), p.epoch(), "epoch " + std::to_string(p.epoch()) + " is superseded");
      continue;
    }
    if (!Accept(worker_id, s, "progress", p.job_id(), p.epoch(), 0, p.credential())) continue;
    Check(store_->RecordProgress({p.job_id(), p.epoch(), p.step(), p.total_steps(), p.loss(),
                                  p.tokens_per_s(), clock_->WallMs()}),
          "progress");
    WatchProgress(p.job_id(), p.epoch(), p.step());
  }
  ArmQuiet(s, hb);
}

bool Daemon::TryQuietHeartbeat(WorkerSink* sink, const pb::WorkerMessage& msg) {
  if (!msg.has_heartbeat()) return false;
  const pb::Heartbeat& hb = msg.heartbeat();
  if (hb.progress_size() > 0 || hb.notice_ms() > 0) return false;  // each changes what ftd keeps
  thread_local std::string bytes;
  if (!hb.SerializeToString(&bytes)) return false;
  WorkerSink::Quiet& q = sink->quiet_;
  std::lock_guard<std::mutex> lock(q.mu);
  const int64_t now = clock_->MonotonicMs();
  if (!q.armed || now >= q.sample_due_mono || bytes != q.last_applied) return false;
  q.heard_mono = now;
  q.heard_credit = stall_credit_ms_.load();
  q.seen_wall_ms = clock_->WallMs();
  quiet_heartbeats_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Daemon::ArmQuiet(Session& s, const pb::Heartbeat& hb) {
  if (!s.sink) return;
  WorkerSink::Quiet& q = s.sink->quiet_;
  std::lock_guard<std::mutex> lock(q.mu);
  // An implausible report stays on the locked path (it is ignored there, and said once per change).
  q.armed = s.alive && s.memory_problem.empty() && hb.SerializeToString(&q.last_applied);
  q.sample_due_mono = hb.devices_size() == 0 ? std::numeric_limits<int64_t>::max()
                                             : s.last_memory_sample_mono + options_.memory_sample_ms;
}

void Daemon::FoldQuiet(Session& s) {
  WorkerSink::Quiet& q = s.sink->quiet_;
  // The newer hearing wins, with the stall credit of its own time (credit only grows).
  if (q.heard_mono != 0 && q.heard_mono >= s.last_message_mono) {
    s.last_message_mono = q.heard_mono;
    s.credit_at_message = q.heard_credit;
  }
  q.heard_mono = 0;
  s.seen_wall_ms = std::max(s.seen_wall_ms, q.seen_wall_ms);
  q.seen_wall_ms = 0;
}

void Daemon::AbsorbQuiet(Session& s, bool disarm) {
  std::lock_guard<std::mutex> lock(s.sink->quiet_.mu);
  FoldQuiet(s);
  if (disarm) s.sink->quiet_.armed = false;
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
  if (devices.size() > kMaxWorkerDevices) {
    return worker + " reports " + std::to_string(devices.size()) + " devices (at most " +
           std::to_string(kMaxWorkerDevices) + " per worker)";
  }
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

void Daemon::OnCheckpoint(const std::string& worker_id, Session& s, const pb::CheckpointCommitted& c) {
  const std::string what = "checkpoint step " + std::to_string(c.step());
  if (!IsCurrent(c.job_id(), c.epoch())) {
    Refuse(s.sink, c.job_id(), c.epoch(),
           "checkpoint from superseded epoch " + std::to_string(c.epoch()) + " refused");
    RefusalEvent(worker_id, s, c.job_id(), what + " from superseded epoch " + std::to_string(c.epoch()),
                 c.step());
    return;
  }
  if (!Accept(worker_id, s, what, c.job_id(), c.epoch(), 0, c.credential())) return;
  if (std::string outside = CheckpointOutsideOutput(c.job_id(), c.dir()); !outside.empty()) {
    RefusalEvent(worker_id, s, c.job_id(),
                 what + " from worker " + Quoted(worker_id) + " refused: " + outside, c.step());
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
    RefusalEvent(worker_id, s, c.job_id(), "checkpoint " + Quoted(c.dir()) + " does not verify", c.step());
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
  if (auto meta = running_meta_.find(c.job_id()); meta != running_meta_.end()) {
    meta->second.last_checkpoint_wall_ms = row.committed_ms;
  }
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

void Daemon::OnNote(const std::string& worker_id, Session& s, const pb::AttemptNote& n) {
  if (!IsCurrent(n.job_id(), n.epoch())) {
    Refuse(s.sink, n.job_id(), n.epoch(), "note from superseded epoch");
    return;
  }
  if (!Accept(worker_id, s, "note", n.job_id(), n.epoch(), 0, n.credential())) return;
  Event(n.job_id(), worker_id, n.kind(), n.message(), n.step());
}

void Daemon::OnExited(const std::string& worker_id, Session& s, const pb::AttemptExited& e) {
  if (!IsCurrent(e.job_id(), e.epoch())) {
    RefusalEvent(worker_id, s, e.job_id(), "exit report of superseded epoch " + std::to_string(e.epoch()),
                 e.step());
    return;
  }
  const std::string what = "exit report (" + pb::AttemptOutcome_Name(e.outcome()) + ")";
  if (!Accept(worker_id, s, what, e.job_id(), e.epoch(), e.rank(), e.credential())) return;
  ApplyExit(worker_id, s, e);
}

void Daemon::ApplyExit(const std::string& worker_id, Session& s, const pb::AttemptExited& e) {
  if (e.notice_ms() > 0) NoticeFor(e.job_id(), e.notice_ms());  // every rank's report too
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

void Daemon::OnMetrics(const std::string& worker_id, Session& s, const pb::MetricsReport& m) {
  if (!IsCurrent(m.job_id(), m.epoch())) {
    Refuse(s.sink, m.job_id(), m.epoch(), "metrics from superseded epoch");
    return;
  }
  if (!Accept(worker_id, s, "metrics", m.job_id(), m.epoch(), 0, m.credential())) return;
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
    // Names from the trainer: the store keeps the valid ones (KeepObjectiveMetrics).
    row.objective_metrics = {p.objective_metrics().begin(), p.objective_metrics().end()};
    rows.push_back(std::move(row));
  }
  std::vector<MetricRow> stored;
  const Status added = store_->AddMetrics(rows, &stored);
  Check(added, "add metrics");
  if (!added.ok()) return;
  // The first step after a preemption: the job has recovered (goodput's recovery time).
  if (auto it = interrupted_mono_.find(m.job_id()); it != interrupted_mono_.end() && !rows.empty()) {
    recovery_seconds_.Record(static_cast<double>(clock_->MonotonicMs() - it->second) / 1000.0);
    interrupted_mono_.erase(it);
  }
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
    p->mutable_objective_metrics()->insert(r.objective_metrics.begin(), r.objective_metrics.end());
    pending_updates_.push_back(std::move(u));
  }
}

void Daemon::OnLog(const std::string& worker_id, Session& s, const pb::LogReport& l) {
  if (!IsCurrent(l.job_id(), l.epoch())) {
    Refuse(s.sink, l.job_id(), l.epoch(), "logs from superseded epoch");
    return;
  }
  if (!Accept(worker_id, s, "log lines", l.job_id(), l.epoch(), l.rank(), l.credential())) return;
  auto path = LogPath(l.job_id());
  if (options_.data_dir.empty() || !path.ok()) return;  // no data dir: logs are not kept
  std::ofstream out(*path, std::ios::app);
  out << l.text();
  out.flush();
  if (out) {
    log_write_failing_.erase(l.job_id());
    return;
  }
  Count(DaemonError::kLogWrite);
  if (!log_write_failing_.insert(l.job_id()).second) return;  // said once until an append succeeds
  const std::string why = "cannot append the worker's log lines to " + *path +
                          " (lines are dropped until it can); check that ftd's --data-dir/logs is writable "
                          "and has free space";
  FT_LOG(ERROR) << "job " << l.job_id() << ": " << why;
  Event(l.job_id(), "", "log_write_failed", why, 0);
}

void Daemon::Heard(Session& s) {
  s.last_message_mono = clock_->MonotonicMs();
  s.credit_at_message = stall_credit_ms_.load();
}

void Daemon::CreditStall(int64_t since_mono) {
  const int64_t held = clock_->MonotonicMs() - since_mono;
  if (held <= options_.stall_credit_after_ms) return;
  // Messages that arrived meanwhile waited for the lock: the time is ftd's, not the workers'.
  stall_credit_ms_ += held;
  FT_LOG(WARN) << "ftd stalled: its lock was held " << held
               << " ms (a slow database commit or a long tick); every worker's lease is extended by as much";
}

bool Daemon::LeaseRunOut(Session& s, int64_t now, int64_t credit_now, int64_t* silent, int64_t* ftd_stalled) {
  std::unique_lock<std::mutex> quiet;
  if (s.sink) {
    quiet = std::unique_lock<std::mutex>(s.sink->quiet_.mu);
    FoldQuiet(s);
  }
  // A message that reached ftd and waits for this lock counts as heard.
  const int64_t heard = std::max(s.last_message_mono, s.sink ? s.sink->arrived_mono_ms.load() : int64_t{0});
  *silent = now - heard;
  *ftd_stalled = credit_now - s.credit_at_message;
  if (*silent - *ftd_stalled <= options_.lease_ms) return false;
  // In the same hold: a quiet heartbeat after this takes the locked path and announces the worker back.
  if (s.sink) s.sink->quiet_.armed = false;
  return true;
}

void Daemon::ExpireLeases() {
  const int64_t now = clock_->MonotonicMs();
  const int64_t credit_now = stall_credit_ms_.load();
  for (auto& [id, s] : sessions_) {
    int64_t silent = 0, ftd_stalled = 0;
    if (!s.alive || !LeaseRunOut(s, now, credit_now, &silent, &ftd_stalled)) continue;
    s.alive = false;
    s.seen_wall_ms = 0;
    Check(store_->SetWorkerAlive(id, false, clock_->WallMs()), "worker lost");
    Event("", id, "worker_lost",
          "no message from worker " + id + " for " + std::to_string(silent / 1000) + " s" +
              (ftd_stalled > 0
                   ? " (ftd's own stalls of " + std::to_string(ftd_stalled / 1000) + " s not counted)"
                   : ""),
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

int64_t Daemon::CheckpointStopMs(const Session& s) {
  const double ckpt_s =
      s.checkpoint_seconds > 0 ? s.checkpoint_seconds : EstimateCheckpointSeconds(s.running_job);
  return static_cast<int64_t>(1.5 * ckpt_s * 1000);
}

void Daemon::StopForSlotEnds() {
  const int64_t now = clock_->WallMs();
  for (auto& [id, s] : sessions_) {
    if (!s.alive || !s.sink || s.slot_end_ms <= 0 || s.running_job.empty() || s.stop_sent) continue;
    if (now < s.slot_end_ms - CheckpointStopMs(s) - options_.checkpoint_margin_ms) continue;
    SendStop(s, std::max<int64_t>(1000, s.slot_end_ms - now), "slot end");
    s.stop_sent = true;
    s.draining = true;
    Event(s.running_job, id, "slot_end", "worker " + id + "'s slot ends: checkpoint and stop", 0);
  }
}

}  // namespace ft
