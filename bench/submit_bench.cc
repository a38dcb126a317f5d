// Submit throughput: C concurrent gRPC clients each submitting jobs to an
// in-process ftd (the Daemon and its Jobs service on a loopback port) as fast
// as acknowledgements come back. Every acknowledged job is durable: the
// store commits with synchronous=FULL before the reply (concurrent submits
// share one fsync: the daemon's group commit). Prints jobs/s and checks that
// the daemon lists exactly the acknowledged jobs. shared/TARGETS.md aims at
// ≥ 500 jobs/s.
//
//   submit_bench [--clients C] [--jobs N]
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/logging.h"
#include "daemon/daemon.h"
#include "daemon/grpc_service.h"
#include "engine/io/hf_model.h"

namespace pb = ftune::v1;

int main(int argc, char** argv) {
  CLI::App app{"submit_bench: concurrent gRPC submits against an in-process ftd"};
  int clients = 16, jobs = 5000;
  app.add_option("--clients", clients, "concurrent clients (threads, one channel each)");
  app.add_option("--jobs", jobs, "jobs in all");
  CLI11_PARSE(app, argc, argv);
  ft::log::Configure({ft::log::Level::kWarn});

  const std::string dir = (std::filesystem::temp_directory_path() / "ft-submit-bench").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/job/model");
  std::ofstream(dir + "/job/model/config.json") << ft::HfConfigJson(*ft::PresetModelConfig("tiny-llama"));
  std::ofstream(dir + "/job/d.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";  // ftd refuses a missing data file
  std::filesystem::create_directories(dir + "/ftd");  // ftd's data dir apart from the job's files
  auto store = ft::Store::Open(dir + "/ftd/ftd.sqlite");
  if (!store.ok()) {
    std::fprintf(stderr, "submit_bench: %s\n", store.status().ToString().c_str());
    return 1;
  }
  ft::SystemClock clock;
  ft::DaemonOptions options;
  options.data_dir = dir + "/ftd";
  ft::Daemon daemon(std::move(*store), &clock, options);
  auto jobs_service = ft::MakeJobsService(&daemon, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(jobs_service.get());
  auto server = builder.BuildAndStart();

  // Every job an output.dir of its own: ftd refuses one another job writes.
  auto spec = [](int i) {
    return "model: {path: model}\ndata: {train: d.jsonl, format: tokens, seq_len: 512}\n"
           "train: {max_steps: 10, global_batch_size: 8}\noutput: {dir: out/" +
           std::to_string(i) + "}\n";
  };
  std::atomic<int> next{0}, acked{0}, failed{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", c);  // a channel (connection) per client
      auto stub = pb::Jobs::NewStub(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                                              grpc::InsecureChannelCredentials(), args));
      for (int i = next++; i < jobs; i = next++) {
        pb::SubmitRequest req;
        req.set_spec_yaml(spec(i));
        req.set_spec_dir(dir + "/job");
        req.set_client_request_id("bench-" + std::to_string(i));
        pb::SubmitReply reply;
        grpc::ClientContext ctx;
        grpc::Status s = stub->Submit(&ctx, req, &reply);
        (s.ok() && !reply.duplicate() ? acked : failed)++;
        if (!s.ok() && failed == 1) std::fprintf(stderr, "submit_bench: %s\n", s.error_message().c_str());
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto listed = daemon.store().ListJobs({}, 0);
  const size_t stored = listed.ok() ? listed->size() : 0;
  std::printf(
      "%d clients submitted %d jobs in %.2f s: %.0f jobs/s acknowledged, each durable before its reply "
      "(aim: >= 500 jobs/s)\n",
      clients, acked.load(), seconds, acked / seconds);
  std::printf("failed %d; jobs in the store %zu (must equal acknowledged)\n", failed.load(), stored);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return failed == 0 && stored == static_cast<size_t>(acked.load()) ? 0 : 1;
}
