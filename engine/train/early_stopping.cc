#include "engine/train/early_stopping.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace ft {

bool TracksEvaluations(const JobSpec& spec) {
  return spec.train.early_stopping.enabled || spec.checkpoint.keep_best;
}

EvalMetric JudgedMetric(const JobSpec& spec) {
  return spec.train.early_stopping.enabled ? spec.train.early_stopping.metric : EvalMetric::kEvalLoss;
}

StatusOr<double> EvalMetricValue(EvalMetric metric, double loss,
                                 const std::map<std::string, double>& objective) {
  if (metric == EvalMetric::kEvalLoss) return loss;
  const std::string name(EnumName(metric));
  auto it = objective.find(name);
  if (it == objective.end()) {
    return Status::InvalidArgument("train.early_stopping.metric: the evaluation did not report " + name);
  }
  return it->second;
}

EvalProgress FreshEvalProgress(const JobSpec& spec) {
  EvalProgress p;
  if (TracksEvaluations(spec)) p.metric = std::string(EnumName(JudgedMetric(spec)));
  return p;
}

namespace {

// "early stopping: eval_loss did not improve by more than 0.01 for 3 evaluations; best 1.2345 at step 40".
std::string StopReason(const JobSpec::Train::EarlyStopping& e, const EvalProgress& p) {
  char text[320];
  std::snprintf(text, sizeof(text),
                "early stopping: %s did not improve by more than %g for %" PRId64
                " evaluation%s; best %.6g at step %" PRId64,
                p.metric.c_str(), e.min_delta, p.since_improvement, p.since_improvement == 1 ? "" : "s",
                p.best_value, p.best_step);
  return text;
}

}  // namespace

EvalVerdict RecordEvaluation(const JobSpec& spec, int64_t step, int64_t last_step, double value,
                             EvalProgress* progress) {
  const bool higher = EvalMetricHigherIsBetter(JudgedMetric(spec));
  const JobSpec::Train::EarlyStopping& e = spec.train.early_stopping;
  // How much `value` beats the best so far (> 0: better); the first finite value always does.
  const bool first = progress->best_step == 0;
  const double gain = higher ? value - progress->best_value : progress->best_value - value;
  EvalVerdict verdict;
  verdict.best = std::isfinite(value) && (first || gain > 0);
  if (verdict.best && (first || gain > e.min_delta)) {
    progress->since_improvement = 0;
  } else {
    ++progress->since_improvement;
  }
  if (verdict.best) {
    progress->best_step = step;
    progress->best_value = value;
  }
  progress->last_step = step;
  if (e.enabled && step < last_step && progress->since_improvement >= e.patience) {
    verdict.stop = true;
    progress->stop_reason = StopReason(e, *progress);
  }
  return verdict;
}

}  // namespace ft
