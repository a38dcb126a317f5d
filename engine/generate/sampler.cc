#include "engine/generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/model/rng.h"

namespace ft {

Status ValidateSampling(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    return Status::InvalidArgument("--temperature must be 0 (greedy) or more, not " +
                                   std::to_string(o.temperature));
  }
  if (o.top_k < 0) return Status::InvalidArgument("--top-k must be 0 (off) or more");
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return Status::InvalidArgument("--top-p must be in (0, 1], not " + std::to_string(o.top_p));
  }
  return Status::OK();
}

int32_t Argmax(const std::vector<float>& logits) {
  FT_CHECK(!logits.empty());
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::Next(const std::vector<float>& logits) {
  if (options_.temperature == 0) return Argmax(logits);
  // Candidates by decreasing logit (ties: lower id first), cut by top-k.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = options_.top_k > 0 ? std::min<size_t>(options_.top_k, order.size()) : order.size();
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), by_logit);
  order.resize(k);
  // Softmax of logit / temperature over the candidates (in double).
  std::vector<double> p(k);
  const double top = logits[order[0]] / options_.temperature;
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp(logits[order[i]] / options_.temperature - top);
  for (double& x : p) x /= sum;
  // Top-p: the smallest prefix whose probability reaches top_p (the first token always stays).
  size_t keep = k;
  if (options_.top_p < 1) {
    double cumulative = 0;
    for (size_t i = 0; i < k; ++i) {
      cumulative += p[i];
      if (cumulative >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double mass = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  // One uniform draw per token, keyed by the seed and the draw's number.
  const uint64_t bits = HashKeys(options_.seed, 0x67656e, draws_++);
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53 * mass;
  double cumulative = 0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += p[i];
    if (u < cumulative) return order[i];
  }
  return order[keep - 1];
}

}  // namespace ft
