// A Hugging Face model's config.json: the model's shape, which is all the
// planner, ftd's placement and ftctl need to know about a model (no weights).
//
// Errors name the file and the field, e.g.
//   /models/x/config.json: missing required key 'hidden_size'
#pragma once

#include <string>

#include "common/status.h"
#include "engine/model/model_config.h"

namespace ft {

// Parses config.json text (named `file` in errors). Supports the model_types of
// engine/model/family.h (llama, mistral, qwen2 with q/k/v bias, qwen3 with
// q/k norms), rope_scaling types linear and llama3; a known family the engine
// cannot train (a mixture of experts, a vision tower) is refused saying so.
StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& file);
// Reads <dir>/config.json (bounded: no FIFO, no /dev/zero).
StatusOr<ModelConfig> ReadHfConfig(const std::string& dir);
// config.json text for `config` (what HF's from_pretrained expects).
std::string HfConfigJson(const ModelConfig& config);

}  // namespace ft
