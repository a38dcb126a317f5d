// What a training step minimises over its global batch (shared/DESIGN.md: "An objective is a loss
// over a batch, not a trainer"). SFT: the mean token cross-entropy. DPO (TRL's DPOTrainer): the
// mean over preference pairs of a loss of the policy's and the reference's log-probabilities of
// the chosen and the rejected response. The trainer's step loop, gradient accumulation, exact
// sums across ranks, clipping, checkpoints and resume are the same for both; an objective says
// what a step is normalised by, runs one micro-batch's forward and backward, and names the sums
// it reports (summed exactly over micro-batches and ranks, then divided by the normaliser).
//
// Thread safety: an Objective is used by the trainer's thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/data/mixture.h"
#include "engine/job/job_spec.h"
#include "engine/model/model.h"

namespace ft {

class Objective {
 public:
  virtual ~Objective() = default;
  // The sums a micro-batch returns, in order; [0] is "loss". metrics.jsonl reports each sum
  // divided by the step's normaliser under this name.
  virtual std::vector<std::string> SumNames() const = 0;
  // What the step's sums are divided by: target tokens (SFT) or pairs (DPO) in the global batch
  // at data positions [first, first + count).
  virtual int64_t Normaliser(const Mixture& data, int64_t first, int64_t count, bool shuffle,
                             uint64_t seed) const = 0;
  // One micro-batch's forward and backward: the gradient of (its loss sum) x grad_scale is added
  // to the model's gradients. Returns SumNames()'s sums over the micro-batch.
  virtual StatusOr<std::vector<double>> MicroStep(Model& model, const MicroBatch& mb, float grad_scale) = 0;
  // One micro-batch of data.eval, forward only (evaluation mode): SumNames()'s sums, what they are
  // divided by (SFT: target tokens; DPO: pairs) and its target tokens.
  struct EvalSums {
    std::vector<double> sums;
    int64_t count = 0, tokens = 0;
  };
  virtual StatusOr<EvalSums> EvalStep(Model& model, const MicroBatch& mb) = 0;
};

// TRL's per-pair DPO terms from the policy's and the reference's response log-probabilities
// (sums over the response tokens; IPO: means): z = (pi_c - ref_c) - (pi_r - ref_r),
//   sigmoid: loss = -(1 - eps) log sigmoid(beta z) - eps log sigmoid(-beta z)
//   ipo:     loss = (z - 1 / (2 beta))^2
// with d(loss)/d(pi_c) = -d(loss)/d(pi_r), and the rewards beta (pi - ref). With rpo_alpha (TRL's
// RPO), the objective adds rpo_alpha x the chosen response's mean token NLL to each pair's loss
// (TRL averages over all the chosen tokens of its batch: the same when the chosen responses are
// equally long; per pair, it does not depend on how pairs fall into micro-batches).
struct DpoPairTerms {
  double loss = 0;
  double dloss_dpi_chosen = 0;  // d(loss) / d(pi_c); d(loss) / d(pi_r) is its negative
  double reward_chosen = 0, reward_rejected = 0;
};
DpoPairTerms ComputeDpoPair(const JobSpec::Train::Dpo& dpo, double pi_chosen, double pi_rejected,
                            double ref_chosen, double ref_rejected);

class ReferenceLogProbs;  // engine/train/reference_logprobs.h

// The objective of spec.train.objective. DPO's reference: the stored log-probabilities of the
// training data (`reference`) and of data.eval (`eval_reference`) when given (a full fine-tune;
// borrowed, must outlive the objective), else the model with its adapter off.
std::unique_ptr<Objective> MakeObjective(const JobSpec& spec, const ReferenceLogProbs* reference = nullptr,
                                         const ReferenceLogProbs* eval_reference = nullptr);

}  // namespace ft
