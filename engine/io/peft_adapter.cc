#include "engine/io/peft_adapter.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "engine/io/safetensors.h"

namespace ft {

namespace fs = std::filesystem;

std::string PeftAdapterConfigJson(const LoraSpec& spec, const std::string& base_model) {
  nlohmann::ordered_json cfg = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", spec.r},
      {"lora_alpha", spec.alpha},
      {"lora_dropout", spec.dropout},
      {"target_modules", spec.target_modules},
      {"use_rslora", spec.rslora},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"revision", nullptr},
  };
  return cfg.dump(2) + "\n";
}

Status SavePeftAdapter(const std::string& dir, Model& model, const std::string& base_model) {
  const LoraSpec* spec = model.lora_spec();
  if (!spec) return Status::FailedPrecondition("model has no LoRA adapters to save");
  FT_RETURN_IF_ERROR(CreateDirectoriesConfined(dir));
  FT_RETURN_IF_ERROR(WriteFileDurably((fs::path(dir) / "adapter_config.json").string(),
                                      PeftAdapterConfigJson(*spec, base_model)));
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<float>> host;  // the adapters copied off the model's backend
  for (const TrainableParam& p : model.TrainableParams()) {
    host.push_back(model.Download(p.data, p.numel));
    tensors.push_back({p.name, p.shape, host.back().data(), DType::kF32});
  }
  return WriteSafetensors((fs::path(dir) / "adapter_model.safetensors").string(), std::move(tensors),
                          {{"format", "pt"}}, /*sync=*/true);
}

StatusOr<LoraSpec> ReadPeftAdapterConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  FT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(path + ": not a JSON object");
  if (j.value("peft_type", "") != "LORA")
    return Status::InvalidArgument(path + ": peft_type must be \"LORA\"");
  LoraSpec spec;
  if (!j.contains("r") || !j["r"].is_number_integer())
    return Status::InvalidArgument(path + ": 'r' must be an integer");
  spec.r = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) {
    return Status::InvalidArgument(path + ": 'lora_alpha' must be a number");
  }
  spec.alpha = j["lora_alpha"].get<double>();
  spec.dropout = j.value("lora_dropout", 0.0);
  spec.rslora = j.value("use_rslora", false);
  if (!j.contains("target_modules") || !j["target_modules"].is_array()) {
    return Status::InvalidArgument(path + ": 'target_modules' must be a list of module names");
  }
  for (const auto& t : j["target_modules"]) spec.target_modules.push_back(t.get<std::string>());
  return spec;
}

Status LoadPeftAdapter(const std::string& dir, Model* model) {
  FT_ASSIGN_OR_RETURN(LoraSpec saved, ReadPeftAdapterConfig(dir));
  const LoraSpec* spec = model->lora_spec();
  if (!spec) return Status::FailedPrecondition("model has no LoRA adapters to load into");
  const std::string cfg = (fs::path(dir) / "adapter_config.json").string();
  if (saved.r != spec->r) {
    return Status::InvalidArgument(cfg + ": r is " + std::to_string(saved.r) +
                                   " but the job's adapter.r is " + std::to_string(spec->r));
  }
  if (saved.alpha != spec->alpha || saved.rslora != spec->rslora) {
    return Status::InvalidArgument(cfg +
                                   ": lora_alpha/use_rslora differ from the job's adapter.alpha/rslora");
  }
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  if (sorted(saved.target_modules) != sorted(spec->target_modules)) {
    return Status::InvalidArgument(cfg + ": target_modules differ from the job's adapter.target_modules");
  }
  FT_ASSIGN_OR_RETURN(auto file,
                      SafetensorsFile::Open((fs::path(dir) / "adapter_model.safetensors").string()));
  for (const TrainableParam& p : model->TrainableParams()) {
    std::vector<float> host(static_cast<size_t>(p.numel));
    FT_RETURN_IF_ERROR(file->ReadFloat(p.name, p.shape, host.data()));
    model->Upload(p.data, host.data(), p.numel);
  }
  return Status::OK();
}

}  // namespace ft
