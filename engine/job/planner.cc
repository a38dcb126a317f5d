#include "engine/job/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/model/attention_route.h"
#include "engine/model/model.h"

namespace ft {

namespace {

constexpr int64_t kF32 = 4;
constexpr int64_t kLossChunkFloats = int64_t{1} << 22;     // engine/model/model.cc's logits budget per chunk
constexpr int64_t kCudaRuntimeBytes = int64_t{512} << 20;  // context + cuBLAS workspace (uncalibrated)
constexpr double kMargin = 0.05;

struct LinearShape {
  int64_t in, out;
  bool adapted;
  bool bias;
};

std::vector<LinearShape> Linears(const PlanRequest& r) {
  const ModelConfig& c = r.model;
  std::vector<LinearShape> out;
  for (int m = 0; m < kNumModules; ++m) {
    const ModuleDims dims = ModuleShape(c, static_cast<ModuleKind>(m));
    if (!dims.present()) continue;
    const std::string name = ModuleName(c, static_cast<ModuleKind>(m));
    const bool adapted =
        !r.full && std::find(r.lora_targets.begin(), r.lora_targets.end(), name) != r.lora_targets.end();
    out.push_back({dims.in, dims.out, adapted, c.attention_bias && m <= static_cast<int>(ModuleKind::kV)});
  }
  return out;
}

int64_t Align(int64_t bytes, int64_t to) { return (bytes + to - 1) / to * to; }

// NF4 storage of n values as the engine keeps it (kernels/cpu/nf4.h's blob):
// packed nibbles, then the block scales (8-bit with double quant), then the
// second-level fp32 scales, each part 16-byte aligned.
int64_t Nf4Bytes(int64_t n, int64_t block, bool double_quant) {
  const int64_t blocks = (n + block - 1) / block;
  const int64_t scales = double_quant ? blocks : blocks * kF32;
  return Align(Align((n + 1) / 2, 16) + scales, 16) + (double_quant ? (blocks + 255) / 256 * kF32 : 0);
}

// cuDNN's attention route (kernels/cuda/attention_cudnn.h) for one micro-batch of `rows` rows: its
// deterministic backward's dP scratch, by the route's own estimate for whole rows (packed rows: their
// documents, counted and sized in powers of two, take up to 8 times that), never more than the
// budget past which the route refuses the call; and its 16-bit copies of dout, dq, dk and dv.
int64_t CudnnAttentionBytes(const PlanRequest& r, int64_t rows) {
  const ModelConfig& c = r.model;
  AttentionRouteFacts f;
  f.shape.q_heads = c.num_heads;
  f.documents = rows / std::max<int64_t>(r.seq_len, 1);
  f.max_doc_len = r.seq_len;
  const int64_t scratch = CudnnDeterministicWorkspaceBytes(f) * (r.packed ? 8 : 1);
  return std::min(scratch, f.workspace_budget_bytes) + rows * (2 * c.q_dim() + 2 * c.kv_dim()) * 2;
}

// Device workspace bytes of one micro-batch of `rows` rows (engine/model/model.cc's backward
// workspaces, loss head, RoPE tables, NF4 scratch; CUDA's extra staging and partials);
// `max_linear`: the largest linear's element count.
int64_t WorkspaceBytes(const PlanRequest& r, int64_t rows, int64_t max_linear) {
  const ModelConfig& c = r.model;
  const bool cuda = r.device == DeviceKind::kCuda;
  const bool low = r.dtype != ComputeDType::kF32;
  const int64_t act = low ? 2 : kF32;
  const int64_t D = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), H = c.num_heads;
  const int64_t lora_r = r.full ? 0 : r.lora_r;
  const int64_t chunk =
      r.loss_chunk_rows > 0 ? r.loss_chunk_rows : std::max<int64_t>(1, kLossChunkFloats / V);
  const int64_t widest = rows * std::max({D, I, Q});
  // A linear's output: with fused projections (Phi-3) qkv_proj's q + 2 kv or gate_up_proj's 2 I.
  const int64_t fused_out = c.fused_projections ? std::max(Q + 2 * KV, 2 * I) : 0;
  const int64_t widest_out = std::max(widest, rows * fused_out);
  const int64_t rope_tables = c.rope_local_theta > 0 ? 2 : 1;  // Gemma 3's sliding layers have their own
  // One block's gradients at a time (Model::AllocBackwardPhase): the MLP's dact (fp32) with dg and
  // du (typed: over dact; fp32: beside it), or the attention's datt, dq, dk, dv (dqp, dkp), fp32.
  const int64_t mlp_phase = low ? std::max(rows * I * kF32, 2 * rows * I * act) : 3 * rows * I * kF32;
  const int64_t attention_phase = rows * (2 * Q + 2 * KV + (c.qk_norm ? Q + KV : 0)) * kF32;
  return rows * 3 * D * kF32                     // dh, dn, dxf
         + std::max(mlp_phase, attention_phase)  // one block's gradients
         + rows * D * act                        // the layers' gradient, stored as PyTorch's bf16 tensor is
         + (low ? rows * D * act : 0)            // d(h) stored beside its fp32 sum
         + (c.gemma ? rows * D * kF32 : 0)       // dpre: through a sandwich norm
         + rows * lora_r * kF32                  // dxa
         + (r.lora_dropout > 0 ? widest * kF32 : 0)         // dropped-out input
         + (low ? (widest_out + rows * lora_r) * kF32 : 0)  // fp32 linear / LoRA results before storing
         + rows * fused_out * (act + kF32)                  // a fused output before its split; its gradient
         + std::min(rows, chunk) * V * kF32                 // logits chunk
         + std::min(rows, chunk) * D * (act + kF32)         // the head's gathered rows and their gradient
         + rows * 6 * 4                                     // int32 batch inputs (4), head rows and targets
         + rope_tables * 2 * r.seq_len * (c.rotary_dim() / 2) * kF32  // RoPE cos/sin
         + (r.nf4 ? max_linear * (low ? 2 : kF32) : 0)  // one NF4 linear dequantised to its GEMM operand type
         // CUDA under bf16/fp16 (engine/model/cuda_backend.cu): the 16-bit copies of fp32 GEMM operands
         // (a full fine-tune's weight, the loss head's gradient; kept for LoRA too, whose frozen weights
         // and stored gradients need none now: an upper bound). Its typed ops read 16-bit activations in
         // place: no fp32 staging but a full fine-tune's loss head (fp32 weights) widening its 16-bit input,
         // forward and backward.
         + (cuda && low ? (max_linear + widest_out) * 2 + (r.full ? 2 * std::min(rows, chunk) * D * kF32 : 0)
                        : 0)
         // CUDA: the attention backward's row deltas, a full fine-tune's RMSNorm weight-gradient partials
         // (kernels/cuda/norm.cu: one row of D per 64 rows).
         + (cuda ? rows * H * kF32 + (r.full ? (rows + 63) / 64 * D * kF32 : 0) : 0) +
         (cuda && r.cudnn_attention ? CudnnAttentionBytes(r, rows) : 0);
}

}  // namespace

MemoryBreakdown PredictMemory(const PlanRequest& r, int64_t micro) {
  const ModelConfig& c = r.model;
  const bool cuda = r.device == DeviceKind::kCuda;
  // Activations are stored in the compute dtype on every backend (typed storage: 2 bytes under
  // bf16/fp16); norms and biases as fp32, and so are the gradient workspaces GEMMs accumulate into
  // (the gradients PyTorch keeps as bf16 tensors are stored in the compute dtype: WorkspaceBytes).
  const bool low = r.dtype != ComputeDType::kF32;
  const int64_t act = low ? 2 : kF32;
  // Frozen linear weights are stored in the compute dtype on every backend (Linear::w16), and
  // widened into one float scratch per linear for its GEMMs.
  const bool typed = r.dtype != ComputeDType::kF32 && !r.nf4 && !r.full;
  const int64_t L = c.num_layers, D = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), H = c.num_heads;
  const std::vector<LinearShape> lin = Linears(r);

  MemoryBreakdown m;
  m.micro_batch = micro;
  int64_t trainable = 0, adapted = 0, max_linear = 0, largest_param = 0;
  // Two norms (Gemma: four), and with q/k norms two of head_dim (Qwen3, Gemma); Gemma keeps each
  // norm's (1 + w) beside it.
  const int64_t qk_norms = c.qk_norm ? 2 * c.head_dim : 0;
  const int64_t layer_norms = (c.gemma ? 4 : 2) * D + qk_norms;
  int64_t per_layer_weights = layer_norms * kF32 * (c.gemma ? 2 : 1);
  int64_t per_layer_linears = 0, stage = 0;  // frozen linear storage; one cpu_offload stage
  for (const LinearShape& s : lin) {
    const int64_t n = s.in * s.out;
    max_linear = std::max(max_linear, n);
    // Not typed: fp32 (a full fine-tune's trainable masters, whatever the compute dtype).
    const int64_t bytes = r.nf4 ? Nf4Bytes(n, r.nf4_block, r.double_quant) : n * (typed ? 2 : kF32);
    per_layer_linears += bytes;
    stage += Align(bytes, 256);
    if (s.bias) per_layer_weights += s.out * kF32;
    if (s.adapted) {
      trainable += L * r.lora_r * (s.in + s.out);
      largest_param = std::max({largest_param, r.lora_r * s.in, r.lora_r * s.out});
      ++adapted;
    }
    if (r.full) {
      trainable += L * (n + (s.bias ? s.out : 0));
      largest_param = std::max(largest_param, n);
    }
  }
  const int64_t embed = V * D;
  const bool cpu_offload = r.cpu_offload && !r.full;
  const bool fsdp = r.fsdp && r.world > 1 && !r.full;
  // FSDP: this rank's shard of each layer's stage image (engine/model/model.cc), and two stages.
  const int64_t shard = Align((stage + r.world - 1) / r.world, 256);
  // cpu_offload keeps the frozen linears (FSDP: this rank's shards of them) in host memory.
  const int64_t linears = cpu_offload ? 2 * stage : fsdp ? L * shard + 2 * stage : L * per_layer_linears;
  // Embeddings and head: frozen under LoRA/QLoRA, so stored in the compute dtype.
  const int64_t embed_bytes = (low && !r.full ? 2 : kF32) * embed * (c.tie_word_embeddings ? 1 : 2);
  m.weights =
      L * per_layer_weights + linears + embed_bytes + D * kF32 +
      (c.gemma ? (D + std::max(D, c.head_dim)) * kF32 : 0);  // Gemma: the final norm's (1 + w), the ones
  m.host_weights = cpu_offload ? (fsdp ? L * shard : L * per_layer_linears) : 0;
  if (r.full) {
    trainable += L * layer_norms + embed + D + (c.tie_word_embeddings ? 0 : embed);
    largest_param = std::max(largest_param, embed);
  }
  // LoRA under bf16/fp16: the fp32 masters and the 16-bit copies the GEMMs read.
  m.adapter = r.full ? 0 : trainable * (kF32 + (low ? 2 : 0));
  m.gradients = trainable * kF32;
  m.trainable_values = trainable;
  m.host_gradient_sum = r.exact_gradient_sum ? trainable * (kExactSumBytesPerValue + kF32) : 0;
  // Paged: two device pages of [m | v] for the largest parameter; the moments on the host.
  // FSDP: rank 0's range of the flat trainable vector (engine/train/optimizer.h); its largest
  // piece of one parameter is at most the largest parameter.
  const int64_t kept = fsdp ? (trainable + r.world - 1) / r.world : trainable;
  const int64_t largest_kept = std::min(largest_param, kept);
  m.optimizer = r.paged_optimizer ? 2 * 2 * largest_kept * kF32 : 2 * kept * kF32;
  m.host_optimizer = r.paged_optimizer ? 2 * kept * kF32 : 0;

  const int64_t rows = micro * r.sequences_per_example * r.seq_len;
  const int64_t lora_r = r.full ? 0 : r.lora_r;
  // Saved per layer: n1, q, k, v, attention out, h, n2, gate, up, act, LoRA x·Aᵀ; fp32 rstd×2 and lse;
  // with q/k norms the projections' outputs too and their rstd per head.
  const int64_t qk_saved = c.qk_norm ? rows * (Q + KV) * act + rows * (H + c.num_kv_heads) * kF32 : 0;
  // Gemma's sandwich norms: the o and down outputs before their norms, and their rstd.
  const int64_t sandwich_saved = c.gemma ? rows * 2 * D * act + rows * 2 * kF32 : 0;
  const int64_t layer_saved = rows * (3 * D + 2 * Q + 2 * KV + 3 * I) * act + rows * (2 + H) * kF32 +
                              rows * lora_r * adapted * act + qk_saved + sandwich_saved;
  // Offloading keeps three layer inputs on the device (engine/model/model.cc's slots), L on the host.
  const bool offload = r.offload_activations && r.activation_checkpointing;
  const int64_t layer_inputs = (offload ? 3 : L + 1) * rows * D * act;
  m.host_activations = offload ? L * rows * D * act : 0;
  const int64_t saved_layers = r.activation_checkpointing ? 1 : L;
  m.activations = layer_inputs + saved_layers * layer_saved + rows * D * act + rows * kF32;  // + final norm

  m.workspace = WorkspaceBytes(r, rows, max_linear);
  m.runtime = cuda ? kCudaRuntimeBytes : 0;
  return m;
}

StatusOr<BatchPlanChoice> ChooseMicroBatch(const PlanRequest& r, int64_t device_bytes) {
  if (r.world <= 0 || r.global_batch % r.world != 0) {
    return Status::InvalidArgument("global_batch_size " + std::to_string(r.global_batch) +
                                   " is not divisible by the world size " + std::to_string(r.world));
  }
  const int64_t per_rank = r.global_batch / r.world;
  const int64_t budget = static_cast<int64_t>(static_cast<double>(device_bytes) * (1.0 - kMargin));
  for (int64_t micro = per_rank; micro >= 1; --micro) {
    if (per_rank % micro != 0) continue;
    MemoryBreakdown m = PredictMemory(r, micro);
    if (m.total() <= budget) return BatchPlanChoice{micro, per_rank / micro, r.world, m, device_bytes};
  }
  MemoryBreakdown one = PredictMemory(r, 1);
  return Status::ResourceExhausted(
      "the job needs " + FormatBytes(one.total()) + " at micro-batch 1 (weights " + FormatBytes(one.weights) +
      ", activations " + FormatBytes(one.activations) + ") but the device offers " +
      FormatBytes(device_bytes) + "; try activation_checkpointing, quantization: nf4 or a shorter seq_len");
}

StatusOr<BatchPlanChoice> CheckFixedMicroBatch(const PlanRequest& r, int64_t micro_batch,
                                               int64_t device_bytes) {
  const MemoryBreakdown m = PredictMemory(r, micro_batch);
  const int64_t accumulation = r.global_batch / (micro_batch * r.world);
  if (m.total() <= device_bytes) return BatchPlanChoice{micro_batch, accumulation, r.world, m, device_bytes};
  std::string fix;
  auto fits = ChooseMicroBatch(r, device_bytes);
  if (fits.ok()) {
    fix = "set micro_batch_size: " + std::to_string(fits->micro_batch) + " (the largest that fits, " +
          FormatBytes(fits->memory.total()) + ") or micro_batch_size: auto";
  } else {
    fix = "even micro-batch 1 needs " + FormatBytes(PredictMemory(r, 1).total()) +
          ": try activation_checkpointing, quantization: nf4 or a shorter seq_len";
  }
  return Status::ResourceExhausted(
      "micro-batch " + std::to_string(micro_batch) + " needs " + FormatBytes(m.total()) + " (weights " +
      FormatBytes(m.weights) + ", activations " + FormatBytes(m.activations) + ", workspace " +
      FormatBytes(m.workspace) + ") but the device offers " + FormatBytes(device_bytes) + "; " + fix +
      " (ft-train plan shows the breakdown)");
}

int64_t FixedMicroBatch(const JobSpec& spec, int64_t world) {
  const auto& t = spec.train;
  if (t.micro_batch_size > 0) return t.micro_batch_size;
  if (t.gradient_accumulation > 0) return t.global_batch_size / (t.gradient_accumulation * world);
  return 0;
}

Status CheckCudaTakesModel(const JobSpec& spec, const ModelConfig& model, const std::string& how) {
  const Status takes = CheckHeadDimForDevice(DeviceKind::kCuda, model.head_dim);
  if (takes.ok()) return takes;
  return Status::InvalidArgument(spec.file + ": resources.device: " + how + ", but model.path " +
                                 spec.model.path + " (config.json) has " + takes.message() +
                                 "; use resources.device: cpu");
}

Status CheckJobTakesModel(const JobSpec& spec, const ModelConfig& model) {
  if (spec.adapter.type == AdapterType::kLora) {
    if (Status s = ResolveTargetModules(model, spec.adapter.target_modules).status(); !s.ok()) {
      return Status::InvalidArgument(spec.file + ": adapter.target_modules: " + std::string(s.message()) +
                                     " (model.path " + spec.model.path + ")");
    }
  }
  if (!model.max_position_embeddings_unset && spec.data.seq_len > model.max_position_embeddings) {
    // Positions past the model's context were never trained (RoPE beyond its range): refused, not
    // trained into a model that behaves well only on short inputs.
    return Status::InvalidArgument(
        spec.file + ": data.seq_len " + std::to_string(spec.data.seq_len) + " exceeds model.path " +
        spec.model.path + " (config.json) max_position_embeddings " +
        std::to_string(model.max_position_embeddings) +
        ", the longest sequence the model takes; use seq_len <= " +
        std::to_string(model.max_position_embeddings) + " or a model with a longer context");
  }
  return Status::OK();
}

PlanRequest PlanRequestFromJob(const JobSpec& spec, const ModelConfig& model, DeviceKind device,
                               int64_t world) {
  PlanRequest r;
  r.model = model;
  r.device = device;
  r.dtype = spec.model.dtype;
  r.nf4 = spec.model.quantization == Quantization::kNf4;
  r.double_quant = spec.model.double_quant;
  r.full = spec.adapter.type == AdapterType::kFull;
  r.lora_r = spec.adapter.r;
  // all-linear: the model's modules (names the model lacks are refused by CheckJobTakesModel).
  auto targets = ResolveTargetModules(model, spec.adapter.target_modules);
  r.lora_targets = targets.ok() ? *targets : spec.adapter.target_modules;
  r.lora_dropout = spec.adapter.dropout;
  r.seq_len = spec.data.seq_len;
  r.sequences_per_example = spec.data.format == DataFormat::kPreference ? 2 : 1;
  r.activation_checkpointing = spec.train.activation_checkpointing != ActivationCheckpointing::kOff;
  r.offload_activations = spec.train.activation_checkpointing == ActivationCheckpointing::kOffload;
  r.cpu_offload = spec.train.cpu_offload;
  r.paged_optimizer = spec.train.optimizer == OptimizerKind::kPagedAdamW;
  r.exact_gradient_sum = ExactGradientSum(spec);
  r.fsdp = spec.distributed.strategy == DistributedStrategy::kFsdp;
  r.global_batch = spec.train.global_batch_size;
  r.world = world;
  r.cudnn_attention = spec.train.attention == AttentionKind::kCudnn;
  r.packed = spec.data.packing;
  return r;
}

StatusOr<int64_t> ParseBytes(const std::string& text) {
  std::string s;
  for (char ch : text) {
    if (!std::isspace(static_cast<unsigned char>(ch))) s += ch;
  }
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (...) {
    return Status::InvalidArgument("cannot read '" + text + "' as a size (e.g. 24GiB, 512MiB, 8e9)");
  }
  std::string unit = s.substr(pos);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char ch) { return std::tolower(ch); });
  double mult = 1;
  if (unit == "" || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "tb")
    mult = 1e12;
  else
    return Status::InvalidArgument("unknown size unit '" + unit + "' in '" + text +
                                   "' (use KiB, MiB, GiB or GB)");
  if (value < 0) return Status::InvalidArgument("size must be positive: '" + text + "'");
  return static_cast<int64_t>(value * mult);
}

std::string FormatBytes(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= (1 << 30))
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1 << 30));
  else if (b >= (1 << 20))
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1 << 20));
  else
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024);
  return buf;
}

std::string FormatPlan(const PlanRequest& r, const BatchPlanChoice& c) {
  const ModelConfig& m = r.model;
  std::ostringstream o;
  const MemoryBreakdown& b = c.memory;
  o << "model: " << m.model_type << ", " << m.num_layers << " layers, hidden " << m.hidden_size
    << ", intermediate " << m.intermediate_size << ", heads " << m.num_heads << "/" << m.num_kv_heads
    << ", vocab " << m.vocab_size << "\n";
  o << "job: "
    << (r.full ? std::string("full fine-tune")
               : "LoRA r=" + std::to_string(r.lora_r) + " on " + std::to_string(r.lora_targets.size()) +
                     " modules")
    << ", "
    << (r.nf4 ? (r.double_quant ? "NF4 + double quant" : "NF4") : std::string(EnumName(r.dtype)) + " weights")
    << ", compute " << EnumName(r.dtype) << ", seq " << r.seq_len << ", activation checkpointing "
    << (r.offload_activations        ? "offload"
        : r.activation_checkpointing ? "on"
                                     : "off")
    << (r.cpu_offload ? ", cpu_offload" : "") << (r.paged_optimizer ? ", paged_adamw" : "")
    << (r.fsdp && r.world > 1 ? ", FSDP over " + std::to_string(r.world) + " ranks (per rank)" : "")
    << ", device " << DeviceKindName(r.device) << "\n";
  auto row = [&](const char* name, int64_t v) {
    char line[96];
    std::snprintf(line, sizeof(line), "  %-12s %12s\n", name, FormatBytes(v).c_str());
    o << line;
  };
  o << "memory at micro-batch " << b.micro_batch << ":\n";
  row("weights", b.weights);
  row("adapter", b.adapter);
  row("gradients", b.gradients);
  row("optimizer", b.optimizer);
  row("activations", b.activations);
  row("workspace", b.workspace);
  if (b.runtime) row("runtime", b.runtime);
  row("total", b.total());
  if (b.host_total() > 0) {
    o << "host memory (techniques, exact gradient sums):\n";
    row("weights", b.host_weights);
    row("optimizer", b.host_optimizer);
    row("activations", b.host_activations);
    if (b.host_gradient_sum) row("gradient sum", b.host_gradient_sum);
    row("total", b.host_total());
  }
  const int64_t per_value = r.exact_gradient_sum ? kExactSumBytesPerValue : kF32SumBytesPerValue;
  o << "gradient sums: "
    << (r.exact_gradient_sum ? "exact (the same bits at any world size)" : "fp32 (in order)") << ", "
    << b.trainable_values << " values; "
    << (r.world > 1 ? "each step all-reduces " + FormatBytes(b.trainable_values * per_value) + " across " +
                          std::to_string(r.world) +
                          " ranks (fp32: " + FormatBytes(b.trainable_values * kF32SumBytesPerValue) + ")"
                    : std::string("one rank: no all-reduce"))
    << "\n";
  o << "device offers " << FormatBytes(c.device_bytes) << "\n";
  o << "plan: micro-batch " << c.micro_batch << " x accumulation " << c.accumulation << " x world " << c.world
    << " = global batch " << c.micro_batch * c.accumulation * c.world << "\n";
  return o.str();
}

}  // namespace ft
