// The whole system on loopback: ftd, ft-workers and ft-train as real
// processes. Each scenario is a failure users meet on preemptible machines.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "tests/e2e/cluster.h"
#include "tests/support/webhook_receiver.h"
#include "worker/http_get.h"

namespace ft::e2e {
namespace {

namespace pb = ftune::v1;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

std::string Adapter(const std::string& out) { return Slurp(out + "/adapter/adapter_model.safetensors"); }

// Kills a worker and every trainer it started: what a node loss looks like.
void KillNode(Cluster& c, const std::string& id, int sig = SIGKILL) {
  c.worker(id).Signal(sig);
  // "[/]" matches "/" but not itself, so pkill spares the shell that runs it.
  std::system(
      ("pkill -" + std::to_string(sig) + " -f '" + c.dir() + "[/]w-" + id + "/' >/dev/null 2>&1").c_str());
}

TEST(E2E, SubmitRunSucceedsBitIdenticalToFtTrainRun) {
  Cluster c("basic");
  const std::string job = c.WriteJob("basic", 30, 10);
  c.StartWorker("w1");
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(id, Done, 60'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason() << "\n" << Slurp(c.dir() + "/worker-w1.log");
  EXPECT_EQ(j.attempts_size(), 1);
  EXPECT_EQ(j.steps_done(), 30);
  const std::string ref = c.RunReference(job);
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(ref)) << "adapter differs from ft-train run of the same job";
  auto events = c.client().Events(id, 0);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> kinds;
  for (const auto& e : events->events()) kinds.push_back(e.kind());
  EXPECT_THAT(kinds, ::testing::Contains("started"));
  EXPECT_THAT(kinds, ::testing::Contains("checkpoint"));
  EXPECT_THAT(kinds, ::testing::Contains("succeeded"));
}

TEST(E2E, KilledWorkerIsReplacedWithinLeaseAndTheResultIsBitIdentical) {
  Cluster c("failover");
  const std::string job = c.WriteJob("failover", 400, 10);
  c.StartWorker("w1");
  c.StartWorker("w2");
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.steps_done() >= 40; }, 60'000);
  ASSERT_EQ(j.state(), pb::RUNNING);
  const std::string first = j.worker_id(), other = first == "w1" ? "w2" : "w1";
  const auto killed = Clock::now();
  KillNode(c, first);
  j = c.WaitFor(
      id, [&](const pb::Job& j) { return j.attempts_size() == 2 && j.worker_id() == other; },
      c.lease_ms() + 10'000);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  std::printf("worker lost -> running again on %s after %.2f s (lease %.1f s)\n", other.c_str(), seconds,
              c.lease_ms() / 1000.0);
  ASSERT_EQ(j.worker_id(), other);
  EXPECT_LE(seconds, c.lease_ms() / 1000.0 + 5);
  j = c.WaitFor(id, Done, 120'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  EXPECT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(j.preemptions(), 1);
  EXPECT_EQ(j.failures(), 0);
  EXPECT_EQ(j.attempts(0).outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_LE(j.attempts(0).steps_lost(), 10) << "at most one checkpoint interval";
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(c.RunReference(job)));
}

// A checkpoint write that fails for lack of space (RLIMIT_FSIZE on the
// running trainer: EFBIG, the same IOError path as ENOSPC): the attempt ends
// "environment" (not the job's failure), the job is placed again, resumes
// from what was committed and ends SUCCEEDED with the uninterrupted result.
TEST(E2E, CheckpointWriteWithoutSpaceIsRetriedAndTheJobSucceeds) {
  Cluster c("diskfull");
  const std::string job = c.WriteJob("diskfull", 120, 20);
  c.StartWorker("w");
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.steps_done() >= 3; }, 60'000);
  ASSERT_EQ(j.state(), pb::RUNNING);
  // No file of the trainer may grow past 64 KiB from now on: metrics.jsonl
  // stays below that (44 KB for the whole run), its next checkpoint's adapter
  // (69 KB) and optimizer state (139 KB) do not fit.
  const std::string limit =
      "for p in $(pgrep -f '" + c.dir() + "[/]w-w/'); do prlimit --pid $p --fsize=65536; done";
  ASSERT_EQ(std::system(limit.c_str()), 0) << limit;
  j = c.WaitFor(id, Done, 180'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  EXPECT_EQ(j.failures(), 0) << "lack of space is the node's problem, not the job's";
  ASSERT_GE(j.attempts_size(), 2);
  EXPECT_EQ(j.attempts(0).outcome(), pb::ATTEMPT_ENVIRONMENT) << j.attempts(0).reason();
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("File too large"));
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(c.RunReference(job)));
}

// Polls `done` every 100 ms until it holds or `timeout` passes; its last answer.
bool PollUntil(const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return done();
}

// GET <ftd's dashboard>/ready: its HTTP status (0 when ftd did not answer).
int ReadyStatus(Cluster& c) {
  auto r = worker::HttpFetch({.url = c.http_url() + "ready", .timeout = std::chrono::milliseconds(2000)});
  return r.ok() ? r->status : 0;
}

// ftd's data directory fills up: a 24 MiB tmpfs of its own (a mount namespace
// made with unshare), filled by the test through /proc/<ftd>/root. ftd
// refuses new work with an error naming the cause and the fix, /ready says
// 503, and the job it acknowledged keeps running; once the filler is removed
// ftd accepts work by itself (no restart), reconciles with its worker and
// both jobs succeed, the first with the result of an uninterrupted run.
TEST(E2E, FullDataDirRefusesNewWorkKeepsEveryJobAndRecoversOnceSpaceFrees) {
  ClusterOptions options;
  options.daemon_wrapper = {"/usr/bin/unshare",
                            "--user",
                            "--map-root-user",
                            "--mount",
                            "sh",
                            "-c",
                            "mount -t tmpfs -o size=24m ftd-data \"$0\" && exec \"$@\"",
                            "{data_dir}"};
  Cluster c("datadirfull", options);
  const std::string job = c.WriteJob("datadirfull", 300, 20);
  c.StartWorker("w");
  const std::string first = c.Submit(job);
  pb::Job j = c.WaitFor(
      first, [](const pb::Job& j) { return j.committed_step() >= 20; }, 60'000);
  ASSERT_EQ(j.state(), pb::RUNNING) << j.reason();
  ASSERT_EQ(ReadyStatus(c), 200);

  // Fill ftd's filesystem (not the test's: the path goes through ftd's root).
  const std::string filler = "/proc/" + std::to_string(c.daemon().pid) + "/root" + c.data_dir() + "/filler";
  {
    std::ofstream out(filler, std::ios::binary);
    ASSERT_TRUE(out.good()) << filler;
    const std::string mib(1 << 20, 'x');
    for (int i = 0; i < 64 && out.write(mib.data(), mib.size()) && out.flush(); ++i) {
    }
  }
  ASSERT_GT(std::filesystem::file_size(filler), 0u);
  // Progress and metrics keep coming: one of their writes soon needs space.
  ASSERT_TRUE(PollUntil([&] { return ReadyStatus(c) == 503; }, std::chrono::seconds(60)))
      << "ftd did not notice its full disk";
  auto refused = c.TrySubmit(job);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().ToString(), HasSubstr("database or disk is full"));
  EXPECT_THAT(refused.status().ToString(), HasSubstr("--data-dir"));
  EXPECT_THAT(refused.status().ToString(), HasSubstr("the job was not submitted"));

  // ftd stays not ready while the disk is full (it retries every 2 s), and
  // accepts none of the checkpoints it cannot record: the trainer's retention
  // (keep 3, one every 20 steps) keeps the resume point ftd has.
  auto got = c.client().Get(first);
  ASSERT_TRUE(got.ok()) << got.status().ToString() << " (reads keep working)";
  const int64_t committed = got->committed_step();
  ASSERT_GT(committed, 0);
  // The trainer's own checkpoints tell how far it got (ftd records no progress now).
  const std::string checkpoints = got->output_dir() + "/checkpoints";
  auto newest = [&] {
    int64_t step = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(checkpoints, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step-", 0) == 0) step = std::max<int64_t>(step, std::atoll(n.c_str() + 5));
    }
    return step;
  };
  ASSERT_TRUE(PollUntil([&] { return newest() >= committed + 100; }, std::chrono::seconds(60)))
      << "the trainer stopped while ftd's disk was full";
  EXPECT_EQ(ReadyStatus(c), 503);
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(committed));
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/" + name + "/MANIFEST.json"))
      << "the committed checkpoint " << name << " was pruned while ftd could not record newer ones";
  std::filesystem::remove(filler);
  ASSERT_TRUE(PollUntil([&] { return ReadyStatus(c) == 200; }, std::chrono::seconds(30)))
      << "ftd did not recover once space was freed";
  // The same settings in an output.dir of its own (ftd refuses a second job for one directory).
  const std::string second = c.Submit(c.WriteJob("datadirfull-2", 300, 20));
  j = c.WaitFor(first, Done, 180'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  EXPECT_EQ(j.failures(), 0);
  EXPECT_EQ(j.steps_done(), 300);
  const pb::Job k = c.WaitFor(second, Done, 180'000);
  ASSERT_EQ(k.state(), pb::SUCCEEDED) << k.reason();
  auto listed = c.client().List(pb::ListJobsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->jobs_size(), 2) << "the refused submit left nothing behind";
  const std::string reference = c.RunReference(job);
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(reference));
  EXPECT_EQ(Adapter(k.output_dir()), Adapter(reference));
  EXPECT_THAT(Slurp(c.dir() + "/ftd.log"), HasSubstr("writable again"));
  EXPECT_THAT(Slurp(c.dir() + "/worker-w.log"), HasSubstr("register again"));
}

// ftctl submit --set: ftd stores the merged job, so every attempt runs it, a
// resume on another worker included, with the result of a file that says
// the same.
TEST(E2E, SubmitWithOverridesRunsTheMergedJobAcrossAResume) {
  Cluster c("overrides");
  const std::string job = c.WriteJob("overrides", 1000, 10);
  c.StartWorker("w1");
  c.StartWorker("w2");
  const std::string log = c.dir() + "/ftctl-submit.log";
  Proc submit = Spawn({FTCTL_BIN, "--addr", c.address(), "submit", job, "--set", "train.max_steps=160",
                       "--set", "train.lr=5e-3"},
                      {.log = log, .stdout_to_log = true});
  ASSERT_EQ(submit.Wait(), 0) << Slurp(log);
  const std::string id = Slurp(log).substr(0, Slurp(log).find_first_of(" \n"));
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.steps_done() >= 30; }, 60'000);
  ASSERT_EQ(j.state(), pb::RUNNING) << Slurp(log);
  EXPECT_EQ(j.total_steps(), 160);
  EXPECT_THAT(j.spec_yaml(), HasSubstr("max_steps: 160"));
  EXPECT_THAT(j.spec_yaml(), HasSubstr("lr: 5e-3"));
  KillNode(c, j.worker_id());
  j = c.WaitFor(id, Done, 120'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  EXPECT_EQ(j.attempts_size(), 2);
  EXPECT_EQ(j.steps_done(), 160);
  const std::string same = c.WriteJob("overrides-in-file", 160, 10);
  std::string text = Slurp(same);
  text.replace(text.find("lr: 1.0e-2"), 10, "lr: 5e-3");
  std::ofstream(same) << text;
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(c.RunReference(same)));
}

// A job whose data is not JSON: ft-train exits with bad input at its start, the job fails at once.
std::string BadInputJob(Cluster& c) {
  const std::string job = c.WriteJob("bad-input", 10, 10);
  std::ofstream(c.dir() + "/job/not-json.jsonl") << "this is not json\n";
  std::string text = Slurp(job);
  text = std::regex_replace(text, std::regex("train: data.jsonl"), "train: not-json.jsonl");
  std::ofstream(job) << text;
  return job;
}

// The delivery ids a webhook owes for these jobs' events of these kinds ("wh-....<seq>").
std::set<std::string> OwedDeliveries(Cluster& c, const std::string& hook,
                                     const std::vector<std::string>& jobs,
                                     const std::set<std::string>& kinds) {
  std::set<std::string> ids;
  for (const std::string& job : jobs) {
    auto events = c.client().Events(job, 0);
    if (!events.ok()) continue;
    for (const pb::Event& e : events->events())
      if (kinds.count(e.kind())) ids.insert(hook + "." + std::to_string(e.seq()));
  }
  return ids;
}

// Also webhooks across the kill (issue #44): a receiver that holds its first post of the failed
// job's delivery unanswered, so that delivery is in flight when ftd dies; it is made again, and
// every subscribed event reaches the receiver, signed, exactly once after dedup by its id.
TEST(E2E, DaemonKilledMidRunRestartsWithoutDuplicatesAndKeepsHistory) {
  Cluster c("restart");
  using testing_support::WebhookPost;
  using testing_support::WebhookReceiver;
  WebhookReceiver receiver([](const WebhookPost& p, int n) {
    return p.body.find("\"kind\":\"failed\"") != std::string::npos && n == 1 ? WebhookReceiver::kHold : 200;
  });
  const std::string secret = "e2e-webhook-secret-0123";
  pb::AddWebhookRequest add;
  add.set_url(receiver.url());
  for (const char* kind : {"succeeded", "failed", "preempted"}) add.add_events(kind);
  add.set_secret(secret);
  auto hook = c.client().AddWebhook(add);
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  const std::string bad = c.Submit(BadInputJob(c));  // runs first, fails at once
  const std::string job = c.WriteJob("restart", 400, 10);
  c.StartWorker("w1");
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.steps_done() >= 30; }, 60'000);
  ASSERT_EQ(j.state(), pb::RUNNING);
  ASSERT_EQ(c.client().Get(bad)->state(), pb::FAILED);
  ASSERT_TRUE(receiver.WaitFor([](const auto& posts) { return !posts.empty(); }, 30'000))
      << "the failed job's delivery is in flight";
  c.daemon().Signal(SIGKILL);
  c.daemon().Wait();
  receiver.Release();  // answers the held post: ftd is gone and never hears it
  c.StartDaemon();
  j = c.WaitFor(id, Done, 120'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  EXPECT_EQ(j.attempts_size(), 1) << "the running attempt was reattached, not duplicated";
  auto events = c.client().Events(id, 0);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> kinds;
  for (const auto& e : events->events()) kinds.push_back(e.kind());
  EXPECT_EQ(kinds.front(), "queued") << "history from before the restart is intact";
  EXPECT_THAT(kinds, ::testing::Contains("reattached"));
  const std::set<std::string> owed =
      OwedDeliveries(c, hook->webhook().id(), {bad, id}, {"succeeded", "failed", "preempted"});
  ASSERT_EQ(owed.size(), 2u) << "the bad job's failed, the other's succeeded";
  ASSERT_TRUE(receiver.WaitFor(
      [&](const std::vector<WebhookPost>& posts) {
        std::set<std::string> seen;
        for (const WebhookPost& p : posts) seen.insert(p.event_id);
        return seen == owed;
      },
      30'000))
      << "every subscribed event, and no other";
  for (const WebhookPost& p : receiver.posts()) {
    EXPECT_TRUE(testing_support::ValidWebhookSignature(secret, p.body, p.signature)) << p.body;
  }
  const std::set<std::string> failed = OwedDeliveries(c, hook->webhook().id(), {bad}, {"failed"});
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(receiver.Count(*failed.begin()), 2) << "in flight at the kill, so delivered again";
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(c.RunReference(job)));
}

TEST(E2E, FrozenWorkerPastItsLeaseIsFencedOffAndTheResultIsUnaffected) {
  Cluster c("frozen");
  const std::string job = c.WriteJob("frozen", 400, 10);
  c.StartWorker("w1");
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.steps_done() >= 30; }, 60'000);
  ASSERT_EQ(j.worker_id(), "w1");
  KillNode(c, "w1", SIGSTOP);  // the whole node freezes
  c.StartWorker("w2");
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.worker_id() == "w2"; }, c.lease_ms() + 10'000);
  ASSERT_EQ(j.worker_id(), "w2");
  KillNode(c, "w1", SIGCONT);  // thaws: its reports are for a superseded epoch
  j = c.WaitFor(id, Done, 120'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  auto events = c.client().Events(id, 0);
  bool refused = false;
  for (const auto& e : events->events()) refused |= e.kind() == "refused";
  EXPECT_TRUE(refused || Slurp(c.dir() + "/worker-w1.log").find("superseded") != std::string::npos)
      << "the thawed worker's stale reports were not refused";
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(c.RunReference(job)));
}

TEST(E2E, JobThatDoesNotFitWaitsWithAReasonAndHigherPriorityStartsFirst) {
  Cluster c("placement");
  const std::string low = c.Submit(c.WriteJob("low", 10, 100, "resources: {priority: 0}\n"));
  const std::string high = c.Submit(c.WriteJob("high", 10, 100, "resources: {priority: 9}\n"));
  c.StartWorker("tiny", {"--cpu-memory", "1MiB"});
  pb::Job j = c.WaitFor(
      high, [](const pb::Job& j) { return j.reason().find("does not fit") != std::string::npos; }, 10'000);
  EXPECT_THAT(j.reason(), HasSubstr("does not fit: needs"));
  EXPECT_EQ(j.state(), pb::QUEUED);
  c.StartWorker("big");
  pb::Job h = c.WaitFor(high, Done, 60'000), l = c.WaitFor(low, Done, 60'000);
  ASSERT_EQ(h.state(), pb::SUCCEEDED);
  ASSERT_EQ(l.state(), pb::SUCCEEDED);
  EXPECT_EQ(h.attempts(0).worker_id(), "big");
  EXPECT_LT(h.attempts(0).started_ms(), l.attempts(0).started_ms()) << "the higher priority job starts first";
}

TEST(E2E, MalformedJobGetsFileAndLineFromFtctlAndTheDaemonIsUnaffected) {
  Cluster c("malformed");
  const std::string job = c.WriteJob("bad", 10, 100, "trian: {lr: 1}\n");
  Proc p = Spawn({FTCTL_BIN, "--addr", c.address(), "submit", job}, {.log = c.dir() + "/ftctl.log"});
  EXPECT_EQ(p.Wait(), 2);
  EXPECT_THAT(Slurp(c.dir() + "/ftctl.log"), HasSubstr(job + ":8:1: unknown key 'trian'"));
  auto jobs = c.client().List({});
  ASSERT_TRUE(jobs.ok()) << "the daemon is still serving";
  EXPECT_EQ(jobs->jobs_size(), 0);
}

// Tokens are secrets: with ftd, a worker and ftctl at debug log level, a job
// run through a worker restart, right and wrong tokens on gRPC and HTTP, no
// log, error message or file any of them writes holds a token.
TEST(E2E, TokensNeverAppearInLogsOrErrorMessages) {
  const std::string client = "client-SECRET-7c1e0d", worker = "worker-SECRET-52aa9f",
                    wrong = "wrong-SECRET-90bd3e";
  Cluster c("tokens", ClusterOptions{3000, {"--log-level", "debug"}, "", client, worker});
  c.StartWorker("w", {"--log-level", "debug"});
  const std::string id = c.Submit(c.WriteJob("tokens", 60, 10));
  c.WaitFor(
      id, [](const pb::Job& j) { return j.steps_done() >= 5 || Done(j); }, 120'000);
  c.worker("w").Signal(SIGKILL);  // the restarted worker registers (and authenticates) again
  c.worker("w").Wait();
  c.StartWorker("w", {"--log-level", "debug"});
  EXPECT_EQ(c.WaitFor(id, Done, 180'000).state(), pb::SUCCEEDED);
  // A worker with a wrong token is refused, and says so without the token.
  Proc bad = Spawn(
      {WORKER_BIN, "--daemon", c.address(), "--id", "intruder", "--token", wrong, "--ft-train", FT_TRAIN_BIN,
       "--work-dir", c.dir() + "/w-intruder", "--cpu-memory", "1GiB", "--log-level", "debug"},
      {.log = c.dir() + "/worker-intruder.log"});
  std::this_thread::sleep_for(std::chrono::seconds(2));
  bad.Signal(SIGKILL);
  bad.Wait();
  EXPECT_THAT(Slurp(c.dir() + "/worker-intruder.log"), HasSubstr("missing or wrong bearer token"));
  // ftctl with the right token, a wrong one and the wrong one from the environment.
  auto ftctl = [&](const std::string& name, std::vector<std::string> args,
                   std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {FTCTL_BIN, "--addr", c.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return Spawn(argv, {.log = c.dir() + "/ftctl-" + name + ".log", .env = std::move(env)}).Wait();
  };
  EXPECT_EQ(ftctl("ok", {"--token", client, "status", id}), 0);
  // The workers list shows each node's host memory (what the memory techniques draw on).
  EXPECT_EQ(ftctl("workers", {"--token", client, "workers"}), 0);
  EXPECT_THAT(Slurp(c.dir() + "/ftctl-workers.log"), HasSubstr("host memory"));
  EXPECT_NE(ftctl("wrong", {"--token", wrong, "ls"}), 0);
  EXPECT_NE(ftctl("env", {"ls"}, {"FTUNE_TOKEN=" + wrong}), 0);
  EXPECT_NE(ftctl("cancel", {"--token", wrong, "cancel", id}), 0);
  EXPECT_THAT(Slurp(c.dir() + "/ftctl-wrong.log"), HasSubstr("missing or wrong bearer token"));
  // The dashboard's API with the token in the query and a wrong one in the header.
  std::smatch m;
  const std::string ftd_log = Slurp(c.dir() + "/ftd.log");
  ASSERT_TRUE(std::regex_search(ftd_log, m, std::regex("dashboard at http://127\\.0\\.0\\.1:([0-9]+)/")));
  for (const std::string& request :
       {"GET /api/jobs?token=" + client + " HTTP/1.0\r\n\r\n",
        "POST /api/jobs/" + id + "/cancel HTTP/1.0\r\nAuthorization: Bearer " + wrong + "\r\n\r\n",
        "GET /api/jobs?token=" + wrong + " HTTP/1.0\r\n\r\n"}) {
    const std::string cmd = "bash -c 'exec 3<>/dev/tcp/127.0.0.1/" + m[1].str() + "; printf \"" + request +
                            "\" >&3; cat <&3' >> " + c.dir() + "/http.log 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  EXPECT_THAT(Slurp(c.dir() + "/http.log"), HasSubstr("401"));
  // Every file under the cluster's directory: logs, job logs, metrics, the database.
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(c.dir())) {
    if (!e.is_regular_file()) continue;
    ++files;
    const std::string text = Slurp(e.path().string());
    for (const std::string& token : {client, worker, wrong}) {
      EXPECT_EQ(text.find(token), std::string::npos) << e.path() << " holds a token";
    }
  }
  EXPECT_GT(files, 20);
}

// ftd serving the dashboard beyond loopback without a view token says so
// at start; with one (or on loopback) it does not.
TEST(E2E, DashboardBeyondLoopbackWithoutAViewTokenWarns) {
  const std::string dir = TempPath("view-token");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto start = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> argv = {FTD_BIN, "--listen", "127.0.0.1:0", "--data-dir", dir + "/" + name};
    argv.insert(argv.end(), extra.begin(), extra.end());
    Proc p = Spawn(argv, {.log = dir + "/" + name + ".log"});
    for (int i = 0; i < 800 && Slurp(p.log).find("dashboard at") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    p.Signal(SIGTERM);
    EXPECT_EQ(p.Wait(), 0) << Slurp(p.log);
    return Slurp(p.log);
  };
  const std::string open = start("open", {"--http", "0.0.0.0:0"});
  EXPECT_THAT(open, HasSubstr("dashboard at http://0.0.0.0:"));
  EXPECT_THAT(open, HasSubstr("has no view token"));
  const std::string guarded = start("guarded", {"--http", "0.0.0.0:0", "--http-view-token", "v-SECRET"});
  EXPECT_THAT(guarded, HasSubstr("dashboard at http://0.0.0.0:"));
  EXPECT_THAT(guarded, ::testing::Not(HasSubstr("has no view token")));
  EXPECT_THAT(start("loopback", {"--http", "127.0.0.1:0"}), ::testing::Not(HasSubstr("has no view token")));
}

TEST(E2E, TlsWhenConfiguredAndPlaintextClientsAreRefused) {
  const std::string certs = TempPath("tls-certs");
  std::filesystem::remove_all(certs);
  std::filesystem::create_directories(certs);
  const std::string cert = certs + "/cert.pem", key = certs + "/key.pem";
  ASSERT_EQ(std::system(("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost "
                         "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
                         key + " -out " + cert + " >" + certs + "/openssl.log 2>&1")
                            .c_str()),
            0)
      << Slurp(certs + "/openssl.log");
  Cluster c("tls", ClusterOptions{3000, {"--tls-cert", cert, "--tls-key", key}, cert});
  c.StartWorker("w", {"--tls-ca", cert});
  const std::string id = c.Submit(c.WriteJob("tls", 12, 6));
  pb::Job j = c.WaitFor(id, Done, 120'000);
  EXPECT_EQ(j.state(), pb::SUCCEEDED) << j.reason();
  // ftctl with the CA works; a plaintext client gets a clear failure, not a hang.
  Proc ok =
      Spawn({FTCTL_BIN, "--addr", c.address(), "--tls-ca", cert, "status", id}, {.log = c.dir() + "/ok.log"});
  EXPECT_EQ(ok.Wait(), 0) << Slurp(c.dir() + "/ok.log");
  JobsClient plain(ClientOptions{c.address(), "", 3'000});
  auto r = plain.Get(id);
  EXPECT_FALSE(r.ok());
  // A bad CA file is bad input naming the flag.
  Proc bad = Spawn({FTCTL_BIN, "--addr", c.address(), "--tls-ca", c.dir() + "/nope.pem", "ls"},
                   {.log = c.dir() + "/bad.log"});
  EXPECT_EQ(bad.Wait(), 2);
  EXPECT_THAT(Slurp(c.dir() + "/bad.log"), HasSubstr("--tls-ca"));
}

TEST(E2E, EmbeddedModeRunsAJobAndStopsBothProcessesOnSigterm) {
  Cluster c("up-jobdir");  // only for the tiny model, data and job file
  const std::string job = c.WriteJob("embedded", 12, 6);
  const std::string data = c.dir() + "/up-data";
  Proc up = Spawn({FTCTL_BIN, "up", "--data-dir", data, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                   "--cpu-memory", "4GiB"},
                  {.log = c.dir() + "/up.log"});
  std::smatch m;
  std::string text;
  const std::regex re("ftune is up: ftd on ([0-9.:]+), dashboard at (http://[0-9.:]+/)");
  for (int i = 0; i < 400 && !std::regex_search(text, m, re); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    text = Slurp(c.dir() + "/up.log");
  }
  ASSERT_TRUE(std::regex_search(text, m, re)) << text;
  const std::string address = m[1];
  Proc submit =
      Spawn({FTCTL_BIN, "--addr", address, "submit", "--follow", job}, {.log = c.dir() + "/submit.log"});
  EXPECT_EQ(submit.Wait(), 0) << Slurp(c.dir() + "/submit.log");
  EXPECT_TRUE(std::filesystem::exists(data + "/ftd.sqlite"));
  up.Signal(SIGTERM);
  EXPECT_EQ(up.Wait(), 0) << Slurp(c.dir() + "/up.log");
  // Neither child outlives it.
  EXPECT_NE(std::system(("pgrep -f '" + data + "([ /]|$)' >/dev/null").c_str()), 0);
}

// A fake cloud metadata server: 404 until `notice` is set, then the notice.
class FakeMetadata {
 public:
  FakeMetadata() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listen(fd_, 16);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeMetadata() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::atomic<bool> notice{false};

 private:
  void Serve() {
    while (!stop_) {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      char buf[4096];
      ssize_t n = read(c, buf, sizeof(buf) - 1);
      std::string req(buf, n > 0 ? static_cast<size_t>(n) : 0);
      std::string body, status = "404 Not Found";
      if (notice && req.find("/latest/meta-data/spot/instance-action") != std::string::npos) {
        status = "200 OK";
        body = R"({"action": "terminate", "time": "2026-11-21T10:00:00Z"})";
      } else if (req.find("/computeMetadata/v1/instance/preempted") != std::string::npos &&
                 req.find("Metadata-Flavor: Google") != std::string::npos) {
        status = "200 OK";
        body = notice ? "TRUE" : "FALSE";
      }
      std::string resp = "HTTP/1.1 " + status + "\r\nContent-Length: " + std::to_string(body.size()) +
                         "\r\nConnection: close\r\n\r\n" + body;
      (void)write(c, resp.data(), resp.size());
      close(c);
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// SIGTERM or a cloud notice: checkpoint now, report "preempted", lose no step. A notice is kept
// with the attempt and counted caught (goodput's notice catch rate); a signal is no notice.
void ExpectGracefulPreemption(const std::string& name, const std::vector<std::string>& flags,
                              const std::function<void(Cluster&)>& trigger, const std::string& reason,
                              bool notice) {
  Cluster c(name);
  const std::string job = c.WriteJob(name, 400, 1000);  // no periodic checkpoint: only the notice makes one
  c.StartWorker("w1", flags);
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.steps_done() >= 30; }, 60'000);
  ASSERT_EQ(j.worker_id(), "w1");
  trigger(c);
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.preemptions() >= 1; }, 30'000);
  ASSERT_EQ(j.preemptions(), 1) << Slurp(c.dir() + "/worker-w1.log");
  EXPECT_EQ(j.failures(), 0);
  ASSERT_GE(j.attempts_size(), 1);
  EXPECT_EQ(j.attempts(0).outcome(), pb::ATTEMPT_PREEMPTED);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr(reason));
  EXPECT_EQ(j.attempts(0).steps_lost(), 0) << "a checkpoint on notice loses nothing";
  EXPECT_EQ(j.committed_step(), j.attempts(0).end_step());
  c.StartWorker("w2");
  j = c.WaitFor(id, Done, 120'000);
  ASSERT_EQ(j.state(), pb::SUCCEEDED);
  EXPECT_EQ(j.goodput().notices(), notice ? 1 : 0);
  EXPECT_EQ(j.goodput().notices_caught(), notice ? 1 : 0);
  EXPECT_EQ(Adapter(j.output_dir()), Adapter(c.RunReference(job)));
}

TEST(E2E, SigtermToTheWorkerCheckpointsAndLosesNoStep) {
  ExpectGracefulPreemption(
      "sigterm", {}, [](Cluster& c) { c.worker("w1").Signal(SIGTERM); }, "SIGTERM", /*notice=*/false);
}

TEST(E2E, AwsSpotNoticeCheckpointsAndLosesNoStep) {
  FakeMetadata aws;
  ExpectGracefulPreemption(
      "aws", {"--aws-metadata-url", aws.url(), "--notice-poll-ms", "200"},
      [&](Cluster&) { aws.notice = true; }, "AWS", /*notice=*/true);
}

TEST(E2E, GcpPreemptionNoticeCheckpointsAndLosesNoStep) {
  FakeMetadata gcp;
  ExpectGracefulPreemption(
      "gcp", {"--gcp-metadata-url", gcp.url(), "--notice-poll-ms", "200"},
      [&](Cluster&) { gcp.notice = true; }, "GCP", /*notice=*/true);
}

// A notice the trainer cannot meet (it is frozen, so it never checkpoints within the worker's
// 2 s stop grace): the worker kills it, steps are lost, and ftd counts the notice, not caught.
TEST(E2E, ANoticeTheTrainerCannotMeetIsCountedButNotCaught) {
  FakeMetadata gcp;
  Cluster c("gcp-late");
  const std::string job = c.WriteJob("gcp-late", 400, 1000);  // no periodic checkpoint
  c.StartWorker("w1", {"--gcp-metadata-url", gcp.url(), "--notice-poll-ms", "200", "--stop-grace", "2"});
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.steps_done() >= 30; }, 60'000);
  ASSERT_EQ(j.worker_id(), "w1");
  ASSERT_EQ(std::system(("pkill -STOP -f '" + c.dir() + "[/]w-w1/' >/dev/null").c_str()), 0);
  gcp.notice = true;
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.preemptions() + j.failures() >= 1; }, 60'000);
  std::system(("pkill -CONT -f '" + c.dir() + "[/]w-w1/' >/dev/null 2>&1").c_str());
  ASSERT_EQ(j.attempts_size(), 1) << Slurp(c.dir() + "/worker-w1.log");
  EXPECT_GT(j.attempts(0).steps_lost(), 0) << j.attempts(0).reason();
  EXPECT_EQ(j.goodput().notices(), 1);
  EXPECT_EQ(j.goodput().notices_caught(), 0);
}

TEST(E2E, SlotEndingSoonYieldsWithACheckpointAndTheJobMovesOn) {
  Cluster c("slot");
  const std::string job = c.WriteJob("slot", 3000, 1000);
  const int64_t before_ms = WallNowMs();
  c.StartWorker("short", {"--slot-end", "+20s"});
  const std::string id = c.Submit(job);
  pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.state() == pb::RUNNING; }, 30'000);
  ASSERT_EQ(j.worker_id(), "short");
  c.StartWorker("next");
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.preemptions() >= 1; }, 40'000);
  ASSERT_EQ(j.preemptions(), 1);
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("slot"));
  EXPECT_EQ(j.attempts(0).steps_lost(), 0);
  // It used its slot (the stop comes at end - 1.5 x checkpoint time - margin,
  // not at once) and yielded before the end.
  EXPECT_GT(j.attempts(0).end_step(), 0);
  EXPECT_GT(j.attempts(0).ended_ms() - j.attempts(0).started_ms(), 5'000);
  EXPECT_LT(j.attempts(0).ended_ms(), before_ms + 20'000);
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.worker_id() == "next"; }, 20'000);
  EXPECT_EQ(j.worker_id(), "next");
  // Cancel so the test does not wait for 3000 steps; cancellation is itself a scenario.
  auto cancelled = c.client().Cancel(id);
  ASSERT_TRUE(cancelled.ok());
  j = c.WaitFor(
      id, [](const pb::Job& j) { return j.state() == pb::CANCELLED; }, 10'000);
  EXPECT_EQ(j.state(), pb::CANCELLED);
}

}  // namespace
}  // namespace ft::e2e
