#include "engine/train/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "common/confined_path.h"
#include "common/file_util.h"

namespace ft {

MetricsLog::MetricsLog(std::string path, std::function<Status()> fence, int64_t epoch)
    : path_(std::move(path)), fence_(std::move(fence)), epoch_(epoch) {}

Status MetricsLog::Open(int64_t keep_through) {
  std::string kept;
  if (auto old = ReadFileToString(path_); old.ok()) {
    std::istringstream in(*old);
    for (std::string line; std::getline(in, line);) {
      auto m = ParseMetricsLine(line);
      if (m.ok() && m->step <= keep_through) kept += line + "\n";
    }
  }
  FT_RETURN_IF_ERROR(ReplaceFileAtomically(path_, kept));  // a kill here must not lose the kept lines
  FT_ASSIGN_OR_RETURN(const std::string confined, Confine(path_));
  out_.open(confined, std::ios::app);
  if (!out_) return Status::IOError(path_ + ": cannot write metrics");
  return Status::OK();
}

Status MetricsLog::Write(MetricsLine line) {
  if (!out_.is_open()) return Status::FailedPrecondition(path_ + ": written before it was opened");
  if (fence_) FT_RETURN_IF_ERROR(fence_());
  line.epoch = epoch_;
  errno = 0;
  out_ << FormatMetricsLine(line) << "\n";
  out_.flush();
  if (!out_) {
    return Status::IOError(path_ + ": write failed" +
                           (errno ? std::string(": ") + std::strerror(errno) : std::string()));
  }
  return Status::OK();
}

}  // namespace ft
