// The worker's core: what ft-worker does with the daemon's commands and with
// its trainers' reports. It is the session's delegate (Register, Heartbeat,
// commands) and every attempt's listener (reports become WorkerMessages sent
// through a ReportSink).
//
//   StartAttempt   writes <work_dir>/<job_id>-e<epoch>[-r<rank>].yaml and
//                  starts an Attempt (one per job and rank: a multi-rank job
//                  may run several ranks here, one per device; a newer epoch
//                  of a running job supersedes the older one). Refused at once, as AttemptExited
//                  PREEMPTED, while the worker stops or when the slot ends too
//                  soon ("slot ends too soon").
//   CheckpointNow  {"cmd": "checkpoint"|"stop"} on the control channel of
//                  every rank of that attempt here. A rank still running
//                  kill_grace_s past a stop's deadline is SIGKILLed (its
//                  process group) and reported PREEMPTED ("... killed").
//   Refused        that attempt is superseded (or its gang ended): every rank
//                  of it here is killed, nothing more reported.
//
// Every exit report is journaled first (<work_dir>/journal, see
// worker/report_journal.h) and replayed in the next Register. Every report
// about an attempt carries the credential its StartAttempt gave (the journal
// keeps it with the exit); Register carries the work dir's instance
// (worker/instance.h), which Init reads or makes while holding the work dir's lock.
//
// Preemption (signals, cloud notices) calls StopAll, then WaitIdle and, for
// trainers that miss the deadline, KillRemaining. Slot end is CheckSlotEnd,
// called periodically.
//
// Thread safety: every public method is thread-safe. The worker's lock is
// never held while calling an attempt's Kill/Abort/Control or the sink, so
// listener callbacks (which arrive holding the attempt's report lock) cannot
// deadlock with commands.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/attempt.h"
#include "worker/devices.h"
#include "worker/instance.h"
#include "worker/report_journal.h"
#include "worker/session.h"

namespace ft::worker {

struct WorkerOptions {
  std::string id;
  std::string hostname;
  std::string version;
  std::string ft_train;  // path of the ft-train binary
  std::string work_dir;  // job files are written here
  double stop_grace_s = 30;
  // A trainer that has not stopped this long after a stop's deadline (cancel,
  // preemption, slot end, StopAll) is SIGKILLed with its process group and
  // reported ended, so the worker is free again (worker/attempt.h).
  double kill_grace_s = 5;
  int64_t slot_end_ms = 0;  // 0 = no known end
  DeviceOptions devices;
  std::chrono::milliseconds poll_interval{200};  // each attempt's metrics/exit polling
  std::string address;                           // where other ranks reach this node's ranks ("" = hostname)
  int rendezvous_port_first = 0;                 // ports a rank 0 here may serve its rendezvous on
  int rendezvous_port_count = 0;                 // 0 = none: no rank 0 of a multi-rank job here
  std::string pool;                              // ft-worker --pool ("" = the default pool)
  double price = 0;                              // ft-worker --price (per device-hour; 0 = none)
};

class Worker : public SessionDelegate, public AttemptListener {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker() override;  // kills attempts still running (without reports)

  // Creates work_dir, takes its lock (waiting up to lock_wait for a worker going away), reads or
  // makes its instance and discovers the devices. IOError or Unavailable; FailedPrecondition when
  // another ft-worker holds the work dir.
  Status Init(std::chrono::milliseconds lock_wait = std::chrono::seconds(5));
  // Register.instance (worker/instance.h); set by Init.
  const std::string& instance() const { return instance_; }
  // Where reports go; set before the session starts.
  void set_sink(ReportSink* sink) { sink_ = sink; }

  // SessionDelegate
  ftune::v1::Register MakeRegister() override;
  void OnRegistered() override;
  ftune::v1::Heartbeat MakeHeartbeat() override;
  void OnCommand(const ftune::v1::DaemonCommand& command) override;

  // AttemptListener
  void OnMetrics(const AttemptSpec& a, const std::vector<MetricsLine>& steps, int64_t time_ms) override;
  void OnLog(const AttemptSpec& a, const std::string& text) override;
  void OnCheckpoint(const AttemptSpec& a, const CommittedCheckpoint& c) override;
  void OnNote(const AttemptSpec& a, const AttemptNote& n) override;
  void OnExit(const AttemptSpec& a, const AttemptExit& e) override;

  // Tells every running attempt to checkpoint and stop within deadline_s
  // (reason is reported with their exits); refuses new attempts from now on.
  void StopAll(const std::string& reason, double deadline_s);
  // A cloud preemption notice reached this node at `wall_ms`: heartbeats and exit reports carry
  // it from now on (ftd's notice catch rate, daemon/goodput.h).
  void NoticeReceived(int64_t wall_ms) { notice_ms_.store(wall_ms); }
  // Stops each attempt whose slot-end stop point (slot_end.h) has come, and
  // refuses new attempts once the slot's end is that near.
  void CheckSlotEnd(int64_t now_ms);
  // Waits until no attempt runs. False at timeout.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // SIGKILLs attempts still running; their exits report PREEMPTED with `reason`.
  void KillRemaining(const std::string& reason);
  // Frees attempts that are done (joins their threads); not from a listener callback.
  void Reap();
  // Attempts running (not yet exited).
  size_t running() const;

 private:
  using Key = std::tuple<std::string, int64_t, int>;  // job id, epoch, rank
  struct Entry {
    std::shared_ptr<Attempt> attempt;
    bool exited = false;  // OnExit was delivered
  };

  void HandleStart(const ftune::v1::StartAttempt& s);
  void HandleCheckpointNow(const ftune::v1::CheckpointNow& c);
  void HandleRefused(const ftune::v1::Refused& r);
  void HandleAccepted(const ftune::v1::CheckpointAccepted& c);
  // Empty when the attempt may start, else why not (the slot or a stop).
  std::string StartRefusal(int64_t now_ms);
  // Takes the attempts (every rank) of `job_id` whose epoch matches out of
  // attempts_ into retired_ (freed once done): what it took. REQUIRES: not mu_.
  std::vector<std::pair<Key, std::shared_ptr<Attempt>>> Retire(
      const std::string& job_id, const std::function<bool(int64_t)>& epoch_matches);
  // Kills running attempts of `job_id` with an epoch below `epoch` (superseded)
  // and waits (bounded) until they are gone, so two trainers never share an output dir.
  void SupersedeOlder(const std::string& job_id, int64_t epoch);
  StatusOr<AttemptSpec> PrepareAttempt(const ftune::v1::StartAttempt& s);
  // How one rank of a multi-rank attempt starts on device `device_index`
  // (RankLaunchOn, devices.h: NCCL and CUDA_VISIBLE_DEVICES on GPUs, Gloo and
  // a share of the threads on CPU devices), under the worker's environment.
  RankLaunch LaunchOfRank(int device_index);
  // Reports the StartAttempt `s` ended at once (PREEMPTED) with `reason`.
  void Reject(const ftune::v1::StartAttempt& s, const std::string& reason);
  // Running attempts (shared pointers, so callers need no lock).
  std::vector<std::shared_ptr<Attempt>> Running() const;
  // The running ranks of (job_id, epoch) here.
  std::vector<std::shared_ptr<Attempt>> RanksOf(const std::string& job_id, int64_t epoch) const;
  void Send(ftune::v1::WorkerMessage m);

  const WorkerOptions options_;
  ReportSink* sink_ = nullptr;
  std::unique_ptr<WorkDirLock> work_dir_lock_;  // held from Init on
  std::string instance_;                        // set by Init

  std::mutex devices_mu_;
  DeviceMonitor devices_;  // GUARDED_BY(devices_mu_)

  std::mutex start_mu_;  // serialises starts with StopAll/CheckSlotEnd

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  std::map<Key, Entry> attempts_;                  // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<Attempt>> retired_;  // GUARDED_BY(mu_): killed, waiting to be freed
  bool stopping_ = false;                          // GUARDED_BY(mu_)
  std::string stop_reason_;                        // GUARDED_BY(mu_)
  std::atomic<int64_t> notice_ms_{0};              // NoticeReceived
  bool slot_closed_ = false;                       // GUARDED_BY(mu_)
  double max_checkpoint_seconds_ = 0;              // GUARDED_BY(mu_): newest measurements' max
  ReportJournal journal_;                          // GUARDED_BY(mu_)
  std::vector<std::tuple<std::string, int64_t, int>> journaled_in_register_;  // GUARDED_BY(mu_)
};

}  // namespace ft::worker
