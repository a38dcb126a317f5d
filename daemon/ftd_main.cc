// ftd: the control daemon. Keeps every job, attempt, worker, checkpoint and
// event in SQLite; serves the Jobs API and worker sessions over gRPC; runs the
// scheduler tick (leases, slot ends, placements).
//
//   ftd --listen 127.0.0.1:7070 --data-dir ~/.local/share/ftune [--client-token T] [--worker-token W]
//       [--http 127.0.0.1:7071] [--web-dir DIR] [--http-view-token V] [--http-allowed-host NAME]...
//
// One ftd per data dir: it holds an exclusive lock on DATA_DIR/ftd.lock for
// its life; a second one exits 2 naming the holder's pid. A client token
// without a worker token exits 2 (anyone reaching --listen could take jobs as
// a worker) unless --allow-tokenless-workers and --listen is loopback. A
// database that PRAGMA quick_check finds damaged stops it (exit 1).
//
// Prints "ftd: listening on HOST:PORT" on stdout once serving (port 0 picks a
// free one), then "ftd: dashboard at http://HOST:PORT/" for the HTTP side
// (dashboard, JSON API, SSE, /metrics; --http "" turns it off), https:// when
// --tls-cert/--tls-key are given: both sides serve the same certificate. The dashboard's
// files come from --web-dir, else the source tree's web/ (FT_WEB_DIR, fixed at
// build time) when it exists, else <exe dir>/../share/ftune/web.
// SIGTERM/SIGINT shut it down cleanly; kill -9 loses nothing acknowledged.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/file.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/ids.h"
#include "common/logging.h"
#include "common/money.h"
#include "daemon/daemon.h"
#include "daemon/grpc_service.h"
#include "daemon/http_api.h"
#include "daemon/http_server.h"
#include "daemon/tokens_file.h"
#include "daemon/webhook_sender.h"
#include "proto/credentials.h"

namespace {
std::atomic<bool> g_stop{false};
extern "C" void OnSignal(int) { g_stop = true; }
std::atomic<bool> g_reload{false};
extern "C" void OnHangup(int) { g_reload = true; }

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
// ftd's command line.
struct Flags {
  std::string listen = "127.0.0.1:7070", data_dir, db, log_level = "info";
  ft::AuthOptions auth;
  ft::DaemonOptions options;
  int64_t tick_ms = 200;
  bool log_json = false;
  std::string http = "127.0.0.1:7071", web_dir, http_view_token;
  std::vector<std::string> http_allowed_hosts;
  std::vector<std::string> pool_prices;  // --pool-price POOL=PRICE, each
  std::string tokens_file;               // --tokens-file (read at start and on SIGHUP)
  ft::HttpServerOptions http_limits;     // its deadlines and connection caps (the --http-* flags)
  bool allow_tokenless_workers = false;
  ft::ServerTls tls;
  ft::WebhookSenderOptions webhooks;
};

// Webhooks (daemon/webhook_sender.h) and stalls (daemon_stalls.cc).
void AddWebhookFlags(CLI::App& app, Flags& f) {
  app.add_option("--stall-factor", f.options.stall_factor,
                 "a running job with no step for this many times its measured step interval is `stalled` "
                 "(default 10)");
  app.add_option("--stall-min-ms", f.options.stall_min_ms,
                 "and at least this long (default 300000: checkpoints and evaluations are not stalls)");
  app.add_option("--public-url", f.webhooks.dashboard_url,
                 "the dashboard's address as people reach it: webhook bodies link each job's page there");
  app.add_option("--webhook-timeout-ms", f.webhooks.timeout_ms,
                 "one webhook request, from resolving its host to the answer (default 10000)");
  app.add_option("--webhook-backoff-ms", f.webhooks.backoff_ms,
                 "a failed delivery is retried after this, doubled per failure (default 1000)");
  app.add_option("--webhook-max-backoff-ms", f.webhooks.max_backoff_ms, "up to this (default 600000)");
  app.add_option("--webhook-max-attempts", f.webhooks.max_attempts,
                 "a delivery is given up after this many attempts: an event and a counter (default 15)");
  app.add_option("--webhook-poll-ms", f.webhooks.poll_ms,
                 "how often new events are read for webhooks (default 500)");
  app.add_option(
      "--webhook-ca", f.webhooks.ca_file,
      "PEM CA bundle https:// webhook receivers are checked against (default: the system's CA store)");
}

void AddFlags(CLI::App& app, Flags& f) {
  f.auth.client_token = std::getenv("FTUNE_TOKEN") ? std::getenv("FTUNE_TOKEN") : "";
  f.auth.worker_token = std::getenv("FTUNE_WORKER_TOKEN") ? std::getenv("FTUNE_WORKER_TOKEN") : "";
  app.add_option("--listen", f.listen, "address to serve gRPC on (port 0 = any free port)");
  app.add_option("--data-dir", f.data_dir, "directory for the database and job logs")->required();
  app.add_option("--db", f.db, "SQLite database path (default: DATA_DIR/ftd.sqlite)");
  app.add_option("--client-token", f.auth.client_token, "bearer token clients must send (env FTUNE_TOKEN)");
  app.add_option("--worker-token", f.auth.worker_token,
                 "bearer token workers must send (env FTUNE_WORKER_TOKEN)");
  app.add_option("--lease-ms", f.options.lease_ms, "a worker silent this long is lost and its job requeued");
  app.add_option("--heartbeat-ms", f.options.heartbeat_ms, "heartbeat period workers are told to use");
  app.add_option("--min-slot-ms", f.options.min_slot_ms, "no start on a worker whose slot ends sooner");
  app.add_option("--checkpoint-margin-ms", f.options.checkpoint_margin_ms, "slot-end safety margin");
  app.add_option("--requeue-backoff-ms", f.options.requeue_backoff_ms,
                 "delay before a preempted job is placed again");
  app.add_option("--tick-ms", f.tick_ms, "scheduler tick period");
  app.add_option("--fair-share-half-life-ms", f.options.fair_share_half_life_ms,
                 "a team's usage counts half after this long (fair share between teams)");
  app.add_option("--min-runtime-ms", f.options.min_runtime_ms,
                 "a job running for less than this is never preempted for another");
  app.add_option("--tokens-file", f.tokens_file,
                 "users as token,user,team,role lines (chmod 600), read at start and again on SIGHUP "
                 "(docs/OPERATIONS.md, Users, teams and roles)");
  app.add_option("--pool-price", f.pool_prices,
                 "POOL=PRICE: what a device-hour in that pool costs, over its workers' own --price "
                 "(repeatable; jobs', teams' and pools' costs are device-seconds at these prices)");
  app.add_option("--tls-cert", f.tls.cert_file,
                 "serve gRPC and the dashboard (HTTPS) over TLS with this PEM certificate chain");
  app.add_option("--tls-key", f.tls.key_file, "the PEM private key of --tls-cert");
  app.add_option("--allowed-root", f.options.allowed_roots,
                 "directories job paths (model, data, adapter init, output) must lie under; repeatable "
                 "(default: anywhere)");
  app.add_option("--log-level", f.log_level, "debug | info | warn | error");
  app.add_flag("--log-json", f.log_json, "log one JSON object per line");
  app.add_option("--http", f.http,
                 "address for the dashboard, JSON API and /metrics (port 0 = any free port; \"\" = off)");
  app.add_option("--web-dir", f.web_dir,
                 "dashboard files (default: the source tree's web/, else <exe dir>/../share/ftune/web)");
  app.add_option(
      "--http-view-token", f.http_view_token,
      "token needed to view the dashboard and read /api (default: the client token when one is set, else "
      "open)");
  app.add_option(
      "--http-allowed-host", f.http_allowed_hosts,
      "a host name the dashboard and /api answer to besides IP addresses, localhost and the --http "
      "host (DNS-rebinding guard); repeatable");
  app.add_option(
      "--http-header-timeout-ms", f.http_limits.header_timeout_ms,
      "an HTTP request's header and body must arrive within this (default 10000; slower clients are closed)");
  app.add_option("--http-idle-timeout-ms", f.http_limits.idle_timeout_ms,
                 "a keep-alive HTTP connection idle this long between requests is closed (default 60000)");
  app.add_option("--http-max-connections", f.http_limits.max_connections,
                 "open HTTP connections, event streams included (default 512; past it: 503, but /healthz and "
                 "/ready still answer)");
  app.add_option("--http-max-connections-per-peer", f.http_limits.max_connections_per_peer,
                 "of them from one client address, an IPv6 /64 (default 64; 0 = no cap): raise it behind a "
                 "reverse proxy");
  app.add_flag("--allow-tokenless-workers", f.allow_tokenless_workers,
               "with --client-token but no --worker-token, accept workers without a token (only when "
               "--listen is a loopback address)");
}

// The host part of HOST:PORT ("[::1]:7070" -> "::1").
std::string HostOf(const std::string& address) {
  if (!address.empty() && address[0] == '[') return address.substr(1, address.find(']') - 1);
  return address.substr(0, address.rfind(':'));
}

bool IsLoopback(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "::1" || host == "localhost";
}

// A client token guards the Jobs API; without a worker token any process that
// reaches --listen could register as a worker and be handed job specs.
// 0, or 2 after saying how to fix it.
int CheckWorkerToken(const Flags& f) {
  if (f.auth.client_token.empty() || !f.auth.worker_token.empty()) return 0;
  if (f.allow_tokenless_workers && IsLoopback(HostOf(f.listen))) {
    FT_LOG(WARN) << "ftd: --allow-tokenless-workers: any local process may register as a worker";
    return 0;
  }
  std::fprintf(stderr,
               "ftd: --client-token is set but --worker-token is not: any process that reaches %s could "
               "register as a worker and be handed job specs. Pass --worker-token W (env FTUNE_WORKER_TOKEN) "
               "and start each ft-worker with --token W%s\n",
               f.listen.c_str(),
               f.allow_tokenless_workers
                   ? " (--allow-tokenless-workers is only accepted with a loopback --listen)"
                   : ", or, with a loopback --listen, pass --allow-tokenless-workers");
  return 2;
}

// Takes DATA_DIR/ftd.lock (flock, exclusive) for the life of the process and
// writes this pid into it: one ftd per data dir. 0, or 2 naming the holder.
int LockDataDir(const std::string& data_dir) {
  const std::string path = (std::filesystem::path(data_dir) / "ftd.lock").string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "ftd: --data-dir %s: cannot open %s: %s\n", data_dir.c_str(), path.c_str(),
                 std::strerror(errno));
    return 2;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    const ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : "unknown";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    std::fprintf(stderr,
                 "ftd: --data-dir %s is in use by another ftd (pid %s holds %s): one ftd per data dir; stop "
                 "that one or pass another --data-dir\n",
                 data_dir.c_str(), holder.c_str(), path.c_str());
    close(fd);
    return 2;
  }
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    FT_LOG(WARN) << "ftd: cannot write the pid into " << path << ": " << std::strerror(errno);
  }
  return 0;  // fd stays open (and locked) until the process exits
}

// SIGHUP: the tokens file again (its users replace the old ones at once; a bad file changes nothing).
void ReloadTokensFile(const std::string& path, ft::TokensFile* file) {
  if (path.empty()) {
    FT_LOG(INFO) << "ftd: SIGHUP: no --tokens-file to reload";
    return;
  }
  auto users = file->Load(path);
  if (users.ok()) {
    FT_LOG(INFO) << "ftd: SIGHUP: " << *users << " users from " << path;
  } else {
    FT_LOG(ERROR) << "ftd: SIGHUP: the tokens file was not reloaded, the previous users stay: "
                  << users.status().message();
  }
}

// --pool-price POOL=PRICE flags into `out`; false (after saying which and how to fix it) for a bad one.
bool ParsePoolPrices(const std::vector<std::string>& flags, std::map<std::string, double>* out) {
  for (const std::string& flag : flags) {
    const size_t eq = flag.find('=');
    const std::string pool = flag.substr(0, eq);
    char* end = nullptr;
    const double price = eq == std::string::npos ? -1 : std::strtod(flag.c_str() + eq + 1, &end);
    ft::Status bad = ft::CheckPoolName(pool, "--pool-price " + flag);
    if (bad.ok() && (end == nullptr || end == flag.c_str() + eq + 1 || *end != '\0')) {
      bad = ft::Status::InvalidArgument("--pool-price '" + flag +
                                        "': expected POOL=PRICE, e.g. spot-a100=1.29");
    }
    if (bad.ok()) bad = ft::CheckPrice(price, "--pool-price " + flag);
    if (!bad.ok()) {
      std::fprintf(stderr, "ftd: %s\n", bad.message().c_str());
      return false;
    }
    (*out)[pool] = price;
  }
  return true;
}

// --allowed-root directories made canonical; false (after saying which) when one is not a directory.
bool CanonicalizeRoots(std::vector<std::string>* roots) {
  for (std::string& root : *roots) {
    std::error_code ec;
    const std::filesystem::path canonical = std::filesystem::canonical(root, ec);
    if (ec || !std::filesystem::is_directory(canonical)) {
      std::fprintf(stderr, "ftd: --allowed-root '%s': not an existing directory%s\n", root.c_str(),
                   ec ? (" (" + ec.message() + ")").c_str() : "");
      return false;
    }
    root = canonical.string();
  }
  return true;
}

// The gRPC side: the Jobs and Workers services and the server that serves them.
struct GrpcSide {
  std::unique_ptr<ftune::v1::Jobs::CallbackService> jobs;
  std::unique_ptr<ftune::v1::Workers::CallbackService> workers;
  std::unique_ptr<grpc::Server> server;
};

// Starts serving gRPC and prints "ftd: listening on HOST:PORT"; 0, or the exit code after saying why.
int StartGrpc(const Flags& f, ft::Daemon* daemon, GrpcSide* out) {
  ft::AuthOptions auth = f.auth;
  auth.view_token = f.http_view_token;  // a viewer of every team on gRPC too
  out->jobs = ft::MakeJobsService(daemon, auth);
  out->workers = ft::MakeWorkersService(daemon, f.auth);
  grpc::ServerBuilder builder;
  int port = 0;
  auto credentials = ft::MakeServerCredentials(f.tls);
  if (!credentials.ok()) {
    std::fprintf(stderr, "ftd: %s\n", credentials.status().ToString().c_str());
    return 2;
  }
  builder.AddListeningPort(f.listen, *credentials, &port);
  builder.RegisterService(out->jobs.get());
  builder.RegisterService(out->workers.get());
  out->server = builder.BuildAndStart();
  if (!out->server || port == 0) {
    std::fprintf(stderr, "ftd: cannot listen on %s\n", f.listen.c_str());
    return 1;
  }
  const std::string host = f.listen.substr(0, f.listen.rfind(':'));
  std::printf("ftd: listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  return 0;
}

// The HTTP side: the dashboard, JSON API, SSE and /metrics.
struct HttpSide {
  std::unique_ptr<ft::HttpApi> api;
  std::unique_ptr<ft::HttpServer> server;
};

// Starts serving HTTP(S) unless --http is "" and prints "ftd: dashboard at URL"; 0, or the exit code.
int StartHttp(const Flags& f, const char* argv0, ft::Daemon* daemon, HttpSide* out) {
  if (f.http.empty()) return 0;
  const std::string web_dir = FindWebDir(f.web_dir, argv0);
  if (!f.web_dir.empty() && !std::filesystem::is_directory(f.web_dir)) {
    std::fprintf(stderr, "ftd: --web-dir %s is not a directory\n", f.web_dir.c_str());
    return 2;
  }
  if (web_dir.empty()) FT_LOG(WARN) << "ftd: no dashboard files found (pass --web-dir); the API still serves";
  std::vector<std::string> hosts = f.http_allowed_hosts;
  hosts.push_back(HostOf(f.http));
  out->api = std::make_unique<ft::HttpApi>(
      daemon, ft::HttpApiOptions{f.auth.client_token, f.http_view_token, web_dir, !f.tls.cert_file.empty(),
                                 hosts, f.auth.tokens_file});
  ft::HttpServerOptions http_options = f.http_limits;
  http_options.address = f.http;
  http_options.tls_cert_file = f.tls.cert_file;
  http_options.tls_key_file = f.tls.key_file;
  auto started = ft::HttpServer::Start(daemon, out->api.get(), http_options);
  if (!started.ok()) {
    std::fprintf(stderr, "ftd: %s\n", started.status().ToString().c_str());
    return 1;
  }
  out->server = std::move(*started);
  const std::string& h = out->server->host();
  const std::string url_host = h.find(':') == std::string::npos ? h : "[" + h + "]";  // IPv6
  std::printf("ftd: dashboard at %s://%s:%d/\n", out->server->tls() ? "https" : "http", url_host.c_str(),
              out->server->port());
  std::fflush(stdout);
  auto users = daemon->store().HasUsers();
  // Users close an ftd without tokens (docs/OPERATIONS.md).
  const bool has_users = (users.ok() && *users) || (f.auth.tokens_file && !f.auth.tokens_file->empty());
  if (!IsLoopback(h) && f.http_view_token.empty() && f.auth.client_token.empty() && !has_users) {
    FT_LOG(WARN) << "ftd: the dashboard on " << h
                 << " has no view token or client token: anyone who can reach this address can read jobs, "
                    "logs and metrics and cancel jobs (pass --client-token, and --http-view-token for "
                    "read-only viewers; see docs/OPERATIONS.md)";
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ftd: ftune's control daemon"};
  Flags f;
  AddFlags(app, f);
  AddWebhookFlags(app, f);
  CLI11_PARSE(app, argc, argv);
  auto level = ft::log::ParseLevel(f.log_level);
  if (!level.ok()) {
    std::fprintf(stderr, "ftd: %s\n", level.status().ToString().c_str());
    return 2;
  }
  ft::log::Configure({*level, f.log_json, "ftd"});
  // A file-size limit fails the write (EFBIG: the store turns sticky-failed and
  // /ready says 503, nothing acknowledged is lost) instead of killing ftd.
  std::signal(SIGXFSZ, SIG_IGN);
  // Before anything announces that ftd listens: a SIGTERM that comes while it still starts (the
  // webhook sender loads the system's CAs) ends it cleanly once the loop begins, instead of killing it.
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGHUP, OnHangup);
  if (int rc = CheckWorkerToken(f); rc != 0) return rc;
  std::error_code mkdir_error;
  std::filesystem::create_directories(f.data_dir, mkdir_error);
  if (int rc = LockDataDir(f.data_dir); rc != 0) return rc;
  f.options.data_dir = f.data_dir;
  f.options.tick_ms = f.tick_ms;  // a tick later than this (by a stall of ftd itself) extends every lease
  if (f.db.empty()) f.db = (std::filesystem::path(f.data_dir) / "ftd.sqlite").string();
  auto store = ft::Store::Open(f.db);
  if (!store.ok()) {
    std::fprintf(stderr, "ftd: %s\n", store.status().ToString().c_str());
    return 1;
  }
  if (!CanonicalizeRoots(&f.options.allowed_roots)) return 2;
  if (!ParsePoolPrices(f.pool_prices, &f.options.pool_prices)) return 2;
  ft::TokensFile tokens_file;
  if (!f.tokens_file.empty()) {
    auto users = tokens_file.Load(f.tokens_file);
    if (!users.ok()) {
      std::fprintf(stderr, "ftd: --tokens-file: %s\n", users.status().message().c_str());
      return 2;
    }
    FT_LOG(INFO) << "ftd: " << *users << " users from " << f.tokens_file;
    f.auth.tokens_file = &tokens_file;
  }
  ft::SystemClock clock;
  ft::Daemon daemon(std::move(*store), &clock, f.options);
  if (!daemon.startup_status().ok()) {
    std::fprintf(stderr, "ftd: cannot load state from %s: %s\n", f.db.c_str(),
                 daemon.startup_status().ToString().c_str());
    return 1;
  }
  GrpcSide grpc_side;
  if (int rc = StartGrpc(f, &daemon, &grpc_side); rc != 0) return rc;
  HttpSide http_side;
  if (int rc = StartHttp(f, argv[0], &daemon, &http_side); rc != 0) return rc;
  ft::WebhookSender webhooks(
      &daemon.store(), &clock, f.webhooks,
      [&daemon](const std::string& job, const std::string& kind, const std::string& message, int64_t step) {
        daemon.RecordEvent(job, kind, message, step);
      },
      &daemon.webhook_counters());
  if (ft::Status s = webhooks.Start(); !s.ok()) {
    std::fprintf(stderr, "ftd: %s\n", s.ToString().c_str());
    return 2;
  }
  // The daemon's periodic duties live in one visible tick.
  while (!g_stop) {
    const auto start = std::chrono::steady_clock::now();
    if (g_reload.exchange(false)) ReloadTokensFile(f.tokens_file, &tokens_file);
    daemon.Tick();
    std::this_thread::sleep_until(start + std::chrono::milliseconds(f.tick_ms));
  }
  FT_LOG(INFO) << "ftd: shutting down";
  webhooks.Stop();  // deliveries in flight are made again after a restart
  if (http_side.server) http_side.server->Stop();
  grpc_side.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
