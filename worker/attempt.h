// One attempt of one job on this worker: an ft-train child supervised from
// start to exit.
//
//   ft-train run JOB_FILE --control-fd 3 [--resume DIR] --stop-grace S --job-id ID --epoch N
//                         [--world W --rank R --rendezvous HOST:PORT --dist-host ADDR]
//
// (the second line for one rank of a multi-rank attempt; only its rank 0
// writes output.dir, so only rank 0's attempt follows metrics.jsonl, and the
// output lines of the others are relayed with a "[rank R] " prefix)
// runs in its own process group. Its stdout+stderr lines are relayed in
// batches (OnLog) and the last ones kept for the failure reason; its
// <output_dir>/metrics.jsonl is followed from the current end (step and eval lines →
// OnMetrics in batches and progress(); checkpoint events → OnCheckpoint with
// the SHA-256 of the checkpoint's MANIFEST.json; resume events → OnNote);
// lines another epoch's trainer wrote are ignored. When it exits, OnExit says
// how: exit 0 FINISHED, 3 PREEMPTED (stopped after a checkpoint), 4
// SUPERSEDED (a newer epoch owns output.dir), 5 ENVIRONMENT (an I/O error),
// 6 RANK_LOST (a peer rank or the rendezvous failed), anything else FAILED with the trainer's last error line
// as the reason.
//
// A stop has a deadline: a trainer still running kill_grace_s after the
// deadline of the earliest stop sent (Control("stop", ...)) is stuck outside
// its step loop (blocked reading a FIFO, a huge planner pass, a chat template
// that does enormous total work) and gets SIGKILL, its whole process group
// with it; its exit is reported as PREEMPTED with the stop's reason and
// "killed". So every stop, whoever sent it (cancel, preemption, slot end),
// frees the worker within its deadline plus kill_grace_s.
//
// Listener calls come from the attempt's own threads, in order, and OnExit is
// the last one. After Kill() returns there are none (the attempt was
// superseded: nothing more is reported for it).
//
// Thread safety: all public methods are thread-safe. Lock order: the
// attempt's report lock is held during listener calls, so a listener must
// not call Kill() or destroy the attempt from inside a callback.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/job/metrics_line.h"
#include "worker/child_process.h"
#include "worker/metrics_tail.h"

namespace ft::worker {

struct AttemptSpec {
  std::string job_id;
  int64_t epoch = 0;
  std::string credential;         // StartAttempt.credential: echoed in every report (a secret: never logged)
  std::string ft_train;           // path of the ft-train binary
  std::string job_file;           // the job.yaml to run (already written)
  std::string output_dir;         // the job's output.dir: metrics.jsonl is followed there
  std::string resume_checkpoint;  // "" = ft-train resumes from the newest valid checkpoint, if any
  double stop_grace_s = 30;       // ft-train's --stop-grace (for signals it receives itself)
  double kill_grace_s = 5;        // a stop not honoured this long past its deadline: SIGKILL (see above)
  int64_t total_steps = 0;        // reported with progress
  double mtbf_seconds = 0;        // ftd's M for checkpoint.every auto (ft-train --mtbf-seconds; 0 = none)
  int64_t start_step = 0;         // the committed step it resumes from (progress until the trainer says)
  std::chrono::milliseconds poll_interval{200};  // metrics.jsonl and exit polling
  // One rank of a multi-rank attempt (world > 1).
  int world = 1;
  int rank = 0;
  std::string rendezvous;        // HOST:PORT rank 0 serves
  std::string dist_host;         // where the other ranks reach this one ("" = ft-train's default)
  std::string dist_backend;      // ft-train --dist-backend: nccl between GPUs ("" = its default, gloo)
  std::vector<std::string> env;  // NAME=VALUE added to the trainer's environment
  // ft-train --allowed-root: ftd's roots (and the worker's own); empty = not confined.
  std::vector<std::string> allowed_roots;
};

struct AttemptProgress {
  int64_t step = 0;  // last finished step (the restored step until a new one is logged)
  int64_t total_steps = 0;
  double loss = 0;
  double tokens_per_s = 0;
  int64_t peak_bytes = 0;
  double checkpoint_seconds = 0;  // newest measured checkpoint write time; 0 = none yet
  bool stop_sent = false;         // a "stop" went out on the control channel
};

struct CommittedCheckpoint {
  int64_t step = 0;
  std::string dir;  // absolute
  std::string manifest_sha256;
  double write_seconds = 0;
};

enum class AttemptOutcome { kFinished, kPreempted, kFailed, kSuperseded, kEnvironment, kRankLost, kBadInput };

// How the trainer resumed, when it is worth an event (see Trainer::set_fencing).
struct AttemptNote {
  std::string kind;  // "resume" | "resume_ahead" | "resume_fallback" | "restart_from_zero"
  std::string message;
  int64_t step = 0;
  std::string dir;
};

struct AttemptExit {
  AttemptOutcome outcome = AttemptOutcome::kFailed;
  int exit_code = 0;  // 128 + signal when killed by a signal
  std::string reason;
  int64_t step = 0;  // last finished step
};

class AttemptListener {
 public:
  virtual ~AttemptListener() = default;
  // Step and evaluation lines read in one poll, oldest first; time_ms: when they were read (Unix ms).
  virtual void OnMetrics(const AttemptSpec& a, const std::vector<MetricsLine>& steps, int64_t time_ms) = 0;
  // Complete output lines, each ending in '\n'.
  virtual void OnLog(const AttemptSpec& a, const std::string& text) = 0;
  virtual void OnCheckpoint(const AttemptSpec& a, const CommittedCheckpoint& c) = 0;
  virtual void OnNote(const AttemptSpec& /*a*/, const AttemptNote& /*n*/) {}
  virtual void OnExit(const AttemptSpec& a, const AttemptExit& e) = 0;
};

class Attempt {
 public:
  // Spawns ft-train and starts following it. Errors: the spawn's (NotFound
  // when the binary is missing); nothing is reported then.
  static StatusOr<std::unique_ptr<Attempt>> Start(AttemptSpec spec, AttemptListener* listener);

  // Kills a trainer that still runs (as Kill()) and waits for the threads.
  ~Attempt();
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  const AttemptSpec& spec() const { return spec_; }
  // The ft-train process (also its process group's id).
  pid_t pid() const { return child_->pid(); }

  // Sends {"cmd": cmd, "deadline_s": deadline_s, "reason": reason} on the
  // control channel; cmd is "checkpoint" or "stop". IOError when the trainer
  // has gone. A stop also arms the kill deadline (deadline_s + kill_grace_s
  // from now; the earliest one stays), even when the channel is closed.
  Status Control(const std::string& cmd, double deadline_s, const std::string& reason);
  // Tells the trainer ftd committed the checkpoint in `dir` (its retention keeps it).
  Status NotifyCommitted(int64_t step, const std::string& dir);

  // Stops reporting, then SIGKILLs the trainer's process group.
  void Kill();
  // SIGKILLs the trainer's process group (a stop that missed its deadline);
  // its exit is still reported, as PREEMPTED with `reason`.
  void Abort(const std::string& reason);

  // True once the trainer exited and OnExit was delivered (or suppressed).
  bool done() const { return done_.load(); }
  AttemptProgress progress() const;
  // Rank 0 (or a single-rank attempt): follows metrics.jsonl and reports progress.
  bool follows_metrics() const { return spec_.rank == 0; }

 private:
  Attempt(AttemptSpec spec, AttemptListener* listener);

  void ReadOutput();  // thread: the child's output → OnLog batches
  void Monitor();     // thread: metrics.jsonl, exit
  void HandleOutputLine(const std::string& line);
  void FlushLog(std::string* batch);
  void PollMetrics();
  // SIGKILLs the process group once the kill deadline of a stop has passed.
  void EnforceKillDeadline();
  void HandleCheckpoint(const MetricsLine& m);
  AttemptExit MakeExit(const ExitStatus& status);

  // Runs `report` under the report lock unless the attempt was killed.
  template <typename F>
  void Report(F report) {
    std::lock_guard<std::mutex> lock(report_mu_);
    if (!killed_) report();
  }

  const AttemptSpec spec_;
  AttemptListener* const listener_;
  std::unique_ptr<ChildProcess> child_;
  MetricsTail tail_;
  const std::string log_prefix_;  // "[rank R] " for ranks > 0
  std::thread reader_;
  std::thread monitor_;
  std::atomic<bool> done_{false};

  std::mutex report_mu_;
  bool killed_ = false;  // GUARDED_BY(report_mu_)

  mutable std::mutex mu_;
  std::condition_variable wake_;  // the monitor's poll sleep; Kill() wakes it
  bool kill_requested_ = false;   // GUARDED_BY(mu_)
  std::string abort_reason_;      // GUARDED_BY(mu_): set by Abort() or at the kill deadline
  // GUARDED_BY(mu_): when an unanswered stop turns into SIGKILL, and the reason reported then.
  std::optional<std::chrono::steady_clock::time_point> kill_at_;
  std::string kill_reason_;
  AttemptProgress progress_;            // GUARDED_BY(mu_)
  std::deque<std::string> last_lines_;  // GUARDED_BY(mu_): the newest output lines
  std::string last_error_line_;         // GUARDED_BY(mu_): newest "ft-train: ..." line
  std::string preempted_reason_;        // monitor thread only
  std::string failed_reason_;           // monitor thread only
  std::string finished_reason_;         // monitor thread only: why a finished run stopped early
};

}  // namespace ft::worker
