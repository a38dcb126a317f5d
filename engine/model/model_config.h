// The shape of a dense decoder (Llama 2/3/3.1, Qwen2/2.5, Qwen3, Mistral,
// TinyLlama, SmolLM), as read from a Hugging Face config.json. The family's
// architecture traits (engine/model/family.h) are copied in when it is read:
// the model code reads them here, never model_type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device_kind.h"
#include "common/status.h"
#include "engine/model/activation.h"

namespace ft {

struct RopeScaling {
  std::string type;  // "" (none), "linear" or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
  bool operator==(const RopeScaling&) const = default;
};

// The most decoder layers a config may have (ModelConfig::Validate).
inline constexpr int64_t kMaxNumLayers = 1024;

struct ModelConfig {
  std::string model_type = "llama";  // a row of engine/model/family.h
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // D
  int64_t intermediate_size = 0;  // I
  int64_t num_layers = 0;         // L
  int64_t num_heads = 0;          // Hq
  int64_t num_kv_heads = 0;       // Hkv
  int64_t head_dim = 0;           // hd
  int64_t max_position_embeddings = 2048;
  bool max_position_embeddings_unset = false;  // config.json lacks the key: the value above is a guess
  int64_t sliding_window = 0;                  // 0 = none (Mistral may set one)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2)
  bool qk_norm = false;         // per-head q/k RMSNorm before RoPE (Qwen3): FamilyTraits::qk_norm
  Activation hidden_act = Activation::kSilu;
  // FamilyTraits::gemma: (1 + w) norms, sandwich norms, embeddings × √hidden_size.
  bool gemma = false;
  double query_pre_attn_scalar = 0;  // the attention's scale is its -½ power; 0 = head_dim's
  double rope_local_theta = 0;       // RoPE base of the sliding layers (no scaling); 0 = rope_theta
  // Per layer, 1 = sliding-window attention (layer_types; Gemma's alternation, Qwen's
  // max_window_layers); empty = every layer alike (sliding_window, if any, applies to all).
  std::vector<uint8_t> sliding_layers;
  bool SlidingLayer(int64_t l) const { return !sliding_layers.empty() && sliding_layers[l] != 0; }
  // The keys layer l's queries see: its last `LayerWindow(l)` positions, 0 = all.
  int64_t LayerWindow(int64_t l) const {
    return sliding_window > 0 && (sliding_layers.empty() || sliding_layers[l] != 0) ? sliding_window : 0;
  }
  // FamilyTraits::fused_projections (Phi-3): q, k and v are one linear (self_attn.qkv_proj, its
  // output columns q, then k, then v) in module slot kQ, gate and up one (mlp.gate_up_proj:
  // gate, then up) in slot kGate; slots kK, kV and kUp are empty (ModuleShape).
  bool fused_projections = false;
  // RoPE turns the first rotary_dim() dims of each head, the rest pass (Phi's partial_rotary_factor).
  double partial_rotary_factor = 1.0;
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  // Soft-capping (Gemma 2): attention scores and final logits become cap · tanh(x / cap); 0 = none.
  double attn_softcap = 0;
  double final_softcap = 0;
  std::string torch_dtype = "float32";
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;  // written back as read (Phi3Config's default 32000 may lie outside a vocab)

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // InvalidArgument naming the field when the shape is inconsistent.
  Status Validate(const std::string& file) const;
  bool operator==(const ModelConfig&) const = default;
};

// RoPE inverse frequencies [head_dim/2], with rope_scaling applied as HF does; `local`: a
// sliding layer's (rope_local_theta, unscaled) when the config has one.
std::vector<double> RopeInverseFrequencies(const ModelConfig& c, bool local = false);

// A named small configuration for tests and demos: "tiny-llama" (GQA,
// rope llama3), "tiny-qwen2" (q/k/v bias), "tiny-qwen3" (q/k norms, head_dim
// 32 apart from hidden/heads, tied embeddings), "tiny-gemma3" (Gemma 3's traits,
// a sliding and a full layer, window 16), "tiny-gemma2" (Gemma 2's: the same with
// soft-capping), "tiny-phi3" (Phi-3's fused projections, partial rotary 0.75, window 16),
// "tiny-tied" (tied embeddings),
// "bench" (4 layers, hidden 256). NotFound for unknown names (listing them).
StatusOr<ModelConfig> PresetModelConfig(const std::string& name);

// The seven linear module slots of a decoder layer, in HF order. A family with fused
// projections (ModelConfig::fused_projections) keeps qkv_proj in kQ and gate_up_proj in kGate
// and has no kK, kV or kUp.
enum class ModuleKind { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
constexpr int kNumModules = 7;
struct ModuleDims {
  int64_t in = 0, out = 0;
  bool present() const { return out > 0; }
};
// Slot m's linear in a layer of `c`: {in, out} features, or {0, 0} when the family has none there.
ModuleDims ModuleShape(const ModelConfig& c, ModuleKind m);
// HF's name of slot m in a layer of `c`: "q_proj", ..., or "qkv_proj" / "gate_up_proj" for a
// fused family's kQ / kGate ("" for an empty slot).
const char* ModuleName(const ModelConfig& c, ModuleKind m);
// "self_attn.q_proj", "mlp.down_proj", ...
std::string ModulePath(const ModelConfig& c, ModuleKind m);
// The slot of a module `c`'s layers have; InvalidArgument naming the model_type and its
// modules for any other name (a Llama's "qkv_proj", a Phi-3's "q_proj").
StatusOr<ModuleKind> ParseModuleName(const ModelConfig& c, const std::string& name);
// Every name a layer of any family gives a module: what a job file's target_modules may say
// before its model is read (besides kAllLinear).
std::vector<std::string> AllModuleNames();
// The names of the modules a layer of `c` has, in slot order.
std::vector<std::string> ModuleNames(const ModelConfig& c);
// PEFT's target_modules value for every linear of the decoder layers.
inline constexpr char kAllLinear[] = "all-linear";
// target_modules as a job gives them, for a model of `c`: [all-linear] alone is ModuleNames(c);
// any other list must name c's modules (ParseModuleName's error otherwise) and is kept as given.
StatusOr<std::vector<std::string>> ResolveTargetModules(const ModelConfig& c,
                                                        const std::vector<std::string>& names);

// OK when `kind`'s attention takes heads of `head_dim` (the CPU any, CUDA
// 64, 128 or 256: kernels/cuda/limits.h); InvalidArgument naming the head dim and
// what the device takes otherwise. Checked before a model is loaded, so a run
// on a device that would refuse the model's first forward ends at once with
// that reason (callers add the file and field it came from).
Status CheckHeadDimForDevice(DeviceKind kind, int64_t head_dim);

}  // namespace ft
