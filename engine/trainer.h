// The training loop of ft-train: builds the model from a job, walks the data
// in global batches split into micro-batches, and applies optimizer steps
// with the math of shared/DESIGN.md (loss = Σ token CE over the global batch ÷
// its target tokens, so the micro-batch plan never changes the result).
//
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "engine/job_spec.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/token_data.h"

namespace ft {

struct StepMetrics {
  int64_t step = 0;      // 1 = first optimizer step
  double loss = 0;       // token-weighted mean over the global batch, before the update
  double lr = 0;         // the rate this update used
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;    // target tokens in the global batch
  double tokens_per_s = 0;
  double step_seconds = 0;
  int64_t peak_bytes = 0;  // tracked peak since start
};

struct BatchPlan {
  int64_t micro_batch = 0;
  int64_t accumulation = 0;
  int64_t world = 1;
};

class Trainer {
 public:
  // Loads the model, data and optional init adapter named by `spec`.
  // Every error names the file and field at fault.
  static StatusOr<std::unique_ptr<Trainer>> Create(const JobSpec& spec);

  // Runs one optimizer step.
  Status Step(StepMetrics* metrics);
  // Runs all remaining steps, writing <output.dir>/metrics.jsonl and a
  // progress line per step on stderr, then the final outputs (adapter/,
  // model/ for full fine-tunes, merged/ when output.merge).
  Status Run();
  // Writes the final outputs only.
  Status WriteOutputs();

  // Called in Step() after the gradients of the global batch are complete and
  // before clipping and the update (tests compare gradients with a reference).
  void set_grad_hook(std::function<void(int64_t step)> hook) { grad_hook_ = std::move(hook); }

  Model& model() { return *model_; }
  AdamWOptimizer& optimizer() { return *optimizer_; }
  const BatchPlan& plan() const { return plan_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t steps_done() const { return optimizer_->step(); }

 private:
  Trainer() = default;

  JobSpec spec_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamWOptimizer> optimizer_;
  std::unique_ptr<TokenDataset> data_;
  BatchPlan plan_;
  int64_t total_steps_ = 0;
  int64_t cursor_ = 0;  // sequences consumed
  std::function<void(int64_t)> grad_hook_;
};

// Chooses micro-batch and accumulation for `spec` (micro × accumulation ×
// world = global_batch_size exactly). InvalidArgument when impossible.
StatusOr<BatchPlan> ChooseBatchPlan(const JobSpec& spec);

}  // namespace ft
