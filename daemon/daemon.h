// The control daemon's core: jobs, workers, leases with fencing, and the
// scheduler tick, independent of gRPC (daemon/grpc_service.h adapts it).
//
// State lives in the Store (SQLite); the Daemon keeps only what is live: the
// connected worker sessions, their lease clocks (monotonic) and the jobs'
// planning inputs. Every state transition is committed to the Store before it
// is acted on, so ftd can be killed at any moment and restarted: running
// attempts are reattached when their workers reconnect (no duplicates), and
// those whose workers do not come back within the lease are requeued from
// their newest committed checkpoint.
//
// Multi-rank jobs run as a gang: one attempt (one epoch) whose ranks run on
// one or several workers, all started together. Only rank 0 writes output.dir
// and reports metrics and checkpoints; every rank's worker reports its exit.
// The attempt ends with the first decisive report: a rank that failed (or was
// superseded, or hit an environment error), rank 0 finishing or stopping
// after a checkpoint, or a worker of the gang losing its lease (preempted).
// A rank that only lost its peers (ATTEMPT_RANK_LOST) waits for the others'
// word; if none comes within two leases the attempt ends preempted, and when
// every rank lost the others it is an environment error (the ranks never
// reached each other). When the attempt ends, every rank still running is
// refused (killed): the job resumes from its committed checkpoint.
//
// Fencing: each attempt has an epoch. A message about (job, epoch) that is not
// the job's current running attempt is refused (the worker is told to stop
// it) and never changes the job.
//
// Binding: each rank of an attempt belongs to the worker ftd started it on,
// and has a credential (HMAC-SHA256 of job, epoch and rank under a random key
// ftd made once and keeps in its store, so it survives restarts; sent in
// StartAttempt, echoed by the worker in every report, never logged or shown).
// A report about a current attempt from another worker, or with a missing or
// wrong credential, is refused: an event naming the reporting worker, a
// Refused to it (not to the rank's own worker: that would stop the real
// trainer) and no change to the job or to any session. A checkpoint must lie
// in the job's output.dir (symlinks and ".." resolved). A registration of a
// worker id whose session lives is accepted only from the same ft-worker
// instance (Register.instance: a reconnect or a restart), so two workers with
// one id do not replace each other; a worker reports at most kMaxWorkerDevices
// devices.
//
// Thread safety: every public method is thread-safe (one mutex, mu_). Commands to
// workers go through WorkerSink::Send, which must not block or call back.
// The exception is the hot path: a quiet heartbeat (it changes nothing ftd keeps,
// see OnWorkerMessage) takes only its stream's own mutex (WorkerSink::Quiet),
// where it stamps its arrival, the stall credit then and its wall time. Before
// every lease decision and every store of last-seen times the daemon folds those
// stamps into the session under both locks (the newer of the session's own
// message and the stamp, each with its own credit), so a quiet heartbeat is heard
// exactly like one handled under mu_. Races, and why each is safe:
// - Lease expiry against a quiet heartbeat: ExpireLeases folds the stamps, decides
//   and, for a lost worker, disarms the sink (Quiet::armed, the daemon's mirror of
//   the session being alive with this sink) in one hold of the sink's mutex. A
//   heartbeat stamped before that hold keeps the lease; one after it finds the
//   sink disarmed and takes the locked path, which announces the worker back.
// - Whatever can make the next heartbeat not quiet disarms the sink or changes
//   what it is compared with, under mu_: a registration (the session's facts
//   change; an evicted older sink is disarmed), a disconnect (the stamps are
//   folded first), a lost lease; only a heartbeat applied under mu_ arms it again.
// - A quiet heartbeat reads stall_credit_ms_ (atomic) and the clock only; it
//   never touches a Session, so no Session field is shared without mu_.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "daemon/goodput.h"
#include "daemon/latency.h"
#include "daemon/output_dirs.h"
#include "daemon/scheduler.h"
#include "daemon/store.h"
#include "daemon/webhooks.h"
#include "proto/ftune.pb.h"

namespace ft {

struct DaemonOptions {
  int64_t lease_ms = 10'000;     // no message for this long → the worker is lost
  int64_t heartbeat_ms = 1'000;  // what workers are told to use
  int64_t min_slot_ms = 60'000;  // no start on a worker whose slot ends sooner
  // Teams (daemon/fair_share.h): usage halves per half life; a job younger than min_runtime is
  // never preempted for another (ftd --fair-share-half-life, --min-runtime).
  int64_t fair_share_half_life_ms = 3'600'000;
  int64_t min_runtime_ms = 300'000;
  // A device-hour's price per pool (ftd --pool-price POOL=PRICE): it takes precedence over the
  // price its workers report (ft-worker --price). Every attempt's cost, and so every job's, team's
  // and pool's, is its device-seconds at the price in effect when it started (common/money.h).
  std::map<std::string, double> pool_prices;
  // Stalls (daemon_stalls.cc): a running job whose newest step is older than stall_factor times
  // its measured step interval, and at least stall_min_ms, is evented `stalled` once (ftd
  // --stall-factor, --stall-min-ms).
  double stall_factor = 10;
  int64_t stall_min_ms = 300'000;
  int64_t checkpoint_margin_ms = 5'000;  // slot end: stop at end − (1.5 × checkpoint time + margin)
  int64_t requeue_backoff_ms = 1'000;    // after a preemption; doubled per failure
  std::string data_dir;                  // logs/<job>.log live here
  // When non-empty, a job's paths (model, data, adapter init, output, chat
  // template) must lie under one of these directories (after resolving
  // symlinks and ".."); Submit refuses others with InvalidArgument.
  std::vector<std::string> allowed_roots;
  int64_t memory_sample_ms = 2'000;  // device memory of a running job's worker is stored this often
  // While the store is sticky-failed (disk full, read-only): how often a tick
  // tries Store::Recover.
  int64_t store_retry_ms = 2'000;
  // A hold of the daemon's lock longer than this is ftd's own stall (a slow
  // store commit, a long tick): every lease is extended by the hold's length.
  // So is a tick that starts later than this past its due time (below).
  int64_t stall_credit_after_ms = 500;
  // How often the caller runs Tick (ftd --tick-ms); 0: unknown (no tick is late). A tick that
  // starts more than stall_credit_after_ms after it was due (the period after the previous tick
  // started, or that tick's end if it ran longer) found ftd itself stalled (descheduled,
  // stopped, swapping): the lateness is credited to every lease like a stall of the lock.
  int64_t tick_ms = 0;
};

// Failures ftd handles without failing a job: each is logged and counted
// (Daemon::error_count; GET /metrics exports ftune_daemon_errors_total{what}).
enum class DaemonError {
  kLogWrite,   // a worker's log lines could not be appended to DATA_DIR/logs/<job>.log
  kPlanInput,  // after a restart, a running job's spec or model did not load (no planning input)
  kCount
};
struct DaemonErrorInfo {
  DaemonError error;
  const char* name;     // the `what` label in /metrics
  const char* meaning;  // one line, for /metrics' HELP and the docs
};
// One entry per DaemonError, in enum order.
const std::array<DaemonErrorInfo, static_cast<size_t>(DaemonError::kCount)>& DaemonErrorTable();

// Where the daemon sends commands for one connected worker.
class WorkerSink {
 public:
  virtual ~WorkerSink() = default;
  virtual void Send(const ftune::v1::DaemonCommand& cmd) = 0;
  // Another session registered this worker's id and replaced this one: end
  // the session telling the worker `reason` (the gRPC side finishes the stream
  // with ALREADY_EXISTS). Like Send, must not block or call back.
  virtual void Evict(const std::string& reason) { (void)reason; }

  // When (the daemon's monotonic clock, Daemon::MonotonicMs) the transport
  // handed ftd the message it is now processing, or 0. Set before the message
  // waits for ftd's lock, so a message that arrived but waits behind a busy
  // daemon keeps its worker's lease: that wait is ftd's, not the worker's.
  std::atomic<int64_t> arrived_mono_ms{0};

 private:
  friend class Daemon;
  // The quiet-heartbeat path's state for this stream (see Daemon::OnWorkerMessage), kept by the
  // Daemon: armed and last_applied are written under the daemon's lock and this mutex; the
  // stamps by a quiet heartbeat under this mutex alone, and read (and cleared) by the daemon
  // under both. Lock order: Daemon::mu_ → Quiet::mu.
  struct Quiet {
    std::mutex mu;
    bool armed = false;                        // the session holding this sink is alive (ftd's mirror)
    std::string last_applied;                  // the last heartbeat ftd applied from this stream, serialized
    int64_t sample_due_mono = 0;               // when its device-memory sample is next due
    int64_t heard_mono = 0, heard_credit = 0;  // the newest quiet heartbeat: arrival, stall credit then
    int64_t seen_wall_ms = 0;                  // and its wall time for FlushSeen (0: none since)
  };
  Quiet quiet_;
};

// Who asks for a state change (recorded on the job and in its events): a user and its team;
// "" = unnamed (tests, an open ftd's callers are "local").
struct Actor {
  std::string user;
  std::string team;
  // " by <user>" for an event's text ("" without a user).
  std::string By() const { return user.empty() ? "" : " by " + user; }
};

// What SetTeam changes of a team; unset fields keep their value.
struct TeamChange {
  std::optional<int64_t> quota_devices;  // devices its jobs run on at once without borrowing; -1: none
  std::optional<double> weight;          // fair-share weight, > 0
  std::optional<int64_t> max_queued;     // jobs it may have queued at once; -1: none
  std::optional<double> budget;          // what its jobs may cost in all; negative: none
};

// A user as ftd shows it (never its token).
// A team as ftd shows it: its policy and what it uses now (ListTeams).
struct TeamInfo {
  std::string name;
  int64_t quota_devices = -1;
  double weight = 1;
  int64_t running_devices = 0;
  int64_t borrowed_devices = 0;
  int64_t queued_jobs = 0;
  int64_t max_queued = -1;          // -1: no cap
  double usage_device_seconds = 0;  // decayed
  double fair_share = 0;            // weight over the weights of the teams with work
  double spend = 0;                 // what its jobs' attempts cost so far (running ones up to now)
  std::optional<double> budget;     // nullopt: none
};

struct UserInfo {
  std::string name, team, role;
  int64_t created_ms = 0;
};

class Daemon {
 public:
  // A registration or heartbeat listing more devices is refused (InvalidArgument) or ignored.
  static constexpr int kMaxWorkerDevices = 64;

  Daemon(std::unique_ptr<Store> store, const Clock* clock, DaemonOptions options);
  // OK when the state was loaded from the store; otherwise the daemon must not
  // serve (it would refuse every running attempt and never place a queued job).
  const Status& startup_status() const { return startup_; }
  // The daemon's monotonic clock (leases are measured on it).
  int64_t MonotonicMs() const { return clock_->MonotonicMs(); }

  // ---- client API (InvalidArgument/NotFound/FailedPrecondition map to gRPC codes)
  // The job is `by`'s: Job.submitted_by and Job.team, and its "queued" event names them.
  StatusOr<ftune::v1::SubmitReply> Submit(const ftune::v1::SubmitRequest& req, const Actor& by = {});
  // The job with its goodput and its newest objective metrics (Job.objective_metrics).
  StatusOr<ftune::v1::Job> GetJob(const std::string& id);
  // `team`: only that team's jobs (nullopt = every team's).
  StatusOr<ftune::v1::ListJobsReply> ListJobs(const ftune::v1::ListJobsRequest& req,
                                              const TeamScope& team = std::nullopt);
  // A page of jobs, newest first (Store::ListJobsNewest: states, id/name
  // substring, limit): only the page's rows are read and converted.
  StatusOr<std::vector<ftune::v1::Job>> ListJobsNewest(const std::vector<JobStateCode>& states,
                                                       const std::string& contains, int64_t limit,
                                                       const TeamScope& team = std::nullopt);
  // The "cancelled" event names `by` when it has a user.
  StatusOr<ftune::v1::Job> Cancel(const std::string& id, const Actor& by = {});
  StatusOr<ftune::v1::ListWorkersReply> ListWorkers();
  // `team`: as Store::ListEvents (the caller checks a job_id's team).
  StatusOr<ftune::v1::ListEventsReply> ListEvents(const ftune::v1::ListEventsRequest& req,
                                                  const TeamScope& team = std::nullopt);

  // ---- users (daemon/authorization.h; the caller checks that `by` may manage users)
  // Each change is an event (user_added, user_removed, user_token) naming `by` and the user.
  // AddUser and RotateUserToken return the new token (shown once; only its salted HMAC is
  // stored). InvalidArgument for a bad name, team or role; FailedPrecondition for an existing
  // name; NotFound for an unknown user. A removed or replaced token stops resolving at once.
  StatusOr<std::string> AddUser(const Actor& by, const std::string& name, const std::string& team,
                                const std::string& role);
  Status RemoveUser(const Actor& by, const std::string& name);
  StatusOr<std::string> RotateUserToken(const Actor& by, const std::string& name);
  StatusOr<std::vector<UserInfo>> ListUsers();

  // ---- teams (daemon_teams.cc; the caller checks that `by` may set them)
  // Changes what `change` sets of the team (the rest keeps its value; a new team has no quota,
  // weight 1, no cap and no budget). A team_set event names `by`. Applies from the next scheduling
  // pass; while a team has max_queued jobs queued, or its spend has reached its budget, Submit
  // refuses its users' jobs (FailedPrecondition, naming the limit and the fix). InvalidArgument for
  // a bad name or value.
  Status SetTeam(const Actor& by, const std::string& name, const TeamChange& change);
  // Every team with a policy, usage, or a queued or running job, by name.
  StatusOr<std::vector<TeamInfo>> ListTeams();

  // ---- webhooks (daemon_webhooks.cc, daemon/webhooks.h; the caller checks that `by` may manage
  // them; daemon/webhook_sender.h delivers)
  // Adds `hook` (its url, events, team or user, and secret: "" = a random one); returns it as
  // stored, with its id and secret (shown once). A webhook_added event names `by`.
  // InvalidArgument naming the field for a bad URL, kind, team or user, or both a team and a user.
  StatusOr<WebhookRow> AddWebhook(const Actor& by, WebhookRow hook);
  // NotFound for an unknown id. Its pending deliveries go; a webhook_removed event names `by`.
  Status RemoveWebhook(const Actor& by, const std::string& id);
  // Every webhook, secrets blanked, and *pending (may be null): its deliveries not yet made.
  StatusOr<std::vector<WebhookRow>> ListWebhooks(std::map<std::string, int64_t>* pending = nullptr);
  // An event of `job_id` ("" = none) from outside the daemon (a webhook delivery given up):
  // stored and published like the daemon's own.
  void RecordEvent(const std::string& job_id, const std::string& kind, const std::string& message,
                   int64_t step);
  WebhookCounters& webhook_counters() { return webhook_counters_; }
  // DATA_DIR/logs/<job_id>.log; InvalidArgument (common/ids.h) for a malformed
  // id, so no caller can make it name a file elsewhere.
  StatusOr<std::string> LogPath(const std::string& job_id) const;

  // Live updates: `fn` is called (from any thread, with no daemon lock held)
  // for every event, metric point and job summary change of `job_id` ("" = all).
  int64_t Subscribe(const std::string& job_id, std::function<void(const ftune::v1::JobUpdate&)> fn);
  void Unsubscribe(int64_t id);

  // ---- worker sessions
  // The first message of a session. Reattaches running attempts the worker
  // reports, refuses superseded ones, requeues ones the worker lost.
  // InvalidArgument for an implausible report (memory, more than
  // kMaxWorkerDevices devices); FailedPrecondition naming the id when another
  // instance holds the id's live session (see Binding above).
  Status OnRegister(const ftune::v1::Register& reg, WorkerSink* sink);
  // Any later message. Messages for a superseded epoch are refused. A quiet
  // heartbeat is handled without the daemon's lock (see Thread safety above): one
  // without progress or a notice, byte for byte the last heartbeat ftd applied
  // from this stream (so the same slot end, devices and host memory), of a live
  // session, whose device-memory sample (options().memory_sample_ms) is not due.
  void OnWorkerMessage(const std::string& worker_id, WorkerSink* sink, const ftune::v1::WorkerMessage& msg);
  // The session ended (the lease keeps running: a quick reconnect loses nothing).
  void OnDisconnect(const std::string& worker_id, WorkerSink* sink);

  // ---- the periodic duties: leases, slot ends, then one scheduling pass.
  // While the store is sticky-failed a tick changes nothing (nothing could be
  // recorded): no placement, no lease decisions. Every store_retry_ms it tries
  // Store::Recover; once that succeeds the daemon reloads its state from the
  // store (as at startup) and asks every connected worker to register again,
  // so what happened meanwhile (exits, checkpoints, attempts still running)
  // is reconciled as after a daemon restart.
  void Tick();

  const DaemonOptions& options() const { return options_; }
  // Time spent handling each worker message, and each Tick().
  const LatencyHistogram& message_latency() const { return message_latency_; }
  // Heartbeats handled without the daemon's lock (quiet: see OnWorkerMessage), of
  // message_latency().count() worker messages in all.
  int64_t quiet_heartbeats() const { return quiet_heartbeats_.load(); }
  const LatencyHistogram& tick_latency() const { return tick_latency_; }
  // Scheduling passes run so far (a tick runs one only when its inputs changed: ScheduleQueued,
  // or kFullPassMs after the last).
  int64_t scheduling_passes() const { return passes_.load(); }
  static constexpr int64_t kFullPassMs = 10'000;
  // Measured checkpoint write times (as committed), and the time from a job's
  // preemption or worker loss to its next attempt starting.
  const LatencyHistogram& checkpoint_seconds() const { return checkpoint_seconds_; }
  const LatencyHistogram& recovery_seconds() const { return recovery_seconds_; }
  // Device-seconds of the attempts ended since ftd started, by goodput category (daemon/goodput.h).
  GoodputSplit goodput_total() {
    Held lock(this);
    return goodput_total_;
  }
  // By pool: every ended attempt's seconds, how many ended preempted and their goodput: M of
  // checkpoint.every auto is MeanTimeBetweenPreemptions of the pool's (engine/job/checkpoint_interval.h).
  std::map<std::string, Store::AttemptTotals> attempt_history() {
    Held lock(this);
    return history_;
  }
  // The pools of the live workers, with how many are alive in each.
  std::map<std::string, int64_t> live_pools();
  // The sum of ftd's own stalls credited to the leases (see DaemonOptions::stall_credit_after_ms).
  int64_t stall_ms_total() const { return stall_credit_ms_.load(); }
  Store& store() { return *store_; }
  // How often `e` happened since ftd started (see DaemonError).
  int64_t error_count(DaemonError e) const { return errors_[static_cast<size_t>(e)].load(); }

  // The planner's predicted device bytes for the job's newest attempt's plan
  // (micro-batch and device kind of that attempt); 0 before any attempt.
  // NotFound for an unknown job; the planning error when its spec or model
  // no longer loads.
  StatusOr<int64_t> PredictedBytes(const std::string& job_id);
  // OK while the store accepts writes; its sticky error otherwise. Checks
  // first that the database's files are still the ones ftd has open
  // (Store::CheckFiles: a deleted or replaced -wal makes ftd refuse writes
  // until it has saved what it acknowledged and reopened the database).
  Status Ready();
  // Submits waiting for their group commit, the one committing included (tests make a batch with it).
  size_t submits_queued() {
    std::lock_guard<std::mutex> lock(submit_mu_);
    return submit_queue_.size();
  }

 private:
  struct Session {
    WorkerSink* sink = nullptr;  // nullptr while disconnected
    int64_t last_message_mono = 0;
    int64_t credit_at_message = 0;  // stall_credit_ms_ then: ftd's stalls since are not the worker's
    int64_t seen_wall_ms = 0;       // a heartbeat's time not yet in the store (0: none; FlushSeen)
    bool alive = false;
    bool draining = false;
    int64_t slot_end_ms = 0;
    std::vector<DeviceRow> devices;  // as last reported (used memory included)
    std::string running_job;         // at most one attempt per worker
    int64_t running_epoch = 0;
    double checkpoint_seconds = 0;  // last measured write time
    bool stop_sent = false;
    int64_t last_memory_sample_mono = 0;  // when device memory was last stored
    int64_t host_total_bytes = 0;         // the node's host memory as last reported (0 = unknown)
    int64_t host_free_bytes = 0;
    std::string address;  // where other ranks reach ranks on this worker
    int32_t rendezvous_port_first = 0, rendezvous_port_count = 0;
    std::string memory_problem;    // the last implausible memory report (evented once per change)
    std::string pool = "default";  // ft-worker --pool
    double price = 0;              // ft-worker --price (per device-hour; 0 = none)
    std::string instance;          // Register.instance of the registration it holds ("" = unknown)
    std::string hostname;          // and its hostname
    int64_t refusals = 0;          // reports and registrations refused for it (events are rate-limited)
  };
  // Who may report on a running attempt (see Binding above): where ftd started each rank and its
  // credential. A cache of the attempt's row (made at its start, read back after a restart).
  struct Binding {
    int64_t epoch = 0;
    std::vector<std::string> workers;      // by rank
    std::vector<std::string> credentials;  // by rank; secrets
  };
  // The running attempt of a multi-rank job.
  struct Gang {
    int64_t epoch = 0;
    std::vector<std::string> workers;  // by rank
    std::vector<int> ended;            // by rank: -1 while it runs, else the outcome it reported
    int64_t first_end_mono = 0;        // when a rank first ended (0: none has)
    std::string first_reason;          // and why
    int64_t first_end_credit = 0;      // stall_credit_ms_ then (ftd's stalls since are not the ranks')
  };

  // The daemon's lock, held. A hold longer than options_.stall_credit_after_ms
  // is ftd's own stall (a slow store commit, a long tick): when it ends it is
  // credited to every lease (CreditStall), so a worker whose messages waited
  // meanwhile is not declared lost for it.
  class Held {
   public:
    explicit Held(Daemon* d) : d_(d), lock_(d->mu_), since_mono_(d->clock_->MonotonicMs()) {}
    ~Held() {
      if (lock_.owns_lock()) d_->CreditStall(since_mono_);
    }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    void Unlock() {
      d_->CreditStall(since_mono_);
      lock_.unlock();
    }

   private:
    Daemon* d_;
    std::unique_lock<std::mutex> lock_;
    int64_t since_mono_;
  };

  // REQUIRES: mu_ held (for all below).
  // Ends a hold of mu_ that began at `since_mono`: a stall is added to
  // stall_credit_ms_ and logged as ftd's.
  void CreditStall(int64_t since_mono);
  // A message (or registration) from the session's worker: its lease starts again.
  void Heard(Session& s);
  // The quiet path: true when `msg` is a quiet heartbeat of the stream of `sink`
  // (see OnWorkerMessage), now stamped in the sink. REQUIRES: mu_ not held.
  bool TryQuietHeartbeat(WorkerSink* sink, const ftune::v1::WorkerMessage& msg);
  // After a heartbeat applied under mu_: what the next one is compared with, and
  // whether it may be quiet at all (the session alive with this sink, its memory plausible).
  void ArmQuiet(Session& s, const ftune::v1::Heartbeat& hb);
  // Folds the session's sink's quiet stamps into the session (the newer hearing
  // wins, with its own credit; the seen time for FlushSeen). REQUIRES: the sink's
  // Quiet::mu held, s.sink set.
  static void FoldQuiet(Session& s);
  // FoldQuiet under the sink's mutex; `disarm`: the sink's heartbeats take the locked path from now on.
  static void AbsorbQuiet(Session& s, bool disarm);
  // Whether the session's lease has run out at `now` (folding its quiet stamps
  // first); if so its sink is disarmed in the same hold of the sink's mutex.
  // *silent and *ftd_stalled: the silence and ftd's stalls within it.
  bool LeaseRunOut(Session& s, int64_t now, int64_t credit_now, int64_t* silent, int64_t* ftd_stalled);
  // A tick that starts late (DaemonOptions::tick_ms) credits its lateness like a stall.
  // `start_mono`: when this tick was entered, before it waited for the lock.
  void CreditTickLateness(int64_t start_mono);
  // Running attempts and queued jobs from the store into the scheduler's
  // state (the constructor; again after the store recovered). Error: the
  // store could not be read.
  Status LoadState();
  // After Store::Recover: forgets what was derived from writes that may have
  // failed, reloads it and sends every connected worker Reregister.
  void ReloadFromStore();
  // True when the store accepts writes (after a successful Recover, if it was
  // sticky-failed); false while it does not (see Ready()).
  bool RetryStore();
  Status EnsurePlanInput(const JobRow& job);
  // How long a checkpoint of the job should take before one was measured on
  // its worker: the job's last measured write, else an estimate from its size.
  double EstimateCheckpointSeconds(const std::string& job_id);
  void ExpireLeases();
  // Stores every session's heartbeat time since the last flush, in one transaction.
  void FlushSeen();
  void StopForSlotEnds();
  // How long the job `s` runs takes to checkpoint and stop: 1.5 x its last measured (else estimated)
  // checkpoint write.
  int64_t CheckpointStopMs(const Session& s);
  // Teams: advances team_usage_ to now; the pass's policies and usage; what a pass sees of the job
  // a worker runs (nullopt: none, or not known: never preempted); stops a victim a pass chose.
  // AccrueTeamUsage returns the devices each team's running jobs hold now; it runs whenever they
  // change (after a pass's placements, when an attempt ends), so usage is exact between changes.
  std::map<std::string, int64_t> AccrueTeamUsage();
  std::string TeamOf(const std::string& job_id) const;  // its JobView's team ("" when none is kept)
  FairShareInput TeamsForPass();
  // InvalidArgument naming the team and the field for a bad name or value.
  static Status CheckTeamChange(const std::string& name, const TeamChange& c);
  // team_usage_ from the attempts in the store (ftd's start, a reload after the store recovered).
  Status RebuildTeamUsage();
  // Money (common/money.h): a device-hour's price on a worker of `pool` that reported `own_price`
  // (ftd's price for the pool, else its own); what each team's jobs cost so far (ended attempts,
  // and running ones up to now), in one pass over the running jobs.
  double PriceIn(const std::string& pool, double own_price) const;
  std::map<std::string, double> SpendByTeam() const;
  std::optional<RunningView> RunningViewOf(const std::string& worker_id, const Session& s) const;
  void Preempt(const Preemption& p);
  bool StoppedForAnotherJob(const std::string& job_id) const;
  void ScheduleQueued();
  // ScheduleQueued's inputs: a digest of the queue's version and every session field a pass
  // reads; and the next time a pass's answer can change with nothing else changing (a backoff
  // ending or counting down, a slot end coming within min_slot_ms; at most kFullPassMs away).
  uint64_t SchedulerInputs() const;
  int64_t NextTimedChange(int64_t now_wall_ms, bool backing_off) const;
  void StartOn(const JobRow& job, const Placement& p);
  // Fails a job that can never run (its spec or model no longer loads), with `reason`.
  void FailUnrunnable(const JobRow& job, const std::string& reason);
  // Keeps queued_ and the job's plan input in step with `job` as just stored.
  void TrackState(const JobRow& job);
  // Takes the job out of queued_ and waiting_ (before its view changes or goes).
  void Unqueue(const std::string& job_id);
  // `lost`: ftd ends it for a loss, not on the attempt's own report (goodput, AttemptRow::lost).
  void EndRunning(const std::string& job_id, int64_t epoch, AttemptOutcomeCode outcome,
                  const std::string& reason, int64_t exit_step, bool lost = false);
  // The gang of (job, epoch) ended: refuses its ranks still running and frees its workers.
  void ReleaseGang(const std::string& job_id, int64_t epoch, const std::string& reason);
  // One rank of a gang reported its exit: ends the attempt when that decides it.
  void OnRankExited(const std::string& worker_id, Session& s, Gang& g, const ftune::v1::AttemptExited& e);
  // Ends gangs whose ranks did not all follow the first one to end within two leases.
  void ExpireGangs();
  void TrackGang(const AttemptRow& a);
  bool IsCurrent(const std::string& job_id, int64_t epoch);
  // The rank's credential: HMAC-SHA256 of (job, epoch, rank) under the store's attempt key (made
  // and stored on first use). The store's error when the key can be neither read nor made.
  StatusOr<std::string> Credential(const std::string& job_id, int64_t epoch, int rank);
  // The binding of attempt `a` (cached); nullptr when a credential cannot be made.
  const Binding* Bind(const AttemptRow& a);
  // The binding of the current attempt (job, epoch), from the cache or the store; nullptr when it
  // cannot be read. REQUIRES: IsCurrent(job_id, epoch).
  const Binding* BindingOf(const std::string& job_id, int64_t epoch);
  // Whether the report `what` about rank `rank` of the current attempt (job, epoch) may be applied:
  // it comes from that rank's worker with its credential. Otherwise an event naming the reporting
  // worker (rate-limited per session) and, unless that worker is the rank's own, a Refused to it.
  bool Accept(const std::string& worker_id, Session& s, const std::string& what, const std::string& job_id,
              int64_t epoch, int rank, const std::string& credential);
  // A "refused" event (logged) about session `s` of `worker_id`: the first ten, then one in a thousand.
  void RefusalEvent(const std::string& worker_id, Session& s, const std::string& job_id,
                    const std::string& message, int64_t step);
  // Asks the session's running attempt to checkpoint and stop. REQUIRES: s.sink.
  void SendStop(Session& s, int64_t deadline_ms, const std::string& reason);
  void Refuse(WorkerSink* sink, const std::string& job_id, int64_t epoch, const std::string& why);
  // A user management event, committed and published.
  void UserEvent(const std::string& kind, const std::string& message);
  void Event(const std::string& job_id, const std::string& worker_id, const std::string& kind,
             const std::string& message, int64_t step);
  bool HasSubscribers();  // takes subs_mu_
  void PublishJob(const std::string& job_id);
  // Publishes the events the store wrote itself for a job (the "queued" of a new job).
  void PublishStoredEvents(const std::string& job_id);
  void Publish(const std::string& job_id, const ftune::v1::JobUpdate& update);
  // Releases `lock` (on mu_) and delivers pending_updates_, in order across threads.
  void ReleaseAndPublish(Held& lock);
  StatusOr<ftune::v1::Job> ToProto(const JobRow& job);
  // Every ended attempt's seconds and preemptions: M of checkpoint.every auto, handed to each
  // attempt (loaded at start, added to as attempts end).
  std::map<std::string, Store::AttemptTotals> history_;        // by pool
  std::map<std::string, Store::AttemptTotals> worker_totals_;  // by (rank 0's) worker: its ended attempts
  GoodputSplit goodput_total_;  // of the attempts ended since ftd started (/metrics)
  // job id → when a preemption notice reached a worker running it (the earliest; kept with the
  // attempt it ends, then dropped).
  std::map<std::string, int64_t> notices_;
  void NoticeFor(const std::string& job_id, int64_t notice_ms) {
    auto [it, added] = notices_.emplace(job_id, notice_ms);
    if (!added) it->second = std::min(it->second, notice_ms);
  }
  // EndRunning's record of the attempt's end: its last step (*exit_step, raised to the steps it
  // forwarded), steps lost past `committed` (returned), loss and notice, M's history, /metrics.
  int64_t StoreAttemptEnd(const std::string& job_id, int64_t epoch, AttemptOutcomeCode outcome,
                          const std::string& reason, int64_t committed, bool lost, int64_t* exit_step);
  // The job's goodput from its stored attempts, step times and checkpoints (daemon/goodput.h).
  StatusOr<JobGoodput> GoodputOf(const JobRow& job);
  // `out` (ToProto of `job`) with its goodput filled in. Reads only the store and the clock:
  // callers need not (and should not) hold the daemon's lock.
  Status AddGoodput(const JobRow& job, ftune::v1::Job* out);
  // OnRegister's steps. AdoptSession: the session takes the registration's
  // facts and the worker's row is stored (its error when the store refuses
  // the row); an older session holding the id is evicted.
  Status AdoptSession(const ftune::v1::Register& reg, WorkerSink* sink, Session& s);
  // Reattaches the current attempts the worker reports and refuses
  // superseded ones; returns the (job, rank) pairs reattached and adds their
  // jobs to *reported.
  std::set<std::pair<std::string, int>> ReattachReported(const ftune::v1::Register& reg, WorkerSink* sink,
                                                         Session& s, std::set<std::string>* reported);
  // Ends as lost every running attempt (rank) the store places on `worker_id`
  // that the worker did not report and whose exit is not known.
  void EndUnreported(const std::string& worker_id,
                     const std::set<std::pair<std::string, int>>& reported_ranks);
  void OnHeartbeat(const std::string& worker_id, Session& s, const ftune::v1::Heartbeat& hb);
  // Empty when the reported devices (at most kMaxWorkerDevices) and their and the host's memory
  // are plausible (0 <= free <= total <= 1 PiB, 0 <= used <= total); else what is wrong, naming
  // the worker and field.
  static std::string ImplausibleMemory(const std::string& worker_id,
                                       const google::protobuf::RepeatedPtrField<ftune::v1::Device>& devices,
                                       int64_t host_total, int64_t host_free);
  // Stores the heartbeat's device memory (throttled to options_.memory_sample_ms per worker).
  void RecordDeviceMemory(const std::string& worker_id, Session& s, const ftune::v1::Heartbeat& hb);
  void OnCheckpoint(const std::string& worker_id, Session& s, const ftune::v1::CheckpointCommitted& c);
  // Empty when the checkpoint directory lies in the job's output.dir (resolved); else why not.
  std::string CheckpointOutsideOutput(const std::string& job_id, const std::string& dir);
  void OnExited(const std::string& worker_id, Session& s, const ftune::v1::AttemptExited& e);
  // An accepted exit report of the current attempt: ends it (or the rank of a gang).
  void ApplyExit(const std::string& worker_id, Session& s, const ftune::v1::AttemptExited& e);
  void OnMetrics(const std::string& worker_id, Session& s, const ftune::v1::MetricsReport& m);
  void OnLog(const std::string& worker_id, Session& s, const ftune::v1::LogReport& l);
  void OnNote(const std::string& worker_id, Session& s, const ftune::v1::AttemptNote& n);
  // An attempt whose outcome is unknown (worker lost or restarted without it):
  // a completed output of this job's math makes the job SUCCEEDED; otherwise
  // the newest checkpoint ahead of the committed one becomes the resume point
  // and the attempt ends preempted with `reason`.
  void EndLostAttempt(const std::string& job_id, int64_t epoch, const std::string& reason, int64_t step);
  // The newest checkpoint under `output_dir` ahead of the job's committed one that is of its math
  // (`hash`, a readable state and manifest) becomes its resume point: a "reconciled" event saying
  // `reason` and where it was found. None: nothing changes.
  void AdoptCheckpointAhead(const std::string& job_id, const std::string& output_dir, const std::string& hash,
                            const std::string& reason);
  // A worker's journaled exit comes in its Register, ahead of the checkpoint reports the worker still
  // queues (they follow the registration): the checkpoints the attempt wrote are read from
  // output.dir first, so a stop that checkpointed while ftd was away loses no step.
  void AdoptCheckpointsBeforeReplayedExit(const ftune::v1::AttemptExited& e);
  // Reports an internal store failure loudly (the store is sticky-failed after one).
  void Check(const Status& s, const char* what);
  void Count(DaemonError e) { errors_[static_cast<size_t>(e)].fetch_add(1); }

  std::unique_ptr<Store> store_;
  const Clock* clock_;
  Status startup_;
  LatencyHistogram message_latency_;
  LatencyHistogram tick_latency_;
  LatencyHistogram checkpoint_seconds_;
  LatencyHistogram recovery_seconds_;
  DaemonOptions options_;
  std::array<std::atomic<int64_t>, static_cast<size_t>(DaemonError::kCount)> errors_{};

  std::mutex mu_;
  std::map<std::string, Session> sessions_;     // GUARDED_BY(mu_) worker id →
  std::map<std::string, JobView> plan_inputs_;  // GUARDED_BY(mu_) job id → planning input
  // GUARDED_BY(mu_) a queued job's view (in plan_inputs_) → the reason it waits, as last published.
  std::unordered_map<const JobView*, WaitReason> waiting_;
  PlacementClasses placement_classes_;               // GUARDED_BY(mu_) every planning input's class
  std::map<std::string, int64_t> interrupted_mono_;  // GUARDED_BY(mu_) job id → when it was preempted
  struct Subscriber {
    std::string job_id;
    std::function<void(const ftune::v1::JobUpdate&)> fn;
  };
  std::mutex publish_mu_;  // lock order: mu_ → publish_mu_ → subs_mu_
  std::mutex subs_mu_;
  std::map<int64_t, Subscriber> subscribers_;          // GUARDED_BY(subs_mu_)
  int64_t next_subscriber_ = 1;                        // GUARDED_BY(subs_mu_)
  std::vector<ftune::v1::JobUpdate> pending_updates_;  // GUARDED_BY(mu_) delivered after mu_ is released
  // The scheduler's input, kept in step with the store so a tick reads no
  // rows: the ids of QUEUED jobs (plan_inputs_ holds their views) and the
  // epoch of each job's running attempt (fencing without a query).
  std::set<const JobView*, QueueOrder> queued_;  // GUARDED_BY(mu_) views in plan_inputs_
  std::atomic<int64_t> passes_{0};               // written under mu_
  int64_t queue_version_ = 0;      // GUARDED_BY(mu_) bumped by every change of queued_ or a view in it
  uint64_t last_pass_inputs_ = 0;  // GUARDED_BY(mu_) SchedulerInputs() after the last pass
  // Teams: policies (the store's teams table, kept by SetTeam), decayed usage (rebuilt from the
  // attempts' spans when ftd starts: RebuildTeamUsage) and when it was last advanced (monotonic; 0:
  // never).
  std::map<std::string, TeamPolicy> team_policies_;  // GUARDED_BY(mu_)
  std::map<std::string, TeamUsage> team_usage_;      // GUARDED_BY(mu_)
  // Each team's limits on submits (the teams table) and what its jobs' ended attempts cost (the
  // store's sum at start, then added to as attempts end), by team.
  struct TeamLimits {
    int64_t max_queued = -1;
    std::optional<double> budget;
  };
  std::map<std::string, TeamLimits> team_limits_;  // GUARDED_BY(mu_)
  std::map<std::string, double> ended_spend_;      // GUARDED_BY(mu_)
  int64_t usage_mono_ = 0;                         // GUARDED_BY(mu_)
  // What the scheduler needs of each running job beyond its JobView, by job id: made when an
  // attempt starts (or is found running at start), gone when it ends.
  struct RunningMeta {
    std::map<std::string, int64_t> devices_on;  // worker id → devices (ranks) it holds there
    bool borrowed = false;                      // placed beyond its team's quota
    int64_t started_wall_ms = 0;
    int64_t last_checkpoint_wall_ms = 0;  // its last committed checkpoint (0: none this attempt)
    std::string preempted_for;            // the job it is being stopped for ("" = none)
    double price = 0;                     // per device-hour (AttemptRow::price)
    // Attempt `a`'s: one device per rank on its rank's worker, and its start.
    static RunningMeta Of(const AttemptRow& a, bool borrowed);
    int64_t devices() const;  // in all
  };
  std::map<std::string, RunningMeta> running_meta_;  // GUARDED_BY(mu_)
  std::vector<const JobView*> queue_order_;          // GUARDED_BY(mu_) queued_ as a vector, at its version:
  int64_t queue_order_version_ = -1;                 // GUARDED_BY(mu_)
  int64_t next_pass_wall_ms_ = 0;                    // GUARDED_BY(mu_) NextTimedChange of the last pass
  std::map<std::string, int64_t> running_epoch_;     // GUARDED_BY(mu_) job id → epoch
  OutputDirs output_dirs_;                           // GUARDED_BY(mu_) every job's output.dir → its id
  std::map<std::string, Gang> gangs_;         // GUARDED_BY(mu_) job id → its running multi-rank attempt
  std::map<std::string, Binding> bindings_;   // GUARDED_BY(mu_) job id → its (last) attempt's binding
  std::string attempt_key_;                   // GUARDED_BY(mu_) Store::AttemptKey ("" until first used)
  int64_t store_retry_mono_ = 0;              // GUARDED_BY(mu_) when Recover was last tried
  std::string last_store_error_;              // GUARDED_BY(mu_) logged once, not per heartbeat
  std::atomic<int64_t> stall_credit_ms_{0};   // written under mu_: ftd's stalls so far (CreditStall)
  std::atomic<int64_t> quiet_heartbeats_{0};  // handled without mu_ (TryQuietHeartbeat)
  // When the previous tick started and ended (monotonic; 0 before the first): CreditTickLateness.
  std::atomic<int64_t> last_tick_start_mono_{0}, last_tick_end_mono_{0};
  std::set<std::string> log_write_failing_;  // GUARDED_BY(mu_) jobs whose last log append failed

  // Stalls (daemon_stalls.cc): each running job's step progress as its heartbeats report it.
  struct StallWatch {
    int64_t epoch = 0;
    int64_t first_step = -1, first_mono = 0;  // the attempt's first step seen, and when
    int64_t last_step = -1, last_mono = 0;    // its newest step, and when it was first seen
    bool stalled = false;                     // evented; again only after a step
  };
  std::map<std::string, StallWatch> stall_watch_;    // GUARDED_BY(mu_) running job id →
  std::map<std::string, int64_t> step_interval_ms_;  // GUARDED_BY(mu_) job id → its last measured ms per step
  // A heartbeat's progress of the current attempt (job, epoch): its step and when it advanced.
  void WatchProgress(const std::string& job_id, int64_t epoch, int64_t step);
  // The tick's check: events `stalled` for each running job past its bound (see DaemonOptions).
  void CheckStalls();
  // The job's expected ms per step: this attempt's so far, else its previous attempt's; 0: unknown.
  int64_t StepIntervalMs(const std::string& job_id, const StallWatch& w) const;
  WebhookCounters webhook_counters_;

  // Group commit: concurrent submits are written in one transaction (one
  // fsync) by whichever is first in the queue (LevelDB's writer queue).
  struct PendingSubmit {
    JobRow row;
    JobView view;
    std::string file;        // its job.yaml, for messages
    std::string output_key;  // OutputDirKey of its output.dir
    bool done = false;
    Status status;
    ftune::v1::SubmitReply reply;
  };
  // Writes `batch` to the store and fills in each one's result. REQUIRES: not mu_.
  void CommitSubmits(const std::vector<PendingSubmit*>& batch);
  // The submits of `batch` whose team is within its limits (fewer than max_queued jobs queued, the
  // batch's earlier ones counted; spend below its budget); the others get their refusal
  // (FailedPrecondition). REQUIRES: mu_.
  std::vector<PendingSubmit*> AdmitTeamLimits(const std::vector<PendingSubmit*>& batch);
  // One job per output.dir: the submits of `batch` whose output.dir overlaps
  // another job's (stored, or earlier in the batch, unless it is the same
  // client_request_id: an idempotent resubmit) get InvalidArgument naming
  // that job; returns the others. *siblings: for each refused one, the batch
  // index of the submit it lost to (-1 for a stored job). REQUIRES: mu_.
  std::vector<PendingSubmit*> AdmitOutputDirs(const std::vector<PendingSubmit*>& batch,
                                              std::map<PendingSubmit*, PendingSubmit*>* siblings);
  // InvalidArgument: `p`'s output.dir overlaps `other_dir`, written by job `id` named `name`.
  static Status OutputDirTaken(const PendingSubmit& p, const std::string& other_dir, const std::string& id,
                               const std::string& name);
  std::mutex submit_mu_;
  std::condition_variable submit_cv_;
  std::deque<PendingSubmit*> submit_queue_;  // GUARDED_BY(submit_mu_)
};

}  // namespace ft
