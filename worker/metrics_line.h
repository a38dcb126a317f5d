// One line of ft-train's <output.dir>/metrics.jsonl, parsed (engine/train/trainer.cc
// writes them): a step line {"step","loss","lr","grad_norm","tokens",
// "tokens_per_s","step_seconds","copy_wait_seconds","peak_bytes", optional
// "checkpoint_seconds"},
// an evaluation line {"step","eval_loss","eval_tokens","eval_seconds"} (after
// the step line of the same step, when the job has data.eval), or an event
// line {"event":"checkpoint"|"preempted"|"failed"|"resume", "step", ...}.
// Attempts under ftd add "epoch" to every line (engine/train/output_owner.h).
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ft::worker {

struct MetricsLine {
  enum class Kind { kStep, kEval, kCheckpoint, kPreempted, kFailed, kResume, kOtherEvent };
  Kind kind = Kind::kOtherEvent;
  int64_t step = 0;   // every kind
  int64_t epoch = 0;  // every kind: the attempt that wrote it (0: not recorded)
  // kStep
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  int64_t tokens = 0;
  int64_t tokens_seen = 0;  // target tokens trained on in the run so far (0: an older trainer)
  double tokens_per_s = 0;
  double step_seconds = 0;       // wall time of the step (0: not reported)
  double copy_wait_seconds = 0;  // of which waiting for copy-stream transfers
  int64_t peak_bytes = 0;
  double checkpoint_seconds = 0;  // kStep (newest measured, 0 = none yet) and kCheckpoint
  // kEval: mean token cross-entropy on data.eval (NaN when the trainer wrote null: it diverged)
  double eval_loss = 0;
  int64_t eval_tokens = 0;
  // kCheckpoint: the checkpoint directory, as the trainer wrote it; kResume: the one resumed from
  std::string dir;
  // kCheckpoint (why it was taken), kPreempted (why it stopped), kFailed (the error), kResume (the note)
  std::string reason;
  // kResume: "resume" | "resume_ahead" | "resume_fallback" | "restart_from_zero"
  std::string resume_kind;
};

// InvalidArgument when the line is not a JSON object with an integer "step".
StatusOr<MetricsLine> ParseMetricsLine(std::string_view line);

}  // namespace ft::worker
