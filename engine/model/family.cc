// The family table (engine/model/family.h).
#include "engine/model/family.h"

#include <iterator>

namespace ft {

namespace {

// Traits as the published HF modeling code of each family has them (transformers 4.5x):
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.
constexpr FamilyTraits kFamilies[] = {
    {.model_type = "llama", .architecture = "LlamaForCausalLM"},
    {.model_type = "mistral", .architecture = "MistralForCausalLM", .sliding_window_default = true},
    {.model_type = "qwen2",
     .architecture = "Qwen2ForCausalLM",
     .qkv_bias = true,
     .attention_bias_key = false,
     .use_sliding_window_key = true},
    {.model_type = "qwen3",
     .architecture = "Qwen3ForCausalLM",
     .qk_norm = true,
     .use_sliding_window_key = true},
    // Known, not trainable: each says why and what to use instead.
    {.model_type = "mixtral", .refused = "a mixture of experts (MoE), which the engine does not train"},
    {.model_type = "qwen2_moe", .refused = "a mixture of experts (MoE), which the engine does not train"},
    {.model_type = "qwen3_moe", .refused = "a mixture of experts (MoE), which the engine does not train"},
    {.model_type = "llava",
     .refused = "a vision-language model (vision tower), which the engine does not train"},
};

}  // namespace

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
