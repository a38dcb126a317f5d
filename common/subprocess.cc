#include "common/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>

extern char** environ;

namespace ft {

namespace {

// This process's environment with `overrides` (NAME=value) replacing or added to it.
std::vector<std::string> MergedEnv(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const std::string& entry : overrides) {
    const size_t eq = entry.find('=');
    const std::string prefix = entry.substr(0, eq == std::string::npos ? entry.size() : eq + 1);
    auto same =
        std::find_if(env.begin(), env.end(), [&](const std::string& e) { return e.starts_with(prefix); });
    if (same != env.end()) {
      *same = entry;
    } else {
      env.push_back(entry);
    }
  }
  return env;
}

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

Status Errno(const std::string& what, int err) { return Status::IOError(what + ": " + strerror(err)); }

// argv0 could not be run (posix_spawn has reaped the child): says why, in the log too.
Status ExecFailed(const std::string& argv0, int exec_errno, int log_fd) {
  const std::string message = "cannot run " + argv0 + ": " + strerror(exec_errno);
  const std::string line = message + "\n";
  if (log_fd >= 0 && write(log_fd, line.data(), line.size()) < 0) {
    return Status::IOError(message + " (and cannot write that to its log: " + strerror(errno) + ")");
  }
  return exec_errno == ENOENT ? Status::NotFound(message) : Status::FailedPrecondition(message);
}

// posix_spawn's descriptor actions and attributes, released on every path.
class SpawnSetup {
 public:
  SpawnSetup() {
    actions_ok_ = posix_spawn_file_actions_init(&actions_) == 0;
    attr_ok_ = posix_spawnattr_init(&attr_) == 0;
  }
  ~SpawnSetup() {
    if (actions_ok_) posix_spawn_file_actions_destroy(&actions_);
    if (attr_ok_) posix_spawnattr_destroy(&attr_);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;

  // The child's log, extra descriptors (a dup2 onto itself clears
  // close-on-exec, as POSIX and glibc >= 2.29 say) and process group; the
  // errno of the first step that failed, 0 when all were recorded.
  int Prepare(const ChildOptions& options, int log_fd) {
    if (!actions_ok_ || !attr_ok_) return ENOMEM;
    int err = 0;
    if (log_fd >= 0 && options.stdout_to_log) err = posix_spawn_file_actions_adddup2(&actions_, log_fd, 1);
    if (log_fd >= 0 && err == 0) err = posix_spawn_file_actions_adddup2(&actions_, log_fd, 2);
    for (const auto& [here, there] : options.fds) {
      if (err == 0) err = posix_spawn_file_actions_adddup2(&actions_, here, there);
    }
    if (options.new_process_group && err == 0) {
      err = posix_spawnattr_setflags(&attr_, POSIX_SPAWN_SETPGROUP);
      if (err == 0) err = posix_spawnattr_setpgroup(&attr_, 0);
    }
    return err;
  }
  const posix_spawn_file_actions_t* actions() const { return &actions_; }
  const posix_spawnattr_t* attr() const { return &attr_; }

 private:
  posix_spawn_file_actions_t actions_;
  posix_spawnattr_t attr_;
  bool actions_ok_ = false, attr_ok_ = false;
};

// Runs the child; returns its pid or why it could not start.
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const ChildOptions& options, int log_fd) {
  SpawnSetup setup;
  if (const int err = setup.Prepare(options, log_fd); err != 0) {
    return Errno("cannot start " + argv[0] + ": posix_spawn setup", err);
  }
  std::vector<std::string> env;
  if (!options.env.empty()) env = MergedEnv(options.env);
  const std::vector<char*> c_argv = CStrings(argv), c_env = CStrings(env);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, argv[0].c_str(), setup.actions(), setup.attr(), c_argv.data(),
                              options.env.empty() ? environ : c_env.data());
  if (err == EAGAIN || err == ENOMEM) {
    return Status::ResourceExhausted("cannot start " + argv[0] + ": posix_spawn: " + strerror(err));
  }
  if (err != 0) return ExecFailed(argv[0], err, log_fd);
  return pid;
}

}  // namespace

StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv, const ChildOptions& options) {
  if (argv.empty())
    return Status::InvalidArgument("SpawnChild: argv is empty (it must start with the program)");
  int log_fd = -1;
  if (!options.log.empty()) {
    const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (options.truncate_log ? O_TRUNC : O_APPEND);
    log_fd = open(options.log.c_str(), flags, 0644);
    if (log_fd < 0) return Errno("cannot open log " + options.log + " for " + argv[0], errno);
  }
  StatusOr<pid_t> pid = Spawn(argv, options, log_fd);
  if (log_fd >= 0) close(log_fd);
  return pid;
}

}  // namespace ft
