// ftd: the control daemon. Keeps every job, attempt, worker, checkpoint and
// event in SQLite; serves the Jobs API and worker sessions over gRPC; runs the
// scheduler tick (leases, slot ends, placements).
//
//   ftd --listen 127.0.0.1:7070 --data-dir ~/.local/share/ftune [--client-token T] [--worker-token W]
//       [--http 127.0.0.1:7071] [--web-dir DIR] [--http-view-token V]
//
// Prints "ftd: listening on HOST:PORT" on stdout once serving (port 0 picks a
// free one), then "ftd: dashboard at http://HOST:PORT/" for the HTTP side
// (dashboard, JSON API, SSE, /metrics; --http "" turns it off), https:// when
// --tls-cert/--tls-key are given: both sides serve the same certificate. The dashboard's
// files come from --web-dir, else the source tree's web/ (FT_WEB_DIR, fixed at
// build time) when it exists, else <exe dir>/../share/ftune/web.
// SIGTERM/SIGINT shut it down cleanly; kill -9 loses nothing acknowledged.
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
#include "daemon/http_api.h"
#include "daemon/http_server.h"
#include "proto/credentials.h"

namespace {
std::atomic<bool> g_stop{false};
extern "C" void OnSignal(int) { g_stop = true; }

// The dashboard's directory: --web-dir, else the source tree's, else the installed one ("" = none).
std::string FindWebDir(const std::string& flag, const char* argv0) {
  namespace fs = std::filesystem;
  if (!flag.empty()) return flag;
  std::error_code ec;
  if (fs::is_directory(FT_WEB_DIR, ec)) return FT_WEB_DIR;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) exe = fs::weakly_canonical(fs::path(argv0), ec);
  exe = exe.parent_path();
  const fs::path installed = exe / ".." / "share" / "ftune" / "web";
  if (fs::is_directory(installed, ec)) return fs::weakly_canonical(installed, ec).string();
  return "";
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ftd: ftune's control daemon"};
  std::string listen = "127.0.0.1:7070", data_dir, db, log_level = "info";
  ft::AuthOptions auth;
  ft::DaemonOptions options;
  int64_t tick_ms = 200;
  bool log_json = false;
  std::string http = "127.0.0.1:7071", web_dir_flag, http_view_token;
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
  ft::ServerTls tls;
  app.add_option("--tls-cert", tls.cert_file,
                 "serve gRPC and the dashboard (HTTPS) over TLS with this PEM certificate chain");
  app.add_option("--tls-key", tls.key_file, "the PEM private key of --tls-cert");
  app.add_option("--allowed-root", options.allowed_roots,
                 "directories job paths (model, data, adapter init, output) must lie under; repeatable "
                 "(default: anywhere)");
  app.add_option("--log-level", log_level, "debug | info | warn | error");
  app.add_flag("--log-json", log_json, "log one JSON object per line");
  app.add_option("--http", http,
                 "address for the dashboard, JSON API and /metrics (port 0 = any free port; \"\" = off)");
  app.add_option("--web-dir", web_dir_flag,
                 "dashboard files (default: the source tree's web/, else <exe dir>/../share/ftune/web)");
  app.add_option(
      "--http-view-token", http_view_token,
      "token needed to view the dashboard and read /api (default: open; actions need --client-token)");
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
  for (std::string& root : options.allowed_roots) {
    std::error_code ec;
    const std::filesystem::path canonical = std::filesystem::canonical(root, ec);
    if (ec || !std::filesystem::is_directory(canonical)) {
      std::fprintf(stderr, "ftd: --allowed-root '%s': not an existing directory%s\n", root.c_str(),
                   ec ? (" (" + ec.message() + ")").c_str() : "");
      return 2;
    }
    root = canonical.string();
  }
  ft::Daemon daemon(std::move(*store), &clock, options);
  if (!daemon.startup_status().ok()) {
    std::fprintf(stderr, "ftd: cannot load state from %s: %s\n", db.c_str(),
                 daemon.startup_status().ToString().c_str());
    return 1;
  }
  auto jobs = ft::MakeJobsService(&daemon, auth);
  auto workers = ft::MakeWorkersService(&daemon, auth);
  grpc::ServerBuilder builder;
  int port = 0;
  auto credentials = ft::MakeServerCredentials(tls);
  if (!credentials.ok()) {
    std::fprintf(stderr, "ftd: %s\n", credentials.status().ToString().c_str());
    return 2;
  }
  builder.AddListeningPort(listen, *credentials, &port);
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
  std::unique_ptr<ft::HttpApi> http_api;
  std::unique_ptr<ft::HttpServer> http_server;
  if (!http.empty()) {
    const std::string web_dir = FindWebDir(web_dir_flag, argv[0]);
    if (!web_dir_flag.empty() && !std::filesystem::is_directory(web_dir_flag)) {
      std::fprintf(stderr, "ftd: --web-dir %s is not a directory\n", web_dir_flag.c_str());
      return 2;
    }
    if (web_dir.empty())
      FT_LOG(WARN) << "ftd: no dashboard files found (pass --web-dir); the API still serves";
    http_api = std::make_unique<ft::HttpApi>(
        &daemon, ft::HttpApiOptions{auth.client_token, http_view_token, web_dir, !tls.cert_file.empty()});
    ft::HttpServerOptions http_options;
    http_options.address = http;
    http_options.tls_cert_file = tls.cert_file;
    http_options.tls_key_file = tls.key_file;
    auto started = ft::HttpServer::Start(&daemon, http_api.get(), http_options);
    if (!started.ok()) {
      std::fprintf(stderr, "ftd: %s\n", started.status().ToString().c_str());
      return 1;
    }
    http_server = std::move(*started);
    const std::string& h = http_server->host();
    const std::string url_host = h.find(':') == std::string::npos ? h : "[" + h + "]";  // IPv6
    std::printf("ftd: dashboard at %s://%s:%d/\n", http_server->tls() ? "https" : "http", url_host.c_str(),
                http_server->port());
    std::fflush(stdout);
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  // The daemon's periodic duties live in one visible tick.
  while (!g_stop) {
    const auto start = std::chrono::steady_clock::now();
    daemon.Tick();
    std::this_thread::sleep_until(start + std::chrono::milliseconds(tick_ms));
  }
  FT_LOG(INFO) << "ftd: shutting down";
  if (http_server) http_server->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
