#include "proto/names.h"

namespace ft {

namespace pb = ftune::v1;

std::string JobStateName(pb::JobState state) {
  switch (state) {
    case pb::QUEUED: return "queued";
    case pb::RUNNING: return "running";
    case pb::PREEMPTED: return "preempted";
    case pb::SUCCEEDED: return "succeeded";
    case pb::FAILED: return "failed";
    case pb::CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

bool ParseJobStateName(const std::string& name, pb::JobState* state) {
  for (pb::JobState s : {pb::QUEUED, pb::RUNNING, pb::PREEMPTED, pb::SUCCEEDED, pb::FAILED, pb::CANCELLED}) {
    if (JobStateName(s) == name) {
      *state = s;
      return true;
    }
  }
  return false;
}

std::string AttemptOutcomeName(pb::AttemptOutcome outcome) {
  switch (outcome) {
    case pb::ATTEMPT_RUNNING: return "running";
    case pb::ATTEMPT_FINISHED: return "finished";
    case pb::ATTEMPT_PREEMPTED: return "preempted";
    case pb::ATTEMPT_FAILED: return "failed";
    case pb::ATTEMPT_CANCELLED: return "cancelled";
    case pb::ATTEMPT_SUPERSEDED: return "superseded";
    case pb::ATTEMPT_ENVIRONMENT: return "environment";
    case pb::ATTEMPT_BAD_INPUT: return "bad input";
    default: return "unknown";
  }
}

}  // namespace ft
