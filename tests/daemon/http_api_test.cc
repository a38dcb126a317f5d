// ftd's HTTP side end to end: a real server on an ephemeral port, a real
// daemon (one job running on a fake worker session, one queued), and a real
// HTTP client. Every JSON endpoint with good input, malformed and unknown job
// ids, bad query parameters, wrong methods, tokens, static files and path
// traversal, SSE live updates and Last-Event-ID replay, a slow SSE client being
// dropped, /metrics through promtool, a DPO job's objective metrics (rewards)
// through every view, and /ready on a sticky-failed store;
// per-client bounds (a slow-loris client closed at the header deadline,
// connection caps per client address, /healthz and /ready through a full
// server) and a web dir that serves only the dashboard's assets; the same over
// HTTPS (HttpsTest), with plaintext and untrusting clients refused.
#include "daemon/http_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <thread>

#include "daemon/daemon.h"
#include "daemon/http_server.h"
#include "engine/io/hf_model.h"
#include "tests/daemon/http_test_util.h"
#include "tests/daemon/tiny_job.h"
#include "tests/support/certificate.h"
#include "tests/support/temp_dir.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using http_test::Fetch;
using http_test::FetchFrom;
using http_test::Reply;
using http_test::SseReader;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

class FakeSink : public WorkerSink {
 public:
  void Send(const pb::DaemonCommand& cmd) override { commands.push_back(cmd); }
  std::vector<pb::DaemonCommand> commands;
};

class HttpApiTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::FreshDir(testing::UnitTest::GetInstance()->current_test_info()->name());
    testing_support::WriteTinyJobDir(dir_);
    if (HasFatalFailure()) return;
    fs::create_directories(dir_ + "/web/node_modules/uplot/dist");
    std::ofstream(dir_ + "/web/index.html") << "<!doctype html><title>ftune</title>";
    std::ofstream(dir_ + "/web/app.js") << "console.log('app');";
    std::ofstream(dir_ + "/web/.hidden") << "hidden";
    std::ofstream(dir_ + "/web/node_modules/uplot/dist/uPlot.min.css") << ".uplot{}";
    std::ofstream(dir_ + "/secret.txt") << "TOP-SECRET";

    auto store = Store::Open(dir_ + "/ftd.sqlite");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    DaemonOptions o;
    o.data_dir = dir_ + "/data";
    o.memory_sample_ms = 0;  // store every heartbeat's device memory
    daemon_ = std::make_unique<Daemon>(std::move(*store), &clock_, o);

    running_ = Submit("alpha");
    queued_ = Submit("beta");
    pb::Register reg;
    reg.set_worker_id("w1");
    reg.set_hostname("node-1");
    pb::Device* d = reg.add_devices();
    d->set_kind("cpu");
    d->set_name("host");
    d->set_total_bytes(int64_t{8} << 30);
    d->set_free_bytes(int64_t{8} << 30);
    ASSERT_TRUE(daemon_->OnRegister(reg, &sink_).ok());
    daemon_->Tick();  // places the older job on w1; the other one waits (one job per worker)
    for (const auto& c : sink_.commands) {
      if (!c.has_start()) continue;
      epoch_ = c.start().epoch();
      credential_ = c.start().credential();  // what the worker echoes in its reports
    }
    ASSERT_GT(epoch_, 0);
    SendMetrics(1, 4);
    Heartbeat(4, int64_t{3} << 30);
    std::ofstream(*daemon_->LogPath(running_)) << "step 1\nstep 2\nstep 3\nstep 4 loss 2.5\n";
  }

  void TearDown() override {
    server_.reset();
    api_.reset();
  }

  void Serve(HttpApiOptions options = {}, HttpServerOptions server_options = {}) {
    server_.reset();
    if (options.web_dir.empty()) options.web_dir = dir_ + "/web";
    api_ = std::make_unique<HttpApi>(daemon_.get(), options);
    server_options.address = "127.0.0.1:0";
    auto s = HttpServer::Start(daemon_.get(), api_.get(), server_options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    port_ = server_->port();
  }

  std::string Submit(const std::string& name) { return testing_support::SubmitTinyJob(*daemon_, dir_, name); }

  void SendMetrics(int64_t from, int64_t to) {
    pb::WorkerMessage m;
    m.mutable_metrics()->set_job_id(running_);
    m.mutable_metrics()->set_epoch(epoch_);
    m.mutable_metrics()->set_credential(credential_);
    for (int64_t s = from; s <= to; ++s) {
      pb::MetricPoint* p = m.mutable_metrics()->add_points();
      p->set_step(s);
      p->set_loss(3.0 - 0.1 * static_cast<double>(s));
      p->set_lr(1e-4);
      p->set_time_ms(1'700'000'000'000 + s * 1000);
      if (s % 2 == 1) {  // odd steps report their timing; even ones come from an older trainer
        p->set_step_seconds(0.5);
        p->set_copy_wait_seconds(0.125);
      }
    }
    daemon_->OnWorkerMessage("w1", &sink_, m);
  }

  // What the worker sends for ft-train's evaluation line: eval_loss alone, for the daemon to merge.
  // Subscribes `sse` to the running job's stream, runs `send`, and returns the first point whose
  // data holds `needle` (*text: everything the stream sent so far).
  json StreamedPoint(SseReader& sse, const std::function<void()>& send, const std::string& needle,
                     std::string* text) {
    EXPECT_TRUE(sse.Get("/api/stream?job=" + running_));
    EXPECT_TRUE(sse.ReadUntil("retry:", std::chrono::seconds(5)));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_->open_streams() != 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    send();
    EXPECT_TRUE(sse.ReadUntil(needle, std::chrono::seconds(5))) << sse.text();
    *text = sse.text();
    const size_t at = text->find(needle);
    if (at == std::string::npos) return json();
    const size_t data = text->rfind("data: ", at);
    return json::parse(text->substr(data + 6, text->find('\n', data) - data - 6));
  }

  // A metrics message of the running job's attempt with one point at `step`.
  pb::MetricPoint* NewPoint(pb::WorkerMessage* m, int64_t step) {
    m->mutable_metrics()->set_job_id(running_);
    m->mutable_metrics()->set_epoch(epoch_);
    m->mutable_metrics()->set_credential(credential_);
    pb::MetricPoint* p = m->mutable_metrics()->add_points();
    p->set_step(step);
    return p;
  }

  void SendEval(int64_t step, double eval_loss) {
    pb::WorkerMessage m;
    pb::MetricPoint* p = NewPoint(&m, step);
    p->set_eval_loss(eval_loss);
    p->set_eval_only(true);
    p->set_time_ms(1'700'000'000'000 + step * 1000 + 500);
    daemon_->OnWorkerMessage("w1", &sink_, m);
  }

  // A DPO trainer's step: TRL's means as objective metrics, and names ftd must drop.
  void SendObjective(int64_t step, double margin) {
    pb::WorkerMessage m;
    pb::MetricPoint* p = NewPoint(&m, step);
    p->set_loss(0.5);
    p->set_time_ms(1'700'000'000'000 + step * 1000);
    auto& o = *p->mutable_objective_metrics();
    o["rewards/margins"] = margin;
    o["rewards/accuracies"] = 0.75;
    o["rewards/chosen"] = margin / 2;
    o["rewards/rejected"] = -margin / 2;
    o["logps/chosen"] = std::nan("");
    o["bad\"}\nname"] = 1;  // would break out of a label and a JSON key
    o["Rewards/Upper"] = 2;
    daemon_->OnWorkerMessage("w1", &sink_, m);
  }

  void Heartbeat(int64_t step, int64_t used) {
    // Samples are keyed by their millisecond: keep two heartbeats apart.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    pb::WorkerMessage m;
    pb::Device* d = m.mutable_heartbeat()->add_devices();
    d->set_kind("cpu");
    d->set_name("host");
    d->set_total_bytes(int64_t{8} << 30);
    d->set_used_bytes(used);
    d->set_free_bytes((int64_t{8} << 30) - used);
    pb::Progress* p = m.mutable_heartbeat()->add_progress();
    p->set_job_id(running_);
    p->set_epoch(epoch_);
    p->set_step(step);
    p->set_total_steps(10);
    p->set_loss(2.6);
    p->set_credential(credential_);
    daemon_->OnWorkerMessage("w1", &sink_, m);
  }

  Reply Get(const std::string& target, std::vector<std::pair<std::string, std::string>> headers = {}) {
    return Fetch(port_, "GET", target, headers);
  }
  json GetJson(const std::string& target) {
    Reply r = Get(target);
    EXPECT_EQ(r.status, 200) << target << ": " << r.body;
    return json::parse(r.body, nullptr, false);
  }
  // Expects a 400 whose error names `what`.
  void ExpectBad(const std::string& target, const std::string& what) {
    Reply r = Get(target);
    EXPECT_EQ(r.status, 400) << target << ": " << r.body;
    EXPECT_THAT(r.body, HasSubstr(what)) << target;
    EXPECT_TRUE(json::parse(r.body, nullptr, false).contains("error")) << target << ": " << r.body;
  }

  std::string dir_;
  SystemClock clock_;
  std::unique_ptr<Daemon> daemon_;
  FakeSink sink_;
  std::string running_, queued_;
  int64_t epoch_ = 0;
  std::string credential_;  // the running attempt's (StartAttempt.credential)
  std::unique_ptr<HttpApi> api_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

TEST_F(HttpApiTest, EndpointTableListsEveryRouteWithHelp) {
  Serve();
  json e = GetJson("/api/endpoints");
  ASSERT_TRUE(e["endpoints"].is_array());
  std::map<std::string, json> by_path;
  for (const json& x : e["endpoints"]) {
    EXPECT_FALSE(x["help"].get<std::string>().empty());
    by_path[x["method"].get<std::string>() + " " + x["path"].get<std::string>()] = x;
  }
  for (const char* p : {"GET /api/jobs", "GET /api/jobs/{id}", "GET /api/jobs/{id}/metrics",
                        "GET /api/jobs/{id}/memory", "GET /api/jobs/{id}/events", "GET /api/jobs/{id}/log",
                        "POST /api/jobs/{id}/cancel", "GET /api/workers", "GET /api/events",
                        "GET /api/stream", "GET /metrics", "GET /healthz", "GET /ready"}) {
    ASSERT_TRUE(by_path.count(p)) << p;
  }
  EXPECT_TRUE(by_path["POST /api/jobs/{id}/cancel"]["changes_state"].get<bool>());
  EXPECT_FALSE(by_path["GET /api/jobs"]["changes_state"].get<bool>());
}

TEST_F(HttpApiTest, JobsListIsNewestFirstWithCountsSparklinesAndFilters) {
  Serve();
  json all = GetJson("/api/jobs");
  ASSERT_EQ(all["jobs"].size(), 2u);
  EXPECT_EQ(all["jobs"][0]["id"], queued_);  // newest first
  EXPECT_EQ(all["jobs"][1]["id"], running_);
  EXPECT_EQ(all["counts"]["running"], 1);
  EXPECT_EQ(all["counts"]["queued"], 1);
  EXPECT_EQ(all["counts"]["succeeded"], 0);
  const json& r = all["jobs"][1];
  EXPECT_EQ(r["name"], "alpha");
  EXPECT_EQ(r["state"], "running");
  EXPECT_EQ(r["worker_id"], "w1");
  EXPECT_EQ(r["attempts"], 1);
  EXPECT_EQ(r["steps_done"], 4);
  EXPECT_EQ(r["total_steps"], 10);
  EXPECT_DOUBLE_EQ(r["last_loss"].get<double>(), 2.6);
  ASSERT_EQ(r["loss_spark"].size(), 4u);  // 4 steps of 10: one per bucket
  EXPECT_NEAR(r["loss_spark"][0].get<double>(), 2.9, 1e-9);
  EXPECT_NEAR(r["loss_spark"][3].get<double>(), 2.6, 1e-9);
  for (const char* key : {"reason", "priority", "created_ms", "updated_ms", "tokens_per_s", "committed_step",
                          "preemptions", "failures", "eta_s"}) {
    EXPECT_TRUE(r.contains(key)) << key;
  }
  EXPECT_TRUE(all["jobs"][0]["eta_s"].is_null());  // queued: unknown
  EXPECT_TRUE(all["jobs"][0]["loss_spark"].empty());

  json running = GetJson("/api/jobs?state=running");
  ASSERT_EQ(running["jobs"].size(), 1u);
  EXPECT_EQ(running["jobs"][0]["id"], running_);
  EXPECT_EQ(GetJson("/api/jobs?state=queued,running")["jobs"].size(), 2u);
  EXPECT_EQ(GetJson("/api/jobs?state=failed")["jobs"].size(), 0u);
  json q = GetJson("/api/jobs?q=BET");
  ASSERT_EQ(q["jobs"].size(), 1u);
  EXPECT_EQ(q["jobs"][0]["name"], "beta");
  EXPECT_EQ(GetJson("/api/jobs?q=" + running_)["jobs"].size(), 1u);
  EXPECT_EQ(GetJson("/api/jobs?limit=1")["jobs"][0]["id"], queued_);
  // q is a literal substring: LIKE's wildcards match only themselves.
  EXPECT_EQ(GetJson("/api/jobs?q=%25")["jobs"].size(), 0u);
  EXPECT_EQ(GetJson("/api/jobs?q=_")["jobs"].size(), 0u);
  EXPECT_EQ(GetJson("/api/jobs?q=a_p")["jobs"].size(), 0u);
  // The filter, order and limit apply together (in SQL): newest matching first, then the limit.
  const std::string third = Submit("alphabet");
  json page = GetJson("/api/jobs?q=ALPHA&limit=1");
  ASSERT_EQ(page["jobs"].size(), 1u);
  EXPECT_EQ(page["jobs"][0]["id"], third);
  json two = GetJson("/api/jobs?q=alpha&state=queued,running");
  ASSERT_EQ(two["jobs"].size(), 2u);
  EXPECT_EQ(two["jobs"][0]["id"], third);
  EXPECT_EQ(two["jobs"][1]["id"], running_);
  EXPECT_EQ(GetJson("/api/jobs")["counts"]["queued"], 2);  // counts stay unfiltered

  ExpectBad("/api/jobs?state=runing", "state");
  ExpectBad("/api/jobs?limit=-1", "limit");
  ExpectBad("/api/jobs?limit=ten", "limit");
  ExpectBad("/api/jobs?limit=10001", "limit");
  ExpectBad("/api/jobs?lmit=5", "lmit");
}

TEST_F(HttpApiTest, JobDetailHasAttemptsPlanSpecAndPrediction) {
  Serve();
  json j = GetJson("/api/jobs/" + running_);
  EXPECT_EQ(j["id"], running_);
  EXPECT_EQ(j["state"], "running");
  ASSERT_EQ(j["attempts_list"].size(), 1u);
  const json& a = j["attempts_list"][0];
  EXPECT_EQ(a["number"], 1);
  EXPECT_EQ(a["epoch"], epoch_);
  EXPECT_EQ(a["worker_id"], "w1");
  EXPECT_EQ(a["outcome"], "running");
  EXPECT_EQ(a["end_step"], 4);
  EXPECT_GE(a["micro_batch"].get<int64_t>(), 1);
  EXPECT_EQ(a["micro_batch"].get<int64_t>() * a["accumulation"].get<int64_t>(), 4);
  EXPECT_EQ(j["plan"]["micro_batch"], a["micro_batch"]);
  EXPECT_EQ(j["plan"]["world"], 1);
  EXPECT_GT(j["predicted_bytes"].get<int64_t>(), 0);
  EXPECT_THAT(j["spec_yaml"].get<std::string>(), HasSubstr("max_steps: 10"));
  EXPECT_THAT(j["output_dir"].get<std::string>(), HasSubstr("out-alpha"));
  // Goodput (#31): the job's device-second split, and the one attempt's, which is all of it.
  const char* kSplit[] = {"productive_s", "checkpoint_s", "restart_s", "lost_s"};
  ASSERT_TRUE(j.contains("goodput")) << j.dump();
  const json& g = j["goodput"];
  for (const char* k : kSplit) {
    ASSERT_TRUE(g[k].is_number()) << k << ": " << g.dump();
    EXPECT_GE(g[k].get<double>(), 0) << k;
    ASSERT_TRUE(a["goodput"][k].is_number()) << k << ": " << a.dump();
    EXPECT_EQ(a["goodput"][k], g[k]) << k;
  }
  EXPECT_EQ(g["lost_s"], 0);  // a running attempt has lost nothing yet
  EXPECT_GE(g["goodput"].get<double>(), 0);
  EXPECT_LE(g["goodput"].get<double>(), 1);
  EXPECT_GE(g["queue_s"].get<double>(), 0);
  EXPECT_TRUE(g["recovery_s"].is_array() && g["recovery_s"].empty()) << g.dump();

  json q = GetJson("/api/jobs/" + queued_);
  EXPECT_TRUE(q["plan"].is_null());
  EXPECT_EQ(q["predicted_bytes"], 0);
  EXPECT_TRUE(q["attempts_list"].empty());
  for (const char* k : kSplit) EXPECT_EQ(q["goodput"][k], 0) << k;
  EXPECT_EQ(q["goodput"]["goodput"], 1);  // no device time yet

  for (const char* bad : {"x", "j-", "j-12a", "J-000001", "j-000001x"})
    ExpectBad(std::string("/api/jobs/") + bad, bad);
  Reply missing = Get("/api/jobs/j-999999");
  EXPECT_EQ(missing.status, 404) << missing.body;
  EXPECT_THAT(missing.body, HasSubstr("j-999999"));
  ExpectBad("/api/jobs/" + running_ + "?verbose=1", "verbose");
}

TEST_F(HttpApiTest, MetricsAreInStepOrderAndPageByAfterStep) {
  Serve();
  SendMetrics(5, 7);
  json m = GetJson("/api/jobs/" + running_ + "/metrics");
  ASSERT_EQ(m["points"].size(), 7u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(m["points"][i]["step"], static_cast<int64_t>(i + 1));
  const json& p = m["points"][0];
  for (const char* key : {"step", "epoch", "time_ms", "loss", "lr", "grad_norm", "tokens_per_s", "peak_bytes",
                          "eval_loss", "step_seconds", "copy_wait_seconds"}) {
    EXPECT_TRUE(p.contains(key)) << key;
  }
  EXPECT_EQ(p["epoch"], epoch_);
  EXPECT_EQ(p["step_seconds"], 0.5);
  EXPECT_EQ(p["copy_wait_seconds"], 0.125);
  EXPECT_TRUE(m["points"][1]["step_seconds"].is_null()) << "not reported";
  EXPECT_TRUE(m["points"][1]["copy_wait_seconds"].is_null());
  EXPECT_TRUE(p["eval_loss"].is_null()) << "no evaluation at this step";
  json after = GetJson("/api/jobs/" + running_ + "/metrics?after_step=5&limit=1");
  ASSERT_EQ(after["points"].size(), 1u);
  EXPECT_EQ(after["points"][0]["step"], 6);
  ExpectBad("/api/jobs/" + running_ + "/metrics?after_step=-3", "after_step");
  ExpectBad("/api/jobs/" + running_ + "/metrics?limit=1e3", "limit");
  ExpectBad("/api/jobs/nope/metrics", "nope");
  EXPECT_EQ(Get("/api/jobs/j-424242/metrics").status, 404);
}

TEST_F(HttpApiTest, MemoryHasHeartbeatSamplesAndThePrediction) {
  Serve();
  Heartbeat(5, int64_t{4} << 30);
  json m = GetJson("/api/jobs/" + running_ + "/memory");
  ASSERT_EQ(m["samples"].size(), 2u);
  EXPECT_EQ(m["samples"][0]["used_bytes"], int64_t{3} << 30);
  EXPECT_EQ(m["samples"][1]["used_bytes"], int64_t{4} << 30);
  EXPECT_EQ(m["samples"][1]["total_bytes"], int64_t{8} << 30);
  EXPECT_EQ(m["samples"][1]["worker_id"], "w1");
  EXPECT_EQ(m["samples"][1]["device"], 0);
  EXPECT_GT(m["predicted_bytes"].get<int64_t>(), 0);
  const int64_t first = m["samples"][0]["time_ms"];
  EXPECT_LE(GetJson("/api/jobs/" + running_ + "/memory?after_ms=" + std::to_string(first))["samples"].size(),
            1u);
  EXPECT_TRUE(GetJson("/api/jobs/" + queued_ + "/memory")["samples"].empty());
  ExpectBad("/api/jobs/" + running_ + "/memory?after_ms=yesterday", "after_ms");
  EXPECT_EQ(Get("/api/jobs/j-424242/memory").status, 404);
}

TEST_F(HttpApiTest, EventsOfOneJobAndOfAll) {
  Serve();
  json e = GetJson("/api/jobs/" + running_ + "/events");
  ASSERT_GE(e["events"].size(), 2u);
  EXPECT_EQ(e["events"][0]["kind"], "queued");
  EXPECT_EQ(e["events"][1]["kind"], "started");
  EXPECT_EQ(e["events"][1]["worker_id"], "w1");
  for (const json& x : e["events"]) EXPECT_EQ(x["job_id"], running_);
  const int64_t first = e["events"][0]["seq"];
  json after = GetJson("/api/jobs/" + running_ + "/events?after_seq=" + std::to_string(first));
  EXPECT_EQ(after["events"].size(), e["events"].size() - 1);

  json all = GetJson("/api/events");
  std::set<std::string> kinds;
  for (const json& x : all["events"]) kinds.insert(x["kind"]);
  EXPECT_TRUE(kinds.count("worker_joined"));
  EXPECT_EQ(GetJson("/api/events?limit=2")["events"].size(), 2u);
  json one = GetJson("/api/events?job=" + queued_);
  ASSERT_FALSE(one["events"].empty());
  for (const json& x : one["events"]) EXPECT_EQ(x["job_id"], queued_);

  ExpectBad("/api/events?after_seq=x", "after_seq");
  ExpectBad("/api/events?job=oops", "oops");
  ExpectBad("/api/jobs/" + running_ + "/events?limit=99999", "limit");
  EXPECT_EQ(Get("/api/events?job=j-424242").status, 404);
  EXPECT_EQ(Get("/api/jobs/j-424242/events").status, 404);
}

TEST_F(HttpApiTest, LogTailIsPlainTextOfTheLastBytes) {
  Serve();
  Reply all = Get("/api/jobs/" + running_ + "/log");
  EXPECT_EQ(all.status, 200);
  EXPECT_THAT(all.headers["Content-Type"], HasSubstr("text/plain"));
  EXPECT_EQ(all.body, "step 1\nstep 2\nstep 3\nstep 4 loss 2.5\n");
  EXPECT_EQ(Get("/api/jobs/" + running_ + "/log?tail_bytes=4").body, "2.5\n");
  Reply none = Get("/api/jobs/" + queued_ + "/log");
  EXPECT_EQ(none.status, 200);
  EXPECT_EQ(none.body, "");
  ExpectBad("/api/jobs/" + running_ + "/log?tail_bytes=-1", "tail_bytes");
  ExpectBad("/api/jobs/" + running_ + "/log?tail_bytes=999999999999", "tail_bytes");
  EXPECT_EQ(Get("/api/jobs/j-424242/log").status, 404);
}

TEST_F(HttpApiTest, CancelChangesStateOnceAndNeedsPost) {
  Serve();
  const std::vector<std::pair<std::string, std::string>> json_body = {{"Content-Type", "application/json"}};
  Reply r = Fetch(port_, "POST", "/api/jobs/" + queued_ + "/cancel", json_body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["state"], "cancelled");
  EXPECT_TRUE(j.contains("attempts_list"));
  EXPECT_EQ(GetJson("/api/jobs/" + queued_)["state"], "cancelled");
  Reply again = Fetch(port_, "POST", "/api/jobs/" + queued_ + "/cancel", json_body);
  EXPECT_EQ(again.status, 409) << again.body;
  EXPECT_THAT(again.body, HasSubstr("already ended"));
  Reply get = Get("/api/jobs/" + running_ + "/cancel");
  EXPECT_EQ(get.status, 405);
  EXPECT_EQ(get.headers["Allow"], "POST");
  EXPECT_EQ(Fetch(port_, "POST", "/api/jobs/j-424242/cancel", json_body).status, 404);
  EXPECT_EQ(Fetch(port_, "POST", "/api/jobs/bad/cancel", json_body).status, 400);
}

TEST_F(HttpApiTest, WrongMethodIs405AndUnknownPathIs404) {
  Serve();
  for (const char* method : {"POST", "PUT", "DELETE"}) {
    Reply r = Fetch(port_, method, "/api/jobs");
    EXPECT_EQ(r.status, 405) << method;
    EXPECT_EQ(r.headers["Allow"], "GET") << method;
    EXPECT_THAT(r.body, HasSubstr("error"));
  }
  EXPECT_EQ(Fetch(port_, "DELETE", "/api/jobs/" + running_).status, 405);
  Reply unknown = Get("/api/nothing/here");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(unknown.body, HasSubstr("/api/endpoints"));
}

TEST_F(HttpApiTest, WorkersShowDevicesAndTheRunningJob) {
  Serve();
  json w = GetJson("/api/workers");
  ASSERT_EQ(w["workers"].size(), 1u);
  const json& x = w["workers"][0];
  EXPECT_EQ(x["id"], "w1");
  EXPECT_EQ(x["hostname"], "node-1");
  EXPECT_TRUE(x["alive"].get<bool>());
  EXPECT_EQ(x["running_job_id"], running_);
  EXPECT_GT(x["last_heartbeat_ms"].get<int64_t>(), 0);
  ASSERT_EQ(x["devices"].size(), 1u);
  EXPECT_EQ(x["devices"][0]["used_bytes"], int64_t{3} << 30);  // from the heartbeat, not the registration
  EXPECT_EQ(x["devices"][0]["kind"], "cpu");
  ExpectBad("/api/workers?all=1", "all");
}

// The pool named `name` in /api/workers' pools (null when absent).
json PoolNamed(const json& workers, const std::string& name) {
  for (const json& p : workers["pools"])
    if (p["pool"] == name) return p;
  return nullptr;
}

TEST_F(HttpApiTest, WorkersPoolsShowThePriorUntilAPreemptionThenTheMeasuredMtbfAndGoodput) {
  // A second worker in a pool of its own (ft-worker --pool): listed with its live worker and the prior.
  pb::Register reg;
  reg.set_worker_id("w2");
  reg.set_hostname("node-2");
  reg.set_pool("a100-spot");
  FakeSink other;
  ASSERT_TRUE(daemon_->OnRegister(reg, &other).ok());
  Serve();
  // No attempt has ended: M is the 1-hour prior (checkpoint.every auto, engine/job/checkpoint_interval.h).
  json workers = GetJson("/api/workers");
  ASSERT_EQ(workers["pools"].size(), 2u) << workers.dump();
  json pool = PoolNamed(workers, "default");
  for (const char* key : {"pool", "workers_alive", "attempts", "attempt_seconds", "preemptions",
                          "preemptions_per_hour", "mtbf_s", "mtbf_is_prior", "goodput"}) {
    EXPECT_TRUE(pool.contains(key)) << key << " in " << pool.dump();
  }
  EXPECT_EQ(pool["workers_alive"], 1);
  EXPECT_EQ(PoolNamed(workers, "a100-spot")["workers_alive"], 1);
  EXPECT_EQ(workers["workers"][1]["pool"], "a100-spot");
  EXPECT_EQ(pool["attempt_seconds"], 0.0);
  EXPECT_EQ(pool["preemptions"], 0);
  EXPECT_EQ(pool["preemptions_per_hour"], 0.0);
  EXPECT_EQ(pool["mtbf_s"], 3600.0);
  EXPECT_TRUE(pool["mtbf_is_prior"].get<bool>());

  // The running attempt ends preempted: M is its wall time, the rate one per that time.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the attempt lasts a measurable time
  pb::WorkerMessage m;
  pb::AttemptExited* e = m.mutable_exited();
  e->set_job_id(running_);
  e->set_epoch(epoch_);
  e->set_outcome(pb::ATTEMPT_PREEMPTED);
  e->set_step(4);
  e->set_reason("spot reclaimed");
  e->set_credential(credential_);
  daemon_->OnWorkerMessage("w1", &sink_, m);
  workers = GetJson("/api/workers");
  pool = PoolNamed(workers, "default");
  const double seconds = pool["attempt_seconds"].get<double>();
  EXPECT_GT(seconds, 0.0);
  EXPECT_LT(seconds, 600.0);
  EXPECT_EQ(pool["preemptions"], 1);
  EXPECT_DOUBLE_EQ(pool["mtbf_s"].get<double>(), seconds);
  EXPECT_DOUBLE_EQ(pool["preemptions_per_hour"].get<double>(), 3600.0 / seconds);
  EXPECT_FALSE(pool["mtbf_is_prior"].get<bool>());
  // The ended attempt's goodput split, in its pool and on its worker: the same device time.
  const json& g = pool["goodput"];
  const double device = g["productive_s"].get<double>() + g["checkpoint_s"].get<double>() +
                        g["restart_s"].get<double>() + g["lost_s"].get<double>();
  EXPECT_NEAR(device, seconds, 1e-9) << g.dump();
  EXPECT_EQ(pool["attempts"], 1);
  EXPECT_EQ(workers["workers"][0]["id"], "w1");
  EXPECT_EQ(workers["workers"][0]["goodput"]["restart_s"], g["restart_s"]);
  EXPECT_EQ(workers["workers"][0]["goodput"]["productive_s"], g["productive_s"]);
  EXPECT_TRUE(PoolNamed(workers, "a100-spot")["mtbf_is_prior"].get<bool>()) << "another pool's M is its own";
}

TEST_F(HttpApiTest, TokensGuardActionsAndOptionallyViewing) {
  Serve({.client_token = "act", .view_token = "look"});
  EXPECT_EQ(Get("/api/jobs").status, 401);
  EXPECT_EQ(Get("/api/jobs", {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(Get("/api/jobs", {{"Authorization", "Bearer look"}}).status, 200);
  EXPECT_EQ(Get("/api/jobs?token=look").status, 200);
  EXPECT_EQ(Get("/api/jobs?token=act").status, 200);  // the client token may view too
  EXPECT_EQ(Get("/").status, 401);
  EXPECT_EQ(Get("/healthz").status, 200);
  EXPECT_EQ(Get("/metrics").status, 200);
  // A page opened with ?token sets a cookie so that its own files load.
  Reply page = Get("/?token=look");
  ASSERT_EQ(page.status, 200);
  EXPECT_THAT(page.headers["Set-Cookie"], HasSubstr("ftune_token=look"));
  EXPECT_EQ(Get("/app.js", {{"Cookie", "ftune_token=look"}}).status, 200);
  // Actions need the client token, by header or query, never the view token or a cookie.
  const std::string cancel = "/api/jobs/" + queued_ + "/cancel";
  Reply denied = Fetch(port_, "POST", cancel, {{"Authorization", "Bearer look"}});
  EXPECT_EQ(denied.status, 401);
  EXPECT_THAT(denied.body, HasSubstr("client token"));
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Cookie", "ftune_token=act"}}).status, 401);
  EXPECT_EQ(GetJson("/api/jobs/" + queued_ + "?token=look")["state"], "queued");
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Authorization", "Bearer act"}}).status, 200);
  EXPECT_EQ(Fetch(port_, "POST", "/api/jobs/" + running_ + "/cancel?token=act").status, 200);

  // With only a client token, actions and reads need it (ReadsNeedATokenWhenOnlyAClientTokenIsSet).
  Serve({.client_token = "act"});
  EXPECT_EQ(Get("/api/jobs").status, 401);
  EXPECT_EQ(Get("/api/jobs?token=act").status, 200);
  EXPECT_EQ(Fetch(port_, "POST", "/api/jobs/" + running_ + "/cancel").status, 401);
}

// gRPC refuses every read without the client token; HTTP must not serve job
// specs, output paths, logs or events to anyone who can reach it instead.
TEST_F(HttpApiTest, ReadsNeedATokenWhenOnlyAClientTokenIsSet) {
  Serve({.client_token = "act"});
  for (const std::string& target : std::vector<std::string>{
           "/api/jobs", "/api/jobs/" + running_, "/api/jobs/" + running_ + "/log",
           "/api/jobs/" + running_ + "/events", "/api/jobs/" + running_ + "/metrics",
           "/api/jobs/" + running_ + "/memory", std::string("/api/events"), std::string("/api/workers"),
           std::string("/api/endpoints"), std::string("/"), std::string("/app.js")}) {
    Reply open = Get(target);
    EXPECT_EQ(open.status, 401) << target << ": " << open.body;
    EXPECT_THAT(open.body, Not(HasSubstr("out-alpha"))) << target;    // no output path
    EXPECT_THAT(open.body, Not(HasSubstr("step 4 loss"))) << target;  // no log
    EXPECT_THAT(open.body, HasSubstr("--client-token")) << target;    // says which token works
    EXPECT_EQ(Get(target, {{"Authorization", "Bearer act"}}).status, 200) << target;
  }
  SseReader sse(port_);
  ASSERT_TRUE(sse.Get("/api/stream"));
  EXPECT_TRUE(sse.ReadUntil("401", std::chrono::seconds(5))) << sse.text();
  // The dashboard opened with the token gets its cookie; the open endpoints stay open.
  Reply page = Get("/?token=act");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(Get("/api/jobs", {{"Cookie", "ftune_token=act"}}).status, 200);
  for (const char* open : {"/metrics", "/healthz", "/ready"}) EXPECT_EQ(Get(open).status, 200) << open;
}

TEST_F(HttpApiTest, OnlyAViewTokenStillGuardsActionsAndTheCookieIsNeverTheRequestsBytes) {
  Serve({.view_token = "look"});
  const std::string cancel = "/api/jobs/" + queued_ + "/cancel";
  EXPECT_EQ(Fetch(port_, "POST", cancel).status, 401);  // an action is never less guarded than a read
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Cookie", "ftune_token=look"}}).status, 401);
  // A ?token= that is not a configured token sets no cookie, and a matching one
  // sets the configured value (no header injection through the query).
  EXPECT_EQ(Get("/?token=look%0d%0aX-Evil:%201").status, 401);
  Reply page = Get("/?token=look");
  EXPECT_EQ(page.headers["Set-Cookie"].rfind("ftune_token=look; ", 0), 0u) << page.headers["Set-Cookie"];
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Authorization", "Bearer look"}}).status, 200);
}

TEST_F(HttpApiTest, CrossSiteActionsAreRefusedEvenWithoutTokens) {
  Serve();
  const std::string cancel = "/api/jobs/" + queued_ + "/cancel";
  // A form on another site POSTing here (browsers send these headers).
  Reply evil = Fetch(port_, "POST", cancel, {{"Origin", "http://evil.example"}});
  EXPECT_EQ(evil.status, 403);
  EXPECT_THAT(evil.body, HasSubstr("cross-site"));
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Sec-Fetch-Site", "cross-site"}}).status, 403);
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Sec-Fetch-Site", "same-site"}}).status, 403);
  EXPECT_EQ(GetJson("/api/jobs/" + queued_)["state"], "queued");
  // The dashboard itself (same origin, as web/api.js posts) and non-browser clients may.
  const std::string self = "http://127.0.0.1:" + std::to_string(port_);
  EXPECT_EQ(Fetch(port_, "POST", cancel,
                  {{"Origin", self},
                   {"Host", "127.0.0.1:" + std::to_string(port_)},
                   {"Sec-Fetch-Site", "same-origin"},
                   {"Content-Type", "application/json"}})
                .status,
            200);
}

// What got through before: a page on another site POSTing text/plain (a form,
// sendBeacon, fetch no-cors) where the browser sends no Sec-Fetch-Site and the
// Origin is dropped or "null"-ed away by a redirect or an old browser, and a
// DNS-rebinding page (its own name resolving to 127.0.0.1) whose Origin
// matches its Host. ftd without tokens must refuse both.
TEST_F(HttpApiTest, TokenlessCrossSiteCancelIsRefused) {
  Serve();
  const std::string cancel = "/api/jobs/" + queued_ + "/cancel";
  Reply plain = Fetch(port_, "POST", cancel, {{"Content-Type", "text/plain"}});
  EXPECT_EQ(plain.status, 403) << plain.body;
  EXPECT_THAT(plain.body, HasSubstr("Content-Type: application/json"));
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Content-Type", "application/x-www-form-urlencoded"}}).status,
            403);
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Origin", "null"}, {"Content-Type", "application/json"}}).status,
            403);
  const std::string rebound = "rebind.example:" + std::to_string(port_);
  Reply rebinding = Fetch(port_, "POST", cancel,
                          {{"Host", rebound},
                           {"Origin", "http://" + rebound},
                           {"Sec-Fetch-Site", "same-origin"},
                           {"Content-Type", "application/json"}});
  EXPECT_EQ(rebinding.status, 421) << rebinding.body;
  EXPECT_EQ(GetJson("/api/jobs/" + queued_)["state"], "queued");
  // curl with the header it documents.
  EXPECT_EQ(Fetch(port_, "POST", cancel, {{"Content-Type", "application/json"}}).status, 200);
}

TEST_F(HttpApiTest, ForeignHostIsRefusedUnlessAllowedByFlag) {
  Serve();
  const std::string port = std::to_string(port_);
  Reply foreign = Get("/api/jobs", {{"Host", "attacker.example:" + port}});
  EXPECT_EQ(foreign.status, 421) << foreign.body;
  EXPECT_THAT(foreign.body, HasSubstr("--http-allowed-host attacker.example"));
  EXPECT_EQ(Get("/", {{"Host", "attacker.example"}}).status, 421);
  for (const std::string& host :
       std::vector<std::string>{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST", "127.0.0.5:" + port,
                                "[::1]:" + port, "10.1.2.3", "dash.localhost:" + port, std::string()}) {
    EXPECT_EQ(Get("/api/jobs", {{"Host", host}}).status, 200) << host;
  }
  // Probes and Prometheus scraping by name reach the open endpoints.
  EXPECT_EQ(Get("/metrics", {{"Host", "ftd-host:" + port}}).status, 200);
  EXPECT_EQ(Get("/healthz", {{"Host", "ftd-host"}}).status, 200);
  // A name the operator allows (ftd --http-allowed-host).
  Serve({.allowed_hosts = {"ftd.example.org"}});
  EXPECT_EQ(Get("/api/jobs", {{"Host", "ftd.example.org:" + std::to_string(port_)}}).status, 200);
  EXPECT_EQ(Get("/api/jobs", {{"Host", "FTD.example.org."}}).status, 200);
  EXPECT_EQ(Get("/api/jobs", {{"Host", "other.example.org"}}).status, 421);
}

TEST_F(HttpApiTest, StaticFilesAndNoWayOutOfTheWebDir) {
  Serve();
  Reply index = Get("/");
  EXPECT_EQ(index.status, 200);
  EXPECT_THAT(index.headers["Content-Type"], HasSubstr("text/html"));
  EXPECT_THAT(index.body, HasSubstr("<title>ftune</title>"));
  Reply js = Get("/app.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_THAT(js.headers["Content-Type"], HasSubstr("javascript"));
  Reply css = Get("/vendor/uPlot.min.css");
  EXPECT_EQ(css.status, 200);
  EXPECT_THAT(css.headers["Content-Type"], HasSubstr("text/css"));
  EXPECT_EQ(css.body, ".uplot{}");
  EXPECT_EQ(Get("/missing.js").status, 404);
  EXPECT_EQ(Get("/vendor/missing.js").status, 404);
  EXPECT_EQ(Get("/.hidden").status, 404);
  EXPECT_EQ(Get("/node_modules").status, 404);  // a directory is not a file
  for (const char* attack :
       {"/../secret.txt", "/%2e%2e/secret.txt", "/%2E%2E%2Fsecret.txt", "/..%2fsecret.txt",
        "/vendor/../../../../secret.txt", "/vendor/..%2f..%2f..%2f..%2fsecret.txt",
        "/vendor/%2e%2e/%2e%2e/%2e%2e/%2e%2e/secret.txt", "/%2fetc%2fpasswd", "/a%00.js", "/%zz"}) {
    Reply r = Get(attack);
    EXPECT_GE(r.status, 400) << attack;
    EXPECT_LT(r.status, 500) << attack;
    EXPECT_THAT(r.body, Not(HasSubstr("TOP-SECRET"))) << attack;
    EXPECT_THAT(r.body, Not(HasSubstr("root:"))) << attack;
  }
}

TEST_F(HttpApiTest, TheWebDirServesOnlyTheDashboardsAssetsAndNo404NamesItsPath) {
  const std::string web = dir_ + "/web";
  fs::create_directories(web + "/.git");
  for (const char* source : {"CMakeLists.txt", "package.json", "package-lock.json",
                             "node_modules/uplot/package.json", "node_modules/uplot/dist/package.json",
                             ".git/config", ".gitignore", "notes.txt", "app.js.map", "build.sh"}) {
    std::ofstream(web + "/" + source) << "SOURCE";
  }
  Serve();
  for (const char* target :
       {"/CMakeLists.txt", "/package.json", "/package-lock.json", "/node_modules/uplot/package.json",
        "/node_modules/uplot/dist/uPlot.min.css", "/.git/config", "/.gitignore", "/.hidden", "/notes.txt",
        "/app.js.map", "/build.sh", "/vendor/package.json", "/missing.js", "/vendor/missing.js",
        "/node_modules"}) {
    Reply r = Get(target);
    EXPECT_EQ(r.status, 404) << target << ": " << r.body;
    EXPECT_THAT(r.body, Not(HasSubstr("SOURCE"))) << target;
    EXPECT_THAT(r.body, Not(HasSubstr(dir_))) << target << " names the web dir";
    EXPECT_TRUE(json::parse(r.body, nullptr, false).contains("error")) << target << ": " << r.body;
  }
  for (const char* asset : {"/", "/index.html", "/app.js", "/vendor/uPlot.min.css"}) {
    EXPECT_EQ(Get(asset).status, 200) << asset;
  }
}

// The dashboard ftd really serves (the source tree's web/): every page, script
// and style loads, and so does every file index.html and the modules refer to;
// its build and package files do not.
TEST_F(HttpApiTest, TheRealDashboardsFilesAllLoadAndItsSourcesDoNot) {
  const fs::path web = fs::path(FT_SOURCE_DIR) / "web";
  Serve({.web_dir = web.string()});
  std::string refs;
  for (const auto& entry : fs::directory_iterator(web)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string(), ext = entry.path().extension().string();
    const bool asset = ext == ".html" || ext == ".js" || ext == ".css";
    Reply r = Get("/" + name);
    EXPECT_EQ(r.status, asset ? 200 : 404) << name;
    EXPECT_THAT(r.body, Not(HasSubstr(web.string()))) << name;
    if (asset) refs += r.body;
  }
  const std::regex ref(R"re((?:src|href)="([^"#:]+)"|from '\./([^']+)')re");
  int checked = 0;
  for (std::sregex_iterator it(refs.begin(), refs.end(), ref), end; it != end; ++it) {
    const std::string file = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
    const bool vendor = file.rfind("vendor/", 0) == 0;
    if (vendor && !fs::exists(web / "node_modules/uplot/dist" / file.substr(7))) continue;  // npm ci not run
    EXPECT_EQ(Get("/" + file).status, 200) << file;
    ++checked;
  }
  EXPECT_GE(checked, 10) << "index.html's scripts, styles and modules";
}

TEST_F(HttpApiTest, HealthzAndReady) {
  Serve();
  Reply h = Get("/healthz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "ok\n");
  EXPECT_EQ(Get("/ready").status, 200);
}

TEST_F(HttpApiTest, ReadyIs503OnceTheStoreIsStickyFailed) {
  Serve();
  // Make the next database write fail: no file may grow past its current size (EFBIG).
  signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto wal = fs::file_size(dir_ + "/ftd.sqlite-wal");
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(wal);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tight), 0);
  for (int i = 0; i < 20 && daemon_->Ready().ok(); ++i) SendMetrics(100 + i * 50, 149 + i * 50);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  ASSERT_FALSE(daemon_->Ready().ok()) << "could not provoke a write failure";
  Reply r = Get("/ready");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("not ready"));
  EXPECT_EQ(Get("/healthz").status, 200);
  EXPECT_EQ(Get("/api/jobs").status, 200);  // reads keep working
}

// Waits until `pred` or 5 s.
template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

TEST_F(HttpApiTest, StreamDeliversLiveJobEventMetricAndWorkerUpdates) {
  Serve();
  SseReader sse(port_);
  ASSERT_TRUE(sse.connected());
  ASSERT_TRUE(sse.Get("/api/stream"));
  ASSERT_TRUE(sse.ReadUntil("retry:", std::chrono::seconds(5))) << sse.text();
  EXPECT_THAT(sse.text(), HasSubstr("Content-Type: text/event-stream"));
  ASSERT_TRUE(Eventually([&] { return server_->open_streams() == 1; }));
  // Workers come within a period, with the pools' figures as in GET /api/workers (keys in order).
  ASSERT_TRUE(
      sse.ReadUntil("event: workers\ndata: {\"pools\":[{\"attempt_seconds\"", std::chrono::seconds(5)))
      << sse.text();
  ASSERT_TRUE(sse.ReadUntil("\"workers\":[{", std::chrono::seconds(5))) << sse.text();
  // A live change: the queued job is cancelled.
  ASSERT_TRUE(daemon_->Cancel(queued_).ok());
  ASSERT_TRUE(sse.ReadUntil("\"kind\":\"cancelled\"", std::chrono::seconds(5))) << sse.text();
  ASSERT_TRUE(sse.ReadUntil("\"state\":\"cancelled\"", std::chrono::seconds(5))) << sse.text();
  EXPECT_THAT(sse.text(), HasSubstr("event: job\ndata: {"));
  EXPECT_THAT(sse.text(), HasSubstr("event: event\ndata: {"));
  // A metric point, then (within a period) the job's summary with the new progress.
  SendMetrics(8, 8);
  Heartbeat(8, int64_t{3} << 30);
  ASSERT_TRUE(sse.ReadUntil("event: metric\ndata: {", std::chrono::seconds(5))) << sse.text();
  ASSERT_TRUE(sse.ReadUntil("\"job_id\":\"" + running_ + "\"", std::chrono::seconds(5)));
  ASSERT_TRUE(sse.ReadUntil("\"steps_done\":8", std::chrono::seconds(5))) << sse.text();
  // The stream of one job sees only that job.
  SseReader one(port_);
  ASSERT_TRUE(one.Get("/api/stream?job=" + running_));
  ASSERT_TRUE(one.ReadUntil("retry:", std::chrono::seconds(5)));
  ASSERT_TRUE(Eventually([&] { return server_->open_streams() == 2; }));
  SendMetrics(9, 9);
  ASSERT_TRUE(one.ReadUntil("\"step\":9", std::chrono::seconds(5))) << one.text();
  EXPECT_THAT(one.text(), Not(HasSubstr(queued_)));
  EXPECT_THAT(one.text(), Not(HasSubstr("event: workers")));
  // Closing the client ends the subscription.
  sse.socket().close();
  one.socket().close();
  EXPECT_TRUE(Eventually([&] { return server_->open_streams() == 0; }));
}

TEST_F(HttpApiTest, EvalLossComesThroughMetricsAndTheStreamMergedIntoItsStep) {
  // The stream: step 8's point again, now with its eval loss and the same training fields.
  Serve();
  SseReader sse(port_);
  std::string text;
  const json point = StreamedPoint(
      sse,
      [&] {
        SendMetrics(5, 8);
        SendEval(8, 2.125);
      },
      "\"eval_loss\":2.125", &text);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(point["step"], 8);
  EXPECT_DOUBLE_EQ(point["loss"].get<double>(), 2.2);

  json m = GetJson("/api/jobs/" + running_ + "/metrics");
  ASSERT_EQ(m["points"].size(), 8u);
  EXPECT_TRUE(m["points"][6]["eval_loss"].is_null());
  const json& last = m["points"][7];
  EXPECT_EQ(last["step"], 8);
  EXPECT_EQ(last["eval_loss"].get<double>(), 2.125);
  EXPECT_DOUBLE_EQ(last["loss"].get<double>(), 2.2) << "the evaluation keeps the step's training fields";
  EXPECT_EQ(last["time_ms"], 1'700'000'008'000);
}

// A DPO job's rewards: in its metric points (and nothing in an SFT step's), live on the
// stream, and the newest step's in the job's detail (Daemon::GetJob: what ftctl status prints);
// names a trainer should not have written are dropped everywhere.
TEST_F(HttpApiTest, ObjectiveMetricsComeThroughMetricsTheStreamAndTheJob) {
  Serve();
  SseReader sse(port_);
  std::string text;
  const json live = StreamedPoint(
      sse,
      [&] {
        SendObjective(5, 1.5);
        SendObjective(6, 2.5);
      },
      "\"rewards/margins\":2.5", &text);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(live["step"], 6);
  const json want = {{"logps/chosen", nullptr},
                     {"rewards/accuracies", 0.75},
                     {"rewards/chosen", 1.25},
                     {"rewards/margins", 2.5},
                     {"rewards/rejected", -1.25}};
  EXPECT_EQ(live["objective_metrics"], want);
  EXPECT_THAT(text, Not(HasSubstr("bad"))) << "dropped before it reached the stream";
  EXPECT_THAT(text, Not(HasSubstr("Rewards/Upper")));

  json m = GetJson("/api/jobs/" + running_ + "/metrics");
  ASSERT_EQ(m["points"].size(), 6u);
  EXPECT_EQ(m["points"][0]["objective_metrics"], json::object()) << "an SFT step has none";
  EXPECT_EQ(m["points"][4]["objective_metrics"]["rewards/margins"], 1.5);
  EXPECT_EQ(m["points"][5]["objective_metrics"], want);
  json job = GetJson("/api/jobs/" + running_);
  EXPECT_EQ(job["objective_metrics"], want) << "the newest step's";

  // The step's evaluation (TRL's eval_ names) merges into its point, on the stream too.
  pb::WorkerMessage e;
  e.mutable_metrics()->set_job_id(running_);
  e.mutable_metrics()->set_epoch(epoch_);
  e.mutable_metrics()->set_credential(credential_);
  pb::MetricPoint* p = e.mutable_metrics()->add_points();
  p->set_step(6);
  p->set_eval_loss(0.625);
  p->set_eval_only(true);
  (*p->mutable_objective_metrics())["eval_rewards/margins"] = 1.75;
  daemon_->OnWorkerMessage("w1", &sink_, e);
  ASSERT_TRUE(sse.ReadUntil("\"eval_rewards/margins\":1.75", std::chrono::seconds(5))) << sse.text();
  json merged = want;
  merged["eval_rewards/margins"] = 1.75;
  EXPECT_EQ(GetJson("/api/jobs/" + running_ + "/metrics?after_step=5")["points"][0]["objective_metrics"],
            merged);
  EXPECT_EQ(GetJson("/api/jobs/" + queued_)["objective_metrics"], json::object());
}

TEST_F(HttpApiTest, StreamKeepsAliveWhenQuiet) {
  Serve({}, {.keepalive_ms = 200, .stream_period_ms = 100});
  SseReader sse(port_);
  ASSERT_TRUE(sse.Get("/api/stream?job=" + queued_));
  EXPECT_TRUE(sse.ReadUntil(": keepalive\n\n", std::chrono::seconds(5))) << sse.text();
}

TEST_F(HttpApiTest, StreamReplaysEventsAfterLastEventId) {
  Serve();
  json events = GetJson("/api/events");
  ASSERT_GE(events["events"].size(), 3u);
  const int64_t first = events["events"][0]["seq"];
  const int64_t last = events["events"].back()["seq"];
  SseReader sse(port_);
  ASSERT_TRUE(sse.Get("/api/stream", {"Last-Event-ID: " + std::to_string(first)}));
  ASSERT_TRUE(sse.ReadUntil("id: " + std::to_string(last) + "\n", std::chrono::seconds(5))) << sse.text();
  EXPECT_THAT(sse.text(), Not(HasSubstr("id: " + std::to_string(first) + "\n")));
  EXPECT_THAT(sse.text(), HasSubstr("id: " + std::to_string(first + 1) + "\n"));
  // Events after the replay come once, in order.
  ASSERT_TRUE(daemon_->Cancel(queued_).ok());
  ASSERT_TRUE(sse.ReadUntil("\"kind\":\"cancelled\"", std::chrono::seconds(5)));
  const std::string& t = sse.text();
  EXPECT_EQ(t.find("id: " + std::to_string(last) + "\n"), t.rfind("id: " + std::to_string(last) + "\n"));
  // ?after_seq does the same for a first connection; a bad Last-Event-ID is a 400.
  SseReader again(port_);
  ASSERT_TRUE(again.Get("/api/stream?job=" + running_ + "&after_seq=0"));
  ASSERT_TRUE(again.ReadUntil("\"kind\":\"started\"", std::chrono::seconds(5))) << again.text();
  Reply bad = Get("/api/stream", {{"Last-Event-ID", "abc"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("Last-Event-ID"));
  ExpectBad("/api/stream?job=x1", "x1");
  ExpectBad("/api/stream?after_seq=-2", "after_seq");
  EXPECT_EQ(Get("/api/stream?job=j-424242").status, 404);
}

TEST_F(HttpApiTest, SlowStreamClientIsDroppedWithoutBlockingTheDaemon) {
  // A batch of 1,000 points is about 250 KB of events, all posted before the
  // server's thread may write any on a loaded machine: the cap is 4 batches.
  Serve({}, {.stream_max_bytes = 1 << 20});
  SseReader slow(port_);
  int small = 4096;
  setsockopt(slow.socket().native_handle(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_TRUE(slow.Get("/api/stream"));
  ASSERT_TRUE(slow.ReadUntil("retry:", std::chrono::seconds(5)));
  SseReader fast(port_);
  ASSERT_TRUE(fast.Get("/api/stream"));
  fast.KeepDraining();  // reads as the bytes come, even while this thread publishes
  ASSERT_TRUE(fast.ReadUntil("retry:", std::chrono::seconds(5)));
  ASSERT_TRUE(Eventually([&] { return server_->open_streams() == 2; }));
  // The slow client never reads again; the daemon keeps publishing at full
  // speed, and the fast client keeps up (it gets each batch's last point).
  const auto start = std::chrono::steady_clock::now();
  int batch = 0;
  for (; batch < 80 && server_->open_streams() > 1; ++batch) {
    SendMetrics(1000 + batch * 1000, 1999 + batch * 1000);
    ASSERT_TRUE(
        fast.ReadUntil("\"step\":" + std::to_string(1999 + batch * 1000) + ",", std::chrono::seconds(10)))
        << "the fast client fell behind at batch " << batch;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(Eventually([&] { return server_->open_streams() == 1; }))
      << "the slow client was never dropped (its backlog is capped by bytes)";
  EXPECT_LT(seconds, 60.0);
  // The other stream goes on: a later point reaches it.
  SendMetrics(99'000'001, 99'000'001);
  EXPECT_TRUE(fast.ReadUntil("\"step\":99000001,", std::chrono::seconds(5)));
  EXPECT_EQ(server_->open_streams(), 1);
  EXPECT_EQ(Get("/healthz").status, 200);  // the server still serves others
}

TEST_F(HttpApiTest, StreamFanOutBuildsEachChangedJobsSummaryOncePerPeriodForAllStreams) {
  constexpr int64_t kPeriodMs = 400;
  constexpr int kStreams = 20;
  Serve({}, {.stream_period_ms = kPeriodMs});
  std::vector<std::unique_ptr<SseReader>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<SseReader>(port_));
    ASSERT_TRUE(streams.back()->Get(i % 2 == 0 ? "/api/stream" : "/api/stream?job=" + running_));
    ASSERT_TRUE(streams.back()->ReadUntil("retry:", std::chrono::seconds(5)));
  }
  ASSERT_TRUE(Eventually([&] { return server_->open_streams() == kStreams; }));
  const int64_t before = server_->stream_summaries_built();
  const auto start = std::chrono::steady_clock::now();
  // A burst of updates to one job: its progress moves, then 30 metric reports.
  Heartbeat(9, int64_t{3} << 30);
  for (int i = 0; i < 30; ++i) SendMetrics(100 + i, 100 + i);
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(streams[i]->ReadUntil("\"steps_done\":9", std::chrono::seconds(10)))
        << "stream " << i << " missed the job's new summary: " << streams[i]->text().substr(0, 2000);
    EXPECT_TRUE(streams[i]->ReadUntil("\"step\":129,", std::chrono::seconds(10))) << "stream " << i;
  }
  const double periods =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / kPeriodMs;
  const int64_t built = server_->stream_summaries_built() - before;
  EXPECT_GE(built, 1);
  // At most one per period (plus the leading one), whatever the number of streams.
  EXPECT_LE(built, static_cast<int64_t>(periods) + 2)
      << built << " summaries for one job in " << periods << " periods with " << kStreams << " streams";
  EXPECT_LT(built, kStreams);
}

TEST_F(HttpApiTest, StreamsAndConnectionsOverTheirCapsGet503) {
  Serve({}, {.max_connections = 4, .max_streams = 2});
  SseReader a(port_), b(port_);
  ASSERT_TRUE(a.Get("/api/stream"));
  ASSERT_TRUE(b.Get("/api/stream?job=" + running_));
  ASSERT_TRUE(a.ReadUntil("retry:", std::chrono::seconds(5)));
  ASSERT_TRUE(b.ReadUntil("retry:", std::chrono::seconds(5)));
  ASSERT_TRUE(Eventually([&] { return server_->open_streams() == 2; }));
  {
    SseReader c(port_);
    ASSERT_TRUE(c.Get("/api/stream"));
    ASSERT_TRUE(c.ReadUntil("\r\n\r\n{", std::chrono::seconds(5))) << c.text();
    EXPECT_THAT(c.text(), HasSubstr("HTTP/1.1 503"));
    EXPECT_THAT(c.text(), HasSubstr("at most 2 event streams"));
    EXPECT_TRUE(c.WaitClosed(std::chrono::seconds(5)));
  }
  EXPECT_EQ(Get("/healthz").status, 200);  // other requests still served
  // A stream that ends frees its slot.
  a.socket().close();
  ASSERT_TRUE(Eventually([&] { return server_->open_streams() == 1; }));
  bool reopened = false;
  for (int i = 0; i < 50 && !reopened; ++i) {
    SseReader d(port_);
    ASSERT_TRUE(d.Get("/api/stream"));
    ASSERT_TRUE(d.ReadUntil("\r\n\r\n", std::chrono::seconds(5)));
    reopened = d.text().rfind("HTTP/1.1 200", 0) == 0;
    if (!reopened) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(reopened) << "the closed stream's slot was never released";
  ASSERT_TRUE(Eventually([&] { return server_->open_streams() == 1 && server_->open_connections() == 1; }));
  // Connections: 1 stream + 3 idle keep-alive clients fill the 4 slots; the 5th gets a JSON 503.
  std::vector<std::unique_ptr<SseReader>> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(std::make_unique<SseReader>(port_));
  ASSERT_TRUE(Eventually([&] { return server_->open_connections() == 4; })) << server_->open_connections();
  Reply refused = Get("/api/jobs");
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_THAT(refused.body, HasSubstr("at most 4 HTTP connections"));
  EXPECT_TRUE(json::parse(refused.body, nullptr, false).contains("error")) << refused.body;
  EXPECT_EQ(Get("/healthz").status, 200) << "probes have their own lane";
  idle.clear();
  ASSERT_TRUE(Eventually([&] { return server_->open_connections() == 1; })) << server_->open_connections();
  EXPECT_EQ(Get("/healthz").status, 200);
}

// Sends `request` one byte every 50 ms (a slow-loris client; then nothing) on
// `fd` until the server closes the connection: the time from `since` until it
// did, or nullopt when it is still open 5 s after `since`.
std::optional<std::chrono::milliseconds> TrickleUntilClosed(int fd, const std::string& request,
                                                            std::chrono::steady_clock::time_point since) {
  using Clock = std::chrono::steady_clock;
  for (size_t i = 0; Clock::now() - since < std::chrono::seconds(5); ++i) {
    bool closed = i < request.size() && send(fd, &request[i], 1, MSG_NOSIGNAL) < 0;
    pollfd p{fd, POLLIN, 0};
    if (!closed && poll(&p, 1, 50) > 0) {
      char buf[256];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      closed = n <= 0;  // EOF, or reset
      if (n > 0) ADD_FAILURE() << "an answer to a request never sent whole: " << std::string(buf, n);
    }
    if (closed) return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since);
  }
  return std::nullopt;
}

TEST_F(HttpApiTest, ASlowLorisClientIsClosedAtTheHeaderDeadlineNotTheIdleTimeout) {
  Serve({}, {.header_timeout_ms = 300, .idle_timeout_ms = 60'000});
  const std::string trickle = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(200, 'z');
  for (const std::string& request : {std::string(), trickle}) {  // silent, then sending a byte every 50 ms
    const auto since = std::chrono::steady_clock::now();
    SseReader client(port_);
    ASSERT_TRUE(client.connected());
    const auto closed = TrickleUntilClosed(client.socket().native_handle(), request, since);
    ASSERT_TRUE(closed.has_value()) << "still open after 5 s (sent " << request.size() << " bytes slowly)";
    EXPECT_GE(closed->count(), 290) << "closed before its header deadline";
    ASSERT_TRUE(Eventually([&] { return server_->open_connections() == 0; })) << "its slot was not freed";
  }
}

TEST_F(HttpApiTest, AnIdleKeepAliveConnectionOutlivesTheHeaderDeadline) {
  Serve({}, {.header_timeout_ms = 300, .idle_timeout_ms = 60'000});
  boost::asio::io_context ioc;
  boost::beast::tcp_stream kept(ioc);
  kept.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)});
  ASSERT_EQ(http_test::Exchange(kept, "GET", "/healthz", {}).status, 200);
  for (int i = 0; i < 2;
       ++i) {  // two header deadlines pass while `kept` is idle: fresh silent clients closed
    SseReader silent(port_);
    ASSERT_TRUE(silent.WaitClosed(std::chrono::seconds(5)));
  }
  Reply again = http_test::Exchange(kept, "GET", "/api/workers", {});
  EXPECT_EQ(again.status, 200) << again.body;
}

TEST_F(HttpApiTest, SixHundredSlowSocketsFromOneAddressLeaveHealthzAndOtherClientsServed) {
  Serve();  // the defaults: 512 connections, 64 from one client address
  boost::asio::io_context ioc;
  std::vector<boost::asio::ip::tcp::socket> slow;
  slow.reserve(600);
  const boost::asio::ip::tcp::endpoint server(boost::asio::ip::make_address("127.0.0.1"),
                                              static_cast<unsigned short>(port_));
  for (int i = 0; i < 600; ++i) {
    boost::system::error_code ec;
    slow.emplace_back(ioc).connect(server, ec);
    ASSERT_FALSE(ec) << "socket " << i << ": " << ec.message();
    boost::asio::write(slow.back(), boost::asio::buffer(std::string("GET / HTTP/1.1\r\nHost: 127")), ec);
  }
  EXPECT_TRUE(Eventually([&] { return server_->open_connections() == 64; })) << server_->open_connections();
  Reply health = FetchFrom("127.0.0.2", port_, "/healthz");
  EXPECT_EQ(health.status, 200) << health.body;
  EXPECT_EQ(FetchFrom("127.0.0.2", port_, "/api/jobs").status, 200);
  EXPECT_EQ(FetchFrom("127.0.0.2", port_, "/ready").status, 200);
  EXPECT_TRUE(Eventually([&] { return server_->open_connections() == 64; }))
      << server_->open_connections() << ": the slow sockets' address got more than its cap";
}

TEST_F(HttpApiTest, AnAddressOverItsConnectionCapGets503CountingItsEventStreamsAndOthersAreServed) {
  Serve({}, {.max_connections_per_peer = 2});
  SseReader a(port_), b(port_);
  ASSERT_TRUE(a.Get("/api/stream"));
  ASSERT_TRUE(b.Get("/api/stream"));
  ASSERT_TRUE(a.ReadUntil("retry:", std::chrono::seconds(5))) << a.text();
  ASSERT_TRUE(b.ReadUntil("retry:", std::chrono::seconds(5))) << b.text();
  Reply over = FetchFrom("127.0.0.1", port_, "/api/jobs");
  EXPECT_EQ(over.status, 503) << over.body;
  EXPECT_THAT(over.body, HasSubstr("at most 2 HTTP connections from one client address"));
  EXPECT_EQ(over.headers["Retry-After"], "5");
  EXPECT_EQ(server_->open_connections(), 2) << "the refused connection took a slot";
  Reply other = FetchFrom("127.0.0.2", port_, "/api/jobs");
  EXPECT_EQ(other.status, 200) << other.body;
  a.socket().close();  // a stream that ends gives its address's place back
  EXPECT_TRUE(Eventually([&] { return FetchFrom("127.0.0.1", port_, "/api/jobs").status == 200; }));
}

TEST_F(HttpApiTest, HealthzAndReadyAnswerWhenEveryConnectionIsTaken) {
  Serve({}, {.max_connections = 4, .probe_connections = 1});
  std::vector<std::unique_ptr<SseReader>> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(std::make_unique<SseReader>(port_));
  ASSERT_TRUE(Eventually([&] { return server_->open_connections() == 4; })) << server_->open_connections();
  Reply health = FetchFrom("127.0.0.1", port_, "/healthz");
  EXPECT_EQ(health.status, 200) << health.body;
  EXPECT_EQ(health.headers["Connection"], "close") << "one request per probe-lane connection";
  // The lane's one place is free again once ftd has closed its side (after the client read the reply).
  const auto lane_free = [&] { return Eventually([&] { return server_->open_probe_connections() == 0; }); };
  ASSERT_TRUE(lane_free());
  EXPECT_EQ(FetchFrom("127.0.0.1", port_, "/ready").status, 200);
  ASSERT_TRUE(lane_free());
  Reply other = FetchFrom("127.0.0.1", port_, "/api/jobs");  // the lane serves probes only
  EXPECT_EQ(other.status, 503) << other.body;
  EXPECT_THAT(other.body, HasSubstr("at most 4 HTTP connections"));
  EXPECT_EQ(other.headers["Retry-After"], "1");
  // The lane is bounded too: with its one place held, a probe is refused.
  ASSERT_TRUE(lane_free());
  SseReader holder(port_);
  ASSERT_TRUE(Eventually([&] { return server_->open_probe_connections() == 1; }));
  EXPECT_EQ(FetchFrom("127.0.0.1", port_, "/healthz").status, 503);
  EXPECT_EQ(server_->open_connections(), 4);
}

TEST(HttpPeerKey, AnIpv6ClientIsCountedByItsSlash64AndAMappedIpv4AsItsIpv4) {
  EXPECT_EQ(HttpPeerKey("10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(HttpPeerKey("::ffff:10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(HttpPeerKey("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::/64");
  EXPECT_EQ(HttpPeerKey("2001:db8:1:2::1"), HttpPeerKey("2001:db8:1:2:ffff::9"));
  EXPECT_NE(HttpPeerKey("2001:db8:1:2::1"), HttpPeerKey("2001:db8:1:3::1"));
  EXPECT_EQ(HttpPeerKey("not an address"), "not an address");
}

TEST_F(HttpApiTest, PrometheusMetricsPassPromtool) {
  Serve();
  SendObjective(5, 1.5);
  SendObjective(6, 2.5);
  Reply m = Get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_THAT(m.headers["Content-Type"], HasSubstr("version=0.0.4"));
  for (const char* line : {"ftune_jobs{state=\"running\"} 1",
                           "ftune_jobs{state=\"queued\"} 1",
                           "ftune_attempts_total 1",
                           "ftune_preemptions_total 0",
                           "ftune_failures_total 0",
                           "ftune_workers{state=\"alive\"} 1",
                           "ftune_workers{state=\"lost\"} 0",
                           "ftune_device_memory_bytes{worker=\"w1\",device=\"0\",kind=\"used\"} 3221225472",
                           "ftune_device_memory_bytes{worker=\"w1\",device=\"0\",kind=\"total\"} 8589934592",
                           "# TYPE ftune_checkpoint_duration_seconds histogram",
                           "# TYPE ftune_recovery_seconds histogram",
                           "# TYPE ftune_goodput_seconds_total counter",
                           "ftune_goodput_seconds_total{category=\"lost\"} 0",
                           "ftune_pool_mtbf_seconds{pool=\"default\"} 3600",
                           "ftune_scheduler_tick_seconds_count 1",
                           "# TYPE ftune_worker_message_seconds histogram",
                           "# TYPE ftune_job_objective_metric gauge",
                           "# TYPE ftune_pool_cost_total counter",
                           "ftune_pool_cost_total{pool=\"default\",category=\"lost\"} 0",
                           "# TYPE ftune_team_spend gauge",
                           "ftune_team_spend{team=\"\"} 0",
                           "# TYPE ftune_team_budget gauge"}) {
    EXPECT_THAT(m.body, HasSubstr(line));
  }
  // The running DPO job's newest step, one gauge per name (a NaN as NaN); the dropped names nowhere.
  const std::string job = "ftune_job_objective_metric{job=\"" + running_ + "\",name=";
  for (const std::string sample :
       {"\"rewards/margins\"} 2.5\n", "\"rewards/accuracies\"} 0.75\n", "\"rewards/chosen\"} 1.25\n",
        "\"rewards/rejected\"} -1.25\n", "\"logps/chosen\"} NaN\n"}) {
    EXPECT_THAT(m.body, HasSubstr(job + sample));
  }
  EXPECT_THAT(m.body, Not(HasSubstr("bad")));
  EXPECT_THAT(m.body, Not(HasSubstr("Rewards/Upper")));
  EXPECT_THAT(m.body, Not(HasSubstr(queued_))) << "a job without objective metrics has no gauge";
  const std::string file = dir_ + "/metrics.txt";
  std::ofstream(file) << m.body;
  // promtool comes with Debian's prometheus package (deploy/install-deps.sh): missing is a failure.
  ASSERT_EQ(std::system("command -v promtool >/dev/null"), 0)
      << "promtool is missing: run deploy/install-deps.sh (Debian package 'prometheus')";
  const std::string out = dir_ + "/promtool.txt";
  const int rc = std::system(("promtool check metrics < '" + file + "' > '" + out + "' 2>&1").c_str());
  std::ifstream in(out);
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << report << "\n" << m.body;
}

TEST_F(HttpApiTest, KeepAliveServesManyRequestsOnOneConnection) {
  Serve();
  namespace beast = boost::beast;
  namespace http = beast::http;
  boost::asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)});
  beast::flat_buffer buffer;
  for (int i = 0; i < 5; ++i) {
    http::request<http::empty_body> req(http::verb::get, i % 2 ? "/api/workers" : "/api/jobs/nope", 11);
    req.set(http::field::host, "127.0.0.1");
    http::write(stream, req);
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    EXPECT_EQ(res.result_int(), i % 2 ? 200u : 400u);
    EXPECT_TRUE(res.keep_alive());
  }
}

TEST_F(HttpApiTest, MalformedHttpGetsA400NotACrash) {
  Serve();
  SseReader raw(port_);
  const std::string junk = "GARBAGE / HTTP/9.9\r\n\x01\x02\r\n\r\n";
  boost::asio::write(raw.socket(), boost::asio::buffer(junk));
  EXPECT_TRUE(raw.ReadUntil("400", std::chrono::seconds(5))) << raw.text();
  EXPECT_EQ(Get("/healthz").status, 200);
}

TEST_F(HttpApiTest, OversizedBodiesAndHeadersAreRefusedClearly) {
  Serve();
  {
    SseReader raw(port_);
    const std::string request =
        "POST /api/jobs/x/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n" +
        std::string(100000, 'x');
    boost::asio::write(raw.socket(), boost::asio::buffer(request));
    EXPECT_TRUE(raw.ReadUntil("takes nothing larger", std::chrono::seconds(5))) << raw.text();
    EXPECT_THAT(raw.text(), HasSubstr("413"));
    EXPECT_THAT(raw.text(), HasSubstr("request body larger than 64 KiB"));
  }
  {
    SseReader raw(port_);
    const std::string request =
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + std::string(20000, 'y') + "\r\n\r\n";
    boost::asio::write(raw.socket(), boost::asio::buffer(request));
    EXPECT_TRUE(raw.ReadUntil("takes nothing larger", std::chrono::seconds(5))) << raw.text();
    EXPECT_THAT(raw.text(), HasSubstr("431"));
    EXPECT_THAT(raw.text(), HasSubstr("request headers larger than 16 KiB"));
  }
  EXPECT_EQ(Get("/healthz").status, 200) << "the daemon still serves";
}

// HTTPS: the same server with ftd's --tls-cert/--tls-key, a self-signed
// certificate made by the openssl CLI for 127.0.0.1, and clients that trust
// only that certificate.
class HttpsTest : public HttpApiTest {
 protected:
  void SetUp() override {
    HttpApiTest::SetUp();
    if (HasFatalFailure()) return;
    cert_ = MakeCertificate("tls");
    key_ = dir_ + "/tls/key.pem";
  }

  // A self-signed certificate for 127.0.0.1 in dir_/<name>/{cert,key}.pem; returns the cert's path.
  std::string MakeCertificate(const std::string& name) {
    const std::string d = dir_ + "/" + name;
    EXPECT_EQ(testing_support::MakeSelfSignedCertificate(d, "localhost", "IP:127.0.0.1,DNS:localhost"), "");
    return d + "/cert.pem";
  }

  void ServeTls() {
    HttpServerOptions o;
    o.tls_cert_file = cert_;
    o.tls_key_file = key_;
    Serve({}, o);
  }

  std::string cert_, key_;
};

TEST_F(HttpsTest, JobsAndEventStreamOverTls) {
  ServeTls();
  ASSERT_TRUE(server_->tls());
  Reply r = http_test::FetchTls(port_, cert_, "GET", "/api/jobs");
  ASSERT_EQ(r.status, 200) << r.body;
  json jobs = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(jobs["jobs"].is_array()) << r.body;
  EXPECT_EQ(jobs["jobs"].size(), 2u);
  EXPECT_THAT(r.body, HasSubstr(running_));
  // Keep-alive works over TLS too: several requests, and the server still answers afterwards.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(http_test::FetchTls(port_, cert_, "GET", "/healthz").status, 200);

  // SSE over TLS: the replay after seq 0, then a live metric and the job's summary.
  http_test::TlsSseReader sse(port_, cert_);
  ASSERT_TRUE(sse.connected());
  ASSERT_TRUE(sse.Get("/api/stream?job=" + running_ + "&after_seq=0"));
  ASSERT_TRUE(sse.ReadUntil("retry: 2000", std::chrono::seconds(5))) << sse.text();
  EXPECT_THAT(sse.text(), HasSubstr("Content-Type: text/event-stream"));
  ASSERT_TRUE(sse.ReadUntil("event: event\ndata: {", std::chrono::seconds(5))) << sse.text();
  ASSERT_TRUE(Eventually([&] { return server_->open_streams() == 1; }));
  SendMetrics(7, 7);
  Heartbeat(7, int64_t{3} << 30);
  ASSERT_TRUE(sse.ReadUntil("event: metric\ndata: {", std::chrono::seconds(5))) << sse.text();
  ASSERT_TRUE(sse.ReadUntil("\"step\":7", std::chrono::seconds(5))) << sse.text();
  ASSERT_TRUE(sse.ReadUntil("\"steps_done\":7", std::chrono::seconds(5))) << sse.text();
}

TEST_F(HttpsTest, PlaintextAndUntrustingClientsFailCleanlyAndTheServerKeepsServing) {
  ServeTls();
  // Plain HTTP to the HTTPS port: a clear 400, not a hang or a reset.
  Reply plain = Fetch(port_, "GET", "/api/jobs");
  EXPECT_EQ(plain.status, 400) << plain.body;
  EXPECT_THAT(plain.body, HasSubstr("serves HTTPS"));
  EXPECT_THAT(plain.body, Not(HasSubstr(running_)));
  // A client that does not trust the certificate (system roots only) fails its handshake.
  Reply untrusting = http_test::FetchTls(port_, "", "GET", "/api/jobs");
  EXPECT_EQ(untrusting.status, -1);
  EXPECT_THAT(untrusting.body, HasSubstr("handshake"));
  // A client that trusts another certificate fails too.
  const std::string other = MakeCertificate("other");
  EXPECT_EQ(http_test::FetchTls(port_, other, "GET", "/api/jobs").status, -1);
  // A ClientHello-looking start followed by junk, and a client that connects and says nothing.
  {
    SseReader junk(port_);
    static const char kHello[] = "\x16\x03\x01\x00\x05\x01junkjunkjunk";  // record + client_hello type
    boost::asio::write(junk.socket(), boost::asio::buffer(kHello, sizeof(kHello) - 1));
    EXPECT_TRUE(junk.WaitClosed(std::chrono::seconds(5)));
    SseReader silent(port_);
    ASSERT_TRUE(silent.connected());
  }
  // None of that disturbed the server.
  EXPECT_EQ(http_test::FetchTls(port_, cert_, "GET", "/healthz").status, 200);
  EXPECT_EQ(http_test::FetchTls(port_, cert_, "GET", "/api/jobs/" + running_).status, 200);
}

TEST_F(HttpsTest, UnusableCertificateOrKeyFailsStartNamingTheFlag) {
  HttpApi api(daemon_.get(), {});
  auto start = [&](const std::string& cert, const std::string& key) {
    return HttpServer::Start(daemon_.get(), &api,
                             {.address = "127.0.0.1:0", .tls_cert_file = cert, .tls_key_file = key});
  };
  auto missing = start(dir_ + "/nope.pem", key_);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-cert"));
  auto no_key = start(cert_, "");
  ASSERT_FALSE(no_key.ok());
  EXPECT_THAT(no_key.status().message(), HasSubstr("--tls-key is missing"));
  auto not_pem = start(cert_, dir_ + "/secret.txt");
  ASSERT_FALSE(not_pem.ok());
  EXPECT_THAT(not_pem.status().message(), HasSubstr("--tls-key"));
  // The key of another certificate.
  MakeCertificate("other");
  auto mismatched = start(cert_, dir_ + "/other/key.pem");
  ASSERT_FALSE(mismatched.ok());
  EXPECT_THAT(mismatched.status().message(), HasSubstr("--tls-key"));
  EXPECT_TRUE(start(cert_, key_).ok());
}

TEST(HttpServerStart, OutOfRangeDeadlinesAndCapsAreRefusedNamingTheFlag) {
  const std::pair<HttpServerOptions, std::string> cases[] = {
      {{.address = "127.0.0.1:0", .header_timeout_ms = 0}, "--http-header-timeout-ms 0"},
      {{.address = "127.0.0.1:0", .idle_timeout_ms = -5}, "--http-idle-timeout-ms -5"},
      {{.address = "127.0.0.1:0", .max_connections = 0}, "--http-max-connections 0"},
      {{.address = "127.0.0.1:0", .max_connections_per_peer = -1}, "--http-max-connections-per-peer -1"},
  };
  for (const auto& [options, flag] : cases) {
    auto s = HttpServer::Start(nullptr, nullptr, options);
    ASSERT_FALSE(s.ok()) << flag;
    EXPECT_EQ(s.status().code(), Status::Code::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr(flag));
  }
}

TEST(HttpServerStart, RejectsBadAddresses) {
  for (const char* address : {"nohost", "127.0.0.1:", "127.0.0.1:99999", ":80", "127.0.0.1:http"}) {
    auto s = HttpServer::Start(nullptr, nullptr, {.address = address});
    ASSERT_FALSE(s.ok()) << address;
    EXPECT_THAT(s.status().message(), HasSubstr("HOST:PORT")) << address;
  }
}

}  // namespace
}  // namespace ft
