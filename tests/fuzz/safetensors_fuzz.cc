// A .safetensors file (header length, JSON header, tensor table, data area):
// opened, validated, and every small tensor read as float
// (engine/io/safetensors.h). A file that opens names each tensor once and
// gives each its own bytes inside the data area (no range shared with
// another, none past the end), whatever the input. An input that mentions "weight_map" is also
// model.safetensors.index.json of a tiny model directory (engine/io/hf_model.h):
// a weight map that loads must have named only shards inside that directory
// (no absolute path, no ".."), whatever the input.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "engine/io/hf_model.h"
#include "engine/io/safetensors.h"
#include "tests/fuzz/fuzz.h"

namespace {

namespace fs = std::filesystem;

// A tiny model directory in the scratch area, written once.
const std::string& IndexModelDir() {
  static const std::string dir = [] {
    const std::string d =
        (fs::path(ft::fuzz::ScratchFile("unused", "")).parent_path() / "index-model").string();
    ft::Model model(*ft::PresetModelConfig("tiny-llama"), {});
    ft::RandomInitModel(&model, 1);
    if (!ft::SaveHfModel(d, model, ft::DType::kF32).ok()) std::abort();
    return d;
  }();
  return dir;
}

void FuzzIndex(std::string_view text) {
  const std::string& dir = IndexModelDir();
  ft::fuzz::ScratchFile("index-model/model.safetensors.index.json", text);
  ft::Model model(*ft::ReadHfConfig(dir), {});
  if (!ft::LoadHfWeights(dir, &model).ok()) return;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  for (const auto& shard : j.at("weight_map")) {
    const fs::path p(shard.get<std::string>());
    if (p.is_absolute()) std::abort();  // loaded a shard outside the model directory
    for (const fs::path& part : p) {
      if (part == "..") std::abort();
    }
  }
}

// Aborts unless every tensor of `file` has a name of its own and bytes of its own.
void CheckTensorsAreDistinct(const ft::SafetensorsFile& file) {
  std::set<std::string> names;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const ft::TensorInfo& t : file.tensors()) {
    if (!names.insert(t.name).second) std::abort();  // a name twice: one of them would be lost
    if (t.end > t.begin) ranges.emplace_back(t.begin, t.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) std::abort();  // two tensors over the same bytes
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = ft::fuzz::AsText(data, size);
  if (text.find("weight_map") != std::string_view::npos) FuzzIndex(text);
  const std::string path = ft::fuzz::ScratchFile("model.safetensors", text);
  auto file = ft::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  CheckTensorsAreDistinct(**file);
  std::vector<float> out;
  for (const ft::TensorInfo& t : (*file)->tensors()) {
    if (t.numel() < 0 || t.numel() > (int64_t{1} << 16)) continue;
    out.resize(static_cast<size_t>(t.numel()) + 1);
    (void)(*file)->ReadFloat(t.name, t.shape, out.data());
  }
  return 0;
}
