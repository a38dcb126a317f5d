// A small client for ftd's Jobs API, shared by ftctl and the end-to-end tests:
// address and token from flags, the environment (FTUNE_ADDR, FTUNE_TOKEN) or
// ~/.config/ftune/client.yaml; every call returns an ft::Status.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "proto/ftune.grpc.pb.h"

namespace ft {

struct ClientOptions {
  std::string address;  // host:port
  std::string token;
  int64_t timeout_ms = 10'000;
  std::string tls_ca;  // "" = plaintext, "system", or a PEM CA bundle (proto/credentials.h)
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // made from tls_ca by ResolveClientOptions
};

// Fills what `o` leaves empty from the environment (FTUNE_ADDR, FTUNE_TOKEN,
// FTUNE_TLS_CA), then the config file, then defaults, and makes the channel
// credentials. InvalidArgument naming the file when the CA bundle is unusable.
StatusOr<ClientOptions> ResolveClientOptions(ClientOptions o);

// Whether `s` is a JobsClient call's report that ftd refused (or wanted) the
// client token: InvalidArgument (bad input) whose message names gRPC's code
// (UNAUTHENTICATED, PERMISSION_DENIED) and how to pass a token, meant to be
// printed without a code name before it.
bool RefusedToken(const Status& s);

class JobsClient {
 public:
  explicit JobsClient(const ClientOptions& options);

  StatusOr<ftune::v1::SubmitReply> Submit(const ftune::v1::SubmitRequest& req);
  StatusOr<ftune::v1::Job> Get(const std::string& id);
  StatusOr<ftune::v1::ListJobsReply> List(const ftune::v1::ListJobsRequest& req);
  StatusOr<ftune::v1::Job> Cancel(const std::string& id);
  StatusOr<ftune::v1::ListWorkersReply> Workers();
  StatusOr<ftune::v1::ListEventsReply> Events(const std::string& job_id, int64_t after_seq);
  // Streams updates to `fn` until it returns false or the stream ends.
  Status Watch(const std::string& job_id, int64_t after_seq,
               const std::function<bool(const ftune::v1::JobUpdate&)>& fn);
  Status Logs(const std::string& job_id, bool follow, const std::function<void(const std::string&)>& fn);
  // Admin only (ftd answers PERMISSION_DENIED otherwise). AddUser and RotateUserToken return
  // the user's new token, which ftd never shows again.
  StatusOr<ftune::v1::UserTokenReply> AddUser(const std::string& name, const std::string& team,
                                              const std::string& role);
  StatusOr<ftune::v1::User> RemoveUser(const std::string& name);
  StatusOr<ftune::v1::UserTokenReply> RotateUserToken(const std::string& name);
  StatusOr<ftune::v1::ListUsersReply> ListUsers();
  // SetTeam: admin only; an unset field keeps its value (a negative budget removes it). ListTeams:
  // any identity.
  StatusOr<ftune::v1::Team> SetTeam(const ftune::v1::SetTeamRequest& req);
  StatusOr<ftune::v1::ListTeamsReply> ListTeams();
  // Webhooks, admin only. AddWebhook's reply holds the signing secret, which ftd never shows again.
  StatusOr<ftune::v1::AddWebhookReply> AddWebhook(const ftune::v1::AddWebhookRequest& req);
  StatusOr<ftune::v1::Webhook> RemoveWebhook(const std::string& id);
  StatusOr<ftune::v1::ListWebhooksReply> ListWebhooks();

 private:
  void Prepare(grpc::ClientContext* ctx, bool deadline = true) const;
  // A failed RPC as a Status: FromGrpcStatus's, naming the address, except a
  // refused token (see RefusedToken).
  Status FromRpc(const grpc::Status& s) const;

  ClientOptions options_;
  std::unique_ptr<ftune::v1::Jobs::Stub> stub_;
};

}  // namespace ft
