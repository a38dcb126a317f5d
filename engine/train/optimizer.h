// AdamW with PyTorch's semantics over the model's trainable tensors, global
// gradient-norm clipping like torch.nn.utils.clip_grad_norm_, and the LR
// schedules of HF's get_{cosine,linear,constant}_schedule_with_warmup.
//
// The moments live in the model's backend memory and every update runs there
// (Backend::SumSquares, Scale, AdamW): the same definitions on every device.
// Paged (job.yaml optimizer: paged_adamw, bitsandbytes' name): the moments
// live in host memory instead (Backend::AllocHost, page-locked on CUDA) and
// each parameter's pair is paged into one of two device pages on the copy
// stream (the next one's while this one updates), updated there and paged
// back: the device holds the moments of two parameters, not of all. The
// arithmetic is the same, so the results are bit-identical.
// Sharded (ZeRO-1; distributed.strategy: fsdp with several ranks): the
// trainable tensors form one flat vector cut into `world` equal ranges; each
// rank keeps the moments of its range only, updates only that range of the
// parameters (from the full, all-reduced gradients: the same arithmetic per
// element) and all-gathers the updated ranges, so every rank ends the step
// with the same parameters as an unsharded optimizer.
//
// Thread safety: one thread at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/job/job_choices.h"
#include "engine/model/memory.h"
#include "engine/model/model.h"

namespace ft {

struct OptimizerConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 1.0;  // <= 0: no clipping
};

// LR multiplier for update number `step` (from 0) of `total`, HF semantics:
// warmup step/warmup, then cosine (half wave), linear decay to 0, or constant.
double LrMultiplier(LrSchedule schedule, int64_t step, int64_t warmup, int64_t total);

// This rank's place among the ranks sharing the optimizer's state.
struct OptimizerSharding {
  int rank = 0, world = 1;
  // out[r·bytes ..] = rank r's `mine` for every rank (Collective::AllGather); false on failure.
  std::function<bool(const void* mine, int64_t bytes, void* out)> all_gather;
};

class AdamWOptimizer {
 public:
  // `params` must stay valid (they point into the model, whose backend is
  // `backend`: Model::shared_backend()).
  AdamWOptimizer(std::vector<TrainableParam> params, OptimizerConfig config, std::shared_ptr<Backend> backend,
                 bool paged = false, OptimizerSharding shard = {});

  // sqrt(Σ g²) over all grads, in a fixed order (deterministic).
  double GradNorm() const;
  // Scales grads by grad_multiplier * min(1, max_norm / (norm + 1e-6))
  // (the clip when clipping is on; the multiplier unscales fp16 loss-scaled
  // grads), then applies one AdamW update at learning rate `lr`. Counts the
  // step and the update. Sharded: collective (the all-gather of the updated
  // ranges); Unavailable when it fails.
  Status ClipAndStep(double grad_norm, double lr, double grad_multiplier = 1.0);
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
  bool paged() const { return paged_; }
  // Parameter i's first (which = 0) or second (1) moment on the host, and
  // its replacement from the host (numel values): what checkpoints save and load.
  // Sharded: Moment reads what the last GatherMoments collected; SetMoment
  // keeps this rank's range of `values`.
  std::vector<float> Moment(size_t i, int which) const;
  void SetMoment(size_t i, int which, const float* values);
  // Sharded: every rank's moments collected on every rank (collective; call it
  // on all ranks before a checkpoint reads Moment). Unavailable when it fails.
  Status GatherMoments();
  bool sharded() const { return shard_.world > 1; }
  // Floats of moments (each of m and v) this rank keeps.
  int64_t moment_floats() const;

 private:
  std::vector<TrainableParam> params_;
  OptimizerConfig config_;
  std::shared_ptr<Backend> backend_;  // declared before the moments: outlives them
  bool paged_ = false;
  // Moments per parameter: device memory, or host memory when paged.
  std::vector<DeviceBuffer> m_, v_;  // of this rank's piece of each parameter (empty: none)
  DeviceBuffer pages_[2];            // paged: two device pages of [m | v] for the largest piece
  OptimizerSharding shard_;
  // Each parameter's offset in the flat vector, and this rank's piece of it: [lo, hi).
  std::vector<int64_t> offset_, lo_, hi_;
  int64_t total_ = 0, range_ = 0;   // flat floats; floats per rank's range
  std::vector<float> gathered_[2];  // sharded: every rank's m and v (GatherMoments)
  bool gathered_valid_ = false;
  // This rank's range of the flat vector into `host` (range_ floats) from
  // `pieces` (this rank's piece of each parameter; in host or backend memory).
  void PackRange(const std::vector<const float*>& pieces, bool host_memory, float* host) const;
  int64_t step_ = 0;     // steps so far
  int64_t skipped_ = 0;  // of which skipped
};

}  // namespace ft
