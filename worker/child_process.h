// A child process in its own process group with its output captured and a
// control channel: how ft-worker runs ft-train.
//
// The child gets stdin from /dev/null, stdout and stderr into one pipe the
// parent reads (output_fd()), and fd 3 connected to a stream the parent writes
// (WriteControl). It starts with an empty signal mask and default signal
// dispositions, and receives SIGTERM when the parent process dies (so a
// trainer orphaned by a crashed worker checkpoints and stops rather than
// training on unsupervised). Children are forked from one long-lived thread
// because that death signal follows the forking thread, not the process.
//
// Thread safety: WriteControl, Signal and Poll may be called from different
// threads; output_fd() is meant for one reader thread.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace ft::worker {

// How a child ended, decoded from its wait status.
struct ExitStatus {
  bool signaled = false;
  int code = 0;                  // exit code, or the signal number when signaled
  std::string ToString() const;  // "exit code 3" | "killed by signal 9 (Killed)"
};

class ChildProcess {
 public:
  // Starts argv[0] (a path) with arguments argv[1..], in our environment with
  // `env`'s "NAME=VALUE" entries added (replacing ours of the same name).
  // IOError when a pipe or fork fails; NotFound/FailedPrecondition when exec
  // fails (errno's text).
  static StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::vector<std::string>& argv,
                                                       const std::vector<std::string>& env = {});

  // Kills the process group (SIGKILL) when it still runs, reaps, closes fds.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Read end of the child's stdout+stderr; EOF once every writer exited.
  int output_fd() const { return output_fd_; }

  // Writes `data` to the child's fd 3. IOError once the child closed it.
  Status WriteControl(const std::string& data);
  // Sends `signo` to the child's whole process group (no-op once reaped).
  void Signal(int signo);

  // True once the child exited; then *status says how. Non-blocking. Before
  // reaping it SIGKILLs what is left of the process group, so no grandchild
  // keeps the output pipe open.
  bool Poll(ExitStatus* status);

 private:
  ChildProcess() = default;

  pid_t pid_ = -1;
  std::mutex mu_;
  bool reaped_ = false;  // GUARDED_BY(mu_)
  ExitStatus status_;    // GUARDED_BY(mu_), once reaped_
  int output_fd_ = -1;
  int control_fd_ = -1;
};

}  // namespace ft::worker
