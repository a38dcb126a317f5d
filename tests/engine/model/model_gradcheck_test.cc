// Whole-model gradient checks by finite differences: the analytic gradient of
// the training loss along a direction equals the central difference of the
// loss along it. The model computes in fp32 (the op-level checks in fp64 are
// in tests/kernels/cpu/gradcheck_test.cc); the loss is summed in double and
// the step is large enough that fp32 rounding stays far below the tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/io/hf_model.h"
#include "engine/model/model.h"
#include "engine/model/rng.h"

namespace ft {
namespace {

MicroBatch Batch(const ModelConfig& c, bool packed) {
  MicroBatch mb;
  mb.batch = 2;
  mb.seq = 13;
  for (int64_t i = 0; i < mb.rows(); ++i) {
    const int64_t t = i % mb.seq;
    const int64_t doc = packed && t >= 6 ? 1 : 0;
    mb.ids.push_back(static_cast<int32_t>(HashKeys(7, i) % c.vocab_size));
    mb.positions.push_back(static_cast<int32_t>(packed && doc ? t - 6 : t));
    if (packed) mb.segments.push_back(static_cast<int32_t>(doc));
  }
  for (int64_t i = 0; i < mb.rows(); ++i) {
    const bool last = i % mb.seq == mb.seq - 1 || (packed && i % mb.seq == 5);
    mb.targets.push_back(last ? -100 : mb.ids[i + 1]);
  }
  return mb;
}

struct Variant {
  const char* name;
  const char* preset;
  bool full, nf4, packed, checkpointing;
  double dropout;
  int64_t loss_chunk_rows = 0;  // the head's rows per chunk (0: all of them in one)
};

void CheckDirectionalDerivative(const Variant& v) {
  ModelConfig c = *PresetModelConfig(v.preset);
  ModelOptions o;
  o.nf4 = v.nf4;
  o.activation_checkpointing = v.checkpointing;
  o.loss_chunk_rows = v.loss_chunk_rows;
  Model model(c, o);
  RandomInitModel(&model, 17);
  if (v.full) {
    ASSERT_TRUE(model.EnableFullTraining().ok());
  } else {
    LoraSpec lora;
    lora.r = 4;
    lora.alpha = 8;
    lora.dropout = v.dropout;
    lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    ASSERT_TRUE(model.EnableLora(lora).ok());
    for (TrainableParam& p : model.TrainableParams()) {
      std::vector<float> v(p.numel);
      for (int64_t i = 0; i < p.numel; ++i) v[i] = 0.2f * (UniformFloat(HashKeys(3, i, p.numel)) - 0.5f);
      model.Upload(p.data, v.data(), p.numel);
    }
  }
  MicroBatch mb = Batch(c, v.packed);
  model.ZeroGrads();
  model.ForwardBackward(mb, 1.0f);
  // Direction: the gradient itself (normalised), so the derivative is large and well conditioned.
  std::vector<TrainableParam> params = model.TrainableParams();
  double gnorm2 = 0;
  std::vector<std::vector<float>> grads, saved, dir;
  for (const auto& p : params) {
    grads.push_back(model.Download(p.grad, p.numel));
    for (float g : grads.back()) gnorm2 += static_cast<double>(g) * g;
  }
  const double gnorm = std::sqrt(gnorm2);
  for (size_t k = 0; k < params.size(); ++k) {
    saved.push_back(model.Download(params[k].data, params[k].numel));
    std::vector<float> d(params[k].numel);
    for (int64_t i = 0; i < params[k].numel; ++i) d[i] = static_cast<float>(grads[k][i] / gnorm);
    dir.push_back(d);
  }
  const double analytic = gnorm;  // g · (g/|g|)
  auto loss_at = [&](double eps) {
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<float> moved(params[k].numel);
      for (int64_t i = 0; i < params[k].numel; ++i)
        moved[i] = saved[k][i] + static_cast<float>(eps) * dir[k][i];
      model.Upload(params[k].data, moved.data(), params[k].numel);
    }
    return model.Forward(mb, nullptr).loss_sum;
  };
  // Central differences at eps and eps/2 combined (Richardson) cancel the
  // O(eps²) curvature term, leaving fp32 noise far below the tolerance.
  auto central = [&](double eps) { return (loss_at(eps) - loss_at(-eps)) / (2 * eps); };
  const double eps = 1e-2;
  const double numeric = (4 * central(eps / 2) - central(eps)) / 3;
  const double rel = std::fabs(numeric - analytic) / analytic;
  std::printf("%-34s analytic %.6f numeric %.6f rel %.2e\n", v.name, analytic, numeric, rel);
  EXPECT_LT(rel, 1e-4) << v.name;
}

TEST(ModelGradcheckTest, DirectionalDerivativeMatchesCentralDifference) {
  const Variant variants[] = {
      {"LoRA, Llama GQA + llama3 RoPE", "tiny-llama", false, false, false, false, 0.0},
      {"LoRA, Qwen2 q/k/v bias", "tiny-qwen2", false, false, false, false, 0.0},
      {"LoRA, tied embeddings", "tiny-tied", false, false, false, false, 0.0},
      {"LoRA with dropout 0.2", "tiny-llama", false, false, false, false, 0.2},
      {"QLoRA (NF4 base)", "tiny-llama", false, true, false, false, 0.0},
      {"LoRA, packed documents", "tiny-llama", false, false, true, false, 0.0},
      {"LoRA, activation checkpointing", "tiny-llama", false, false, false, true, 0.0},
      {"full fine-tune", "tiny-llama", true, false, false, false, 0.0},
      {"full fine-tune, tied embeddings", "tiny-tied", true, false, false, false, 0.0},
      // The head runs on the rows with a target only (Model::HeadForwardBackward), gathered
      // five at a time here: the scatter of their gradients and the head's accumulation
      // across chunks are checked as well.
      {"full fine-tune, tied, head by 5 rows", "tiny-tied", true, false, true, false, 0.0, 5},
      {"LoRA, head by 5 rows", "tiny-llama", false, false, true, false, 0.0, 5},
  };
  for (const Variant& v : variants) CheckDirectionalDerivative(v);
}

// The loss of the head run on the target rows alone (what training and evaluation do)
// equals the loss of every row's logits (what a caller asking for logits gets), one chunk
// or several, and both equal the cross-entropy of those logits computed here.
TEST(ModelGradcheckTest, TheHeadOnTheTargetRowsAloneGivesEveryRowsLoss) {
  const ModelConfig c = *PresetModelConfig("tiny-llama");
  const MicroBatch mb = Batch(c, /*packed=*/true);
  int64_t targets = 0;
  for (int32_t t : mb.targets) targets += t >= 0 ? 1 : 0;
  ASSERT_LT(targets, mb.rows()) << "the batch needs rows without a target";
  double reference = 0;
  for (int64_t chunk_rows : {0, 5}) {
    ModelOptions o;
    o.loss_chunk_rows = chunk_rows;
    Model model(c, o);
    RandomInitModel(&model, 17);
    std::vector<float> logits;
    const LossResult all = model.Forward(mb, &logits);
    const LossResult picked = model.Forward(mb, nullptr);
    EXPECT_EQ(all.tokens, targets);
    EXPECT_EQ(picked.tokens, targets);
    EXPECT_NEAR(picked.loss_sum, all.loss_sum, 1e-6 * all.loss_sum) << "chunks of " << chunk_rows;
    double ce = 0;
    for (int64_t i = 0; i < mb.rows(); ++i) {
      if (mb.targets[i] < 0) continue;
      const float* row = logits.data() + i * c.vocab_size;
      double max = row[0], sum = 0;
      for (int64_t j = 0; j < c.vocab_size; ++j) max = std::max<double>(max, row[j]);
      for (int64_t j = 0; j < c.vocab_size; ++j) sum += std::exp(row[j] - max);
      ce += max + std::log(sum) - row[mb.targets[i]];
    }
    EXPECT_NEAR(all.loss_sum, ce, 1e-6 * ce);
    if (chunk_rows == 0) reference = picked.loss_sum;
    EXPECT_NEAR(picked.loss_sum, reference, 1e-6 * reference);
  }
}

}  // namespace
}  // namespace ft
