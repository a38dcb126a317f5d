#include "daemon/grpc_service.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "common/ids.h"
#include "common/logging.h"
#include "common/secret.h"
#include "common/untrusted_text.h"
#include "daemon/grpc_status.h"

namespace ft {

namespace pb = ftune::v1;

namespace {

bool Authorised(const grpc::CallbackServerContext* ctx, const std::string& token) {
  if (token.empty()) return true;
  auto it = ctx->client_metadata().find("authorization");
  return it != ctx->client_metadata().end() &&
         SecretEquals(std::string_view(it->second.data(), it->second.size()), "Bearer " + token);
}

const grpc::Status kUnauthenticated(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token");

// The client a call comes from, for the per-client stream cap: its address without the port
// ("ipv4:10.0.0.7", "ipv6:[::1]"); other transports are one client each ("unix").
std::string ClientOf(const grpc::CallbackServerContext* ctx) {
  const std::string peer = ctx->peer();
  if (peer.rfind("ipv4:", 0) == 0 || peer.rfind("ipv6:", 0) == 0) return peer.substr(0, peer.rfind(':'));
  return peer.substr(0, peer.find(':'));
}

// Counts each client's open Watch and Logs streams. Thread-safe.
class StreamCounter {
 public:
  explicit StreamCounter(int cap) : cap_(cap) {}
  // One more stream of `client`; false (nothing counted) when it holds the cap already.
  bool Acquire(const std::string& client) {
    std::lock_guard<std::mutex> lock(mu_);
    int& n = open_[client];
    if (n >= cap_) return false;
    ++n;
    return true;
  }
  void Release(const std::string& client) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(client);
    if (it != open_.end() && --it->second <= 0) open_.erase(it);
  }
  int cap() const { return cap_; }

 private:
  const int cap_;
  std::mutex mu_;
  std::map<std::string, int> open_;  // GUARDED_BY(mu_) client → its open streams
};

// One counted stream: released when the reactor holding it is deleted (after OnDone).
class StreamSlot {
 public:
  StreamSlot(std::shared_ptr<StreamCounter> counter, std::string client)
      : counter_(std::move(counter)), client_(std::move(client)) {}
  ~StreamSlot() { counter_->Release(client_); }
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;

 private:
  std::shared_ptr<StreamCounter> counter_;
  std::string client_;
};

// Commands queued for one worker's stream at most (count, bytes): past either the session is closed.
constexpr size_t kMaxQueuedCommands = 1'000;
constexpr size_t kMaxQueuedBytes = size_t{4} << 20;

// One worker's session: reads its messages into the daemon, writes the daemon's commands.
// Commands wait in out_ while the transport cannot take them (the worker does not read, or
// reads slower than ftd sends); a worker that leaves more than kMaxQueuedCommands or
// kMaxQueuedBytes unread has its session closed with RESOURCE_EXHAUSTED and a WARN, so one
// stuck worker cannot grow ftd's memory without bound. Its lease keeps running; ft-worker
// reconnects and registers again, as after any ended stream.
class SessionReactor : public grpc::ServerBidiReactor<pb::WorkerMessage, pb::DaemonCommand>,
                       public WorkerSink {
 public:
  SessionReactor(Daemon* daemon, grpc::CallbackServerContext* ctx, const AuthOptions& auth)
      : daemon_(daemon) {
    if (!Authorised(ctx, auth.worker_token)) {
      Finish(kUnauthenticated);
      return;
    }
    StartRead(&in_);
  }

  void Send(const pb::DaemonCommand& cmd) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    const size_t bytes = cmd.ByteSizeLong();
    if (out_.size() >= kMaxQueuedCommands || out_bytes_ + bytes > kMaxQueuedBytes) return Overflow();
    out_.push_back({cmd, bytes});
    out_bytes_ += bytes;
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front().cmd);
    }
  }

  void Evict(const std::string& reason) override {
    // Called with the daemon's lock held: no call back into it (OnDone's
    // OnDisconnect finds another session under this id and changes nothing).
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    Finish(grpc::Status(grpc::StatusCode::ALREADY_EXISTS, reason));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Close(grpc::Status::OK);
      return;
    }
    arrived_mono_ms = daemon_->MonotonicMs();  // before it waits for the daemon's lock
    if (worker_id_.empty()) {
      if (in_.msg_case() != pb::WorkerMessage::kRegister) {
        Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message must be register"));
        return;
      }
      worker_id_ = in_.register_().worker_id();
      Status s = daemon_->OnRegister(in_.register_(), this);
      if (!s.ok()) {
        Close(ToGrpcStatus(s));
        return;
      }
    } else {
      daemon_->OnWorkerMessage(worker_id_, this, in_);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;  // evicted: the stream is ending
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_bytes_ -= out_.front().bytes;
    out_.pop_front();
    if (ok && !out_.empty() && !finished_) {
      StartWrite(&out_.front().cmd);
    } else {
      writing_ = false;
    }
  }

  void OnDone() override {
    if (!worker_id_.empty()) daemon_->OnDisconnect(worker_id_, this);
    delete this;
  }

 private:
  // Send's cap was reached. REQUIRES: mu_ held, !finished_. Like Evict: called with the daemon's
  // lock held, so no call back into it (OnDone, whose OnDisconnect takes that lock, is never run
  // inline by Finish: this reactor is not inlineable).
  void Overflow() {
    finished_ = true;
    const std::string why = "ftd closed this session: its worker left " + std::to_string(out_.size()) +
                            " commands (" + std::to_string(out_bytes_) +
                            " bytes) unread; the worker should reconnect and register again";
    FT_LOG(WARN) << "worker " << EscapeControlChars(worker_id_, 128) << ": " << why;
    Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, why));
  }

  void Close(const grpc::Status& status) {
    if (!worker_id_.empty()) daemon_->OnDisconnect(worker_id_, this);  // no Send after this returns
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  Daemon* daemon_;
  std::string worker_id_;
  pb::WorkerMessage in_;
  std::mutex mu_;
  struct Queued {
    pb::DaemonCommand cmd;
    size_t bytes;
  };
  std::deque<Queued> out_;  // GUARDED_BY(mu_); front is being written while writing_
  size_t out_bytes_ = 0;    // GUARDED_BY(mu_) of out_
  bool writing_ = false;    // GUARDED_BY(mu_)
  bool finished_ = false;   // GUARDED_BY(mu_)
};

// Watch: replays events after `after_seq`, then streams live updates until the client leaves.
class WatchReactor : public grpc::ServerWriteReactor<pb::JobUpdate> {
 public:
  WatchReactor(Daemon* daemon, const pb::WatchRequest& req, std::unique_ptr<StreamSlot> slot)
      : daemon_(daemon), slot_(std::move(slot)) {
    subscription_ = daemon_->Subscribe(req.job_id(), [this](const pb::JobUpdate& u) { Enqueue(u); });
    pb::ListEventsRequest past;
    past.set_job_id(req.job_id());
    past.set_after_seq(req.after_seq());
    auto events = daemon_->ListEvents(past);
    if (events.ok()) {
      for (const pb::Event& e : events->events()) {
        pb::JobUpdate u;
        u.set_job_id(e.job_id());
        *u.mutable_event() = e;
        Enqueue(u);
      }
    }
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_.pop_front();
    if (!ok) {
      writing_ = false;
      return;
    }
    if (!out_.empty()) {
      StartWrite(&out_.front());
    } else {
      writing_ = false;
    }
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }
  void OnDone() override {
    daemon_->Unsubscribe(subscription_);
    delete this;
  }

 private:
  void Enqueue(const pb::JobUpdate& u) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || out_.size() > 10'000)
      return;  // a stalled client drops live updates, never blocks the daemon
    out_.push_back(u);
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }

  Daemon* daemon_;
  std::unique_ptr<StreamSlot> slot_;
  int64_t subscription_ = 0;
  std::mutex mu_;
  std::deque<pb::JobUpdate> out_;  // GUARDED_BY(mu_)
  bool writing_ = false;           // GUARDED_BY(mu_)
  bool finished_ = false;          // GUARDED_BY(mu_)
};

// Logs: the job's log file, then (follow) new lines until the client leaves or the job ends.
class LogsReactor : public grpc::ServerWriteReactor<pb::LogChunk> {
 public:
  LogsReactor(Daemon* daemon, const pb::LogsRequest& req, std::unique_ptr<StreamSlot> slot)
      : daemon_(daemon), slot_(std::move(slot)), req_(req) {
    thread_ = std::thread([this] { Run(); });
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    write_ok_ = ok;
    writing_ = false;
    cv_.notify_all();
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    cancelled_ = true;
    // OnDone may run inline on the thread that called Finish: never join oneself.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    delete this;
  }

 private:
  void Run() {
    auto log_path = daemon_->LogPath(req_.job_id());  // Logs() checked the id; this refuses a bad one too
    if (!log_path.ok()) {
      Finish(ToGrpcStatus(log_path.status()));
      return;
    }
    const std::string path = *log_path;
    std::streamoff pos = 0;
    while (!cancelled_) {
      std::ifstream in(path, std::ios::binary);
      if (in) {
        in.seekg(pos);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        pos += static_cast<std::streamoff>(text.size());
        if (!text.empty() && !Write(text)) break;
      }
      if (!req_.follow() || JobEnded()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    Finish(grpc::Status::OK);
  }
  bool JobEnded() {
    auto j = daemon_->GetJob(req_.job_id());
    if (!j.ok()) return true;
    return j->state() == pb::SUCCEEDED || j->state() == pb::FAILED || j->state() == pb::CANCELLED;
  }
  bool Write(const std::string& text) {
    std::unique_lock<std::mutex> lock(mu_);
    chunk_.set_text(text);
    writing_ = true;
    StartWrite(&chunk_);
    cv_.wait(lock, [&] { return !writing_; });
    return write_ok_;
  }

  Daemon* daemon_;
  std::unique_ptr<StreamSlot> slot_;
  pb::LogsRequest req_;
  std::thread thread_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  pb::LogChunk chunk_;
  bool writing_ = false;  // GUARDED_BY(mu_)
  bool write_ok_ = true;  // GUARDED_BY(mu_)
};

class JobsService : public pb::Jobs::CallbackService {
 public:
  JobsService(Daemon* daemon, AuthOptions auth)
      : daemon_(daemon),
        auth_(std::move(auth)),
        streams_(std::make_shared<StreamCounter>(auth_.max_streams_per_client)) {}

  template <typename Reply, typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Reply* reply, Fn fn) {
    auto* reactor = ctx->DefaultReactor();
    if (!Authorised(ctx, auth_.client_token)) {
      reactor->Finish(kUnauthenticated);
      return reactor;
    }
    auto result = fn();
    if (result.ok()) *reply = std::move(result).value();
    reactor->Finish(ToGrpcStatus(result.status()));
    return reactor;
  }

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const pb::SubmitRequest* req,
                                   pb::SubmitReply* reply) override {
    return Unary(ctx, reply, [&] { return daemon_->Submit(*req); });
  }
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const pb::GetJobRequest* req,
                                pb::Job* reply) override {
    return Unary(ctx, reply, [&]() -> StatusOr<pb::Job> {
      FT_RETURN_IF_ERROR(CheckJobId(req->id(), "id"));
      return daemon_->GetJob(req->id());
    });
  }
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const pb::ListJobsRequest* req,
                                 pb::ListJobsReply* reply) override {
    return Unary(ctx, reply, [&] { return daemon_->ListJobs(*req); });
  }
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx, const pb::CancelRequest* req,
                                   pb::Job* reply) override {
    return Unary(ctx, reply, [&]() -> StatusOr<pb::Job> {
      FT_RETURN_IF_ERROR(CheckJobId(req->id(), "id"));
      return daemon_->Cancel(req->id());
    });
  }
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx, const pb::ListWorkersRequest*,
                                        pb::ListWorkersReply* reply) override {
    return Unary(ctx, reply, [&] { return daemon_->ListWorkers(); });
  }
  grpc::ServerUnaryReactor* ListEvents(grpc::CallbackServerContext* ctx, const pb::ListEventsRequest* req,
                                       pb::ListEventsReply* reply) override {
    return Unary(ctx, reply, [&]() -> StatusOr<pb::ListEventsReply> {
      if (!req->job_id().empty()) FT_RETURN_IF_ERROR(CheckJobId(req->job_id(), "job_id"));
      return daemon_->ListEvents(*req);
    });
  }
  grpc::ServerWriteReactor<pb::JobUpdate>* Watch(grpc::CallbackServerContext* ctx,
                                                 const pb::WatchRequest* req) override {
    if (!Authorised(ctx, auth_.client_token)) return Refuse<pb::JobUpdate>(kUnauthenticated);
    if (!req->job_id().empty()) {  // "" = every job
      if (Status bad = CheckJobId(req->job_id(), "job_id"); !bad.ok())
        return Refuse<pb::JobUpdate>(ToGrpcStatus(bad));
    }
    auto slot = Slot(ctx);
    if (!slot) return Refuse<pb::JobUpdate>(StreamsExhausted(ctx));
    return new WatchReactor(daemon_, *req, std::move(slot));
  }
  grpc::ServerWriteReactor<pb::LogChunk>* Logs(grpc::CallbackServerContext* ctx,
                                               const pb::LogsRequest* req) override {
    if (!Authorised(ctx, auth_.client_token)) return Refuse<pb::LogChunk>(kUnauthenticated);
    if (Status bad = CheckJobId(req->job_id(), "job_id"); !bad.ok())
      return Refuse<pb::LogChunk>(ToGrpcStatus(bad));
    if (auto job = daemon_->GetJob(req->job_id()); !job.ok())
      return Refuse<pb::LogChunk>(ToGrpcStatus(job.status()));
    auto slot = Slot(ctx);
    if (!slot) return Refuse<pb::LogChunk>(StreamsExhausted(ctx));
    return new LogsReactor(daemon_, *req, std::move(slot));
  }

 private:
  // A counted stream of the caller's client, or null at its cap.
  std::unique_ptr<StreamSlot> Slot(const grpc::CallbackServerContext* ctx) {
    std::string client = ClientOf(ctx);
    if (!streams_->Acquire(client)) return nullptr;
    return std::make_unique<StreamSlot>(streams_, std::move(client));
  }
  grpc::Status StreamsExhausted(const grpc::CallbackServerContext* ctx) {
    const std::string client = EscapeControlChars(ClientOf(ctx), 128);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "this client (" + client + ") already holds " + std::to_string(streams_->cap()) +
                            " open Watch/Logs streams, ftd's cap per client; close some (each `ftctl watch` "
                            "or `ftctl logs -f` holds one)");
  }

  // A stream answered with `status` alone.
  template <typename T>
  static grpc::ServerWriteReactor<T>* Refuse(const grpc::Status& status) {
    class Refuser : public grpc::ServerWriteReactor<T> {
     public:
      explicit Refuser(const grpc::Status& s) { this->Finish(s); }
      void OnDone() override { delete this; }
    };
    return new Refuser(status);
  }

  Daemon* daemon_;
  AuthOptions auth_;
  std::shared_ptr<StreamCounter> streams_;
};

class WorkersService : public pb::Workers::CallbackService {
 public:
  WorkersService(Daemon* daemon, AuthOptions auth) : daemon_(daemon), auth_(std::move(auth)) {}
  grpc::ServerBidiReactor<pb::WorkerMessage, pb::DaemonCommand>* Session(
      grpc::CallbackServerContext* ctx) override {
    return new SessionReactor(daemon_, ctx, auth_);
  }

 private:
  Daemon* daemon_;
  AuthOptions auth_;
};

}  // namespace

std::unique_ptr<pb::Jobs::CallbackService> MakeJobsService(Daemon* daemon, AuthOptions auth) {
  return std::make_unique<JobsService>(daemon, std::move(auth));
}

std::unique_ptr<pb::Workers::CallbackService> MakeWorkersService(Daemon* daemon, AuthOptions auth) {
  return std::make_unique<WorkersService>(daemon, std::move(auth));
}

}  // namespace ft
