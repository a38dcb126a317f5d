// Requests that reach a running trainer from outside: "checkpoint now" and
// "checkpoint and stop", each with a deadline. Sources: SIGTERM, SIGUSR1 and
// SIGINT (stop, deadline = now + grace), and JSON lines on a control file
// descriptor (the worker's channel):
//   {"cmd": "checkpoint", "deadline_s": 30}         checkpoint at the next step boundary, continue
//   {"cmd": "stop", "deadline_s": 30, "reason": "slot end"}   checkpoint and exit "preempted"
//   {"cmd": "committed", "step": 40, "dir": "/abs/step-00000040"}  ftd committed this checkpoint
//                                                   (retention must keep it: committed_dir())
// The trainer polls Pending() between micro-batches and at step boundaries.
//
// Thread safety: Post/Pending/Clear are thread-safe; the signal handler only
// sets an atomic flag, which Pending() turns into a request.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ft {

struct ControlRequest {
  bool stop = false;  // false: checkpoint and continue
  std::chrono::steady_clock::time_point deadline;
  std::string reason;
};

class TrainControl {
 public:
  TrainControl() = default;
  ~TrainControl();

  // Routes SIGTERM, SIGUSR1 and SIGINT to this object (one per process).
  void InstallSignalHandlers(double grace_seconds);
  // Reads JSON-line commands from `fd` on a background thread until EOF.
  void StartControlFd(int fd);

  void Post(ControlRequest r);
  // The pending request (a stop wins over a checkpoint; the earliest deadline wins).
  std::optional<ControlRequest> Pending();
  void Clear();
  // The pending request, removed atomically (a request posted meanwhile stays pending).
  std::optional<ControlRequest> Take();

  // The newest checkpoint ftd committed, as forwarded by the worker ("" before the first).
  void SetCommitted(int64_t step, const std::string& dir);
  std::string committed_dir();

 private:
  void ReadLoop(int fd);

  std::mutex mu_;
  std::optional<ControlRequest> pending_;  // GUARDED_BY(mu_)
  int64_t committed_step_ = -1;            // GUARDED_BY(mu_)
  std::string committed_dir_;              // GUARDED_BY(mu_)
  double grace_seconds_ = 10;
  std::atomic<bool> stopping_{false};
  std::thread reader_;
};

}  // namespace ft
