// A model's config.json → ModelConfig, and the memory planner on what parses
// (engine/io/hf_model.h, engine/train/planner.h): errors, never a crash or an
// overflow, whatever the sizes say.
#include "engine/io/hf_model.h"
#include "engine/train/planner.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = ft::ParseHfConfig(std::string(ft::fuzz::AsText(data, size)), "fuzz/config.json");
  if (!config.ok()) return 0;
  ft::PlanRequest request;
  request.model = *config;
  request.lora_targets = {"q_proj", "v_proj"};
  (void)ft::PredictMemory(request, 1);
  return 0;
}
