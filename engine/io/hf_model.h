// Hugging Face model directories: config.json (engine/job/hf_config.h) + model.safetensors (or a
// sharded model.safetensors.index.json), read into and written from a Model.
//
// Errors name the file and the field or tensor, e.g.
//   /models/x/config.json: missing required key 'hidden_size'
//   /models/x/model.safetensors: tensor 'model.norm.weight' has shape [32] but the model config needs [64]
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "engine/io/safetensors.h"
#include "engine/job/hf_config.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"

namespace ft {

// Fills every base weight of `model` from <dir>/model.safetensors or the
// shards listed in <dir>/model.safetensors.index.json. Every weight must be
// present with the right shape; dtypes F32/F16/BF16/F64 are converted.
// InvalidArgument naming the index and the tensor when the index names a
// tensor twice or two shards hold the same tensor (ambiguous: JSON and a
// name map would keep one silently). The load is finished when it returns
// (Model::FinishLoading), with an error too: the backend's failure, if any,
// with the directory as context.
Status LoadHfWeights(const std::string& dir, Model* model);

// The files LoadHfWeights reads from `dir`: model.safetensors, or
// model.safetensors.index.json and the shards it names. Errors as
// LoadHfWeights' for a bad index.
StatusOr<std::vector<std::string>> HfWeightFiles(const std::string& dir);

// Writes <dir>/config.json and <dir>/model.safetensors (tensors stored as
// `dtype`: F32, BF16 or F16). Creates `dir` if needed.
Status SaveHfModel(const std::string& dir, Model& model, DType dtype);

// Copies the tokenizer and generation files of a model directory
// (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// tokenizer.model, generation_config.json), those present, into `to_dir`, so a
// model written from it (merged weights) is complete. IOError naming the file.
Status CopyTokenizerFiles(const std::string& from_dir, const std::string& to_dir);

// Random weights (seeded, deterministic): linears and embeddings
// N(0, 1/fan_in) (fan_in = the last dimension), norms 1, biases 0. Ends the
// load (Model::FinishLoading; a backend failure there crashes).
void RandomInitModel(Model* model, uint64_t seed);

// The HF model directory RandomInitModel then SaveHfModel would write for
// `config` (the same bytes), written without a model: each tensor is made and
// encoded a chunk at a time as it is written (safetensors.h's fill), so its
// memory is a few chunks whatever the model's size, the 8B shape included
// (`ft-train make-model`). IOError naming the file on failure.
Status WriteRandomHfModel(const std::string& dir, const ModelConfig& config, DType dtype, uint64_t seed);

}  // namespace ft
