#include "common/status.h"

#include <cstdio>
#include <cstdlib>

namespace ft {

const char* Status::CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kNotFound: return "NotFound";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kIOError: return "IOError";
    case Code::kCorruption: return "Corruption";
    case Code::kFailedPrecondition: return "FailedPrecondition";
    case Code::kResourceExhausted: return "ResourceExhausted";
    case Code::kUnavailable: return "Unavailable";
    case Code::kAborted: return "Aborted";
    case Code::kCancelled: return "Cancelled";
    case Code::kDeadlineExceeded: return "DeadlineExceeded";
    case Code::kUnimplemented: return "Unimplemented";
    case Code::kInternal: return "Internal";
  }
  return "Unknown";
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, msg);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out = CodeName(code_);
  out += ": ";
  out += message_;
  return out;
}

void DieWithStatus(const Status& status, const char* what) {
  std::fprintf(stderr, "ftune fatal: %s: %s\n", what, status.ToString().c_str());
  std::abort();
}

void CheckFailed(const char* file, int line, const char* cond) {
  std::fprintf(stderr, "ftune fatal: %s:%d: check failed: %s\n", file, line, cond);
  std::abort();
}

}  // namespace ft
