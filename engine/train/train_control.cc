#include "engine/train/train_control.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <nlohmann/json.hpp>
#include <string>

#include "common/logging.h"

namespace ft {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void OnStopSignal(int signo) { g_signal = signo; }

const char* SignalName(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
  }
  return "signal";
}
}  // namespace

TrainControl::~TrainControl() {
  // The reader polls, so it sees this within one poll interval: a command
  // arriving as the trainer exits (ftd's acknowledgement of the final
  // checkpoint) never reaches a destroyed object.
  stopping_ = true;
  if (reader_.joinable()) reader_.join();
}

void TrainControl::InstallSignalHandlers(double grace_seconds) {
  grace_seconds_ = grace_seconds;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGUSR1, SIGINT}) sigaction(s, &sa, nullptr);
  // A file-size limit (RLIMIT_FSIZE) fails the write with EFBIG, an IOError
  // like ENOSPC (exit 5, "environment"), instead of killing the trainer.
  std::signal(SIGXFSZ, SIG_IGN);
}

void TrainControl::StartControlFd(int fd) {
  reader_ = std::thread([this, fd] { ReadLoop(fd); });
}

void TrainControl::ReadLoop(int fd) {
  std::string buffer;
  char chunk[4096];
  while (!stopping_) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return;
    if (ready == 0) continue;
    ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    buffer.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      const std::string cmd = j.is_object() ? j.value("cmd", "") : "";
      if (cmd == "committed" && j.value("dir", "") != "") {
        SetCommitted(j.value("step", int64_t{0}), j.value("dir", ""));
        continue;
      }
      if (cmd != "checkpoint" && cmd != "stop") {
        FT_LOG(WARN) << "control channel: ignoring unknown command: " << line;
        continue;
      }
      ControlRequest r;
      r.stop = cmd == "stop";
      r.deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(j.value("deadline_s", grace_seconds_)));
      r.reason =
          j.value("reason", r.stop ? std::string("stop requested") : std::string("checkpoint requested"));
      Post(r);
    }
  }
}

void TrainControl::Post(ControlRequest r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_) {
    pending_ = r;
    return;
  }
  if (r.stop && !pending_->stop) pending_->reason = r.reason;
  pending_->stop = pending_->stop || r.stop;
  pending_->deadline = std::min(pending_->deadline, r.deadline);
}

std::optional<ControlRequest> TrainControl::Pending() {
  if (int signo = g_signal) {
    g_signal = 0;
    ControlRequest r;
    r.stop = true;
    r.deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(grace_seconds_));
    r.reason = SignalName(signo);
    Post(r);
  }
  std::lock_guard<std::mutex> lock(mu_);
  return pending_;
}

std::optional<ControlRequest> TrainControl::Take() {
  Pending();  // folds a caught signal into the pending request
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<ControlRequest> r = pending_;
  pending_.reset();
  return r;
}

void TrainControl::SetCommitted(int64_t step, const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step < committed_step_) return;  // reports can cross: keep the newest
  committed_step_ = step;
  committed_dir_ = dir;
}

std::string TrainControl::committed_dir() {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_dir_;
}

void TrainControl::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.reset();
}

}  // namespace ft
