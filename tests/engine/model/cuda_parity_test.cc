// The whole model on CUDA against the CPU reference backend: the same random
// model, adapters, micro-batches and AdamW settings, trained for kSteps steps
// on both. Per step the losses and gradient norms must agree, and at the end
// every trainable tensor:
//   - fp32 storage (cuBLASLt with true fp32 compute): losses and grad norms
//     within 1e-4 relative, trained tensors within 1e-3 (norm-wise);
//   - bf16 and fp16 rounding points (ComputeDType::kBF16, kF16; fp16 GEMMs
//     on cuBLASLt's fp16 path): the bounds of the bf16 goldens, 1e-2 on
//     losses (tests/engine/model/golden_test.cc), 5e-2 on grad norms and
//     trained tensors (a bf16 ulp is 7.8e-3, an fp16 one 9.8e-4).
// Also: training state moved between devices mid-run (CUDA → CPU and
// CPU → CUDA, through host copies of parameters and Adam moments, as a
// checkpoint does) continues the same run.
//
// Label gpu: skipped with the reason when no CUDA device is visible (or the
// build has no CUDA); with FT_REQUIRE_GPU=1 (bench/gpu/run.sh) that is a failure.
// Each case prints one "PARITY" line with its worst figures for docs/PERFORMANCE.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/io/hf_model.h"
#include "engine/model/model.h"
#include "engine/model/rng.h"
#include "engine/train/optimizer.h"
#include "tests/support/cuda_or_skip.h"

namespace ft {
namespace {

constexpr int kSteps = 6;

using testing_support::CudaOrSkip;

// Small shapes the CUDA attention supports (head dim 64, 128 or 256).
ModelConfig SmallConfig(const std::string& family) {
  ModelConfig c = *PresetModelConfig("tiny-" + family);
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_layers = 2;
  if (family == "qwen2") {
    c.num_heads = 2;
    c.num_kv_heads = 2;
    c.head_dim = 128;
  } else if (family == "qwen3" || family == "gemma3") {  // q/k norms over head_dim 128, apart from 256/4
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 128;
  } else if (family == "gemma2") {  // Gemma's real head dim, soft-caps, window 16 < seq 96
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 256;
  } else {  // llama; phi3 (fused projections, 48 of 64 dims turned, window 16 < seq 96)
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 64;
  }
  return c;
}

MicroBatch Batch(const ModelConfig& c, int step, bool packed) {
  MicroBatch mb;
  mb.batch = 2;
  mb.seq = 96;
  mb.first_sequence = 2 * step;
  for (int64_t i = 0; i < mb.rows(); ++i) {
    const int64_t t = i % mb.seq;
    const bool second_doc = packed && t >= 40;
    mb.ids.push_back(static_cast<int32_t>(HashKeys(91, step, i) % c.vocab_size));
    mb.positions.push_back(static_cast<int32_t>(second_doc ? t - 40 : t));
    if (packed) mb.segments.push_back(second_doc ? 1 : 0);
  }
  for (int64_t i = 0; i < mb.rows(); ++i) {
    const int64_t t = i % mb.seq;
    const bool no_target = t == mb.seq - 1 || (packed && t == 39) || t < 3;  // prompt-like masked head
    mb.targets.push_back(no_target ? -100 : mb.ids[i + 1]);
  }
  return mb;
}

struct Case {
  const char* name;
  const char* family;
  bool nf4;
  ComputeDType dtype;
  bool full, packed, checkpointing;
  double dropout;
};

// One model + optimizer on one backend.
struct Trained {
  std::unique_ptr<Model> model;
  std::unique_ptr<AdamWOptimizer> opt;

  Trained(const Case& k, std::shared_ptr<Backend> backend) {
    ModelOptions o;
    o.dtype = k.dtype;
    o.nf4 = k.nf4;
    o.nf4_config = {64, true, 256};  // NF4 + double quant, as QLoRA
    o.activation_checkpointing = k.checkpointing;
    o.loss_chunk_rows = 64;  // several loss-head chunks per micro-batch
    o.backend = std::move(backend);
    model = std::make_unique<Model>(SmallConfig(k.family), o);
    RandomInitModel(model.get(), 5);
    model->RoundWeightsToComputeDType();
    if (k.full) {
      EXPECT_TRUE(model->EnableFullTraining().ok());
    } else {
      LoraSpec lora;
      lora.r = 8;
      lora.alpha = 16;
      lora.dropout = k.dropout;
      lora.target_modules = ModuleNames(model->config());  // every linear of the family
      EXPECT_TRUE(model->EnableLora(lora).ok());
    }
    OptimizerConfig oc;
    oc.weight_decay = 0.01;
    oc.max_grad_norm = 1.0;
    opt = std::make_unique<AdamWOptimizer>(model->TrainableParams(), oc, model->shared_backend());
  }

  // One optimizer step on one micro-batch; returns {loss, grad norm}.
  std::pair<double, double> Step(const Case& k, int step) {
    const MicroBatch mb = Batch(model->config(), step, k.packed);
    int64_t tokens = 0;
    for (int32_t t : mb.targets) tokens += t >= 0 ? 1 : 0;
    model->ZeroGrads();
    const LossResult r = model->ForwardBackward(mb, static_cast<float>(1.0 / static_cast<double>(tokens)));
    const double norm = opt->GradNorm();
    EXPECT_TRUE(opt->ClipAndStep(norm, 2e-3).ok());
    EXPECT_TRUE(model->backend().Synchronize().ok()) << model->backend().Synchronize().ToString();
    return {r.loss_sum / static_cast<double>(tokens), norm};
  }

  // Every trainable tensor, then every Adam moment, copied to the host.
  std::vector<std::vector<float>> State() {
    std::vector<std::vector<float>> out;
    const auto& params = opt->params();
    for (const TrainableParam& p : params) out.push_back(model->Download(p.data, p.numel));
    for (size_t i = 0; i < params.size(); ++i) {
      out.push_back(opt->Moment(i, 0));
      out.push_back(opt->Moment(i, 1));
    }
    return out;
  }
  void SetState(const std::vector<std::vector<float>>& s, int64_t step) {
    const auto& params = opt->params();
    ASSERT_EQ(s.size(), 3 * params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      model->Upload(params[i].data, s[i].data(), params[i].numel);
      opt->SetMoment(i, 0, s[params.size() + 2 * i].data());
      opt->SetMoment(i, 1, s[params.size() + 2 * i + 1].data());
    }
    opt->set_step(step);
  }
};

double Rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

// ‖a − b‖ / ‖b‖ over the trainable tensors only (the first `n` entries of State()).
double TensorsRel(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                  size_t n) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(a[i].size(), b[i].size());
    for (size_t j = 0; j < a[i].size(); ++j) {
      if (!std::isfinite(a[i][j])) return INFINITY;
      diff += (static_cast<double>(a[i][j]) - b[i][j]) * (static_cast<double>(a[i][j]) - b[i][j]);
      ref += static_cast<double>(b[i][j]) * b[i][j];
    }
  }
  return std::sqrt(diff / std::max(ref, 1e-300));
}

class CudaParity : public ::testing::TestWithParam<Case> {};

TEST_P(CudaParity, TrainsLikeTheCpuReference) {
  const Case& k = GetParam();
  std::string skip;
  std::shared_ptr<Backend> cuda = CudaOrSkip(&skip);
  if (!cuda) GTEST_SKIP() << skip;
  const bool low = k.dtype != ComputeDType::kF32;
  const double loss_tol = low ? 1e-2 : 1e-4, norm_tol = low ? 5e-2 : 1e-4, tensor_tol = low ? 5e-2 : 1e-3;
  Trained cpu(k, CpuBackendInstance()), gpu(k, cuda);
  double worst_loss = 0, worst_norm = 0;
  for (int s = 0; s < kSteps; ++s) {
    const auto [cl, cn] = cpu.Step(k, s);
    const auto [gl, gn] = gpu.Step(k, s);
    ASSERT_TRUE(std::isfinite(gl) && std::isfinite(gn)) << "step " << s + 1 << ": loss " << gl;
    worst_loss = std::max(worst_loss, Rel(gl, cl));
    worst_norm = std::max(worst_norm, Rel(gn, cn));
    EXPECT_LE(Rel(gl, cl), loss_tol) << "step " << s + 1 << ": cuda loss " << gl << " vs cpu " << cl;
    EXPECT_LE(Rel(gn, cn), norm_tol) << "step " << s + 1 << ": cuda grad norm " << gn << " vs cpu " << cn;
  }
  const size_t n = cpu.opt->params().size();
  const double tensors = TensorsRel(gpu.State(), cpu.State(), n);
  EXPECT_LE(tensors, tensor_tol) << "trained tensors after " << kSteps << " steps";
  std::printf(
      "PARITY %s: %d steps, worst loss rel %.2e (bound %.0e), worst grad-norm rel %.2e (bound %.0e), "
      "trained tensors rel %.2e (bound %.0e)\n",
      k.name, kSteps, worst_loss, loss_tol, worst_norm, norm_tol, tensors, tensor_tol);
}

// Half the run on one device, the rest on the other, against the whole run on the CPU.
TEST_P(CudaParity, ResumesAcrossDevices) {
  const Case& k = GetParam();
  std::string skip;
  std::shared_ptr<Backend> cuda = CudaOrSkip(&skip);
  if (!cuda) GTEST_SKIP() << skip;
  const bool low = k.dtype != ComputeDType::kF32;
  const double loss_tol = low ? 1e-2 : 1e-4, tensor_tol = low ? 5e-2 : 1e-3;
  Trained ref(k, CpuBackendInstance());
  std::vector<double> want;
  for (int s = 0; s < kSteps; ++s) want.push_back(ref.Step(k, s).first);
  const size_t n = ref.opt->params().size();
  for (bool gpu_first : {true, false}) {
    Trained first(k, gpu_first ? cuda : CpuBackendInstance());
    Trained second(k, gpu_first ? CpuBackendInstance() : cuda);
    for (int s = 0; s < kSteps / 2; ++s) first.Step(k, s);
    second.SetState(first.State(), first.opt->step());
    double worst = 0;
    for (int s = kSteps / 2; s < kSteps; ++s) {
      const double loss = second.Step(k, s).first;
      worst = std::max(worst, Rel(loss, want[s]));
      EXPECT_LE(Rel(loss, want[s]), loss_tol) << (gpu_first ? "cuda→cpu" : "cpu→cuda") << " step " << s + 1;
    }
    const double tensors = TensorsRel(second.State(), ref.State(), n);
    EXPECT_LE(tensors, tensor_tol);
    std::printf("PARITY %s resume %s: worst loss rel %.2e, trained tensors rel %.2e\n", k.name,
                gpu_first ? "cuda->cpu" : "cpu->cuda", worst, tensors);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaParity,
    ::testing::Values(
        Case{"llama_lora_fp32", "llama", false, ComputeDType::kF32, false, false, false, 0.0},
        Case{"llama_qlora_nf4dq_fp32", "llama", true, ComputeDType::kF32, false, false, false, 0.0},
        Case{"qwen2_lora_fp32", "qwen2", false, ComputeDType::kF32, false, false, false, 0.0},
        Case{"qwen2_qlora_nf4dq_fp32", "qwen2", true, ComputeDType::kF32, false, true, true, 0.1},
        Case{"llama_full_fp32", "llama", false, ComputeDType::kF32, true, false, false, 0.0},
        Case{"llama_lora_bf16", "llama", false, ComputeDType::kBF16, false, false, false, 0.0},
        Case{"llama_qlora_nf4dq_bf16", "llama", true, ComputeDType::kBF16, false, true, true, 0.1},
        Case{"llama_qlora_nf4dq_fp16", "llama", true, ComputeDType::kF16, false, true, true, 0.1},
        Case{"qwen3_qlora_nf4dq_bf16", "qwen3", true, ComputeDType::kBF16, false, true, true, 0.1},
        Case{"qwen3_full_fp32", "qwen3", false, ComputeDType::kF32, true, false, false, 0.0},
        Case{"gemma3_qlora_nf4dq_bf16", "gemma3", true, ComputeDType::kBF16, false, true, true, 0.1},
        Case{"gemma3_full_fp32", "gemma3", false, ComputeDType::kF32, true, false, false, 0.0},
        Case{"gemma2_lora_bf16", "gemma2", false, ComputeDType::kBF16, false, false, false, 0.0},
        Case{"gemma2_full_fp32", "gemma2", false, ComputeDType::kF32, true, false, false, 0.0},
        Case{"phi3_qlora_nf4dq_bf16", "phi3", true, ComputeDType::kBF16, false, true, true, 0.1},
        Case{"phi3_lora_fp32", "phi3", false, ComputeDType::kF32, false, false, false, 0.0}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ft
