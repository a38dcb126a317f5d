#include "engine/model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "engine/model/rng.h"
#include "kernels/cpu/ops.h"

namespace ft {

namespace {
constexpr int64_t kLossChunkFloats = int64_t{1} << 22;  // 16 MiB of logits per chunk
// Offloaded activations: device slots for layer inputs. Layer l reads slot
// l % 3 and writes l + 1's; the third holds the input being copied in or out.
constexpr int kOffloadSlots = 3;

std::string LayerPrefix(int l) { return "model.layers." + std::to_string(l) + "."; }

}  // namespace

float LoraSpec::Scale() const {
  return static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(r))
                                   : alpha / static_cast<double>(r));
}

// Saved tensors of one layer's forward (all [rows, ·]). In the activation
// dtype (typed storage): n1, q, k, v, att, h, n2, g, u, act, xa and with q/k
// norms qp and kp (the projections' outputs; q and k are then the normed ones);
// fp32: the norms' rstd (rstdq, rstdk per row and head) and attention's lse.
struct Model::LayerActs {
  DeviceBuffer n1, rstd1, q, k, v, att, lse, h, n2, rstd2, g, u, act;
  DeviceBuffer qp, kp, rstdq, rstdk;  // q/k norms only
  DeviceBuffer o, rstdo, d, rstdd;    // Gemma's sandwich norms: the o and down outputs before their norms
  DeviceBuffer xa[kNumModules];       // LoRA x·Aᵀ (rows, r) per adapted module
};

// Arenas sized for the largest micro-batch seen; reused across steps.
struct Model::Activations {
  int64_t rows = 0, batch = 0;
  // L + 1 of (rows, D), typed; [L] is the last layer's output. Offloading:
  // three device slots (LayerInput), and the L layer inputs in host memory.
  std::vector<DeviceBuffer> layer_in;
  std::vector<DeviceBuffer> host_in;
  std::vector<LayerActs> layers;  // L, or 1 with activation checkpointing
  DeviceBuffer xf, rstdf;         // final norm (xf typed)
  // Backward workspace: fp32, but grad (a layer's output/input gradient) and dh16 (d(h) stored),
  // which are typed (Model::LayerBackward). dpre (Gemma): a sandwich norm's input gradient.
  DeviceBuffer grad, dh, dh16, dn, dxa, drop, logits, dxf, dpre;
  // One block's gradients, in `phase` (Model::AllocBackwardPhase): the MLP's dact (fp32), then
  // SwiGLU's dg and du (typed: over dact once it is stored; fp32: beside it), and the attention's
  // datt, dq, dk, dv, dqp and dkp (q/k norms only: the projections' output gradients; fp32) over
  // them once the MLP block is done.
  DeviceBuffer phase;
  float *dact = nullptr, *datt = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *dqp = nullptr,
        *dkp = nullptr;
  void *dg = nullptr, *du = nullptr;
  // Typed storage: a linear's fp32 result (rows, widest output) and LoRA's x·Aᵀ (rows, r) before
  // they are stored in the activation dtype; in the backward, y32 holds a gradient stored for the
  // next call alone (an op, or a LinearBackward), and xa32 LoRA's dxa rounded.
  DeviceBuffer y32, xa32;
  // Fused projections (Phi-3): qkv_proj's or gate_up_proj's output before its columns are split
  // into q, k, v / gate, up (typed), and the gradient joined from theirs (fp32 for qkv, typed
  // for gate_up).
  DeviceBuffer fused, dfused;
  // DPO's head per sequence (SequenceHead): one double of Σ cross-entropy per batch row.
  DeviceBuffer seq_loss;
  // The micro-batch's integer inputs (int32 [rows] each) and the loss sum (one double).
  DeviceBuffer ids, targets, positions, segments, loss_sum;
  // The loss head on the rows with a target only (HeadForwardBackward): their indices and
  // targets (int32 [rows]), one chunk of their final-norm outputs (typed) and of its gradient.
  DeviceBuffer head_rows, head_targets, head_x, head_dx;
  bool has_segments = false;
};

Model::Model(ModelConfig config, ModelOptions options)
    : config_(std::move(config)),
      options_(options),
      backend_(options_.backend ? options_.backend : *CreateBackend(DeviceKind::kCpu)) {
  const ModelConfig& c = config_;
  FT_CHECK(c.Validate("config").ok());
  const int64_t D = c.hidden_size;
  act_dtype_ = ActivationDType(options_.dtype);
  const int64_t embed_bytes = c.vocab_size * D * ActDTypeBytes(act_dtype_);
  embed_ = backend_->AllocBytes(embed_bytes, MemCategory::kWeights);
  final_norm_ = backend_->Alloc(D, MemCategory::kWeights);
  if (!c.tie_word_embeddings) lm_head_ = backend_->AllocBytes(embed_bytes, MemCategory::kWeights);
  layers_.resize(c.num_layers);
  if (!options_.nf4 && options_.dtype != ComputeDType::kF32) {
    weight_format_ = act_dtype_;
  }
  for (auto& layer : layers_) {
    layer.attn_norm = backend_->Alloc(D, MemCategory::kWeights);
    layer.mlp_norm = backend_->Alloc(D, MemCategory::kWeights);
    if (c.qk_norm) {
      layer.q_norm = backend_->Alloc(c.head_dim, MemCategory::kWeights);
      layer.k_norm = backend_->Alloc(c.head_dim, MemCategory::kWeights);
    }
    if (c.gemma) {
      layer.post_attn_norm = backend_->Alloc(D, MemCategory::kWeights);
      layer.post_mlp_norm = backend_->Alloc(D, MemCategory::kWeights);
    }
    for (int m = 0; m < kNumModules; ++m) {
      Linear& lin = layer.proj[m];
      const ModuleDims dims = ModuleShape(c, static_cast<ModuleKind>(m));
      if (!dims.present()) continue;  // a fused family's empty slot
      lin.in = dims.in;
      lin.out = dims.out;
      // NF4 blobs are allocated when the weight is set (SetLinearWeight).
      const int64_t bytes = lin.in * lin.out * (weight_format_ ? 2 : 4);
      DeviceBuffer* storage = weight_format_ ? &lin.w16 : options_.nf4 ? nullptr : &lin.w;
      if (storage) *storage = AllocFrozen(bytes);
      if (c.attention_bias && m <= static_cast<int>(ModuleKind::kV))
        lin.bias = backend_->Alloc(lin.out, MemCategory::kWeights);
    }
  }
  if (c.gemma) {  // (1 + w) norms: each weight's effective copy, and the ones that add the 1
    std::vector<const DeviceBuffer*> norms = {&final_norm_};
    for (auto& layer : layers_) {
      for (const NormRef& n : LayerNorms(layer)) norms.push_back(n.w);
    }
    for (const DeviceBuffer* w : norms)
      norm_eff_[w->data()] = backend_->Alloc(w->size(), MemCategory::kWeights);
    const std::vector<float> ones(static_cast<size_t>(std::max(D, c.head_dim)), 1.0f);
    ones_ = backend_->Alloc(static_cast<int64_t>(ones.size()), MemCategory::kWeights);
    Upload(ones_.data(), ones.data(), static_cast<int64_t>(ones.size()));
  }
  if (options_.nf4) {  // 16-bit codes need no scratch: their GEMMs read them as they are
    int64_t largest = 0;
    for (const auto& lin : layers_[0].proj) largest = std::max(largest, lin.in * lin.out);
    dequant_ = backend_->AllocBytes(largest * ActDTypeBytes(act_dtype_), MemCategory::kWorkspace);
  }
}

Model::~Model() {
  // A load left unfinished (an error part-way): no copy may still read a slot or write a
  // buffer once they are freed. The status is the loader's to report.
  if (loading()) static_cast<void>(FinishLoading());
}

std::vector<NamedTensor> Model::NamedWeights() {
  const int64_t D = config_.hidden_size, V = config_.vocab_size;
  std::vector<NamedTensor> out;
  const bool codes = EmbedDType() != ActDType::kF32;
  const auto embedding = [&](const char* name, DeviceBuffer& b) {
    return NamedTensor{name, {V, D}, codes ? nullptr : b.data(), nullptr, codes ? &b : nullptr};
  };
  out.push_back(embedding("model.embed_tokens.weight", embed_));
  for (int l = 0; l < config_.num_layers; ++l) {
    DecoderLayer& layer = layers_[l];
    const std::string p = LayerPrefix(l);
    for (const NormRef& n : LayerNorms(layer)) out.push_back({p + n.name, {n.w->size()}, n.w->data()});
    for (int m = 0; m < kNumModules; ++m) {
      Linear& lin = layer.proj[m];
      if (lin.out == 0) continue;  // a fused family's empty slot
      const std::string name = p + ModulePath(config_, static_cast<ModuleKind>(m));
      out.push_back({name + ".weight",
                     {lin.out, lin.in},
                     // An NF4, 16-bit or offloaded linear has no float device buffer, unless
                     // made one since (MergeLora, EnableFullTraining).
                     lin.w.empty() || lin.w.host() ? nullptr : lin.w.data(),
                     lin.w.empty() || lin.w.host() ? &lin : nullptr});
      if (!lin.bias.empty()) out.push_back({name + ".bias", {lin.out}, lin.bias.data()});
    }
  }
  out.push_back({"model.norm.weight", {D}, final_norm_.data()});
  if (!lm_head_.empty()) out.push_back(embedding("lm_head.weight", lm_head_));
  return out;
}

Status Model::EnableLora(const LoraSpec& spec) {
  if (spec.r <= 0)
    return Status::InvalidArgument("adapter.r must be positive, got " + std::to_string(spec.r));
  if (spec.dropout < 0 || spec.dropout >= 1)
    return Status::InvalidArgument("adapter.dropout must be in [0, 1)");
  if (spec.target_modules.empty()) return Status::InvalidArgument("adapter.target_modules is empty");
  FT_ASSIGN_OR_RETURN(const std::vector<std::string> names,
                      ResolveTargetModules(config_, spec.target_modules));
  std::vector<ModuleKind> targets;
  for (const auto& name : names) targets.push_back(*ParseModuleName(config_, name));
  lora_spec_ = spec;
  lora_spec_.target_modules = names;  // all-linear: the model's names (what adapter_config.json lists)
  lora_enabled_ = true;
  for (int l = 0; l < config_.num_layers; ++l) {
    for (ModuleKind m : targets) {
      Linear& lin = layers_[l][m];
      auto lw = std::make_unique<LoraWeights>();
      lw->r = spec.r;
      lw->in = lin.in;
      lw->out = lin.out;
      lw->scale = spec.Scale();
      lw->a = backend_->Alloc(spec.r * lin.in, MemCategory::kAdapter);
      lw->b = backend_->Alloc(lin.out * spec.r, MemCategory::kAdapter);
      lw->da = backend_->Alloc(spec.r * lin.in, MemCategory::kGradients);
      lw->db = backend_->Alloc(lin.out * spec.r, MemCategory::kGradients);
      if (act_dtype_ != ActDType::kF32) {  // B's copy starts as its zeros; A's is made by the Upload below
        const int64_t es = ActDTypeBytes(act_dtype_);
        lw->a16 = backend_->AllocBytes(lw->a.size() * es, MemCategory::kAdapter);
        lw->b16 = backend_->AllocBytes(lw->b.size() * es, MemCategory::kAdapter);
        lora_copies_[lw->a.data()] = A(lw->a16);
        lora_copies_[lw->b.data()] = A(lw->b16);
      }
      // PEFT: kaiming_uniform_(a=sqrt(5)) on A gives U(-1/sqrt(in), 1/sqrt(in)); B = 0.
      const float bound = 1.0f / std::sqrt(static_cast<float>(lin.in));
      const uint64_t module_key = static_cast<uint64_t>(l) * kNumModules + static_cast<uint64_t>(m);
      std::vector<float> a(static_cast<size_t>(lw->a.size()));
      for (int64_t i = 0; i < lw->a.size(); ++i) {
        a[i] = (2 * UniformFloat(HashKeys(spec.seed, 0xA11A, module_key, i)) - 1) * bound;
      }
      Upload(lw->a.data(), a.data(), lw->a.size());
      lin.lora = std::move(lw);
    }
  }
  return Status::OK();
}

Status Model::EnableFullTraining() {
  if (options_.nf4)
    return Status::FailedPrecondition("NF4 base weights cannot be fully fine-tuned; use LoRA");
  if (options_.cpu_offload)
    return Status::FailedPrecondition(
        "cpu_offload keeps frozen weights off the device; a full fine-tune "
        "trains them: use LoRA, or cpu_offload: false");
  if (options_.shard.world > 1)
    return Status::FailedPrecondition(
        "FSDP here shards the frozen base weights; a full fine-tune trains them: use LoRA/QLoRA, or "
        "distributed.strategy: ddp");
  const ActDType embed_dtype = EmbedDType();  // fp32 from here on
  full_training_ = true;
  for (auto& layer : layers_) {
    for (auto& lin : layer.proj) WidenLinear(lin);  // trained weights are fp32 masters
  }
  for (DeviceBuffer* b : {&embed_, &lm_head_}) {
    if (embed_dtype == ActDType::kF32 || b->empty()) continue;
    const int64_t n = b->bytes() / ActDTypeBytes(embed_dtype);
    DeviceBuffer wide = backend_->Alloc(n, MemCategory::kWeights);
    backend_->Convert(ConstAct(b->data(), embed_dtype), n, wide.data());
    *b = std::move(wide);
  }
  dembed_ = backend_->Alloc(embed_.size(), MemCategory::kGradients);
  dfinal_norm_ = backend_->Alloc(final_norm_.size(), MemCategory::kGradients);
  if (!lm_head_.empty()) dlm_head_ = backend_->Alloc(lm_head_.size(), MemCategory::kGradients);
  for (auto& layer : layers_) {
    for (const NormRef& n : LayerNorms(layer))
      *n.grad = backend_->Alloc(n.w->size(), MemCategory::kGradients);
    for (auto& lin : layer.proj) {
      if (lin.out == 0) continue;  // a fused family's empty slot
      lin.dw = backend_->Alloc(lin.w.size(), MemCategory::kGradients);
      if (!lin.bias.empty()) lin.dbias = backend_->Alloc(lin.bias.size(), MemCategory::kGradients);
    }
  }
  return Status::OK();
}

DeviceBuffer Model::AllocFrozen(int64_t bytes) {
  // Sharded models load into host memory too: ShardFrozenWeights keeps 1/world of it on the device.
  return options_.cpu_offload || options_.shard.world > 1
             ? backend_->AllocHost(bytes, MemCategory::kWeights)
             : backend_->AllocBytes(bytes, MemCategory::kWeights);
}

void Model::ReserveNf4Weights() {
  if (!options_.nf4) return;
  for (auto& layer : layers_) {
    for (Linear& lin : layer.proj) {
      if (!lin.nf4.empty() || lin.out == 0) continue;
      lin.nf4_layout = cpu::Nf4BlobLayoutFor(lin.in * lin.out, options_.nf4_config);
      lin.nf4 = AllocFrozen(lin.nf4_layout.bytes);
    }
  }
}

void Model::SetLinearWeight(Linear* lin, const float* values) {
  dequantized_ = kNoneDequantized;  // the values may be new
  const int64_t n = lin->in * lin->out;
  cpu::Nf4Tensor q;
  if (options_.nf4) {
    q = cpu::QuantizeNf4(values, n, options_.nf4_config);
    lin->nf4_layout = cpu::Nf4BlobLayout(q);
    lin->nf4 = AllocFrozen(lin->nf4_layout.bytes);
  }
  DeviceBuffer& dst = FrozenStorage(*lin);
  FT_CHECK(options_.nf4 || weight_format_ || dst.host());  // device float weights are NamedTensor::data
  // Storage in host memory is written in place; device storage through a staging slot.
  uint8_t* out = dst.host() ? dst.as<uint8_t>() : LoadSlot(dst.bytes());
  if (options_.nf4) {
    cpu::PackNf4Blob(q, lin->nf4_layout, out);
  } else if (weight_format_) {
    cpu::NarrowTo16(*weight_format_ == ActDType::kBF16, values, n, reinterpret_cast<uint16_t*>(out));
  } else {
    std::memcpy(out, values, static_cast<size_t>(dst.bytes()));
  }
  if (!dst.host()) CopyLoadSlot(dst.data(), dst.bytes());
}

uint8_t* Model::LoadSlot(int64_t bytes) {
  const int i = load_.next;
  if (load_.busy[i]) {
    // The backend's only host wait: it covers the copy stream, so both slots are free after it.
    static_cast<void>(backend_->Synchronize());  // a failure sticks: FinishLoading returns it
    load_.busy[0] = load_.busy[1] = false;
  }
  if (load_.slot[i].bytes() < bytes) {
    load_.slot[i] = DeviceBuffer();  // the smaller one first: the host holds one of them at a time
    load_.slot[i] = backend_->AllocHost(bytes, MemCategory::kWorkspace);
  }
  return load_.slot[i].as<uint8_t>();
}

void Model::CopyLoadSlot(void* dst, int64_t bytes) {
  const int i = load_.next;
  backend_->CopyToDeviceAsync(dst, load_.slot[i].data(), bytes);
  load_.busy[i] = true;
  load_.next = 1 - i;
}

Status Model::FinishLoading() {
  if (!loading()) return Status::OK();
  backend_->WaitForCopies();                    // ops called from here on read the loaded weights
  const Status done = backend_->Synchronize();  // and the host: no copy reads a slot any more
  load_ = LoadStaging();
  return done;
}

StatusOr<std::vector<float>> Model::LinearValues(const Linear& lin) const {
  FT_CHECK(!loading());  // a load's copies may still be running: FinishLoading first
  if (lin.w16.empty() && !lin.w.host()) {
    return Status::FailedPrecondition("an NF4 linear has no values to save; merge the adapter first");
  }
  const int64_t n = lin.in * lin.out;
  const DeviceBuffer& b = lin.w16.empty() ? lin.w : lin.w16;
  std::vector<float> out(static_cast<size_t>(n));
  std::vector<uint16_t> codes(lin.w16.empty() ? 0 : static_cast<size_t>(n));
  void* host = lin.w16.empty() ? static_cast<void*>(out.data()) : codes.data();  // the bytes as stored
  if (b.host()) {
    std::memcpy(host, b.data(), static_cast<size_t>(b.bytes()));
  } else {
    backend_->CopyToHost(host, b.data(), b.bytes());
  }
  if (!codes.empty()) cpu::WidenFrom16(*weight_format_ == ActDType::kBF16, codes.data(), n, out.data());
  return out;
}

void Model::SetWeight(const NamedTensor& t, const float* values) {
  const int64_t n = t.numel();
  norm_eff_stale_ = true;
  if (t.linear) {
    SetLinearWeight(t.linear, values);
    return;
  }
  // Embeddings or head as 16-bit codes, or an fp32 tensor (a base weight: no LoRA copy to refresh).
  const int64_t bytes = n * (t.codes ? 2 : static_cast<int64_t>(sizeof(float)));
  uint8_t* staged = LoadSlot(bytes);
  if (t.codes) {
    cpu::NarrowTo16(act_dtype_ == ActDType::kBF16, values, n, reinterpret_cast<uint16_t*>(staged));
  } else {
    std::memcpy(staged, values, static_cast<size_t>(bytes));
  }
  CopyLoadSlot(t.codes ? t.codes->data() : static_cast<void*>(t.data), bytes);
}

StatusOr<std::vector<float>> Model::WeightValues(const NamedTensor& t) const {
  FT_CHECK(!loading());  // a load's copies may still be running: FinishLoading first
  const int64_t n = t.numel();
  if (t.linear) return LinearValues(*t.linear);
  if (!t.codes) return Download(t.data, n);
  std::vector<uint16_t> codes(static_cast<size_t>(n));
  backend_->CopyToHost(codes.data(), t.codes->data(), n * 2);
  std::vector<float> out(static_cast<size_t>(n));
  cpu::WidenFrom16(act_dtype_ == ActDType::kBF16, codes.data(), n, out.data());
  return out;
}

DeviceBuffer& Model::FrozenStorage(Linear& lin) {
  if (!lin.nf4.empty()) return lin.nf4;
  return lin.w16.empty() ? lin.w : lin.w16;
}

void Model::BringToDevice(Linear& lin) {
  FT_CHECK(!sharded_);  // a sharded model holds 1/world of it: merge a fresh copy instead
  DeviceBuffer& b = FrozenStorage(lin);
  if (!b.host()) return;
  DeviceBuffer d = backend_->AllocBytes(b.bytes(), MemCategory::kWeights);
  backend_->CopyToDevice(d.data(), b.data(), b.bytes());
  FT_CHECK(backend_->Synchronize().ok());  // before the host copy is freed
  b = std::move(d);
}

void Model::EnsureStages() {
  if (!stage_[0].empty()) return;
  // Every layer's linears have the same shapes, so the same storage sizes.
  int64_t at = 0;
  for (int m = 0; m < kNumModules; ++m) {
    stage_at_[m] = at;
    at += (FrozenStorage(layers_[0].proj[m]).bytes() + 255) / 256 * 256;
  }
  stage_bytes_ = at;
  for (DeviceBuffer& stage : stage_) stage = backend_->AllocBytes(at, MemCategory::kWeights);
}

void Model::StageLayer(int l) {
  if (l < 0 || l >= config_.num_layers || !(sharded_ || FrozenStorage(layers_[l].proj[0]).host())) return;
  const int slot = l % 2;
  if (staged_[slot] == l) return;
  EnsureStages();
  if (sharded_) {
    // Collective: every rank gathers the same layers in the same order.
    const auto start = std::chrono::steady_clock::now();
    const void* mine = shards_[l].data();  // offloaded shards are in host memory already
    if (!shards_[l].host()) {
      backend_->CopyToHost(gather_mine_.data(), shards_[l].data(), shard_bytes_);
      mine = gather_mine_.data();
    }
    options_.shard.all_gather(mine, shard_bytes_, gather_all_.data());
    backend_->CopyToDevice(stage_[slot].data(), gather_all_.data(), stage_bytes_);
    FT_CHECK(backend_->Synchronize().ok());  // gather_all_ is reused by the next gather
    gather_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } else {
    for (int m = 0; m < kNumModules; ++m) {
      if (layers_[l].proj[m].out == 0) continue;  // a fused family's empty slot
      const DeviceBuffer& b = FrozenStorage(layers_[l].proj[m]);
      backend_->CopyToDeviceAsync(stage_[slot].as<char>() + stage_at_[m], b.data(), b.bytes());
    }
  }
  staged_[slot] = l;
}

void Model::ShardFrozenWeights() {
  dequantized_ = kNoneDequantized;
  const int world = options_.shard.world, rank = options_.shard.rank;
  FT_CHECK(world > 1 && !sharded_ && !full_training_ && options_.shard.all_gather);
  EnsureStages();
  shard_bytes_ = ((stage_bytes_ + world - 1) / world + 255) / 256 * 256;
  gather_mine_.resize(static_cast<size_t>(shard_bytes_));
  gather_all_.assign(static_cast<size_t>(shard_bytes_ * world), 0);
  std::vector<char>& image = gather_all_;  // one layer's storage as a stage holds it
  for (DecoderLayer& layer : layers_) {
    std::fill(image.begin(), image.end(), 0);
    for (int m = 0; m < kNumModules; ++m) {
      if (layer.proj[m].out == 0) continue;  // a fused family's empty slot
      DeviceBuffer& b = FrozenStorage(layer.proj[m]);
      FT_CHECK(b.host());  // loaded into host memory (AllocFrozen)
      std::memcpy(image.data() + stage_at_[m], b.data(), static_cast<size_t>(b.bytes()));
      b = DeviceBuffer();  // the whole is freed: this rank keeps its shard
    }
    // With cpu_offload the shard stays in host memory: only the two stages are on the device.
    DeviceBuffer shard = options_.cpu_offload ? backend_->AllocHost(shard_bytes_, MemCategory::kWeights)
                                              : backend_->AllocBytes(shard_bytes_, MemCategory::kWeights);
    if (shard.host()) {
      std::memcpy(shard.data(), image.data() + rank * shard_bytes_, static_cast<size_t>(shard_bytes_));
    } else {
      backend_->CopyToDevice(shard.data(), image.data() + rank * shard_bytes_, shard_bytes_);
      FT_CHECK(backend_->Synchronize().ok());  // `image` is refilled next
    }
    shards_.push_back(std::move(shard));
  }
  sharded_ = true;
  staged_[0] = staged_[1] = -1;
}

void Model::WidenLinear(Linear& lin) {
  BringToDevice(lin);
  if (lin.w16.empty()) return;
  lin.w = backend_->Alloc(lin.in * lin.out, MemCategory::kWeights);
  backend_->Convert(ConstAct(lin.w16.data(), *weight_format_), lin.in * lin.out, lin.w.data());
  lin.w16 = DeviceBuffer();
}

std::vector<float> Model::Download(const float* tensor, int64_t n) const {
  std::vector<float> host(static_cast<size_t>(n));
  backend_->CopyToHost(host.data(), tensor, n * static_cast<int64_t>(sizeof(float)));
  return host;
}

void Model::Upload(float* tensor, const float* host, int64_t n) {
  backend_->CopyToDevice(tensor, host, n * static_cast<int64_t>(sizeof(float)));
  if (auto copy = lora_copies_.find(tensor); copy != lora_copies_.end()) {
    backend_->Convert(ConstAct(tensor), n, copy->second);
  }
  // The caller may free `host` next: wait for the copy (a no-op on the CPU).
  FT_CHECK(backend_->Synchronize().ok());
}

StatusOr<ComputeDType> ParseComputeDType(const std::string& name) { return ParseEnum<ComputeDType>(name); }

void Model::RoundWeightsToComputeDType() {
  for (NamedTensor& t : NamedWeights()) {
    if (t.data != nullptr) Round(t.data, t.numel());
  }
}

ConstAct Model::LinearWeight(int l, ModuleKind m) {
  Linear& lin = layers_[l][m];
  const DeviceBuffer& b = FrozenStorage(lin);
  const void* storage = b.data();
  if (sharded_ || b.host()) {  // offloaded or sharded: this layer's stage (StageLayer, then WaitForCopies)
    FT_CHECK(staged_[l % 2] == l);
    storage = stage_[l % 2].as<char>() + stage_at_[static_cast<int>(m)];
  }
  // Which storage the linear has (a sharded one keeps none of its own: the options say).
  const bool nf4 = sharded_ ? options_.nf4 : !lin.nf4.empty();
  const bool codes16 = sharded_ ? !nf4 && weight_format_.has_value() : !lin.w16.empty();
  if (!nf4 && !codes16) return static_cast<const float*>(storage);
  // Typed storage is in the linears' operand type (weight_format_ is the compute dtype's): the
  // GEMM reads the codes in place.
  if (codes16) return ConstAct(storage, *weight_format_);
  // NF4: dequantized straight to the operand type (LinearOperands takes the activation dtype's),
  // rounded to it on the way (as the fp32 values rounded to the compute dtype were). Unless the
  // scratch holds this weight already: a checkpointed layer's recompute ends with down_proj, the
  // first weight its backward uses.
  const Act out(dequant_.data(), act_dtype_);
  const std::pair<int, int> key{l, static_cast<int>(m)};
  if (dequantized_ != key) backend_->DequantizeNf4(lin.nf4_layout, storage, out);
  dequantized_ = key;
  return out;
}

std::vector<TrainableParam> Model::TrainableParams() {
  std::vector<TrainableParam> out;
  if (full_training_) {
    for (NamedTensor& t : NamedWeights()) {
      TrainableParam p{t.name, t.shape, t.data, nullptr, 1, true};
      for (int64_t d : t.shape) p.numel *= d;
      out.push_back(std::move(p));
    }
    // Attach gradients in the same order as NamedWeights().
    size_t i = 0;
    auto attach = [&](float* grad, bool decay) {
      out[i].grad = grad;
      out[i].weight_decay = decay;
      ++i;
    };
    attach(dembed_.data(), true);
    for (auto& layer : layers_) {
      for (const NormRef& n : LayerNorms(layer)) attach(n.grad->data(), false);
      for (auto& lin : layer.proj) {
        if (lin.out == 0) continue;  // as NamedWeights: a fused family's empty slot
        attach(lin.dw.data(), true);
        if (!lin.bias.empty()) attach(lin.dbias.data(), false);
      }
    }
    attach(dfinal_norm_.data(), false);
    if (!lm_head_.empty()) attach(dlm_head_.data(), true);
    FT_CHECK(i == out.size());
    return out;
  }
  for (int l = 0; l < config_.num_layers; ++l) {
    for (int m = 0; m < kNumModules; ++m) {
      Linear& lin = layers_[l].proj[m];
      if (!lin.lora) continue;
      LoraWeights& lw = *lin.lora;
      const std::string base =
          "base_model.model." + LayerPrefix(l) + ModulePath(config_, static_cast<ModuleKind>(m));
      const auto add = [&](const char* suffix, std::vector<int64_t> shape, DeviceBuffer& w,
                           DeviceBuffer& grad, DeviceBuffer& copy) {
        out.push_back({base + suffix, std::move(shape), w.data(), grad.data(), w.size(), true,
                       copy.empty() ? Act() : A(copy)});
      };
      add(".lora_A.weight", {lw.r, lw.in}, lw.a, lw.da, lw.a16);
      add(".lora_B.weight", {lw.out, lw.r}, lw.b, lw.db, lw.b16);
    }
  }
  return out;
}

void Model::ZeroGrads() {
  for (TrainableParam& p : TrainableParams()) backend_->Zero(p.grad, p.numel);
}

void Model::Round(float* x, int64_t n) const {
  if (options_.dtype == ComputeDType::kBF16) backend_->RoundToBf16(x, n);
  if (options_.dtype == ComputeDType::kF16) backend_->RoundToFp16(x, n);
}

ConstAct Model::HeadWeight() const {
  const DeviceBuffer& w = lm_head_.empty() ? embed_ : lm_head_;
  return ConstAct(w.data(), EmbedDType());
}

ActDType Model::EmbedDType() const { return full_training_ ? ActDType::kF32 : act_dtype_; }

// fp32 operands for an fp32 head: bf16 operands would convert the whole head
// weight for every chunk of rows (measured on an H200, QLoRA 8B shape: 985
// instead of 824 ms a step). A 16-bit head is read as it is stored.
GemmOperands Model::HeadOperands() const {
  return EmbedDType() != ActDType::kF32 ? LinearOperands() : GemmOperands::kF32;
}
float* Model::HeadGrad() {
  if (!full_training_) return nullptr;
  return lm_head_.empty() ? dembed_.data() : dlm_head_.data();
}

void Model::EnsureRope(int64_t max_pos) {
  if (max_pos <= rope_len_) return;
  const int64_t half = config_.rotary_dim() / 2;
  // The tables of every layer, and of the sliding layers when they have a RoPE base of their own.
  for (const bool local : {false, true}) {
    if (local && config_.rope_local_theta <= 0) break;
    const std::vector<double> inv = RopeInverseFrequencies(config_, local);
    std::vector<float> cos_table(static_cast<size_t>(max_pos * half)), sin_table(cos_table.size());
    for (int64_t p = 0; p < max_pos; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) * inv[i];
        cos_table[p * half + i] = static_cast<float>(std::cos(angle));
        sin_table[p * half + i] = static_cast<float>(std::sin(angle));
      }
    }
    DeviceBuffer& cos = local ? rope_local_cos_ : rope_cos_;
    DeviceBuffer& sin = local ? rope_local_sin_ : rope_sin_;
    cos = backend_->Alloc(max_pos * half, MemCategory::kWorkspace);
    sin = backend_->Alloc(max_pos * half, MemCategory::kWorkspace);
    Upload(cos.data(), cos_table.data(), max_pos * half);
    Upload(sin.data(), sin_table.data(), max_pos * half);
  }
  rope_len_ = max_pos;
}

void Model::EnsureActivations(int64_t rows, int64_t batch) {
  if (acts_ && acts_->rows >= rows && acts_->batch >= batch) return;
  const ModelConfig& c = config_;
  const int64_t D = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim(), V = c.vocab_size;
  const int64_t r = lora_enabled_ ? lora_spec_.r : 0;
  const MemCategory act = MemCategory::kActivations, ws = MemCategory::kWorkspace;
  acts_.reset();  // release before allocating the larger arenas
  auto a = std::make_unique<Activations>();
  a->rows = rows;
  a->batch = batch;
  const bool offload = options_.offload_activations;
  for (int64_t l = 0; l < (offload ? kOffloadSlots : c.num_layers + 1); ++l)
    a->layer_in.push_back(AllocAct(rows * D, act));
  for (int64_t l = 0; offload && l < c.num_layers; ++l)
    a->host_in.push_back(backend_->AllocHost(rows * D * ActDTypeBytes(act_dtype_), act));
  a->layers.resize(options_.activation_checkpointing ? 1 : c.num_layers);
  for (int l = 0; l < static_cast<int>(a->layers.size()); ++l) {
    LayerActs& s = a->layers[l];
    s.n1 = AllocAct(rows * D, act);
    s.rstd1 = backend_->Alloc(rows, act);
    s.q = AllocAct(rows * Q, act);
    s.k = AllocAct(rows * KV, act);
    if (c.qk_norm) {
      s.qp = AllocAct(rows * Q, act);
      s.kp = AllocAct(rows * KV, act);
      s.rstdq = backend_->Alloc(rows * c.num_heads, act);
      s.rstdk = backend_->Alloc(rows * c.num_kv_heads, act);
    }
    if (c.gemma) {
      s.o = AllocAct(rows * D, act);
      s.d = AllocAct(rows * D, act);
      s.rstdo = backend_->Alloc(rows, act);
      s.rstdd = backend_->Alloc(rows, act);
    }
    s.v = AllocAct(rows * KV, act);
    s.att = AllocAct(rows * Q, act);
    s.lse = backend_->Alloc(rows * c.num_heads, act);
    s.h = AllocAct(rows * D, act);
    s.n2 = AllocAct(rows * D, act);
    s.rstd2 = backend_->Alloc(rows, act);
    s.g = AllocAct(rows * I, act);
    s.u = AllocAct(rows * I, act);
    s.act = AllocAct(rows * I, act);
    for (int m = 0; m < kNumModules; ++m) {
      if (layers_[l].proj[m].lora) s.xa[m] = AllocAct(rows * r, act);
    }
  }
  a->xf = AllocAct(rows * D, act);
  a->rstdf = backend_->Alloc(rows, act);
  // Gradients stored as PyTorch's bf16 tensors are (typed): grad, dh16, dg, du; the rest fp32.
  a->grad = AllocAct(rows * D, ws);
  a->dh = backend_->Alloc(rows * D, ws);
  if (act_dtype_ != ActDType::kF32) a->dh16 = AllocAct(rows * D, ws);
  a->dn = backend_->Alloc(rows * D, ws);
  if (c.gemma) a->dpre = backend_->Alloc(rows * D, ws);
  AllocBackwardPhase(a.get(), rows);
  a->dxf = backend_->Alloc(rows * D, ws);
  if (r > 0) {
    a->dxa = backend_->Alloc(rows * r, ws);
    if (lora_spec_.dropout > 0) a->drop = backend_->Alloc(rows * std::max({D, I, Q}), ws);
  }
  int64_t widest_out = std::max({D, I, Q});  // a linear's output (a fused one's: q + 2 kv, 2 I)
  for (int m = 0; m < kNumModules; ++m) widest_out = std::max(widest_out, layers_[0].proj[m].out);
  if (act_dtype_ != ActDType::kF32) {
    a->y32 = backend_->Alloc(rows * widest_out, ws);
    if (r > 0) a->xa32 = backend_->Alloc(rows * r, ws);
  }
  if (c.fused_projections) {
    a->fused = AllocAct(rows * widest_out, ws);
    a->dfused = backend_->Alloc(rows * widest_out, ws);
  }
  const int64_t chunk =
      options_.loss_chunk_rows > 0 ? options_.loss_chunk_rows : std::max<int64_t>(1, kLossChunkFloats / V);
  a->logits = backend_->Alloc(std::min(rows, chunk) * V, ws);
  a->head_x = AllocAct(std::min(rows, chunk) * D, ws);
  a->head_dx = backend_->Alloc(std::min(rows, chunk) * D, ws);
  for (DeviceBuffer* b :
       {&a->ids, &a->targets, &a->positions, &a->segments, &a->head_rows, &a->head_targets}) {
    *b = backend_->AllocBytes(rows * static_cast<int64_t>(sizeof(int32_t)), ws);
  }
  a->loss_sum = backend_->AllocBytes(sizeof(double), ws);
  acts_ = std::move(a);
}

void Model::AllocBackwardPhase(Activations* a, int64_t rows) {
  const ModelConfig& c = config_;
  const int64_t I = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
  const int64_t es = ActDTypeBytes(act_dtype_);
  // Blocks start 256 bytes apart at least, as separate allocations would (vectorised kernels, GEMMs).
  const auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  // The MLP's dact, dg, du (typed: dg and du over dact, which is stored before they are written)
  // and the attention's datt, dq, dk, dv (dqp, dkp), in bytes; the phase holds the larger.
  const int64_t dact = aligned(rows * I * 4), d16 = aligned(rows * I * es);
  const int64_t mlp = act_dtype_ == ActDType::kF32 ? 3 * dact : std::max(dact, 2 * d16);
  std::vector<std::pair<float**, int64_t>> attention_blocks = {
      {&a->datt, Q}, {&a->dq, Q}, {&a->dk, KV}, {&a->dv, KV}};
  if (c.qk_norm) attention_blocks.insert(attention_blocks.end(), {{&a->dqp, Q}, {&a->dkp, KV}});
  int64_t attention = 0;
  for (const auto& block : attention_blocks) attention += aligned(rows * block.second * 4);
  a->phase = backend_->AllocBytes(std::max(mlp, attention), MemCategory::kWorkspace);
  char* base = a->phase.as<char>();
  a->dact = reinterpret_cast<float*>(base);
  a->dg = base + (act_dtype_ == ActDType::kF32 ? dact : 0);
  a->du = base + (act_dtype_ == ActDType::kF32 ? 2 * dact : d16);
  int64_t at = 0;
  for (const auto& [block, cols] : attention_blocks) {
    *block = reinterpret_cast<float*>(base + at);
    at += aligned(rows * cols * 4);
  }
}

void Model::UploadBatch(const MicroBatch& mb) {
  Activations& a = *acts_;
  const int64_t bytes = mb.rows() * static_cast<int64_t>(sizeof(int32_t));
  FT_CHECK(static_cast<int64_t>(mb.ids.size()) == mb.rows() && mb.targets.size() == mb.ids.size() &&
           mb.positions.size() == mb.ids.size());
  backend_->CopyToDevice(a.ids.data(), mb.ids.data(), bytes);
  backend_->CopyToDevice(a.targets.data(), mb.targets.data(), bytes);
  backend_->CopyToDevice(a.positions.data(), mb.positions.data(), bytes);
  a.has_segments = !mb.segments.empty();
  if (a.has_segments) {
    FT_CHECK(mb.segments.size() == mb.ids.size());
    backend_->CopyToDevice(a.segments.data(), mb.segments.data(), bytes);
  }
}

void Model::EmbedForward(const MicroBatch& mb, Act x) {
  const int64_t n = mb.rows() * config_.hidden_size;
  backend_->EmbeddingForward(ConstAct(embed_.data(), EmbedDType()), acts_->ids.as<int32_t>(), mb.rows(),
                             config_.hidden_size, x);
  if (!config_.gemma) return;
  // HF's Gemma3TextScaledWordEmbedding: rows × the scale in the weights' dtype, rounded once.
  if (x.dtype == ActDType::kF32) return backend_->Scale(n, EmbedScale(), x.as<float>());
  float* x32 = acts_->y32.data();
  backend_->Convert(x, n, Act(x32, ActDType::kF32));
  backend_->Scale(n, EmbedScale(), x32);
  backend_->Convert(ConstAct(x32), n, x);
}

float Model::EmbedScale() const {
  if (!config_.gemma) return 1.0f;
  const float s = static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size)));
  switch (EmbedDType()) {
    case ActDType::kBF16: return cpu::Load(cpu::Bf16{cpu::FloatToBf16(s)});
    case ActDType::kF16: return cpu::Load(cpu::Half{cpu::FloatToHalf(s)});
    case ActDType::kF32: break;
  }
  return s;
}

std::vector<Model::NormRef> Model::LayerNorms(DecoderLayer& layer) {
  // Gemma's post_attention_layernorm is on the attention's output; Llama's is the MLP's input norm.
  std::vector<NormRef> out = {{"input_layernorm.weight", &layer.attn_norm, &layer.dattn_norm}};
  if (config_.gemma) {
    out.push_back({"post_attention_layernorm.weight", &layer.post_attn_norm, &layer.dpost_attn_norm});
    out.push_back({"pre_feedforward_layernorm.weight", &layer.mlp_norm, &layer.dmlp_norm});
    out.push_back({"post_feedforward_layernorm.weight", &layer.post_mlp_norm, &layer.dpost_mlp_norm});
  } else {
    out.push_back({"post_attention_layernorm.weight", &layer.mlp_norm, &layer.dmlp_norm});
  }
  if (config_.qk_norm) {
    out.push_back({"self_attn.q_norm.weight", &layer.q_norm, &layer.dq_norm});
    out.push_back({"self_attn.k_norm.weight", &layer.k_norm, &layer.dk_norm});
  }
  return out;
}

const float* Model::NormWeight(const DeviceBuffer& w) const {
  if (norm_eff_.empty()) return w.data();
  return norm_eff_.at(w.data()).data();
}

void Model::RefreshNormWeights() {
  if (!norm_eff_stale_ && !full_training_) return;
  norm_eff_stale_ = false;
  for (auto& [w, eff] : norm_eff_) {
    backend_->Copy(eff.data(), w, eff.bytes());
    backend_->Axpy(eff.size(), 1.0f, ConstAct(ones_.data()), eff.data());
  }
}

void Model::AddResidual(ConstAct a, ConstAct b, int64_t n, Act out) {
  float* sum = out.dtype == ActDType::kF32 ? out.as<float>() : acts_->y32.data();
  if (a.data != sum) backend_->Convert(a, n, Act(sum, ActDType::kF32));
  backend_->Axpy(n, 1.0f, b, sum);
  if (out.dtype != ActDType::kF32) backend_->Convert(ConstAct(sum), n, out);
}

std::pair<const float*, const float*> Model::RopeTables(int l) const {
  if (config_.SlidingLayer(l) && !rope_local_cos_.empty())
    return {rope_local_cos_.data(), rope_local_sin_.data()};
  return {rope_cos_.data(), rope_sin_.data()};
}

cpu::AttentionShape Model::AttentionShapeOf(const MicroBatch& mb, int l) const {
  const ModelConfig& c = config_;
  const double scale_dim =
      c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<double>(c.head_dim);
  cpu::AttentionShape s{mb.batch,       mb.seq,     c.num_heads,
                        c.num_kv_heads, c.head_dim, 1.0 / std::sqrt(scale_dim)};
  s.window = c.LayerWindow(l);
  s.softcap = c.attn_softcap;
  return s;
}

ActDType ActivationDType(ComputeDType dtype) {
  static constexpr ActDType kByCompute[] = {ActDType::kF32, ActDType::kBF16,
                                            ActDType::kF16};  // ComputeDType's order
  return kByCompute[static_cast<int>(dtype)];
}

DeviceBuffer Model::AllocAct(int64_t n, MemCategory category) {
  return backend_->AllocBytes(n * ActDTypeBytes(act_dtype_), category);
}

DropoutKey Model::DropoutKeyFor(int l, ModuleKind m) const {
  const MicroBatch& mb = *current_batch_;
  return DropoutKey{lora_spec_.dropout, lora_spec_.seed, mb.first_sequence, mb.seq,
                    static_cast<uint64_t>(l) * kNumModules + static_cast<uint64_t>(m)};
}

ConstAct Model::DropoutInput(int l, ModuleKind m, ConstAct x, int64_t rows, int64_t in, float* buf) {
  if (lora_spec_.dropout <= 0 || eval_mode_) return x;
  backend_->Dropout(DropoutKeyFor(l, m), x, rows, in, buf);
  return buf;
}

// Under bf16, the decoder's linears (base, LoRA and their gradients) and
// attention take bf16 operands, as torch.autocast does; the loss head and
// merges stay fp32.
GemmOperands Model::LinearOperands() const {
  switch (options_.dtype) {
    case ComputeDType::kBF16: return GemmOperands::kBF16;
    case ComputeDType::kF16: return GemmOperands::kF16;
    case ComputeDType::kF32: break;
  }
  return GemmOperands::kF32;
}

// Typed storage: the products accumulate in fp32 (y32, xa32) and are
// stored in the activation dtype once, rounded, as a bf16 matmul's output is:
// LoRA's product, the rounding and the residual in one backend op (LinearOutput).
void Model::LinearForward(int l, ModuleKind m, ConstAct x, int64_t rows, Act y, Act xa,
                          const ConstAct* residual) {
  Linear& lin = layers_[l][m];
  const bool typed = act_dtype_ != ActDType::kF32;
  float* y32 = typed ? acts_->y32.data() : y.as<float>();
  backend_->Gemm(LinearOperands(), false, true, rows, lin.out, lin.in, 1.0f, x, lin.in, LinearWeight(l, m),
                 lin.in, 0.0f, y32, lin.out);
  if (!lin.bias.empty()) backend_->AddBias(y32, lin.bias.data(), rows, lin.out);
  LoraWeights* lw = lin.lora && !adapter_off_ ? lin.lora.get() : nullptr;
  if (lw != nullptr) {
    const ConstAct xd = DropoutInput(l, m, x, rows, lin.in, acts_->drop.data());
    float* xa32 = typed ? acts_->xa32.data() : xa.as<float>();
    backend_->Gemm(LinearOperands(), false, true, rows, lw->r, lw->in, 1.0f, xd, lw->in,
                   LoraOperand(lw->a, lw->a16), lw->in, 0.0f, xa32, lw->r);
    if (typed) backend_->Convert(ConstAct(xa32), rows * lw->r, xa);
  }
  if (typed) {
    const ConstAct none(static_cast<const float*>(nullptr));
    backend_->LinearOutput(rows, lin.out, lw != nullptr ? lw->r : 0, lw != nullptr ? lw->scale : 0.0f,
                           lw != nullptr ? ConstAct(xa) : none,
                           lw != nullptr ? LoraOperand(lw->b, lw->b16) : none, y32, residual, y);
    return;
  }
  if (lw != nullptr) {
    backend_->Gemm(LinearOperands(), false, true, rows, lw->out, lw->r, lw->scale, xa, lw->r, lw->b.data(),
                   lw->r, 1.0f, y32, lw->out);
  }
  if (residual) backend_->Axpy(rows * lin.out, 1.0f, *residual, y32);  // fp32: nothing to round
}

void Model::ColumnBlocks(void* whole, int64_t es, int64_t rows,
                         std::initializer_list<std::pair<void*, int64_t>> blocks, bool split) {
  int64_t width = 0;
  for (const auto& block : blocks) width += block.second;
  char* at = static_cast<char*>(whole);
  for (const auto& [block, cols] : blocks) {
    if (split) {
      backend_->Copy2D(block, cols * es, at, width * es, cols * es, rows);
    } else {
      backend_->Copy2D(at, width * es, block, cols * es, cols * es, rows);
    }
    at += cols * es;
  }
}

ConstAct Model::LoraOperand(const DeviceBuffer& master, const DeviceBuffer& copy) const {
  return copy.empty() ? ConstAct(master.data()) : ConstAct(copy.data(), act_dtype_);
}

ConstAct Model::Rounded(const float* x, int64_t n, DeviceBuffer& buf) {
  if (act_dtype_ == ActDType::kF32) return ConstAct(x);
  const Act out(buf.data(), act_dtype_);
  backend_->Convert(ConstAct(x), n, out);
  return out;
}

// Under bf16/fp16 dy comes stored in the activation dtype, where PyTorch's gradient is a bf16
// tensor: the GEMMs and the bias gradient read it as it is. LoRA's dxa, an fp32 GEMM result, is
// rounded once into a 16-bit copy (in the forward's xa32, which the backward does not use) for its
// two GEMMs.
void Model::LinearBackward(int l, ModuleKind m, ConstAct x, ConstAct xa, ConstAct dy, int64_t rows, float* dx,
                           bool accumulate_dx) {
  Linear& lin = layers_[l][m];
  FT_CHECK(dy.dtype == act_dtype_);
  backend_->Gemm(LinearOperands(), false, false, rows, lin.in, lin.out, 1.0f, dy, lin.out, LinearWeight(l, m),
                 lin.in, accumulate_dx ? 1.0f : 0.0f, dx, lin.in);
  if (full_training_) {
    backend_->Gemm(LinearOperands(), true, false, lin.out, lin.in, rows, 1.0f, dy, lin.out, x, lin.in, 1.0f,
                   lin.dw.data(), lin.in);
    if (!lin.bias.empty()) backend_->BiasGrad(dy, rows, lin.out, lin.dbias.data());
  }
  if (!lin.lora || adapter_off_) return;
  LoraWeights& lw = *lin.lora;
  float* dxa32 = acts_->dxa.data();
  backend_->Gemm(LinearOperands(), false, false, rows, lw.r, lw.out, 1.0f, dy, lw.out,
                 LoraOperand(lw.b, lw.b16), lw.r, 0.0f, dxa32, lw.r);
  const ConstAct dxa = Rounded(dxa32, rows * lw.r, acts_->xa32);
  backend_->Gemm(LinearOperands(), true, false, lw.out, lw.r, rows, lw.scale, dy, lw.out, xa, lw.r, 1.0f,
                 lw.db.data(), lw.r);
  const ConstAct xd = DropoutInput(l, m, x, rows, lw.in, acts_->drop.data());
  backend_->Gemm(LinearOperands(), true, false, lw.r, lw.in, rows, lw.scale, dxa, lw.r, xd, lw.in, 1.0f,
                 lw.da.data(), lw.in);
  if (lora_spec_.dropout <= 0) {
    backend_->Gemm(LinearOperands(), false, false, rows, lw.in, lw.r, lw.scale, dxa, lw.r,
                   LoraOperand(lw.a, lw.a16), lw.in, 1.0f, dx, lw.in);
    return;
  }
  // Through the dropout: d(drop(x))/dx is the same keep mask and scale.
  float* tmp = acts_->drop.data();
  backend_->Gemm(LinearOperands(), false, false, rows, lw.in, lw.r, lw.scale, dxa, lw.r,
                 LoraOperand(lw.a, lw.a16), lw.in, 0.0f, tmp, lw.in);
  backend_->DropoutBackwardAdd(DropoutKeyFor(l, m), tmp, rows, lw.in, dx);
}

void Model::LayerForward(int l, const MicroBatch& mb, ConstAct x_in, LayerActs& a, Act x_out) {
  const ModelConfig& c = config_;
  DecoderLayer& layer = layers_[l];
  const int64_t rows = mb.rows(), D = c.hidden_size, I = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto xa = [&](ModuleKind m) { return A(a.xa[static_cast<int>(m)]); };
  const auto [rope_cos, rope_sin] = RopeTables(l);

  // Typed tensors are stored rounded by the ops that write them.
  backend_->RmsNormForward(x_in, NormWeight(layer.attn_norm), rows, D, eps, A(a.n1), a.rstd1.data());
  // With q/k norms the projections write qp and kp, normed per head into q and k.
  const Act q_out = A(c.qk_norm ? a.qp : a.q), k_out = A(c.qk_norm ? a.kp : a.k);
  if (c.fused_projections) {  // one qkv_proj, its columns split into q, k and v
    LinearForward(l, ModuleKind::kQ, A(a.n1), rows, A(acts_->fused), xa(ModuleKind::kQ));
    ColumnBlocks(acts_->fused.data(), ActDTypeBytes(act_dtype_), rows,
                 {{q_out.data, c.q_dim()}, {k_out.data, c.kv_dim()}, {a.v.data(), c.kv_dim()}}, true);
  } else {
    LinearForward(l, ModuleKind::kQ, A(a.n1), rows, q_out, xa(ModuleKind::kQ));
    LinearForward(l, ModuleKind::kK, A(a.n1), rows, k_out, xa(ModuleKind::kK));
    LinearForward(l, ModuleKind::kV, A(a.n1), rows, A(a.v), xa(ModuleKind::kV));
  }
  if (c.qk_norm) {
    backend_->RmsNormForward(A(a.qp), NormWeight(layer.q_norm), rows * c.num_heads, c.head_dim, eps, A(a.q),
                             a.rstdq.data());
    backend_->RmsNormForward(A(a.kp), NormWeight(layer.k_norm), rows * c.num_kv_heads, c.head_dim, eps,
                             A(a.k), a.rstdk.data());
  }
  backend_->RopeApply(A(a.q), rows, c.num_heads, c.head_dim, c.rotary_dim(), acts_->positions.as<int32_t>(),
                      rope_cos, rope_sin, false);
  backend_->RopeApply(A(a.k), rows, c.num_kv_heads, c.head_dim, c.rotary_dim(),
                      acts_->positions.as<int32_t>(), rope_cos, rope_sin, false);
  cpu::AttentionShape shape = AttentionShapeOf(mb, l);
  const int32_t* seg = acts_->has_segments ? acts_->segments.as<int32_t>() : nullptr;
  ConstAct keys = A(a.k), values = A(a.v);
  if (decode_cache_) {  // this sequence's new keys and values go after the cached ones
    KvCache& kv = *decode_cache_;
    const int64_t at = kv.length_ * c.kv_dim(), bytes = rows * c.kv_dim() * ActDTypeBytes(act_dtype_);
    backend_->Copy(A(kv.k_[l]).At(at).data, a.k.data(), bytes);
    backend_->Copy(A(kv.v_[l]).At(at).data, a.v.data(), bytes);
    keys = A(kv.k_[l]);
    values = A(kv.v_[l]);
    shape.kv_seq = kv.length_ + rows;
  }
  backend_->AttentionForward(LinearOperands(), shape, A(a.q), keys, values, seg, A(a.att), a.lse.data(),
                             options_.naive_attention);
  if (c.gemma) {  // sandwich: h = x + norm(o(att)); the normed output passes through n2's buffer
    LinearForward(l, ModuleKind::kO, A(a.att), rows, A(a.o), xa(ModuleKind::kO));
    backend_->RmsNormForward(A(a.o), NormWeight(layer.post_attn_norm), rows, D, eps, A(a.n2), a.rstdo.data());
    AddResidual(A(a.n2), x_in, rows * D, A(a.h));
  } else {
    LinearForward(l, ModuleKind::kO, A(a.att), rows, A(a.h), xa(ModuleKind::kO), &x_in);
  }

  backend_->RmsNormForward(A(a.h), NormWeight(layer.mlp_norm), rows, D, eps, A(a.n2), a.rstd2.data());
  if (c.fused_projections) {  // one gate_up_proj: gate, then up
    LinearForward(l, ModuleKind::kGate, A(a.n2), rows, A(acts_->fused), xa(ModuleKind::kGate));
    ColumnBlocks(acts_->fused.data(), ActDTypeBytes(act_dtype_), rows, {{a.g.data(), I}, {a.u.data(), I}},
                 true);
  } else {
    LinearForward(l, ModuleKind::kGate, A(a.n2), rows, A(a.g), xa(ModuleKind::kGate));
    LinearForward(l, ModuleKind::kUp, A(a.n2), rows, A(a.u), xa(ModuleKind::kUp));
  }
  backend_->GluForward(c.hidden_act, A(a.g), A(a.u), rows * I, A(a.act));
  const ConstAct h = A(a.h);
  if (c.gemma) {  // sandwich: out = h + norm(down(act)); the normed output passes through x_out
    LinearForward(l, ModuleKind::kDown, A(a.act), rows, A(a.d), xa(ModuleKind::kDown));
    backend_->RmsNormForward(A(a.d), NormWeight(layer.post_mlp_norm), rows, D, eps, x_out, a.rstdd.data());
    AddResidual(x_out, h, rows * D, x_out);
  } else {
    LinearForward(l, ModuleKind::kDown, A(a.act), rows, x_out, xa(ModuleKind::kDown), &h);
  }
}

// The gradients PyTorch keeps as bf16 tensors are stored in the activation dtype (Rounded: one
// conversion each, into y32 when only the next op reads it); what GEMMs accumulate into and the
// residual sums are fp32 workspaces. Under fp32 every Rounded is the workspace itself.
ConstAct Model::ThroughPostNorm(ConstAct pre, DeviceBuffer& norm, DeviceBuffer& dnorm,
                                const DeviceBuffer& rstd, ConstAct dy, int64_t rows) {
  Activations& w = *acts_;
  const int64_t D = config_.hidden_size;
  backend_->RmsNormBackward(pre, NormWeight(norm), rstd.data(), dy, rows, D, w.dpre.data(),
                            full_training_ ? dnorm.data() : nullptr);
  return Rounded(w.dpre.data(), rows * D, w.y32);
}

void Model::LayerBackward(int l, const MicroBatch& mb, ConstAct x_in, LayerActs& a, Act g) {
  const int64_t rows = mb.rows();
  const ConstAct dh = MlpBackward(l, a, g, rows);
  AttentionBlockBackward(l, mb, x_in, a, dh, rows, g);
}

// MLP block: out = h + down(act(gate(n2)) * up(n2)), n2 = norm(h) (Gemma: out = h + norm(down(..))).
// g holds d(out); returns d(h).
ConstAct Model::MlpBackward(int l, LayerActs& a, ConstAct g, int64_t rows) {
  const ModelConfig& c = config_;
  DecoderLayer& layer = layers_[l];
  Activations& w = *acts_;
  const int64_t D = c.hidden_size, I = c.intermediate_size;
  auto xa = [&](ModuleKind m) { return A(a.xa[static_cast<int>(m)]); };
  const ConstAct ddown =
      c.gemma ? ThroughPostNorm(A(a.d), layer.post_mlp_norm, layer.dpost_mlp_norm, a.rstdd, g, rows) : g;
  LinearBackward(l, ModuleKind::kDown, A(a.act), xa(ModuleKind::kDown), ddown, rows, w.dact, false);
  const ConstAct dact = Rounded(w.dact, rows * I, w.y32);
  backend_->GluBackward(c.hidden_act, A(a.g), A(a.u), dact, rows * I, Act(w.dg, act_dtype_),
                        Act(w.du, act_dtype_));
  if (c.fused_projections) {
    ColumnBlocks(w.dfused.data(), ActDTypeBytes(act_dtype_), rows, {{w.dg, I}, {w.du, I}}, false);
    LinearBackward(l, ModuleKind::kGate, A(a.n2), xa(ModuleKind::kGate), A(w.dfused), rows, w.dn.data(),
                   false);
  } else {
    LinearBackward(l, ModuleKind::kGate, A(a.n2), xa(ModuleKind::kGate), Act(w.dg, act_dtype_), rows,
                   w.dn.data(), false);
    LinearBackward(l, ModuleKind::kUp, A(a.n2), xa(ModuleKind::kUp), Act(w.du, act_dtype_), rows, w.dn.data(),
                   true);
  }
  const ConstAct dn = Rounded(w.dn.data(), rows * D, w.y32);
  backend_->RmsNormBackward(A(a.h), NormWeight(layer.mlp_norm), a.rstd2.data(), dn, rows, D, w.dh.data(),
                            full_training_ ? layer.dmlp_norm.data() : nullptr);
  backend_->Axpy(rows * D, 1.0f, g, w.dh.data());
  return Rounded(w.dh.data(), rows * D, w.dh16);
}

// Attention block: h = x + o(attn(rope(q(n1)), rope(k(n1)), v(n1))), n1 = norm(x) (Gemma: the
// output normed before the residual). dh holds d(h); d(x) is stored into g.
void Model::AttentionBlockBackward(int l, const MicroBatch& mb, ConstAct x_in, LayerActs& a, ConstAct dh,
                                   int64_t rows, Act g) {
  const ModelConfig& c = config_;
  DecoderLayer& layer = layers_[l];
  Activations& w = *acts_;
  const int64_t D = c.hidden_size;
  auto xa = [&](ModuleKind m) { return A(a.xa[static_cast<int>(m)]); };
  const auto [rope_cos, rope_sin] = RopeTables(l);
  const ConstAct dout =
      c.gemma ? ThroughPostNorm(A(a.o), layer.post_attn_norm, layer.dpost_attn_norm, a.rstdo, dh, rows) : dh;
  LinearBackward(l, ModuleKind::kO, A(a.att), xa(ModuleKind::kO), dout, rows, w.datt, false);
  Round(w.datt, rows * c.q_dim());  // the attention backward reads fp32 gradients
  const cpu::AttentionShape shape = AttentionShapeOf(mb, l);
  const int32_t* seg = acts_->has_segments ? acts_->segments.as<int32_t>() : nullptr;
  backend_->AttentionBackward(LinearOperands(), shape, A(a.q), A(a.k), A(a.v), seg, A(a.att), a.lse.data(),
                              w.datt, w.dq, w.dk, w.dv);
  backend_->RopeApply(w.dq, rows, c.num_heads, c.head_dim, c.rotary_dim(), acts_->positions.as<int32_t>(),
                      rope_cos, rope_sin, true);
  backend_->RopeApply(w.dk, rows, c.num_kv_heads, c.head_dim, c.rotary_dim(), acts_->positions.as<int32_t>(),
                      rope_cos, rope_sin, true);
  float* dq = w.dq;  // the gradient of the q projection's output
  float* dk = w.dk;
  if (c.qk_norm) {  // back through the per-head norms (their weights' gradients under full training)
    backend_->RmsNormBackward(A(a.qp), NormWeight(layer.q_norm), a.rstdq.data(),
                              Rounded(dq, rows * c.q_dim(), w.y32), rows * c.num_heads, c.head_dim, w.dqp,
                              full_training_ ? layer.dq_norm.data() : nullptr);
    backend_->RmsNormBackward(A(a.kp), NormWeight(layer.k_norm), a.rstdk.data(),
                              Rounded(dk, rows * c.kv_dim(), w.y32), rows * c.num_kv_heads, c.head_dim, w.dkp,
                              full_training_ ? layer.dk_norm.data() : nullptr);
    dq = w.dqp;
    dk = w.dkp;
  }
  if (c.fused_projections) {
    ColumnBlocks(w.dfused.data(), sizeof(float), rows,
                 {{dq, c.q_dim()}, {dk, c.kv_dim()}, {w.dv, c.kv_dim()}}, false);
    LinearBackward(l, ModuleKind::kQ, A(a.n1), xa(ModuleKind::kQ),
                   Rounded(w.dfused.data(), rows * (c.q_dim() + 2 * c.kv_dim()), w.y32), rows, w.dn.data(),
                   false);
  } else {
    LinearBackward(l, ModuleKind::kQ, A(a.n1), xa(ModuleKind::kQ), Rounded(dq, rows * c.q_dim(), w.y32), rows,
                   w.dn.data(), false);
    LinearBackward(l, ModuleKind::kK, A(a.n1), xa(ModuleKind::kK), Rounded(dk, rows * c.kv_dim(), w.y32),
                   rows, w.dn.data(), true);
    LinearBackward(l, ModuleKind::kV, A(a.n1), xa(ModuleKind::kV), Rounded(w.dv, rows * c.kv_dim(), w.y32),
                   rows, w.dn.data(), true);
  }
  // d(x) = norm's backward + d(h), summed in fp32 (in dn's workspace once dn is stored) and stored.
  const ConstAct dn = Rounded(w.dn.data(), rows * D, w.y32);
  float* dx = act_dtype_ == ActDType::kF32 ? g.as<float>() : w.dn.data();
  backend_->RmsNormBackward(x_in, NormWeight(layer.attn_norm), a.rstd1.data(), dn, rows, D, dx,
                            full_training_ ? layer.dattn_norm.data() : nullptr);
  backend_->Axpy(rows * D, 1.0f, dh, dx);
  if (act_dtype_ != ActDType::kF32) backend_->Convert(ConstAct(dx), rows * D, g);
}

LossResult Model::HeadForwardBackward(const MicroBatch& mb, ConstAct x_last, float grad_scale, bool backward,
                                      std::vector<float>* logits) {
  const ModelConfig& c = config_;
  Activations& w = *acts_;
  const int64_t rows = mb.rows(), D = c.hidden_size, V = c.vocab_size;
  backend_->RmsNormForward(x_last, NormWeight(final_norm_), rows, D, static_cast<float>(c.rms_norm_eps),
                           A(w.xf), w.rstdf.data());
  if (logits) logits->assign(static_cast<size_t>(rows * V), 0.0f);
  LossResult result;
  // Rows without a target (a chat SFT batch's prompt tokens) add nothing to the loss or any
  // gradient: unless the caller wants every row's logits, the head runs on the rows with a
  // target alone, gathered a chunk at a time, and their gradients are scattered back into dxf
  // (zero elsewhere). With a target on every row, the rows are used in place.
  const std::vector<int32_t> picked = TargetRows(mb, 0, rows);
  result.tokens = static_cast<int64_t>(picked.size());
  const bool gather = logits == nullptr && result.tokens < rows;
  if (gather) {
    UploadHeadRows(mb, picked);
    if (backward) backend_->Zero(w.dxf.data(), rows * D);
  }
  backend_->Zero(w.loss_sum.data(), 2);  // one double
  HeadChunks(0, gather ? result.tokens : rows, gather, grad_scale, backward, logits, w.loss_sum.as<double>());
  if (backward) FinalNormBackward(x_last, rows);
  backend_->CopyToHost(&result.loss_sum, w.loss_sum.as<double>(), sizeof(double));
  return result;
}

std::vector<int32_t> Model::TargetRows(const MicroBatch& mb, int64_t begin, int64_t end) const {
  std::vector<int32_t> picked;
  for (int64_t i = begin; i < end; ++i) {
    if (mb.targets[i] >= 0) picked.push_back(static_cast<int32_t>(i));
  }
  return picked;
}

void Model::UploadHeadRows(const MicroBatch& mb, const std::vector<int32_t>& picked) {
  // Kept in members: a backend may still read the host arrays after CopyToDevice returns.
  head_rows_host_ = picked;
  head_targets_host_.clear();
  for (int32_t i : picked) head_targets_host_.push_back(mb.targets[i]);
  const int64_t bytes = static_cast<int64_t>(picked.size() * sizeof(int32_t));
  if (bytes == 0) return;
  backend_->CopyToDevice(acts_->head_rows.data(), head_rows_host_.data(), bytes);
  backend_->CopyToDevice(acts_->head_targets.data(), head_targets_host_.data(), bytes);
}

// grad (the last layer's output gradient) from dxf: both stored as PyTorch's bf16 tensors are.
void Model::FinalNormBackward(ConstAct x_last, int64_t rows) {
  Activations& w = *acts_;
  const int64_t D = config_.hidden_size;
  const bool typed = act_dtype_ != ActDType::kF32;
  float* dx = typed ? w.dn.data() : w.grad.data();
  backend_->RmsNormBackward(x_last, NormWeight(final_norm_), w.rstdf.data(),
                            Rounded(w.dxf.data(), rows * D, w.y32), rows, D, dx,
                            full_training_ ? dfinal_norm_.data() : nullptr);
  if (typed) backend_->Convert(ConstAct(dx), rows * D, A(w.grad));
}

void Model::HeadChunks(int64_t first, int64_t count, bool gather, float grad_scale, bool backward,
                       std::vector<float>* logits, double* loss_sum) {
  const ModelConfig& c = config_;
  Activations& w = *acts_;
  const int64_t D = c.hidden_size, V = c.vocab_size, chunk = w.logits.size() / V;
  const int32_t* targets = gather ? w.head_targets.as<int32_t>() : w.targets.as<int32_t>();
  for (int64_t r0 = first; r0 < first + count; r0 += chunk) {
    const int64_t n = std::min(chunk, first + count - r0);
    float* lg = w.logits.data();
    ConstAct xf = A(w.xf).At(r0 * D);
    const int32_t* rows_of_chunk = w.head_rows.as<int32_t>() + r0;
    if (gather) {
      backend_->EmbeddingForward(A(w.xf), rows_of_chunk, n, D, A(w.head_x));
      xf = A(w.head_x);
    }
    backend_->Gemm(HeadOperands(), false, true, n, V, D, 1.0f, xf, D, HeadWeight(), D, 0.0f, lg, V);
    Round(lg, n * V);
    const float cap = static_cast<float>(config_.final_softcap);  // Gemma 2: cap · tanh(logits / cap)
    if (cap > 0) {
      backend_->SoftCap(n * V, cap, lg);
      Round(lg, n * V);  // HF caps the bf16 logits in bf16: the capped values are bf16 too
    }
    if (logits)
      backend_->CopyToHost(logits->data() + r0 * V, lg, static_cast<int64_t>(sizeof(float)) * n * V);
    backend_->CrossEntropy(lg, targets + r0, n, V, grad_scale, backward ? lg : nullptr, loss_sum, cap);
    if (!backward) continue;
    // lg now holds d(loss)/d(logits) for these rows.
    float* dx = gather ? w.head_dx.data() : w.dxf.data() + r0 * D;
    backend_->Gemm(HeadOperands(), false, false, n, D, V, 1.0f, lg, V, HeadWeight(), D, 0.0f, dx, D);
    if (gather) backend_->EmbeddingBackward(dx, rows_of_chunk, n, D, w.dxf.data());
    if (float* dhead = HeadGrad())
      backend_->Gemm(GemmOperands::kF32, true, false, V, D, n, 1.0f, lg, V, xf, D, 1.0f, dhead, D);
  }
}

std::vector<int64_t> Model::PrepareSequenceHead(const MicroBatch& mb, ConstAct x_last) {
  const ModelConfig& c = config_;
  Activations& w = *acts_;
  const int64_t rows = mb.rows(), D = c.hidden_size;
  backend_->RmsNormForward(x_last, NormWeight(final_norm_), rows, D, static_cast<float>(c.rms_norm_eps),
                           A(w.xf), w.rstdf.data());
  // Rows are sequence-major, so the targeted rows of sequence b are one run of them.
  const std::vector<int32_t> picked = TargetRows(mb, 0, rows);
  UploadHeadRows(mb, picked);
  std::vector<int64_t> starts(static_cast<size_t>(mb.batch + 1), 0);
  for (int32_t i : picked) ++starts[i / mb.seq + 1];
  for (int64_t b = 0; b < mb.batch; ++b) starts[b + 1] += starts[b];
  const int64_t bytes = mb.batch * static_cast<int64_t>(sizeof(double));
  if (w.seq_loss.bytes() < bytes) w.seq_loss = backend_->AllocBytes(bytes, MemCategory::kWorkspace);
  return starts;
}

std::vector<SequenceLogProb> Model::SequenceHead(const MicroBatch& mb, const std::vector<int64_t>& starts,
                                                 const std::vector<float>* weights) {
  Activations& w = *acts_;
  backend_->Zero(w.seq_loss.data(), 2 * mb.batch);  // doubles
  double* loss = w.seq_loss.as<double>();
  for (int64_t b = 0; b < mb.batch; ++b) {  // each sequence with its own sum and gradient weight
    HeadChunks(starts[b], starts[b + 1] - starts[b], true, weights ? (*weights)[b] : 0.0f, weights != nullptr,
               nullptr, loss + b);
  }
  std::vector<double> sums(static_cast<size_t>(mb.batch));
  backend_->CopyToHost(sums.data(), loss, mb.batch * static_cast<int64_t>(sizeof(double)));
  std::vector<SequenceLogProb> out(static_cast<size_t>(mb.batch));
  for (int64_t b = 0; b < mb.batch; ++b) out[b] = {-sums[b], starts[b + 1] - starts[b]};
  return out;
}

std::vector<SequenceLogProb> Model::SequenceLogProbs(const MicroBatch& mb) {
  eval_mode_ = true;
  const ConstAct x_last = ForwardLayers(mb, false);
  std::vector<SequenceLogProb> out = SequenceHead(mb, PrepareSequenceHead(mb, x_last), nullptr);
  eval_mode_ = false;
  return out;
}

LossResult Model::ForwardBackwardBySequence(
    const MicroBatch& mb,
    const std::function<std::vector<float>(const std::vector<SequenceLogProb>&)>& weights) {
  const ConstAct x_last = ForwardLayers(mb, true);
  const std::vector<int64_t> starts = PrepareSequenceHead(mb, x_last);
  const std::vector<SequenceLogProb> logps = SequenceHead(mb, starts, nullptr);
  const std::vector<float> w = weights(logps);
  FT_CHECK(static_cast<int64_t>(w.size()) == mb.batch);
  backend_->Zero(acts_->dxf.data(), mb.rows() * config_.hidden_size);
  SequenceHead(mb, starts, &w);  // the head again, now with each sequence's gradient weight
  FinalNormBackward(x_last, mb.rows());
  BackwardLayers(mb);
  LossResult result;
  for (const SequenceLogProb& s : logps) {
    result.loss_sum -= s.sum;
    result.tokens += s.tokens;
  }
  return result;
}

ConstAct Model::ForwardLayers(const MicroBatch& mb, bool for_backward) {
  current_batch_ = &mb;
  EnsureActivations(mb.rows(), mb.batch);
  EnsureRope(*std::max_element(mb.positions.begin(), mb.positions.end()) + 1);
  UploadBatch(mb);
  RefreshNormWeights();  // Gemma's (1 + w), when the weights may have changed since the last forward
  Activations& w = *acts_;
  const int64_t bytes = mb.rows() * config_.hidden_size * ActDTypeBytes(act_dtype_);
  EmbedForward(mb, LayerInput(0));
  for (int l = 0; l < config_.num_layers; ++l) {
    LayerActs& a = w.layers[options_.activation_checkpointing ? 0 : l];
    StageLayer(l);
    // This layer's weights are staged; the slot it writes was copied out two layers ago.
    backend_->WaitForCopies();
    StageLayer(l + 1);  // prefetched while this layer computes
    // Offloading: this input out to the host, for the backward to bring back (the last two
    // layers' are still in their slots then; a forward-only call needs none).
    if (options_.offload_activations && for_backward && l + kOffloadSlots <= config_.num_layers)
      backend_->CopyToHostAsync(w.host_in[l].data(), LayerInput(l).data, bytes);
    LayerForward(l, mb, LayerInput(l), a, LayerInput(l + 1));
  }
  return LayerInput(config_.num_layers);
}

Act Model::LayerInput(int l) {
  return A(acts_->layer_in[options_.offload_activations ? l % kOffloadSlots : l]);
}

Act Model::A(DeviceBuffer& b) const { return Act(b.data(), act_dtype_); }

LossResult Model::Forward(const MicroBatch& mb, std::vector<float>* logits) {
  return HeadForwardBackward(mb, ForwardLayers(mb, false), 0.0f, false, logits);
}

LossResult Model::EvalForward(const MicroBatch& mb) {
  eval_mode_ = true;
  LossResult result = Forward(mb, nullptr);
  eval_mode_ = false;
  return result;
}

KvCache::KvCache(Model& model, int64_t capacity) : capacity_(capacity) {
  const ModelConfig& c = model.config();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t bytes = capacity * c.kv_dim() * ActDTypeBytes(model.activation_dtype());
    k_.push_back(model.backend().AllocBytes(bytes, MemCategory::kActivations));
    v_.push_back(model.backend().AllocBytes(bytes, MemCategory::kActivations));
  }
}

StatusOr<std::vector<float>> Model::Decode(const std::vector<int32_t>& ids, KvCache* cache) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n == 0) return Status::InvalidArgument("Decode: no tokens");
  if (cache->length_ + n > cache->capacity_) {
    return Status::InvalidArgument("Decode: " + std::to_string(cache->length_ + n) +
                                   " positions do not fit a KV cache of " + std::to_string(cache->capacity_));
  }
  MicroBatch mb;
  mb.batch = 1;
  mb.seq = n;
  mb.ids = ids;
  mb.targets.assign(ids.size(), -100);
  for (int64_t i = 0; i < n; ++i) mb.positions.push_back(static_cast<int32_t>(cache->length_ + i));
  eval_mode_ = true;
  decode_cache_ = cache;
  const ConstAct x_last = ForwardLayers(mb, false);
  decode_cache_ = nullptr;
  eval_mode_ = false;
  cache->length_ += n;
  // The head on the last position only (its target, like every other, is none).
  MicroBatch last;
  last.batch = 1;
  last.seq = 1;
  last.targets = {-100};
  std::vector<float> logits;
  HeadForwardBackward(last, x_last.At((n - 1) * config_.hidden_size), 0.0f, false, &logits);
  FT_RETURN_IF_ERROR(backend_->Synchronize().WithContext("Decode on " + backend_->Describe()));
  return logits;
}

LossResult Model::ForwardBackward(const MicroBatch& mb, float grad_scale) {
  const ConstAct x_last = ForwardLayers(mb, true);
  LossResult result = HeadForwardBackward(mb, x_last, grad_scale, true, nullptr);
  BackwardLayers(mb);
  return result;
}

void Model::BackwardLayers(const MicroBatch& mb) {
  Activations& w = *acts_;
  const int L = static_cast<int>(config_.num_layers);
  const int64_t bytes = mb.rows() * config_.hidden_size * ActDTypeBytes(act_dtype_);
  for (int l = L - 1; l >= 0; --l) {
    LayerActs* a = &w.layers[l % w.layers.size()];
    StageLayer(l);
    backend_->WaitForCopies();  // this layer's weights (and offloaded input) are in
    StageLayer(l - 1);
    // Offloading: layer l - 1's input back into its slot, unless still there (the
    // last two layers' are: nothing has written their slots since the forward).
    if (options_.offload_activations && l >= 1 && l - 1 + kOffloadSlots <= L)
      backend_->CopyToDeviceAsync(LayerInput(l - 1).data, w.host_in[l - 1].data(), bytes);
    if (options_.activation_checkpointing) {
      // Recompute this layer's saved tensors from its input; its output slot is free by now.
      LayerForward(l, mb, LayerInput(l), *a, LayerInput(l + 1));
    }
    LayerBackward(l, mb, LayerInput(l), *a, A(w.grad));
  }
  if (full_training_) {  // the embeddings' gradient, from the stored one widened (in dn's workspace)
    const int64_t n = mb.rows() * config_.hidden_size;
    const bool typed = act_dtype_ != ActDType::kF32;
    float* grad = typed ? w.dn.data() : w.grad.data();
    if (typed) backend_->Convert(A(w.grad), n, Act(grad));
    if (config_.gemma) backend_->Scale(n, EmbedScale(), grad);
    backend_->EmbeddingBackward(grad, w.ids.as<int32_t>(), mb.rows(), config_.hidden_size, dembed_.data());
  }
}

void Model::MergeLora() {
  dequantized_ = kNoneDequantized;
  for (auto& layer : layers_) {
    for (auto& lin : layer.proj) {
      BringToDevice(lin);  // a merged model is a plain one: every weight on the device
      if (!lin.lora) continue;
      if (!lin.nf4.empty()) {  // merge into the dequantized weight: the one the adapter was trained against
        lin.w = backend_->Alloc(lin.in * lin.out, MemCategory::kWeights);
        backend_->DequantizeNf4(lin.nf4_layout, lin.nf4.data(), lin.w.data());
        lin.nf4 = DeviceBuffer();
      }
      WidenLinear(lin);
      LoraWeights& lw = *lin.lora;
      backend_->Gemm(GemmOperands::kF32, false, false, lw.out, lw.in, lw.r, lw.scale, lw.b.data(), lw.r,
                     lw.a.data(), lw.in, 1.0f, lin.w.data(), lin.in);
      lin.lora.reset();
    }
  }
  lora_copies_.clear();
  lora_enabled_ = false;
  acts_.reset();
  for (DeviceBuffer& stage : stage_) stage = DeviceBuffer();
  staged_[0] = staged_[1] = -1;
}

}  // namespace ft
