// job.yaml → JobSpec: any bytes parse to a spec or to an error naming the
// file, line and key (engine/job/job_spec.h). A spec that parses holds only
// finite numbers inside their documented ranges (no .inf, .nan or 1e308 lr
// gets through, and a repeated key is an error, not a silent first value),
// and came from text within the limits (size, nodes, nesting: the corpus'
// huge, many-nodes and deep seeds are refused before a tree is built).
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/yaml_config.h"
#include "engine/job/job_spec.h"
#include "tests/fuzz/fuzz.h"

namespace {

// Aborts (a finding) when a parsed spec breaks the value rules.
void CheckValues(const ft::JobSpec& s) {
  const struct {
    const char* key;
    double value, low, high;
  } numbers[] = {
      {"adapter.alpha", s.adapter.alpha, 0, 1e6},
      {"adapter.dropout", s.adapter.dropout, 0, 1},
      {"train.lr", s.train.lr, 0, 1},
      {"train.weight_decay", s.train.weight_decay, 0, 1},
      {"train.adam_eps", s.train.adam_eps, 0, 1},
      {"train.adam_beta1", s.train.adam_beta1, 0, 1},
      {"train.adam_beta2", s.train.adam_beta2, 0, 1},
      {"train.max_grad_norm", s.train.max_grad_norm, -1e308, 1e308},
      {"train.loss_scale_init", s.train.loss_scale_init, 1, 1e30},
      {"train.warmup_steps", static_cast<double>(s.train.warmup_steps), 0, 1e9},
      {"train.max_steps", static_cast<double>(s.train.max_steps), 0, 1e9},
      {"checkpoint.every_steps", static_cast<double>(s.checkpoint.every_steps), 0, 1e9},
      {"checkpoint.every_minutes", s.checkpoint.every_minutes, 0, 1e6},
      {"resources.max_failures", static_cast<double>(s.resources.max_failures), 0, 1000},
  };
  for (const auto& n : numbers) {
    if (!std::isfinite(n.value) || n.value < n.low || n.value > n.high) {
      std::fprintf(stderr, "job_spec_fuzz: %s = %g was accepted\n", n.key, n.value);
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(ft::fuzz::AsText(data, size));
  auto spec = ft::ParseJobSpec(text, "fuzz/job.yaml");
  if (!spec.ok()) return 0;
  CheckValues(*spec);
  if (text.size() > ft::kMaxJobSpecBytes || !ft::CheckYamlLimits(text, "fuzz/job.yaml").ok()) {
    std::fprintf(stderr, "job_spec_fuzz: a job of %zu bytes past the YAML limits was accepted\n",
                 text.size());
    std::abort();
  }
  return 0;
}
