#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "engine/model/family.h"
#include "kernels/cuda/limits.h"

namespace ft {

namespace {

// InvalidArgument naming the key unless every number of `c` is finite and in range.
Status ValidateNumbers(const ModelConfig& c, const std::string& file) {
  // Each a finite number in (low, high]: far wider than any released model's, narrow enough that
  // the norms and RoPE stay finite. The rope_scaling keys count only when rope_scaling is used.
  struct Range {
    double value;
    const char* key;
    double low, high;
    bool used;
  };
  const RopeScaling& r = c.rope_scaling;
  const bool llama3 = r.type == "llama3";
  const Range ranges[] = {
      {c.rms_norm_eps, "rms_norm_eps", 0, 1, true},
      {c.rope_theta, "rope_theta", 0, 1e12, true},
      {r.factor, "rope_scaling.factor", 0, 1e6, !r.type.empty()},
      {r.low_freq_factor, "rope_scaling.low_freq_factor", 0, 1e6, llama3},
      {r.high_freq_factor, "rope_scaling.high_freq_factor", 0, 1e6, llama3},
      {static_cast<double>(r.original_max_position_embeddings),
       "rope_scaling.original_max_position_embeddings", 0, double{1 << 24}, llama3},
      {static_cast<double>(c.sliding_window), "sliding_window", -1, double{1 << 24}, true},
      {c.query_pre_attn_scalar, "query_pre_attn_scalar", 0, 1e6, c.query_pre_attn_scalar != 0},
      {c.rope_local_theta, "rope_local_base_freq", 0, 1e12, c.rope_local_theta != 0},
      {c.attn_softcap, "attn_logit_softcapping", 0, 1e6, c.attn_softcap != 0},
      {c.final_softcap, "final_logit_softcapping", 0, 1e6, c.final_softcap != 0},
  };
  for (const Range& b : ranges) {
    if (!b.used || (std::isfinite(b.value) && b.value > b.low && b.value <= b.high)) continue;
    char text[160];
    std::snprintf(text, sizeof(text), "'%s' must be a finite number in (%g, %g], got %g", b.key, b.low,
                  b.high, b.value);
    return Status::InvalidArgument(file + ": " + text + "; correct the model's config.json");
  }
  return Status::OK();
}

}  // namespace

Status ModelConfig::Validate(const std::string& file) const {
  FT_ASSIGN_OR_RETURN(const FamilyTraits* family, FindFamily(model_type, file));
  const struct {
    bool config, family;
    const char* what;
  } traits[] = {{qk_norm, family->qk_norm, "q/k norms"},
                {gemma, family->gemma, "Gemma's norms and scales"},
                {fused_projections, family->fused_projections, "fused projections"}};
  for (const auto& t : traits) {
    if (t.config == t.family) continue;
    return Status::InvalidArgument(file + ": model_type '" + model_type +
                                   (t.family ? "' has " : "' has no ") + t.what);
  }
  if (!sliding_layers.empty() && static_cast<int64_t>(sliding_layers.size()) != num_layers) {
    return Status::InvalidArgument(file + ": layer_types has " + std::to_string(sliding_layers.size()) +
                                   " entries for num_hidden_layers " + std::to_string(num_layers));
  }
  // Each size positive and at most a bound far above any released model's
  // (so that every byte count the planner and the model compute fits int64).
  struct Bound {
    int64_t value;
    const char* key;
    int64_t max;
  };
  const Bound bounds[] = {
      {vocab_size, "vocab_size", int64_t{1} << 22},
      {hidden_size, "hidden_size", int64_t{1} << 16},
      {intermediate_size, "intermediate_size", int64_t{1} << 19},
      {num_layers, "num_hidden_layers", kMaxNumLayers},
      {num_heads, "num_attention_heads", 1024},
      {num_kv_heads, "num_key_value_heads", 1024},
      {head_dim, "head_dim", 1024},
      {max_position_embeddings, "max_position_embeddings", int64_t{1} << 24},
  };
  for (const Bound& b : bounds) {
    if (b.value <= 0 || b.value > b.max) {
      return Status::InvalidArgument(file + ": '" + b.key + "' must be an integer in [1, " +
                                     std::to_string(b.max) + "], got " + std::to_string(b.value));
    }
  }
  if (num_heads % num_kv_heads != 0) {
    return Status::InvalidArgument(file + ": num_attention_heads (" + std::to_string(num_heads) +
                                   ") must be a multiple of num_key_value_heads (" +
                                   std::to_string(num_kv_heads) + ")");
  }
  if (head_dim % 2 != 0)
    return Status::InvalidArgument(file + ": head_dim must be even for rotary embeddings");
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1) || rotary_dim() < 2 ||
      rotary_dim() % 2 != 0) {
    return Status::InvalidArgument(file + ": 'partial_rotary_factor' " +
                                   std::to_string(partial_rotary_factor) +
                                   " must be in (0, 1] and turn an even number (>= 2) of the head's " +
                                   std::to_string(head_dim) + " dims");
  }
  FT_RETURN_IF_ERROR(ValidateNumbers(*this, file));
  const RopeScaling& r = rope_scaling;
  if (r.type == "llama3" && !(r.high_freq_factor > r.low_freq_factor)) {
    return Status::InvalidArgument(file + ": rope_scaling (llama3) needs low_freq_factor < high_freq_factor");
  }
  return Status::OK();
}

std::vector<double> RopeInverseFrequencies(const ModelConfig& c, bool local) {
  const int64_t rotary = c.rotary_dim(), half = rotary / 2;  // HF: frequencies over the rotary dims
  local = local && c.rope_local_theta > 0;
  const double theta = local ? c.rope_local_theta : c.rope_theta;
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(rotary));
  }
  if (local) return inv;  // HF's Gemma 3: the local rotary embedding is the default one
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear") {
    for (double& f : inv) f /= s.factor;
  } else if (s.type == "llama3") {
    // HF _compute_llama3_parameters: long wavelengths are divided by factor,
    // short ones kept, and the band between is interpolated.
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_ctx / s.low_freq_factor;
    const double high_freq_wavelen = old_ctx / s.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

StatusOr<ModelConfig> PresetModelConfig(const std::string& name) {
  ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  if (name == "tiny-llama") {
    c.rope_theta = 500000;
    c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  } else if (name == "tiny-qwen2") {
    ApplyFamily(**FindFamily("qwen2", "preset"), &c);
    c.num_kv_heads = 4;
    c.rope_theta = 1000000;
    c.rms_norm_eps = 1e-6;
  } else if (name == "tiny-qwen3") {  // Qwen3-0.6B's traits: head_dim apart, q/k norms, tied
    ApplyFamily(**FindFamily("qwen3", "preset"), &c);
    c.head_dim = 32;
    c.tie_word_embeddings = true;
    c.rope_theta = 1000000;
    c.rms_norm_eps = 1e-6;
  } else if (name == "tiny-gemma3") {  // Gemma 3 1B's traits: a sliding layer, then a full one
    ApplyFamily(**FindFamily("gemma3_text", "preset"), &c);  // tied, GELU-tanh
    c.head_dim = 32;
    c.query_pre_attn_scalar = 24;
    c.rope_theta = 1000000;
    c.rope_local_theta = 10000;
    c.rms_norm_eps = 1e-6;
    c.sliding_window = 16;  // shorter than the tests' sequences: the window is exercised
    c.sliding_layers = {1, 0};
  } else if (name == "tiny-gemma2") {  // Gemma 2 2B's traits: alternating layers, soft-capping
    ApplyFamily(**FindFamily("gemma2", "preset"), &c);  // tied, GELU-tanh, caps 50 / 30
    c.head_dim = 32;
    c.query_pre_attn_scalar = 24;
    c.rms_norm_eps = 1e-6;
    c.sliding_window = 16;
    c.sliding_layers = {1, 0};
    c.attn_softcap = 2;  // small enough to bend a tiny random model's scores and logits
    c.final_softcap = 1.5;
  } else if (name == "tiny-phi3") {  // Phi-3's traits: fused projections, Phi-4-mini's partial rotary
    ApplyFamily(**FindFamily("phi3", "preset"), &c);
    c.partial_rotary_factor = 0.75;
    c.sliding_window = 16;  // every layer's, shorter than the tests' sequences
  } else if (name == "tiny-tied") {
    c.tie_word_embeddings = true;
    c.num_layers = 3;
  } else if (name == "bench" || name == "bench16") {
    c.vocab_size = 2048;
    c.hidden_size = 256;
    c.intermediate_size = 688;
    c.num_layers = name == "bench" ? 4 : 16;  // bench16: deep enough that per-layer techniques show
    c.num_heads = 8;
    c.num_kv_heads = 4;
    c.head_dim = 32;
  } else {
    return Status::NotFound("unknown model preset '" + name +
                            "' (known: tiny-llama, tiny-qwen2, tiny-qwen3, tiny-gemma2, tiny-gemma3, "
                            "tiny-phi3, tiny-tied, bench, "
                            "bench16)");
  }
  return c;
}

namespace {
constexpr const char* kActivationNames[] = {"silu", "gelu_pytorch_tanh"};
}  // namespace

const char* ActivationName(Activation a) { return kActivationNames[static_cast<int>(a)]; }

StatusOr<Activation> ParseActivation(const std::string& name, const std::string& key) {
  for (int i = 0; i < static_cast<int>(std::size(kActivationNames)); ++i) {
    if (name == kActivationNames[i]) return static_cast<Activation>(i);
  }
  return Status::InvalidArgument(key + " '" + name +
                                 "' is not supported (supported: silu, gelu_pytorch_tanh)");
}

namespace {
// Per slot: its name in a family with separate projections and in one with fused ones ("": none).
struct ModuleRow {
  const char* name;
  const char* fused_name;
};
constexpr ModuleRow kModuleRows[kNumModules] = {{"q_proj", "qkv_proj"},
                                                {"k_proj", ""},
                                                {"v_proj", ""},
                                                {"o_proj", "o_proj"},
                                                {"gate_proj", "gate_up_proj"},
                                                {"up_proj", ""},
                                                {"down_proj", "down_proj"}};
bool IsAttention(ModuleKind m) { return static_cast<int>(m) <= static_cast<int>(ModuleKind::kO); }
}  // namespace

ModuleDims ModuleShape(const ModelConfig& c, ModuleKind m) {
  const int64_t D = c.hidden_size, I = c.intermediate_size;
  const int64_t fused = c.fused_projections ? 1 : 0;
  const ModuleDims dims[kNumModules] = {{D, c.q_dim() + fused * 2 * c.kv_dim()},
                                        {D, c.kv_dim()},
                                        {D, c.kv_dim()},
                                        {c.q_dim(), D},
                                        {D, I + fused * I},
                                        {D, I},
                                        {I, D}};
  if (*ModuleName(c, m) == '\0') return {};
  return dims[static_cast<int>(m)];
}

const char* ModuleName(const ModelConfig& c, ModuleKind m) {
  const ModuleRow& row = kModuleRows[static_cast<int>(m)];
  return c.fused_projections ? row.fused_name : row.name;
}

std::string ModulePath(const ModelConfig& c, ModuleKind m) {
  return std::string(IsAttention(m) ? "self_attn." : "mlp.") + ModuleName(c, m);
}

std::vector<std::string> ModuleNames(const ModelConfig& c) {
  std::vector<std::string> names;
  for (int i = 0; i < kNumModules; ++i) {
    const std::string slot = ModuleName(c, static_cast<ModuleKind>(i));
    if (!slot.empty()) names.push_back(slot);
  }
  return names;
}

StatusOr<ModuleKind> ParseModuleName(const ModelConfig& c, const std::string& name) {
  std::string known;
  for (int i = 0; i < kNumModules; ++i) {
    const std::string slot = ModuleName(c, static_cast<ModuleKind>(i));
    if (slot.empty()) continue;
    if (name == slot) return static_cast<ModuleKind>(i);
    known += (known.empty() ? "" : ", ") + slot;
  }
  return Status::InvalidArgument("module '" + name + "' is not a module of a " + c.model_type +
                                 " model (its modules: " + known + ", or " + kAllLinear + " for all)");
}

StatusOr<std::vector<std::string>> ResolveTargetModules(const ModelConfig& c,
                                                        const std::vector<std::string>& names) {
  if (names.size() == 1 && names[0] == kAllLinear) return ModuleNames(c);
  for (const std::string& name : names) FT_RETURN_IF_ERROR(ParseModuleName(c, name).status());
  return names;
}

std::vector<std::string> AllModuleNames() {
  std::vector<std::string> names;
  for (const ModuleRow& row : kModuleRows) names.emplace_back(row.name);
  for (const ModuleRow& row : kModuleRows) {
    if (*row.fused_name != '\0' && std::find(names.begin(), names.end(), row.fused_name) == names.end())
      names.emplace_back(row.fused_name);
  }
  return names;
}

Status CheckHeadDimForDevice(DeviceKind kind, int64_t head_dim) {
  if (kind == DeviceKind::kCpu || cuda::AttentionTakesHeadDim(head_dim)) return Status::OK();
  std::string takes;
  for (int64_t d : cuda::kAttentionHeadDims) takes += (takes.empty() ? "" : " or ") + std::to_string(d);
  return Status::InvalidArgument("head_dim " + std::to_string(head_dim) + ": the " + DeviceKindName(kind) +
                                 " attention kernels take head dim " + takes);
}

}  // namespace ft
