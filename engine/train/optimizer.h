// AdamW with PyTorch's semantics over the model's trainable tensors, global
// gradient-norm clipping like torch.nn.utils.clip_grad_norm_, and the LR
// schedules of HF's get_{cosine,linear,constant}_schedule_with_warmup.
//
// The moments live in the model's backend memory and every update runs there
// (Backend::SumSquares, Scale, AdamW): the same definitions on every device.
//
// Thread safety: one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/model/memory.h"
#include "engine/model/model.h"

namespace ft {

struct OptimizerConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 1.0;  // <= 0: no clipping
};

// LR multiplier for update number `step` (from 0) of `total`, HF semantics:
// warmup step/warmup, then cosine (half wave), linear decay to 0, or constant.
double LrMultiplier(const std::string& schedule, int64_t step, int64_t warmup, int64_t total);

class AdamWOptimizer {
 public:
  // `params` must stay valid (they point into the model, whose backend is
  // `backend`: Model::shared_backend()).
  AdamWOptimizer(std::vector<TrainableParam> params, OptimizerConfig config,
                 std::shared_ptr<Backend> backend);

  // sqrt(Σ g²) over all grads, in a fixed order (deterministic).
  double GradNorm() const;
  // Scales grads by grad_multiplier * min(1, max_norm / (norm + 1e-6))
  // (the clip when clipping is on; the multiplier unscales fp16 loss-scaled
  // grads), then applies one AdamW update at learning rate `lr`. Counts the
  // step and the update.
  void ClipAndStep(double grad_norm, double lr, double grad_multiplier = 1.0);
  // Counts a step whose update was skipped (fp16 overflow): nothing changes
  // but step(); Adam's bias correction counts only updates().
  void SkipStep() { ++step_, ++skipped_; }

  int64_t step() const { return step_; }                // steps taken, skipped ones included
  int64_t skipped() const { return skipped_; }          // steps skipped
  int64_t updates() const { return step_ - skipped_; }  // AdamW updates applied
  void set_step(int64_t step, int64_t skipped = 0) {
    step_ = step;
    skipped_ = skipped;
  }
  const std::vector<TrainableParam>& params() const { return params_; }
  // First and second moments, parallel to params() (backend memory).
  std::vector<DeviceBuffer>& exp_avg() { return m_; }
  std::vector<DeviceBuffer>& exp_avg_sq() { return v_; }

 private:
  std::vector<TrainableParam> params_;
  OptimizerConfig config_;
  std::shared_ptr<Backend> backend_;  // declared before the moments: outlives them
  std::vector<DeviceBuffer> m_, v_;
  int64_t step_ = 0;     // steps so far
  int64_t skipped_ = 0;  // of which skipped
};

}  // namespace ft
