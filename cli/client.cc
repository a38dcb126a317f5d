#include "cli/client.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "common/yaml_config.h"
#include "daemon/grpc_status.h"
#include "proto/credentials.h"

namespace ft {

namespace pb = ftune::v1;

StatusOr<ClientOptions> ResolveClientOptions(ClientOptions o) {
  if (o.address.empty() && std::getenv("FTUNE_ADDR")) o.address = std::getenv("FTUNE_ADDR");
  if (o.token.empty() && std::getenv("FTUNE_TOKEN")) o.token = std::getenv("FTUNE_TOKEN");
  if (o.tls_ca.empty() && std::getenv("FTUNE_TLS_CA")) o.tls_ca = std::getenv("FTUNE_TLS_CA");
  const char* home = std::getenv("HOME");
  if ((o.address.empty() || o.token.empty() || o.tls_ca.empty()) && home) {
    auto cfg = YamlMap::LoadFile((std::filesystem::path(home) / ".config/ftune/client.yaml").string());
    if (cfg.ok()) {
      if (o.address.empty()) (void)cfg->Get("address", &o.address);
      if (o.token.empty()) (void)cfg->Get("token", &o.token);
      if (o.tls_ca.empty()) (void)cfg->Get("tls_ca", &o.tls_ca);
    }
  }
  if (o.address.empty()) o.address = "127.0.0.1:7070";
  FT_ASSIGN_OR_RETURN(o.credentials, MakeChannelCredentials(o.tls_ca));
  return o;
}

JobsClient::JobsClient(const ClientOptions& options)
    : options_(options),
      stub_(pb::Jobs::NewStub(grpc::CreateChannel(
          options.address, options.credentials ? options.credentials : grpc::InsecureChannelCredentials()))) {
}

void JobsClient::Prepare(grpc::ClientContext* ctx, bool deadline) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  if (deadline) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.timeout_ms));
  }
}

namespace {
constexpr char kTokenRefused[] = " the client token (gRPC ";
}  // namespace

bool RefusedToken(const Status& s) {
  return s.IsInvalidArgument() && s.message().find(kTokenRefused) != std::string::npos;
}

Status JobsClient::FromRpc(const grpc::Status& s) const {
  const grpc::StatusCode code = s.error_code();
  if (code != grpc::StatusCode::UNAUTHENTICATED && code != grpc::StatusCode::PERMISSION_DENIED) {
    return FromGrpcStatus(s).WithContext("ftd at " + options_.address);
  }
  if (code == grpc::StatusCode::PERMISSION_DENIED) {  // a known identity, not allowed this
    return Status::InvalidArgument("ftd at " + options_.address + " refused" + kTokenRefused +
                                   "PERMISSION_DENIED): " + s.error_message());
  }
  const std::string name = "UNAUTHENTICATED";
  return Status::InvalidArgument(
      "ftd at " + options_.address + (options_.token.empty() ? " wants" : " refused") + kTokenRefused + name +
      ": " + s.error_message() +
      "): pass the token ftd was started with (its --client-token) as --token TOKEN, in FTUNE_TOKEN or as "
      "'token:' in ~/.config/ftune/client.yaml");
}

#define FT_UNARY_(method, Req, Reply, build)             \
  Req req_;                                              \
  build;                                                 \
  Reply reply_;                                          \
  grpc::ClientContext ctx_;                              \
  Prepare(&ctx_);                                        \
  grpc::Status s_ = stub_->method(&ctx_, req_, &reply_); \
  if (!s_.ok()) return FromRpc(s_);                      \
  return reply_

StatusOr<pb::SubmitReply> JobsClient::Submit(const pb::SubmitRequest& req) {
  FT_UNARY_(Submit, pb::SubmitRequest, pb::SubmitReply, req_ = req);
}
StatusOr<pb::Job> JobsClient::Get(const std::string& id) {
  FT_UNARY_(Get, pb::GetJobRequest, pb::Job, req_.set_id(id));
}
StatusOr<pb::ListJobsReply> JobsClient::List(const pb::ListJobsRequest& req) {
  FT_UNARY_(List, pb::ListJobsRequest, pb::ListJobsReply, req_ = req);
}
StatusOr<pb::Job> JobsClient::Cancel(const std::string& id) {
  FT_UNARY_(Cancel, pb::CancelRequest, pb::Job, req_.set_id(id));
}
StatusOr<pb::ListWorkersReply> JobsClient::Workers() {
  FT_UNARY_(ListWorkers, pb::ListWorkersRequest, pb::ListWorkersReply, (void)0);
}
StatusOr<pb::ListEventsReply> JobsClient::Events(const std::string& job_id, int64_t after_seq) {
  FT_UNARY_(ListEvents, pb::ListEventsRequest, pb::ListEventsReply,
            (req_.set_job_id(job_id), req_.set_after_seq(after_seq)));
}
StatusOr<pb::UserTokenReply> JobsClient::AddUser(const std::string& name, const std::string& team,
                                                 const std::string& role) {
  FT_UNARY_(AddUser, pb::AddUserRequest, pb::UserTokenReply,
            (req_.set_name(name), req_.set_team(team), req_.set_role(role)));
}
StatusOr<pb::User> JobsClient::RemoveUser(const std::string& name) {
  FT_UNARY_(RemoveUser, pb::UserRequest, pb::User, req_.set_name(name));
}
StatusOr<pb::UserTokenReply> JobsClient::RotateUserToken(const std::string& name) {
  FT_UNARY_(RotateUserToken, pb::UserRequest, pb::UserTokenReply, req_.set_name(name));
}
StatusOr<pb::ListUsersReply> JobsClient::ListUsers() {
  FT_UNARY_(ListUsers, pb::ListUsersRequest, pb::ListUsersReply, (void)0);
}
StatusOr<pb::Team> JobsClient::SetTeam(const pb::SetTeamRequest& req) {
  FT_UNARY_(SetTeam, pb::SetTeamRequest, pb::Team, req_ = req);
}
StatusOr<pb::ListTeamsReply> JobsClient::ListTeams() {
  FT_UNARY_(ListTeams, pb::ListTeamsRequest, pb::ListTeamsReply, (void)0);
}
StatusOr<pb::AddWebhookReply> JobsClient::AddWebhook(const pb::AddWebhookRequest& req) {
  FT_UNARY_(AddWebhook, pb::AddWebhookRequest, pb::AddWebhookReply, req_ = req);
}
StatusOr<pb::Webhook> JobsClient::RemoveWebhook(const std::string& id) {
  FT_UNARY_(RemoveWebhook, pb::RemoveWebhookRequest, pb::Webhook, req_.set_id(id));
}
StatusOr<pb::ListWebhooksReply> JobsClient::ListWebhooks() {
  FT_UNARY_(ListWebhooks, pb::ListWebhooksRequest, pb::ListWebhooksReply, (void)0);
}
#undef FT_UNARY_

Status JobsClient::Watch(const std::string& job_id, int64_t after_seq,
                         const std::function<bool(const pb::JobUpdate&)>& fn) {
  grpc::ClientContext ctx;
  Prepare(&ctx, /*deadline=*/false);
  pb::WatchRequest req;
  req.set_job_id(job_id);
  req.set_after_seq(after_seq);
  auto reader = stub_->Watch(&ctx, req);
  pb::JobUpdate update;
  while (reader->Read(&update)) {
    if (!fn(update)) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) return FromRpc(s);
  return Status::OK();
}

Status JobsClient::Logs(const std::string& job_id, bool follow,
                        const std::function<void(const std::string&)>& fn) {
  grpc::ClientContext ctx;
  Prepare(&ctx, /*deadline=*/!follow);
  pb::LogsRequest req;
  req.set_job_id(job_id);
  req.set_follow(follow);
  auto reader = stub_->Logs(&ctx, req);
  pb::LogChunk chunk;
  while (reader->Read(&chunk)) fn(chunk.text());
  grpc::Status s = reader->Finish();
  return s.ok() ? Status::OK() : FromRpc(s);
}

}  // namespace ft
