#include "worker/session.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <random>

#include "common/logging.h"

namespace ft::worker {

namespace {

using Clock = std::chrono::steady_clock;
using ftune::v1::DaemonCommand;
using ftune::v1::WorkerMessage;

// Pings only every 5 minutes: a gRPC server's default ping policy rejects
// more frequent pings on a stream it sends nothing on (the daemon rarely does).
constexpr int kKeepaliveMs = 300'000;
constexpr int kKeepaliveTimeoutMs = 20'000;
constexpr auto kCloseWait = std::chrono::seconds(2);  // for the daemon to end a half-closed stream

bool IsCritical(const WorkerMessage& m) { return m.has_checkpoint() || m.has_exited(); }
bool IsDroppable(const WorkerMessage& m) { return m.has_metrics() || m.has_log(); }

// The daemon refused the registration itself: trying again at once would be refused the same way.
bool RegistrationRefused(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
         status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
         status.error_code() == grpc::StatusCode::INVALID_ARGUMENT;
}

bool ForAttempt(const WorkerMessage& m, const std::string& job_id, int64_t epoch) {
  switch (m.msg_case()) {
    case WorkerMessage::kCheckpoint:
      return m.checkpoint().job_id() == job_id && m.checkpoint().epoch() == epoch;
    case WorkerMessage::kExited: return m.exited().job_id() == job_id && m.exited().epoch() == epoch;
    case WorkerMessage::kMetrics: return m.metrics().job_id() == job_id && m.metrics().epoch() == epoch;
    case WorkerMessage::kLog: return m.log().job_id() == job_id && m.log().epoch() == epoch;
    default: return false;
  }
}

}  // namespace

Session::Session(SessionOptions options, SessionDelegate* delegate)
    : options_(std::move(options)), delegate_(delegate), heartbeat_(options_.default_heartbeat) {
  NewChannel();
}

void Session::NewChannel() {
  grpc::ChannelArguments args;
  // gRPC's own reconnect backoff (default up to 2 minutes) would hold back ours.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(options_.backoff_initial.count()));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(options_.backoff_initial.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(options_.backoff_max.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  channel_ = grpc::CreateCustomChannel(
      options_.target, options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(),
      args);
  stub_ = ftune::v1::Workers::NewStub(channel_);
}

Session::~Session() { Shutdown(std::chrono::milliseconds(0)); }

void Session::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = true;
  thread_ = std::thread([this] { Run(); });
}

void Session::Send(WorkerMessage message) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool critical = IsCritical(message);
  Enqueue({std::move(message), critical, {}}, /*front=*/false);
  cv_.notify_all();
}

void Session::DropQueued(const std::string& job_id, int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto match = [&](const Queued& q) { return ForAttempt(q.message, job_id, epoch); };
  std::erase_if(queue_, match);
  std::erase_if(recent_, match);
}

bool Session::registered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registered_;
}

int64_t Session::registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registrations_;
}

int64_t Session::lease_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lease_ms_;
}

bool Session::Shutdown(std::chrono::milliseconds flush_timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!thread_.joinable()) return queue_.empty();
  const bool flushed = cv_.wait_for(lock, flush_timeout, [this] { return queue_.empty() && !writing_; });
  closing_ = true;  // the writer half-closes; the daemon then ends the stream
  cv_.notify_all();
  if (!cv_.wait_for(lock, kCloseWait, [this] { return !running_; }) && context_ != nullptr) {
    context_->TryCancel();
  }
  lock.unlock();
  thread_.join();
  return flushed;
}

void Session::Enqueue(Queued q, bool front) {
  if (front) {
    queue_.push_front(std::move(q));
  } else {
    queue_.push_back(std::move(q));
  }
  if (queue_.size() <= options_.max_queued) return;
  auto it =
      std::find_if(queue_.begin(), queue_.end(), [](const Queued& x) { return IsDroppable(x.message); });
  if (it == queue_.end()) return;
  queue_.erase(it);
  if (dropped_++ % 1000 == 0) {
    FT_LOG(WARN) << "session: report queue full (" << queue_.size() << "); dropping the oldest metrics/logs";
  }
}

void Session::RequeueRecent() {
  const auto oldest = Clock::now() - options_.resend_window;
  while (!recent_.empty()) {
    Queued q = std::move(recent_.back());
    recent_.pop_back();
    if (q.written >= oldest) queue_.push_front(std::move(q));
  }
}

std::chrono::milliseconds Session::Backoff(int failures, std::chrono::milliseconds initial,
                                           std::chrono::milliseconds max) {
  thread_local std::minstd_rand rng(std::random_device{}());
  int64_t ms = initial.count();
  for (int i = 0; i < failures && ms < max.count(); ++i) ms *= 2;
  ms = std::min<int64_t>(ms, max.count());
  std::uniform_int_distribution<int64_t> jitter(ms / 2, ms);
  return std::chrono::milliseconds(jitter(rng));
}

void Session::Run() {
  int failures = 0, refusals = 0;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) break;
    }
    grpc::Status status;
    const bool registered = RunStream(&status);
    const bool refused = !registered && RegistrationRefused(status);
    failures = registered ? 0 : failures + 1;
    refusals = refused ? refusals + 1 : 0;
    // A channel whose connects failed keeps gRPC's own backoff state and can
    // fail new streams fast for seconds after the daemon is back (seen: 4 s
    // after a restart, past a 3 s lease); the next try gets a fresh channel.
    if (!registered) NewChannel();
    const auto wait =
        refused ? Backoff(refusals - 1, options_.refused_backoff_initial, options_.refused_backoff_max)
                : Backoff(failures, options_.backoff_initial, options_.backoff_max);
    LogStreamEnd(registered, status, failures, wait);
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, wait, [this] { return closing_; })) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
  cv_.notify_all();
}

void Session::LogStreamEnd(bool registered, const grpc::Status& status, int failures,
                           std::chrono::milliseconds wait) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
  }
  const std::string why = status.ok() ? "the daemon closed it" : status.error_message();
  if (!registered && RegistrationRefused(status)) {  // e.g. another ft-worker holds this --id
    FT_LOG(ERROR) << "the daemon at " << options_.target << " refused this worker's registration: " << why
                  << "; trying again in " << wait.count() / 1000.0 << " s";
    return;
  }
  if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {  // a newer session of this worker took over
    FT_LOG(ERROR) << "the daemon at " << options_.target << " replaced this worker's session: " << why
                  << "; reconnecting";
    return;
  }
  if (registered) {
    FT_LOG(WARN) << "session with " << options_.target << " ended: " << why << "; reconnecting";
    return;
  }
  const bool denied = status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                      status.error_code() == grpc::StatusCode::PERMISSION_DENIED;
  // The first failure and then one in 20, so a long outage does not flood the log.
  if (failures != 1 && failures % 20 != 0) {
    FT_LOG(DEBUG) << "cannot open a session with " << options_.target << ": " << why;
  } else if (denied) {
    FT_LOG(ERROR) << "the daemon at " << options_.target << " refused this worker (check --token): " << why;
  } else {
    FT_LOG(WARN) << "cannot open a session with " << options_.target << " (" << failures
                 << " tries; retrying): " << why;
  }
}

bool Session::RunStream(grpc::Status* status) {
  grpc::ClientContext context;
  if (!options_.token.empty()) context.AddMetadata("authorization", "Bearer " + options_.token);
  std::unique_ptr<Stream> stream = stub_->Session(&context);
  {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = &context;
    stream_done_ = false;
    registered_ = false;
  }
  WorkerMessage reg;
  *reg.mutable_register_() = delegate_->MakeRegister();
  bool got_registered = false;
  std::thread writer;
  if (stream->Write(reg)) {
    writer = std::thread([&] { WriteLoop(stream.get(), &context); });
    DaemonCommand command;
    while (stream->Read(&command)) {
      if (command.has_registered()) {
        HandleRegistered(command.registered());
        delegate_->OnRegistered();
        got_registered = true;
      } else if (command.has_reregister()) {
        // Ending the stream makes Run open the next one with a fresh Register.
        FT_LOG(INFO) << "the daemon asks this worker to register again: " << command.reregister().reason();
        context.TryCancel();
      } else {
        delegate_->OnCommand(command);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream_done_ = true;
    registered_ = false;
  }
  cv_.notify_all();
  if (writer.joinable()) writer.join();
  *status = stream->Finish();
  std::lock_guard<std::mutex> lock(mu_);
  context_ = nullptr;
  if (!closing_) RequeueRecent();
  return got_registered;
}

void Session::HandleRegistered(const ftune::v1::Registered& r) {
  std::lock_guard<std::mutex> lock(mu_);
  registered_ = true;
  ++registrations_;
  lease_ms_ = r.lease_ms();
  heartbeat_ =
      r.heartbeat_ms() > 0 ? std::chrono::milliseconds(r.heartbeat_ms()) : options_.default_heartbeat;
  FT_LOG(INFO) << "registered with " << options_.target << " (heartbeat " << heartbeat_.count()
               << " ms, lease " << lease_ms_ << " ms, " << queue_.size() << " reports queued)";
  cv_.notify_all();
}

void Session::WriteLoop(Stream* stream, grpc::ClientContext* context) {
  const auto register_deadline = Clock::now() + options_.register_timeout;
  auto next_heartbeat = Clock::time_point::max();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stream_done_) {
    const auto now = Clock::now();
    if (!registered_) {
      if (now >= register_deadline || closing_) {
        if (!closing_) FT_LOG(WARN) << "no Registered from " << options_.target << "; reconnecting";
        context->TryCancel();
        return;
      }
      cv_.wait_until(lock, register_deadline, [this] { return stream_done_ || registered_ || closing_; });
      continue;
    }
    if (next_heartbeat == Clock::time_point::max()) next_heartbeat = now;  // the first right away
    if (!queue_.empty()) {
      Queued q = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      const bool ok = stream->Write(q.message);
      lock.lock();
      writing_ = false;
      if (!ok) {
        Enqueue(std::move(q), /*front=*/true);
        context->TryCancel();
        cv_.notify_all();
        return;
      }
      if (q.critical) {
        const auto written = Clock::now();
        q.written = written;
        recent_.push_back(std::move(q));
        while (recent_.front().written < written - options_.resend_window) recent_.pop_front();
      }
      cv_.notify_all();  // Shutdown waits for an empty queue
      continue;
    }
    if (closing_) {
      lock.unlock();
      stream->WritesDone();
      return;
    }
    if (now >= next_heartbeat) {
      lock.unlock();
      WorkerMessage hb;
      *hb.mutable_heartbeat() = delegate_->MakeHeartbeat();
      const bool ok = stream->Write(hb);
      lock.lock();
      if (!ok) {
        context->TryCancel();
        return;
      }
      next_heartbeat = Clock::now() + heartbeat_;
      continue;
    }
    cv_.wait_until(lock, next_heartbeat, [this] { return stream_done_ || closing_ || !queue_.empty(); });
  }
}

}  // namespace ft::worker
