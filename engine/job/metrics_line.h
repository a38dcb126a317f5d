// One line of ft-train's <output.dir>/metrics.jsonl: the trainer writes it
// (FormatMetricsLine), ft-worker reads it back (ParseMetricsLine), both from
// the one key table in metrics_line.cc (kMetricsKeys), so the two never
// drift apart. Three shapes:
//   step:  "step" and the step keys of kMetricsKeys (each with the condition under which it is
//          written), "peak_bytes_by_category", and "skipped" under fp16 ("grad_norm" is null for
//          a skipped step)
//   eval:  "step" and the eval keys of kMetricsKeys, after the step line of the same step
//   event: {"event":"checkpoint"|"preempted"|"failed"|"resume"|"interval"|"early_stop", "step",
//          ...}; early_stop (train.early_stopping ended the run at "step") has its "reason"; an
//          interval line (checkpoint.every: auto) has "why", "interval_seconds",
//          "checkpoint_seconds" (C, 0 = not measured yet) and "mtbf_seconds" (M); an every_auto
//          (or every_auto_probe) checkpoint line has the "interval_seconds" and "mtbf_seconds" it
//          was taken at; a checkpoint written the step after the previous one has
//          "back_to_back": true (its time is C's fixed part)
// Attempts under ftd add "epoch" to every line (engine/train/output_owner.h).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ft {

struct MetricsLine {
  enum class Kind {
    kStep,
    kEval,
    kCheckpoint,
    kPreempted,
    kFailed,
    kResume,
    kInterval,
    kEarlyStop,
    kOtherEvent
  };
  Kind kind = Kind::kOtherEvent;
  int64_t step = 0;   // every kind
  int64_t epoch = 0;  // every kind: the attempt that wrote it (0: not recorded, and not written)
  // kStep
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;  // NaN: written as null (a skipped fp16 step)
  int64_t tokens = 0;
  int64_t tokens_seen = 0;  // target tokens trained on in the run so far (0: an older trainer)
  double tokens_per_s = 0;
  double step_seconds = 0;       // wall time of the step (0: not reported)
  int64_t time_ms = 0;           // the trainer's clock (Unix ms) when the step ended (0: not reported)
  double copy_wait_seconds = 0;  // of which waiting for copy-stream transfers
  int64_t peak_bytes = 0;
  std::map<std::string, int64_t> peak_bytes_by_category;
  // The objective's own means (engine/train/objective.h; DPO: TRL's "rewards/chosen",
  // "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected"),
  // each a key of its own; read back from every step key with a '/' in its name. kEval: the same
  // over data.eval, named as TRL names them ("eval_rewards/chosen", ...).
  std::map<std::string, double> objective_metrics;
  double checkpoint_seconds = 0;  // kStep (newest measured, 0 = none yet), kCheckpoint, kInterval (C)
  double interval_seconds = 0;    // kInterval: the interval chosen; kCheckpoint (every_auto): in force
  double mtbf_seconds = 0;        // kInterval: M; kCheckpoint (every_auto): the M it was chosen with
  int64_t world = 0;              // several ranks: how many (0/1: written only above 1)
  double allreduce_seconds = 0;   // several ranks
  double gather_seconds = 0;      // several ranks under FSDP (written when sharded is set)
  bool sharded = false;           // not a key: whether gather_seconds is written
  double loss_scale = 0;          // fp16 (0: not fp16, not written)
  bool fp16 = false;              // not a key: whether loss_scale and skipped are written
  bool skipped = false;
  bool back_to_back = false;  // kCheckpoint: written the step after the previous checkpoint
  // kEval: mean token cross-entropy on data.eval (NaN when the trainer wrote null: it diverged)
  double eval_loss = 0;
  int64_t eval_tokens = 0;
  double eval_seconds = 0;
  // kCheckpoint: the checkpoint directory, as the trainer wrote it; kResume: the one resumed from
  std::string dir;
  // kCheckpoint (why it was taken), kPreempted (why it stopped), kFailed (the error), kResume (the note),
  // kInterval (checkpoint.every: auto's interval and why, engine/job/checkpoint_interval.h),
  // kEarlyStop (why the run stopped before train.max_steps)
  std::string reason;
  // kResume: "resume" | "resume_ahead" | "resume_fallback" | "restart_from_zero"
  std::string resume_kind;
};

// An event line (checkpoint, preempted, failed, resume) at `step` with its reason (a resume's note).
MetricsLine MetricsEvent(MetricsLine::Kind kind, int64_t step, std::string reason);

// The line's JSON text (no newline).
std::string FormatMetricsLine(const MetricsLine& m);

// InvalidArgument when the line is not a JSON object with an integer "step".
StatusOr<MetricsLine> ParseMetricsLine(std::string_view line);

}  // namespace ft
