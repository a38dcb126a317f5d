// ft-worker: the node agent. Registers this node's devices with ftd, runs
// ft-train for the attempts the daemon starts here, relays their progress,
// and stops them cleanly when the node is going away.
//
//   ft-worker --daemon HOST:PORT [--token T] [--id ID] [--ft-train PATH] [--work-dir DIR]
//             [--cpu-memory 8GiB] [--cpu-devices N] [--slot-end T|+20s|+5m] [--aws-metadata-url URL]
//             [--gcp-metadata-url URL] [--notice-poll-ms N] [--stop-grace S]
//             [--address ADDR] [--rendezvous-ports FIRST-LAST] [--pool NAME] [--price USD]
//
// Multi-rank jobs: ftd places a job's ranks on the devices of one worker or
// of several, and hands each rank the rendezvous its rank 0 serves on a port
// of that worker's --rendezvous-ports (default 29400-29499); ranks reach each
// other at each worker's --address (default: the host name).
//
// Stops on SIGTERM, SIGUSR1, SIGINT or a cloud preemption notice: every
// trainer is told to checkpoint and stop, their exits are reported, the
// session is flushed, and ft-worker exits 0. Near the slot end (--slot-end or
// SLURM_JOB_END_TIME) trainers are stopped the same way but ft-worker keeps
// running, starting nothing new, until it is killed.
//
// Exit codes: 0 after a clean stop; 1 on a fatal error; 2 on bad flags.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/money.h"
#include "engine/job/planner.h"
#include "proto/credentials.h"
#include "worker/notices.h"
#include "worker/session.h"
#include "worker/slot_end.h"
#include "worker/worker.h"

namespace {

namespace fs = std::filesystem;
using ft::worker::Notice;

constexpr int kExitClean = 0;
constexpr int kExitFatal = 1;
constexpr int kExitBadFlags = 2;
constexpr auto kStopSlack = std::chrono::seconds(15);  // past the stop deadline before SIGKILL
constexpr auto kFlushTimeout = std::chrono::seconds(10);
constexpr auto kTick = std::chrono::milliseconds(250);
constexpr double kMaxStopDeadlineS = 3600;  // a notice's far-away action time is not a reason to wait longer

struct Flags {
  std::string daemon;
  std::string token;
  std::string tls_ca;
  std::string id;
  std::string ft_train;
  std::string work_dir;
  std::string cpu_memory;
  int cpu_devices = 1;
  std::string address;
  std::string rendezvous_ports = "29400-29499";
  std::string pool = std::string(ft::kDefaultPool);
  double price = 0;
  std::string slot_end;
  std::string aws_url;
  std::string gcp_url;
  int64_t notice_poll_ms = 1000;
  double stop_grace = 30;
  std::string log_level = "info";
  bool log_json = false;
};

// The first reason to stop, posted from any thread.
class StopRequest {
 public:
  void Post(const std::string& reason, double deadline_s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (posted_) {
      FT_LOG(WARN) << reason << " while already stopping (" << reason_ << ")";
      return;
    }
    posted_ = true;
    reason_ = reason;
    deadline_s_ = deadline_s;
    cv_.notify_all();
  }
  // True when a stop was posted (within `wait`); then *reason and *deadline_s say what.
  bool Wait(std::chrono::milliseconds wait, std::string* reason, double* deadline_s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, wait, [this] { return posted_; })) return false;
    *reason = reason_;
    *deadline_s = deadline_s_;
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool posted_ = false;
  std::string reason_;
  double deadline_s_ = 0;
};

// A stop signal caught by a thread that does not block it: threads that
// libraries start before main() (OpenBLAS's pool) have every signal unblocked,
// and without a handler the default action would end ft-worker on the spot,
// with no checkpoint. The handler records it; SignalWatcher picks it up.
std::atomic<int> g_caught_signal{0};
extern "C" void OnStopSignal(int signo) { g_caught_signal.store(signo); }

// The signals that stop the worker; blocked in every thread we start, taken by SignalWatcher.
sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGUSR1, SIGINT}) sigaddset(&set, s);
  return set;
}

// Turns SIGTERM/SIGUSR1/SIGINT into stop requests.
class SignalWatcher {
 public:
  SignalWatcher(StopRequest* stop, double grace_s) : stop_(stop), grace_s_(grace_s) {}
  ~SignalWatcher() {
    quit_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }

 private:
  void Loop() {
    const sigset_t set = StopSignals();
    while (!quit_) {
      timespec tick{0, 200'000'000};
      int signo = sigtimedwait(&set, nullptr, &tick);
      if (signo <= 0) signo = g_caught_signal.exchange(0);
      if (signo == SIGTERM) stop_->Post("SIGTERM", grace_s_);
      if (signo == SIGUSR1) stop_->Post("SIGUSR1", grace_s_);
      if (signo == SIGINT) stop_->Post("SIGINT", grace_s_);
    }
  }

  StopRequest* stop_;
  double grace_s_;
  std::atomic<bool> quit_{false};
  std::thread thread_;
};

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string DefaultFtTrain() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "ft-train" : (self.parent_path() / "ft-train").string();
}

bool ValidDaemonAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  return address.find_first_not_of("0123456789", colon + 1) == std::string::npos;
}

// Checks flags and fills options. Prints why and returns false on bad flags.
bool MakeOptions(const Flags& f, ft::worker::WorkerOptions* w, ft::worker::SessionOptions* s) {
  auto bad = [](const std::string& why) {
    std::fprintf(stderr, "ft-worker: %s\n", why.c_str());
    return false;
  };
  if (!ValidDaemonAddress(f.daemon)) return bad("--daemon '" + f.daemon + "': expected HOST:PORT");
  if (f.notice_poll_ms <= 0) return bad("--notice-poll-ms must be positive");
  if (f.stop_grace <= 0) return bad("--stop-grace must be positive");
  w->hostname = Hostname();
  w->id = f.id.empty() ? w->hostname : f.id;
  w->version = FT_VERSION;
  w->ft_train = f.ft_train.empty() ? DefaultFtTrain() : f.ft_train;
  if (!f.ft_train.empty() && access(f.ft_train.c_str(), X_OK) != 0) {
    return bad("--ft-train '" + f.ft_train + "': not an executable file");
  }
  w->work_dir = f.work_dir.empty() ? "/tmp/ft-worker-" + w->id : f.work_dir;
  w->stop_grace_s = f.stop_grace;
  if (!f.cpu_memory.empty()) {
    auto bytes = ft::ParseBytes(f.cpu_memory);
    if (!bytes.ok() || *bytes <= 0)
      return bad("--cpu-memory '" + f.cpu_memory + "': expected a size like 8GiB");
    w->devices.cpu_memory_bytes = *bytes;
  }
  if (f.cpu_devices < 1 || f.cpu_devices > 64) return bad("--cpu-devices must be 1..64");
  w->devices.cpu_devices = f.cpu_devices;
  w->address = f.address.empty() ? w->hostname : f.address;
  if (ft::Status pool = ft::CheckPoolName(f.pool, "--pool"); !pool.ok()) return bad(pool.message());
  w->pool = f.pool;
  if (ft::Status price = ft::CheckPrice(f.price, "--price"); !price.ok()) return bad(price.message());
  w->price = f.price;
  {
    int first = 0, last = 0;
    char extra = 0;
    if (std::sscanf(f.rendezvous_ports.c_str(), "%d-%d%c", &first, &last, &extra) != 2 || first < 1 ||
        last > 65535 || last < first) {
      return bad("--rendezvous-ports '" + f.rendezvous_ports + "': expected FIRST-LAST, e.g. 29400-29499");
    }
    w->rendezvous_port_first = first;
    w->rendezvous_port_count = last - first + 1;
  }
  int64_t flag_end = 0;
  if (!f.slot_end.empty()) {
    auto end = ft::worker::ParseSlotEnd(f.slot_end, ft::WallNowMs());
    if (!end.ok()) return bad("--slot-end: " + end.status().message());
    flag_end = *end;
  }
  auto slurm_end = ft::worker::SlotEndFromSlurm(std::getenv("SLURM_JOB_END_TIME"));
  if (!slurm_end.ok()) return bad(slurm_end.status().message());
  w->slot_end_ms = ft::worker::EarlierSlotEnd(flag_end, *slurm_end);
  s->target = f.daemon;
  s->token = f.token;
  auto credentials = ft::MakeChannelCredentials(f.tls_ca);
  if (!credentials.ok()) return bad(credentials.status().message());
  s->credentials = *credentials;
  return true;
}

void AddFlags(CLI::App* app, Flags* f) {
  app->add_option("--daemon", f->daemon, "ftd's worker endpoint, HOST:PORT")->required();
  app->add_option("--token", f->token, "bearer token for the daemon")->envname("FTUNE_WORKER_TOKEN");
  app->add_option("--tls-ca", f->tls_ca,
                  "use TLS, trusting this PEM CA bundle ('system': the system's roots)")
      ->envname("FTUNE_TLS_CA");
  app->add_option("--id", f->id, "worker id (default: the hostname)");
  app->add_option("--ft-train", f->ft_train, "ft-train binary (default: next to ft-worker)");
  app->add_option("--work-dir", f->work_dir, "scratch directory (default: /tmp/ft-worker-<id>)");
  app->add_option("--cpu-memory", f->cpu_memory, "report each CPU device with this much memory, e.g. 8GiB");
  app->add_option("--cpu-devices", f->cpu_devices,
                  "offer the CPU as N devices (one rank of a multi-rank job each; default 1)");
  app->add_option("--address", f->address, "where other ranks reach this node's ranks (default: host name)");
  app->add_option("--rendezvous-ports", f->rendezvous_ports,
                  "ports a rank 0 here may serve its rendezvous on, FIRST-LAST (default 29400-29499)");
  app->add_option("--pool", f->pool,
                  "the pool this node belongs to (instance type, zone, spot or on-demand): ftd keeps the "
                  "mean time between preemptions and goodput per pool (default: default)");
  app->add_option("--price", f->price,
                  "what a device-hour on this node costs (for jobs' and teams' costs; ftd's --pool-price "
                  "for its pool takes precedence; default 0: not priced)");
  app->add_option("--slot-end", f->slot_end, "end of this node's slot: Unix seconds, or +20s / +5m / +2h");
  app->add_option("--aws-metadata-url", f->aws_url, "poll AWS spot interruption notices at this base URL");
  app->add_option("--gcp-metadata-url", f->gcp_url, "poll GCP preemption notices at this base URL");
  app->add_option("--notice-poll-ms", f->notice_poll_ms, "how often to poll for notices");
  app->add_option("--stop-grace", f->stop_grace,
                  "seconds a trainer gets to checkpoint on a signal or notice");
  app->add_option("--log-level", f->log_level, "debug | info | warn | error");
  app->add_flag("--log-json", f->log_json, "log one JSON object per line");
}

std::vector<std::unique_ptr<ft::worker::NoticePoller>> StartPollers(const Flags& f, StopRequest* stop,
                                                                    ft::worker::Worker* worker) {
  std::vector<std::unique_ptr<ft::worker::NoticePoller>> pollers;
  const auto interval = std::chrono::milliseconds(f.notice_poll_ms);
  const auto timeout = std::chrono::milliseconds(std::min<int64_t>(f.notice_poll_ms, 1000));
  auto on_notice = [stop, worker, grace = f.stop_grace](const Notice& n) {
    worker->NoticeReceived(ft::WallNowMs());
    stop->Post(n.reason, n.deadline_s > 0 ? n.deadline_s : grace);
  };
  if (!f.aws_url.empty()) {
    auto aws = std::make_shared<ft::worker::AwsNoticeChecker>(f.aws_url, timeout);
    pollers.push_back(std::make_unique<ft::worker::NoticePoller>(
        "AWS", [aws] { return aws->Check(); }, interval, on_notice));
  }
  if (!f.gcp_url.empty()) {
    pollers.push_back(std::make_unique<ft::worker::NoticePoller>(
        "GCP", [url = f.gcp_url, timeout] { return ft::worker::CheckGcpNotice(url, timeout); }, interval,
        on_notice));
  }
  for (auto& p : pollers) p->Start();
  return pollers;
}

// Stops every trainer, waits for their exits and flushes the reports.
void StopCleanly(ft::worker::Worker* worker, ft::worker::Session* session, const std::string& reason,
                 double deadline_s) {
  deadline_s = std::clamp(deadline_s, 1.0, kMaxStopDeadlineS);
  FT_LOG(WARN) << "stopping (" << reason << "): trainers have " << deadline_s << " s to checkpoint";
  worker->StopAll(reason, deadline_s);
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000)) + kStopSlack;
  if (!worker->WaitIdle(wait)) {
    worker->KillRemaining(reason + ": killed, no checkpoint within " + std::to_string(deadline_s) + " s");
    worker->WaitIdle(std::chrono::seconds(10));
  }
  if (!session->Shutdown(kFlushTimeout)) FT_LOG(WARN) << "some reports could not be delivered to the daemon";
  worker->Reap();
}

int Run(const Flags& flags, const ft::worker::WorkerOptions& options, const ft::worker::SessionOptions& so) {
  ft::worker::Worker worker(options);
  if (ft::Status s = worker.Init(); !s.ok()) {
    FT_LOG(ERROR) << s.ToString();
    return kExitFatal;
  }
  if (access(options.ft_train.c_str(), X_OK) != 0) {
    FT_LOG(ERROR) << options.ft_train << ": ft-train not found (use --ft-train)";
    return kExitFatal;
  }
  StopRequest stop;
  SignalWatcher signals(&stop, flags.stop_grace);
  signals.Start();
  ft::worker::Session session(so, &worker);
  worker.set_sink(&session);
  session.Start();
  auto pollers = StartPollers(flags, &stop, &worker);
  FT_LOG(INFO) << "ft-worker " << options.id << " (" << options.version << ") serving " << so.target
               << (options.slot_end_ms > 0
                       ? "; slot ends in " + std::to_string((options.slot_end_ms - ft::WallNowMs()) / 1000) +
                             " s"
                       : "");
  std::string reason;
  double deadline_s = 0;
  while (!stop.Wait(kTick, &reason, &deadline_s)) {
    worker.Reap();
    worker.CheckSlotEnd(ft::WallNowMs());
  }
  for (auto& p : pollers) p->Stop();
  StopCleanly(&worker, &session, reason, deadline_s);
  FT_LOG(INFO) << "ft-worker stopped (" << reason << ")";
  return kExitClean;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread starts: the signals go to SignalWatcher only; a dead
  // trainer's control channel must not kill us.
  const sigset_t stop_signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit fails the write (EFBIG) instead of killing the worker
  struct sigaction on_stop {};
  on_stop.sa_handler = OnStopSignal;
  sigemptyset(&on_stop.sa_mask);
  on_stop.sa_flags = SA_RESTART;
  for (int s : {SIGTERM, SIGUSR1, SIGINT}) sigaction(s, &on_stop, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  CLI::App app{"ft-worker: ftune's node agent"};
  Flags flags;
  AddFlags(&app, &flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitClean : kExitBadFlags;
  }
  auto level = ft::log::ParseLevel(flags.log_level);
  if (!level.ok()) {
    std::fprintf(stderr, "ft-worker: --log-level: %s\n", level.status().message().c_str());
    return kExitBadFlags;
  }
  ft::log::Configure({*level, flags.log_json, "ft-worker"});
  ft::worker::WorkerOptions options;
  ft::worker::SessionOptions session_options;
  if (!MakeOptions(flags, &options, &session_options)) return kExitBadFlags;
  return Run(flags, options, session_options);
}
