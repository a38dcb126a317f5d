#include "tests/support/process.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace ft::testing_support {

namespace fs = std::filesystem;

namespace {
int ExitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
}  // namespace

bool Proc::Alive() const { return pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0; }

void Proc::Signal(int sig) const {
  if (pid > 0) kill(pid, sig);
}

int Proc::Wait() {
  if (pid <= 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  pid = -1;
  return ExitCode(status);
}

int Proc::WaitFor(std::chrono::milliseconds timeout) {
  if (pid <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return ExitCode(status);
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string Proc::Log() const { return Slurp(log); }

Proc Spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  Proc p;
  p.log = options.log;
  p.pid = fork();
  if (p.pid == 0) {
    const int flags = O_WRONLY | O_CREAT | (options.truncate_log ? O_TRUNC : O_APPEND);
    const int fd = open(options.log.c_str(), flags, 0644);
    if (fd >= 0) {
      if (options.stdout_to_log) dup2(fd, 1);
      dup2(fd, 2);
    }
    for (const auto& [here, there] : options.fds) {
      if (here == there) {
        fcntl(here, F_SETFD, 0);  // dup2 onto itself would leave close-on-exec set
      } else {
        dup2(here, there);
      }
    }
    for (const std::string& e : options.env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return p;
}

ScopedProc::~ScopedProc() {
  if (p_.pid > 0) {
    p_.Signal(SIGKILL);
    p_.Wait();
  }
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempPath(const std::string& name) {
  std::string prefix = program_invocation_short_name;
  // A sharded test (GTEST_SHARD_INDEX, ft_add_test's SHARDS) runs as several
  // processes of one binary at once: each shard has directories of its own.
  if (const char* shard = std::getenv("GTEST_SHARD_INDEX")) prefix += std::string("-shard") + shard;
  return (fs::path(testing::TempDir()) / (prefix + "-" + name)).lexically_normal().string();
}

std::string FreshDir(const std::string& name) {
  const std::string d = TempPath(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace ft::testing_support
