// The family table (engine/model/family.h).
#include "engine/model/family.h"

#include <functional>
#include <iterator>
#include <utility>

#include "engine/model/model_config.h"

namespace ft {

namespace {

constexpr std::string_view kMoe = "a mixture of experts (MoE), which the engine does not train";
constexpr std::string_view kVision =
    "a vision-language model (vision tower), which the engine does not train";

// Traits as the published HF modeling code of each family has them (transformers 4.5x):
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM,
// Gemma3ForCausalLM, Phi3ForCausalLM (Phi-3 and Phi-4).
constexpr FamilyTraits kFamilies[] = {
    {.model_type = "llama", .architecture = "LlamaForCausalLM"},
    {.model_type = "mistral", .architecture = "MistralForCausalLM", .sliding_window_default = true},
    {.model_type = "qwen2",
     .architecture = "Qwen2ForCausalLM",
     .qkv_bias = true,
     .attention_bias_key = false,
     .use_sliding_window_key = true,
     .max_window_layers_key = true},
    {.model_type = "qwen3",
     .architecture = "Qwen3ForCausalLM",
     .qk_norm = true,
     .use_sliding_window_key = true,
     .max_window_layers_key = true},
    // Gemma2ForCausalLM: soft-capped scores and logits, sliding and full layers alternating.
    {.model_type = "gemma2",
     .architecture = "Gemma2ForCausalLM",
     .sliding_window_default = true,
     .gemma = true,
     .sliding_pattern_default = 2,
     .attn_softcap_default = 50,
     .final_softcap_default = 30,
     .activation_default = Activation::kGeluTanh,
     .tie_default = true},
    // Gemma3ForCausalLM: sliding_window applies to its sliding layers (no use_sliding_window key).
    {.model_type = "gemma3_text",
     .architecture = "Gemma3ForCausalLM",
     .qk_norm = true,
     .sliding_window_default = true,
     .gemma = true,
     .sliding_pattern_default = 6,
     .rope_local_default = 10000,
     .activation_default = Activation::kGeluTanh,
     .tie_default = true},
    // Phi3ForCausalLM (Phi-3, Phi-4): fused projections; sliding_window on every layer when set.
    {.model_type = "phi3",
     .architecture = "Phi3ForCausalLM",
     .sliding_window_default = true,
     .fused_projections = true},
    // Known, not trainable: each says why.
    {.model_type = "mixtral", .refused = kMoe},
    {.model_type = "qwen2_moe", .refused = kMoe},
    {.model_type = "qwen3_moe", .refused = kMoe},
    {.model_type = "deepseek_v3", .refused = kMoe},
    {.model_type = "llava", .refused = kVision},
    {.model_type = "mllama", .refused = kVision},
    {.model_type = "qwen2_vl", .refused = kVision},
    {.model_type = "qwen2_5_vl", .refused = kVision},
    {.model_type = "gemma3",
     .refused = "Gemma 3 with its vision tower (Gemma3ForConditionalGeneration), which the engine does not "
                "train; its text model (Gemma3ForCausalLM, model_type gemma3_text) trains"},
};

// Keys that make a config a model the engine cannot train whatever its model_type says
// (a vision tower or experts on a dense family's config), and what they mean.
constexpr std::pair<std::string_view, std::string_view> kRefusedKeys[] = {
    {"vision_config", "a vision tower"},
    {"num_experts", "a mixture of experts (MoE)"},
    {"num_local_experts", "a mixture of experts (MoE)"},
    {"n_routed_experts", "a mixture of experts (MoE)"},
};

}  // namespace

std::string RefusedKey(const std::function<std::string(std::string_view)>& value_of) {
  for (const auto& [key, what] : kRefusedKeys) {
    const std::string value = value_of(key);
    if (value.empty() || value == "null" || value == "0" || value == "{}") continue;
    return "'" + std::string(key) + "' (" + value + ") makes it " + std::string(what) +
           ", which the engine does not train";
  }
  return "";
}

void ApplyFamily(const FamilyTraits& family, ModelConfig* c) {
  c->model_type = std::string(family.model_type);
  c->qk_norm = family.qk_norm;
  c->gemma = family.gemma;
  c->attention_bias = family.qkv_bias;
  c->hidden_act = family.activation_default;
  c->tie_word_embeddings = family.tie_default;
  c->rope_local_theta = family.rope_local_default;
  c->attn_softcap = family.attn_softcap_default;
  c->final_softcap = family.final_softcap_default;
  c->fused_projections = family.fused_projections;
}

std::string SupportedFamilies() {
  std::string out;
  for (const FamilyTraits& f : kFamilies) {
    if (!f.refused.empty()) continue;
    out += (out.empty() ? "" : ", ") + std::string(f.model_type);
  }
  return out;
}

StatusOr<const FamilyTraits*> FindFamily(std::string_view model_type, const std::string& file) {
  for (const FamilyTraits& f : kFamilies) {
    if (f.model_type != model_type) continue;
    if (!f.refused.empty()) {
      return Status::InvalidArgument(file + ": model_type '" + std::string(model_type) + "' is " +
                                     std::string(f.refused) + " (supported: " + SupportedFamilies() + ")");
    }
    return &f;
  }
  return Status::InvalidArgument(file + ": model_type '" + std::string(model_type) +
                                 "' is not supported (supported: " + SupportedFamilies() + ")");
}

}  // namespace ft
