// Test support for every test that runs real processes (ft-train, ftd,
// ft-worker): spawning with output to a log file, signalling, waiting with and
// without a deadline, reading files whole, and per-binary temporary paths.
//
// A Proc is a plain handle (copyable, no ownership): whoever starts one kills
// or waits for it; ScopedProc kills and reaps a still-running child when it
// goes out of scope.
//
// Thread safety: for a test's main thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace ft::testing_support {

struct SpawnOptions {
  std::string log;               // stderr (and stdout, unless !stdout_to_log) go here, appended
  std::vector<std::string> env;  // NAME=value entries added to (and overriding) the inherited ones
  bool stdout_to_log = true;     // false: stdout stays the test's own
  bool truncate_log = false;     // start the log empty instead of appending
  // {descriptor here, descriptor in the child} pairs, dup2'ed in the child
  // (e.g. a pipe's read end as ft-train's --control-fd 3).
  std::vector<std::pair<int, int>> fds;
};

// A child process.
struct Proc {
  pid_t pid = -1;
  std::string log;
  // Running (not yet reaped). A stopped (SIGSTOP) process is alive.
  bool Alive() const;
  void Signal(int sig) const;
  // Waits for the exit: the exit code, or 128 + the signal that killed it
  // (-1 when there is no process).
  int Wait();
  // Like Wait, but gives up after `timeout`: -1 when it has not exited by then.
  int WaitFor(std::chrono::milliseconds timeout);
  // The log's contents so far.
  std::string Log() const;
};

// Starts argv[0] (a path) with argv. A child that cannot exec exits 127.
Proc Spawn(const std::vector<std::string>& argv, const SpawnOptions& options);

// A Proc that is killed (SIGKILL) and reaped when it goes out of scope.
class ScopedProc {
 public:
  explicit ScopedProc(Proc p) : p_(std::move(p)) {}
  ScopedProc(const ScopedProc&) = delete;
  ScopedProc& operator=(const ScopedProc&) = delete;
  ~ScopedProc();
  Proc* operator->() { return &p_; }
  Proc& get() { return p_; }

 private:
  Proc p_;
};

// A file's contents ("" when unreadable).
std::string Slurp(const std::string& path);
// <testing::TempDir()>/<this test binary's name>[-shard<i>]-<name>, so test
// binaries (and shards of one) running side by side never share a directory.
std::string TempPath(const std::string& name);
// TempPath(name), emptied and created.
std::string FreshDir(const std::string& name);

}  // namespace ft::testing_support
