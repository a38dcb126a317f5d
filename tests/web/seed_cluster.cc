// Seeds a running ftd with a large, idle cluster for the dashboard load test
// (issue #8, acceptance 4): N simulated workers (real gRPC sessions that
// register and heartbeat once a second, each with one device too small for
// any job) and M submitted jobs that therefore stay queued.
//
//   web_seed_cluster --daemon HOST:PORT [--workers 100] [--jobs 1000] --dir DIR [--token T]
//
// Prints "seeded: N workers, M jobs" once everything is registered and
// submitted, then keeps heartbeating until its stdin closes or it gets
// SIGTERM/SIGINT. Exit 0 then; 1 when the daemon refused something (the
// reason on stderr); 2 on bad flags.
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "cli/client.h"
#include "engine/io/hf_model.h"
#include "engine/model/model_config.h"

namespace {

namespace pb = ftune::v1;
constexpr int64_t kDeviceBytes = 1 << 20;  // 1 MiB: no job fits, so all stay queued

std::atomic<bool> g_stop{false};

// One simulated worker: a Session stream that registered; a thread drains the
// daemon's commands so its flow-control window never fills.
class SimWorker {
 public:
  SimWorker(pb::Workers::Stub* stub, const std::string& id, const std::string& token) : id_(id) {
    if (!token.empty()) ctx_.AddMetadata("authorization", "Bearer " + token);
    stream_ = stub->Session(&ctx_);
    pb::WorkerMessage m;
    pb::Register* reg = m.mutable_register_();
    reg->set_worker_id(id);
    reg->set_hostname("sim-host-" + id);
    reg->set_version("seed");
    FillDevice(reg->add_devices());
    ok_ = stream_->Write(m);
    reader_ = std::thread([this] {
      pb::DaemonCommand command;
      while (stream_->Read(&command)) {
      }
    });
  }
  ~SimWorker() {
    ctx_.TryCancel();
    reader_.join();
  }
  bool Heartbeat() {
    pb::WorkerMessage m;
    FillDevice(m.mutable_heartbeat()->add_devices());
    return ok_ = ok_ && stream_->Write(m);
  }
  bool ok() const { return ok_; }
  const std::string& id() const { return id_; }

 private:
  void FillDevice(pb::Device* d) const {
    d->set_index(0);
    d->set_kind("cpu");
    d->set_name("simulated");
    d->set_total_bytes(kDeviceBytes);
    d->set_used_bytes(kDeviceBytes / 4);
    d->set_free_bytes(kDeviceBytes - kDeviceBytes / 4);
  }

  std::string id_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::WorkerMessage, pb::DaemonCommand>> stream_;
  std::thread reader_;
  bool ok_ = false;
};

bool StdinClosed() {
  pollfd p{0, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char c;
  return read(0, &c, 1) <= 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"web_seed_cluster: simulated workers and queued jobs for the dashboard load test"};
  std::string daemon, dir, token;
  int workers = 100, jobs = 1000;
  app.add_option("--daemon", daemon, "ftd's gRPC address HOST:PORT")->required();
  app.add_option("--dir", dir, "scratch directory for the jobs' model config")->required();
  app.add_option("--workers", workers, "simulated workers")->check(CLI::Range(0, 100000));
  app.add_option("--jobs", jobs, "jobs to submit")->check(CLI::Range(0, 1000000));
  app.add_option("--token", token, "bearer token (client and worker)");
  CLI11_PARSE(app, argc, argv);
  signal(SIGTERM, [](int) { g_stop = true; });
  signal(SIGINT, [](int) { g_stop = true; });

  const auto start = std::chrono::steady_clock::now();
  std::filesystem::create_directories(dir + "/model");
  std::ofstream(dir + "/model/config.json") << ft::HfConfigJson(*ft::PresetModelConfig("tiny-llama"));
  std::ofstream(dir + "/d.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";  // ftd refuses a missing data file

  auto channel = grpc::CreateChannel(daemon, grpc::InsecureChannelCredentials());
  auto stub = pb::Workers::NewStub(channel);
  std::vector<std::unique_ptr<SimWorker>> sims;
  for (int i = 0; i < workers; ++i) {
    char id[32];
    std::snprintf(id, sizeof(id), "sim-%03d", i);
    sims.push_back(std::make_unique<SimWorker>(stub.get(), id, token));
    if (!sims.back()->ok()) {
      std::fprintf(stderr, "web_seed_cluster: worker %s could not register with %s\n", id, daemon.c_str());
      return 1;
    }
  }

  ft::JobsClient client(ft::ClientOptions{daemon, token, 10'000});
  for (int i = 0; i < jobs; ++i) {
    pb::SubmitRequest req;
    req.set_spec_yaml("name: load-" + std::to_string(i) +
                      "\nmodel: {path: model}\ndata: {train: d.jsonl, format: tokens, seq_len: 512}\n"
                      "train: {max_steps: 100, global_batch_size: 8}\n"
                      "resources: {priority: " +
                      std::to_string(i % 5) + "}\noutput: {dir: out-" + std::to_string(i) + "}\n");
    req.set_spec_dir(dir);
    auto reply = client.Submit(req);
    if (!reply.ok()) {
      std::fprintf(stderr, "web_seed_cluster: submit %d refused: %s\n", i, reply.status().ToString().c_str());
      return 1;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("seeded: %d workers, %d jobs in %.1f s\n", workers, jobs, seconds);
  std::fflush(stdout);

  while (!g_stop && !StdinClosed()) {
    for (auto& w : sims) {
      if (!w->Heartbeat()) {
        std::fprintf(stderr, "web_seed_cluster: %s's session ended (did ftd stop?)\n", w->id().c_str());
        return 1;
      }
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return 0;
}
