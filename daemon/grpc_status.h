// The one place ft::Status becomes grpc::Status (and back, for clients).
#pragma once

#include <grpcpp/grpcpp.h>

#include "common/status.h"

namespace ft {

inline grpc::Status ToGrpcStatus(const Status& s) {
  using C = Status::Code;
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  switch (s.code()) {
    case C::kOk: return grpc::Status::OK;
    case C::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case C::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case C::kIOError: code = grpc::StatusCode::INTERNAL; break;
    case C::kCorruption: code = grpc::StatusCode::DATA_LOSS; break;
    case C::kFailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case C::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case C::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case C::kAborted: code = grpc::StatusCode::ABORTED; break;
    case C::kCancelled: code = grpc::StatusCode::CANCELLED; break;
    case C::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case C::kUnimplemented: code = grpc::StatusCode::UNIMPLEMENTED; break;
    case C::kInternal: code = grpc::StatusCode::INTERNAL; break;
  }
  return grpc::Status(code, s.message());
}

inline Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return Status::OK();
  switch (s.error_code()) {
    case grpc::StatusCode::NOT_FOUND: return Status::NotFound(s.error_message());
    case grpc::StatusCode::INVALID_ARGUMENT: return Status::InvalidArgument(s.error_message());
    case grpc::StatusCode::FAILED_PRECONDITION: return Status::FailedPrecondition(s.error_message());
    case grpc::StatusCode::UNAVAILABLE: return Status::Unavailable(s.error_message());
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return Status::InvalidArgument("not authorised: " + s.error_message());
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return Status::ResourceExhausted(s.error_message());
    default: return Status::Internal(s.error_message());
  }
}

}  // namespace ft
