// The daemon's events and live updates: events stored and published to
// subscribers after the daemon's lock is released, in order.
#include <filesystem>

#include "common/logging.h"
#include "daemon/daemon.h"
#include "daemon/daemon_internal.h"

namespace ft {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

namespace daemon_internal {

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

}  // namespace daemon_internal

using daemon_internal::ToProtoEvent;

void Daemon::ReleaseAndPublish(Held& lock) {
  std::vector<pb::JobUpdate> updates;
  updates.swap(pending_updates_);
  // Taken before mu_ is released: updates made under mu_ by two threads reach
  // subscribers in the order they were made (event seqs never go backwards).
  std::lock_guard<std::mutex> publishing(publish_mu_);
  lock.Unlock();
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

}  // namespace ft
