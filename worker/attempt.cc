#include "worker/attempt.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "engine/job/exit_codes.h"

namespace ft::worker {

namespace {

// How each of ft-train's exit codes (engine/job/exit_codes.h) ends an
// attempt, and where its reason comes from; any other code is FAILED with the
// trainer's last error.
struct ExitMeaning {
  enum class Reason { kNone, kPreempted, kErrorLine, kFailure };
  int code;
  AttemptOutcome outcome;
  Reason reason;
  const char* fallback;  // when the trainer said nothing more
};
constexpr ExitMeaning kExitMeanings[] = {
    {kExitFinished, AttemptOutcome::kFinished, ExitMeaning::Reason::kNone, ""},
    {kExitPreempted, AttemptOutcome::kPreempted, ExitMeaning::Reason::kPreempted,
     "stopped after a checkpoint"},
    {kExitSuperseded, AttemptOutcome::kSuperseded, ExitMeaning::Reason::kErrorLine,
     "a newer epoch owns output.dir"},
    {kExitRankLost, AttemptOutcome::kRankLost, ExitMeaning::Reason::kErrorLine, "a peer rank was lost"},
    {kExitEnvironment, AttemptOutcome::kEnvironment, ExitMeaning::Reason::kFailure, ""},  // retried
    {kExitBadInput, AttemptOutcome::kBadInput, ExitMeaning::Reason::kFailure, ""},  // fails the job at once
};

const ExitMeaning* FindExitMeaning(int code) {
  for (const ExitMeaning& m : kExitMeanings) {
    if (m.code == code) return &m;
  }
  return nullptr;
}

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kLastLines = 20;                                // kept for the failure reason
constexpr size_t kLogBatchBytes = 16 << 10;                      // a LogReport is sent at this size ...
constexpr auto kLogBatchDelay = std::chrono::milliseconds(250);  // ... or this long after its first line
constexpr size_t kMaxLineBytes = 64 << 10;                       // longer output lines are cut

// "ft-train: resumed from DIR at step N" or "ft-train: already complete at step N" → N, else -1.
int64_t ResumedStep(const std::string& line) {
  if (line.rfind("ft-train: resumed from ", 0) != 0 && line.rfind("ft-train: already complete ", 0) != 0) {
    return -1;
  }
  const size_t at = line.rfind(" at step ");
  if (at == std::string::npos) return -1;
  return std::strtoll(line.c_str() + at + 9, nullptr, 10);
}

// The trainer runs in our working directory, so its relative paths are ours.
std::string AbsoluteDir(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  return (ec ? fs::path(dir) : p).lexically_normal().string();
}

// An output line that explains a failure: ft-train's own error line
// ("ft-train: <Status>", not its progress notes) or a logged error.
bool IsErrorLine(const std::string& line) {
  if (line.find("[error]") != std::string::npos || line.find("\"level\":\"error\"") != std::string::npos) {
    return true;
  }
  if (line.rfind("ft-train: ", 0) != 0) return false;
  for (const char* note : {"ft-train: resumed from", "ft-train: finished", "ft-train: stopped after",
                           "ft-train: wrote", "ft-train: already complete", "ft-train: resuming from"}) {
    if (line.rfind(note, 0) == 0) return false;
  }
  return true;
}

}  // namespace

Attempt::Attempt(AttemptSpec spec, AttemptListener* listener)
    : spec_(std::move(spec)),
      listener_(listener),
      tail_(spec_.output_dir + "/metrics.jsonl"),
      log_prefix_(spec_.rank > 0 ? "[rank " + std::to_string(spec_.rank) + "] " : "") {
  progress_.total_steps = spec_.total_steps;
  progress_.step = spec_.start_step;  // until the trainer says where it resumed
}

StatusOr<std::unique_ptr<Attempt>> Attempt::Start(AttemptSpec spec, AttemptListener* listener) {
  std::unique_ptr<Attempt> a(new Attempt(std::move(spec), listener));
  const AttemptSpec& s = a->spec_;
  if (!a->follows_metrics()) {
    // Not rank 0: output.dir is rank 0's to write and its attempt's to report.
  } else if (Status st = a->tail_.SkipExisting(); !st.ok()) {
    FT_LOG(WARN) << st.ToString();
  }
  std::vector<std::string> argv = {s.ft_train, "run", s.job_file, "--control-fd", "3"};
  if (!s.resume_checkpoint.empty()) argv.insert(argv.end(), {"--resume", s.resume_checkpoint});
  argv.insert(argv.end(), {"--stop-grace", std::to_string(s.stop_grace_s)});
  if (s.mtbf_seconds > 0) argv.insert(argv.end(), {"--mtbf-seconds", std::to_string(s.mtbf_seconds)});
  if (s.epoch > 0) argv.insert(argv.end(), {"--job-id", s.job_id, "--epoch", std::to_string(s.epoch)});
  for (const std::string& root : s.allowed_roots) argv.insert(argv.end(), {"--allowed-root", root});
  if (s.world > 1) {
    argv.insert(argv.end(), {"--world", std::to_string(s.world), "--rank", std::to_string(s.rank),
                             "--rendezvous", s.rendezvous});
    if (!s.dist_host.empty()) argv.insert(argv.end(), {"--dist-host", s.dist_host});
    if (!s.dist_backend.empty()) argv.insert(argv.end(), {"--dist-backend", s.dist_backend});
  }
  FT_ASSIGN_OR_RETURN(a->child_, ChildProcess::Spawn(argv, s.env));
  FT_LOG(INFO) << "attempt " << s.job_id << " e" << s.epoch << ": ft-train pid " << a->child_->pid()
               << " running " << s.job_file;
  Attempt* self = a.get();
  a->reader_ = std::thread([self] { self->ReadOutput(); });
  a->monitor_ = std::thread([self] { self->Monitor(); });
  return a;
}

Attempt::~Attempt() {
  if (!done_) Kill();
  if (monitor_.joinable()) monitor_.join();
  if (reader_.joinable()) reader_.join();
}

Status Attempt::Control(const std::string& cmd, double deadline_s, const std::string& reason) {
  nlohmann::json j = {{"cmd", cmd}, {"deadline_s", deadline_s}, {"reason", reason}};
  Status sent = child_->WriteControl(j.dump() + "\n");
  if (cmd != "stop") return sent;
  // Armed even when the channel is closed: a trainer that cannot hear the stop is killed all the same.
  const double kill_after_s = std::max(0.0, deadline_s) + std::max(0.0, spec_.kill_grace_s);
  const Clock::time_point kill_at =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kill_after_s));
  std::lock_guard<std::mutex> lock(mu_);
  if (sent.ok()) progress_.stop_sent = true;
  if (!kill_at_ || kill_at < *kill_at_) {
    kill_at_ = kill_at;
    std::ostringstream why;
    why << reason << ": killed (SIGKILL to its process group): the trainer did not stop within "
        << kill_after_s << " s (the stop's " << deadline_s << " s deadline + " << spec_.kill_grace_s
        << " s grace)";
    kill_reason_ = why.str();
  }
  return sent;
}

Status Attempt::NotifyCommitted(int64_t step, const std::string& dir) {
  nlohmann::json j = {{"cmd", "committed"}, {"step", step}, {"dir", dir}};
  return child_->WriteControl(j.dump() + "\n");
}

void Attempt::Kill() {
  {
    std::lock_guard<std::mutex> lock(report_mu_);
    killed_ = true;
  }
  if (child_) child_->Signal(SIGKILL);
  {
    std::lock_guard<std::mutex> lock(mu_);
    kill_requested_ = true;
  }
  wake_.notify_all();
}

void Attempt::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_reason_ = reason;
  }
  child_->Signal(SIGKILL);
}

AttemptProgress Attempt::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

// ---------------------------------------------------------------- output

void Attempt::ReadOutput() {
  std::string partial, batch;
  Clock::time_point batch_start;
  char buf[8192];
  while (true) {
    int timeout_ms = -1;
    if (!batch.empty()) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(batch_start + kLogBatchDelay - Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    pollfd p{child_->output_fd(), POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      FlushLog(&batch);
      continue;
    }
    const ssize_t n = ::read(child_->output_fd(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: every writer is gone
    partial.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (batch.empty()) batch_start = Clock::now();
      std::string line = partial.substr(start, std::min(nl - start, kMaxLineBytes));
      HandleOutputLine(line);
      batch += log_prefix_ + line + "\n";
    }
    partial.erase(0, start);
    if (partial.size() > kMaxLineBytes) {  // a huge unterminated line: pass it on in pieces
      if (batch.empty()) batch_start = Clock::now();
      batch += log_prefix_ + partial + "\n";
      partial.clear();
    }
    if (batch.size() >= kLogBatchBytes) FlushLog(&batch);
  }
  if (!partial.empty()) {
    HandleOutputLine(partial);
    batch += log_prefix_ + partial + "\n";
  }
  FlushLog(&batch);
}

void Attempt::HandleOutputLine(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (line.empty()) return;
  last_lines_.push_back(line);
  if (last_lines_.size() > kLastLines) last_lines_.pop_front();
  if (IsErrorLine(line)) last_error_line_ = line.rfind("ft-train: ", 0) == 0 ? line.substr(10) : line;
  if (int64_t step = ResumedStep(line); step > progress_.step) progress_.step = step;
}

void Attempt::FlushLog(std::string* batch) {
  if (batch->empty()) return;
  Report([&] { listener_->OnLog(spec_, *batch); });
  batch->clear();
}

// ---------------------------------------------------------------- metrics and exit

void Attempt::Monitor() {
  ExitStatus status;
  while (true) {
    PollMetrics();
    if (child_->Poll(&status)) break;
    EnforceKillDeadline();
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, spec_.poll_interval, [this] { return kill_requested_; });
  }
  reader_.join();  // the output ends with the process group
  PollMetrics();   // lines written just before the exit
  AttemptExit e = MakeExit(status);
  const bool explained = !e.reason.empty() && e.reason.find(status.ToString()) == std::string::npos;
  FT_LOG(INFO) << "attempt " << spec_.job_id << " e" << spec_.epoch << ": ft-train " << status.ToString()
               << (explained ? ": " + e.reason : "");
  Report([&] { listener_->OnExit(spec_, e); });
  done_ = true;
}

void Attempt::EnforceKillDeadline() {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!kill_at_ || Clock::now() < *kill_at_ || !abort_reason_.empty()) return;
    abort_reason_ = reason = kill_reason_;
  }
  FT_LOG(ERROR) << "attempt " << spec_.job_id << " e" << spec_.epoch << ": ft-train pid " << child_->pid()
                << ": " << reason;
  child_->Signal(SIGKILL);
}

void Attempt::PollMetrics() {
  if (!follows_metrics()) return;
  std::vector<std::string> lines;
  if (Status s = tail_.Poll(&lines); !s.ok()) FT_LOG(WARN) << s.ToString();
  std::vector<MetricsLine> steps;
  auto flush_steps = [&] {
    if (steps.empty()) return;
    Report([&] { listener_->OnMetrics(spec_, steps, WallNowMs()); });
    steps.clear();
  };
  for (const std::string& line : lines) {
    auto m = ParseMetricsLine(line);
    if (!m.ok()) {
      FT_LOG(DEBUG) << tail_.path() << ": " << m.status().ToString();
      continue;
    }
    if (m->epoch != 0 && m->epoch != spec_.epoch) {
      FT_LOG(WARN) << tail_.path() << ": ignoring a line of epoch " << m->epoch << " (this attempt is e"
                   << spec_.epoch << ")";
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      progress_.step = std::max(progress_.step, m->step);
      if (m->checkpoint_seconds > 0) progress_.checkpoint_seconds = m->checkpoint_seconds;
      if (m->kind == MetricsLine::Kind::kStep) {
        progress_.step = m->step;  // a resumed run may restart below a step a killed run logged
        progress_.loss = m->loss;
        progress_.tokens_per_s = m->tokens_per_s;
        progress_.peak_bytes = m->peak_bytes;
      }
    }
    switch (m->kind) {
      case MetricsLine::Kind::kStep:
      case MetricsLine::Kind::kEval: steps.push_back(*m); break;
      case MetricsLine::Kind::kCheckpoint:
        flush_steps();
        HandleCheckpoint(*m);
        break;
      case MetricsLine::Kind::kPreempted: preempted_reason_ = m->reason; break;
      case MetricsLine::Kind::kFailed: failed_reason_ = m->reason; break;
      case MetricsLine::Kind::kEarlyStop: finished_reason_ = m->reason; break;
      case MetricsLine::Kind::kResume: {
        const AttemptNote note{m->resume_kind, m->reason, m->step, m->dir};
        Report([&] { listener_->OnNote(spec_, note); });
        break;
      }
      case MetricsLine::Kind::kInterval: {  // ftd records it as the job's event
        const AttemptNote note{"checkpoint_interval", m->reason, m->step, ""};
        Report([&] { listener_->OnNote(spec_, note); });
        break;
      }
      case MetricsLine::Kind::kOtherEvent: break;
    }
  }
  flush_steps();
}

void Attempt::HandleCheckpoint(const MetricsLine& m) {
  CommittedCheckpoint c;
  c.step = m.step;
  c.dir = AbsoluteDir(m.dir);
  c.write_seconds = m.checkpoint_seconds;
  auto sha = Sha256File(c.dir + "/MANIFEST.json");
  if (!sha.ok()) {
    // Rotated away (checkpoint.keep) before we looked: no longer a resume point.
    FT_LOG(DEBUG) << "checkpoint at step " << c.step << " not reported: " << sha.status().ToString();
    return;
  }
  c.manifest_sha256 = *sha;
  Report([&] { listener_->OnCheckpoint(spec_, c); });
}

AttemptExit Attempt::MakeExit(const ExitStatus& status) {
  std::lock_guard<std::mutex> lock(mu_);
  AttemptExit e;
  e.step = progress_.step;
  e.exit_code = status.signaled ? 128 + status.code : status.code;
  if (status.signaled && !abort_reason_.empty()) {
    e.outcome = AttemptOutcome::kPreempted;
    e.reason = abort_reason_;
    return e;
  }
  const ExitMeaning* meaning = status.signaled ? nullptr : FindExitMeaning(status.code);
  e.outcome = meaning ? meaning->outcome : AttemptOutcome::kFailed;
  if (meaning && meaning->reason == ExitMeaning::Reason::kNone) {
    e.reason = finished_reason_;  // "" unless train.early_stopping ended the run
    return e;
  }
  if (meaning && meaning->reason == ExitMeaning::Reason::kPreempted) {
    e.reason = preempted_reason_.empty() ? meaning->fallback : preempted_reason_;
  } else if (meaning && meaning->reason == ExitMeaning::Reason::kErrorLine) {
    e.reason = last_error_line_.empty() ? meaning->fallback : last_error_line_;
  } else if (!status.signaled && !failed_reason_.empty()) {  // a failure: the trainer's own words
    e.reason = failed_reason_;
  } else if (!status.signaled && !last_error_line_.empty()) {
    e.reason = last_error_line_;
  } else if (!status.signaled && !last_lines_.empty()) {
    e.reason = last_lines_.back();
  } else {
    e.reason = "ft-train " + status.ToString();
  }
  return e;
}

}  // namespace ft::worker
