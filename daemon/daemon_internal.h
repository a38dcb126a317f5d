// Helpers shared by the Daemon's source files (daemon.cc, daemon_sessions.cc,
// daemon_gangs.cc, daemon_placement.cc, daemon_events.cc); not part of the
// daemon's interface.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "daemon/scheduler.h"
#include "daemon/store.h"
#include "engine/job/job_spec.h"
#include "engine/model/model_config.h"
#include "proto/ftune.pb.h"

namespace ft::daemon_internal {

// A cancelled trainer has 10 s to checkpoint and stop; its worker SIGKILLs its process group when
// it still runs 5 s (ft-worker's kill grace) after that, so it is gone within 15 s and the worker is
// free (worker/attempt.h), even when it is stuck outside its step loop.
inline constexpr int64_t kCancelStopMs = 10'000;

// How a worker's exit report ends an attempt (RANK_LOST only where the gang's other ranks say nothing).
AttemptOutcomeCode ToOutcomeCode(ftune::v1::AttemptOutcome o);

// A stored job's spec, parsed as at submit (relative paths against its spec_dir).
StatusOr<JobSpec> StoredSpec(const JobRow& job);

// What the scheduler needs to place a job.
JobView MakeJobView(const JobRow& job, const JobSpec& spec, const ModelConfig& model);

ftune::v1::Event ToProtoEvent(const EventRow& e);

}  // namespace ft::daemon_internal
