#include "cli/embedded.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <thread>
#include <vector>

#include "common/subprocess.h"

namespace ft {

namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_stop = 0;
// How long each child gets after SIGTERM: the worker must let its trainer
// checkpoint (ft-worker gives it --stop-grace, 30 s by default, plus slack).
constexpr std::chrono::seconds kWorkerGrace{90}, kDaemonGrace{10};
extern "C" void OnStopSignal(int) { g_stop = 1; }

// `name` next to this binary (installed), else at `build_rel` from the build tree's root.
std::string FindSibling(const std::string& name, const std::string& build_rel) {
  const fs::path self = fs::canonical("/proc/self/exe");
  if (fs::exists(self.parent_path() / name)) return (self.parent_path() / name).string();
  return (self.parent_path().parent_path() / build_rel).string();
}

// Starts args[0] with stdout+stderr appended to `log`, in a process group of
// its own: a Ctrl-C at the terminal reaches only ftctl, which then stops the
// worker first (so its trainer checkpoints) and ftd last. -1 (after saying
// why) when it cannot be started.
pid_t Start(const std::vector<std::string>& args, const std::string& log) {
  const StatusOr<pid_t> pid = SpawnChild(args, {.log = log, .new_process_group = true});
  if (pid.ok()) return *pid;
  std::fprintf(stderr, "ftctl up: %s\n", pid.status().message().c_str());
  return -1;
}

std::string Slurp(const std::string& path, size_t from) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "";
  std::fseek(f, static_cast<long>(from), SEEK_SET);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return text;
}

// SIGTERM, then SIGKILL if it has not exited after `grace`.
void Stop(pid_t pid, std::chrono::seconds grace) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (waitpid(pid, nullptr, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int RunEmbedded(const EmbeddedOptions& o) {
  std::error_code ec;
  fs::create_directories(o.data_dir, ec);
  if (ec) {
    std::fprintf(stderr, "ftctl up: cannot create --data-dir '%s': %s\n", o.data_dir.c_str(),
                 ec.message().c_str());
    return 1;
  }
  const std::string ftd = FindSibling("ftd", "daemon/ftd");
  const std::string worker = FindSibling("ft-worker", "worker/ft-worker");
  const std::string ft_train = FindSibling("ft-train", "engine/ft-train");
  for (const std::string& bin : {ftd, worker, ft_train}) {
    if (access(bin.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "ftctl up: %s is missing: install ftune's binaries side by side\n", bin.c_str());
      return 1;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const std::string ftd_log = (fs::path(o.data_dir) / "ftd.log").string();
  const size_t log_start = fs::exists(ftd_log) ? fs::file_size(ftd_log) : 0;
  const pid_t daemon =
      Start({ftd, "--listen", o.listen, "--http", o.http, "--data-dir", o.data_dir}, ftd_log);
  if (daemon < 0) return 1;
  // ftd prints where it listens once it serves (the port may have been 0).
  const std::regex grpc_re("ftd: listening on ([^\\s]+)"), http_re("ftd: dashboard at ([^\\s]+)");
  std::string address, dashboard;
  for (int i = 0; i < 400 && !g_stop && (address.empty() || (!o.http.empty() && dashboard.empty())); ++i) {
    const std::string text = Slurp(ftd_log, log_start);
    std::smatch m;
    if (std::regex_search(text, m, grpc_re)) address = m[1];
    if (std::regex_search(text, m, http_re)) dashboard = m[1];
    if (waitpid(daemon, nullptr, WNOHANG) == daemon) {
      std::fprintf(stderr, "ftctl up: ftd exited at start; see %s:\n%s", ftd_log.c_str(), text.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (address.empty()) {
    std::fprintf(stderr, "ftctl up: ftd did not start serving within 10 s; see %s\n", ftd_log.c_str());
    Stop(daemon, kDaemonGrace);
    return 1;
  }
  std::vector<std::string> args = {worker,   "--daemon",   address,
                                   "--id",   "local",      "--ft-train",
                                   ft_train, "--work-dir", (fs::path(o.data_dir) / "worker").string()};
  if (!o.cpu_memory.empty()) args.insert(args.end(), {"--cpu-memory", o.cpu_memory});
  const pid_t local = Start(args, (fs::path(o.data_dir) / "worker.log").string());
  if (local < 0) {
    Stop(daemon, kDaemonGrace);
    return 1;
  }
  std::printf(
      "ftune is up: ftd on %s, dashboard at %s, worker 'local' (state and logs in %s). "
      "Ctrl-C stops both.\n",
      address.c_str(), dashboard.empty() ? "(off)" : dashboard.c_str(), o.data_dir.c_str());
  std::fflush(stdout);
  int code = 0;
  while (!g_stop) {
    for (pid_t pid : {daemon, local}) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) {
        std::fprintf(stderr, "ftctl up: %s exited on its own; see its log in %s\n",
                     pid == daemon ? "ftd" : "the worker", o.data_dir.c_str());
        if (pid == daemon) {
          Stop(local, kWorkerGrace);
        } else {
          Stop(daemon, kDaemonGrace);
        }
        return 1;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Stop(local, kWorkerGrace);  // first, so its trainer checkpoints while ftd still listens
  Stop(daemon, kDaemonGrace);
  return code;
}

}  // namespace ft
