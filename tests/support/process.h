// Test support for every test that runs real processes (ft-train, ftd,
// ft-worker): spawning with output to a log file (common/subprocess.h),
// signalling, waiting with and without a deadline, reading files whole, and
// (temp_dir.h) per-binary temporary paths.
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

#include "common/subprocess.h"
#include "tests/support/temp_dir.h"  // TempPath, FreshDir

namespace ft::testing_support {

// How to start a child: its log, environment, extra descriptors (common/subprocess.h).
using SpawnOptions = ChildOptions;

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

// Starts argv[0] (a path) with argv. When it cannot be started (a missing
// binary, a log that cannot be opened) the test fails with the reason and the
// Proc has pid -1.
Proc Spawn(const std::vector<std::string>& argv, const SpawnOptions& options);

// ftctl (`bin`) with --addr `address` and `args`, HOME = `dir` and none of the caller's FTUNE_TOKEN
// or FTUNE_TLS_CA; its output in <dir>/<name>.log (truncated first).
Proc SpawnFtctl(const std::string& bin, const std::string& dir, const std::string& address,
                const std::vector<std::string>& args, const std::string& name);

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

}  // namespace ft::testing_support
