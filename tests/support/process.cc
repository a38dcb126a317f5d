#include "tests/support/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <thread>

namespace ft::testing_support {

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
  const StatusOr<pid_t> pid = SpawnChild(argv, options);
  if (!pid.ok()) ADD_FAILURE() << pid.status().ToString();
  return {pid.ok() ? *pid : -1, options.log};
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

Proc SpawnFtctl(const std::string& bin, const std::string& dir, const std::string& address,
                const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> argv = {bin, "--addr", address};
  argv.insert(argv.end(), args.begin(), args.end());
  return Spawn(argv, {.log = dir + "/" + name + ".log",
                      .env = {"HOME=" + dir, "FTUNE_TOKEN=", "FTUNE_TLS_CA="},
                      .truncate_log = true});
}

}  // namespace ft::testing_support
