#include "daemon/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/clock.h"

namespace ft {

namespace {

// The schema, as an ordered list of migrations: kMigrations[i] takes the
// database from user_version i to i + 1, in one transaction. Never edit an
// entry that has shipped; append a new one.
//
// REAL columns are nullable on purpose: SQLite stores a NaN (a diverged
// loss) as NULL, and reads give NULL back as NaN.
constexpr const char* kMigrations[] = {
    // 1: the initial schema.
    R"sql(
CREATE TABLE counters (
  name  TEXT PRIMARY KEY,
  value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO counters (name, value) VALUES ('job', 0);

CREATE TABLE jobs (
  num               INTEGER PRIMARY KEY,  -- from counters 'job': never reused
  id                TEXT NOT NULL UNIQUE, -- 'j-000001'
  name              TEXT NOT NULL,
  state             INTEGER NOT NULL,     -- JobStateCode
  reason            TEXT NOT NULL,
  priority          INTEGER NOT NULL,
  spec_yaml         TEXT NOT NULL,
  spec_dir          TEXT NOT NULL,
  client_request_id TEXT NOT NULL,        -- '' when none
  created_ms        INTEGER NOT NULL,
  updated_ms        INTEGER NOT NULL,
  total_steps       INTEGER NOT NULL,
  steps_done        INTEGER NOT NULL,
  last_loss         REAL,
  tokens_per_s      REAL,
  preemptions       INTEGER NOT NULL,
  failures          INTEGER NOT NULL,
  max_failures      INTEGER NOT NULL,
  output_dir        TEXT NOT NULL,
  not_before_ms     INTEGER NOT NULL,
  gpus              INTEGER NOT NULL,
  device            TEXT NOT NULL
);
CREATE UNIQUE INDEX jobs_by_request ON jobs (client_request_id) WHERE client_request_id != '';
CREATE INDEX jobs_by_state ON jobs (state, priority DESC, created_ms, num);
CREATE INDEX jobs_by_created ON jobs (created_ms, num);

CREATE TABLE attempts (
  job_id       TEXT NOT NULL REFERENCES jobs (id),
  number       INTEGER NOT NULL,
  epoch        INTEGER NOT NULL,
  worker_id    TEXT NOT NULL,
  outcome      INTEGER NOT NULL,          -- AttemptOutcomeCode
  reason       TEXT NOT NULL,
  started_ms   INTEGER NOT NULL,
  ended_ms     INTEGER NOT NULL,
  start_step   INTEGER NOT NULL,
  end_step     INTEGER NOT NULL,
  steps_lost   INTEGER NOT NULL,
  micro_batch  INTEGER NOT NULL,
  accumulation INTEGER NOT NULL,
  world        INTEGER NOT NULL,
  PRIMARY KEY (job_id, number),
  UNIQUE (job_id, epoch)
) WITHOUT ROWID;
CREATE INDEX attempts_running ON attempts (job_id, number) WHERE outcome = 1;

CREATE TABLE workers (
  id           TEXT PRIMARY KEY,
  hostname     TEXT NOT NULL,
  version      TEXT NOT NULL,
  last_seen_ms INTEGER NOT NULL,
  slot_end_ms  INTEGER NOT NULL,
  alive        INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE devices (
  worker_id   TEXT NOT NULL REFERENCES workers (id),
  idx         INTEGER NOT NULL,
  kind        TEXT NOT NULL,
  name        TEXT NOT NULL,
  total_bytes INTEGER NOT NULL,
  free_bytes  INTEGER NOT NULL,
  used_bytes  INTEGER NOT NULL,
  PRIMARY KEY (worker_id, idx)
) WITHOUT ROWID;

CREATE TABLE checkpoints (
  job_id          TEXT NOT NULL REFERENCES jobs (id),
  epoch           INTEGER NOT NULL,
  step            INTEGER NOT NULL,
  dir             TEXT NOT NULL,
  manifest_sha256 TEXT NOT NULL,
  write_seconds   REAL,
  committed_ms    INTEGER NOT NULL,
  PRIMARY KEY (job_id, step, epoch)
) WITHOUT ROWID;

CREATE TABLE events (
  seq       INTEGER PRIMARY KEY AUTOINCREMENT,
  time_ms   INTEGER NOT NULL,
  job_id    TEXT NOT NULL,                -- '' for events of no job
  worker_id TEXT NOT NULL,
  kind      TEXT NOT NULL,
  message   TEXT NOT NULL,
  step      INTEGER NOT NULL
);
CREATE INDEX events_by_job ON events (job_id, seq);

-- No foreign key: metrics are a log, written in bulk.
CREATE TABLE metrics (
  job_id       TEXT NOT NULL,
  epoch        INTEGER NOT NULL,
  step         INTEGER NOT NULL,
  loss         REAL,
  lr           REAL,
  grad_norm    REAL,
  tokens_per_s REAL,
  peak_bytes   INTEGER NOT NULL,
  time_ms      INTEGER NOT NULL,
  PRIMARY KEY (job_id, step, epoch)
) WITHOUT ROWID;
)sql",
    // 2: device memory over time of the devices a job ran on, sampled from the
    // heartbeats of the worker running it (the dashboard's memory chart).
    R"sql(
CREATE TABLE device_memory (
  job_id      TEXT NOT NULL,
  time_ms     INTEGER NOT NULL,
  worker_id   TEXT NOT NULL,
  device      INTEGER NOT NULL,
  used_bytes  INTEGER NOT NULL,
  total_bytes INTEGER NOT NULL,
  PRIMARY KEY (job_id, time_ms, worker_id, device)
) WITHOUT ROWID;
)sql",
    // 3: the evaluation loss on data.eval at a step (NULL = no evaluation there).
    R"sql(
ALTER TABLE metrics ADD COLUMN eval_loss REAL;
)sql",
    // 4: target tokens trained on up to a step (the dashboard's compare view
    // plots loss by tokens; NULL = not reported).
    R"sql(
ALTER TABLE metrics ADD COLUMN tokens_seen INTEGER;
)sql",
    // 5: the step's wall time and, of it, the time spent waiting for the memory
    // techniques' copies (the dashboard's overlap chart; NULL = not reported).
    R"sql(
ALTER TABLE metrics ADD COLUMN step_seconds REAL;
ALTER TABLE metrics ADD COLUMN copy_wait_seconds REAL;
)sql",
    // 6: every rank of a multi-rank attempt, by rank, one per line: its
    // device index, a space, its worker id ('' = one rank, on worker_id).
    R"sql(
ALTER TABLE attempts ADD COLUMN ranks TEXT NOT NULL DEFAULT '';
)sql",
    // 7: whether ftd ended the attempt for a loss (its worker's lease, a lost
    // rank) rather than on the attempt's own report: goodput counts the time
    // after its last surviving step as lost (daemon/goodput.h); and when a
    // cloud preemption notice reached its worker (0 = none).
    R"sql(
ALTER TABLE attempts ADD COLUMN lost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN notice_ms INTEGER NOT NULL DEFAULT 0;
)sql",
    // 8: worker pools (ft-worker --pool): each worker's, and each attempt's
    // when it started (M and goodput per pool); an ended attempt's goodput
    // split in device-seconds (NULL: running, or ended before this version);
    // and a lost attempt's last sign of life (its worker's last message; 0:
    // its end), which M's history counts up to.
    R"sql(
ALTER TABLE workers ADD COLUMN pool TEXT NOT NULL DEFAULT 'default';
ALTER TABLE attempts ADD COLUMN pool TEXT NOT NULL DEFAULT 'default';
ALTER TABLE attempts ADD COLUMN productive_s REAL;
ALTER TABLE attempts ADD COLUMN checkpoint_s REAL;
ALTER TABLE attempts ADD COLUMN restart_s REAL;
ALTER TABLE attempts ADD COLUMN lost_s REAL;
ALTER TABLE attempts ADD COLUMN seen_ms INTEGER NOT NULL DEFAULT 0;
)sql",
    // 9: ftd's own secrets, by name. 'attempt_key': the key every attempt's
    // credential is derived from (HMAC-SHA256 of job, epoch and rank; see
    // Store::AttemptKey), made once by the first attempt start and never shown.
    R"sql(
CREATE TABLE secrets (
  name  TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;
)sql",
    // 10: the training objective's own metrics at a step (DPO's rewards and
    // log-probabilities, and its evaluation's eval_rewards/...), a JSON object
    // {"rewards/margins": 0.5, ...} (null = not finite); NULL = none (SFT). The partial index finds a
    // job's newest such step without reading an SFT job's rows.
    R"sql(
ALTER TABLE metrics ADD COLUMN objective TEXT;
CREATE INDEX metrics_objective ON metrics (job_id, step, epoch) WHERE objective IS NOT NULL;
)sql",
    // 11: users in teams (daemon/authorization.h). A user's token is never stored: token_id is
    // its public part (the lookup key), token_hash the HMAC-SHA256 of the whole token under
    // token_salt (random). Every job records who submitted it and that user's team ('' for
    // jobs submitted before users existed, or by a token that is no user: only identities of
    // every team see those).
    R"sql(
CREATE TABLE users (
  name        TEXT PRIMARY KEY,
  team        TEXT NOT NULL,
  role        TEXT NOT NULL,
  token_id    TEXT NOT NULL UNIQUE,
  token_salt  TEXT NOT NULL,
  token_hash  TEXT NOT NULL,
  created_ms  INTEGER NOT NULL
) WITHOUT ROWID;
ALTER TABLE jobs ADD COLUMN submitted_by TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN team TEXT NOT NULL DEFAULT '';
CREATE INDEX jobs_by_team ON jobs (team, created_ms);
)sql",
    // 12: each team's share of the cluster (daemon/fair_share.h): its nominal quota of devices
    // running at once (-1: none) and its fair-share weight. A team without a row has the defaults.
    R"sql(
CREATE TABLE teams (
  name           TEXT PRIMARY KEY,
  quota_devices  INTEGER NOT NULL DEFAULT -1,
  weight         REAL NOT NULL DEFAULT 1,
  updated_ms     INTEGER NOT NULL
) WITHOUT ROWID;
)sql",
    // 13: money. A worker's price per device-hour as it reported it (ft-worker --price; 0: none);
    // an attempt's, per device-hour, fixed at its start (the mean over its ranks' workers of ftd's
    // price for the worker's pool, else the worker's own), so its cost is its device-seconds times
    // it; and a team's budget in the same currency (NULL: none). Also a team's cap on queued jobs (-1: none).
    R"sql(
ALTER TABLE workers ADD COLUMN price REAL NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN price REAL NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN budget REAL;
ALTER TABLE teams ADD COLUMN max_queued INTEGER NOT NULL DEFAULT -1;
)sql",
    // 14: webhooks (daemon/webhooks.h). The events table is
    // their outbox: each webhook's cursor is the last event seq it has considered, advanced in the
    // transaction that inserts its delivery rows, so every matching event is queued exactly once
    // across ftd restarts. A delivery row holds the JSON body as first built (the signature and
    // the receiver's dedup id cover it unchanged across retries) until it is delivered or given up.
    R"sql(
CREATE TABLE webhooks (
  id          TEXT PRIMARY KEY,   -- 'wh-' + 8 random hex characters
  url         TEXT NOT NULL,
  events      TEXT NOT NULL,      -- the subscribed kinds, comma-separated
  team        TEXT NOT NULL,      -- '' = any team
  user        TEXT NOT NULL,      -- '' = any submitter
  secret      TEXT NOT NULL,      -- the HMAC-SHA256 key of its signature header
  created_by  TEXT NOT NULL,
  created_ms  INTEGER NOT NULL,
  cursor      INTEGER NOT NULL    -- events with seq <= cursor are queued or were not subscribed
) WITHOUT ROWID;
CREATE TABLE webhook_deliveries (
  webhook_id  TEXT NOT NULL,
  event_seq   INTEGER NOT NULL,
  body        TEXT NOT NULL,
  attempts    INTEGER NOT NULL,   -- made so far
  next_ms     INTEGER NOT NULL,   -- wall clock: when it is due
  last_error  TEXT NOT NULL,
  PRIMARY KEY (webhook_id, event_seq)
) WITHOUT ROWID;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_ms);
)sql",
    // 15: the job a running attempt was asked to stop for by the scheduler ('' = none): its
    // preemption is the scheduler's, not the pool's (checkpoint.every auto's M counts only the
    // pool's), and ftd still knows it after a restart.
    R"sql(
ALTER TABLE attempts ADD COLUMN preempted_for TEXT NOT NULL DEFAULT '';
)sql",
};

constexpr int kLatestVersion = static_cast<int>(std::size(kMigrations));
constexpr int kBusyTimeoutMs = 10000;
// Recover waits until the database's filesystem has this much free space.
constexpr int64_t kRecoveryFreeBytes = int64_t{4} << 20;
namespace fs = std::filesystem;

// The directory holding the database file ("." for a bare file name).
std::string DirectoryOf(const std::string& path) {
  const std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

constexpr char kJobColumns[] =
    "id, name, state, reason, priority, spec_yaml, spec_dir, client_request_id, created_ms, updated_ms, "
    "total_steps, steps_done, last_loss, tokens_per_s, preemptions, failures, max_failures, output_dir, "
    "not_before_ms, gpus, device, submitted_by, team";
constexpr char kUserColumns[] = "name, team, role, token_id, token_salt, token_hash, created_ms";
constexpr char kAttemptColumns[] =
    "job_id, number, epoch, worker_id, outcome, reason, started_ms, ended_ms, start_step, end_step, "
    "steps_lost, micro_batch, accumulation, world, ranks, lost, notice_ms, pool, price, preempted_for";
constexpr char kCheckpointColumns[] =
    "job_id, epoch, step, dir, manifest_sha256, write_seconds, committed_ms";
constexpr char kEventColumns[] = "seq, time_ms, job_id, worker_id, kind, message, step";
constexpr char kMetricColumns[] =
    "job_id, epoch, step, loss, lr, grad_norm, tokens_per_s, peak_bytes, time_ms, eval_loss, tokens_seen, "
    "step_seconds, copy_wait_seconds, objective";

// A query of the objective column of job `job`'s highest step that has one (the newest epoch's
// at that step): `job` is a parameter or an outer query's column.
std::string LatestObjectiveSql(const std::string& job) {
  return "SELECT m.objective FROM metrics m INDEXED BY metrics_objective WHERE m.job_id = " + job +
         " AND m.objective IS NOT NULL ORDER BY m.step DESC, m.epoch DESC LIMIT 1";
}

// "?, ?, ?" with n placeholders.
std::string Placeholders(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += i == 0 ? "?" : ", ?";
  return out;
}

std::string JobId(int64_t num) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "j-%06" PRId64, num);
  return buf;
}

// SQLite's LIMIT: a negative value means none.
int64_t SqlLimit(int64_t limit) { return limit > 0 ? limit : -1; }

}  // namespace

namespace store_internal {

// A cached statement in use: binds parameters, steps, reads columns, and
// resets itself when it goes out of scope so the cache can hand it out again.
class Query {
 public:
  Query(sqlite3* db, sqlite3_stmt* stmt, const std::string& path, const std::string& op)
      : db_(db), stmt_(stmt), path_(path), op_(op) {}
  Query(Query&& other) noexcept
      : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), path_(other.path_), op_(other.op_) {}
  Query& operator=(Query&&) = delete;
  ~Query() {
    if (stmt_ == nullptr) return;
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  // Binds the arguments to the next parameters (1, 2, ... over all calls).
  template <typename... Args>
  Query& Bind(const Args&... args) {
    (BindOne(next_param_++, args), ...);
    return *this;
  }

  // Steps once: *row says whether a row is available.
  Status Next(bool* row) {
    *row = false;
    if (bind_rc_ != SQLITE_OK) return Fail(sqlite3_errstr(bind_rc_));
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) *row = true;
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) return Status::OK();
    return Fail(sqlite3_errmsg(db_));
  }

  // Runs the statement to completion, ignoring rows.
  Status Run() {
    bool row = true;
    while (row) FT_RETURN_IF_ERROR(Next(&row));
    return Status::OK();
  }

  // Rows changed by the last INSERT/UPDATE/DELETE that ran to completion.
  int64_t Changes() const { return sqlite3_changes64(db_); }

  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const {
    return IsNull(col) ? std::numeric_limits<double>::quiet_NaN() : sqlite3_column_double(stmt_, col);
  }
  std::string Text(int col) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return p == nullptr ? std::string() : std::string(p, sqlite3_column_bytes(stmt_, col));
  }

 private:
  Status Fail(const char* message) const { return Status::IOError(path_ + ": " + op_ + ": " + message); }

  // Bind errors (misuse, too big) are kept and reported by the next step.
  void Check(int rc) {
    if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  }
  void BindOne(int i, int64_t v) { Check(sqlite3_bind_int64(stmt_, i, v)); }
  void BindOne(int i, int v) { Check(sqlite3_bind_int64(stmt_, i, v)); }
  void BindOne(int i, double v) { Check(sqlite3_bind_double(stmt_, i, v)); }
  void BindOne(int i, std::nullptr_t) { Check(sqlite3_bind_null(stmt_, i)); }
  void BindOne(int i, const std::string& v) {
    Check(sqlite3_bind_text64(stmt_, i, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  const std::string& path_;
  std::string op_;  // a copy: callers pass temporaries
  int next_param_ = 1;
  int bind_rc_ = SQLITE_OK;
};

}  // namespace store_internal

namespace {

using store_internal::Query;

int64_t Code(JobStateCode s) { return static_cast<int64_t>(s); }
int64_t Code(AttemptOutcomeCode o) { return static_cast<int64_t>(o); }

JobRow ReadJob(const Query& q) {
  JobRow j;
  int c = 0;
  j.id = q.Text(c++);
  j.name = q.Text(c++);
  j.state = static_cast<JobStateCode>(q.Int(c++));
  j.reason = q.Text(c++);
  j.priority = q.Int(c++);
  j.spec_yaml = q.Text(c++);
  j.spec_dir = q.Text(c++);
  j.client_request_id = q.Text(c++);
  j.created_ms = q.Int(c++);
  j.updated_ms = q.Int(c++);
  j.total_steps = q.Int(c++);
  j.steps_done = q.Int(c++);
  j.last_loss = q.Real(c++);
  j.tokens_per_s = q.Real(c++);
  j.preemptions = q.Int(c++);
  j.failures = q.Int(c++);
  j.max_failures = q.Int(c++);
  j.output_dir = q.Text(c++);
  j.not_before_ms = q.Int(c++);
  j.gpus = q.Int(c++);
  j.device = q.Text(c++);
  j.submitted_by = q.Text(c++);
  j.team = q.Text(c++);
  return j;
}

UserRow ReadUser(const Query& q) {
  UserRow u;
  int c = 0;
  u.name = q.Text(c++);
  u.team = q.Text(c++);
  u.role = q.Text(c++);
  u.token_id = q.Text(c++);
  u.token_salt = q.Text(c++);
  u.token_hash = q.Text(c++);
  u.created_ms = q.Int(c++);
  return u;
}

// AttemptRow's ranks in the ranks column: "<device index> <worker id>" per line.
std::string JoinRanks(const AttemptRow& a) {
  std::string out;
  for (const RankSlot& r : a.ranks)
    out += (out.empty() ? "" : "\n") + std::to_string(r.device) + " " + r.worker_id;
  return out;
}
void SplitRanks(const std::string& text, AttemptRow* a) {
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(start, nl - start);
    const size_t space = line.find(' ');
    a->ranks.push_back({space == std::string::npos ? line : line.substr(space + 1),
                        std::atoi(line.substr(0, space).c_str())});
    start = nl + 1;
  }
}

AttemptRow ReadAttempt(const Query& q) {
  AttemptRow a;
  int c = 0;
  a.job_id = q.Text(c++);
  a.number = q.Int(c++);
  a.epoch = q.Int(c++);
  a.worker_id = q.Text(c++);
  a.outcome = static_cast<AttemptOutcomeCode>(q.Int(c++));
  a.reason = q.Text(c++);
  a.started_ms = q.Int(c++);
  a.ended_ms = q.Int(c++);
  a.start_step = q.Int(c++);
  a.end_step = q.Int(c++);
  a.steps_lost = q.Int(c++);
  a.micro_batch = q.Int(c++);
  a.accumulation = q.Int(c++);
  a.world = q.Int(c++);
  SplitRanks(q.Text(c++), &a);
  a.lost = q.Int(c++) != 0;
  a.notice_ms = q.Int(c++);
  a.pool = q.Text(c++);
  a.price = q.Real(c++);
  a.preempted_for = q.Text(c++);
  return a;
}

CheckpointRow ReadCheckpoint(const Query& q) {
  CheckpointRow r;
  r.job_id = q.Text(0);
  r.epoch = q.Int(1);
  r.step = q.Int(2);
  r.dir = q.Text(3);
  r.manifest_sha256 = q.Text(4);
  r.write_seconds = q.Real(5);
  r.committed_ms = q.Int(6);
  return r;
}

EventRow ReadEvent(const Query& q) {
  EventRow e;
  e.seq = q.Int(0);
  e.time_ms = q.Int(1);
  e.job_id = q.Text(2);
  e.worker_id = q.Text(3);
  e.kind = q.Text(4);
  e.message = q.Text(5);
  e.step = q.Int(6);
  return e;
}

// The objective column's text: a JSON object of numbers (null: NaN); NULL or '' = none.
std::string FormatObjective(const std::map<std::string, double>& metrics) {
  if (metrics.empty()) return "";
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : metrics) {
    out[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
  }
  return out.dump();
}

// FormatObjective's text back; what is not such an object (a damaged row) reads as none.
std::map<std::string, double> ParseObjective(const std::string& text) {
  std::map<std::string, double> out;
  if (text.empty()) return out;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  for (const auto& [name, value] : j.items()) {
    out[name] = value.is_number() ? value.get<double>() : std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

MetricRow ReadMetric(const Query& q) {
  MetricRow m;
  m.job_id = q.Text(0);
  m.epoch = q.Int(1);
  m.step = q.Int(2);
  m.loss = q.Real(3);
  m.lr = q.Real(4);
  m.grad_norm = q.Real(5);
  m.tokens_per_s = q.Real(6);
  m.peak_bytes = q.Int(7);
  m.time_ms = q.Int(8);
  m.eval_loss = q.Real(9);
  m.tokens_seen = q.Int(10);
  m.step_seconds = q.Real(11);
  m.copy_wait_seconds = q.Real(12);
  m.objective_metrics = ParseObjective(q.Text(13));
  return m;
}

// Every row of `q`, converted by read(q).
template <typename Read>
auto Collect(Query& q, Read read) -> StatusOr<std::vector<decltype(read(q))>> {
  std::vector<decltype(read(q))> rows;
  for (;;) {
    bool row = false;
    FT_RETURN_IF_ERROR(q.Next(&row));
    if (!row) return rows;
    rows.push_back(read(q));
  }
}

}  // namespace

bool IsObjectiveMetricName(const std::string& name) {
  if (name.empty() || name.size() > kMaxObjectiveMetricName || name[0] < 'a' || name[0] > 'z') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '/' || c == '.';
  });
}

std::map<std::string, double> KeepObjectiveMetrics(const std::map<std::string, double>& metrics) {
  std::map<std::string, double> kept;
  for (const auto& [name, value] : metrics) {
    if (kept.size() == kMaxObjectiveMetrics) break;
    if (IsObjectiveMetricName(name)) kept.emplace(name, value);
  }
  return kept;
}

// ---- plumbing

StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) { return Open(path, true); }

StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path, bool quick_check) {
  std::unique_ptr<Store> store(new Store(path));
  store->quick_check_ = quick_check;
  std::lock_guard<std::mutex> lock(store->mu_);
  FT_RETURN_IF_ERROR(store->Init());
  store->RecordFiles();
  return store;
}

Store::~Store() {
  for (auto& [sql, stmt] : stmts_) sqlite3_finalize(stmt);
  sqlite3_close(db_);  // checkpoints the WAL; a no-op on nullptr
}

int Store::schema_version() const { return schema_version_; }

Status Store::Init() {
  // A read-only directory (a volume that came back read-only): open the
  // database read-only, serve reads and refuse writes until Recover.
  const bool read_only = access(DirectoryOf(path_).c_str(), W_OK) != 0 && errno == EROFS;
  const int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  // SQLite cannot create the WAL's -shm there; with no WAL left behind (ftd
  // stopped cleanly) the file alone is the whole database: open it immutable.
  std::string name = path_;
  std::error_code ec;
  if (read_only && !fs::exists(path_ + "-wal", ec)) {
    name = "file:";
    for (char c : path_) name += c == '?' ? "%3f" : c == '#' ? "%23" : c == '%' ? "%25" : std::string(1, c);
    name += "?immutable=1";
  }
  int rc = sqlite3_open_v2(name.c_str(), &db_, flags | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_URI, nullptr);
  if (rc != SQLITE_OK) {
    return db_ != nullptr ? Error("open") : Status::IOError(path_ + ": open: " + sqlite3_errstr(rc));
  }
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  if (quick_check_) FT_RETURN_IF_ERROR(QuickCheck());
  if (read_only) {
    FT_ASSIGN_OR_RETURN(std::string version, QueryText("PRAGMA user_version", "read schema version"));
    schema_version_ = static_cast<int>(std::strtol(version.c_str(), nullptr, 10));
    if (schema_version_ != kLatestVersion) {
      return Status::IOError(path_ + ": open: schema version " + version + " needs migrating to " +
                             std::to_string(kLatestVersion) + " but its directory is read-only");
    }
    sticky_ = Status::IOError(path_ + ": open: its directory is read-only (" + std::strerror(EROFS) +
                              "); serving reads, refusing writes until it is writable again");
    return Status::OK();
  }
  // journal_mode answers with the mode in force: WAL needs shared memory,
  // which some network filesystems lack.
  FT_ASSIGN_OR_RETURN(std::string mode, QueryText("PRAGMA journal_mode=WAL", "enable WAL"));
  if (mode != "wal") {
    return Status::IOError(path_ + ": enable WAL: journal mode is '" + mode + "' (local disk?)");
  }
  // FULL fsyncs the WAL at every commit: an acknowledged write survives power loss.
  FT_RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL", "set synchronous=FULL"));
  FT_RETURN_IF_ERROR(Exec("PRAGMA foreign_keys=ON", "enable foreign keys"));
  return Migrate();
}

Status Store::QuickCheck() {
  // quick_check reads every page once (no index cross-checks): a damaged page
  // is found now, not by a query in the middle of serving.
  const std::string fix =
      "; ftd will not serve from a damaged database: restore DATA_DIR/ftd.sqlite from a backup, or move "
      "it (and its -wal/-shm files) aside to start empty (docs/OPERATIONS.md)";
  auto q = Prepare("PRAGMA quick_check(8)", "integrity check (PRAGMA quick_check)");
  if (!q.ok()) return Status::IOError(q.status().message() + fix);  // e.g. not a database at all
  std::string problems;
  for (;;) {
    bool row = false;
    if (Status s = q->Next(&row); !s.ok()) return Status::Corruption(s.message() + fix);
    if (!row) break;
    const std::string line = q->Text(0);
    if (line != "ok") problems += (problems.empty() ? "" : "; ") + line;
  }
  if (problems.empty()) return Status::OK();
  return Status::Corruption(path_ + ": PRAGMA quick_check found damage: " + problems + fix);
}

Status Store::Migrate() {
  FT_ASSIGN_OR_RETURN(std::string version, QueryText("PRAGMA user_version", "read schema version"));
  schema_version_ = static_cast<int>(std::strtol(version.c_str(), nullptr, 10));
  if (schema_version_ > kLatestVersion) {
    return Status::FailedPrecondition(path_ + ": schema version " + std::to_string(schema_version_) +
                                      " is newer than this ftd's (" + std::to_string(kLatestVersion) +
                                      "); run a newer ftd");
  }
  while (schema_version_ < kLatestVersion) {
    const int next = schema_version_ + 1;
    const std::string op = "migrate to schema version " + std::to_string(next);
    FT_RETURN_IF_ERROR(Write(op, [&]() -> Status {
      // Multi-statement text: sqlite3_exec, not the statement cache.
      char* err = nullptr;
      if (sqlite3_exec(db_, kMigrations[next - 1], nullptr, nullptr, &err) != SQLITE_OK) {
        Status s = Status::IOError(path_ + ": " + op + ": " + (err ? err : "unknown error"));
        sqlite3_free(err);
        return s;
      }
      // user_version lives in the database header: it commits with the migration.
      return Exec("PRAGMA user_version = " + std::to_string(next), op);
    }));
    schema_version_ = next;
  }
  return Status::OK();
}

StatusOr<std::string> Store::QueryText(const std::string& sql, const std::string& op) {
  FT_ASSIGN_OR_RETURN(Query q, Prepare(sql, op));
  bool row = false;
  FT_RETURN_IF_ERROR(q.Next(&row));
  return row ? q.Text(0) : std::string();
}

Status Store::Error(const std::string& op) const {
  return Status::IOError(path_ + ": " + op + ": " + sqlite3_errmsg(db_));
}

StatusOr<Store::Query> Store::Prepare(const std::string& sql, const std::string& op) {
  if (db_ == nullptr) return sticky_.ok() ? Status::IOError(path_ + ": " + op + ": not open") : sticky_;
  auto it = stmts_.find(sql);
  if (it == stmts_.end()) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v3(db_, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr) != SQLITE_OK) {
      return Error(op);
    }
    it = stmts_.emplace(sql, stmt).first;
  }
  return Query(db_, it->second, path_, op);
}

Status Store::Exec(const std::string& sql, const std::string& op) {
  FT_ASSIGN_OR_RETURN(Query q, Prepare(sql, op));
  return q.Run();
}

template <typename Body>
Status Store::Write(const std::string& op, Body&& body, Durability durability) {
  if (!sticky_.ok()) return sticky_;
  // synchronous=NORMAL in WAL mode: the commit is atomic and ordered but not
  // fsynced; the next FULL commit (or a checkpoint) makes it durable too.
  const bool relaxed = durability == Durability::kRelaxed;
  Status s = relaxed ? Exec("PRAGMA synchronous=NORMAL", op) : Status::OK();
  // IMMEDIATE takes the write lock now, so the transaction cannot fail
  // later with SQLITE_BUSY when another connection wrote in between.
  if (s.ok()) s = Exec("BEGIN IMMEDIATE", op);
  if (s.ok()) s = body();
  if (s.ok() && commit_hook_) commit_hook_();
  if (s.ok()) s = Exec("COMMIT", op);
  if (!s.ok()) {
    // SQLite may already have rolled back (e.g. after an I/O error).
    if (!sqlite3_get_autocommit(db_)) {
      Status r = Exec("ROLLBACK", op);
      if (!r.ok() && !s.IsIOError()) s = r;
    }
    if (s.IsIOError()) sticky_ = s;
  }
  if (relaxed) {
    // Outside any transaction now (SQLite refuses the change inside one). A
    // connection left at NORMAL would silently stop fsyncing acknowledged
    // writes, so failing to restore FULL fails the store.
    Status full = Exec("PRAGMA synchronous=FULL", op);
    if (!full.ok()) {
      sticky_ = Status::IOError(path_ + ": " + op + ": cannot restore synchronous=FULL: " + full.message());
      if (s.ok()) s = sticky_;
    }
  }
  // A commit into a -wal no longer at its path is durable once it is saved into the main file.
  if (s.ok() && !relaxed) {
    if (Status files = CheckFilesLocked(); !files.ok() && !wal_saved_) s = files;
  }
  return s;
}

StatusOr<std::optional<JobRow>> Store::FindJob(const std::string& column, const std::string& value,
                                               const std::string& op) {
  FT_ASSIGN_OR_RETURN(Query q,
                      Prepare(std::string("SELECT ") + kJobColumns + " FROM jobs WHERE " + column + " = ?" +
                                  (column == "client_request_id" ? " AND " + column + " != ''" : ""),
                              op));
  q.Bind(value);
  bool row = false;
  FT_RETURN_IF_ERROR(q.Next(&row));
  if (!row) return std::optional<JobRow>();
  return std::optional<JobRow>(ReadJob(q));
}

Status Store::RequireJob(const std::string& job_id, const std::string& op) {
  FT_ASSIGN_OR_RETURN(Query q, Prepare("SELECT 1 FROM jobs WHERE id = ?", op));
  q.Bind(job_id);
  bool row = false;
  FT_RETURN_IF_ERROR(q.Next(&row));
  return row ? Status::OK() : Status::NotFound("no job " + job_id);
}

StatusOr<int64_t> Store::InsertEvent(const EventRow& e, const std::string& op) {
  FT_ASSIGN_OR_RETURN(Query q, Prepare("INSERT INTO events (time_ms, job_id, worker_id, kind, message, step) "
                                       "VALUES (?, ?, ?, ?, ?, ?)",
                                       op));
  q.Bind(e.time_ms, e.job_id, e.worker_id, e.kind, e.message, e.step);
  FT_RETURN_IF_ERROR(q.Run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

// ---- jobs

StatusOr<JobRow> Store::CreateJob(JobRow job, bool* duplicate) {
  std::vector<bool> dup;
  FT_ASSIGN_OR_RETURN(std::vector<JobRow> created, CreateJobs({std::move(job)}, &dup));
  if (duplicate != nullptr) *duplicate = dup[0];
  return std::move(created[0]);
}

StatusOr<std::vector<JobRow>> Store::CreateJobs(std::vector<JobRow> jobs, std::vector<bool>* duplicates) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = jobs.size() == 1 ? "create job" : "create " + std::to_string(jobs.size()) + " jobs";
  std::vector<bool> dup(jobs.size(), false);
  FT_RETURN_IF_ERROR(Write(op, [&]() -> Status {
    for (size_t i = 0; i < jobs.size(); ++i) {
      bool d = false;
      FT_RETURN_IF_ERROR(InsertJob(jobs[i], &d, op));
      dup[i] = d;
    }
    return Status::OK();
  }));
  if (duplicates != nullptr) *duplicates = std::move(dup);
  return jobs;
}

Status Store::InsertJob(JobRow& job, bool* dup, const std::string& op) {
  if (!job.client_request_id.empty()) {
    FT_ASSIGN_OR_RETURN(std::optional<JobRow> existing,
                        FindJob("client_request_id", job.client_request_id, op));
    if (existing) {
      job = std::move(*existing);
      *dup = true;
      return Status::OK();
    }
  }
  // The counter lives in the database, so ids are never reused.
  FT_ASSIGN_OR_RETURN(
      Query next, Prepare("UPDATE counters SET value = value + 1 WHERE name = 'job' RETURNING value", op));
  bool row = false;
  FT_RETURN_IF_ERROR(next.Next(&row));
  if (!row) return Status::IOError(path_ + ": " + op + ": the job counter is missing");
  const int64_t num = next.Int(0);
  FT_RETURN_IF_ERROR(next.Run());
  job.id = JobId(num);
  job.state = JobStateCode::kQueued;
  if (job.created_ms == 0) job.created_ms = WallNowMs();
  if (job.updated_ms == 0) job.updated_ms = job.created_ms;
  FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("INSERT INTO jobs (num, ") + kJobColumns + ") VALUES (" +
                                           Placeholders(24) + ")",
                                       op));
  const JobRow& j = job;
  q.Bind(num, j.id, j.name, Code(j.state), j.reason, j.priority, j.spec_yaml, j.spec_dir, j.client_request_id,
         j.created_ms, j.updated_ms, j.total_steps, j.steps_done, j.last_loss, j.tokens_per_s, j.preemptions,
         j.failures, j.max_failures, j.output_dir, j.not_before_ms, j.gpus, j.device, j.submitted_by, j.team);
  FT_RETURN_IF_ERROR(q.Run());
  const std::string by = j.submitted_by.empty()
                             ? ""
                             : " by " + j.submitted_by + (j.team.empty() ? "" : " (team " + j.team + ")");
  EventRow e{.time_ms = j.created_ms, .job_id = j.id, .kind = "queued", .message = "submitted" + by};
  return InsertEvent(e, op).status();
}

StatusOr<JobRow> Store::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(std::optional<JobRow> job, FindJob("id", id, "get job " + id));
  if (!job) return Status::NotFound("no job " + id);
  return std::move(*job);
}

StatusOr<std::vector<JobRow>> Store::ListJobs(const std::vector<JobStateCode>& states, int64_t limit,
                                              const TeamScope& team) {
  std::lock_guard<std::mutex> lock(mu_);
  // One cached statement per number of distinct states (at most six).
  const std::set<JobStateCode> distinct(states.begin(), states.end());
  std::string sql = std::string("SELECT ") + kJobColumns + " FROM jobs WHERE 1";
  if (!distinct.empty()) sql += " AND state IN (" + Placeholders(static_cast<int>(distinct.size())) + ")";
  if (team) sql += " AND team = ?";
  sql += " ORDER BY created_ms, num LIMIT ?";
  FT_ASSIGN_OR_RETURN(Query q, Prepare(sql, "list jobs"));
  for (JobStateCode s : distinct) q.Bind(Code(s));
  if (team) q.Bind(*team);
  q.Bind(SqlLimit(limit));
  return Collect(q, ReadJob);
}

StatusOr<std::vector<JobRow>> Store::ListJobsNewest(const std::vector<JobStateCode>& states,
                                                    const std::string& contains, int64_t limit,
                                                    int64_t offset, const TeamScope& team) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::set<JobStateCode> distinct(states.begin(), states.end());
  std::string sql = std::string("SELECT ") + kJobColumns + " FROM jobs";
  std::vector<std::string> where;
  if (!distinct.empty())
    where.push_back("state IN (" + Placeholders(static_cast<int>(distinct.size())) + ")");
  if (team) where.push_back("team = ?");
  if (!contains.empty()) where.push_back("(id LIKE ? ESCAPE '\\' OR name LIKE ? ESCAPE '\\')");
  for (size_t i = 0; i < where.size(); ++i) sql += (i == 0 ? " WHERE " : " AND ") + where[i];
  sql += " ORDER BY created_ms DESC, num DESC LIMIT ? OFFSET ?";
  FT_ASSIGN_OR_RETURN(Query q, Prepare(sql, "list jobs"));
  for (JobStateCode s : distinct) q.Bind(Code(s));
  if (team) q.Bind(*team);
  if (!contains.empty()) {
    std::string pattern = "%";
    for (char c : contains) {
      if (c == '%' || c == '_' || c == '\\') pattern += '\\';
      pattern += c;
    }
    pattern += '%';
    q.Bind(pattern, pattern);
  }
  q.Bind(SqlLimit(limit), offset > 0 ? offset : int64_t{0});
  return Collect(q, ReadJob);
}

Status Store::UpdateJob(const JobRow& j) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "update job " + j.id;
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query q,
                        Prepare("UPDATE jobs SET name = ?, state = ?, reason = ?, priority = ?, "
                                "updated_ms = ?, total_steps = ?, steps_done = ?, last_loss = ?, "
                                "tokens_per_s = ?, preemptions = ?, failures = ?, max_failures = ?, "
                                "output_dir = ?, not_before_ms = ?, gpus = ?, device = ? WHERE id = ?",
                                op));
    q.Bind(j.name, Code(j.state), j.reason, j.priority, j.updated_ms, j.total_steps, j.steps_done,
           j.last_loss, j.tokens_per_s, j.preemptions, j.failures, j.max_failures, j.output_dir,
           j.not_before_ms, j.gpus, j.device, j.id);
    FT_RETURN_IF_ERROR(q.Run());
    return q.Changes() == 1 ? Status::OK() : Status::NotFound("no job " + j.id);
  });
}

// ---- attempts

StatusOr<AttemptRow> Store::StartAttempt(const std::string& job_id, const std::string& worker_id,
                                         int64_t start_step, int64_t micro_batch, int64_t accumulation,
                                         int64_t world, int64_t now_ms, const std::vector<RankSlot>& ranks,
                                         const std::string& pool, double price) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "start attempt of " + job_id;
  AttemptRow a{.job_id = job_id,
               .worker_id = worker_id,
               .outcome = AttemptOutcomeCode::kRunning,
               .started_ms = now_ms,
               .start_step = start_step,
               .end_step = start_step,
               .micro_batch = micro_batch,
               .accumulation = accumulation,
               .world = world,
               .ranks = ranks.size() > 1 ? ranks : std::vector<RankSlot>{}};
  a.pool = pool;
  a.price = price;
  FT_RETURN_IF_ERROR(Write(op, [&]() -> Status {
    FT_RETURN_IF_ERROR(RequireJob(job_id, op));
    FT_ASSIGN_OR_RETURN(
        Query last,
        Prepare("SELECT COALESCE(MAX(number), 0), COALESCE(MAX(epoch), 0) FROM attempts WHERE job_id = ?",
                op));
    bool row = false;
    FT_RETURN_IF_ERROR(last.Bind(job_id).Next(&row));
    a.number = last.Int(0) + 1;
    a.epoch = last.Int(1) + 1;
    FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("INSERT INTO attempts (") + kAttemptColumns +
                                             ") VALUES (" + Placeholders(20) + ")",
                                         op));
    q.Bind(a.job_id, a.number, a.epoch, a.worker_id, Code(a.outcome), a.reason, a.started_ms, a.ended_ms,
           a.start_step, a.end_step, a.steps_lost, a.micro_batch, a.accumulation, a.world, JoinRanks(a),
           int64_t{a.lost ? 1 : 0}, a.notice_ms, a.pool, a.price, a.preempted_for);
    return q.Run();
  }));
  return a;
}

Status Store::EndAttempt(const std::string& job_id, int64_t epoch, AttemptOutcomeCode outcome,
                         const std::string& reason, int64_t end_step, int64_t steps_lost, int64_t now_ms,
                         bool lost, int64_t notice_ms, const GoodputSplit* goodput, int64_t seen_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "end attempt " + std::to_string(epoch) + " of " + job_id;
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query q, Prepare("UPDATE attempts SET outcome = ?, reason = ?, end_step = ?, "
                                         "steps_lost = ?, ended_ms = ?, lost = ?, notice_ms = ?, "
                                         "productive_s = ?, checkpoint_s = ?, restart_s = ?, lost_s = ?, "
                                         "seen_ms = ? WHERE job_id = ? AND epoch = ?",
                                         op));
    q.Bind(Code(outcome), reason, end_step, steps_lost, now_ms, int64_t{lost ? 1 : 0}, notice_ms);
    if (goodput != nullptr) {
      q.Bind(goodput->productive_s, goodput->checkpoint_s, goodput->restart_s, goodput->lost_s);
    } else {
      q.Bind(nullptr, nullptr, nullptr, nullptr);
    }
    FT_RETURN_IF_ERROR(q.Bind(seen_ms, job_id, epoch).Run());
    if (q.Changes() == 1) return Status::OK();
    return Status::NotFound("job " + job_id + " has no attempt with epoch " + std::to_string(epoch));
  });
}

Status Store::MarkPreemptedFor(const std::string& job_id, int64_t epoch, const std::string& for_job) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op =
      "mark attempt " + std::to_string(epoch) + " of " + job_id + " preempted for " + for_job;
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query q,
                        Prepare("UPDATE attempts SET preempted_for = ? WHERE job_id = ? AND epoch = ?", op));
    FT_RETURN_IF_ERROR(q.Bind(for_job, job_id, epoch).Run());
    if (q.Changes() == 1) return Status::OK();
    return Status::NotFound("job " + job_id + " has no attempt with epoch " + std::to_string(epoch));
  });
}

StatusOr<std::vector<AttemptRow>> Store::ListAttempts(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("SELECT ") + kAttemptColumns +
                                           " FROM attempts WHERE job_id = ? ORDER BY number",
                                       "list attempts of " + job_id));
  return Collect(q.Bind(job_id), ReadAttempt);
}

StatusOr<std::map<std::string, Store::AttemptTotals>> Store::EndedAttemptTotals(AttemptGroup by) {
  std::lock_guard<std::mutex> lock(mu_);
  static_assert(static_cast<int>(AttemptOutcomeCode::kRunning) == 1 &&
                static_cast<int>(AttemptOutcomeCode::kPreempted) == 3);
  const std::string key = by == AttemptGroup::kPool ? "pool" : "worker_id";
  FT_ASSIGN_OR_RETURN(
      Query q, Prepare("SELECT " + key +
                           ", SUM(MAX(started_ms, CASE WHEN seen_ms > 0 AND seen_ms < ended_ms "
                           "THEN seen_ms ELSE ended_ms END) - started_ms), SUM(outcome = 3 AND preempted_for "
                           "= ''), COUNT(*), "
                           "TOTAL(productive_s), TOTAL(checkpoint_s), TOTAL(restart_s), "
                           "TOTAL(lost_s), TOTAL(productive_s * price), TOTAL(checkpoint_s * price), "
                           "TOTAL(restart_s * price), TOTAL(lost_s * price) FROM attempts WHERE outcome != 1 "
                           "GROUP BY " +
                           key,
                       "attempt totals by " + key));
  std::map<std::string, AttemptTotals> out;
  for (;;) {
    bool row = false;
    FT_RETURN_IF_ERROR(q.Next(&row));
    if (!row) return out;
    out[q.Text(0)] =
        AttemptTotals{.seconds = static_cast<double>(q.Int(1)) / 1000.0,
                      .preemptions = q.Int(2),
                      .attempts = q.Int(3),
                      .device = {q.Real(4), q.Real(5), q.Real(6), q.Real(7)},
                      .cost = CostSplit::Priced({q.Real(8), q.Real(9), q.Real(10), q.Real(11)}, 1.0)};
  }
}

StatusOr<std::vector<Store::UsageSpan>> Store::UsageSpans(int64_t ended_after_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  static_assert(static_cast<int>(AttemptOutcomeCode::kRunning) == 1);
  FT_ASSIGN_OR_RETURN(Query q,
                      Prepare("SELECT j.team, a.started_ms, CASE WHEN a.outcome = 1 THEN 0 ELSE "
                              "a.ended_ms END, MAX(1, a.world) FROM attempts a JOIN jobs j ON j.id = "
                              "a.job_id WHERE a.outcome = 1 OR a.ended_ms > ?",
                              "usage spans"));
  q.Bind(ended_after_ms);
  return Collect(q, [](const Query& r) {
    return UsageSpan{.team = r.Text(0), .started_ms = r.Int(1), .ended_ms = r.Int(2), .devices = r.Int(3)};
  });
}

StatusOr<std::map<std::string, double>> Store::EndedSpendByTeam() {
  std::lock_guard<std::mutex> lock(mu_);
  static_assert(static_cast<int>(AttemptOutcomeCode::kRunning) == 1);
  FT_ASSIGN_OR_RETURN(Query q, Prepare("SELECT j.team, TOTAL(MAX(0, a.ended_ms - a.started_ms) * a.world * "
                                       "a.price) / 3600000.0 FROM attempts a JOIN jobs j ON j.id = a.job_id "
                                       "WHERE a.outcome != 1 AND a.price > 0 GROUP BY j.team",
                                       "spend by team"));
  std::map<std::string, double> out;
  for (;;) {
    bool row = false;
    FT_RETURN_IF_ERROR(q.Next(&row));
    if (!row) return out;
    out[q.Text(0)] = q.Real(1);
  }
}

StatusOr<std::vector<AttemptRow>> Store::RunningAttempts() {
  std::lock_guard<std::mutex> lock(mu_);
  // "outcome = 1" literally, so that the partial index attempts_running applies.
  static_assert(static_cast<int>(AttemptOutcomeCode::kRunning) == 1);
  FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("SELECT ") + kAttemptColumns +
                                           " FROM attempts WHERE outcome = 1 ORDER BY job_id, number",
                                       "list running attempts"));
  return Collect(q, ReadAttempt);
}

// ---- checkpoints

Status Store::AddCheckpoint(const CheckpointRow& c) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "add checkpoint of " + c.job_id + " at step " + std::to_string(c.step);
  return Write(op, [&]() -> Status {
    FT_RETURN_IF_ERROR(RequireJob(c.job_id, op));
    FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("INSERT OR REPLACE INTO checkpoints (") +
                                             kCheckpointColumns + ") VALUES (" + Placeholders(7) + ")",
                                         op));
    return q.Bind(c.job_id, c.epoch, c.step, c.dir, c.manifest_sha256, c.write_seconds, c.committed_ms).Run();
  });
}

StatusOr<CheckpointRow> Store::LatestCheckpoint(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q,
                      Prepare(std::string("SELECT ") + kCheckpointColumns +
                                  " FROM checkpoints WHERE job_id = ? ORDER BY step DESC, epoch DESC "
                                  "LIMIT 1",
                              "latest checkpoint of " + job_id));
  bool row = false;
  FT_RETURN_IF_ERROR(q.Bind(job_id).Next(&row));
  if (!row) return Status::NotFound("job " + job_id + " has no committed checkpoint");
  return ReadCheckpoint(q);
}

StatusOr<std::vector<CheckpointRow>> Store::ListCheckpointRows(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("SELECT ") + kCheckpointColumns +
                                           " FROM checkpoints WHERE job_id = ? ORDER BY step, epoch",
                                       "checkpoints of " + job_id));
  return Collect(q.Bind(job_id), ReadCheckpoint);
}

// ---- workers

Status Store::UpsertWorker(const WorkerRow& w) {
  std::set<int32_t> indexes;
  for (const DeviceRow& d : w.devices) {
    if (!indexes.insert(d.index).second) {
      return Status::InvalidArgument("worker " + w.id + " reports device index " + std::to_string(d.index) +
                                     " twice");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "upsert worker " + w.id;
  return Write(
      op,
      [&]() -> Status {
        FT_ASSIGN_OR_RETURN(
            Query q,
            Prepare(
                "INSERT INTO workers (id, hostname, version, last_seen_ms, slot_end_ms, "
                "alive, pool, price) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "hostname = excluded.hostname, version = excluded.version, "
                "last_seen_ms = excluded.last_seen_ms, slot_end_ms = "
                "excluded.slot_end_ms, alive = excluded.alive, pool = excluded.pool, price = excluded.price",
                op));
        FT_RETURN_IF_ERROR(
            q.Bind(w.id, w.hostname, w.version, w.last_seen_ms, w.slot_end_ms, int{w.alive}, w.pool, w.price)
                .Run());
        FT_ASSIGN_OR_RETURN(Query del, Prepare("DELETE FROM devices WHERE worker_id = ?", op));
        FT_RETURN_IF_ERROR(del.Bind(w.id).Run());
        for (const DeviceRow& d : w.devices) {
          FT_ASSIGN_OR_RETURN(Query ins,
                              Prepare("INSERT INTO devices (worker_id, idx, kind, name, total_bytes, "
                                      "free_bytes, used_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                      op));
          FT_RETURN_IF_ERROR(
              ins.Bind(w.id, d.index, d.kind, d.name, d.total_bytes, d.free_bytes, d.used_bytes).Run());
        }
        return Status::OK();
        // Relaxed: a worker's row is what it last told; after a crash the worker registers again.
      },
      Durability::kRelaxed);
}

Status Store::SetWorkerAlive(const std::string& id, bool alive, int64_t last_seen_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "set worker " + id + (alive ? " alive" : " dead");
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query q, Prepare("UPDATE workers SET alive = ?, last_seen_ms = ? WHERE id = ?", op));
    FT_RETURN_IF_ERROR(q.Bind(int{alive}, last_seen_ms, id).Run());
    return q.Changes() == 1 ? Status::OK() : Status::NotFound("no worker " + id);
  });
}

Status Store::TouchWorkers(const std::vector<std::pair<std::string, int64_t>>& last_seen_ms) {
  if (last_seen_ms.empty()) return Status::OK();
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "heartbeats of " + std::to_string(last_seen_ms.size()) + " workers";
  return Write(
      op,
      [&]() -> Status {
        for (const auto& [id, ms] : last_seen_ms) {
          FT_ASSIGN_OR_RETURN(Query q,
                              Prepare("UPDATE workers SET alive = 1, last_seen_ms = ? WHERE id = ?", op));
          FT_RETURN_IF_ERROR(q.Bind(ms, id).Run());
        }
        return Status::OK();
      },
      Durability::kRelaxed);
}

Status Store::RecordProgress(const ProgressRow& p) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "progress of " + p.job_id + " epoch " + std::to_string(p.epoch);
  return Write(
      op,
      [&]() -> Status {
        FT_ASSIGN_OR_RETURN(Query job,
                            Prepare("UPDATE jobs SET steps_done = ?, last_loss = ?, tokens_per_s = ?, "
                                    "total_steps = CASE WHEN ? > 0 THEN ? ELSE total_steps END, "
                                    "updated_ms = ? WHERE id = ?",
                                    op));
        FT_RETURN_IF_ERROR(
            job.Bind(p.step, p.loss, p.tokens_per_s, p.total_steps, p.total_steps, p.time_ms, p.job_id)
                .Run());
        if (job.Changes() != 1) return Status::NotFound("no job " + p.job_id);
        FT_ASSIGN_OR_RETURN(Query attempt,
                            Prepare("UPDATE attempts SET end_step = ? WHERE job_id = ? AND epoch = ?", op));
        FT_RETURN_IF_ERROR(attempt.Bind(p.step, p.job_id, p.epoch).Run());
        if (attempt.Changes() == 1) return Status::OK();
        return Status::NotFound("job " + p.job_id + " has no attempt with epoch " + std::to_string(p.epoch));
      },
      Durability::kRelaxed);
}

StatusOr<std::vector<WorkerRow>> Store::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  // One statement, so workers and devices come from one snapshot.
  FT_ASSIGN_OR_RETURN(
      Query q,
      Prepare("SELECT w.id, w.hostname, w.version, w.last_seen_ms, w.slot_end_ms, "
              "w.alive, d.idx, d.kind, d.name, d.total_bytes, d.free_bytes, "
              "d.used_bytes, w.pool, w.price FROM workers w LEFT JOIN devices d ON d.worker_id = w.id "
              "ORDER BY w.id, d.idx",
              "list workers"));
  std::vector<WorkerRow> workers;
  for (;;) {
    bool row = false;
    FT_RETURN_IF_ERROR(q.Next(&row));
    if (!row) return workers;
    if (workers.empty() || workers.back().id != q.Text(0)) {
      workers.push_back(WorkerRow{.id = q.Text(0),
                                  .hostname = q.Text(1),
                                  .version = q.Text(2),
                                  .last_seen_ms = q.Int(3),
                                  .slot_end_ms = q.Int(4),
                                  .alive = q.Int(5) != 0,
                                  .pool = q.Text(12),
                                  .price = q.Real(13)});
    }
    if (q.IsNull(6)) continue;  // a worker without devices
    workers.back().devices.push_back(DeviceRow{.index = static_cast<int32_t>(q.Int(6)),
                                               .kind = q.Text(7),
                                               .name = q.Text(8),
                                               .total_bytes = q.Int(9),
                                               .free_bytes = q.Int(10),
                                               .used_bytes = q.Int(11)});
  }
}

// ---- events and metrics

StatusOr<int64_t> Store::AddEvent(EventRow e) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "add event " + e.kind + (e.job_id.empty() ? "" : " of " + e.job_id);
  FT_RETURN_IF_ERROR(Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(e.seq, InsertEvent(e, op));
    return Status::OK();
  }));
  return e.seq;
}

StatusOr<std::vector<EventRow>> Store::ListEvents(const std::string& job_id, int64_t after_seq, int64_t limit,
                                                  const TeamScope& team) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string select = std::string("SELECT ") + kEventColumns + " FROM events WHERE ";
  if (job_id.empty() && team) {
    // The team's jobs' events and the worker events; never user management events (kinds user_*).
    FT_ASSIGN_OR_RETURN(
        Query q, Prepare(select + "seq > ? AND ((job_id = '' AND kind NOT LIKE 'user\\_%' ESCAPE '\\') "
                                  "OR job_id IN (SELECT id FROM jobs WHERE team = ?)) ORDER BY seq LIMIT ?",
                         "list events of team " + *team));
    return Collect(q.Bind(after_seq, *team, SqlLimit(limit)), ReadEvent);
  }
  if (job_id.empty()) {
    FT_ASSIGN_OR_RETURN(Query q, Prepare(select + "seq > ? ORDER BY seq LIMIT ?", "list events"));
    return Collect(q.Bind(after_seq, SqlLimit(limit)), ReadEvent);
  }
  FT_ASSIGN_OR_RETURN(
      Query q, Prepare(select + "job_id = ? AND seq > ? ORDER BY seq LIMIT ?", "list events of " + job_id));
  return Collect(q.Bind(job_id, after_seq, SqlLimit(limit)), ReadEvent);
}

Status Store::AddMetrics(const std::vector<MetricRow>& rows, std::vector<MetricRow>* stored) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "add " + std::to_string(rows.size()) + " metric rows";
  // A training point replaces the step's training fields; an eval-only point sets eval_loss.
  // Either keeps what the other one wrote (a NaN binds as NULL: none).
  const std::string insert = std::string("INSERT INTO metrics (") + kMetricColumns + ") VALUES (" +
                             Placeholders(14) + ") ON CONFLICT (job_id, step, epoch) DO UPDATE SET ";
  const std::string returning = std::string(" RETURNING ") + kMetricColumns;
  if (stored) stored->clear();
  return Write(op, [&]() -> Status {
    for (const MetricRow& m : rows) {
      FT_ASSIGN_OR_RETURN(
          Query q, Prepare(insert +
                               (m.eval_only ? "eval_loss = excluded.eval_loss, "
                                              "objective = COALESCE(excluded.objective, objective)"
                                            : "loss = excluded.loss, lr = excluded.lr, grad_norm = "
                                              "excluded.grad_norm, tokens_per_s = excluded.tokens_per_s, "
                                              "peak_bytes = excluded.peak_bytes, time_ms = excluded.time_ms, "
                                              "eval_loss = COALESCE(excluded.eval_loss, eval_loss), "
                                              "tokens_seen = excluded.tokens_seen, "
                                              "step_seconds = excluded.step_seconds, "
                                              "copy_wait_seconds = excluded.copy_wait_seconds, "
                                              "objective = COALESCE(excluded.objective, objective)") +
                               returning,
                           op));
      const double none = std::numeric_limits<double>::quiet_NaN();
      q.Bind(m.job_id, m.epoch, m.step);
      if (m.eval_only) {
        q.Bind(none, none, none, none, int64_t{0});
      } else {
        q.Bind(m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.peak_bytes);
      }
      q.Bind(m.time_ms, m.eval_loss, m.eval_only ? int64_t{0} : m.tokens_seen);
      q.Bind(m.eval_only ? none : m.step_seconds, m.eval_only ? none : m.copy_wait_seconds);
      FT_ASSIGN_OR_RETURN(const std::string objective, MergedObjective(m, op));
      if (objective.empty()) {
        q.Bind(nullptr);
      } else {
        q.Bind(objective);
      }
      bool row = false;
      FT_RETURN_IF_ERROR(q.Next(&row));
      if (row && stored) stored->push_back(ReadMetric(q));
      FT_RETURN_IF_ERROR(q.Run());
    }
    return Status::OK();
  });
}

StatusOr<std::string> Store::MergedObjective(const MetricRow& m, const std::string& op) {
  std::map<std::string, double> kept = KeepObjectiveMetrics(m.objective_metrics);
  if (kept.empty()) return std::string();
  FT_ASSIGN_OR_RETURN(
      Query q, Prepare("SELECT objective FROM metrics WHERE job_id = ? AND step = ? AND epoch = ?", op));
  bool row = false;
  FT_RETURN_IF_ERROR(q.Bind(m.job_id, m.step, m.epoch).Next(&row));
  if (!row) return FormatObjective(kept);
  std::map<std::string, double> merged = ParseObjective(q.Text(0));
  for (const auto& [name, value] : kept) merged[name] = value;
  return FormatObjective(KeepObjectiveMetrics(merged));
}

StatusOr<std::vector<MetricRow>> Store::ListMetrics(const std::string& job_id, int64_t after_step,
                                                    int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("SELECT ") + kMetricColumns +
                                           " FROM metrics WHERE job_id = ? AND step > ? ORDER BY step, epoch "
                                           "LIMIT ?",
                                       "list metrics of " + job_id));
  return Collect(q.Bind(job_id, after_step, SqlLimit(limit)), ReadMetric);
}

StatusOr<std::map<std::string, double>> Store::LatestObjectiveMetrics(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q, Prepare(LatestObjectiveSql("?"), "read the objective metrics of " + job_id));
  bool row = false;
  FT_RETURN_IF_ERROR(q.Bind(job_id).Next(&row));
  return row ? ParseObjective(q.Text(0)) : std::map<std::string, double>();
}

StatusOr<std::map<std::string, std::map<std::string, double>>> Store::LiveObjectiveMetrics() {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q, Prepare("SELECT j.id, (" + LatestObjectiveSql("j.id") +
                                           ") FROM jobs j WHERE j.state IN (?, ?, ?) ORDER BY j.num",
                                       "read the objective metrics of the live jobs"));
  q.Bind(Code(JobStateCode::kQueued), Code(JobStateCode::kRunning), Code(JobStateCode::kPreempted));
  std::map<std::string, std::map<std::string, double>> out;
  for (;;) {
    bool row = false;
    FT_RETURN_IF_ERROR(q.Next(&row));
    if (!row) return out;
    if (auto metrics = ParseObjective(q.Text(1)); !metrics.empty()) out[q.Text(0)] = std::move(metrics);
  }
}

StatusOr<std::unordered_map<std::string, std::vector<double>>> Store::LossSparklines(
    const std::vector<std::string>& job_ids, int buckets) {
  if (buckets < 1) return Status::InvalidArgument("loss sparklines: buckets must be >= 1");
  std::string ids = "[";  // a JSON array of the ids, read back by json_each: one query for every job
  for (const std::string& id : job_ids) {
    if (ids.size() > 1) ids += ",";
    ids += "\"";
    for (char c : id) {
      if (c == '"' || c == '\\') ids += '\\';
      ids += c;
    }
    ids += "\"";
  }
  ids += "]";
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(
      Query q,
      Prepare("SELECT m.job_id, MIN(?1 - 1, MAX(0, (m.step - 1) * ?1 / MAX(j.total_steps, 1))) AS b, "
              "AVG(m.loss) FROM metrics m JOIN jobs j ON j.id = m.job_id "
              "WHERE m.job_id IN (SELECT value FROM json_each(?2)) "
              "GROUP BY m.job_id, b ORDER BY m.job_id, b",
              "loss sparklines"));
  q.Bind(int64_t{buckets}, ids);
  std::unordered_map<std::string, std::vector<double>> out;
  for (;;) {
    bool row = false;
    FT_RETURN_IF_ERROR(q.Next(&row));
    if (!row) return out;
    out[q.Text(0)].push_back(q.Real(2));
  }
}

// ---- device memory

Status Store::RecordDeviceMemory(const std::string& worker_id, const std::string& job_id, int64_t time_ms,
                                 const std::vector<DeviceRow>& devices) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "record device memory of worker " + worker_id;
  auto record = [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query known, Prepare("SELECT 1 FROM workers WHERE id = ?", op));
    bool row = false;
    FT_RETURN_IF_ERROR(known.Bind(worker_id).Next(&row));
    if (!row) return Status::NotFound("no worker " + worker_id);
    for (const DeviceRow& d : devices) {
      FT_ASSIGN_OR_RETURN(Query upd,
                          Prepare("UPDATE devices SET total_bytes = ?, free_bytes = ?, used_bytes = ? "
                                  "WHERE worker_id = ? AND idx = ?",
                                  op));
      FT_RETURN_IF_ERROR(upd.Bind(d.total_bytes, d.free_bytes, d.used_bytes, worker_id, d.index).Run());
      if (job_id.empty()) continue;
      FT_ASSIGN_OR_RETURN(Query ins,
                          Prepare("INSERT OR REPLACE INTO device_memory (job_id, time_ms, worker_id, "
                                  "device, used_bytes, total_bytes) VALUES (?, ?, ?, ?, ?, ?)",
                                  op));
      FT_RETURN_IF_ERROR(ins.Bind(job_id, time_ms, worker_id, d.index, d.used_bytes, d.total_bytes).Run());
    }
    return Status::OK();
  };
  // Heartbeat-rate: atomic, made durable by the next synced commit.
  return Write(op, record, Durability::kRelaxed);
}

StatusOr<std::vector<DeviceMemoryRow>> Store::ListDeviceMemory(const std::string& job_id, int64_t after_ms,
                                                               int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q, Prepare("SELECT job_id, time_ms, worker_id, device, used_bytes, total_bytes "
                                       "FROM device_memory WHERE job_id = ? AND time_ms > ? "
                                       "ORDER BY time_ms, worker_id, device LIMIT ?",
                                       "list device memory of " + job_id));
  return Collect(q.Bind(job_id, after_ms, SqlLimit(limit)), [](const Query& r) {
    return DeviceMemoryRow{.job_id = r.Text(0),
                           .time_ms = r.Int(1),
                           .worker_id = r.Text(2),
                           .device = static_cast<int32_t>(r.Int(3)),
                           .used_bytes = r.Int(4),
                           .total_bytes = r.Int(5)};
  });
}

// ---- monitoring

StatusOr<StoreTotals> Store::Totals() {
  std::lock_guard<std::mutex> lock(mu_);
  StoreTotals t;
  for (int s = static_cast<int>(JobStateCode::kQueued); s <= static_cast<int>(JobStateCode::kCancelled);
       ++s) {
    t.jobs_by_state[static_cast<JobStateCode>(s)] = 0;
  }
  {
    FT_ASSIGN_OR_RETURN(Query q, Prepare("SELECT state, COUNT(*), SUM(preemptions), SUM(failures) FROM jobs "
                                         "GROUP BY state",
                                         "count jobs"));
    for (;;) {
      bool row = false;
      FT_RETURN_IF_ERROR(q.Next(&row));
      if (!row) break;
      t.jobs_by_state[static_cast<JobStateCode>(q.Int(0))] = q.Int(1);
      t.preemptions += q.Int(2);
      t.failures += q.Int(3);
    }
  }
  FT_ASSIGN_OR_RETURN(Query q, Prepare("SELECT COUNT(*) FROM attempts", "count attempts"));
  bool row = false;
  FT_RETURN_IF_ERROR(q.Next(&row));
  t.attempts = row ? q.Int(0) : 0;
  return t;
}

Status Store::sticky_error() {
  std::lock_guard<std::mutex> lock(mu_);
  return sticky_;
}

void Store::SetCommitHookForTest(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  commit_hook_ = std::move(hook);
}

namespace {
// One synced write of a counter the daemon never reads.
constexpr char kProbeWriteSql[] =
    "INSERT INTO counters (name, value) VALUES ('recovered', 1) "
    "ON CONFLICT (name) DO UPDATE SET value = value + 1";
}  // namespace

Status Store::ProbeWrite() {
  std::lock_guard<std::mutex> lock(mu_);
  return Write("probe write", [&] { return Exec(kProbeWriteSql, "probe write"); });
}

Status Store::Recover() {
  std::lock_guard<std::mutex> lock(mu_);
  if (sticky_.ok()) return Status::OK();
  // A full disk lets a small write through whenever SQLite reuses its WAL,
  // so ask the filesystem too.
  struct statvfs st {};
  if (statvfs(DirectoryOf(path_).c_str(), &st) == 0 &&
      static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize) < kRecoveryFreeBytes) {
    return Status::IOError(path_ + ": recover: " + std::to_string(st.f_bavail * st.f_frsize >> 10) +
                           " KiB free on its filesystem; waiting for " +
                           std::to_string(kRecoveryFreeBytes >> 20) + " MiB");
  }
  // A -wal or -shm replaced meanwhile: a second connection would share this one's (deleted) -shm.
  (void)CheckFilesLocked();
  if (!replaced_file_.empty()) return ReopenAfterReplacedFiles();
  auto fresh = Open(path_, false);  // checked at start; not again on every retry of the tick
  Status probe = fresh.ok() ? (*fresh)->ProbeWrite() : fresh.status();
  if (!probe.ok())
    return probe.IsIOError() ? probe : Status::IOError(path_ + ": recover: " + probe.ToString());
  // The old connection (and its statements) closes with `fresh`.
  std::swap(db_, (*fresh)->db_);
  std::swap(stmts_, (*fresh)->stmts_);
  std::swap(wal_file_, (*fresh)->wal_file_);
  std::swap(shm_file_, (*fresh)->shm_file_);
  sticky_ = Status::OK();
  return Status::OK();
}

// ---- users

Status Store::AddUser(const UserRow& u) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "add user " + u.name;
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query exists, Prepare("SELECT 1 FROM users WHERE name = ?", op));
    bool row = false;
    FT_RETURN_IF_ERROR(exists.Bind(u.name).Next(&row));
    if (row) return Status::FailedPrecondition("user " + u.name + " already exists");
    FT_RETURN_IF_ERROR(exists.Run());
    FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("INSERT INTO users (") + kUserColumns + ") VALUES (" +
                                             Placeholders(7) + ")",
                                         op));
    FT_RETURN_IF_ERROR(
        q.Bind(u.name, u.team, u.role, u.token_id, u.token_salt, u.token_hash, u.created_ms).Run());
    has_users_ = 1;
    return Status::OK();
  });
}

Status Store::RemoveUser(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "remove user " + name;
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query q, Prepare("DELETE FROM users WHERE name = ?", op));
    FT_RETURN_IF_ERROR(q.Bind(name).Run());
    has_users_ = -1;  // read again
    return q.Changes() == 1 ? Status::OK() : Status::NotFound("no user " + name);
  });
}

Status Store::SetUserToken(const std::string& name, const std::string& token_id, const std::string& salt,
                           const std::string& hash) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "set the token of user " + name;
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(
        Query q, Prepare("UPDATE users SET token_id = ?, token_salt = ?, token_hash = ? WHERE name = ?", op));
    FT_RETURN_IF_ERROR(q.Bind(token_id, salt, hash, name).Run());
    return q.Changes() == 1 ? Status::OK() : Status::NotFound("no user " + name);
  });
}

StatusOr<std::vector<UserRow>> Store::ListUsers() {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(
      Query q, Prepare(std::string("SELECT ") + kUserColumns + " FROM users ORDER BY name", "list users"));
  return Collect(q, ReadUser);
}

StatusOr<std::optional<UserRow>> Store::UserByTokenId(const std::string& token_id) {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q,
                      Prepare(std::string("SELECT ") + kUserColumns + " FROM users WHERE token_id = ?",
                              "find a user by token"));
  bool row = false;
  FT_RETURN_IF_ERROR(q.Bind(token_id).Next(&row));
  if (!row) return std::optional<UserRow>();
  return std::optional<UserRow>(ReadUser(q));
}

// ---- teams

Status Store::SetTeam(const TeamRow& t) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "set team " + t.name;
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query q,
                        Prepare("INSERT INTO teams (name, quota_devices, weight, max_queued, budget, "
                                "updated_ms) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                                "quota_devices = excluded.quota_devices, weight = excluded.weight, "
                                "max_queued = excluded.max_queued, budget = excluded.budget, "
                                "updated_ms = excluded.updated_ms",
                                op));
    q.Bind(t.name, t.quota_devices, t.weight, t.max_queued);
    if (t.budget) {
      q.Bind(*t.budget);
    } else {
      q.Bind(nullptr);
    }
    return q.Bind(t.updated_ms).Run();
  });
}

StatusOr<std::vector<TeamRow>> Store::ListTeams() {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(
      Query q,
      Prepare("SELECT name, quota_devices, weight, max_queued, budget, updated_ms FROM teams ORDER BY name",
              "list teams"));
  return Collect(q, [](const Query& r) {
    return TeamRow{.name = r.Text(0),
                   .quota_devices = r.Int(1),
                   .weight = r.Real(2),
                   .max_queued = r.Int(3),
                   .budget = r.IsNull(4) ? std::nullopt : std::optional<double>(r.Real(4)),
                   .updated_ms = r.Int(5)};
  });
}

StatusOr<bool> Store::HasUsers() {
  if (const int known = has_users_; known >= 0) return known == 1;
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(std::string any, QueryText("SELECT 1 FROM users LIMIT 1", "count users"));
  has_users_ = any.empty() ? 0 : 1;
  return !any.empty();
}

StatusOr<std::string> Store::AttemptKey(const std::string& candidate) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "read the attempt key";
  const std::string select = "SELECT value FROM secrets WHERE name = 'attempt_key'";
  FT_ASSIGN_OR_RETURN(std::string key, QueryText(select, op));
  if (!key.empty()) return key;
  if (candidate.empty()) return Status::NotFound(path_ + ": " + op + ": none was made yet");
  FT_RETURN_IF_ERROR(Write("store the attempt key", [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query q,
                        Prepare("INSERT OR IGNORE INTO secrets (name, value) VALUES ('attempt_key', ?)", op));
    return q.Bind(candidate).Run();
  }));
  return QueryText(select, op);
}

StatusOr<int> Store::SynchronousLevel() {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(std::string level, QueryText("PRAGMA synchronous", "read synchronous"));
  return static_cast<int>(std::strtol(level.c_str(), nullptr, 10));
}

StatusOr<std::vector<std::pair<std::string, std::string>>> Store::ListOutputDirs() {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q, Prepare("SELECT id, output_dir FROM jobs ORDER BY num", "list output dirs"));
  return Collect(q, [](const Query& r) { return std::make_pair(r.Text(0), r.Text(1)); });
}

// ---- the database's files

namespace {

// {device, inode} of the file at `path`; {0, 0} when there is none.
std::pair<uint64_t, uint64_t> FileIdentity(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return {0, 0};
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

constexpr char kLeaveAlone[] = "; leave ftd's database and its -wal and -shm files alone while ftd runs";

}  // namespace

void Store::RecordFiles() {
  wal_file_ = FileIdentity(path_ + "-wal");
  shm_file_ = FileIdentity(path_ + "-shm");
}

Status Store::CheckFiles() {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckFilesLocked();
}

bool Store::files_replaced() {
  std::lock_guard<std::mutex> lock(mu_);
  return !replaced_file_.empty();
}

Status Store::CheckFilesLocked() {
  if (!replaced_file_.empty()) return sticky_;
  if (db_ == nullptr) return Status::OK();
  int moved = 0;
  if (sqlite3_file_control(db_, "main", SQLITE_FCNTL_HAS_MOVED, &moved) == SQLITE_OK && moved != 0) {
    replaced_file_ = path_;
  } else if (wal_file_.second != 0 && FileIdentity(path_ + "-wal") != wal_file_) {
    replaced_file_ = path_ + "-wal";
  } else if (shm_file_.second != 0 && FileIdentity(path_ + "-shm") != shm_file_) {
    replaced_file_ = path_ + "-shm";
  } else {
    return Status::OK();
  }
  const std::string what = path_ + ": " + replaced_file_ +
                           " was deleted or replaced while ftd had the database open (a cleanup script, a "
                           "backup tool?), so what ftd commits there would be lost by a restart: ";
  if (replaced_file_ == path_) {
    auto copy = SaveCopy();
    sticky_ = Status::IOError(
        what + "ftd refuses writes. " +
        (copy.ok() ? "It wrote everything it acknowledged to " + *copy + ": stop ftd, move that file to " +
                         path_ + " (removing its -wal and -shm files) and start ftd again"
                   : "Saving a copy failed (" + copy.status().message() +
                         "): do not stop ftd; copy its open database from /proc/" + std::to_string(getpid()) +
                         "/fd to " + path_ + ".saved first") +
        kLeaveAlone);
    return sticky_;
  }
  const Status saved = SaveWal();
  wal_saved_ = saved.ok();
  sticky_ = Status::IOError(
      what +
      (wal_saved_ ? "ftd copied everything it had committed into " + path_ +
                        " and refuses writes until it has reopened the database (within seconds)"
                  : "copying what ftd had committed into " + path_ + " failed (" + saved.message() +
                        "): ftd refuses writes and tries again; do not stop ftd meanwhile") +
      kLeaveAlone);
  return sticky_;
}

Status Store::SaveWal() {
  const std::string op = "copy the WAL into the database (PRAGMA wal_checkpoint(TRUNCATE))";
  FT_ASSIGN_OR_RETURN(Query q, Prepare("PRAGMA wal_checkpoint(TRUNCATE)", op));
  bool row = false;
  FT_RETURN_IF_ERROR(q.Next(&row));
  if (!row || q.Int(0) != 0) return Status::IOError(path_ + ": " + op + ": another connection blocked it");
  return Status::OK();
}

StatusOr<std::string> Store::SaveCopy() {
  const std::string copy = path_ + ".saved-" + std::to_string(WallNowMs());
  const std::string op = "save a copy of the database to " + copy + " (VACUUM INTO)";
  {
    FT_ASSIGN_OR_RETURN(Query q, Prepare("VACUUM INTO ?", op));
    q.Bind(copy);
    FT_RETURN_IF_ERROR(q.Run());
  }
  const int fd = ::open(copy.c_str(), O_RDONLY | O_CLOEXEC);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!synced) return Status::IOError(path_ + ": " + op + ": fsync: " + std::strerror(errno));
  return copy;
}

void Store::CloseConnection() {
  for (auto& [sql, stmt] : stmts_) sqlite3_finalize(stmt);
  stmts_.clear();
  sqlite3_close_v2(db_);  // a no-op on nullptr
  db_ = nullptr;
}

Status Store::ReopenAfterReplacedFiles() {
  if (replaced_file_ == path_) return sticky_;  // only a restart from the saved copy helps (CheckFiles)
  if (db_ != nullptr) {
    if (!wal_saved_) {
      const Status saved = SaveWal();
      if (!saved.ok()) return Status::IOError(path_ + ": recover: " + saved.message());
      wal_saved_ = true;
    }
    // The last connection: SQLite removes whatever now lies at the -wal and -shm paths.
    CloseConnection();
  }
  const std::string replaced = std::exchange(replaced_file_, "");
  wal_file_ = shm_file_ = {0, 0};
  sticky_ = Status::OK();
  quick_check_ = false;  // checked at start
  Status s = Init();
  if (s.ok()) RecordFiles();
  if (s.ok() && sticky_.ok()) s = Write("probe write", [&] { return Exec(kProbeWriteSql, "probe write"); });
  if (!s.ok()) {
    CloseConnection();
    replaced_file_ = replaced;  // the next Recover opens again (nothing is left unsaved)
    wal_saved_ = true;
    sticky_ = Status::IOError(path_ + ": reopening the database after " + replaced +
                              " was deleted or replaced: " + s.message());
    return sticky_;
  }
  wal_saved_ = false;
  return sticky_;  // OK, or Init's refusal of a read-only directory (then Recover as for any other)
}

// ---- webhooks

namespace {

constexpr char kWebhookColumns[] = "id, url, events, team, user, secret, created_by, created_ms, cursor";
constexpr char kDeliveryColumns[] = "webhook_id, event_seq, body, attempts, next_ms, last_error";

WebhookRow ReadWebhook(const Query& q) {
  return WebhookRow{.id = q.Text(0),
                    .url = q.Text(1),
                    .events = q.Text(2),
                    .team = q.Text(3),
                    .user = q.Text(4),
                    .secret = q.Text(5),
                    .created_by = q.Text(6),
                    .created_ms = q.Int(7),
                    .cursor = q.Int(8)};
}

WebhookDeliveryRow ReadDelivery(const Query& q) {
  return WebhookDeliveryRow{.webhook_id = q.Text(0),
                            .event_seq = q.Int(1),
                            .body = q.Text(2),
                            .attempts = q.Int(3),
                            .next_ms = q.Int(4),
                            .last_error = q.Text(5)};
}

}  // namespace

StatusOr<WebhookRow> Store::AddWebhook(WebhookRow w) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "add webhook " + w.id;
  FT_RETURN_IF_ERROR(Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(std::string newest, QueryText("SELECT COALESCE(MAX(seq), 0) FROM events", op));
    w.cursor = std::stoll(newest.empty() ? "0" : newest);
    FT_ASSIGN_OR_RETURN(Query q, Prepare(std::string("INSERT OR IGNORE INTO webhooks (") + kWebhookColumns +
                                             ") VALUES (" + Placeholders(9) + ")",
                                         op));
    FT_RETURN_IF_ERROR(
        q.Bind(w.id, w.url, w.events, w.team, w.user, w.secret, w.created_by, w.created_ms, w.cursor).Run());
    return q.Changes() == 1 ? Status::OK() : Status::FailedPrecondition("webhook " + w.id + " exists");
  }));
  return w;
}

Status Store::RemoveWebhook(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "remove webhook " + id;
  return Write(op, [&]() -> Status {
    FT_ASSIGN_OR_RETURN(Query q, Prepare("DELETE FROM webhooks WHERE id = ?", op));
    FT_RETURN_IF_ERROR(q.Bind(id).Run());
    if (q.Changes() != 1)
      return Status::NotFound("no webhook " + id + " (ftctl admin webhook ls lists them)");
    FT_ASSIGN_OR_RETURN(Query d, Prepare("DELETE FROM webhook_deliveries WHERE webhook_id = ?", op));
    return d.Bind(id).Run();
  });
}

StatusOr<std::vector<WebhookRow>> Store::ListWebhooks() {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(
      Query q,
      Prepare(std::string("SELECT ") + kWebhookColumns + " FROM webhooks ORDER BY id", "list webhooks"));
  return Collect(q, ReadWebhook);
}

Status Store::QueueWebhookDeliveries(const std::vector<WebhookDeliveryRow>& rows,
                                     const std::map<std::string, int64_t>& cursors) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "queue " + std::to_string(rows.size()) + " webhook deliveries";
  return Write(
      op,
      [&]() -> Status {
        for (const WebhookDeliveryRow& d : rows) {
          FT_ASSIGN_OR_RETURN(
              Query q, Prepare(std::string("INSERT OR IGNORE INTO webhook_deliveries (") + kDeliveryColumns +
                                   ") SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS "
                                   "(SELECT 1 FROM webhooks WHERE id = ?)",
                               op));
          FT_RETURN_IF_ERROR(
              q.Bind(d.webhook_id, d.event_seq, d.body, d.attempts, d.next_ms, d.last_error, d.webhook_id)
                  .Run());
        }
        for (const auto& [id, cursor] : cursors) {
          FT_ASSIGN_OR_RETURN(Query q,
                              Prepare("UPDATE webhooks SET cursor = MAX(cursor, ?) WHERE id = ?", op));
          FT_RETURN_IF_ERROR(q.Bind(cursor, id).Run());
        }
        return Status::OK();
      },
      Durability::kRelaxed);
}

StatusOr<std::vector<WebhookDeliveryRow>> Store::DueWebhookDeliveries(int64_t now_ms, int64_t limit,
                                                                      const std::string& webhook_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string select = std::string("SELECT ") + kDeliveryColumns + " FROM webhook_deliveries WHERE ";
  if (!webhook_id.empty()) {  // the primary key's order: the webhook's oldest due first
    FT_ASSIGN_OR_RETURN(Query q,
                        Prepare(select + "webhook_id = ? AND next_ms <= ? ORDER BY event_seq LIMIT ?",
                                "list due deliveries of webhook " + webhook_id));
    return Collect(q.Bind(webhook_id, now_ms, SqlLimit(limit)), ReadDelivery);
  }
  FT_ASSIGN_OR_RETURN(
      Query q, Prepare(select + "next_ms <= ? ORDER BY event_seq LIMIT ?", "list due webhook deliveries"));
  return Collect(q.Bind(now_ms, SqlLimit(limit)), ReadDelivery);
}

Status Store::RetryWebhookDelivery(const WebhookDeliveryRow& d) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "retry webhook delivery " + d.webhook_id + "." + std::to_string(d.event_seq);
  return Write(
      op,
      [&]() -> Status {
        FT_ASSIGN_OR_RETURN(Query q,
                            Prepare("UPDATE webhook_deliveries SET attempts = ?, next_ms = ?, last_error "
                                    "= ? WHERE webhook_id = ? AND event_seq = ?",
                                    op));
        return q.Bind(d.attempts, d.next_ms, d.last_error, d.webhook_id, d.event_seq).Run();
      },
      Durability::kRelaxed);
}

Status Store::FinishWebhookDelivery(const std::string& webhook_id, int64_t event_seq) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string op = "finish webhook delivery " + webhook_id + "." + std::to_string(event_seq);
  return Write(
      op,
      [&]() -> Status {
        FT_ASSIGN_OR_RETURN(
            Query q, Prepare("DELETE FROM webhook_deliveries WHERE webhook_id = ? AND event_seq = ?", op));
        return q.Bind(webhook_id, event_seq).Run();
      },
      Durability::kRelaxed);
}

StatusOr<std::map<std::string, int64_t>> Store::PendingWebhookDeliveries() {
  std::lock_guard<std::mutex> lock(mu_);
  FT_ASSIGN_OR_RETURN(Query q,
                      Prepare("SELECT webhook_id, COUNT(*) FROM webhook_deliveries GROUP BY webhook_id",
                              "count webhook deliveries"));
  FT_ASSIGN_OR_RETURN(auto pairs,
                      Collect(q, [](const Query& r) { return std::make_pair(r.Text(0), r.Int(1)); }));
  return std::map<std::string, int64_t>(pairs.begin(), pairs.end());
}

}  // namespace ft
