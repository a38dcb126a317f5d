// Status and StatusOr: how every ftune module reports success or failure.
//
// A Status is OK or carries a code and a human-readable message. Modules never
// throw across their boundaries: they return Status (or StatusOr<T> when they
// also produce a value). The message should say what failed, where (file,
// field, line) and, for bad input, how to fix it. Conversion to grpc::Status
// happens in exactly one place (daemon/grpc_status.h).
//
// Thread safety: Status and StatusOr are values; distinct objects may be used
// from distinct threads without synchronisation.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ft {

class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk = 0,
    kNotFound,            // a file, job, key or record does not exist
    kInvalidArgument,     // bad input from a user or a peer; message says how to fix it
    kIOError,             // the environment failed a read/write/fsync
    kCorruption,          // stored data failed a checksum or format check
    kFailedPrecondition,  // the system is not in a state that allows this
    kResourceExhausted,   // out of memory, disk, budget
    kUnavailable,         // a peer or device is gone or not reachable
    kAborted,             // superseded: e.g. a message from an old attempt epoch
    kCancelled,           // the caller or user asked to stop
    kDeadlineExceeded,    // a deadline passed before completion
    kUnimplemented,       // not supported by this build or backend
    kInternal,            // a broken invariant inside ftune (a bug)
  };

  // OK status.
  Status() = default;

  static Status OK() { return Status(); }
  static Status NotFound(std::string_view msg) { return {Code::kNotFound, msg}; }
  static Status InvalidArgument(std::string_view msg) { return {Code::kInvalidArgument, msg}; }
  static Status IOError(std::string_view msg) { return {Code::kIOError, msg}; }
  static Status Corruption(std::string_view msg) { return {Code::kCorruption, msg}; }
  static Status FailedPrecondition(std::string_view msg) { return {Code::kFailedPrecondition, msg}; }
  static Status ResourceExhausted(std::string_view msg) { return {Code::kResourceExhausted, msg}; }
  static Status Unavailable(std::string_view msg) { return {Code::kUnavailable, msg}; }
  static Status Aborted(std::string_view msg) { return {Code::kAborted, msg}; }
  static Status Cancelled(std::string_view msg) { return {Code::kCancelled, msg}; }
  static Status DeadlineExceeded(std::string_view msg) { return {Code::kDeadlineExceeded, msg}; }
  static Status Unimplemented(std::string_view msg) { return {Code::kUnimplemented, msg}; }
  static Status Internal(std::string_view msg) { return {Code::kInternal, msg}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsInvalidArgument() const { return code_ == Code::kInvalidArgument; }
  bool IsIOError() const { return code_ == Code::kIOError; }
  bool IsCorruption() const { return code_ == Code::kCorruption; }
  bool IsAborted() const { return code_ == Code::kAborted; }

  // Returns a copy whose message is "context: message" (OK stays OK).
  Status WithContext(std::string_view context) const;

  // "OK", or "<CodeName>: <message>".
  std::string ToString() const;

  static const char* CodeName(Code code);

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  Status(Code code, std::string_view msg) : code_(code), message_(msg) {}

  Code code_ = Code::kOk;
  std::string message_;
};

// Either a value of T or a non-OK Status. Accessing value() of a non-OK
// StatusOr is a bug and aborts with the status printed.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Status::Internal("StatusOr constructed from OK status without value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & {
    CheckOk();
    return *value_;
  }
  const T& value() const& {
    CheckOk();
    return *value_;
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckOk() const;

  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void DieWithStatus(const Status& status, const char* what);

template <typename T>
void StatusOr<T>::CheckOk() const {
  if (!status_.ok()) DieWithStatus(status_, "StatusOr::value() on an error");
}

}  // namespace ft

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define FT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::ft::Status ft_status_ = (expr);        \
    if (!ft_status_.ok()) return ft_status_; \
  } while (0)

#define FT_CONCAT_INNER_(a, b) a##b
#define FT_CONCAT_(a, b) FT_CONCAT_INNER_(a, b)
// `FT_ASSIGN_OR_RETURN(auto x, Expr())`: assigns the value or returns the error.
#define FT_ASSIGN_OR_RETURN(lhs, expr) \
  FT_ASSIGN_OR_RETURN_IMPL_(FT_CONCAT_(ft_statusor_, __LINE__), lhs, expr)
#define FT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// A broken invariant inside ftune: crashes loudly with file:line. Never use it
// for anything the environment or a user can cause; return a Status instead.
#define FT_CHECK(cond)                                         \
  do {                                                         \
    if (!(cond)) ::ft::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)

namespace ft {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond);
}  // namespace ft
