// Control-plane load: N simulated workers, each a real gRPC session to an
// in-process ftd (the Daemon and its services on a loopback port), sending a
// heartbeat once a second, with Q queued jobs that fit nowhere (so every tick
// runs a full scheduling pass). Prints the daemon-side handling latency of
// worker messages (p50/p99/max), heartbeats sent vs handled, and the tick
// (scheduling pass) latency. shared/TARGETS.md aims at 1,000 workers with
// p99 < 20 ms and nothing dropped, and a pass over 10,000 jobs < 50 ms.
//
//   heartbeat_bench [--workers N] [--jobs Q] [--seconds S]
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "daemon/daemon.h"
#include "daemon/grpc_service.h"
#include "engine/io/hf_model.h"

namespace {

namespace pb = ftune::v1;
using Clock = std::chrono::steady_clock;

std::atomic<int64_t> g_sent{0}, g_deferred{0};

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
      if (ok && out_.has_heartbeat()) g_sent++;
      if (!ok || pending_ == 0 || done_) return;
      pending_--;
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

int main(int argc, char** argv) {
  CLI::App app{"heartbeat_bench: N simulated workers at 1 Hz against an in-process ftd"};
  int workers = 1000, jobs = 10000, seconds = 20;
  app.add_option("--workers", workers);
  app.add_option("--jobs", jobs);
  app.add_option("--seconds", seconds);
  CLI11_PARSE(app, argc, argv);
  ft::log::Configure({ft::log::Level::kWarn});

  const std::string dir = (std::filesystem::temp_directory_path() / "ft-heartbeat-bench").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/job/model");
  std::ofstream(dir + "/job/model/config.json") << ft::HfConfigJson(*ft::PresetModelConfig("tiny-llama"));
  std::ofstream(dir + "/job/d.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";  // ftd refuses a missing data file
  std::filesystem::create_directories(dir + "/ftd");  // ftd's data dir apart from the job's files
  auto store = ft::Store::Open(dir + "/ftd/ftd.sqlite");
  if (!store.ok()) {
    std::fprintf(stderr, "heartbeat_bench: %s\n", store.status().ToString().c_str());
    return 1;
  }
  ft::SystemClock clock;
  ft::DaemonOptions options;
  options.data_dir = dir + "/ftd";
  options.lease_ms = 10'000;
  ft::Daemon daemon(std::move(*store), &clock, options);

  const auto submit_start = Clock::now();
  for (int i = 0; i < jobs; ++i) {
    pb::SubmitRequest req;
    req.set_spec_yaml(
        "model: {path: model}\ndata: {train: d.jsonl, format: tokens, seq_len: 512}\n"
        "train: {max_steps: 10, global_batch_size: 8}\noutput: {dir: out/" +
        std::to_string(i) + "}\n");  // every job an output.dir of its own: ftd refuses a shared one
    req.set_spec_dir(dir + "/job");
    if (auto submitted = daemon.Submit(req); !submitted.ok()) {
      std::fprintf(stderr, "heartbeat_bench: submit %d: %s\n", i, submitted.status().ToString().c_str());
      return 1;
    }
  }
  const double submit_s = std::chrono::duration<double>(Clock::now() - submit_start).count();

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

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = pb::Workers::NewStub(channel);
  std::vector<std::unique_ptr<SimWorker>> sims;
  for (int i = 0; i < workers; ++i)
    sims.push_back(std::make_unique<SimWorker>(stub.get(), "sim-" + std::to_string(i)));
  // Heartbeats spread evenly over each second.
  const auto start = Clock::now();
  for (int s = 0; s < seconds; ++s) {
    for (int i = 0; i < workers; ++i) {
      std::this_thread::sleep_until(start +
                                    std::chrono::microseconds(s * 1'000'000LL + i * 1'000'000LL / workers));
      sims[i]->Heartbeat();
    }
  }
  // Let deferred heartbeats drain.
  for (int i = 0; i < 50 && g_sent < static_cast<int64_t>(workers) * seconds; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto& m = daemon.message_latency();
  const auto& t = daemon.tick_latency();
  std::printf("workers %d at 1 Hz for %d s, %d queued jobs (submitted at %.0f jobs/s, each fsynced)\n",
              workers, seconds, jobs, jobs / submit_s);
  std::printf(
      "heartbeats due %lld, sent %lld, handled by the daemon %lld (%lld waited for the previous write); "
      "dropped %lld\n",
      static_cast<long long>(workers) * seconds, static_cast<long long>(g_sent.load()),
      static_cast<long long>(m.count()), static_cast<long long>(g_deferred.load()),
      static_cast<long long>(workers) * seconds - static_cast<long long>(m.count()));
  std::printf("handling latency: p50 %.2f ms  p99 %.2f ms  max %.2f ms   (aim: p99 < 20 ms)\n",
              m.Quantile(0.5) * 1e3, m.Quantile(0.99) * 1e3, m.max_seconds() * 1e3);
  std::printf(
      "scheduler tick over %d queued jobs x %d workers: p50 %.1f ms  p99 %.1f ms  max %.1f ms over %lld "
      "ticks "
      "(aim: < 50 ms)\n",
      jobs, workers, t.Quantile(0.5) * 1e3, t.Quantile(0.99) * 1e3, t.max_seconds() * 1e3,
      static_cast<long long>(t.count()));
  for (auto& w : sims) w->Stop();
  stop = true;
  ticker.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
