// ftd: the control daemon. Keeps every job, attempt, worker, checkpoint and
// event in SQLite; serves the Jobs API and worker sessions over gRPC; runs the
// scheduler tick (leases, slot ends, placements).
//
//   ftd --listen 127.0.0.1:7070 --data-dir ~/.local/share/ftune [--client-token T] [--worker-token W]
//
// Prints "ftd: listening on HOST:PORT" on stdout once serving (port 0 picks a
// free one). SIGTERM/SIGINT shut it down cleanly; kill -9 loses nothing
// acknowledged.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "common/logging.h"
#include "daemon/daemon.h"
#include "daemon/grpc_service.h"

namespace {
std::atomic<bool> g_stop{false};
extern "C" void OnSignal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ftd: ftune's control daemon"};
  std::string listen = "127.0.0.1:7070", data_dir, db, log_level = "info";
  ft::AuthOptions auth;
  ft::DaemonOptions options;
  int64_t tick_ms = 200;
  bool log_json = false;
  auth.client_token = std::getenv("FTUNE_TOKEN") ? std::getenv("FTUNE_TOKEN") : "";
  auth.worker_token = std::getenv("FTUNE_WORKER_TOKEN") ? std::getenv("FTUNE_WORKER_TOKEN") : "";
  app.add_option("--listen", listen, "address to serve gRPC on (port 0 = any free port)");
  app.add_option("--data-dir", data_dir, "directory for the database and job logs")->required();
  app.add_option("--db", db, "SQLite database path (default: DATA_DIR/ftd.sqlite)");
  app.add_option("--client-token", auth.client_token, "bearer token clients must send (env FTUNE_TOKEN)");
  app.add_option("--worker-token", auth.worker_token,
                 "bearer token workers must send (env FTUNE_WORKER_TOKEN)");
  app.add_option("--lease-ms", options.lease_ms, "a worker silent this long is lost and its job requeued");
  app.add_option("--heartbeat-ms", options.heartbeat_ms, "heartbeat period workers are told to use");
  app.add_option("--min-slot-ms", options.min_slot_ms, "no start on a worker whose slot ends sooner");
  app.add_option("--checkpoint-margin-ms", options.checkpoint_margin_ms, "slot-end safety margin");
  app.add_option("--requeue-backoff-ms", options.requeue_backoff_ms,
                 "delay before a preempted job is placed again");
  app.add_option("--tick-ms", tick_ms, "scheduler tick period");
  app.add_option("--log-level", log_level, "debug | info | warn | error");
  app.add_flag("--log-json", log_json, "log one JSON object per line");
  CLI11_PARSE(app, argc, argv);
  auto level = ft::log::ParseLevel(log_level);
  if (!level.ok()) {
    std::fprintf(stderr, "ftd: %s\n", level.status().ToString().c_str());
    return 2;
  }
  ft::log::Configure({*level, log_json, "ftd"});
  std::filesystem::create_directories(data_dir);
  options.data_dir = data_dir;
  if (db.empty()) db = (std::filesystem::path(data_dir) / "ftd.sqlite").string();
  auto store = ft::Store::Open(db);
  if (!store.ok()) {
    std::fprintf(stderr, "ftd: %s\n", store.status().ToString().c_str());
    return 1;
  }
  ft::SystemClock clock;
  ft::Daemon daemon(std::move(*store), &clock, options);
  auto jobs = ft::MakeJobsService(&daemon, auth);
  auto workers = ft::MakeWorkersService(&daemon, auth);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(jobs.get());
  builder.RegisterService(workers.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "ftd: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  const std::string host = listen.substr(0, listen.rfind(':'));
  std::printf("ftd: listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  // The daemon's periodic duties live in one visible tick.
  while (!g_stop) {
    const auto start = std::chrono::steady_clock::now();
    daemon.Tick();
    std::this_thread::sleep_until(start + std::chrono::milliseconds(tick_ms));
  }
  FT_LOG(INFO) << "ftd: shutting down";
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
