// Evaluation a run acts on (issue #45): which evaluation is the best so far
// (checkpoint.keep_best, output.adapter_from: best) and whether the run stops
// early (train.early_stopping). The verdicts are a pure function of the
// evaluations in order, and their state (EvalProgress) is part of every
// checkpoint, so a run killed and resumed stops at the step an uninterrupted
// run stops at.
//
// The rules (Hugging Face's EarlyStoppingCallback): an evaluation is the new
// best when its value is strictly better than the best so far (the first one
// always is; one that is not finite never is); an evaluation that is not
// better than the best by more than min_delta adds one to the count, any
// other resets it; the run stops once the count reaches patience, unless that
// evaluation is of the last step (then it simply finished).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"
#include "engine/job/checkpoint_state.h"
#include "engine/job/job_spec.h"

namespace ft {

// Whether `spec` acts on its evaluations (train.early_stopping or checkpoint.keep_best).
bool TracksEvaluations(const JobSpec& spec);

// The metric evaluations are judged by: train.early_stopping.metric, else eval_loss.
EvalMetric JudgedMetric(const JobSpec& spec);

// The value of `metric` in an evaluation: its loss, or the objective's mean of that name
// (DPO's "eval_rewards/accuracies", ...). InvalidArgument naming the metric when the objective
// did not report it.
StatusOr<double> EvalMetricValue(EvalMetric metric, double loss,
                                 const std::map<std::string, double>& objective);

// A progress fresh for `spec` (its metric's name; "" when the job tracks nothing).
EvalProgress FreshEvalProgress(const JobSpec& spec);

// What one evaluation decided.
struct EvalVerdict {
  bool best = false;  // the best so far: checkpoint.keep_best keeps this step's state
  bool stop = false;  // early stopping ends the run here (progress->stop_reason says why)
};

// Folds the evaluation of `step` (valued `value`) into *progress by the rules above; `last_step`
// is the run's final step (an evaluation there never stops the run early).
EvalVerdict RecordEvaluation(const JobSpec& spec, int64_t step, int64_t last_step, double value,
                             EvalProgress* progress);

}  // namespace ft
