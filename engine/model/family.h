// Decoder families as data: one row per Hugging Face model_type, of the
// architecture traits the model code, config.json's reader and writer read.
// A new dense family is a new row (and its golden test), not a branch in the
// model: code asks ModelConfig for a trait (qk_norm, attention_bias, ...),
// which the row sets when config.json is read, never for the model_type.
//
// Families that are known but cannot be trained (mixtures of experts, vision
// towers) have a row too, with the reason: FindFamily refuses them by name.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "engine/model/activation.h"

namespace ft {

struct FamilyTraits {
  std::string_view model_type;    // config.json "model_type"
  std::string_view architecture;  // config.json "architectures"[0] as HF writes it
  // q/k/v projections carry biases unless config.json's attention_bias says otherwise (Qwen2).
  bool qkv_bias = false;
  // config.json has an attention_bias key (Qwen2's has none: its biases are implied).
  bool attention_bias_key = true;
  // Per-head RMSNorm of q and k (weights [head_dim]: self_attn.q_norm / k_norm) after the
  // projections and before RoPE (Qwen3).
  bool qk_norm = false;
  // use_sliding_window when config.json does not say (Mistral applies sliding_window unless told).
  bool sliding_window_default = false;
  // config.json has a use_sliding_window key (Qwen2, Qwen3).
  bool use_sliding_window_key = false;
  // Gemma: every RMSNorm is zero-centred, x̂ · (1 + w); each layer has sandwich norms
  // (post_attention_layernorm on the attention's output, pre_ and post_feedforward_layernorm
  // around the MLP); the embeddings are scaled by √hidden_size; the attention's scale comes
  // from query_pre_attn_scalar; sliding layers (layer_types or sliding_window_pattern) use
  // rope_local_base_freq; config.json spells the activation hidden_activation.
  bool gemma = false;
  // Gemma: without layer_types, every n-th layer is full and the others sliding (HF's
  // sliding_window_pattern default: Gemma 3's 6; Gemma 2 alternates, 2). 0: no pattern.
  int sliding_pattern_default = 0;
  // Gemma: config.json's rope_local_base_freq (the sliding layers' RoPE base) and its default;
  // 0: the family has no such key (Gemma 2's sliding layers share rope_theta).
  double rope_local_default = 0;
  // Gemma: attn_logit_softcapping / final_logit_softcapping when config.json does not say
  // (Gemma 2: 50 and 30; Gemma 3: none). Read for every Gemma family.
  double attn_softcap_default = 0;
  double final_softcap_default = 0;
  // Qwen: with use_sliding_window, layers from max_window_layers on slide (when config.json
  // has no layer_types); the default is Qwen2Config's.
  bool max_window_layers_key = false;
  // Phi-3: q/k/v and gate/up are fused linears, self_attn.qkv_proj and mlp.gate_up_proj
  // (ModelConfig::fused_projections); config.json may set partial_rotary_factor.
  bool fused_projections = false;
  // The gate activation and tie_word_embeddings when config.json does not say.
  Activation activation_default = Activation::kSilu;
  bool tie_default = false;
  // Non-empty: a family the engine cannot train, and why (named with the key in the error).
  std::string_view refused;
};

// The row of `model_type`; InvalidArgument naming `file`, the key and value and the
// supported families for an unknown one, and the reason for a refused one.
StatusOr<const FamilyTraits*> FindFamily(std::string_view model_type, const std::string& file);
struct ModelConfig;
// Sets `c`'s model_type, its fixed traits (qk_norm, gemma) and the defaults config.json may
// override (attention_bias, hidden_act, tie_word_embeddings) from `family`: what a config of that
// family starts from, read or preset.
void ApplyFamily(const FamilyTraits& family, ModelConfig* c);
// "llama, mistral, qwen2, qwen3, gemma3_text": the families the engine trains.
std::string SupportedFamilies();
// Empty, or why a config cannot be trained whatever its model_type: a key that adds a vision
// tower or experts ("'num_experts' (8) makes it a mixture of experts (MoE), ..."). `value_of`
// gives a key's JSON text ("" when absent); null, 0 and {} count as absent.
std::string RefusedKey(const std::function<std::string(std::string_view)>& value_of);

}  // namespace ft
