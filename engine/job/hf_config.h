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

// Parses config.json text (named `file` in errors). Supports model_type llama,
// mistral and qwen2 (q/k/v bias), rope_scaling types linear and llama3.
StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& file);
// Reads <dir>/config.json (bounded: no FIFO, no /dev/zero).
StatusOr<ModelConfig> ReadHfConfig(const std::string& dir);
// config.json text for `config` (what HF's from_pretrained expects).
std::string HfConfigJson(const ModelConfig& config);

}  // namespace ft
