// The Llama-family decoder with LoRA, with an explicit forward and backward
// per layer (no autograd framework).
//
// The model owns its weights, adapters, gradients and activation arenas, all
// through the tracking allocator. Math follows HF transformers (RMSNorm,
// rotate_half RoPE, causal GQA attention, SwiGLU MLP) and PEFT (LoRA
// y = xWᵀ + b + s·(drop(x)Aᵀ)Bᵀ, s = alpha/r or alpha/√r).
//
// Usage: construct from a ModelConfig, fill weights (LoadHfModel or random),
// EnableLora or EnableFullTraining, then for each micro-batch call
// ForwardBackward(); gradients accumulate until ZeroGrads().
//
// Every op goes through the model's Backend (engine/model/backend.h; the CPU
// reference unless ModelOptions::backend names another), in the same order
// whatever the backend, so the CPU run is the reference of every device.
// Every tensor (weights, NF4 codes, adapters, gradients, activations, RoPE
// tables, the loss accumulator) lives in that backend's memory; the host
// reaches it only through Download/Upload (and the backend's copies).
//
// Thread safety: a Model is used by one thread at a time; the kernels it calls
// parallelise internally.
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/backend.h"
#include "engine/model/compute_dtype.h"
#include "engine/model/memory.h"
#include "engine/model/model_config.h"
#include "kernels/cpu/nf4.h"

namespace ft {

// "fp32", "bf16", "fp16" (ComputeDType's table, engine/model/compute_dtype.h);
// InvalidArgument naming the accepted names otherwise.
StatusOr<ComputeDType> ParseComputeDType(const std::string& name);
// The storage type of a model's activations under a compute dtype.
ActDType ActivationDType(ComputeDType dtype);

struct LoraSpec {
  int64_t r = 16;
  double alpha = 32;
  bool rslora = false;
  double dropout = 0.0;
  std::vector<std::string> target_modules;  // names accepted by ParseModuleName
  uint64_t seed = 42;                       // for A's init and dropout masks
  float Scale() const;                      // alpha/r or alpha/sqrt(r)
};

// Every tensor below lives in the model's backend memory (DeviceBuffer):
// read and write it from the host only through Model::Download/Upload.
struct LoraWeights {
  int64_t r = 0, in = 0, out = 0;
  float scale = 1;
  DeviceBuffer a;  // (r, in)   trainable, fp32 master
  DeviceBuffer b;  // (out, r)  trainable, zero at init
  // Under bf16/fp16: a and b in the compute dtype, what the GEMMs read (TrainableParam::copy), so
  // that no GEMM converts them; empty under fp32.
  DeviceBuffer a16, b16;
  DeviceBuffer da;  // (r, in)
  DeviceBuffer db;  // (out, r)
};

// A linear's base weight is held in exactly one of w, w16 and nf4. Frozen
// (LoRA) weights live in device memory, or with ModelOptions::cpu_offload in
// host memory (DeviceBuffer::host()), staged into the device one layer at a time.
struct Linear {
  int64_t in = 0, out = 0;
  DeviceBuffer w;  // (out, in) floats; empty when the weight is held in NF4 or w16
  // Typed storage: the frozen base weight (out, in) in the compute dtype,
  // bf16 or fp16 codes (uint16_t), under ModelOptions::dtype bf16/fp16
  // without NF4 or full training: half the bytes of w.
  DeviceBuffer w16;
  // QLoRA: the frozen base weight in NF4, (out, in) row-major quantized as
  // one vector, as one blob (kernels/cpu/nf4.h) described by nf4_layout.
  DeviceBuffer nf4;
  cpu::Nf4Layout nf4_layout;
  DeviceBuffer bias;   // (out) or empty
  DeviceBuffer dw;     // (out, in) full fine-tune only
  DeviceBuffer dbias;  // (out) full fine-tune only
  std::unique_ptr<LoraWeights> lora;
};

struct DecoderLayer {
  DeviceBuffer attn_norm;   // (D)
  DeviceBuffer mlp_norm;    // (D)
  DeviceBuffer dattn_norm;  // (D) full fine-tune only
  DeviceBuffer dmlp_norm;   // (D) full fine-tune only
  // ModelConfig::qk_norm (Qwen3): the per-head RMSNorms of q and k (self_attn.q_norm / k_norm).
  DeviceBuffer q_norm, k_norm;    // (head_dim), or empty
  DeviceBuffer dq_norm, dk_norm;  // (head_dim) full fine-tune only
  // ModelConfig::gemma's sandwich norms: on the attention's output and on the MLP's (mlp_norm
  // is then pre_feedforward_layernorm).
  DeviceBuffer post_attn_norm, post_mlp_norm;    // (D), or empty
  DeviceBuffer dpost_attn_norm, dpost_mlp_norm;  // (D) full fine-tune only
  Linear proj[kNumModules];
  Linear& operator[](ModuleKind m) { return proj[static_cast<int>(m)]; }
  const Linear& operator[](ModuleKind m) const { return proj[static_cast<int>(m)]; }
};

// A named weight tensor of the base model, in HF naming. Read and write its
// values with Model::WeightValues / SetWeight, whatever its storage.
struct NamedTensor {
  std::string name;  // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  // fp32 backend memory (Model::Download/Upload); nullptr for a linear held in
  // NF4 or 16-bit codes, and for 16-bit embeddings and head.
  float* data = nullptr;
  Linear* linear = nullptr;       // that linear (data is nullptr)
  DeviceBuffer* codes = nullptr;  // embeddings or head as 16-bit codes of the activation dtype
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A trainable tensor with its gradient.
struct TrainableParam {
  std::string name;  // PEFT key for LoRA, HF name for full fine-tune
  std::vector<int64_t> shape;
  float* data = nullptr;  // backend memory, like grad
  float* grad = nullptr;
  int64_t numel = 0;
  bool weight_decay = true;  // HF Trainer: no decay for biases and norm weights
  // LoRA under bf16/fp16: the copy of data in the compute dtype that the GEMMs read (rounded to
  // nearest even), refreshed by each writer of data: the optimizer's update (Backend::AdamW's
  // copy) and Model::Upload. None (data nullptr) otherwise.
  Act copy;
};

// One micro-batch: `batch` rows of `seq` tokens, right-padded.
struct MicroBatch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> ids;        // [batch*seq]
  std::vector<int32_t> targets;    // [batch*seq], -100 = no loss at this position
  std::vector<int32_t> positions;  // [batch*seq]
  std::vector<int32_t> segments;   // [batch*seq] or empty (packing: attention stays within a segment)
  // Data position (cursor) of row 0's sequence; row b holds sequence
  // first_sequence + b. Dropout masks are keyed by (sequence, position), so
  // they do not depend on how sequences are grouped into micro-batches.
  int64_t first_sequence = 0;
  // The dataset row (engine/data/dataset.h) each data position of the batch came from: one per
  // row, or one per pair for preference pairs (batch rows 2i and 2i + 1). Empty when not from a
  // Dataset.
  std::vector<int64_t> data_rows;
  int64_t rows() const { return batch * seq; }
};

struct ModelOptions {
  ComputeDType dtype = ComputeDType::kF32;
  // QLoRA: keep every linear base weight frozen in NF4 (bitsandbytes layout),
  // dequantized just in time for its GEMMs. Embeddings, norms and the head
  // stay in the compute dtype. Incompatible with full fine-tuning.
  bool nf4 = false;
  cpu::Nf4Config nf4_config;
  bool activation_checkpointing = false;  // keep layer inputs only; recompute in backward
  // With activation_checkpointing: the layer inputs are kept in host memory
  // (Backend::AllocHost), each copied out on the copy stream while its layer
  // runs and back one layer ahead in backward; the device holds three.
  bool offload_activations = false;
  // Frozen base weights (LoRA/QLoRA only) kept in host memory and copied into
  // one of two device stages per layer on the copy stream, the next layer's
  // while this one computes; the device holds two layers of them.
  bool cpu_offload = false;
  // FSDP (distributed.strategy: fsdp; LoRA/QLoRA): each of `world` ranks
  // keeps 1/world of every layer's frozen linear storage on the device
  // (Model::ShardFrozenWeights splits it once loaded). A layer's whole
  // storage is all-gathered into one of two device stages just before its
  // forward, and again for its backward (or recompute), the next layer's
  // right after this one's: the device holds two layers, not all. Every
  // rank must run the same forwards and backwards (the gathers are
  // collective). With cpu_offload too, the shards stay in host memory and
  // only the two stages are on the device. A failed gather leaves the stage as it was and is the
  // caller's to report (its collective stays failed: the step's gradient
  // all-reduce returns the error).
  struct Sharding {
    int rank = 0, world = 1;
    // out[r·bytes ..] = rank r's `mine` for every rank (Collective::AllGather); false on failure.
    std::function<bool(const void* mine, int64_t bytes, void* out)> all_gather;
  } shard;
  bool naive_attention = false;  // reference attention (materialises scores)
  int64_t loss_chunk_rows = 0;   // rows per cross-entropy chunk; 0 = auto (bounded memory)
  // The device the ops run on (engine/model/backend.h); null = CreateBackend(kCpu)
  // (the CPU reference backend, or the guarded one in tests). Read once, by the constructor: set_options
  // cannot move a model.
  std::shared_ptr<Backend> backend;
};

struct LossResult {
  double loss_sum = 0;  // Σ token cross-entropies
  int64_t tokens = 0;   // tokens with a target
};

// One batch row's Σ log p of its target tokens, and how many it has (DPO's response
// log-probabilities: the prompt's positions have no target).
struct SequenceLogProb {
  double sum = 0;
  int64_t tokens = 0;
};

class Model;

// Keys and values of one sequence's positions so far, for every layer, in the
// model's backend memory (after RoPE, as the layer's attention reads them):
// what Model::Decode appends to and attends over, so generating a token costs
// one position's forward instead of the whole prefix's.
class KvCache {
 public:
  // Room for `capacity` positions: 2 · layers · capacity · kv_dim floats,
  // counted as activations.
  KvCache(Model& model, int64_t capacity);
  int64_t length() const { return length_; }  // positions held
  int64_t capacity() const { return capacity_; }

 private:
  friend class Model;
  int64_t length_ = 0, capacity_ = 0;
  std::vector<DeviceBuffer> k_, v_;  // per layer: (capacity, kv_dim)
};

class Model {
 public:
  // Allocates zeroed weights for `config` (which must be valid).
  Model(ModelConfig config, ModelOptions options);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  // How the activations are stored (ActivationDType of the compute dtype).
  ActDType activation_dtype() const { return act_dtype_; }
  Backend& backend() const { return *backend_; }
  const std::shared_ptr<Backend>& shared_backend() const { return backend_; }
  void set_options(const ModelOptions& options) { options_ = options; }

  // Every base weight in HF naming (lm_head absent when tied).
  std::vector<NamedTensor> NamedWeights();

  // Adds LoRA adapters to the targeted modules of every layer: A uniform in
  // ±1/√in (PEFT's kaiming_uniform(a=√5)), B zero. InvalidArgument for an
  // unknown module name or r ≤ 0.
  Status EnableLora(const LoraSpec& spec);
  // Makes every weight trainable (allocates gradients). FailedPrecondition
  // for an NF4 model (a quantized weight cannot be trained).
  Status EnableFullTraining();
  // With options.nf4, or a bf16/fp16 dtype (typed storage), linear base
  // weights have no float buffer: loaders pass each one's (host) values
  // here; they are quantized to NF4 (or rounded to 16 bits, to nearest even)
  // on the host and uploaded to the backend as SetWeight says.
  void SetLinearWeight(Linear* lin, const float* values);
  // With options.nf4: gives every linear without one its NF4 storage at the
  // layout QuantizeNf4 would give it (cpu::Nf4BlobLayoutFor), its values left
  // as the backend's memory holds them (zeros): a model of the right shape
  // without quantizing anything, for the CUDA cost model.
  void ReserveNf4Weights();
  // The values of a linear held in 16-bit codes, on the host (exact).
  // FailedPrecondition for an NF4 one (merge it first: MergeLora).
  StatusOr<std::vector<float>> LinearValues(const Linear& lin) const;
  // A named weight's values from the host (quantized, rounded to 16 bits or
  // copied as its storage says), and back on the host (exact for 16-bit
  // storage; FailedPrecondition for NF4, as LinearValues).
  // Loading: SetWeight prepares the storage's bytes in a page-locked staging
  // slot (Backend::AllocHost; two, used in turn, counted under kWorkspace by
  // the host tracker) and copies them on the backend's copy stream, so the
  // copy of one tensor runs while the caller reads and quantizes the next;
  // storage kept in host memory (cpu_offload, sharding) is written in place.
  // `values` may be reused as soon as SetWeight returns. The copies may still
  // be running then: call FinishLoading after the last SetWeight, before the
  // model runs or its weights are read.
  void SetWeight(const NamedTensor& t, const float* values);
  StatusOr<std::vector<float>> WeightValues(const NamedTensor& t) const;
  // Ends a load: waits for every copy SetWeight started (ops called later see
  // the weights) and frees the staging, so none of it stays through training.
  // OK, also when no load is under way; otherwise the backend's first failure
  // (Synchronize's), and the weights are not all on the device.
  // LoadHfWeights and RandomInitModel call it; so does the destructor.
  Status FinishLoading();

  // Host <-> backend copies of n floats of a model tensor (NamedTensor::data,
  // TrainableParam::data/grad). Download waits for the copy; after Upload the
  // host memory may be reused at once.
  std::vector<float> Download(const float* tensor, int64_t n) const;
  void Upload(float* tensor, const float* host, int64_t n);
  // Rounds every float base weight to the compute dtype in place (bf16 or
  // fp16; nothing under fp32): what the run trains on (NF4 weights are
  // rounded when dequantized).
  void RoundWeightsToComputeDType();
  bool nf4() const { return options_.nf4; }
  bool full_training() const { return full_training_; }
  const LoraSpec* lora_spec() const { return lora_enabled_ ? &lora_spec_ : nullptr; }

  // Trainable tensors in a fixed order (the order grads are reduced in).
  std::vector<TrainableParam> TrainableParams();
  void ZeroGrads();

  // Forward and backward of one micro-batch; gradients of
  // grad_scale · Σ token losses are added to the trainable params' grads.
  LossResult ForwardBackward(const MicroBatch& mb, float grad_scale);
  // DPO's passes. SequenceLogProbs: forward in evaluation mode (no dropout), each batch row's
  // Σ log p of its targets. ForwardBackwardBySequence: forward, those sums, then the gradient of
  // Σ_b w[b] · (row b's cross-entropy sum), w = weights(sums) (one per row), added to the
  // trainable params' grads; the result's loss_sum is the rows' cross-entropy total.
  std::vector<SequenceLogProb> SequenceLogProbs(const MicroBatch& mb);
  LossResult ForwardBackwardBySequence(
      const MicroBatch& mb,
      const std::function<std::vector<float>(const std::vector<SequenceLogProb>&)>& weights);
  // false: every LoRA adapter is skipped (the base model: DPO's reference); true again after.
  void SetAdapterEnabled(bool enabled) { adapter_off_ = !enabled; }
  // Forward only: loss and, when logits != nullptr, logits [rows, vocab].
  LossResult Forward(const MicroBatch& mb, std::vector<float>* logits);
  // Forward in evaluation mode (HF's model.eval()): as Forward but without
  // LoRA dropout. Changes no weight, gradient or random state.
  LossResult EvalForward(const MicroBatch& mb);
  // Generation, one sequence: runs `ids` at positions cache->length().. in
  // evaluation mode, their attention reading the cached positions too, appends
  // their keys and values to the cache and returns the logits [vocab] after
  // the last of them. The same logits as a Forward of the whole sequence at
  // that position (up to the summation order of the products). Errors:
  // InvalidArgument when ids is empty or does not fit the cache.
  StatusOr<std::vector<float>> Decode(const std::vector<int32_t>& ids, KvCache* cache);

  // Folds every adapter into its base weight (W += s·B·A) and drops the
  // adapters; an NF4 weight is dequantized first (what the adapter trained on).
  // Not on a sharded model (merge a fresh, unsharded copy).
  void MergeLora();

  // FSDP (options().shard.world > 1): keeps this rank's 1/world of each
  // layer's frozen linear storage on the device and frees the whole (held in
  // host memory while loading). Call once, after the weights are loaded.
  void ShardFrozenWeights();
  bool sharded() const { return sharded_; }
  // Bytes of one layer's frozen storage this rank keeps (0 when not sharded).
  int64_t shard_bytes() const { return shard_bytes_; }
  // Wall time spent in those gathers so far (the host copies included).
  double gather_seconds() const { return gather_seconds_; }

 private:
  struct Activations;
  struct LayerActs;

  void EnsureActivations(int64_t rows, int64_t batch);
  void EnsureRope(int64_t max_pos);
  void UploadBatch(const MicroBatch& mb);  // ids, targets, positions, segments into acts_
  // The embedding rows of the batch (× √hidden_size under ModelConfig::gemma, in the embedding dtype).
  void EmbedForward(const MicroBatch& mb, Act x);
  float EmbedScale() const;  // 1, or Gemma's √hidden_size as the embedding dtype rounds it
  // A layer's norms: (HF name suffix, weight, gradient), in NamedWeights' order.
  struct NormRef {
    std::string name;
    DeviceBuffer* w;
    DeviceBuffer* grad;
  };
  std::vector<NormRef> LayerNorms(DecoderLayer& layer);
  // The weight a norm multiplies by: w, or Gemma's (1 + w) (norm_eff_).
  const float* NormWeight(const DeviceBuffer& w) const;
  // norm_eff_ = 1 + w for every norm (Gemma) when a weight may have changed: after SetWeight, and
  // before every forward of a full fine-tune (the optimizer trains the norms); LoRA's are frozen.
  void RefreshNormWeights();
  // out = a + b, rounded to the activation dtype once (a residual add: torch's x + bf16 y).
  void AddResidual(ConstAct a, ConstAct b, int64_t n, Act out);
  cpu::AttentionShape AttentionShapeOf(const MicroBatch& mb, int l) const;
  // Fused projections (Phi-3): copies between `whole` [rows, Σ cols] (qkv_proj's / gate_up_proj's
  // output or its gradient) and its column blocks ([rows, cols] each, elements of es bytes):
  // into the blocks when `split`, out of them into `whole` otherwise.
  void ColumnBlocks(void* whole, int64_t es, int64_t rows,
                    std::initializer_list<std::pair<void*, int64_t>> blocks, bool split);
  // Uploads the batch and runs the embedding and every layer forward; returns the last layer's output.
  // `for_backward`: a backward follows (offloaded layer inputs are copied out for it).
  ConstAct ForwardLayers(const MicroBatch& mb, bool for_backward);
  void LayerForward(int l, const MicroBatch& mb, ConstAct x_in, LayerActs& a, Act x_out);
  // g: the gradient of the layer's output in, of its input out (stored in the activation dtype).
  void LayerBackward(int l, const MicroBatch& mb, ConstAct x_in, LayerActs& a, Act g);
  // The backward's per-block gradient buffers, placed in one allocation (Activations::phase).
  void AllocBackwardPhase(Activations* a, int64_t rows);
  // The two blocks of LayerBackward; MlpBackward leaves d(h) in w.dh16 (w.dh under fp32).
  ConstAct MlpBackward(int l, LayerActs& a, ConstAct g, int64_t rows);
  void AttentionBlockBackward(int l, const MicroBatch& mb, ConstAct x_in, LayerActs& a, ConstAct dh,
                              int64_t rows, Act g);
  // Gemma's sandwich norms: the gradient of a branch's output `dy` back through its norm, stored.
  ConstAct ThroughPostNorm(ConstAct pre, DeviceBuffer& norm, DeviceBuffer& dnorm, const DeviceBuffer& rstd,
                           ConstAct dy, int64_t rows);
  LossResult HeadForwardBackward(const MicroBatch& mb, ConstAct x_last, float grad_scale, bool backward,
                                 std::vector<float>* logits);
  // The loss head per batch row (DPO). PrepareSequenceHead: the final norm, the targeted rows
  // uploaded once, and where each row's run of them starts ([batch + 1]). SequenceHead: each row's
  // Σ log p of its targets; with `weights`, also weights[b] x the gradient of row b's cross-entropy
  // sum added into dxf (the caller zeroes dxf first and runs FinalNormBackward after).
  std::vector<int64_t> PrepareSequenceHead(const MicroBatch& mb, ConstAct x_last);
  std::vector<SequenceLogProb> SequenceHead(const MicroBatch& mb, const std::vector<int64_t>& starts,
                                            const std::vector<float>* weights);
  // Runs the head on rows [first, first + count) of xf (gather: of the rows UploadHeadRows named,
  // with their targets), adding the cross-entropy sum to *loss_sum and, when backward, grad_scale x
  // its gradient into dxf (and the head's weight gradient under full training).
  void HeadChunks(int64_t first, int64_t count, bool gather, float grad_scale, bool backward,
                  std::vector<float>* logits, double* loss_sum);
  std::vector<int32_t> TargetRows(const MicroBatch& mb, int64_t begin, int64_t end) const;
  void UploadHeadRows(const MicroBatch& mb, const std::vector<int32_t>& picked);
  void FinalNormBackward(ConstAct x_last, int64_t rows);
  // Every layer's backward from grad (the final norm's input gradient), last layer first.
  void BackwardLayers(const MicroBatch& mb);
  // y = x Wᵀ (+ bias) (+ LoRA), plus *residual when given; xa receives LoRA's x·Aᵀ.
  void LinearForward(int l, ModuleKind m, ConstAct x, int64_t rows, Act y, Act xa,
                     const ConstAct* residual = nullptr);
  // dy: the output's gradient as PyTorch's tensor holds it (the activation dtype); dx (fp32) is
  // overwritten or accumulated into.
  void LinearBackward(int l, ModuleKind m, ConstAct x, ConstAct xa, ConstAct dy, int64_t rows, float* dx,
                      bool accumulate_dx);
  GemmOperands LinearOperands() const;
  DropoutKey DropoutKeyFor(int l, ModuleKind m) const;
  ConstAct DropoutInput(int l, ModuleKind m, ConstAct x, int64_t rows, int64_t in, float* buf);
  // x[n] (fp32) stored into `buf` in the activation dtype, rounded to nearest even (under fp32: x
  // itself): a gradient where PyTorch keeps a bf16 tensor, or a GEMM operand rounded once for its uses.
  ConstAct Rounded(const float* x, int64_t n, DeviceBuffer& buf);
  const MicroBatch* current_batch_ = nullptr;  // the micro-batch being processed (for dropout keys)
  KvCache* decode_cache_ = nullptr;            // Decode in progress: attention appends to and reads it
  bool eval_mode_ = false;                     // EvalForward in progress: no dropout
  bool adapter_off_ = false;                   // SetAdapterEnabled(false): the base model alone
  std::vector<int32_t> head_rows_host_, head_targets_host_;  // UploadHeadRows' host arrays
  void Round(float* x, int64_t n) const;
  // How the embeddings and head are stored: the activation dtype, fp32 once
  // full training made them trainable masters.
  ActDType EmbedDType() const;
  // The head's weight (the embeddings when tied), in its storage type.
  ConstAct HeadWeight() const;
  // How the head's GEMMs take their operands: as the decoder's linears when
  // the head is stored in 16 bits (logits and their gradient rounded to it,
  // as a bf16 lm_head in PyTorch), else fp32.
  GemmOperands HeadOperands() const;
  // The GEMM operand of linear m of layer l's weight: its own fp32 buffer, its
  // 16-bit codes as they are (the linears' GEMMs take 16-bit operands then), or
  // its NF4 codes dequantized into scratch straight to the GEMM's operand type
  // (the activation dtype); from the stage when offloaded or sharded.
  ConstAct LinearWeight(int l, ModuleKind m);
  // Frozen storage of `bytes`: in host memory under cpu_offload, else on the device.
  DeviceBuffer AllocFrozen(int64_t bytes);
  // Loading's staging (SetWeight): two page-locked host slots, each as large
  // as the largest tensor staged in it so far, filled in turn; busy: a copy
  // issued from it may still be reading it.
  struct LoadStaging {
    DeviceBuffer slot[2];
    bool busy[2] = {false, false};
    int next = 0;  // the slot the next tensor goes through
  };
  LoadStaging load_;
  // The next slot, at least `bytes` large, for the host to fill: when its last
  // copy may still be running, first waits for the backend (both slots are
  // free after). A failed wait is the backend's sticky error, which
  // FinishLoading returns.
  uint8_t* LoadSlot(int64_t bytes);
  // Copies `bytes` of the slot LoadSlot returned to `dst` (device memory) on the
  // copy stream, and moves on to the other slot.
  void CopyLoadSlot(void* dst, int64_t bytes);
  bool loading() const { return !load_.slot[0].empty() || !load_.slot[1].empty(); }
  // The frozen storage of a linear (w, w16 or nf4: the one in use).
  static DeviceBuffer& FrozenStorage(Linear& lin);
  // cpu_offload: layer l's host-resident frozen storage copied into stage
  // l % 2 on the copy stream (nothing when it is there already, or l is out
  // of range). Ops reading it must follow a WaitForCopies. Sharded: the
  // layer's shards all-gathered into the stage.
  void StageLayer(int l);
  // The stages' layout (stage_at_, stage_bytes_) and the two stages, once.
  void EnsureStages();
  // Offloaded storage moved back into device memory for good (merging).
  void BringToDevice(Linear& lin);
  // Saved layer input l (a slot of three when offloading).
  Act LayerInput(int l);
  // An activation buffer of n elements in the activation dtype, and a view of one.
  DeviceBuffer AllocAct(int64_t n, MemCategory category);
  Act A(DeviceBuffer& b) const;
  float* HeadGrad();

  ModelConfig config_;
  ModelOptions options_;
  ActDType act_dtype_ = ActDType::kF32;
  std::shared_ptr<Backend> backend_;  // every op and (later) every buffer goes through it
  // Embeddings and head: fp32, or (LoRA/QLoRA under bf16/fp16: frozen)
  // 16-bit codes of the activation dtype (EmbedDType).
  DeviceBuffer embed_;                            // (V, D)
  DeviceBuffer final_norm_;                       // (D)
  DeviceBuffer lm_head_;                          // (V, D) or empty when tied
  DeviceBuffer dembed_, dfinal_norm_, dlm_head_;  // full fine-tune only
  std::vector<DecoderLayer> layers_;
  bool lora_enabled_ = false;
  bool full_training_ = false;
  DeviceBuffer dequant_;  // scratch for one NF4 linear weight dequantized (in act_dtype_)
  // The (layer, module) whose weight dequant_ holds (frozen: its values stay until a load, a
  // sharding or a merge rewrites NF4 storage, which reset it).
  static constexpr std::pair<int, int> kNoneDequantized{-1, -1};
  std::pair<int, int> dequantized_ = kNoneDequantized;
  // cpu_offload: two device stages of one layer's frozen storage, the byte
  // offset of each module's storage in a stage, and the layer each holds.
  DeviceBuffer stage_[2];
  int64_t stage_at_[kNumModules] = {};
  int64_t stage_bytes_ = 0;
  int staged_[2] = {-1, -1};
  // FSDP: this rank's shard of each layer's stage image, and host buffers for the gathers.
  bool sharded_ = false;
  int64_t shard_bytes_ = 0;
  std::vector<DeviceBuffer> shards_;
  std::vector<char> gather_mine_, gather_all_;
  double gather_seconds_ = 0;
  // The 16-bit format of typed base weights, when the model has them (Linear::w16).
  std::optional<ActDType> weight_format_;
  // Replaces lin's 16-bit codes by floats (full training, merging).
  void WidenLinear(Linear& lin);
  LoraSpec lora_spec_;
  // LoRA's 16-bit copies (LoraWeights::a16, b16) keyed by their fp32 master, for Upload to refresh.
  std::map<const float*, Act> lora_copies_;
  // What a LoRA GEMM reads of a master: its 16-bit copy under bf16/fp16, else the master.
  ConstAct LoraOperand(const DeviceBuffer& master, const DeviceBuffer& copy) const;

  DeviceBuffer rope_cos_, rope_sin_;              // (rope_len_, hd/2)
  DeviceBuffer rope_local_cos_, rope_local_sin_;  // the sliding layers' (rope_local_theta), or empty
  int64_t rope_len_ = 0;
  // ModelConfig::gemma: each norm weight's effective (1 + w), refreshed by RefreshNormWeights
  // before a forward, keyed by the weight's buffer; ones_ (max(D, head_dim) ones) adds the 1.
  std::map<const float*, DeviceBuffer> norm_eff_;
  DeviceBuffer ones_;
  bool norm_eff_stale_ = true;  // a weight was set since the last RefreshNormWeights
  // The RoPE tables (cos, sin) of layer l: the sliding layers' own when the config has them.
  std::pair<const float*, const float*> RopeTables(int l) const;
  std::unique_ptr<Activations> acts_;
};

}  // namespace ft
