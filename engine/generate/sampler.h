// Choosing the next token from a position's logits: greedy (temperature 0)
// or sampling with temperature, top-k and top-p (nucleus), in that order, as
// transformers' generate applies its TemperatureLogitsWarper, TopKLogitsWarper
// and TopPLogitsWarper.
//
// Reproducible: a Sampler's draws are a pure function of its seed and how many
// tokens it has drawn (counter-based, engine/model/rng.h), on every machine.
// Ties in greedy decoding go to the lowest id (torch.argmax's choice).
//
// Thread safety: one Sampler per generation.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace ft {

struct SamplingOptions {
  double temperature = 0;  // 0 = greedy
  int64_t top_k = 0;       // 0 = all tokens
  double top_p = 1;        // 1 = all tokens
  uint64_t seed = 0;
};

// InvalidArgument naming the option when one is out of range.
Status ValidateSampling(const SamplingOptions& options);

class Sampler {
 public:
  explicit Sampler(SamplingOptions options) : options_(options) {}
  // The next token given `logits` [vocab] (non-empty).
  int32_t Next(const std::vector<float>& logits);

 private:
  SamplingOptions options_;
  uint64_t draws_ = 0;
};

// The index of the largest value, the lowest index among equal ones.
int32_t Argmax(const std::vector<float>& logits);

}  // namespace ft
