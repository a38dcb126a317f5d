// A model's config.json → ModelConfig, and the memory planner on what parses
// (engine/job/hf_config.h, engine/job/planner.h): errors, never a crash or an
// overflow, whatever the sizes say. A config that parses has finite numbers
// (rms_norm_eps, rope_theta, the rope_scaling factors) in their ranges.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/io/hf_model.h"
#include "engine/job/planner.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = ft::ParseHfConfig(std::string(ft::fuzz::AsText(data, size)), "fuzz/config.json");
  if (!config.ok()) return 0;
  const ft::RopeScaling& r = config->rope_scaling;
  const bool finite =
      std::isfinite(config->rms_norm_eps) && config->rms_norm_eps > 0 && config->rms_norm_eps <= 1 &&
      std::isfinite(config->rope_theta) && (r.type.empty() || (std::isfinite(r.factor) && r.factor > 0)) &&
      (r.type != "llama3" || (std::isfinite(r.low_freq_factor) && std::isfinite(r.high_freq_factor)));
  if (!finite) {
    std::fprintf(stderr, "hf_config_fuzz: a non-finite or out-of-range number was accepted\n");
    std::abort();
  }
  ft::PlanRequest request;
  request.model = *config;
  request.lora_targets = {"q_proj", "v_proj"};
  (void)ft::PredictMemory(request, 1);
  return 0;
}
