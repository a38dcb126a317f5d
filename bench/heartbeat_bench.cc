// Control-plane load: N simulated workers, each a real gRPC session to an
// ftd (the Daemon and its services on a loopback port, in this process),
// sending a heartbeat once a second, with Q queued jobs that fit nowhere (so
// every tick runs a scheduling pass over all of them). The simulated workers
// run in a child process, so this process's resident size is ftd's. Prints
// every phase: submit (S concurrent submitters, each job durable when its
// reply comes: group commit), registration, the heartbeat window; the
// daemon-side handling latency of worker messages (p50/p99/max), heartbeats
// due vs handled, the tick (scheduling pass) latency, and ftd's RSS.
// shared/TARGETS.md aims at 10,000 workers and 100,000 queued jobs on 2 cores:
// heartbeat p99 < 20 ms, nothing dropped, a pass < 50 ms, RSS < 1 GiB.
//
//   heartbeat_bench [--workers N] [--jobs Q] [--seconds S] [--submitters K]
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "daemon/daemon.h"
#include "daemon/grpc_service.h"
#include "engine/io/hf_model.h"

namespace {

namespace pb = ftune::v1;
using Clock = std::chrono::steady_clock;

std::atomic<int64_t> g_deferred{0}, g_pending{0};  // pending: deferred, not yet sent
// Heartbeats sent, in memory shared with the parent (mapped before the fork): it starts its
// window once the daemon has caught up with them.
std::atomic<int64_t>* g_sent = nullptr;

// One simulated worker: registers, then heartbeats when asked.
class SimWorker : public grpc::ClientBidiReactor<pb::WorkerMessage, pb::DaemonCommand> {
 public:
  SimWorker(pb::Workers::Stub* stub, const std::string& id) : id_(id) {
    stub->async()->Session(&ctx_, this);
    pb::Register* reg = out_.mutable_register_();
    reg->set_worker_id(id);
    pb::Device* d = reg->add_devices();
    d->set_kind("cpu");
    d->set_total_bytes(1 << 20);  // 1 MiB: no job fits, so every tick is a full pass
    d->set_free_bytes(1 << 20);
    writing_ = true;
    StartWrite(&out_);
    StartRead(&in_);
    StartCall();
  }
  // Like ft-worker's session: a heartbeat due while the previous write is in
  // flight is sent as soon as that write completes (never skipped).
  void Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      if (writing_) {
        g_deferred++;
        g_pending++;
        pending_++;
        return;
      }
      PrepareHeartbeat();
    }
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (ok && out_.has_heartbeat()) g_sent->fetch_add(1);
      if (!ok || pending_ == 0 || done_) return;
      pending_--;
      g_pending--;
      PrepareHeartbeat();
    }
    StartWrite(&out_);
  }
  // REQUIRES: mu_ held, no write in flight.
  void PrepareHeartbeat() {
    writing_ = true;
    out_.Clear();
    pb::Device* d = out_.mutable_heartbeat()->add_devices();
    d->set_kind("cpu");
    d->set_total_bytes(1 << 20);
    d->set_free_bytes(1 << 20);
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void Stop() {
    ctx_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  std::string id_;
  grpc::ClientContext ctx_;
  pb::WorkerMessage out_;
  pb::DaemonCommand in_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false;
  int pending_ = 0;  // heartbeats due while a write was in flight
  bool done_ = false;
};

}  // namespace

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The child: N simulated workers against 127.0.0.1:port, each heartbeating
// once a second from its registration on (spread evenly over each second, as
// ft-worker does) until a byte comes on `stop`; then, once its writes are
// done, writes "sent deferred" (heartbeats, in all) to `out`.
int RunWorkers(int port, int workers, int stop, int out) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = pb::Workers::NewStub(channel);
  std::atomic<bool> stopping{false};
  std::thread watcher([&] {
    char byte = 0;
    (void)!read(stop, &byte, 1);  // the byte, or the parent gone: stop either way
    stopping = true;
  });
  std::vector<std::unique_ptr<SimWorker>> sims;
  const auto start = Clock::now();
  // Second by second; a second the loop fell behind on is skipped, not caught up (a worker
  // heartbeats every second from now on, it does not send the ones it missed).
  for (int64_t s = 0; !stopping; s = std::max<int64_t>(s + 1, static_cast<int64_t>(SecondsSince(start)))) {
    for (int i = 0; i < workers && !stopping; ++i) {
      std::this_thread::sleep_until(start +
                                    std::chrono::microseconds(s * 1'000'000LL + i * 1'000'000LL / workers));
      if (s == 0) {
        sims.push_back(std::make_unique<SimWorker>(stub.get(), "sim-" + std::to_string(i)));
      } else {
        sims[i]->Heartbeat();
      }
    }
  }
  watcher.join();
  // Let deferred heartbeats drain: each worker's writes done.
  for (int i = 0; i < 100 && g_pending > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string result = std::to_string(g_sent->load()) + " " + std::to_string(g_deferred.load()) + "\n";
  if (write(out, result.data(), result.size()) != static_cast<ssize_t>(result.size())) return 1;
  for (auto& w : sims) w->Stop();
  return 0;
}

// Submits `jobs` jobs from `submitters` threads; the first error, or OK.
ft::Status SubmitAll(ft::Daemon& daemon, const std::string& dir, int jobs, int submitters) {
  std::atomic<int> next{0};
  std::mutex mu;
  ft::Status first;
  std::vector<std::thread> threads;
  for (int t = 0; t < submitters; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < jobs; i = next++) {
        pb::SubmitRequest req;
        req.set_spec_yaml(
            "model: {path: model}\ndata: {train: d.jsonl, format: tokens, seq_len: 512}\n"
            "train: {max_steps: 10, global_batch_size: 8}\noutput: {dir: out/" +
            std::to_string(i) + "}\n");  // every job an output.dir of its own: ftd refuses a shared one
        req.set_spec_dir(dir + "/job");
        if (auto submitted = daemon.Submit(req); !submitted.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first.ok()) first = submitted.status();
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return first;
}

// "VmRSS" / "VmHWM" of this process, in MiB (0 if unreadable).
double ResidentMiB(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
  }
  return 0;
}

// Forks the simulated workers' process, before either side starts gRPC: it
// reads the port from to_child, then "s" (stop) once the window is over, and
// writes "<sent> <deferred>" to from_child. -1 when the fork fails.
pid_t ForkWorkers(int workers, int to_child[2], int from_child[2]) {
  void* shared =
      mmap(nullptr, sizeof(std::atomic<int64_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return -1;
  g_sent = new (shared) std::atomic<int64_t>(0);
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return -1;
  const pid_t child = fork();
  if (child == 0) {
    close(to_child[1]);
    close(from_child[0]);
    int port = 0;
    if (read(to_child[0], &port, sizeof(port)) != sizeof(port)) _exit(1);
    _exit(RunWorkers(port, workers, to_child[0], from_child[1]));
  }
  close(to_child[0]);
  close(from_child[1]);
  return child;
}

// A fresh directory with the jobs' files (a model's config.json, a data file) and ftd's data dir.
std::string MakeBenchDir() {
  const std::string dir = (std::filesystem::temp_directory_path() / "ft-heartbeat-bench").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/job/model");
  std::ofstream(dir + "/job/model/config.json") << ft::HfConfigJson(*ft::PresetModelConfig("tiny-llama"));
  std::ofstream(dir + "/job/d.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";  // ftd refuses a missing data file
  std::filesystem::create_directories(dir + "/ftd");  // ftd's data dir apart from the job's files
  return dir;
}

// What main measured, for PrintFigures.
struct Figures {
  int workers, seconds, jobs, submitters;
  double submit_s, rss_queued;
  int64_t registered;
  double register_s, settle_s, beat_s;
  long long handled, sent, deferred, dropped;
};

// Every phase's figures, with the daemon's own latency histograms.
void PrintFigures(const Figures& f, ft::Daemon& daemon) {
  const auto& m = daemon.message_latency();
  const auto& t = daemon.tick_latency();
  const long long due = static_cast<long long>(f.workers) * f.seconds;
  std::printf("%d workers at 1 Hz for %d s, %d queued jobs\n", f.workers, f.seconds, f.jobs);
  std::printf("submit: %d jobs in %.1f s from %d submitters: %.0f durable jobs/s (aim >= 500)\n", f.jobs,
              f.submit_s, f.submitters, f.jobs / f.submit_s);
  std::printf(
      "register: %lld of %d workers alive after %.1f s; the heartbeats sent meanwhile handled %.1f s later\n",
      static_cast<long long>(f.registered), f.workers, f.register_s, f.settle_s);
  std::printf("heartbeats in a %.1f s window: due %lld, handled by the daemon %lld\n", f.beat_s, due,
              f.handled);
  std::printf(
      "heartbeats in all (from registration to the end): sent %lld (%lld waited for the previous write), "
      "dropped %lld\n",
      f.sent, f.deferred, f.dropped);
  std::printf(
      "handling latency of every worker message after its registration: p50 %.2f ms  p99 %.2f ms  max %.2f "
      "ms   (aim: p99 < 20 ms); %.0f%% handled without the daemon's lock (quiet heartbeats)\n",
      m.Quantile(0.5) * 1e3, m.Quantile(0.99) * 1e3, m.max_seconds() * 1e3,
      100.0 * static_cast<double>(daemon.quiet_heartbeats()) /
          static_cast<double>(std::max<int64_t>(1, m.count())));
  std::printf(
      "scheduler tick over %d queued jobs x %d workers: p50 %.1f ms  p99 %.1f ms  max %.1f ms over %lld "
      "ticks (aim: p50 < 50 ms, p99 < 100 ms)\n",
      f.jobs, f.workers, t.Quantile(0.5) * 1e3, t.Quantile(0.99) * 1e3, t.max_seconds() * 1e3,
      static_cast<long long>(t.count()));
  std::printf(
      "ftd resident: %.0f MiB with the jobs queued, %.0f MiB at the end, peak %.0f MiB (aim < 1024)\n",
      f.rss_queued, ResidentMiB("VmRSS"), ResidentMiB("VmHWM"));
}

int main(int argc, char** argv) {
  CLI::App app{"heartbeat_bench: N simulated workers at 1 Hz against an in-process ftd"};
  int workers = 1000, jobs = 10000, seconds = 20, submitters = 16;
  app.add_option("--workers", workers);
  app.add_option("--jobs", jobs);
  app.add_option("--seconds", seconds);
  app.add_option("--submitters", submitters, "concurrent submitting threads (group commit)");
  CLI11_PARSE(app, argc, argv);
  ft::log::Configure({ft::log::Level::kWarn});

  int to_child[2], from_child[2];  // [1] and [0]: this side's ends
  const pid_t child = ForkWorkers(workers, to_child, from_child);
  if (child < 0) return 1;

  const std::string dir = MakeBenchDir();
  auto store = ft::Store::Open(dir + "/ftd/ftd.sqlite");
  if (!store.ok()) {
    std::fprintf(stderr, "heartbeat_bench: %s\n", store.status().ToString().c_str());
    return 1;
  }
  ft::SystemClock clock;
  ft::DaemonOptions options;
  options.data_dir = dir + "/ftd";
  options.lease_ms = 10'000;
  options.tick_ms = 200;  // the ticker's period below
  ft::Daemon daemon(std::move(*store), &clock, options);

  const auto submit_start = Clock::now();
  if (ft::Status submitted = SubmitAll(daemon, dir, jobs, submitters); !submitted.ok()) {
    std::fprintf(stderr, "heartbeat_bench: submit: %s\n", submitted.ToString().c_str());
    return 1;
  }
  const double submit_s = SecondsSince(submit_start);
  const double rss_queued = ResidentMiB("VmRSS");

  auto jobs_service = ft::MakeJobsService(&daemon, {});
  auto workers_service = ft::MakeWorkersService(&daemon, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(jobs_service.get());
  builder.RegisterService(workers_service.get());
  auto server = builder.BuildAndStart();
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    while (!stop) {
      const auto t = Clock::now();
      daemon.Tick();
      std::this_thread::sleep_until(t + std::chrono::milliseconds(200));
    }
  });

  const auto register_start = Clock::now();
  if (write(to_child[1], &port, sizeof(port)) != sizeof(port)) return 1;
  auto alive = [&] {
    int64_t n = 0;
    for (const auto& [pool, count] : daemon.live_pools()) n += count;
    return n;
  };
  while (alive() < workers && SecondsSince(register_start) < 600)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double register_s = SecondsSince(register_start);
  const int64_t registered = alive();
  // The heartbeats that queued while workers registered drain first (at most a minute).
  const auto backlog = [&] { return g_sent->load() - daemon.message_latency().count(); };
  const auto settle_start = Clock::now();
  while (backlog() > workers / 10 && SecondsSince(settle_start) < 60)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double settle_s = SecondsSince(settle_start);
  // The window: every worker registered and heartbeating.
  const int64_t before = daemon.message_latency().count();
  const auto beat_start = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  const long long handled = static_cast<long long>(daemon.message_latency().count() - before);
  const double beat_s = SecondsSince(beat_start);
  if (write(to_child[1], "s", 1) != 1) return 1;
  char result[64] = {0};
  const ssize_t got = read(from_child[0], result, sizeof(result) - 1);
  long long sent = 0, deferred = 0;
  if (got <= 0 || std::sscanf(result, "%lld %lld", &sent, &deferred) != 2) {
    std::fprintf(stderr, "heartbeat_bench: the workers' process reported nothing\n");
    return 1;
  }
  // Every heartbeat sent is handled (or dropped): wait for the daemon to drain what is in flight.
  const auto heartbeats_handled = [&] { return daemon.message_latency().count(); };  // (not registrations)
  for (int i = 0; i < 100 && heartbeats_handled() < sent; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Figures f{workers,    seconds,  jobs,   submitters, submit_s, rss_queued, registered,
            register_s, settle_s, beat_s, handled,    sent,     deferred,   0};
  // Below zero when the daemon handled a heartbeat whose write the client saw fail as it stopped.
  f.dropped = std::max(0LL, sent - static_cast<long long>(daemon.message_latency().count()));
  PrintFigures(f, daemon);
  stop = true;
  ticker.join();
  int status = 0;
  waitpid(child, &status, 0);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
