// The CUDA cost model (engine/model/cuda_cost.h, engine/train/step_cost.h)
// against figures computed by hand from the model's shape: one QLoRA step
// with activation checkpointing of the Llama-3-8B shape (bench/gpu's job:
// NF4 + double quant, r = 16 on every linear, seq 2048, micro-batch 1) and of
// the bench preset. Two ops are checked whole: the attention kernels' FLOPs
// (causal pairs; forward twice, for the recompute) and NF4 dequantization's
// bytes (the blob read, bf16 written: the GEMMs' operand type; forward,
// recompute and backward each dequantize every linear). Then what the plan
// prints from it, and the calls an H200 measured.
#include "engine/train/step_cost.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "engine/job/hf_config.h"
#include "engine/job/planner.h"
#include "engine/model/cuda_op_names.h"
#include "kernels/cpu/nf4.h"

namespace ft {
namespace {

using ::testing::HasSubstr;

JobSpec QloraJob(int64_t seq, const std::string& gradient_sum = "auto") {
  const std::string yaml =
      "model: {path: /m, dtype: bf16, quantization: nf4, double_quant: true}\n"
      "adapter: {type: lora, r: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, "
      "up_proj, down_proj]}\n"
      "data: {train: /d.jsonl, format: tokens, seq_len: " +
      std::to_string(seq) +
      ", packing: false}\n"
      "train: {max_steps: 1, global_batch_size: 1, micro_batch_size: 1, activation_checkpointing: true, "
      "gradient_sum: " +
      gradient_sum +
      "}\n"
      "output: {dir: /o}\n";
  auto spec = ParseJobSpec(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

// An NF4 blob's bytes by hand: 4-bit codes, one 8-bit scale per 64 values, one fp32 per 256 scales,
// each part starting 16-byte aligned.
double Nf4BlobBytes(int64_t n) {
  const auto align16 = [](int64_t b) { return (b + 15) / 16 * 16; };
  const int64_t blocks = (n + 63) / 64;
  return static_cast<double>(align16(align16((n + 1) / 2) + blocks) + 4 * ((blocks + 255) / 256));
}

struct Expected {
  double attention_forward_flops, attention_backward_flops, nf4_bytes;
  int64_t nf4_calls;
};

Expected ByHand(const ModelConfig& c, int64_t seq) {
  const double pairs = static_cast<double>(seq) * static_cast<double>(seq + 1) / 2;  // causal, batch 1
  const double per_layer = static_cast<double>(c.num_heads * c.head_dim) * pairs;
  const int64_t D = c.hidden_size, I = c.intermediate_size, q = c.num_heads * c.head_dim,
                kv = c.num_kv_heads * c.head_dim;
  const int64_t linears[] = {D * q, D * kv, D * kv, q * D, D * I, D * I, I * D};
  double nf4 = 0;
  const auto dequantized = [](int64_t n) { return Nf4BlobBytes(n) + 2.0 * static_cast<double>(n); };  // bf16
  for (int64_t n : linears) nf4 += dequantized(n);
  const double layers = static_cast<double>(c.num_layers);
  // QK^T and PV (2 FLOPs a multiply-add) forward and in the recompute; five products backward.
  // Every linear dequantized forward, in the recompute and backward, but down_proj (the recompute's
  // last, the backward's first) once for both.
  return {2 * 4 * per_layer * layers, 10 * per_layer * layers, (3 * nf4 - dequantized(I * D)) * layers,
          (3 * 7 - 1) * c.num_layers};
}

void ExpectHandFigures(const ModelConfig& config, int64_t seq) {
  auto cost = PredictCudaStep(QloraJob(seq), config, 1, 1);
  ASSERT_TRUE(cost.ok()) << cost.status().ToString();
  const Expected e = ByHand(config, seq);
  const OpWork& fwd = cost->ops.at(cuda_op::kAttentionForward);
  const OpWork& bwd = cost->ops.at(cuda_op::kAttentionBackward);
  const OpWork& nf4 = cost->ops.at(cuda_op::kNf4Dequantize);
  EXPECT_DOUBLE_EQ(fwd.flops, e.attention_forward_flops);
  EXPECT_EQ(fwd.calls, 2 * config.num_layers) << "forward and recompute";
  EXPECT_TRUE(fwd.tensor) << "bf16 attention runs on tensor cores";
  EXPECT_DOUBLE_EQ(bwd.flops, e.attention_backward_flops);
  EXPECT_EQ(bwd.launches, 3 * config.num_layers) << "a delta kernel and two tile kernels a layer";
  EXPECT_DOUBLE_EQ(nf4.bytes, e.nf4_bytes);
  EXPECT_EQ(nf4.calls, e.nf4_calls);
  EXPECT_EQ(cost->tokens, seq);
}

TEST(StepCostTest, TheEightBillionQloraStepMatchesTheHandComputedAttentionFlopsAndNf4Bytes) {
  auto config = ReadHfConfig(std::string(FT_SOURCE_DIR) + "/bench/gpu/llama3-8b");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ExpectHandFigures(*config, 2048);
}

TEST(StepCostTest, TheBenchPresetQloraStepMatchesTheHandComputedAttentionFlopsAndNf4Bytes) {
  auto config = PresetModelConfig("bench");
  ASSERT_TRUE(config.ok());
  ExpectHandFigures(*config, 128);
}

// The calls per step the model predicts are the ones the CUDA backend made on an H200: the
// FT_CUDA_OP_TIMES profile of docs/PERFORMANCE.md (bench/gpu/run.sh, 2026-11-27: model loading and
// 5 steps of this job, float gradient sums as then). Loading adds host->device copies and one
// rounding of each float weight (2 norms a layer and the final one); every other call is a step's.
// Since then NF4 weights are dequantized straight to bf16: each of a step's 3 uses of its 7 x 32
// linears lost its rounding pass and its GEMM operand conversion. And the typed ops read and write
// bf16 in place: the conversions of their fp32 staging are gone (`staged` below, from the same
// profile: each norm forward widened x and narrowed y, each norm backward widened x, each forward
// RoPE (640 of the 960; the backward's rotate fp32 gradients) widened and narrowed q or k, attention
// widened q, k, v and narrowed out forward and widened q, k, v, out backward, SwiGLU forward widened
// gate and up and narrowed h and backward widened gate and up, and each residual Axpy (640 of the
// 960; the backward's add fp32 gradients) widened the residual). What is left to convert are the
// linears' fp32 results, stored rounded. And each linear's backward rounds its gradient dy and
// LoRA's dxa once into 16-bit copies (2 conversions) that its GEMMs read, where the GEMMs rounded dy
// three times and dxa twice (after a rounding pass over dxa); the gradients only GEMMs read (dy of
// gate, up, q, k and v: 5 of a layer's 7) lost their rounding pass, their copy being rounded. And
// LoRA's A and B are read from 16-bit copies the optimizer's update writes (Backend::AdamW's copy):
// the 6 operand conversions of each linear's step (A and B in the forward, the recompute and the
// backward) are gone. The gradient norm's sums of squares (one call per tensor, 2 launches each)
// are one multi-tensor call (2 launches) a step. And each linear's forward ends in one LinearOutput
// (LoRA's B product, the rounding and the residual in one kernel): its LoRA-B GEMM, its result's
// conversion and, for o and down, the residual's rounding pass and Axpy are gone. And the gradients
// PyTorch keeps as bf16 tensors are stored 16-bit (backend.h): a linear's backward reads its dy as
// stored (its 7 conversions a layer go), and a layer stores 8 instead (d(act), d(n2), d(h), d(n1),
// its input's gradient, and q, k, v's), where 5 of them were rounding passes in place; the head's
// two (d(xf) and the last layer's output gradient) are stores too. And a checkpointed layer's
// backward starts with the down_proj weight its recompute dequantized last: kept, not made again.
TEST(StepCostTest, PredictedCallsPerStepAreTheOnesMeasuredOnAnH200) {
  auto config = ReadHfConfig(std::string(FT_SOURCE_DIR) + "/bench/gpu/llama3-8b");
  ASSERT_TRUE(config.ok());
  auto cost = PredictCudaStep(QloraJob(2048, "float"), *config, 1, 1);
  ASSERT_TRUE(cost.ok()) << cost.status().ToString();
  const int64_t steps = 5, load_roundings = 2 * config->num_layers + 1;
  const int64_t nf4_uses = steps * 3 * 7 * config->num_layers;  // no longer rounded nor converted
  const int64_t staged = 2 * 645 + 325 + 2 * 640 + 4 * 320 + 4 * 160 + 3 * 320 + 2 * 160 + 640;
  const int64_t linear_backwards = steps * 7 * config->num_layers;
  const int64_t residual_adds = steps * 2 * 2 * config->num_layers;  // o and down, forward and recompute
  const int64_t stored_gradients = steps * (8 * config->num_layers + 2);
  const int64_t rounded_then = steps * (5 * config->num_layers + 2);  // of those, rounded in place before
  const std::pair<const char*, int64_t> measured[] = {
      {cuda_op::kGemmBf16, 12960 - 2 * linear_backwards},
      {cuda_op::kOperandsToBf16, 16000 - nf4_uses - 5 * linear_backwards - 6 * linear_backwards},
      {cuda_op::kNf4Dequantize, 3360 - steps * config->num_layers},  // down_proj's recompute is kept
      {cuda_op::kRoundBf16, 7275 - load_roundings - nf4_uses - linear_backwards -
                                5 * steps * config->num_layers - residual_adds - rounded_then},
      {cuda_op::kConvert,
       11215 - staged + 2 * linear_backwards - 2 * linear_backwards - linear_backwards + stored_gradients},
      {cuda_op::kAttentionBackward, 160},
      {cuda_op::kAttentionForward, 320},
      {cuda_op::kCrossEntropy, 320},
      {cuda_op::kSwiGluForward, 320},
      {cuda_op::kSumSquares, 2240 / (7 * 32 * 2)},  // one multi-tensor pass over the 448 gradients
      {cuda_op::kAxpy, 960 - residual_adds},
      {cuda_op::kSwiGluBackward, 160},
      {cuda_op::kRope, 960},
      {cuda_op::kRmsNormForward, 645},
      {cuda_op::kRmsNormBackward, 325},
      {cuda_op::kAdamW, 2240},
      {cuda_op::kZero, 2245},
      {cuda_op::kEmbeddingForward16, 5},
  };
  for (const auto& [name, calls] : measured) {
    ASSERT_TRUE(cost->ops.count(name)) << name;
    EXPECT_EQ(cost->ops.at(name).calls * steps, calls) << name;
  }
  ASSERT_TRUE(cost->ops.count(cuda_op::kLinearOutput));
  EXPECT_EQ(cost->ops.at(cuda_op::kLinearOutput).calls * steps, 2 * linear_backwards)
      << "one per linear forward";
}

// The planner's device memory for a CUDA job (less the CUDA runtime it adds) is within 5% of what
// the CUDA backend allocates for one step of it (the cost backend mirrors its allocations; its 8.12
// GiB for this job equalled the allocator peak an H200 measured before typed ops read in place),
// and never below it: the planner is what `micro_batch_size: auto` and ftd's placement trust.
TEST(StepCostTest, ThePlannersDeviceMemoryIsWithinFivePercentOfWhatTheBackendAllocates) {
  const std::string full_yaml =  // a full fine-tune in bf16: its loss head is fp32, its input bf16
      "model: {path: /m, dtype: bf16}\nadapter: {type: full}\n"
      "data: {train: /d.jsonl, format: tokens, seq_len: 1024, packing: false}\n"
      "train: {max_steps: 1, global_batch_size: 1, micro_batch_size: 1, gradient_sum: float}\n"
      "output: {dir: /o}\n";
  const std::pair<const char*, JobSpec> cases[] = {
      {"/bench/gpu/llama3-8b", QloraJob(2048)},
      {"/bench/gpu/small-llama", QloraJob(2048)},
      {"/bench/gpu/small-llama", *ParseJobSpec(full_yaml, "full.yaml")},
  };
  for (const auto& [dir, spec] : cases) {
    auto config = ReadHfConfig(std::string(FT_SOURCE_DIR) + dir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    auto cost = PredictCudaStep(spec, *config, 1, 1);
    ASSERT_TRUE(cost.ok()) << cost.status().ToString();
    const PlanRequest request = PlanRequestFromJob(spec, *config, DeviceKind::kCuda, 1);
    const MemoryBreakdown planned = PredictMemory(request, 1);
    const double engine = static_cast<double>(planned.total() - planned.runtime);
    const double allocated = static_cast<double>(cost->device_bytes);
    std::printf("%s: planned %.3f GiB, allocated %.3f GiB\n", dir, engine / (1 << 30), allocated / (1 << 30));
    EXPECT_GE(engine, allocated) << dir;
    EXPECT_LE(engine, 1.05 * allocated) << dir;
  }
}

// The layout the cost model gives an NF4 weight is the one quantizing it gives.
TEST(StepCostTest, Nf4LayoutFromTheShapeIsTheQuantizedTensorsLayout) {
  for (const bool dq : {true, false}) {
    for (const int64_t n : {int64_t{64}, int64_t{1000}, int64_t{65536 + 64}}) {
      const cpu::Nf4Config config{64, dq, 256};
      std::vector<float> values(static_cast<size_t>(n), 0.5f);
      const cpu::Nf4Layout a = cpu::Nf4BlobLayout(cpu::QuantizeNf4(values.data(), n, config));
      const cpu::Nf4Layout b = cpu::Nf4BlobLayoutFor(n, config);
      EXPECT_EQ(a.bytes, b.bytes) << n;
      EXPECT_EQ(a.absmax_at, b.absmax_at);
      EXPECT_EQ(a.absmax2_at, b.absmax2_at);
      EXPECT_EQ(a.absmax2_n, b.absmax2_n);
    }
  }
}

// A sliding window (Mistral, Gemma's local layers) costs only the keys inside it: the query at
// position p computes min(p + 1, window) pairs, forward and backward, also after cached keys.
TEST(StepCostTest, SlidingWindowAttentionCountsOnlyTheKeysInsideTheWindow) {
  CudaCostBackend cost;
  const float* none = nullptr;
  float* grad = nullptr;
  const auto forward_flops = [&](const cpu::AttentionShape& s) {
    cost.ClearLedger();
    cost.AttentionForward(GemmOperands::kBF16, s, none, none, none, nullptr, grad, grad, false);
    return cost.ledger().at(cuda_op::kAttentionForward).flops;
  };
  const double per_pair = 4.0 * 4 * 64;  // QK^T and PV (2 FLOPs a multiply-add), 4 query heads of 64 dims
  cpu::AttentionShape s{1, 1000, 4, 2, 64, 0.125};
  EXPECT_DOUBLE_EQ(forward_flops(s), per_pair * (1000.0 * 1001 / 2));
  s.window = 100;  // queries 0..99 see 1..100 keys, the other 900 see 100
  const double windowed_pairs = 100.0 * 101 / 2 + 900.0 * 100;
  EXPECT_DOUBLE_EQ(forward_flops(s), per_pair * windowed_pairs);
  s.window = 5000;  // wider than the sequence: every causal pair
  EXPECT_DOUBLE_EQ(forward_flops(s), per_pair * (1000.0 * 1001 / 2));
  s.seq = 10;  // 10 queries after 1000 cached keys: 100 keys each
  s.kv_seq = 1010;
  s.window = 100;
  EXPECT_DOUBLE_EQ(forward_flops(s), per_pair * 10 * 100);
  s.kv_seq = 95;  // after 85 cached keys: positions 85..94 see 86..95 keys, within the window
  EXPECT_DOUBLE_EQ(forward_flops(s), per_pair * (86.0 + 95) * 10 / 2);

  const cpu::AttentionShape train{1, 1000, 4, 2, 64, 0.125, 0, 100};
  cost.ClearLedger();
  cost.AttentionBackward(GemmOperands::kBF16, train, none, none, none, nullptr, none, none, none, grad, grad,
                         grad);
  EXPECT_DOUBLE_EQ(cost.ledger().at(cuda_op::kAttentionBackward).flops, 10.0 * 4 * 64 * windowed_pairs);
}

// What `ft-train plan --gpu` prints: the categories, the launches and the bytes converted, and a
// roofline the size of the work (the 8B step's GEMMs alone are ~6·N·tokens FLOPs).
TEST(StepCostTest, ThePlanSaysLaunchesConversionsAndTheRoofline) {
  auto config = ReadHfConfig(std::string(FT_SOURCE_DIR) + "/bench/gpu/llama3-8b");
  ASSERT_TRUE(config.ok());
  auto cost = PredictCudaStep(QloraJob(2048), *config, 1, 1);
  ASSERT_TRUE(cost.ok()) << cost.status().ToString();
  auto h100 = FindGpu("h100");
  ASSERT_TRUE(h100.ok());
  const std::string text = FormatStepCost(*cost, *h100);
  EXPECT_THAT(text, HasSubstr("gemm bf16 (cuBLASLt)"));
  EXPECT_THAT(text, HasSubstr("nf4 dequantize"));
  EXPECT_THAT(text, HasSubstr("launches"));
  EXPECT_THAT(text, HasSubstr("of it conversions"));
  EXPECT_GT(Launches(*cost), 1000);
  EXPECT_GT(ConversionBytes(*cost), 0);
  const OpWork& gemm = cost->ops.at(cuda_op::kGemmBf16);
  const double six_n_t = 6.0 * static_cast<double>(cost->parameters) * static_cast<double>(cost->tokens);
  EXPECT_GT(gemm.flops, 0.8 * six_n_t) << "forward, recompute and backward of the frozen linears";
  EXPECT_LT(gemm.flops, 1.2 * six_n_t);
  EXPECT_FALSE(FindGpu("v100").ok());
  std::printf("%s", text.c_str());
}

}  // namespace
}  // namespace ft
