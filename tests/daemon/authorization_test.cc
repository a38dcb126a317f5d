// Users in teams and the one authorization decision (issue #44), through gRPC
// and HTTP alike on a real server and client: a member cannot see, cancel or
// read the logs or events of another team's job; a viewer cannot act; an
// admin can; a removed or rotated token stops working at once; wrong tokens
// are UNAUTHENTICATED/401 and a refused action PERMISSION_DENIED/403 naming
// the user, the action and why; the single client token setup still works;
// every state change is an event naming the user; and `ftctl admin user`
// against a real ftd.
#include "daemon/authorization.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>
#include <tuple>

#include "daemon/daemon.h"
#include "daemon/grpc_service.h"
#include "daemon/http_api.h"
#include "daemon/http_server.h"
#include "daemon/tokens_file.h"
#include "engine/job/hf_config.h"
#include "engine/model/model_config.h"
#include "proto/ftune.grpc.pb.h"
#include "tests/daemon/http_test_util.h"
#include "tests/support/process.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using http_test::Fetch;
using http_test::Reply;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_support::Proc;
using testing_support::ScopedProc;
using testing_support::Spawn;

constexpr char kClientToken[] = "act-token";
constexpr char kViewToken[] = "look-token";

// A job.yaml (model config and data under dir/job) writing to out-<name>.
std::string WriteJob(const std::string& dir, const std::string& name) {
  if (!fs::exists(dir + "/job/model/config.json")) {
    fs::create_directories(dir + "/job/model");
    std::ofstream(dir + "/job/model/config.json") << HfConfigJson(*PresetModelConfig("tiny-llama"));
    std::ofstream(dir + "/job/data.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";
  }
  return "name: " + name +
         "\nmodel: {path: model}\ndata: {train: data.jsonl, format: tokens, seq_len: 64}\n"
         "train: {max_steps: 10, global_batch_size: 4}\noutput: {dir: out-" +
         name + "}\n";
}

// A daemon with users alice (member of team-a), bob (member of team-b), vera (viewer of team-a)
// and ada (admin of team-a), a job of each member's team, served over gRPC and HTTP with the
// client token and the view token.
class AuthorizationTest : public testing::Test {
 protected:
  void SetUp() override { Start(/*with_users=*/true); }

  void Start(bool with_users) {
    dir_ = testing_support::FreshDir(
        "authz-" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    auto store = Store::Open(dir_ + "/ftd.sqlite");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    DaemonOptions o;
    o.data_dir = dir_ + "/data";
    fs::create_directories(o.data_dir + "/logs");
    daemon_ = std::make_unique<Daemon>(std::move(*store), &clock_, o);
    if (with_users) {
      for (auto [name, team, role] : {std::tuple{"alice", "team-a", "member"},
                                      {"bob", "team-b", "member"},
                                      {"vera", "team-a", "viewer"},
                                      {"ada", "team-a", "admin"}}) {
        auto token = daemon_->AddUser({"admin", ""}, name, team, role);
        ASSERT_TRUE(token.ok()) << token.status().ToString();
        tokens_[name] = *token;
      }
      job_a_ = SubmitAs({"alice", "team-a"}, "ja");
      job_b_ = SubmitAs({"bob", "team-b"}, "jb");
      std::ofstream(o.data_dir + "/logs/" + job_b_ + ".log") << "bob's secret log line\n";
    }
    Serve();
  }

  std::string SubmitAs(const Actor& by, const std::string& name) {
    pb::SubmitRequest req;
    req.set_spec_yaml(WriteJob(dir_, name));
    req.set_spec_dir(dir_ + "/job");
    auto r = daemon_->Submit(req, by);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->job().id() : "";
  }

  void Serve() {
    jobs_ = MakeJobsService(daemon_.get(), {.client_token = kClientToken, .view_token = kViewToken});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(jobs_.get());
    grpc_server_ = builder.BuildAndStart();
    ASSERT_TRUE(grpc_server_ && port > 0);
    stub_ = pb::Jobs::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
    api_ = std::make_unique<HttpApi>(daemon_.get(),
                                     HttpApiOptions{.client_token = kClientToken, .view_token = kViewToken});
    HttpServerOptions http;
    http.address = "127.0.0.1:0";
    auto server = HttpServer::Start(daemon_.get(), api_.get(), http);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    http_ = std::move(*server);
  }

  void TearDown() override {
    http_.reset();
    if (grpc_server_) grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }
  grpc::Status GrpcGet(const std::string& token, const std::string& id, pb::Job* job = nullptr) {
    pb::GetJobRequest req;
    req.set_id(id);
    pb::Job out;
    return stub_->Get(As(token).get(), req, job ? job : &out);
  }
  grpc::Status GrpcCancel(const std::string& token, const std::string& id) {
    pb::CancelRequest req;
    req.set_id(id);
    pb::Job out;
    return stub_->Cancel(As(token).get(), req, &out);
  }
  grpc::Status GrpcLogs(const std::string& token, const std::string& id, std::string* text = nullptr) {
    pb::LogsRequest req;
    req.set_job_id(id);
    auto ctx = As(token);
    auto reader = stub_->Logs(ctx.get(), req);
    pb::LogChunk chunk;
    while (reader->Read(&chunk))
      if (text) *text += chunk.text();
    return reader->Finish();
  }
  grpc::Status GrpcEvents(const std::string& token, const std::string& id, pb::ListEventsReply* reply) {
    pb::ListEventsRequest req;
    req.set_job_id(id);
    return stub_->ListEvents(As(token).get(), req, reply);
  }
  grpc::Status GrpcWatch(const std::string& token, const std::string& id) {
    pb::WatchRequest req;
    req.set_job_id(id);
    auto ctx = As(token);
    auto reader = stub_->Watch(ctx.get(), req);
    pb::JobUpdate u;
    while (reader->Read(&u)) ctx->TryCancel();  // a stream that started is not a refusal
    return reader->Finish();
  }
  std::vector<std::string> GrpcListIds(const std::string& token) {
    pb::ListJobsReply reply;
    EXPECT_TRUE(stub_->List(As(token).get(), pb::ListJobsRequest(), &reply).ok());
    std::vector<std::string> ids;
    for (const pb::Job& j : reply.jobs()) ids.push_back(j.id());
    return ids;
  }

  Reply Http(const std::string& token, const std::string& method, const std::string& target) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (!token.empty()) headers.emplace_back("Authorization", "Bearer " + token);
    return Fetch(http_->port(), method, target, headers);
  }
  std::vector<std::string> HttpListIds(const std::string& token) {
    Reply r = Http(token, "GET", "/api/jobs");
    EXPECT_EQ(r.status, 200) << r.body;
    std::vector<std::string> ids;
    const nlohmann::json body = nlohmann::json::parse(r.body);
    for (const auto& j : body["jobs"]) ids.push_back(j["id"]);
    return ids;
  }
  // The job ids the events of every job name, as `token` reads them through gRPC and HTTP.
  std::pair<std::set<std::string>, std::set<std::string>> EventJobs(const std::string& token) {
    std::set<std::string> grpc_ids, http_ids;
    pb::ListEventsReply reply;
    EXPECT_TRUE(GrpcEvents(token, "", &reply).ok());
    for (const pb::Event& e : reply.events()) grpc_ids.insert(e.job_id());
    Reply r = Http(token, "GET", "/api/events");
    EXPECT_EQ(r.status, 200) << r.body;
    const nlohmann::json body = nlohmann::json::parse(r.body);
    for (const auto& e : body["events"]) http_ids.insert(e["job_id"]);
    return {grpc_ids, http_ids};
  }

  std::string dir_;
  SystemClock clock_;
  std::unique_ptr<Daemon> daemon_;
  std::map<std::string, std::string> tokens_;
  std::string job_a_, job_b_;
  std::unique_ptr<pb::Jobs::CallbackService> jobs_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<pb::Jobs::Stub> stub_;
  std::unique_ptr<HttpApi> api_;
  std::unique_ptr<HttpServer> http_;
};

TEST_F(AuthorizationTest, AMemberCannotSeeCancelOrReadTheLogsOrEventsOfAnotherTeamsJobThroughGrpc) {
  const std::string alice = tokens_["alice"];
  grpc::Status get = GrpcGet(alice, job_b_);
  EXPECT_EQ(get.error_code(), grpc::StatusCode::PERMISSION_DENIED) << get.error_message();
  EXPECT_THAT(get.error_message(), HasSubstr("user 'alice'"));
  EXPECT_THAT(get.error_message(), HasSubstr("may not read job " + job_b_));
  EXPECT_THAT(get.error_message(), HasSubstr("team 'team-b'"));
  grpc::Status cancel = GrpcCancel(alice, job_b_);
  EXPECT_EQ(cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(cancel.error_message(), HasSubstr("may not cancel job " + job_b_));
  std::string text;
  EXPECT_EQ(GrpcLogs(alice, job_b_, &text).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(text, Not(HasSubstr("secret")));
  pb::ListEventsReply events;
  EXPECT_EQ(GrpcEvents(alice, job_b_, &events).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(GrpcWatch(alice, job_b_).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(GrpcListIds(alice), std::vector<std::string>{job_a_});
  EXPECT_EQ(EventJobs(alice).first, std::set<std::string>{job_a_});
  EXPECT_EQ(daemon_->GetJob(job_b_)->state(), pb::QUEUED);
  // Its own team's job it may read and cancel.
  EXPECT_TRUE(GrpcGet(alice, job_a_).ok());
  EXPECT_TRUE(GrpcLogs(alice, job_a_).ok());
  EXPECT_TRUE(GrpcCancel(alice, job_a_).ok());
}

TEST_F(AuthorizationTest, AMemberCannotSeeCancelOrReadTheLogsOrEventsOfAnotherTeamsJobThroughHttp) {
  const std::string alice = tokens_["alice"];
  for (const std::string& target :
       {"/api/jobs/" + job_b_, "/api/jobs/" + job_b_ + "/log", "/api/jobs/" + job_b_ + "/events",
        "/api/jobs/" + job_b_ + "/metrics", "/api/jobs/" + job_b_ + "/memory", "/api/events?job=" + job_b_}) {
    Reply r = Http(alice, "GET", target);
    EXPECT_EQ(r.status, 403) << target << ": " << r.body;
    EXPECT_THAT(r.body, HasSubstr("user 'alice'")) << target;
    EXPECT_THAT(r.body, Not(HasSubstr("secret"))) << target;
  }
  http_test::SseReader stream(http_->port());  // a stream that opened would never end: read its head
  ASSERT_TRUE(stream.Get("/api/stream?job=" + job_b_ + "&token=" + alice));
  EXPECT_TRUE(stream.ReadUntil("403", std::chrono::seconds(5))) << stream.text();
  Reply cancel = Http(alice, "POST", "/api/jobs/" + job_b_ + "/cancel");
  EXPECT_EQ(cancel.status, 403) << cancel.body;
  EXPECT_THAT(cancel.body, HasSubstr("may not cancel job " + job_b_));
  EXPECT_EQ(HttpListIds(alice), std::vector<std::string>{job_a_});
  EXPECT_EQ(EventJobs(alice).second, std::set<std::string>{job_a_});
  EXPECT_EQ(daemon_->GetJob(job_b_)->state(), pb::QUEUED);
  // Its own team's job it may read and cancel; the workers list is every identity's.
  EXPECT_EQ(Http(alice, "GET", "/api/jobs/" + job_a_ + "/log").status, 200);
  EXPECT_EQ(Http(alice, "GET", "/api/workers").status, 200);
  EXPECT_EQ(Http(alice, "POST", "/api/jobs/" + job_a_ + "/cancel").status, 200);
}

TEST_F(AuthorizationTest, AMembersLiveStreamCarriesOnlyItsTeamsJobs) {
  http_test::SseReader sse(http_->port());
  ASSERT_TRUE(sse.Get("/api/stream?after_seq=0&token=" + tokens_["alice"]));
  ASSERT_TRUE(sse.ReadUntil("\"job_id\":\"" + job_a_ + "\"", std::chrono::seconds(10))) << sse.text();
  // A later job of each team: only team-a's reaches alice's stream.
  const std::string b2 = SubmitAs({"bob", "team-b"}, "jb2");
  const std::string a2 = SubmitAs({"alice", "team-a"}, "ja2");
  ASSERT_TRUE(sse.ReadUntil("\"job_id\":\"" + a2 + "\"", std::chrono::seconds(10))) << sse.text();
  EXPECT_THAT(sse.text(), Not(HasSubstr(b2)));
  EXPECT_THAT(sse.text(), Not(HasSubstr(job_b_)));
}

TEST_F(AuthorizationTest, AViewerReadsItsTeamButCannotAct) {
  const std::string vera = tokens_["vera"];
  EXPECT_TRUE(GrpcGet(vera, job_a_).ok());
  EXPECT_EQ(Http(vera, "GET", "/api/jobs/" + job_a_).status, 200);
  grpc::Status cancel = GrpcCancel(vera, job_a_);
  EXPECT_EQ(cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(cancel.error_message(), HasSubstr("user 'vera' (viewer of team 'team-a') may not cancel"));
  Reply http_cancel = Http(vera, "POST", "/api/jobs/" + job_a_ + "/cancel");
  EXPECT_EQ(http_cancel.status, 403) << http_cancel.body;
  EXPECT_THAT(http_cancel.body, HasSubstr("viewers may only read"));
  pb::SubmitRequest submit;
  submit.set_spec_yaml(WriteJob(dir_, "jv"));
  submit.set_spec_dir(dir_ + "/job");
  pb::SubmitReply reply;
  EXPECT_EQ(stub_->Submit(As(vera).get(), submit, &reply).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(GrpcGet(vera, job_b_).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(daemon_->GetJob(job_a_)->state(), pb::QUEUED);
  // The view token reads every team's jobs and acts on none.
  EXPECT_EQ(GrpcListIds(kViewToken).size(), 2u);
  EXPECT_EQ(GrpcCancel(kViewToken, job_a_).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(AuthorizationTest, OnlyAnAdminSetsATeamsQuotaAndEveryIdentityReadsTheTeams) {
  pb::SetTeamRequest set;
  set.set_name("team-a");
  set.set_quota_devices(2);
  pb::Team team;
  grpc::Status refused = stub_->SetTeam(As(tokens_["alice"]).get(), set, &team);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("only admins set quotas and weights"));
  ASSERT_TRUE(stub_->SetTeam(As(tokens_["ada"]).get(), set, &team).ok());
  EXPECT_EQ(team.quota_devices(), 2);
  EXPECT_EQ(team.weight(), 1);
  pb::SetTeamRequest weight_only;
  weight_only.set_name("team-a");
  weight_only.set_weight(3);
  ASSERT_TRUE(stub_->SetTeam(As(kClientToken).get(), weight_only, &team).ok());
  EXPECT_EQ(team.quota_devices(), 2) << "an unset quota keeps its value";
  EXPECT_EQ(team.weight(), 3);
  pb::SetTeamRequest bad;
  bad.set_name("team-a");
  bad.set_weight(0);
  grpc::Status invalid = stub_->SetTeam(As(kClientToken).get(), bad, &team);
  EXPECT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(invalid.error_message(), HasSubstr("weight must be a number above 0"));
  pb::ListTeamsReply teams;
  ASSERT_TRUE(stub_->ListTeams(As(tokens_["vera"]).get(), pb::ListTeamsRequest(), &teams).ok());
  ASSERT_EQ(teams.teams_size(), 2);  // team-a (a policy and a queued job) and team-b (a queued job)
  EXPECT_EQ(teams.teams(0).name(), "team-a");
  EXPECT_EQ(teams.teams(0).queued_jobs(), 1);
  EXPECT_DOUBLE_EQ(teams.teams(0).fair_share(), 0.75);
  EXPECT_EQ(teams.teams(1).quota_devices(), -1);
  Reply http = Http(tokens_["bob"], "GET", "/api/teams");
  ASSERT_EQ(http.status, 200) << http.body;
  const nlohmann::json body = nlohmann::json::parse(http.body);
  ASSERT_EQ(body["teams"].size(), 2u);
  EXPECT_EQ(body["teams"][0]["quota_devices"], 2);
  EXPECT_EQ(body["teams"][0]["weight"], 3);
  pb::ListEventsReply events;
  ASSERT_TRUE(GrpcEvents(kClientToken, "", &events).ok());
  EXPECT_THAT(events.events().rbegin()->message(),
              HasSubstr("team team-a: a quota of 2 devices, weight 3, no queue cap, no budget by admin"));
}

TEST_F(AuthorizationTest, AnAdminCanDoEverythingOnEveryTeam) {
  EXPECT_EQ(GrpcListIds(tokens_["ada"]).size(), 2u);
  EXPECT_EQ(HttpListIds(tokens_["ada"]).size(), 2u);
  EXPECT_TRUE(GrpcCancel(tokens_["ada"], job_b_).ok());  // an admin user of team-a, on team-b's job
  EXPECT_EQ(Http(kClientToken, "POST", "/api/jobs/" + job_a_ + "/cancel").status, 200);
  pb::ListUsersReply users;
  EXPECT_TRUE(stub_->ListUsers(As(tokens_["ada"]).get(), pb::ListUsersRequest(), &users).ok());
  EXPECT_EQ(users.users_size(), 4);
  grpc::Status refused = stub_->ListUsers(As(tokens_["alice"]).get(), pb::ListUsersRequest(), &users);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("only admins manage users"));
}

TEST_F(AuthorizationTest, ARemovedOrRotatedTokenIsRefusedAtOnce) {
  const std::string alice = tokens_["alice"];
  ASSERT_TRUE(GrpcGet(alice, job_a_).ok());
  ASSERT_EQ(Http(alice, "GET", "/api/jobs").status, 200);
  pb::UserRequest remove;
  remove.set_name("alice");
  pb::User removed;
  ASSERT_TRUE(stub_->RemoveUser(As(kClientToken).get(), remove, &removed).ok());
  EXPECT_EQ(GrpcGet(alice, job_a_).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Http(alice, "GET", "/api/jobs").status, 401);

  pb::UserRequest rotate;
  rotate.set_name("bob");
  pb::UserTokenReply fresh;
  ASSERT_TRUE(stub_->RotateUserToken(As(kClientToken).get(), rotate, &fresh).ok());
  EXPECT_NE(fresh.token(), tokens_["bob"]);
  EXPECT_EQ(GrpcGet(tokens_["bob"], job_b_).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Http(tokens_["bob"], "GET", "/api/jobs").status, 401);
  EXPECT_TRUE(GrpcGet(fresh.token(), job_b_).ok());
  EXPECT_EQ(Http(fresh.token(), "GET", "/api/jobs/" + job_b_).status, 200);
}

TEST_F(AuthorizationTest, WrongTokensAreUnauthenticatedAndTokensAreStoredOnlyAsSaltedHashes) {
  for (const std::string& token :
       {std::string(), std::string("nope"), tokens_["alice"] + "x", "ftu_" + std::string(16, '0') + "_x"}) {
    EXPECT_EQ(GrpcGet(token, job_a_).error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_EQ(Http(token, "GET", "/api/jobs").status, 401) << token;
    EXPECT_EQ(Http(token, "POST", "/api/jobs/" + job_a_ + "/cancel").status, 401) << token;
  }
  auto users = daemon_->store().ListUsers();
  ASSERT_TRUE(users.ok());
  for (const UserRow& u : *users) {
    EXPECT_EQ(u.token_hash.size(), 64u);
    EXPECT_THAT(tokens_[u.name], Not(HasSubstr(u.token_hash)));
  }
  std::ifstream db(dir_ + "/ftd.sqlite", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(db)), std::istreambuf_iterator<char>());
  std::ifstream wal(dir_ + "/ftd.sqlite-wal", std::ios::binary);
  const std::string wal_bytes((std::istreambuf_iterator<char>(wal)), std::istreambuf_iterator<char>());
  for (const auto& [name, token] : tokens_) {
    EXPECT_EQ(bytes.find(token), std::string::npos) << name;
    EXPECT_EQ(wal_bytes.find(token), std::string::npos) << name;
  }
}

TEST_F(AuthorizationTest, EveryStateChangeIsAnEventNamingTheUser) {
  ASSERT_TRUE(GrpcCancel(tokens_["alice"], job_a_).ok());
  pb::ListEventsReply reply;
  ASSERT_TRUE(GrpcEvents(kClientToken, "", &reply).ok());
  std::string all;
  for (const pb::Event& e : reply.events()) all += e.kind() + ": " + e.message() + "\n";
  EXPECT_THAT(all, HasSubstr("user_added: user alice (member of team team-a) added by admin"));
  EXPECT_THAT(all, HasSubstr("queued: submitted by alice (team team-a)"));
  EXPECT_THAT(all, HasSubstr("cancelled: cancelled by alice"));
  // Jobs record who submitted them and the team, in gRPC and the HTTP job JSON.
  pb::Job job;
  ASSERT_TRUE(GrpcGet(kClientToken, job_b_, &job).ok());
  EXPECT_EQ(job.submitted_by(), "bob");
  EXPECT_EQ(job.team(), "team-b");
  auto json = nlohmann::json::parse(Http(kClientToken, "GET", "/api/jobs/" + job_b_).body);
  EXPECT_EQ(json["submitted_by"], "bob");
  EXPECT_EQ(json["team"], "team-b");
  // User management events are an admin's to read, not a member's.
  pb::ListEventsReply members;
  ASSERT_TRUE(GrpcEvents(tokens_["alice"], "", &members).ok());
  for (const pb::Event& e : members.events()) EXPECT_NE(e.kind().rfind("user_", 0), 0u) << e.message();
}

class SingleTokenTest : public AuthorizationTest {
 protected:
  void SetUp() override { Start(/*with_users=*/false); }
};

TEST_F(SingleTokenTest, TheClientTokenAloneIsAnAdminNamedAdminAndNoTokenIsRefused) {
  pb::SubmitRequest submit;
  submit.set_spec_yaml(WriteJob(dir_, "one"));
  submit.set_spec_dir(dir_ + "/job");
  pb::SubmitReply reply;
  EXPECT_EQ(stub_->Submit(As("").get(), submit, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(stub_->Submit(As(kClientToken).get(), submit, &reply).ok());
  EXPECT_EQ(reply.job().submitted_by(), "admin");
  EXPECT_EQ(reply.job().team(), "");
  EXPECT_EQ(GrpcListIds(kClientToken).size(), 1u);
  EXPECT_EQ(HttpListIds(kViewToken).size(), 1u);
  EXPECT_EQ(Http("", "GET", "/api/jobs").status, 401);
  EXPECT_EQ(Http(kClientToken, "POST", "/api/jobs/" + reply.job().id() + "/cancel").status, 200);
}

// ---------------------------------------------------------------- ftd --tokens-file

const std::string kAliceToken = "alice-token-0123456789abcdef";
const std::string kBobToken = "bob-token-0123456789abcdef";

// Writes `text` to `path` with `mode`.
void WriteTokens(const std::string& path, const std::string& text, mode_t mode = 0600) {
  std::ofstream(path, std::ios::trunc) << text;
  ASSERT_EQ(chmod(path.c_str(), mode), 0);
}

// Users from a file: a load replaces them as a whole (a removed token stops resolving), and a load
// that fails keeps the previous ones and names the file, the line and the field; a file others may
// read is refused.
TEST(TokensFileTest, ALoadReplacesTheUsersAndABadFileKeepsThePreviousOnes) {
  const std::string dir = testing_support::FreshDir("tokens-file");
  const std::string path = dir + "/tokens";
  TokensFile file;
  WriteTokens(path, "# token,user,team,role\n" + kAliceToken +
                        ",alice,nlp,member\n\nroot-token-0123456789,ops,,admin\n");
  auto loaded1 = file.Load(path);
  ASSERT_TRUE(loaded1.ok()) << loaded1.status().ToString();
  ASSERT_EQ(*loaded1, 2u);
  std::optional<Identity> alice = file.Resolve(kAliceToken);
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->user, "alice");
  EXPECT_EQ(alice->team, "nlp");
  EXPECT_EQ(alice->role, Role::kMember);
  EXPECT_TRUE(file.Resolve("root-token-0123456789")->every_team) << "an admin of no team";
  EXPECT_FALSE(file.Resolve(kAliceToken + "x").has_value());

  const std::map<std::string, std::string> bad = {
      {kBobToken + ",bob,nlp\n", ":1: expected token,user,team,role (4 fields), found 3"},
      {"short,bob,nlp,member\n", ":1: token: use 16 to 256 characters"},
      {"# x\n" + kBobToken + ",bob,nlp,owner\n", ":2: "},
      {kBobToken + ",bob smith,nlp,member\n", ":1: user 'bob smith'"},
      {kBobToken + ",bob,,member\n", ":1: team ''"},
      {kBobToken + ",bob,nlp,member\n" + kAliceToken + ",bob,nlp,viewer\n", ":2: user bob appears twice"},
      {kBobToken + ",bob,nlp,member\n" + kBobToken + ",carol,nlp,viewer\n", ":2: this token is also another"},
  };
  for (const auto& [text, error] : bad) {
    WriteTokens(path, text);
    auto refused = file.Load(path);
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_THAT(refused.status().message(), HasSubstr(path + error)) << text;
    EXPECT_TRUE(file.Resolve(kAliceToken).has_value()) << "the previous users stay: " << text;
  }
  WriteTokens(path, kBobToken + ",bob,vision,viewer\n", 0644);
  auto readable = file.Load(path);
  ASSERT_FALSE(readable.ok());
  EXPECT_THAT(readable.status().message(),
              HasSubstr("mode 0644 lets its group or others read it: chmod 600"));
  EXPECT_FALSE(file.Load(dir + "/missing").ok());

  WriteTokens(path, kBobToken + ",bob,vision,viewer\n");
  auto loaded2 = file.Load(path);
  ASSERT_TRUE(loaded2.ok()) << loaded2.status().ToString();
  ASSERT_EQ(*loaded2, 1u);
  EXPECT_FALSE(file.Resolve(kAliceToken).has_value()) << "removed from the file: refused at once";
  EXPECT_EQ(file.Resolve(kBobToken)->role, Role::kViewer);
}

// ---------------------------------------------------------------- ftctl admin against a real ftd

// ftctl with `args` (tests/support/process.h's SpawnFtctl).
Proc Ftctl(const std::string& dir, const std::string& address, const std::vector<std::string>& args,
           const std::string& name) {
  return testing_support::SpawnFtctl(FTCTL_BIN, dir, address, args, name);
}

// The token `ftctl admin user add|token` printed on its last line.
std::string PrintedToken(const std::string& log) {
  std::smatch m;
  return std::regex_search(log, m, std::regex("(ftu_[0-9a-f]+_[0-9a-f]+)")) ? m[1].str() : "";
}

// The gRPC address ftd says it listens on, once it has (waiting up to 30 s); "" when it did not.
std::string ListeningAddress(const Proc& ftd) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::smatch m;
  std::string log;
  while (!std::regex_search(log = ftd.Log(), m, std::regex("listening on (\\S+)"))) {
    if (std::chrono::steady_clock::now() > deadline) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return m[1].str();
}

TEST(FtctlAdminTest, AddListRotateAndRemoveUsersThroughFtctl) {
  const std::string dir = testing_support::FreshDir("ftctl-admin");
  ScopedProc ftd(Spawn({FTD_BIN, "--listen", "127.0.0.1:0", "--data-dir", dir + "/data", "--http", "",
                        "--client-token", "root", "--worker-token", "w"},
                       {.log = dir + "/ftd.log", .truncate_log = true}));
  const std::string address = ListeningAddress(ftd.get());
  ASSERT_FALSE(address.empty()) << ftd->Log();

  Proc add =
      Ftctl(dir, address, {"--token", "root", "admin", "user", "add", "alice", "--team", "nlp"}, "add");
  ASSERT_EQ(add.Wait(), 0) << add.Log();
  EXPECT_THAT(add.Log(), HasSubstr("user alice (member of team nlp)"));
  const std::string token = PrintedToken(add.Log());
  ASSERT_FALSE(token.empty()) << add.Log();
  Proc ls = Ftctl(dir, address, {"--token", "root", "admin", "user", "ls"}, "ls");
  EXPECT_EQ(ls.Wait(), 0);
  EXPECT_THAT(ls.Log(), HasSubstr("alice"));
  EXPECT_THAT(ls.Log(), Not(HasSubstr(token)));
  Proc jobs = Ftctl(dir, address, {"--token", token, "ls"}, "jobs");
  EXPECT_EQ(jobs.Wait(), 0) << jobs.Log();
  EXPECT_THAT(jobs.Log(), HasSubstr("TEAM"));
  Proc member_admin = Ftctl(dir, address, {"--token", token, "admin", "user", "ls"}, "member-admin");
  EXPECT_EQ(member_admin.Wait(), 2);
  EXPECT_THAT(member_admin.Log(), HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(member_admin.Log(), HasSubstr("only admins manage users"));

  Proc rotate = Ftctl(dir, address, {"--token", "root", "admin", "user", "token", "alice"}, "rotate");
  ASSERT_EQ(rotate.Wait(), 0) << rotate.Log();
  const std::string fresh = PrintedToken(rotate.Log());
  ASSERT_FALSE(fresh.empty());
  Proc old = Ftctl(dir, address, {"--token", token, "ls"}, "old");
  EXPECT_EQ(old.Wait(), 2);
  EXPECT_THAT(old.Log(), HasSubstr("UNAUTHENTICATED"));
  Proc remove = Ftctl(dir, address, {"--token", "root", "admin", "user", "remove", "alice"}, "remove");
  EXPECT_EQ(remove.Wait(), 0) << remove.Log();
  Proc gone = Ftctl(dir, address, {"--token", fresh, "ls"}, "gone");
  EXPECT_EQ(gone.Wait(), 2);
  EXPECT_THAT(gone.Log(), HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(ftd->Log(), Not(HasSubstr(fresh)));  // tokens are never logged

  Proc team_set =
      Ftctl(dir, address, {"--token", "root", "admin", "team", "set", "nlp", "--quota", "4", "--weight", "2"},
            "team-set");
  EXPECT_EQ(team_set.Wait(), 0) << team_set.Log();
  EXPECT_THAT(team_set.Log(), HasSubstr("team nlp: quota 4, weight 2"));
  Proc team_ls = Ftctl(dir, address, {"--token", "root", "admin", "team", "ls"}, "team-ls");
  EXPECT_EQ(team_ls.Wait(), 0) << team_ls.Log();
  EXPECT_THAT(team_ls.Log(), HasSubstr("QUOTA"));
  EXPECT_THAT(team_ls.Log(), testing::ContainsRegex("nlp +4 +2 "));

  // Webhooks (issue #44): admins only; the secret ftd makes is printed once, never listed or logged.
  Proc member =
      Ftctl(dir, address, {"--token", "root", "admin", "user", "add", "bea", "--team", "nlp"}, "bea");
  ASSERT_EQ(member.Wait(), 0) << member.Log();
  const std::string fresh_member = PrintedToken(member.Log());
  Proc hook_add = Ftctl(dir, address,
                        {"--token", "root", "admin", "webhook", "add", "https://hooks.example.com/T0/B0/x",
                         "--events", "stalled,failed", "--team", "nlp"},
                        "hook-add");
  ASSERT_EQ(hook_add.Wait(), 0) << hook_add.Log();
  std::smatch hook;
  const std::string hook_log = hook_add.Log();
  ASSERT_TRUE(std::regex_search(hook_log, hook,
                                std::regex("webhook (wh-[0-9a-f]{8}) added[\\s\\S]*\\n([0-9a-f]{64})\\n")))
      << hook_log;
  const std::string hook_id = hook[1].str(), secret = hook[2].str();
  Proc hook_ls = Ftctl(dir, address, {"--token", "root", "admin", "webhook", "ls"}, "hook-ls");
  EXPECT_EQ(hook_ls.Wait(), 0) << hook_ls.Log();
  EXPECT_THAT(hook_ls.Log(), testing::ContainsRegex(hook_id + " +failed,stalled +team nlp +0 "));
  EXPECT_THAT(hook_ls.Log(), Not(HasSubstr(secret)));
  Proc bad_kind =
      Ftctl(dir, address,
            {"--token", "root", "admin", "webhook", "add", "http://127.0.0.1:9/", "--events", "finished"},
            "hook-bad");
  EXPECT_EQ(bad_kind.Wait(), 2);
  EXPECT_THAT(bad_kind.Log(), HasSubstr("unknown kind 'finished'"));
  Proc hook_member = Ftctl(dir, address, {"--token", fresh_member, "admin", "webhook", "ls"}, "hook-member");
  EXPECT_EQ(hook_member.Wait(), 2);
  EXPECT_THAT(hook_member.Log(), HasSubstr("only admins manage webhooks"));
  Proc hook_remove =
      Ftctl(dir, address, {"--token", "root", "admin", "webhook", "remove", hook_id}, "hook-remove");
  EXPECT_EQ(hook_remove.Wait(), 0) << hook_remove.Log();
  EXPECT_THAT(hook_remove.Log(), HasSubstr("removed webhook " + hook_id));
  EXPECT_THAT(ftd->Log(), Not(HasSubstr(secret)));
  EXPECT_THAT(ftd->Log(), Not(HasSubstr("/T0/B0/x"))) << "a receiver's URL may be a secret";
}

// ftd --tokens-file on a real ftd: its users act as themselves; the file rewritten and SIGHUP sent,
// a removed user's token is refused and a new one works, without a restart; a file others may read
// stops ftd at start with the fix.
TEST(FtctlAdminTest, ATokensFileIsReloadedOnSighup) {
  const std::string dir = testing_support::FreshDir("tokens-sighup");
  const std::string tokens = dir + "/tokens";
  WriteTokens(tokens, kAliceToken + ",alice,nlp,member\n", 0644);
  const std::vector<std::string> args = {
      FTD_BIN, "--listen",       "127.0.0.1:0", "--data-dir",    dir + "/data", "--http",
      "",      "--worker-token", "w",           "--tokens-file", tokens};
  Proc readable = Spawn(args, {.log = dir + "/readable.log", .truncate_log = true});
  EXPECT_EQ(readable.Wait(), 2);
  EXPECT_THAT(readable.Log(), HasSubstr("chmod 600 " + tokens));
  ASSERT_EQ(chmod(tokens.c_str(), 0600), 0);
  ScopedProc ftd(Spawn(args, {.log = dir + "/ftd.log", .truncate_log = true}));
  const std::string address = ListeningAddress(ftd.get());
  ASSERT_FALSE(address.empty()) << ftd->Log();
  const auto ls = [&](const std::string& token, const std::string& name) {
    Proc p = Ftctl(dir, address, {"--token", token, "ls"}, name);
    const int rc = p.Wait();  // before the log: it is complete once the process has exited
    return std::make_pair(rc, p.Log());
  };
  EXPECT_EQ(ls(kAliceToken, "alice").first, 0);
  EXPECT_EQ(ls(kBobToken, "bob-before").first, 2);
  WriteTokens(tokens, kBobToken + ",bob,vision,viewer\n");
  ftd->Signal(SIGHUP);
  // The reload happens at ftd's next tick: wait for its word in the log, not for a time.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ftd->Log().find("SIGHUP: 1 users from") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto [alice_rc, alice_log] = ls(kAliceToken, "alice-after");
  EXPECT_EQ(alice_rc, 2);
  EXPECT_THAT(alice_log, HasSubstr("UNAUTHENTICATED"));
  EXPECT_EQ(ls(kBobToken, "bob").first, 0);
  EXPECT_THAT(ftd->Log(), Not(HasSubstr(kBobToken))) << "tokens are never logged";
}

}  // namespace
}  // namespace ft
