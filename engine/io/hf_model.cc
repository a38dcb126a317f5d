#include "engine/io/hf_model.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sstream>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/openmp_start.h"
#include "engine/io/json_members.h"
#include "engine/model/cuda_cost.h"
#include "engine/model/rng.h"

namespace ft {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// At most this much of a name taken from a file goes into an error message.
std::string Clip(const std::string& s) { return s.size() <= 200 ? s : s.substr(0, 200) + "..."; }

// OK when `shard` names a file inside the model directory: relative, no "..",
// no empty or "." components. (Lexical on purpose: Hugging Face's cache links
// each shard to ../../blobs/, so where a link leads is the allowed roots'
// business, checked at open time, not the index's.)
Status CheckShardName(const std::string& index, const std::string& tensor, const std::string& shard) {
  fs::path p(shard);
  bool ok = !shard.empty() && p.is_relative() && shard.find('\0') == std::string::npos && !p.has_root_name();
  for (const fs::path& part : p) ok = ok && !part.empty() && part != ".." && part != ".";
  if (ok) return Status::OK();
  return Status::InvalidArgument(index + ": weight_map['" + Clip(tensor) + "'] = '" + Clip(shard) +
                                 "': a shard must be a file name inside the model directory (no absolute "
                                 "path, no '..'); fix the index");
}

// The tensor -> shard map of model.safetensors.index.json, each shard name checked.
StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& index) {
  FT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index, kMaxConfigFileBytes));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return Status::InvalidArgument(index + ": needs a 'weight_map' object {tensor: shard file}");
  }
  // A tensor the map names twice (JSON keeps the last): which shard holds it is ambiguous.
  const std::optional<JsonMembers> members = ObjectMembers(text, {"weight_map"});
  if (auto repeated = members ? FindRepeatedKey(*members) : std::nullopt) {
    return Status::InvalidArgument(index + ": weight_map names tensor '" + Clip(repeated->key) + "' twice (" +
                                   Clip((*members)[repeated->first].second.dump()) + " and " +
                                   Clip((*members)[repeated->second].second.dump()) +
                                   "): which shard holds it is ambiguous; fix the index");
  }
  std::map<std::string, std::string> where;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it->is_string())
      return Status::InvalidArgument(index + ": weight_map['" + Clip(it.key()) + "'] must be a file name");
    FT_RETURN_IF_ERROR(CheckShardName(index, it.key(), it->get<std::string>()));
    where[it.key()] = it->get<std::string>();
  }
  return where;
}

}  // namespace

Status LoadHfWeights(const std::string& dir, Model* model) {
  // tensor name -> shard file
  std::map<std::string, std::string> where;
  std::vector<std::string> files;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const bool sharded = fs::exists(index);
  if (sharded) {
    FT_ASSIGN_OR_RETURN(where, ReadWeightMap(index.string()));
    std::set<std::string> unique;
    for (const auto& [tensor, shard] : where) unique.insert(shard);
    files.assign(unique.begin(), unique.end());
  } else {
    files.push_back("model.safetensors");
  }
  std::map<std::string, std::unique_ptr<SafetensorsFile>> opened;
  std::map<std::string, std::string> holder;  // tensor -> the shard file that holds it
  for (const auto& f : files) {
    const std::string path = (fs::path(dir) / f).string();
    FT_ASSIGN_OR_RETURN(opened[f], SafetensorsFile::Open(path));
    for (const auto& t : opened[f]->tensors()) {
      auto [it, fresh] = holder.emplace(t.name, f);
      if (!fresh) {
        return Status::InvalidArgument(index.string() + ": tensor '" + Clip(t.name) + "' is in two shards, " +
                                       it->second + " and " + f +
                                       ": which one to load is ambiguous; keep each tensor in one shard");
      }
    }
    if (!sharded) where = holder;
  }
  std::set<std::string> used;
  const auto set_every_weight = [&]() -> Status {
    for (NamedTensor& t : model->NamedWeights()) {
      auto it = where.find(t.name);
      if (it == where.end()) {
        return Status::NotFound((fs::path(dir) / files.front()).string() + ": tensor '" + t.name +
                                "' is missing (does config.json match these weights?)");
      }
      auto file_it = opened.find(it->second);
      if (file_it == opened.end())
        return Status::NotFound(index.string() + ": shard '" + it->second + "' not loaded");
      // One tensor in host floats, then set (its copy to the device runs while the next is read).
      std::vector<float> values(static_cast<size_t>(t.numel()));
      FT_RETURN_IF_ERROR(file_it->second->ReadFloat(t.name, t.shape, values.data()));
      model->SetWeight(t, values.data());
      used.insert(t.name);
    }
    return Status::OK();
  };
  // The load ends (its copies waited for, its staging freed) whether or not every tensor was set.
  const Status set = set_every_weight();
  const Status finished = model->FinishLoading();
  FT_RETURN_IF_ERROR(set);
  FT_RETURN_IF_ERROR(finished.WithContext(dir + ": copying the weights to " + model->backend().Describe()));
  for (const auto& [name, file] : where) {
    if (!used.count(name))
      FT_LOG(WARN) << dir << "/" << file << ": ignoring tensor '" << name << "' not used by the model";
  }
  return Status::OK();
}

StatusOr<std::vector<std::string>> HfWeightFiles(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index)) return std::vector<std::string>{(fs::path(dir) / "model.safetensors").string()};
  FT_ASSIGN_OR_RETURN(const auto where, ReadWeightMap(index.string()));
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : where) shards.insert((fs::path(dir) / shard).string());
  std::vector<std::string> files = {index.string()};
  files.insert(files.end(), shards.begin(), shards.end());
  return files;
}

Status CopyTokenizerFiles(const std::string& from_dir, const std::string& to_dir) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "tokenizer.model", "generation_config.json"}) {
    const fs::path from = fs::path(from_dir) / name;
    if (!fs::exists(from)) continue;
    auto text = ReadFileToString(from.string());
    if (!text.ok()) return text.status().WithContext("copying the tokenizer to " + to_dir);
    FT_RETURN_IF_ERROR(WriteFileDurably((fs::path(to_dir) / name).string(), *text));
  }
  return Status::OK();
}

namespace {

Status WriteHfConfig(const std::string& dir, ModelConfig c, DType dtype) {
  FT_RETURN_IF_ERROR(CreateDirectoriesConfined(dir));
  c.torch_dtype = dtype == DType::kBF16 ? "bfloat16" : dtype == DType::kF16 ? "float16" : "float32";
  return WriteFileDurably((fs::path(dir) / "config.json").string(), HfConfigJson(c));
}

Status WriteHfWeights(const std::string& dir, std::vector<TensorToWrite> tensors) {
  return WriteSafetensors((fs::path(dir) / "model.safetensors").string(), std::move(tensors),
                          {{"format", "pt"}},
                          /*sync=*/true);
}

float NormInitValue(const ModelConfig& c) { return c.gemma ? 0.0f : 1.0f; }

// Values [begin, begin + count) of weight number `index` of RandomInitModel's walk; norms are
// `norm_value` (1, or 0 for Gemma's (1 + w) norms, as HF initialises both).
void RandomWeightValues(const NamedTensor& t, uint64_t seed, uint64_t index, int64_t begin, int64_t count,
                        float norm_value, float* out) {
  const bool is_norm = t.name.find("norm") != std::string::npos;
  // Fan-in scaling keeps activations and logits O(1) at any width, so a
  // frozen random head still lets a tiny model learn (0.02 would not at width 64).
  const double stddev = 1.0 / std::sqrt(static_cast<double>(t.shape.back()));
  const bool is_bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
  // Counter-based: every element is a pure function of (seed, tensor, i), so the loop parallelises.
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 16))
#endif
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = begin + k;
    if (is_norm) {
      out[k] = norm_value;
    } else if (is_bias) {
      out[k] = 0.0f;
    } else {
      // Box-Muller from two counter-based uniforms.
      const double u1 = (static_cast<double>(HashKeys(seed, index, i, 1) >> 11) + 1.0) / 9007199254740993.0;
      const double u2 = static_cast<double>(HashKeys(seed, index, i, 2) >> 11) / 9007199254740992.0;
      out[k] =
          static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2));
    }
  }
}

}  // namespace

Status SaveHfModel(const std::string& dir, Model& model, DType dtype) {
  FT_RETURN_IF_ERROR(WriteHfConfig(dir, model.config(), dtype));
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<float>> host;  // the weights copied off the model's backend
  for (NamedTensor& t : model.NamedWeights()) {
    FT_ASSIGN_OR_RETURN(std::vector<float> values, model.WeightValues(t));
    host.push_back(std::move(values));
    tensors.push_back({t.name, t.shape, host.back().data(), dtype});
  }
  return WriteHfWeights(dir, std::move(tensors));
}

void RandomInitModel(Model* model, uint64_t seed) {
  uint64_t tensor_index = 0;
  for (NamedTensor& t : model->NamedWeights()) {
    std::vector<float> values(static_cast<size_t>(t.numel()));  // on the host, then uploaded or quantized
    RandomWeightValues(t, seed, tensor_index++, 0, t.numel(), NormInitValue(model->config()), values.data());
    model->SetWeight(t, values.data());
  }
  // No Status to return (tests, benchmarks): a backend failure crashes, as SetWeight's own waits did.
  FT_CHECK(model->FinishLoading().ok());
}

Status WriteRandomHfModel(const std::string& dir, const ModelConfig& config, DType dtype, uint64_t seed) {
  // The weights' names and shapes, RandomInitModel's walk, from a model on a backend that holds
  // nothing (address space reserved, never committed: engine/model/cuda_cost.h).
  ModelOptions options;
  options.backend = std::make_shared<CudaCostBackend>();
  Model shapes(config, options);
  FT_RETURN_IF_ERROR(WriteHfConfig(dir, config, dtype));
  std::vector<TensorToWrite> tensors;
  uint64_t tensor_index = 0;
  for (const NamedTensor& t : shapes.NamedWeights()) {
    const NamedTensor named{t.name, t.shape};
    tensors.push_back({t.name, t.shape, nullptr, dtype,
                       [named, seed, index = tensor_index++, norm = NormInitValue(config)](
                           int64_t begin, int64_t count, float* out) {
                         RandomWeightValues(named, seed, index, begin, count, norm, out);
                       }});
  }
  return WriteHfWeights(dir, std::move(tensors));
}

}  // namespace ft
