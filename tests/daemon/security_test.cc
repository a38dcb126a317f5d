// ftd's entry points and identity under hostile input (issue #28): the same
// malicious job ids fed to the gRPC Jobs service and the HTTP API (both refuse
// with InvalidArgument / 400 and read no file), Daemon::LogPath refusing them
// itself, a duplicate worker id refused while its session lives (the same
// instance reattaches; as processes: the refused worker backs off), a client's
// Watch/Logs streams capped, implausible worker memory refused with an event, a damaged database refused
// at open, and, as real processes, one ftd per data dir, a client token
// without a worker token, and ftctl printing a job name's escape sequences
// escaped.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "common/ids.h"
#include "common/untrusted_text.h"
#include "daemon/daemon.h"
#include "daemon/grpc_service.h"
#include "daemon/http_api.h"
#include "daemon/http_server.h"
#include "engine/io/hf_model.h"
#include "proto/ftune.grpc.pb.h"
#include "tests/daemon/http_test_util.h"
#include "tests/support/process.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_support::Proc;
using testing_support::ScopedProc;
using testing_support::Slurp;
using testing_support::Spawn;

constexpr char kSecret[] = "SECRET-FILE-CONTENT";

// Ids a caller might send instead of a job id, each a way out of DATA_DIR/logs
// or a way to confuse a key.
std::vector<std::string> MaliciousIds() {
  return {"../x",
          "../../../../" + fs::temp_directory_path().string() + "/x",
          "/etc/passwd",
          std::string("j-1\0", 4),
          std::string("j-000001\0.txt", 13),
          "",
          "j-1/../..",
          "j-" + std::string(5000, '1'),
          "j-\xd9\xa1\xd9\xa2",  // Arabic-Indic digits
          "\xc3\xa9t\xc3\xa9",
          "j-1\n",
          "J-000001",
          "j-1 ",
          "%2e%2e"};
}

// Writes a tiny model and data under `dir`/job and returns a job.yaml named `name` for it.
std::string WriteJob(const std::string& dir, const std::string& name) {
  if (!fs::exists(dir + "/job/model")) {
    fs::create_directories(dir + "/job");
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, 1);
    EXPECT_TRUE(SaveHfModel(dir + "/job/model", model, DType::kF32).ok());
    std::ofstream(dir + "/job/data.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";
  }
  return "name: " + name +
         "\nmodel: {path: model, dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n"
         "data: {train: data.jsonl, format: tokens, seq_len: 64}\n"
         "train: {max_steps: 10, global_batch_size: 4}\noutput: {dir: out}\n";
}

class FakeSink : public WorkerSink {
 public:
  void Send(const pb::DaemonCommand& cmd) override { commands.push_back(cmd); }
  void Evict(const std::string& reason) override { evicted = reason; }
  std::vector<pb::DaemonCommand> commands;
  std::string evicted;
};

// A daemon with one job, served over gRPC and HTTP on ephemeral ports; files
// that a path escaping DATA_DIR/logs would reach hold kSecret.
class EntryPointTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::FreshDir(
        "entry-" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    auto store = Store::Open(dir_ + "/ftd.sqlite");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    DaemonOptions o;
    o.data_dir = dir_ + "/data";
    fs::create_directories(o.data_dir + "/logs");
    daemon_ = std::make_unique<Daemon>(std::move(*store), &clock_, o);
    pb::SubmitRequest req;
    req.set_spec_yaml(WriteJob(dir_, "one"));
    req.set_spec_dir(dir_ + "/job");
    auto r = daemon_->Submit(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    job_ = r->job().id();
    // Where "../x" and an id cut at its NUL would lead.
    std::ofstream(o.data_dir + "/x.log") << kSecret;
    std::ofstream(o.data_dir + "/logs/j-1") << kSecret;
    std::ofstream(o.data_dir + "/logs/j-000001") << kSecret;
    std::ofstream(fs::temp_directory_path().string() + "/x.log") << kSecret;

    jobs_ = MakeJobsService(daemon_.get(), {});
    workers_ = MakeWorkersService(daemon_.get(), {});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(jobs_.get());
    builder.RegisterService(workers_.get());
    grpc_server_ = builder.BuildAndStart();
    ASSERT_TRUE(grpc_server_ && port > 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    stub_ = pb::Jobs::NewStub(channel_);

    api_ = std::make_unique<HttpApi>(daemon_.get(), HttpApiOptions{});
    HttpServerOptions http;
    http.address = "127.0.0.1:0";
    auto server = HttpServer::Start(daemon_.get(), api_.get(), http);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    http_server_ = std::move(*server);
  }

  void TearDown() override {
    http_server_.reset();
    if (grpc_server_) grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  }

  // What gRPC Logs answers for `id`: the status and the text it streamed.
  std::pair<grpc::Status, std::string> GrpcLogs(const std::string& id) {
    pb::LogsRequest req;
    req.set_job_id(id);
    auto ctx = Context();
    auto reader = stub_->Logs(ctx.get(), req);
    std::string text;
    pb::LogChunk chunk;
    while (reader->Read(&chunk)) text += chunk.text();
    return {reader->Finish(), text};
  }

  grpc::Status GrpcWatch(const std::string& id) {
    pb::WatchRequest req;
    req.set_job_id(id);
    auto ctx = Context();
    auto reader = stub_->Watch(ctx.get(), req);
    pb::JobUpdate u;
    while (reader->Read(&u)) {
      ctx->TryCancel();  // a stream that started is not a refusal; stop it
    }
    return reader->Finish();
  }

  std::string dir_;
  SystemClock clock_;
  std::unique_ptr<Daemon> daemon_;
  std::string job_;
  std::unique_ptr<pb::Jobs::CallbackService> jobs_;
  std::unique_ptr<pb::Workers::CallbackService> workers_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Jobs::Stub> stub_;
  std::unique_ptr<HttpApi> api_;
  std::unique_ptr<HttpServer> http_server_;
};

std::string PercentEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    char buf[4];
    std::snprintf(buf, sizeof(buf), "%%%02X", c);
    out += std::isalnum(c) || c == '-' ? std::string(1, static_cast<char>(c)) : buf;
  }
  return out;
}

TEST_F(EntryPointTest, MaliciousJobIdsAreRefusedAlikeByGrpcAndHttpAndReadNoFile) {
  for (const std::string& id : MaliciousIds()) {
    const std::string shown = EscapeControlChars(id, 40);
    EXPECT_FALSE(IsValidJobId(id)) << shown;
    // Defence in depth: the daemon itself never makes a path of it.
    EXPECT_TRUE(daemon_->LogPath(id).status().IsInvalidArgument()) << shown;

    auto [logs, text] = GrpcLogs(id);
    EXPECT_EQ(logs.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << shown << ": " << logs.error_message();
    EXPECT_THAT(logs.error_message(), HasSubstr("j-000001")) << shown;  // says what ids look like
    EXPECT_THAT(text, Not(HasSubstr(kSecret))) << shown;
    pb::GetJobRequest get;
    get.set_id(id);
    pb::Job job;
    EXPECT_EQ(stub_->Get(Context().get(), get, &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << shown;
    pb::CancelRequest cancel;
    cancel.set_id(id);
    EXPECT_EQ(stub_->Cancel(Context().get(), cancel, &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << shown;
    if (!id.empty()) {  // "" means every job for these two
      pb::ListEventsRequest events;
      events.set_job_id(id);
      pb::ListEventsReply reply;
      EXPECT_EQ(stub_->ListEvents(Context().get(), events, &reply).error_code(),
                grpc::StatusCode::INVALID_ARGUMENT)
          << shown;
      EXPECT_EQ(GrpcWatch(id).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << shown;
    }

    // HTTP: the id as a path segment and as ?job=, percent-encoded as a browser would.
    const int port = http_server_->port();
    for (const std::string& target :
         {"/api/jobs/" + PercentEncode(id) + "/log", "/api/jobs/" + PercentEncode(id),
          "/api/events?job=" + PercentEncode(id)}) {
      http_test::Reply r = http_test::Fetch(port, "GET", target);
      if (id.empty() && target.rfind("/api/events", 0) == 0) continue;  // "" = every job
      EXPECT_EQ(r.status, 400) << shown << " " << target << ": " << r.body;
      EXPECT_THAT(r.body, Not(HasSubstr(kSecret))) << target;
    }
  }
  // A good id still works on both sides.
  EXPECT_TRUE(GrpcLogs(job_).first.ok());
  EXPECT_EQ(http_test::Fetch(http_server_->port(), "GET", "/api/jobs/" + job_ + "/log").status, 200);
}

// A worker's session over gRPC that sent its Register (`instance`: Register.instance).
struct WorkerStream {
  WorkerStream(pb::Workers::Stub* stub, const std::string& host, const std::string& instance) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream = stub->Session(&ctx);
    pb::WorkerMessage reg;
    reg.mutable_register_()->set_worker_id("w1");
    reg.mutable_register_()->set_hostname(host);
    reg.mutable_register_()->set_instance(instance);
    EXPECT_TRUE(stream->Write(reg));
  }
  // Whether the daemon answered Registered.
  bool Registered() {
    pb::DaemonCommand cmd;
    return stream->Read(&cmd) && cmd.has_registered();
  }
  // How the daemon ended the stream.
  grpc::Status Ended() {
    pb::DaemonCommand cmd;
    while (stream->Read(&cmd)) {
    }
    return stream->Finish();
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<pb::WorkerMessage, pb::DaemonCommand>> stream;
};

// Two ft-workers given one --id must not replace each other forever (each reconnecting within
// ~100 ms): while the id's session lives, another instance is refused, naming the id; the same
// instance (a restarted worker, its instance kept in its work dir) takes its session back at once.
TEST_F(EntryPointTest, ASecondWorkerWithALiveWorkersIdIsRefusedAndTheSameInstanceReattaches) {
  auto stub = pb::Workers::NewStub(channel_);
  WorkerStream first(stub.get(), "node-a", "instance-a");
  ASSERT_TRUE(first.Registered());
  WorkerStream second(stub.get(), "node-b", "instance-b");
  const grpc::Status why = second.Ended();
  EXPECT_EQ(why.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << why.error_message();
  EXPECT_THAT(why.error_message(), HasSubstr("worker id 'w1' is held by another ft-worker (host 'node-a')"));
  EXPECT_THAT(why.error_message(), HasSubstr("node-b"));
  EXPECT_THAT(why.error_message(), HasSubstr("--id"));
  pb::ListEventsRequest req;
  auto events = daemon_->ListEvents(req);
  ASSERT_TRUE(events.ok());
  bool evented = false;
  for (const pb::Event& e : events->events())
    evented |= e.kind() == "refused" && e.worker_id() == "w1" && e.message().find("registration") == 0;
  EXPECT_TRUE(evented);
  auto workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_EQ(workers->workers(0).hostname(), "node-a") << "the live worker keeps its id";

  // The first worker restarts (same instance) before its old stream is seen dead: it takes over.
  WorkerStream restarted(stub.get(), "node-a", "instance-a");
  ASSERT_TRUE(restarted.Registered());
  const grpc::Status replaced = first.Ended();
  EXPECT_EQ(replaced.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(replaced.error_message(), HasSubstr("newer session of the same ft-worker"));
  restarted.ctx.TryCancel();
}

// A client's concurrent Watch and Logs streams are capped: one more is refused with
// RESOURCE_EXHAUSTED naming the cap; a stream that ended makes room again.
TEST_F(EntryPointTest, AClientOverItsWatchStreamCapIsRefusedNamingTheCap) {
  AuthOptions auth;
  auth.max_streams_per_client = 2;
  auto jobs = MakeJobsService(daemon_.get(), auth);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(jobs.get());
  auto server = builder.BuildAndStart();
  ASSERT_TRUE(server && port > 0);
  auto stub = pb::Jobs::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  pb::WatchRequest watch;
  watch.set_job_id(job_);
  struct Open {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<pb::JobUpdate>> reader;
  };
  // A Watch stream that ftd serves (it replayed the job's first event), or null.
  auto open = [&]() -> std::unique_ptr<Open> {
    auto o = std::make_unique<Open>();
    o->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    o->reader = stub->Watch(&o->ctx, watch);
    pb::JobUpdate u;
    if (o->reader->Read(&u)) return o;
    o->reader->Finish();
    return nullptr;
  };
  std::vector<std::unique_ptr<Open>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(open());
    ASSERT_NE(held.back(), nullptr) << "stream " << i + 1 << " of the cap was refused";
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub->Watch(&ctx, watch);
    pb::JobUpdate u;
    EXPECT_FALSE(reader->Read(&u));
    const grpc::Status refused = reader->Finish();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.error_message(), HasSubstr("2 open Watch/Logs streams"));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::LogsRequest logs;
    logs.set_job_id(job_);
    logs.set_follow(true);
    auto reader = stub->Logs(&ctx, logs);
    pb::LogChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  held[0]->ctx.TryCancel();
  held[0]->reader->Finish();
  held[0].reset();
  std::unique_ptr<Open> again;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!again && std::chrono::steady_clock::now() < deadline) again = open();  // once ftd saw it end
  EXPECT_NE(again, nullptr) << "an ended stream still counts";
  held.push_back(std::move(again));
  for (auto& o : held) {
    if (o) o->ctx.TryCancel();
  }
  for (auto& o : held) {
    if (o) o->reader->Finish();
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

// A worker that leaves ftd's commands unread cannot grow ftd's memory without bound: past the
// per-stream cap (1,000 commands) ftd closes its session, saying why (the worker registers again).
TEST_F(EntryPointTest, AWorkerThatLeavesItsCommandsUnreadHasItsSessionClosed) {
  auto stub = pb::Workers::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->Session(&ctx);
  pb::WorkerMessage reg;
  reg.mutable_register_()->set_worker_id("deaf");
  ASSERT_TRUE(stream->Write(reg));
  // Heartbeats each reporting 20,000 attempts of superseded epochs: ftd refuses each with a command
  // (about 1 MB a heartbeat), none of which the worker reads while ftd sends them. The transport
  // takes what its flow-control windows allow (on some machines all of one heartbeat's), so the
  // worker sends more until ftd closes the session: at most 64 (64 MB, far past any window).
  constexpr int kRefusals = 20'000, kMaxHeartbeats = 64;
  pb::WorkerMessage hb;
  for (int i = 0; i < kRefusals; ++i) {
    pb::Progress* p = hb.mutable_heartbeat()->add_progress();
    p->set_job_id(job_);
    p->set_epoch(1'000 + i);
  }
  // Each is sent once ftd handled the one before; a Write that fails or one ftd never handles
  // (the session closed as the Write went out) ends the sending.
  const auto handled = [&](int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (daemon_->message_latency().count() < int64_t{n} && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return daemon_->message_latency().count() >= int64_t{n};
  };
  ASSERT_TRUE(stream->Write(hb));
  ASSERT_TRUE(handled(1)) << "ftd never handled the heartbeat";
  int sent = 1;
  while (sent < kMaxHeartbeats && stream->Write(hb) && handled(sent + 1)) ++sent;
  int read = 0;
  pb::DaemonCommand cmd;
  while (stream->Read(&cmd)) ++read;
  const grpc::Status why = stream->Finish();
  EXPECT_EQ(why.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << why.error_message();
  EXPECT_THAT(why.error_message(), HasSubstr("commands"));
  EXPECT_THAT(why.error_message(), HasSubstr("unread"));
  EXPECT_LT(read, sent * kRefusals);
}

// The kinds of events the daemon recorded for worker `id`.
std::vector<std::string> WorkerEventKinds(Daemon& d, const std::string& id) {
  std::vector<std::string> kinds;
  auto events = d.ListEvents(pb::ListEventsRequest());
  if (!events.ok()) return kinds;
  for (const pb::Event& e : events->events()) {
    if (e.worker_id() == id) kinds.push_back(e.kind() + ": " + e.message());
  }
  return kinds;
}

TEST_F(EntryPointTest, ImplausibleWorkerMemoryIsRefusedWithAnEventNamingTheWorker) {
  auto reg = [](const std::string& id, int64_t total, int64_t free) {
    pb::Register r;
    r.set_worker_id(id);
    pb::Device* d = r.add_devices();
    d->set_kind("cpu");
    d->set_total_bytes(total);
    d->set_free_bytes(free);
    return r;
  };
  FakeSink sink;
  const int64_t gib = int64_t{1} << 30;
  Status negative = daemon_->OnRegister(reg("neg", 8 * gib, -1), &sink);
  EXPECT_TRUE(negative.IsInvalidArgument());
  EXPECT_THAT(negative.message(), HasSubstr("worker 'neg' device cpu:0 reports free_bytes -1"));
  EXPECT_FALSE(daemon_->OnRegister(reg("more", 8 * gib, 9 * gib), &sink).ok());  // free > total
  Status huge = daemon_->OnRegister(reg("huge", int64_t{2} << 50, 0), &sink);    // 2 PiB
  EXPECT_THAT(huge.message(), HasSubstr("total_bytes"));
  EXPECT_THAT(WorkerEventKinds(*daemon_, "neg"), testing::Contains(HasSubstr("worker_refused")));
  auto workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->workers_size(), 0);  // none of them was taken in

  // A good registration, then a heartbeat with free > total: ignored, evented once.
  ASSERT_TRUE(daemon_->OnRegister(reg("good", 8 * gib, 8 * gib), &sink).ok());
  for (int i = 0; i < 3; ++i) {
    pb::WorkerMessage m;
    pb::Device* d = m.mutable_heartbeat()->add_devices();
    d->set_kind("cpu");
    d->set_total_bytes(8 * gib);
    d->set_free_bytes(int64_t{1} << 60);
    daemon_->OnWorkerMessage("good", &sink, m);
  }
  auto kinds = WorkerEventKinds(*daemon_, "good");
  EXPECT_EQ(std::count_if(kinds.begin(), kinds.end(),
                          [](const std::string& k) { return k.rfind("memory_refused", 0) == 0; }),
            1)
      << testing::PrintToString(kinds);
  workers = daemon_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_EQ(workers->workers(0).devices(0).free_bytes(), 8 * gib);  // the last good report stands
}

// A database at `path` with 200 jobs and then one page in the middle
// overwritten with garbage (a disk or a careless copy did it); its header is intact.
void MakeDamagedDatabase(const std::string& path) {
  {
    auto store = Store::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (int i = 0; i < 200; ++i) {
      JobRow row;
      row.name = "job-" + std::to_string(i) + std::string(200, 'x');
      row.spec_yaml = std::string(500, 'y');
      row.client_request_id = "r" + std::to_string(i);
      bool duplicate = false;
      ASSERT_TRUE((*store)->CreateJob(row, &duplicate).ok());
    }
  }                                     // closed: the WAL is checkpointed into the file
  ASSERT_TRUE(Store::Open(path).ok());  // intact: opens
  const auto size = fs::file_size(path);
  ASSERT_GT(size, 16u * 4096);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>((size / 4096 / 2) * 4096));
  const std::string garbage(4096, '\x5a');
  f.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
}

TEST(StoreIntegrity, DamagedDatabasePageIsRefusedAtOpen) {
  const std::string path = testing_support::FreshDir("damaged-db") + "/ftd.sqlite";
  MakeDamagedDatabase(path);
  auto damaged = Store::Open(path);
  ASSERT_FALSE(damaged.ok());
  EXPECT_TRUE(damaged.status().IsCorruption()) << damaged.status().ToString();
  EXPECT_THAT(damaged.status().message(), HasSubstr("quick_check"));
  EXPECT_THAT(damaged.status().message(), HasSubstr("backup"));
}

// ---------------------------------------------------------------- real processes

// Waits until `p`'s log holds `needle` (true) or the process exits or 30 s pass.
bool WaitForLog(Proc& p, const std::string& needle) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (p.Log().find(needle) != std::string::npos) return true;
    if (!p.Alive()) return p.Log().find(needle) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

Proc StartFtd(const std::string& data_dir, const std::string& log, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {FTD_BIN, "--listen", "127.0.0.1:0", "--http", "", "--data-dir", data_dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Spawn(argv, {.log = log, .truncate_log = true});
}

TEST(FtdProcess, SecondFtdOnOneDataDirExitsNamingTheHolder) {
  const std::string dir = testing_support::FreshDir("two-ftd");
  ScopedProc first(StartFtd(dir + "/data", dir + "/ftd1.log"));
  ASSERT_TRUE(WaitForLog(first.get(), "ftd: listening on")) << first->Log();
  Proc second = StartFtd(dir + "/data", dir + "/ftd2.log");
  EXPECT_EQ(second.WaitFor(std::chrono::seconds(30)), 2) << second.Log();
  EXPECT_THAT(second.Log(), HasSubstr("pid " + std::to_string(first->pid)));
  EXPECT_THAT(second.Log(), HasSubstr("--data-dir"));
  EXPECT_TRUE(first->Alive());
  // Once the first is gone the data dir is free again.
  first->Signal(SIGTERM);
  EXPECT_EQ(first->WaitFor(std::chrono::seconds(30)), 0);
  ScopedProc third(StartFtd(dir + "/data", dir + "/ftd3.log"));
  EXPECT_TRUE(WaitForLog(third.get(), "ftd: listening on")) << third->Log();
}

TEST(FtdProcess, ClientTokenWithoutWorkerTokenRefusesToStartUnlessOptedOutOnLoopback) {
  const std::string dir = testing_support::FreshDir("tokenless-workers");
  Proc refused = StartFtd(dir + "/a", dir + "/a.log", {"--client-token", "c"});
  EXPECT_EQ(refused.WaitFor(std::chrono::seconds(30)), 2) << refused.Log();
  EXPECT_THAT(refused.Log(), HasSubstr("--worker-token"));
  Proc wide = Spawn({FTD_BIN, "--listen", "0.0.0.0:0", "--http", "", "--data-dir", dir + "/b",
                     "--client-token", "c", "--allow-tokenless-workers"},
                    {.log = dir + "/b.log"});
  EXPECT_EQ(wide.WaitFor(std::chrono::seconds(30)), 2) << wide.Log();
  EXPECT_THAT(wide.Log(), HasSubstr("loopback"));
  ScopedProc opted(
      StartFtd(dir + "/c", dir + "/c.log", {"--client-token", "c", "--allow-tokenless-workers"}));
  EXPECT_TRUE(WaitForLog(opted.get(), "ftd: listening on")) << opted->Log();
  ScopedProc both(StartFtd(dir + "/d", dir + "/d.log", {"--client-token", "c", "--worker-token", "w"}));
  EXPECT_TRUE(WaitForLog(both.get(), "ftd: listening on")) << both->Log();
}

TEST(FtdProcess, DamagedDatabaseStopsFtdWithTheReason) {
  const std::string dir = testing_support::FreshDir("ftd-damaged");
  fs::create_directories(dir + "/data");
  MakeDamagedDatabase(dir + "/data/ftd.sqlite");
  Proc p = StartFtd(dir + "/data", dir + "/ftd.log");
  EXPECT_EQ(p.WaitFor(std::chrono::seconds(30)), 1) << p.Log();
  EXPECT_THAT(p.Log(), Not(HasSubstr("listening on")));
  EXPECT_THAT(p.Log(), HasSubstr("ftd.sqlite"));
  EXPECT_THAT(p.Log(), HasSubstr("quick_check"));
}

// The address a started ftd printed ("" when it did not).
std::string ListenAddress(const Proc& ftd) {
  std::smatch m;
  const std::string log = ftd.Log();
  return std::regex_search(log, m, std::regex("listening on (\\S+)")) ? m[1].str() : "";
}

// Two ft-worker processes given one --id (different work dirs: different instances): the second
// is refused, says why and backs off (longer each time) instead of replacing the first.
TEST(FtdProcess, TwoWorkersWithOneIdTheSecondIsRefusedSaysWhyAndBacksOff) {
  const std::string dir = testing_support::FreshDir("duplicate-worker");
  ScopedProc ftd(StartFtd(dir + "/data", dir + "/ftd.log"));
  ASSERT_TRUE(WaitForLog(ftd.get(), "ftd: listening on")) << ftd->Log();
  auto worker = [&](const std::string& name) {
    return Spawn({WORKER_BIN, "--daemon", ListenAddress(ftd.get()), "--id", "twin", "--ft-train",
                  FT_TRAIN_BIN, "--work-dir", dir + "/" + name, "--cpu-memory", "1GiB"},
                 {.log = dir + "/" + name + ".log", .truncate_log = true});
  };
  ScopedProc first(worker("first"));
  ASSERT_TRUE(WaitForLog(first.get(), "registered with")) << first->Log();
  ScopedProc second(worker("second"));
  ASSERT_TRUE(WaitForLog(second.get(), "trying again in")) << second->Log();
  EXPECT_THAT(second->Log(), HasSubstr("refused this worker's registration"));
  EXPECT_THAT(second->Log(), HasSubstr("worker id 'twin' is held by another ft-worker"));
  // The second refusal waits longer than the first could (1 s, then 1-2 s: not every 100 ms).
  std::regex waits("trying again in ([0-9.]+) s");
  std::vector<double> seen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (seen.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    seen.clear();
    const std::string log = second->Log();
    for (auto it = std::sregex_iterator(log.begin(), log.end(), waits); it != std::sregex_iterator(); ++it)
      seen.push_back(std::stod((*it)[1]));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(seen.size(), 2u) << second->Log();
  EXPECT_GE(seen[0], 0.5);
  EXPECT_GE(seen[1], 1.0);
  EXPECT_TRUE(WaitForLog(ftd.get(), "registration refused")) << ftd->Log();
  EXPECT_THAT(first->Log(), Not(HasSubstr("replaced"))) << "the first keeps its session";
  EXPECT_TRUE(first->Alive());
}

TEST(FtdProcess, FtctlPrintsTerminalEscapesInNamesEscaped) {
  const std::string dir = testing_support::FreshDir("ftctl-escape");
  ScopedProc ftd(StartFtd(dir + "/data", dir + "/ftd.log"));
  ASSERT_TRUE(WaitForLog(ftd.get(), "ftd: listening on")) << ftd->Log();
  std::smatch m;
  const std::string log = ftd->Log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on (\\S+)")));
  const std::string address = m[1];
  // A job whose name sets the terminal's title and rings its bell.
  const std::string yaml = WriteJob(dir, "\"evil\\e]0;pwned\\a\"");
  std::ofstream(dir + "/job/job.yaml") << yaml;
  Proc submit = Spawn({FTCTL_BIN, "--addr", address, "submit", dir + "/job/job.yaml"},
                      {.log = dir + "/submit.log", .truncate_log = true});
  ASSERT_EQ(submit.Wait(), 0) << submit.Log();
  const std::string id = submit.Log().substr(0, submit.Log().find('\n'));
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"ls"}, {"status", id}, {"events"}}) {
    std::vector<std::string> argv = {FTCTL_BIN, "--addr", address};
    argv.insert(argv.end(), args.begin(), args.end());
    Proc p = Spawn(argv, {.log = dir + "/" + args[0] + ".log", .truncate_log = true});
    ASSERT_EQ(p.Wait(), 0) << p.Log();
    EXPECT_THAT(p.Log(), Not(HasSubstr("\x1b"))) << args[0];
    EXPECT_THAT(p.Log(), Not(HasSubstr("\x07"))) << args[0];
    if (args[0] != "events") {
      EXPECT_THAT(p.Log(), HasSubstr("evil\\x1b]0;pwned\\x07")) << args[0];
    }
  }
}

TEST(UntrustedText, ControlCharactersAreEscapedAndTextIsKept) {
  EXPECT_EQ(EscapeControlChars("plain name ü 模型"), "plain name ü 模型");
  EXPECT_EQ(EscapeControlChars("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
  EXPECT_EQ(EscapeControlChars("a\xc2\x9b"
                               "31mb"),
            "a\\u009b31mb");                                // C1 CSI
  EXPECT_EQ(EscapeControlChars("\x9b\xff"), "\\x9b\\xff");  // not UTF-8
  EXPECT_EQ(EscapeControlChars("abcdef", 3), "abc...");
}

}  // namespace
}  // namespace ft
