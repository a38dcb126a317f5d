// SFT and DPO (engine/train/objective.h).
#include "engine/train/objective.h"

#include <cmath>

#include "engine/train/reference_logprobs.h"

namespace ft {

namespace {

// log sigmoid(x), stable for both signs.
double LogSigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double Sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }

class SftObjective : public Objective {
 public:
  std::vector<std::string> SumNames() const override { return {"loss"}; }
  int64_t Normaliser(const Mixture& data, int64_t first, int64_t count, bool shuffle,
                     uint64_t seed) const override {
    return data.CountTargets(first, count, shuffle, seed);
  }
  StatusOr<std::vector<double>> MicroStep(Model& model, const MicroBatch& mb, float grad_scale) override {
    return std::vector<double>{model.ForwardBackward(mb, grad_scale).loss_sum};
  }
  StatusOr<EvalSums> EvalStep(Model& model, const MicroBatch& mb) override {
    const LossResult r = model.EvalForward(mb);
    return EvalSums{{r.loss_sum}, r.tokens, r.tokens};
  }
};

// Rows 2i and 2i + 1 of a micro-batch are pair i's chosen and rejected sequences (Dataset's
// preference rows). The reference is the stored one (a full fine-tune) or the model with its
// adapter off (LoRA/QLoRA).
class DpoObjective : public Objective {
 public:
  DpoObjective(const JobSpec::Train::Dpo& dpo, const ReferenceLogProbs* reference,
               const ReferenceLogProbs* eval_reference)
      : dpo_(dpo), reference_(reference), eval_reference_(eval_reference) {}

  std::vector<std::string> SumNames() const override {
    return {"loss",         "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
            "logps/chosen", "logps/rejected"};
  }
  int64_t Normaliser(const Mixture&, int64_t, int64_t count, bool, uint64_t) const override { return count; }

  StatusOr<std::vector<double>> MicroStep(Model& model, const MicroBatch& mb, float grad_scale) override {
    const std::vector<SequenceLogProb> ref = Reference(model, mb, reference_);
    std::vector<double> sums;
    auto weights = [&](const std::vector<SequenceLogProb>& pi) {
      std::vector<float> w(pi.size(), 0.0f);
      sums = PairSums(pi, ref, [&](size_t c, size_t r, double dloss_dpi_chosen) {
        // The head's gradient is grad_scale x d(-log p)/d(logits) per sequence: the weight of a
        // sequence is -d(loss)/d(its sum of log-probabilities) (IPO: through the mean; RPO's
        // term adds rpo_alpha / the chosen's tokens).
        double chosen = -dloss_dpi_chosen / Count(pi[c]);
        if (dpo_.rpo_alpha != 0) chosen += dpo_.rpo_alpha / Tokens(pi[c]);
        w[c] = static_cast<float>(chosen * grad_scale);
        w[r] = static_cast<float>(dloss_dpi_chosen / Count(pi[r]) * grad_scale);
      });
      return w;
    };
    model.ForwardBackwardBySequence(mb, weights);
    return sums;
  }

  StatusOr<EvalSums> EvalStep(Model& model, const MicroBatch& mb) override {
    const std::vector<SequenceLogProb> ref = Reference(model, mb, eval_reference_);
    const std::vector<SequenceLogProb> pi = model.SequenceLogProbs(mb);
    EvalSums e{PairSums(pi, ref, [](size_t, size_t, double) {}), static_cast<int64_t>(pi.size() / 2), 0};
    for (const SequenceLogProb& s : pi) e.tokens += s.tokens;
    return e;
  }

 private:
  // SumNames()'s sums over the pairs of a micro-batch (rows 2i, 2i + 1); `each(c, r, dloss/dpi_c)`
  // sees every pair.
  template <typename Each>
  std::vector<double> PairSums(const std::vector<SequenceLogProb>& pi,
                               const std::vector<SequenceLogProb>& ref, Each each) const {
    std::vector<double> sums(SumNames().size(), 0.0);
    for (size_t c = 0; c + 1 < pi.size(); c += 2) {
      const size_t r = c + 1;
      const DpoPairTerms t = ComputeDpoPair(dpo_, Value(pi[c]), Value(pi[r]), Value(ref[c]), Value(ref[r]));
      each(c, r, t.dloss_dpi_chosen);
      const double rpo = dpo_.rpo_alpha == 0 ? 0.0 : -dpo_.rpo_alpha * pi[c].sum / Tokens(pi[c]);
      const double add[] = {t.loss + rpo,
                            t.reward_chosen,
                            t.reward_rejected,
                            t.reward_chosen - t.reward_rejected,
                            t.reward_chosen > t.reward_rejected ? 1.0 : 0.0,
                            Value(pi[c]),
                            Value(pi[r])};
      for (size_t k = 0; k < sums.size(); ++k) sums[k] += add[k];
    }
    return sums;
  }
  // The reference's log-probabilities of the batch's sequences: `stored`'s rows, or the model's
  // with its adapter off.
  static std::vector<SequenceLogProb> Reference(Model& model, const MicroBatch& mb,
                                                const ReferenceLogProbs* stored) {
    if (stored == nullptr) {
      model.SetAdapterEnabled(false);
      std::vector<SequenceLogProb> ref = model.SequenceLogProbs(mb);
      model.SetAdapterEnabled(true);
      return ref;
    }
    std::vector<SequenceLogProb> ref;
    for (const int64_t row : mb.data_rows) ref.insert(ref.end(), stored->Pair(row), stored->Pair(row) + 2);
    return ref;
  }
  // A response's log-probability as the loss reads it: the sum, or the mean for IPO.
  double Value(const SequenceLogProb& s) const { return s.sum / Count(s); }
  static double Tokens(const SequenceLogProb& s) {
    return static_cast<double>(std::max<int64_t>(s.tokens, 1));
  }
  double Count(const SequenceLogProb& s) const { return dpo_.loss == DpoLoss::kIpo ? Tokens(s) : 1.0; }

  JobSpec::Train::Dpo dpo_;
  const ReferenceLogProbs* reference_;
  const ReferenceLogProbs* eval_reference_;
};

}  // namespace

DpoPairTerms ComputeDpoPair(const JobSpec::Train::Dpo& dpo, double pi_chosen, double pi_rejected,
                            double ref_chosen, double ref_rejected) {
  DpoPairTerms t;
  const double z = (pi_chosen - ref_chosen) - (pi_rejected - ref_rejected);
  const double beta = dpo.beta, eps = dpo.label_smoothing;
  if (dpo.loss == DpoLoss::kIpo) {
    const double d = z - 1 / (2 * beta);
    t.loss = d * d;
    t.dloss_dpi_chosen = 2 * d;
  } else {
    t.loss = -(1 - eps) * LogSigmoid(beta * z) - eps * LogSigmoid(-beta * z);
    // d/dz: -(1 - eps) beta sigmoid(-beta z) + eps beta sigmoid(beta z)
    t.dloss_dpi_chosen = beta * (-(1 - eps) * Sigmoid(-beta * z) + eps * Sigmoid(beta * z));
  }
  t.reward_chosen = beta * (pi_chosen - ref_chosen);
  t.reward_rejected = beta * (pi_rejected - ref_rejected);
  return t;
}

std::unique_ptr<Objective> MakeObjective(const JobSpec& spec, const ReferenceLogProbs* reference,
                                         const ReferenceLogProbs* eval_reference) {
  if (spec.train.objective == TrainObjective::kDpo)
    return std::make_unique<DpoObjective>(spec.train.dpo, reference, eval_reference);
  return std::make_unique<SftObjective>();
}

}  // namespace ft
