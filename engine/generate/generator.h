// Generation with a trained model, the engine of `ft-train generate`.
//
// LoadGenerationModel: a base HF model directory, with a PEFT adapter
// (ft-train's output.dir/adapter) or without (the base alone, or merged
// weights: output.dir/merged is a plain model directory), on the CPU or CUDA
// backend, in fp32 or bf16, with the base in NF4 when asked (what a QLoRA
// adapter trained on). The adapter's config must match the model (its own
// errors say which key).
//
// Generate: the prompt goes through Model::Decode once (filling the KV
// cache), then one token per call, each chosen by a Sampler, until an EOS id
// (the model's config.json and generation_config.json eos_token_id, and the
// tokenizer's eos_token), a stop string, or max_new_tokens. The text is the
// tokenizer's own decode of the new ids without special tokens (byte
// fallback and special tokens as HF decodes them); on_text receives it in
// pieces as soon as they are final: a piece is held back while it ends in an
// incomplete UTF-8 character (U+FFFD) or could be the start of a stop string.
// A stop string found in the text ends it there (the stop string excluded).
//
// Errors: InvalidArgument for an empty prompt, a prompt and max_new_tokens
// past the model's max_position_embeddings, or bad sampling options; the
// loaders' errors name the file.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/device_kind.h"
#include "common/status.h"
#include "engine/generate/sampler.h"
#include "engine/model/compute_dtype.h"
#include "engine/model/model.h"
#include "engine/text/tokenizer.h"

namespace ft {

struct GenerationModelOptions {
  std::string model_dir;    // HF model directory (config.json, safetensors, tokenizer.json)
  std::string adapter_dir;  // PEFT adapter directory; "" = none
  DeviceKind device = DeviceKind::kCpu;
  ComputeDType dtype = ComputeDType::kF32;
  bool nf4 = false;  // the base in NF4 with double quantization (QLoRA)
};

struct GenerationModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> eos_ids;  // sorted, unique
};

StatusOr<GenerationModel> LoadGenerationModel(const GenerationModelOptions& options);

struct PromptOptions {
  bool chat = false;                             // render as a user message through the chat template
  std::string system;                            // with chat: a system message first ("" = none)
  std::map<std::string, std::string> chat_vars;  // extra template variables (e.g. enable_thinking=false)
};

// The prompt's token ids: with chat, the rendering of [system,] user message
// with add_generation_prompt, encoded as apply_chat_template(tokenize=True)
// does (no post-processor); otherwise the text with the tokenizer's special
// tokens (e.g. Llama's BOS). InvalidArgument when chat is asked and the
// tokenizer has no chat template.
StatusOr<std::vector<int32_t>> PromptIds(const Tokenizer& tokenizer, const std::string& prompt,
                                         const PromptOptions& options);

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  std::vector<std::string> stop;  // stop strings (empty ones are ignored)
};

struct Generation {
  std::vector<int32_t> ids;  // the new tokens, an ending EOS included
  std::string text;          // their text (stop string and special tokens excluded)
  std::string finish;        // "eos" | "stop" | "length"
};

StatusOr<Generation> Generate(Model& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& eos_ids, const GenerateOptions& options,
                              const std::function<void(std::string_view)>& on_text = nullptr);

}  // namespace ft
