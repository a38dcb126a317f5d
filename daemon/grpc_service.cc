#include "daemon/grpc_service.h"

#include <algorithm>
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
#include "common/split.h"
#include "common/untrusted_text.h"
#include "daemon/authorization.h"
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

// The bearer token a call carries ("" when none).
std::string_view BearerToken(const grpc::CallbackServerContext* ctx) {
  auto it = ctx->client_metadata().find("authorization");
  if (it == ctx->client_metadata().end()) return {};
  const std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "Bearer ";
  return value.substr(0, kBearer.size()) == kBearer ? value.substr(kBearer.size()) : std::string_view();
}

// One call's identity, and the refusal Authorize gave it (the call then answers PERMISSION_DENIED).
struct Call {
  Identity who;
  std::optional<std::string> denied;
  // OK when `who` may; else records the refusal and returns it as an error to stop the handler.
  Status Check(Action action, std::string_view job_team = {}, std::string_view job_id = {}) {
    Decision d = Authorize(who, action, job_team, job_id);
    if (d.allowed) return Status::OK();
    FT_LOG(INFO) << "grpc: refused: " << EscapeControlChars(d.reason, 512);
    denied = d.reason;
    return Status::FailedPrecondition(d.reason);
  }
  Actor actor() const { return {who.user, who.team}; }
};

// Whether a live update may go to a stream limited to `scope`; `teams` caches each job's team
// (a job's team never changes).
bool Visible(const pb::JobUpdate& u, const TeamScope& scope, Store& store,
             std::map<std::string, std::string>* teams) {
  if (!scope) return true;
  if (u.job_id().empty()) return !(u.has_event() && u.event().kind().rfind("user_", 0) == 0);
  if (u.has_job()) return u.job().team() == *scope;
  auto it = teams->find(u.job_id());
  if (it == teams->end()) {
    auto job = store.GetJob(u.job_id());
    if (!job.ok()) return false;
    it = teams->emplace(u.job_id(), job->team).first;
  }
  return it->second == *scope;
}

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
  // `scope`: only updates of that team's jobs (and worker events); nullopt = every job's.
  WatchReactor(Daemon* daemon, const pb::WatchRequest& req, std::unique_ptr<StreamSlot> slot, TeamScope scope)
      : daemon_(daemon), slot_(std::move(slot)), scope_(std::move(scope)) {
    subscription_ = daemon_->Subscribe(req.job_id(), [this](const pb::JobUpdate& u) { Enqueue(u); });
    pb::ListEventsRequest past;
    past.set_job_id(req.job_id());
    past.set_after_seq(req.after_seq());
    auto events = daemon_->ListEvents(past, scope_);
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
    if (!Visible(u, scope_, daemon_->store(), &teams_)) return;
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
  const TeamScope scope_;
  int64_t subscription_ = 0;
  std::mutex mu_;
  std::map<std::string, std::string> teams_;  // GUARDED_BY(mu_) job id → its team (Visible)
  std::deque<pb::JobUpdate> out_;             // GUARDED_BY(mu_)
  bool writing_ = false;                      // GUARDED_BY(mu_)
  bool finished_ = false;                     // GUARDED_BY(mu_)
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
        authenticator_(&daemon->store(), auth_.client_token, auth_.view_token, auth_.tokens_file),
        streams_(std::make_shared<StreamCounter>(auth_.max_streams_per_client)) {}

  // Runs fn(call) for an authenticated caller: UNAUTHENTICATED without one, PERMISSION_DENIED
  // when fn's Call::Check refused. `for_action`: a state change (the view token is no identity).
  template <typename Reply, typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Reply* reply, Fn fn,
                                  bool for_action = false) {
    auto* reactor = ctx->DefaultReactor();
    std::optional<Identity> who = authenticator_.Resolve(BearerToken(ctx), for_action);
    if (!who) {
      reactor->Finish(kUnauthenticated);
      return reactor;
    }
    Call call{*who, std::nullopt};
    auto result = fn(call);
    if (call.denied) {
      reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, *call.denied));
      return reactor;
    }
    if (result.ok()) *reply = std::move(result).value();
    reactor->Finish(ToGrpcStatus(result.status()));
    return reactor;
  }

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const pb::SubmitRequest* req,
                                   pb::SubmitReply* reply) override {
    return Unary(
        ctx, reply,
        [&](Call& call) -> StatusOr<pb::SubmitReply> {
          FT_RETURN_IF_ERROR(call.Check(Action::kSubmit));
          return daemon_->Submit(*req, call.actor());
        },
        true);
  }
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const pb::GetJobRequest* req,
                                pb::Job* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::Job> {
      FT_RETURN_IF_ERROR(CheckJobId(req->id(), "id"));
      FT_ASSIGN_OR_RETURN(pb::Job job, daemon_->GetJob(req->id()));
      FT_RETURN_IF_ERROR(call.Check(Action::kReadJob, job.team(), job.id()));
      return job;
    });
  }
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const pb::ListJobsRequest* req,
                                 pb::ListJobsReply* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::ListJobsReply> {
      FT_RETURN_IF_ERROR(call.Check(Action::kListJobs));
      return daemon_->ListJobs(*req, call.who.scope());
    });
  }
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx, const pb::CancelRequest* req,
                                   pb::Job* reply) override {
    return Unary(
        ctx, reply,
        [&](Call& call) -> StatusOr<pb::Job> {
          FT_RETURN_IF_ERROR(CheckOnJob(call, Action::kCancel, req->id(), "id"));
          return daemon_->Cancel(req->id(), call.actor());
        },
        true);
  }
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx, const pb::ListWorkersRequest*,
                                        pb::ListWorkersReply* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::ListWorkersReply> {
      FT_RETURN_IF_ERROR(call.Check(Action::kReadWorkers));
      return daemon_->ListWorkers();
    });
  }
  grpc::ServerUnaryReactor* ListEvents(grpc::CallbackServerContext* ctx, const pb::ListEventsRequest* req,
                                       pb::ListEventsReply* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::ListEventsReply> {
      if (!req->job_id().empty()) {
        FT_RETURN_IF_ERROR(CheckOnJob(call, Action::kReadJob, req->job_id(), "job_id"));
      } else {
        FT_RETURN_IF_ERROR(call.Check(Action::kListJobs));
      }
      return daemon_->ListEvents(*req, call.who.scope());
    });
  }
  grpc::ServerUnaryReactor* AddUser(grpc::CallbackServerContext* ctx, const pb::AddUserRequest* req,
                                    pb::UserTokenReply* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::UserTokenReply> {
      FT_RETURN_IF_ERROR(call.Check(Action::kManageUsers));
      FT_ASSIGN_OR_RETURN(std::string token,
                          daemon_->AddUser(call.actor(), req->name(), req->team(), req->role()));
      return TokenReply(req->name(), std::move(token));
    });
  }
  grpc::ServerUnaryReactor* RemoveUser(grpc::CallbackServerContext* ctx, const pb::UserRequest* req,
                                       pb::User* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::User> {
      FT_RETURN_IF_ERROR(call.Check(Action::kManageUsers));
      FT_ASSIGN_OR_RETURN(pb::User user, FindUser(req->name()));
      FT_RETURN_IF_ERROR(daemon_->RemoveUser(call.actor(), req->name()));
      return user;
    });
  }
  grpc::ServerUnaryReactor* RotateUserToken(grpc::CallbackServerContext* ctx, const pb::UserRequest* req,
                                            pb::UserTokenReply* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::UserTokenReply> {
      FT_RETURN_IF_ERROR(call.Check(Action::kManageUsers));
      FT_ASSIGN_OR_RETURN(std::string token, daemon_->RotateUserToken(call.actor(), req->name()));
      return TokenReply(req->name(), std::move(token));
    });
  }
  grpc::ServerUnaryReactor* ListUsers(grpc::CallbackServerContext* ctx, const pb::ListUsersRequest*,
                                      pb::ListUsersReply* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::ListUsersReply> {
      FT_RETURN_IF_ERROR(call.Check(Action::kManageUsers));
      FT_ASSIGN_OR_RETURN(std::vector<UserInfo> users, daemon_->ListUsers());
      pb::ListUsersReply out;
      for (const UserInfo& u : users) *out.add_users() = ToProtoUser(u);
      return out;
    });
  }
  grpc::ServerUnaryReactor* SetTeam(grpc::CallbackServerContext* ctx, const pb::SetTeamRequest* req,
                                    pb::Team* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::Team> {
      FT_RETURN_IF_ERROR(call.Check(Action::kManageTeams));
      TeamChange change;
      if (req->has_quota_devices()) change.quota_devices = req->quota_devices();
      if (req->has_weight()) change.weight = req->weight();
      if (req->has_max_queued()) change.max_queued = req->max_queued();
      if (req->has_budget()) change.budget = req->budget();
      FT_RETURN_IF_ERROR(daemon_->SetTeam(call.actor(), req->name(), change));
      FT_ASSIGN_OR_RETURN(std::vector<TeamInfo> teams, daemon_->ListTeams());
      for (const TeamInfo& t : teams)
        if (t.name == req->name()) return ToProtoTeam(t);
      return Status::Internal("team " + req->name() + " was set but is not listed");
    });
  }
  grpc::ServerUnaryReactor* ListTeams(grpc::CallbackServerContext* ctx, const pb::ListTeamsRequest*,
                                      pb::ListTeamsReply* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::ListTeamsReply> {
      FT_RETURN_IF_ERROR(call.Check(Action::kReadTeams));
      FT_ASSIGN_OR_RETURN(std::vector<TeamInfo> teams, daemon_->ListTeams());
      pb::ListTeamsReply out;
      for (const TeamInfo& t : teams) *out.add_teams() = ToProtoTeam(t);
      return out;
    });
  }
  grpc::ServerUnaryReactor* AddWebhook(grpc::CallbackServerContext* ctx, const pb::AddWebhookRequest* req,
                                       pb::AddWebhookReply* reply) override {
    return Unary(
        ctx, reply,
        [&](Call& call) -> StatusOr<pb::AddWebhookReply> {
          FT_RETURN_IF_ERROR(call.Check(Action::kManageWebhooks));
          std::string events;
          for (const std::string& e : req->events()) events += (events.empty() ? "" : ",") + e;
          FT_ASSIGN_OR_RETURN(WebhookRow hook,
                              daemon_->AddWebhook(call.actor(), WebhookRow{.url = req->url(),
                                                                           .events = events,
                                                                           .team = req->team(),
                                                                           .user = req->user(),
                                                                           .secret = req->secret()}));
          pb::AddWebhookReply out;
          out.set_secret(hook.secret);
          *out.mutable_webhook() = ToProtoWebhook(hook, 0);
          return out;
        },
        true);
  }
  grpc::ServerUnaryReactor* RemoveWebhook(grpc::CallbackServerContext* ctx,
                                          const pb::RemoveWebhookRequest* req, pb::Webhook* reply) override {
    return Unary(
        ctx, reply,
        [&](Call& call) -> StatusOr<pb::Webhook> {
          FT_RETURN_IF_ERROR(call.Check(Action::kManageWebhooks));
          FT_ASSIGN_OR_RETURN(std::vector<WebhookRow> hooks, daemon_->ListWebhooks());
          for (const WebhookRow& h : hooks) {
            if (h.id != req->id()) continue;
            FT_RETURN_IF_ERROR(daemon_->RemoveWebhook(call.actor(), h.id));
            return ToProtoWebhook(h, 0);
          }
          return Status::NotFound("no webhook " + req->id() + " (ftctl admin webhook ls lists them)");
        },
        true);
  }
  grpc::ServerUnaryReactor* ListWebhooks(grpc::CallbackServerContext* ctx, const pb::ListWebhooksRequest*,
                                         pb::ListWebhooksReply* reply) override {
    return Unary(ctx, reply, [&](Call& call) -> StatusOr<pb::ListWebhooksReply> {
      FT_RETURN_IF_ERROR(call.Check(Action::kManageWebhooks));
      std::map<std::string, int64_t> pending;
      FT_ASSIGN_OR_RETURN(std::vector<WebhookRow> hooks, daemon_->ListWebhooks(&pending));
      pb::ListWebhooksReply out;
      for (const WebhookRow& h : hooks) *out.add_webhooks() = ToProtoWebhook(h, pending[h.id]);
      return out;
    });
  }
  grpc::ServerWriteReactor<pb::JobUpdate>* Watch(grpc::CallbackServerContext* ctx,
                                                 const pb::WatchRequest* req) override {
    std::optional<Identity> who = authenticator_.Resolve(BearerToken(ctx));
    if (!who) return Refuse<pb::JobUpdate>(kUnauthenticated);
    Call call{*who, std::nullopt};
    if (!req->job_id().empty()) {  // "" = every job (that the identity may read)
      if (grpc::Status bad = StreamCheck(call, req->job_id()); !bad.ok()) return Refuse<pb::JobUpdate>(bad);
    }
    auto slot = Slot(ctx);
    if (!slot) return Refuse<pb::JobUpdate>(StreamsExhausted(ctx));
    return new WatchReactor(daemon_, *req, std::move(slot), call.who.scope());
  }
  grpc::ServerWriteReactor<pb::LogChunk>* Logs(grpc::CallbackServerContext* ctx,
                                               const pb::LogsRequest* req) override {
    std::optional<Identity> who = authenticator_.Resolve(BearerToken(ctx));
    if (!who) return Refuse<pb::LogChunk>(kUnauthenticated);
    Call call{*who, std::nullopt};
    if (grpc::Status bad = StreamCheck(call, req->job_id()); !bad.ok()) return Refuse<pb::LogChunk>(bad);
    auto slot = Slot(ctx);
    if (!slot) return Refuse<pb::LogChunk>(StreamsExhausted(ctx));
    return new LogsReactor(daemon_, *req, std::move(slot));
  }

 private:
  // The job id is well-formed, the job exists, and call.who may do `action` on it.
  Status CheckOnJob(Call& call, Action action, const std::string& id, const std::string& field) {
    FT_RETURN_IF_ERROR(CheckJobId(id, field));
    FT_ASSIGN_OR_RETURN(JobRow job, daemon_->store().GetJob(id));
    return call.Check(action, job.team, id);
  }
  // CheckOnJob(kReadJob) for a stream, as the status it is refused with.
  grpc::Status StreamCheck(Call& call, const std::string& id) {
    Status s = CheckOnJob(call, Action::kReadJob, id, "job_id");
    if (call.denied) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, *call.denied);
    return ToGrpcStatus(s);
  }
  static pb::Team ToProtoTeam(const TeamInfo& t) {
    pb::Team out;
    out.set_name(t.name);
    out.set_quota_devices(t.quota_devices);
    out.set_weight(t.weight);
    out.set_running_devices(t.running_devices);
    out.set_borrowed_devices(t.borrowed_devices);
    out.set_queued_jobs(t.queued_jobs);
    out.set_usage_device_seconds(t.usage_device_seconds);
    out.set_fair_share(t.fair_share);
    out.set_max_queued(t.max_queued);
    out.set_spend(t.spend);
    if (t.budget) out.set_budget(*t.budget);
    return out;
  }
  static pb::Webhook ToProtoWebhook(const WebhookRow& h, int64_t pending) {
    pb::Webhook out;
    out.set_id(h.id);
    out.set_url(h.url);
    for (const std::string& kind : SplitOn(h.events, ',')) out.add_events(kind);
    out.set_team(h.team);
    out.set_user(h.user);
    out.set_created_by(h.created_by);
    out.set_created_ms(h.created_ms);
    out.set_pending_deliveries(pending);
    return out;
  }
  static pb::User ToProtoUser(const UserInfo& u) {
    pb::User out;
    out.set_name(u.name);
    out.set_team(u.team);
    out.set_role(u.role);
    out.set_created_ms(u.created_ms);
    return out;
  }
  StatusOr<pb::User> FindUser(const std::string& name) {
    FT_ASSIGN_OR_RETURN(std::vector<UserInfo> users, daemon_->ListUsers());
    for (const UserInfo& u : users)
      if (u.name == name) return ToProtoUser(u);
    return Status::NotFound("no user " + name + " (ftctl admin user ls lists them)");
  }
  StatusOr<pb::UserTokenReply> TokenReply(const std::string& name, std::string token) {
    pb::UserTokenReply out;
    FT_ASSIGN_OR_RETURN(*out.mutable_user(), FindUser(name));
    out.set_token(std::move(token));
    return out;
  }

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
  Authenticator authenticator_;
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
