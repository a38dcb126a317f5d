#include "common/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

extern char** environ;

namespace ft {

namespace {

// What the child does between fork and exec, all prepared before the fork.
struct ChildPlan {
  char* const* argv;
  char* const* envp;
  int log_fd;  // -1: no log
  int exec_errno_fd;
  const ChildOptions* options;
};

// In the forked child: async-signal-safe calls only.
[[noreturn]] void RunChild(const ChildPlan& plan) {
  if (plan.options->new_process_group) setpgid(0, 0);
  if (plan.log_fd >= 0) {
    if (plan.options->stdout_to_log) dup2(plan.log_fd, STDOUT_FILENO);
    dup2(plan.log_fd, STDERR_FILENO);
  }
  for (const auto& [here, there] : plan.options->fds) {
    if (here == there) {
      fcntl(here, F_SETFD, 0);  // dup2 onto itself would leave close-on-exec set
    } else {
      dup2(here, there);
    }
  }
  execve(plan.argv[0], plan.argv, plan.envp);
  const int exec_errno = errno;
  // Tells the parent why (should this write fail, it still sees the exit status 127).
  [[maybe_unused]] const ssize_t sent = write(plan.exec_errno_fd, &exec_errno, sizeof(exec_errno));
  _exit(127);
}

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

// `fd` moved above stderr and every descriptor the child dup2s onto, so that
// no dup2 in the child closes it; -1 when that fails.
int AboveChildTargets(int fd, const std::vector<std::pair<int, int>>& fds) {
  int top = STDERR_FILENO;
  for (const auto& target : fds) top = std::max(top, target.second);
  if (fd > top) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, top + 1);
  close(fd);
  return moved;
}

// The errno the child sent through `fd` when its exec failed; 0 when exec succeeded.
int ReadExecErrno(int fd) {
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(fd, &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  return n == sizeof(exec_errno) ? exec_errno : 0;
}

Status Errno(const std::string& what, int err) { return Status::IOError(what + ": " + strerror(err)); }

// The child (pid) could not exec argv0: reaps it and says why, in the log too.
Status ExecFailed(pid_t pid, const std::string& argv0, int exec_errno, int log_fd) {
  waitpid(pid, nullptr, 0);
  const std::string message = "cannot run " + argv0 + ": " + strerror(exec_errno);
  const std::string line = message + "\n";
  if (log_fd >= 0 && write(log_fd, line.data(), line.size()) < 0) {
    return Status::IOError(message + " (and cannot write that to its log: " + strerror(errno) + ")");
  }
  return exec_errno == ENOENT ? Status::NotFound(message) : Status::FailedPrecondition(message);
}

// Forks and runs the child; the parent's side returns the pid or why it failed.
StatusOr<pid_t> ForkExec(const std::vector<std::string>& argv, const ChildOptions& options, int log_fd) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return Errno("cannot start " + argv[0] + ": pipe", errno);
  const int errno_w = AboveChildTargets(pipe_fds[1], options.fds);
  if (errno_w < 0) {
    const int err = errno;
    close(pipe_fds[0]);
    return Errno("cannot start " + argv[0] + ": fcntl", err);
  }
  std::vector<std::string> env;
  if (!options.env.empty()) env = MergedEnv(options.env);
  const std::vector<char*> c_argv = CStrings(argv), c_env = CStrings(env);
  const ChildPlan plan{c_argv.data(), options.env.empty() ? environ : c_env.data(), log_fd, errno_w,
                       &options};
  const pid_t pid = fork();
  if (pid == 0) RunChild(plan);
  const int fork_errno = errno;
  close(errno_w);
  const int exec_errno = pid > 0 ? ReadExecErrno(pipe_fds[0]) : 0;
  close(pipe_fds[0]);
  if (pid < 0) {
    return Status::ResourceExhausted("cannot start " + argv[0] + ": fork: " + strerror(fork_errno));
  }
  if (exec_errno != 0) return ExecFailed(pid, argv[0], exec_errno, log_fd);
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
  StatusOr<pid_t> pid = ForkExec(argv, options, log_fd);
  if (log_fd >= 0) close(log_fd);
  return pid;
}

}  // namespace ft
