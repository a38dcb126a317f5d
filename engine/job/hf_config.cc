#include "engine/job/hf_config.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "engine/model/family.h"

namespace ft {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reads key as T into *out; missing keeps *out unless required.
template <typename T>
Status GetKey(const json& j, const std::string& key, const std::string& file, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return Status::InvalidArgument(file + ": missing required key '" + key + "'");
    return Status::OK();
  }
  bool type_ok = std::is_same_v<T, bool>       ? it->is_boolean()
                 : std::is_integral_v<T>       ? it->is_number_integer()
                 : std::is_floating_point_v<T> ? it->is_number()
                                               : it->is_string();
  if (!type_ok)
    return Status::InvalidArgument(file + ": key '" + key + "' has the wrong type (" + it->dump() + ")");
  *out = it->get<T>();
  return Status::OK();
}

// A number key that may be null for "none": *out = 0 then; absent keeps *out.
Status GetOptionalNumber(const json& j, const std::string& key, const std::string& file, double* out) {
  if (auto it = j.find(key); it != j.end() && it->is_null()) {
    *out = 0;
    return Status::OK();
  }
  return GetKey(j, key, file, out, false);
}

// Which layers slide (ModelConfig::sliding_layers), for every family: layer_types when
// config.json has it (newer transformers write it), else the family's older spelling: Gemma's
// sliding_window_pattern (every n-th layer full) or Qwen's max_window_layers (layers from it
// on slide, with use_sliding_window). Left empty (every layer alike) otherwise.
Status ParseLayerTypes(const json& j, const FamilyTraits& family, const std::string& file, bool use_sliding,
                       ModelConfig* c) {
  // A layer count out of Validate's range is refused there, before anything is sized by it.
  if (c->num_layers < 1 || c->num_layers > kMaxNumLayers) return Status::OK();
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c->num_layers) {
      return Status::InvalidArgument(file + ": 'layer_types' must list num_hidden_layers (" +
                                     std::to_string(c->num_layers) + ") attention types");
    }
    c->sliding_layers.assign(static_cast<size_t>(c->num_layers), 0);
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string type = (*it)[i].is_string() ? (*it)[i].get<std::string>() : (*it)[i].dump();
      if (type != "sliding_attention" && type != "full_attention") {
        return Status::InvalidArgument(file + ": layer_types[" + std::to_string(i) + "] '" + type +
                                       "' is not sliding_attention or full_attention");
      }
      c->sliding_layers[i] = type == "sliding_attention";
    }
    return Status::OK();
  }
  if (family.sliding_pattern_default > 0) {
    int64_t pattern = family.sliding_pattern_default;
    FT_RETURN_IF_ERROR(GetKey(j, "sliding_window_pattern", file, &pattern, false));
    if (pattern <= 0) {
      return Status::InvalidArgument(file + ": 'sliding_window_pattern' must be positive, got " +
                                     std::to_string(pattern));
    }
    c->sliding_layers.assign(static_cast<size_t>(c->num_layers), 0);
    for (int64_t i = 0; i < c->num_layers; ++i) c->sliding_layers[i] = (i + 1) % pattern != 0;
  } else if (family.max_window_layers_key && use_sliding) {
    int64_t first = 28;  // Qwen2Config's default
    FT_RETURN_IF_ERROR(GetKey(j, "max_window_layers", file, &first, false));
    if (first < 0) {
      return Status::InvalidArgument(file + ": 'max_window_layers' must be >= 0, got " +
                                     std::to_string(first));
    }
    if (first == 0) return Status::OK();  // every layer slides: left empty, ModelConfig's "all alike"
    c->sliding_layers.assign(static_cast<size_t>(c->num_layers), 0);
    for (int64_t i = 0; i < c->num_layers; ++i) c->sliding_layers[i] = i >= first;
  }
  return Status::OK();
}

// Gemma's keys (FamilyTraits::gemma), with HF's config defaults: the attention's scale, the
// sliding layers' RoPE base (Gemma 3) and soft-capping (null: none).
Status ParseGemmaKeys(const json& j, const FamilyTraits& family, const std::string& file, ModelConfig* c) {
  c->query_pre_attn_scalar = 256;
  FT_RETURN_IF_ERROR(GetKey(j, "query_pre_attn_scalar", file, &c->query_pre_attn_scalar, false));
  if (family.rope_local_default > 0)
    FT_RETURN_IF_ERROR(GetKey(j, "rope_local_base_freq", file, &c->rope_local_theta, false));
  FT_RETURN_IF_ERROR(GetOptionalNumber(j, "attn_logit_softcapping", file, &c->attn_softcap));
  return GetOptionalNumber(j, "final_logit_softcapping", file, &c->final_softcap);
}

// The smallest n with sliding_layers[i] == ((i + 1) % n != 0) for every layer (HF's older
// sliding_window_pattern), or 0 when none gives them.
int64_t SlidingPattern(const ModelConfig& c) {
  for (int64_t n = 1; n <= c.num_layers + 1; ++n) {
    bool fits = true;
    for (int64_t i = 0; i < c.num_layers && fits; ++i)
      fits = (c.sliding_layers[i] != 0) == ((i + 1) % n != 0);
    if (fits) return n;
  }
  return 0;
}

// The first sliding layer when every layer from it on slides and none before it (Qwen's
// max_window_layers; 0 when every layer slides), or -1 when the layers are not of that shape.
int64_t FirstOfSlidingSuffix(const ModelConfig& c) {
  if (c.sliding_layers.empty()) return 0;
  int64_t first = c.num_layers;
  while (first > 0 && c.SlidingLayer(first - 1)) --first;
  for (int64_t i = 0; i < first; ++i) {
    if (c.SlidingLayer(i)) return -1;
  }
  return first;
}

}  // namespace

StatusOr<ModelConfig> ParseHfConfig(const std::string& text, const std::string& file) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(file + ": not a JSON object");
  ModelConfig c;
  FT_RETURN_IF_ERROR(GetKey(j, "model_type", file, &c.model_type, true));
  FT_ASSIGN_OR_RETURN(const FamilyTraits* family, FindFamily(c.model_type, file));
  if (const std::string why = RefusedKey([&](std::string_view key) {
        auto it = j.find(std::string(key));
        return it == j.end() ? std::string() : it->dump();
      });
      !why.empty()) {
    return Status::InvalidArgument(file + ": " + why + " (model_type '" + c.model_type + "')");
  }
  ApplyFamily(*family, &c);
  FT_RETURN_IF_ERROR(GetKey(j, "vocab_size", file, &c.vocab_size, true));
  FT_RETURN_IF_ERROR(GetKey(j, "hidden_size", file, &c.hidden_size, true));
  FT_RETURN_IF_ERROR(GetKey(j, "intermediate_size", file, &c.intermediate_size, true));
  FT_RETURN_IF_ERROR(GetKey(j, "num_hidden_layers", file, &c.num_layers, true));
  FT_RETURN_IF_ERROR(GetKey(j, "num_attention_heads", file, &c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  FT_RETURN_IF_ERROR(GetKey(j, "num_key_value_heads", file, &c.num_kv_heads, false));
  c.head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  FT_RETURN_IF_ERROR(GetKey(j, "head_dim", file, &c.head_dim, false));
  FT_RETURN_IF_ERROR(GetKey(j, "max_position_embeddings", file, &c.max_position_embeddings, false));
  c.max_position_embeddings_unset =
      !j.contains("max_position_embeddings") || j["max_position_embeddings"].is_null();
  FT_RETURN_IF_ERROR(GetKey(j, "rms_norm_eps", file, &c.rms_norm_eps, false));
  FT_RETURN_IF_ERROR(GetKey(j, "rope_theta", file, &c.rope_theta, false));
  FT_RETURN_IF_ERROR(GetKey(j, "partial_rotary_factor", file, &c.partial_rotary_factor, false));
  FT_RETURN_IF_ERROR(GetKey(j, "tie_word_embeddings", file, &c.tie_word_embeddings, false));
  FT_RETURN_IF_ERROR(GetKey(j, "torch_dtype", file, &c.torch_dtype, false));
  FT_RETURN_IF_ERROR(GetKey(j, "bos_token_id", file, &c.bos_token_id, false));
  FT_RETURN_IF_ERROR(GetKey(j, "pad_token_id", file, &c.pad_token_id, false));
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
    if (!j["eos_token_id"].empty()) c.eos_token_id = j["eos_token_id"][0].get<int64_t>();
  } else {
    FT_RETURN_IF_ERROR(GetKey(j, "eos_token_id", file, &c.eos_token_id, false));
  }
  FT_RETURN_IF_ERROR(GetKey(j, "attention_bias", file, &c.attention_bias, false));
  bool mlp_bias = false;
  FT_RETURN_IF_ERROR(GetKey(j, "mlp_bias", file, &mlp_bias, false));
  if (mlp_bias) return Status::InvalidArgument(file + ": mlp_bias: true is not supported");
  // Gemma spells it hidden_activation (HF's Gemma configs read that one first).
  std::string act = ActivationName(c.hidden_act), act_key = "hidden_act";
  FT_RETURN_IF_ERROR(GetKey(j, "hidden_act", file, &act, false));
  if (j.contains("hidden_activation") && !j["hidden_activation"].is_null()) act_key = "hidden_activation";
  FT_RETURN_IF_ERROR(GetKey(j, "hidden_activation", file, &act, false));
  auto parsed_act = ParseActivation(act, act_key);
  if (!parsed_act.ok())
    return Status::InvalidArgument(file + ": " + std::string(parsed_act.status().message()));
  c.hidden_act = *parsed_act;
  bool use_sliding = family->sliding_window_default;
  FT_RETURN_IF_ERROR(GetKey(j, "use_sliding_window", file, &use_sliding, false));
  if (family->gemma) {
    c.sliding_window = 4096;  // Gemma2Config's and Gemma3TextConfig's default
    FT_RETURN_IF_ERROR(ParseGemmaKeys(j, *family, file, &c));
  }
  if (use_sliding) FT_RETURN_IF_ERROR(GetKey(j, "sliding_window", file, &c.sliding_window, false));
  FT_RETURN_IF_ERROR(ParseLayerTypes(j, *family, file, use_sliding, &c));
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Status::InvalidArgument(file + ": rope_scaling must be an object or null");
    const std::string where = file + " rope_scaling";
    std::string type;
    FT_RETURN_IF_ERROR(GetKey(*it, "type", where, &type, false));
    FT_RETURN_IF_ERROR(GetKey(*it, "rope_type", where, &type, false));
    if (type == "llama3") {
      FT_RETURN_IF_ERROR(GetKey(*it, "factor", where, &c.rope_scaling.factor, true));
      FT_RETURN_IF_ERROR(GetKey(*it, "low_freq_factor", where, &c.rope_scaling.low_freq_factor, true));
      FT_RETURN_IF_ERROR(GetKey(*it, "high_freq_factor", where, &c.rope_scaling.high_freq_factor, true));
      FT_RETURN_IF_ERROR(GetKey(*it, "original_max_position_embeddings", where,
                                &c.rope_scaling.original_max_position_embeddings, true));
    } else if (type == "linear") {
      FT_RETURN_IF_ERROR(GetKey(*it, "factor", where, &c.rope_scaling.factor, true));
    } else if (type != "default" && !type.empty()) {
      return Status::InvalidArgument(file + ": rope_scaling type '" + type +
                                     "' is not supported (supported: linear, llama3)");
    }
    c.rope_scaling.type = type == "default" ? "" : type;
  }
  FT_RETURN_IF_ERROR(c.Validate(file));
  return c;
}

StatusOr<ModelConfig> ReadHfConfig(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  FT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file, kMaxConfigFileBytes));
  return ParseHfConfig(text, file);
}

std::string HfConfigJson(const ModelConfig& c) {
  auto found = FindFamily(c.model_type, "config");
  FT_CHECK(found.ok());  // ModelConfig::Validate: every model_type is a trainable row
  const FamilyTraits& family = **found;
  json j;
  j["architectures"] = {std::string(family.architecture)};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = c.partial_rotary_factor;
  if (c.rope_scaling.type == "llama3") {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  } else if (c.rope_scaling.type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (family.attention_bias_key) j["attention_bias"] = c.attention_bias;
  if (family.use_sliding_window_key) j["use_sliding_window"] = c.sliding_window > 0;
  j[family.gemma ? "hidden_activation" : "hidden_act"] = ActivationName(c.hidden_act);
  auto or_null = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  if (family.gemma) {
    j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
    if (family.rope_local_default > 0) j["rope_local_base_freq"] = c.rope_local_theta;
    j["attn_logit_softcapping"] = or_null(c.attn_softcap);
    j["final_logit_softcapping"] = or_null(c.final_softcap);
  }
  if (!c.sliding_layers.empty()) {
    json types = json::array();
    for (int64_t i = 0; i < c.num_layers; ++i)
      types.push_back(c.SlidingLayer(i) ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;  // newer transformers read these; older ones the family's own key
    const int64_t pattern = family.sliding_pattern_default > 0 ? SlidingPattern(c) : 0;
    if (pattern > 0) j["sliding_window_pattern"] = pattern;
  }
  if (family.max_window_layers_key && c.sliding_window > 0) {
    if (const int64_t first = FirstOfSlidingSuffix(c); first >= 0) j["max_window_layers"] = first;
  }
  j["torch_dtype"] = c.torch_dtype;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  return j.dump(2) + "\n";
}

}  // namespace ft
