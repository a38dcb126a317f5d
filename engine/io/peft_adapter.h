// PEFT LoRA adapter directories: adapter_config.json + adapter_model.safetensors,
// exactly as Hugging Face PEFT saves and loads them (keys like
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight, A [r, in],
// B [out, r], F32).
#pragma once

#include <string>

#include "common/status.h"
#include "engine/model/model.h"

namespace ft {

// Writes the model's adapters to `dir` (created if needed; files fsynced).
// `base_model` is recorded as base_model_name_or_path.
Status SavePeftAdapter(const std::string& dir, Model& model, const std::string& base_model);

// adapter_config.json text for `spec` (PEFT's LoraConfig fields).
std::string PeftAdapterConfigJson(const LoraSpec& spec, const std::string& base_model);

// Reads adapter_config.json of `dir` into a LoraSpec (r, lora_alpha,
// lora_dropout, use_rslora, target_modules).
StatusOr<LoraSpec> ReadPeftAdapterConfig(const std::string& dir);

// Loads A/B of every adapter of `model` from `dir`. The adapter's r, alpha and
// targets must equal the model's LoRA setup (InvalidArgument naming the field
// otherwise); every tensor must be present with the right shape.
Status LoadPeftAdapter(const std::string& dir, Model* model);

}  // namespace ft
