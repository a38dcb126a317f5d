// The daemon's durable state in SQLite: jobs, attempts (with their epoch, the
// fencing token), workers and their devices, committed checkpoints, events
// and metrics.
//
// The database runs in WAL mode with synchronous=FULL: every method that
// changes state commits (fsynced) before it returns OK, so an acknowledged
// submit or state transition survives a crash. The exceptions are the
// heartbeat-rate writes (TouchWorkers, RecordProgress, device memory samples) and UpsertWorker:
// atomic but not fsynced, made durable by the next synced commit. The schema is versioned
// (PRAGMA user_version) and migrated forward on Open. After a failed write
// the store is "sticky-failed": every later write returns the same IOError
// (leveldb's rule: never carry on half-broken) until Recover() succeeds on a
// fresh connection. Only SQLite failures are sticky (they are IOErrors naming
// the database path and the operation); NotFound and InvalidArgument answers
// roll back and leave the store usable. Reads keep working on a sticky-failed
// store.
//
// Thread safety: all methods are safe to call from any thread (one internal
// mutex serialises them; SQLite is opened in serialized mode).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace ft {

namespace store_internal {
class Query;  // a cached prepared statement in use (store.cc)
}  // namespace store_internal

// States as stored (and as in proto JobState / AttemptOutcome).
enum class JobStateCode {
  kQueued = 1,
  kRunning = 2,
  kPreempted = 3,
  kSucceeded = 4,
  kFailed = 5,
  kCancelled = 6
};
enum class AttemptOutcomeCode {
  kRunning = 1,
  kFinished = 2,
  kPreempted = 3,
  kFailed = 4,
  kCancelled = 5,
  kSuperseded = 6,   // a newer epoch took output.dir
  kEnvironment = 7,  // failed for the environment: retried with backoff, not counted
  kBadInput = 9,     // the job's input is wrong: the job fails at once, whatever max_failures says
};

struct JobRow {
  std::string id;  // "j-000001"
  std::string name;
  JobStateCode state = JobStateCode::kQueued;
  std::string reason;
  int64_t priority = 0;
  std::string spec_yaml;  // as submitted
  std::string spec_dir;   // where relative paths resolve
  std::string client_request_id;
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  int64_t total_steps = 0;
  int64_t steps_done = 0;
  double last_loss = 0;
  double tokens_per_s = 0;
  int64_t preemptions = 0;
  int64_t failures = 0;
  int64_t max_failures = 3;
  std::string output_dir;
  int64_t not_before_ms = 0;  // requeue backoff: not placed before this time
  int64_t gpus = 1;
  std::string device;  // "auto" | "cuda" | "cpu"
  std::string
      submitted_by;  // the user who submitted it ("" before users existed; "admin" = the client token)
  std::string team;  // that user's team ("" = none: only identities of every team see it)
};

// Which teams' jobs a read covers: nullopt = every team's, else only this team's.
using TeamScope = std::optional<std::string>;

// A user of ftd (daemon/authorization.h says what each role may do). The token is
// never stored: token_id is its public part, token_hash = HMAC-SHA256(token_salt, token).
struct UserRow {
  std::string name;
  std::string team;
  std::string role;  // "admin" | "member" | "viewer"
  std::string token_id;
  std::string token_salt;
  std::string token_hash;
  int64_t created_ms = 0;
};

// A team's share of the cluster (schema 12; daemon/fair_share.h uses it).
struct TeamRow {
  std::string name;
  int64_t quota_devices = -1;    // devices its jobs may run on at once (nominal quota); -1: no quota
  double weight = 1;             // its fair-share weight
  int64_t max_queued = -1;       // jobs it may have queued at once; -1: no cap
  std::optional<double> budget;  // what its jobs may cost in all (the prices' currency); nullopt: no budget
  int64_t updated_ms = 0;
};

// A webhook (daemon/webhooks.h; schema 14): where ftd posts the events it subscribes to.
struct WebhookRow {
  std::string id;      // "wh-" + 8 random hex characters
  std::string url;     // http:// or https://
  std::string events;  // subscribed kinds, comma-separated ("succeeded,failed")
  std::string team;    // only this team's jobs ("" = any team)
  std::string user;    // only the jobs this user submitted ("" = anyone's)
  std::string secret;  // the key of its signature header; never shown after it is made
  std::string created_by;
  int64_t created_ms = 0;
  int64_t cursor = 0;  // events up to this seq were considered (queued when they matched)
};

// One event's delivery to one webhook, pending until delivered or given up.
struct WebhookDeliveryRow {
  std::string webhook_id;
  int64_t event_seq = 0;
  std::string body;  // the JSON posted, fixed when queued (the signature covers it)
  int64_t attempts = 0;
  int64_t next_ms = 0;  // wall clock: due from then
  std::string last_error;
};

// Where one rank of a multi-rank attempt runs: a worker and its device index.
struct RankSlot {
  std::string worker_id;
  int device = 0;
  bool operator==(const RankSlot&) const = default;
};

// An attempt's device-seconds by goodput category (daemon/goodput.h says what each holds).
// Money: a price per device-hour (ft-worker --price, ftd --pool-price) in one currency, whichever the
// operator chose (the docs and ftctl say "$"). 0: not priced.
struct GoodputSplit {
  double productive_s = 0, checkpoint_s = 0, restart_s = 0, lost_s = 0;  // device-seconds
  double total_s() const { return productive_s + checkpoint_s + restart_s + lost_s; }
  // productive ÷ all of it (1 when there is no device time yet).
  double goodput() const { return total_s() > 0 ? productive_s / total_s() : 1.0; }
  void Add(const GoodputSplit& o) {
    productive_s += o.productive_s;
    checkpoint_s += o.checkpoint_s;
    restart_s += o.restart_s;
    lost_s += o.lost_s;
  }
};

// What device time cost, split as its GoodputSplit (the same categories, in money).
struct CostSplit {
  double productive = 0, checkpoint = 0, restart = 0, lost = 0;
  double total() const { return productive + checkpoint + restart + lost; }
  double overhead() const { return checkpoint + restart; }  // checkpoints and restarts
  // `device` (device-seconds) at `price` per device-hour.
  static CostSplit Priced(const GoodputSplit& device, double price) {
    const double per_s = price / 3600.0;
    return {device.productive_s * per_s, device.checkpoint_s * per_s, device.restart_s * per_s,
            device.lost_s * per_s};
  }
  void Add(const CostSplit& o) {
    productive += o.productive;
    checkpoint += o.checkpoint;
    restart += o.restart;
    lost += o.lost;
  }
};

struct AttemptRow {
  std::string job_id;
  int64_t number = 0;
  int64_t epoch = 0;
  std::string worker_id;
  AttemptOutcomeCode outcome = AttemptOutcomeCode::kRunning;
  std::string reason;
  int64_t started_ms = 0;
  int64_t ended_ms = 0;
  int64_t start_step = 0;
  int64_t end_step = 0;
  int64_t steps_lost = 0;
  int64_t micro_batch = 0, accumulation = 0, world = 1;
  bool lost = false;      // ended by ftd for a loss (lease, lost rank), not by the attempt's own report
  int64_t notice_ms = 0;  // when a cloud preemption notice reached its worker (0 = none)
  std::string pool = "default";  // the pool of its (rank 0's) worker when it started
  double price = 0;              // per device-hour, fixed at its start (the mean over its ranks)
  std::string preempted_for;     // the job the scheduler asked it to stop for ("" = none)
  // Its device-seconds up to `now_ms` (its end once it ended): (end - start) x ranks.
  double DeviceSeconds(int64_t now_ms) const {
    const int64_t end = outcome == AttemptOutcomeCode::kRunning ? now_ms : ended_ms;
    return static_cast<double>(std::max<int64_t>(0, end - started_ms)) / 1000.0 *
           static_cast<double>(std::max<int64_t>(1, world));
  }
  // A multi-rank attempt: where each rank runs, by rank (rank 0's worker is
  // worker_id). Empty: one rank, on worker_id.
  std::vector<RankSlot> ranks;
  // The workers this attempt runs on (each once; worker_id first).
  std::vector<std::string> Workers() const {
    std::vector<std::string> out = {worker_id};
    for (const RankSlot& r : ranks)
      if (std::find(out.begin(), out.end(), r.worker_id) == out.end()) out.push_back(r.worker_id);
    return out;
  }
};

struct DeviceRow {
  int32_t index = 0;
  std::string kind;  // cuda | cpu
  std::string name;
  int64_t total_bytes = 0, free_bytes = 0, used_bytes = 0;
};

struct WorkerRow {
  std::string id;
  std::string hostname;
  std::string version;
  int64_t last_seen_ms = 0;  // wall clock, for display (leases use the daemon's monotonic clock)
  int64_t slot_end_ms = 0;
  bool alive = false;
  std::vector<DeviceRow> devices;
  std::string pool = "default";  // ft-worker --pool
  double price = 0;              // per device-hour, as the worker reported it (ft-worker --price; 0: none)
};

struct CheckpointRow {
  std::string job_id;
  int64_t epoch = 0;
  int64_t step = 0;
  std::string dir;
  std::string manifest_sha256;
  double write_seconds = 0;
  int64_t committed_ms = 0;
};

struct EventRow {
  int64_t seq = 0;  // assigned by the store, increasing
  int64_t time_ms = 0;
  std::string job_id;
  std::string worker_id;
  std::string kind;
  std::string message;
  int64_t step = 0;
};

// One device's memory at one time, while `job_id` ran on it.
struct DeviceMemoryRow {
  std::string job_id;
  int64_t time_ms = 0;
  std::string worker_id;
  int32_t device = 0;  // the device's index on its worker
  int64_t used_bytes = 0, total_bytes = 0;
};

// Whole-store counts for monitoring (Prometheus).
struct StoreTotals {
  std::map<JobStateCode, int64_t> jobs_by_state;  // every state present, also with 0
  int64_t attempts = 0;                           // attempts ever started
  int64_t preemptions = 0;                        // sum over jobs
  int64_t failures = 0;                           // sum over jobs
};

// A running attempt's progress, from a heartbeat.
struct ProgressRow {
  std::string job_id;
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t total_steps = 0;  // 0 = unchanged
  double loss = 0, tokens_per_s = 0;
  int64_t time_ms = 0;
};

struct MetricRow {
  std::string job_id;
  int64_t epoch = 0;
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
  int64_t peak_bytes = 0;
  int64_t time_ms = 0;
  // Mean token cross-entropy on data.eval at this step; NaN = none (NULL).
  double eval_loss = std::numeric_limits<double>::quiet_NaN();
  // Carries only eval_loss: merged into the step's row, whose training fields stay.
  bool eval_only = false;
  int64_t tokens_seen = 0;  // target tokens trained on up to this step; 0 = not reported
  // Wall time of the step and, of it, the wait for copy-stream transfers; NaN = not reported (NULL).
  double step_seconds = std::numeric_limits<double>::quiet_NaN();
  double copy_wait_seconds = std::numeric_limits<double>::quiet_NaN();
  // The objective's own means at this step by name (DPO's "rewards/margins" ...; NaN = not
  // finite); empty = none (SFT). Stored as a JSON object in the `objective` column.
  std::map<std::string, double> objective_metrics;
};

// What ftd keeps of a step's objective metrics: their names come from the
// trainer's metrics.jsonl, so they are untrusted. A name is kept when it is
// 1-kMaxObjectiveMetricName characters of [a-z0-9_/.] and starts with a letter
// (TRL's "rewards/chosen", "logps/rejected"); of those, the first
// kMaxObjectiveMetrics in name order. The others are dropped.
inline constexpr size_t kMaxObjectiveMetrics = 32;
inline constexpr size_t kMaxObjectiveMetricName = 64;
bool IsObjectiveMetricName(const std::string& name);
std::map<std::string, double> KeepObjectiveMetrics(const std::map<std::string, double>& metrics);

class Store {
 public:
  // Opens (creating and migrating) the database at `path`. IOError naming
  // the path when it cannot be opened or migrated; FailedPrecondition when
  // the file has a newer schema than this build knows; Corruption naming the
  // damage when PRAGMA quick_check finds a damaged page (checked at every open).
  static StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  int schema_version() const;

  // ---- jobs
  // Inserts a job with a new id (state QUEUED) and an event "queued" in one
  // transaction. created_ms/updated_ms default to the wall clock when 0. When
  // `job.client_request_id` is non-empty and already known, returns the
  // existing job and sets *duplicate (nothing is inserted). `duplicate` may
  // be null.
  StatusOr<JobRow> CreateJob(JobRow job, bool* duplicate);
  // CreateJob for many jobs in one transaction (one fsync: the daemon's group
  // commit of concurrent submits). All or nothing; (*duplicates)[i] tells
  // whether jobs[i] was already known by its client_request_id (may be null).
  StatusOr<std::vector<JobRow>> CreateJobs(std::vector<JobRow> jobs, std::vector<bool>* duplicates);
  StatusOr<JobRow> GetJob(const std::string& id);  // NotFound
  // All jobs in these states (empty = all), oldest first (created_ms, then
  // submission order). limit 0 = no limit.
  // `team`: only that team's jobs (nullopt = every team's).
  StatusOr<std::vector<JobRow>> ListJobs(const std::vector<JobStateCode>& states, int64_t limit = 0,
                                         const TeamScope& team = std::nullopt);
  // A page of jobs, newest first (created_ms, then submission order, both
  // descending): those in `states` (empty = all) whose id or name contains
  // `contains` (ASCII case-insensitive; "" = any), skipping `offset`, at most
  // `limit` (0 = no limit). One query that reads only the page's rows when
  // neither a state nor `contains` filters (the jobs_by_created index).
  StatusOr<std::vector<JobRow>> ListJobsNewest(const std::vector<JobStateCode>& states,
                                               const std::string& contains, int64_t limit, int64_t offset = 0,
                                               const TeamScope& team = std::nullopt);
  // Writes every mutable field of `job` (state, reason, counters, progress, not_before_ms ...):
  // all but id, client_request_id, created_ms, spec_yaml and spec_dir. NotFound for an unknown id.
  Status UpdateJob(const JobRow& job);

  // ---- attempts
  // Starts attempt number n+1 with epoch = (the job's highest epoch) + 1; returns it
  // (outcome RUNNING, end_step = start_step). `ranks`: where each rank of a
  // multi-rank attempt runs (AttemptRow). NotFound for an unknown job.
  StatusOr<AttemptRow> StartAttempt(const std::string& job_id, const std::string& worker_id,
                                    int64_t start_step, int64_t micro_batch, int64_t accumulation,
                                    int64_t world, int64_t now_ms, const std::vector<RankSlot>& ranks = {},
                                    const std::string& pool = "default", double price = 0);
  // NotFound when the job has no attempt with this epoch. `lost`: ftd ended it for a loss
  // (AttemptRow::lost); `notice_ms`: a preemption notice came first (AttemptRow::notice_ms);
  // `goodput`: its split (kept for the pool and worker totals; nullptr = not known); `seen_ms`:
  // a lost attempt's last sign of life (0 = its end).
  Status EndAttempt(const std::string& job_id, int64_t epoch, AttemptOutcomeCode outcome,
                    const std::string& reason, int64_t end_step, int64_t steps_lost, int64_t now_ms,
                    bool lost = false, int64_t notice_ms = 0, const GoodputSplit* goodput = nullptr,
                    int64_t seen_ms = 0);
  // Records that the scheduler asked the attempt to stop for job `for_job` (AttemptRow::preempted_for).
  // NotFound for an unknown attempt.
  Status MarkPreemptedFor(const std::string& job_id, int64_t epoch, const std::string& for_job);
  StatusOr<std::vector<AttemptRow>> ListAttempts(const std::string& job_id);
  // Attempts with outcome RUNNING (any job), e.g. to reattach after a restart.
  StatusOr<std::vector<AttemptRow>> RunningAttempts();
  // Over ended attempts: their wall seconds summed (a lost attempt's up to its last sign of life:
  // after that its node was gone), how many ended preempted, the scheduler's stops apart (checkpoint.every
  // auto's M, engine/job/checkpoint_interval.h), and their goodput splits summed (attempts that ended before
  // ftd kept splits count as none).
  struct AttemptTotals {
    double seconds = 0;
    int64_t preemptions = 0;
    int64_t attempts = 0;
    GoodputSplit device;
    CostSplit cost;  // the same split at each attempt's price
    void Add(const AttemptTotals& o) {
      seconds += o.seconds;
      preemptions += o.preemptions;
      attempts += o.attempts;
      device.Add(o.device);
      cost.Add(o.cost);
    }
  };
  // Grouped by the attempt's pool, or by its (rank 0's) worker.
  enum class AttemptGroup { kPool, kWorker };
  StatusOr<std::map<std::string, AttemptTotals>> EndedAttemptTotals(AttemptGroup by);
  // The device time of the attempts that ran after `ended_after_ms` (running ones too), by the team
  // of their job: the teams' fair-share usage is rebuilt from them when ftd starts.
  struct UsageSpan {
    std::string team;
    int64_t started_ms = 0, ended_ms = 0;  // ended_ms 0: running
    int64_t devices = 1;
  };
  StatusOr<std::vector<UsageSpan>> UsageSpans(int64_t ended_after_ms);
  // What the ended attempts of each team's jobs cost (device-seconds x price), by team ('': jobs of
  // no team).
  StatusOr<std::map<std::string, double>> EndedSpendByTeam();

  // ---- checkpoints
  // Idempotent: committing the same (job, epoch, step) again replaces the row. NotFound for an unknown job.
  Status AddCheckpoint(const CheckpointRow& c);
  // Newest committed checkpoint of a job (highest step), or NotFound.
  StatusOr<CheckpointRow> LatestCheckpoint(const std::string& job_id);
  // Every committed checkpoint of a job, by step (empty for none).
  StatusOr<std::vector<CheckpointRow>> ListCheckpointRows(const std::string& job_id);

  // ---- workers
  // Replaces its device list. InvalidArgument when two devices share an index. Committed
  // atomically but not fsynced (a worker registers again after a crash).
  Status UpsertWorker(const WorkerRow& w);
  Status SetWorkerAlive(const std::string& id, bool alive, int64_t last_seen_ms);  // NotFound
  // Heartbeats: each worker alive, last seen at its time; one transaction for
  // all, committed atomically but not fsynced (it is display-only; leases run
  // on the daemon's clock): heartbeats from 10,000 workers must cost neither
  // 10,000 fsyncs nor 10,000 transactions a second. Unknown ids are skipped.
  Status TouchWorkers(const std::vector<std::pair<std::string, int64_t>>& last_seen_ms);
  // The job's steps_done/last_loss/tokens_per_s/total_steps and the attempt's
  // end_step, in one transaction, not fsynced (progress is advisory: the
  // resume point is the committed checkpoint). NotFound for an unknown job or epoch.
  Status RecordProgress(const ProgressRow& p);
  StatusOr<std::vector<WorkerRow>> ListWorkers();  // by id, devices by index

  // ---- events and metrics
  StatusOr<int64_t> AddEvent(EventRow e);  // returns the assigned seq
  // Events with seq > after_seq in seq order; job_id "" = every job's; limit 0 = no limit.
  // With `team` and job_id "": that team's jobs' events and the events of no job (workers),
  // but never user management events (kinds "user_*"). The caller checks a job_id's team.
  StatusOr<std::vector<EventRow>> ListEvents(const std::string& job_id, int64_t after_seq, int64_t limit,
                                             const TeamScope& team = std::nullopt);
  // One transaction. A row is keyed by (job, epoch, step): sending it again
  // replaces its training fields, keeping an eval_loss already there; an
  // eval_only row sets eval_loss only (a step whose training point has not
  // arrived reads NaN training fields until it does). Objective metrics (either
  // kind of row) merge by name into the row's, kept as KeepObjectiveMetrics
  // leaves them. When `stored` is set it receives each row as stored after the
  // merge, in order.
  Status AddMetrics(const std::vector<MetricRow>& rows, std::vector<MetricRow>* stored = nullptr);
  // Rows with step > after_step ordered by (step, epoch): steps an earlier attempt lost
  // appear once per epoch that reported them. limit 0 = no limit.
  StatusOr<std::vector<MetricRow>> ListMetrics(const std::string& job_id, int64_t after_step, int64_t limit);
  // The objective metrics of the job's highest step that has them (the newest
  // epoch's at that step); empty when it has none (an SFT job, an unknown job).
  StatusOr<std::map<std::string, double>> LatestObjectiveMetrics(const std::string& job_id);
  // LatestObjectiveMetrics of every job that has not ended (queued, running,
  // preempted) and has any, by job id, in one query (/metrics).
  StatusOr<std::map<std::string, std::map<std::string, double>>> LiveObjectiveMetrics();
  // Each job's loss downsampled to at most `buckets` points in one query: the
  // steps 1..total_steps are cut into `buckets` equal ranges and each range's
  // mean loss is one point (ranges without metrics are left out; a range whose
  // losses are all NaN gives NaN). Jobs without metrics are absent.
  StatusOr<std::unordered_map<std::string, std::vector<double>>> LossSparklines(
      const std::vector<std::string>& job_ids, int buckets);

  // ---- device memory
  // From a heartbeat of `worker_id`: updates its devices' used/free/total
  // bytes and, when `job_id` is non-empty, appends one sample per device for
  // that job at `time_ms` (one transaction; heartbeat-rate, so not fsynced:
  // see the class comment). Devices the worker never registered are ignored;
  // NotFound for an unknown worker.
  Status RecordDeviceMemory(const std::string& worker_id, const std::string& job_id, int64_t time_ms,
                            const std::vector<DeviceRow>& devices);
  // A job's samples with time_ms > after_ms, oldest first; limit 0 = no limit.
  StatusOr<std::vector<DeviceMemoryRow>> ListDeviceMemory(const std::string& job_id, int64_t after_ms,
                                                          int64_t limit);

  // ---- secrets
  // The key attempt credentials are derived from (daemon/daemon.h): the stored one, else
  // `candidate` (random, >= 128 bits) stored durably first. NotFound when none is stored and
  // `candidate` is empty; a write's error when it cannot be stored. Never log the result.
  StatusOr<std::string> AttemptKey(const std::string& candidate);

  // ---- users (synced writes)
  // FailedPrecondition when a user of that name exists.
  Status AddUser(const UserRow& user);
  Status RemoveUser(const std::string& name);  // NotFound
  // Replaces the user's token (the old one stops matching at once). NotFound for an unknown user.
  Status SetUserToken(const std::string& name, const std::string& token_id, const std::string& salt,
                      const std::string& hash);
  StatusOr<std::vector<UserRow>> ListUsers();  // by name
  // The user whose token has this public part; nullopt when none.
  StatusOr<std::optional<UserRow>> UserByTokenId(const std::string& token_id);
  // ---- teams (synced writes): SetTeam inserts or replaces the team's row.
  Status SetTeam(const TeamRow& team);
  StatusOr<std::vector<TeamRow>> ListTeams();  // by name
  // Whether any user exists: read once, then kept (AddUser and RemoveUser update it), since
  // every HTTP request and gRPC call asks.
  StatusOr<bool> HasUsers();

  // ---- webhooks (schema 14; daemon/webhooks.h). Changes are synced; a delivery's bookkeeping
  // (RetryWebhookDelivery, FinishWebhookDelivery) is relaxed: lost in a power cut, a delivery
  // is made again (at least once).
  // Inserts `w` with its cursor at the newest event (a webhook hears what happens from now on);
  // returns the row as stored. FailedPrecondition when its id is taken.
  StatusOr<WebhookRow> AddWebhook(WebhookRow w);
  Status RemoveWebhook(const std::string& id);       // NotFound; its pending deliveries go with it
  StatusOr<std::vector<WebhookRow>> ListWebhooks();  // by id
  // One transaction: inserts `rows` (a delivery already queued is left as it is) and moves each
  // webhook's cursor forward to cursors[id] (never back; an unknown webhook is skipped, and so
  // are its rows).
  Status QueueWebhookDeliveries(const std::vector<WebhookDeliveryRow>& rows,
                                const std::map<std::string, int64_t>& cursors);
  // Deliveries due at `now_ms` (next_ms <= now_ms), by event seq; at most `limit` (0 = all); only
  // `webhook_id`'s unless it is "".
  StatusOr<std::vector<WebhookDeliveryRow>> DueWebhookDeliveries(int64_t now_ms, int64_t limit,
                                                                 const std::string& webhook_id = "");
  // A failed attempt: its attempts, when it is due again and why it failed.
  Status RetryWebhookDelivery(const WebhookDeliveryRow& d);
  // Delivered, or given up: the row goes (NotFound is no error: the webhook was removed).
  Status FinishWebhookDelivery(const std::string& webhook_id, int64_t event_seq);
  // Pending deliveries per webhook id (webhooks with none are absent).
  StatusOr<std::map<std::string, int64_t>> PendingWebhookDeliveries();

  // Every job's id and output_dir (the daemon's index of output dirs: one
  // job per directory), in one query reading those two columns.
  StatusOr<std::vector<std::pair<std::string, std::string>>> ListOutputDirs();

  // ---- the database's files
  // Whether the files at the database's path are still the ones this
  // connection has open: the main file (SQLITE_FCNTL_HAS_MOVED), its -wal and
  // its -shm (device and inode as opened). A cleanup script or a backup tool
  // that deletes or replaces one while ftd runs would make every later commit
  // land in a file no restart reads (SQLite's "How To Corrupt": deleting a
  // hot journal). OK when they are. Otherwise the store turns sticky-failed
  // with an IOError naming the file, after copying everything committed into
  // the main file through the still-open connection (PRAGMA
  // wal_checkpoint(TRUNCATE), fsynced): nothing acknowledged is lost, and
  // Recover reopens the database (new -wal and -shm files). A deleted or
  // replaced main file cannot be reopened: the store writes what it holds to
  // a copy beside it (VACUUM INTO, fsynced), names it in the error and
  // refuses writes for good (the operator restarts ftd from that copy). A
  // few stat calls: run per tick and per /ready; Write runs it after every
  // synced commit, whose OK then means the commit is in the main file (else
  // the write fails with the sticky error).
  Status CheckFiles();
  // Whether the sticky error is CheckFiles' (a file deleted or replaced).
  bool files_replaced();

  // ---- monitoring
  StatusOr<StoreTotals> Totals();
  // OK, or the sticky error that makes every write fail (see the class comment).
  Status sticky_error();
  // Ends a sticky failure once the database is writable again. After
  // CheckFiles found a -wal or -shm deleted or replaced: once what was
  // committed is in the main file, closes the connection (SQLite removes
  // whatever now lies at the -wal and -shm paths) and opens the database
  // again, then makes one synced probe write. Otherwise (space freed,
  // the directory writable again): once its filesystem has 4 MiB free, opens
  // a fresh connection (SQLite rolls back whatever the failed write left) and
  // makes one synced probe write with it; when both succeed the
  // fresh connection replaces the old one and writes are accepted again (OK).
  // Otherwise the store stays sticky-failed with its first error, and an
  // IOError saying why it cannot recover yet is returned. OK at once on a
  // healthy store. The caller must reload whatever it derived from writes
  // that failed (Daemon::ReloadFromStore).
  Status Recover();
  // The connection's PRAGMA synchronous (2 = FULL, what every synced write
  // relies on); for health checks and tests.
  StatusOr<int> SynchronousLevel();
  // Tests only: `hook` runs inside every later write transaction, just before
  // its COMMIT (e.g. to stall a commit); an empty function removes it.
  void SetCommitHookForTest(std::function<void()> hook);

 private:
  using Query = store_internal::Query;

  explicit Store(std::string path) : path_(std::move(path)) {}
  // Open, with PRAGMA quick_check or (Recover: the file was checked at start) without.
  static StatusOr<std::unique_ptr<Store>> Open(const std::string& path, bool quick_check);
  Status Init();        // opens, sets the pragmas, migrates
  Status QuickCheck();  // Corruption when PRAGMA quick_check finds damage
  Status Migrate();     // applies the missing migrations, one transaction each
  Status ProbeWrite();  // one synced write of a counter the daemon never reads
  // The first column of the first row of `sql` as text ("" when no row).
  StatusOr<std::string> QueryText(const std::string& sql, const std::string& op);

  // IOError "<path>: <op>: <sqlite message>" for the connection's last error.
  Status Error(const std::string& op) const;
  // The cached prepared statement for `sql` (prepared on first use).
  // A Query resets its statement when destroyed: one must not outlive the
  // transaction it reads in (COMMIT fails while a statement is mid-way).
  StatusOr<Query> Prepare(const std::string& sql, const std::string& op);
  Status Exec(const std::string& sql, const std::string& op);  // cached; no parameters, rows ignored
  // Runs body() between BEGIN IMMEDIATE and COMMIT (ROLLBACK on error). A
  // sticky-failed store returns its error; an IOError makes it sticky.
  // kSynced: fsynced before returning (state transitions). kRelaxed: atomic
  // but not fsynced (heartbeat-rate data whose loss in a crash is harmless).
  enum class Durability { kSynced, kRelaxed };
  template <typename Body>
  Status Write(const std::string& op, Body&& body, Durability durability = Durability::kSynced);

  // Helpers that run inside Write().
  StatusOr<std::optional<JobRow>> FindJob(const std::string& column, const std::string& value,
                                          const std::string& op);
  Status RequireJob(const std::string& job_id, const std::string& op);  // NotFound
  StatusOr<int64_t> InsertEvent(const EventRow& e, const std::string& op);
  // Inserts `job` (new id, QUEUED, a "queued" event), or loads the job its
  // client_request_id names and sets *dup.
  Status InsertJob(JobRow& job, bool* dup, const std::string& op);
  // The objective column for `m`: its objective metrics merged by name over
  // those its row holds already (a step's evaluation adds its eval_* names),
  // as KeepObjectiveMetrics leaves them; "" (NULL: keep the row's) when `m`
  // has none to keep.
  StatusOr<std::string> MergedObjective(const MetricRow& m, const std::string& op);

  // CheckFiles' parts. REQUIRES: mu_ held (for all below).
  // Notes the device and inode of the -wal and -shm files (after Init).
  void RecordFiles();
  // CheckFiles: sticky_ when a file is (or was earlier) found replaced, else OK.
  Status CheckFilesLocked();
  // Copies every committed frame of the open WAL into the main file, fsynced
  // (PRAGMA wal_checkpoint(TRUNCATE)); IOError when SQLite could not.
  Status SaveWal();
  // A deleted or replaced main file: writes the open database to a new file
  // beside it, fsynced (VACUUM INTO); returns its path.
  StatusOr<std::string> SaveCopy();
  // Recover after CheckFiles: SaveWal, close, Init again, one probe write.
  Status ReopenAfterReplacedFiles();
  // Closes the connection and its statements (db_ is null after).
  void CloseConnection();

  const std::string path_;
  int schema_version_ = 0;   // set by Open
  bool quick_check_ = true;  // Init runs PRAGMA quick_check
  std::mutex mu_;
  sqlite3* db_ = nullptr;                                 // GUARDED_BY(mu_)
  std::unordered_map<std::string, sqlite3_stmt*> stmts_;  // GUARDED_BY(mu_); by SQL text
  Status sticky_;                                         // GUARDED_BY(mu_)
  std::function<void()> commit_hook_;                     // GUARDED_BY(mu_) SetCommitHookForTest
  // The -wal and -shm files this connection has open, as {device, inode} ({0, 0}: not known).
  std::pair<uint64_t, uint64_t> wal_file_, shm_file_;  // GUARDED_BY(mu_)
  std::string replaced_file_;       // GUARDED_BY(mu_) the file CheckFiles found replaced ("" = none)
  bool wal_saved_ = false;          // GUARDED_BY(mu_) SaveWal succeeded since then
  std::atomic<int> has_users_{-1};  // HasUsers: -1 not read yet, else 0 or 1
};

}  // namespace ft
