// Young/Daly checkpoint intervals (engine/job/checkpoint_interval.h).
#include "engine/job/checkpoint_interval.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace ft {

CheckpointInterval ChooseCheckpointInterval(CheckpointCost cost, double mtbf_seconds, double min_minutes,
                                            double max_minutes, bool async) {
  const double lo = 60 * min_minutes, hi = 60 * max_minutes;
  const double m = mtbf_seconds > 0 ? mtbf_seconds : kPriorMtbfSeconds;
  const double checkpoint_seconds = cost.c();
  char why[288];
  if (checkpoint_seconds <= 0) {
    std::snprintf(why, sizeof(why),
                  "C not measured yet: first checkpoint after %.1f min (checkpoint.min_minutes)",
                  min_minutes);
    return {lo, why};
  }
  const double optimum = std::sqrt(2 * checkpoint_seconds * m);
  const double chosen = std::clamp(optimum, lo, hi);
  char c_text[96];
  if (cost.fixed_seconds > 0) {
    std::snprintf(c_text, sizeof(c_text), "%.3g s back to back (%.3g s at the interval)", cost.fixed_seconds,
                  cost.recent_seconds);
  } else {
    std::snprintf(c_text, sizeof(c_text), "%.3g s", checkpoint_seconds);
  }
  std::snprintf(why, sizeof(why), "C = %s, M = %.1f min%s -> every %.2f min%s; %s", c_text, m / 60,
                mtbf_seconds > 0 ? "" : " (prior)", chosen / 60,
                chosen > optimum   ? " (checkpoint.min_minutes)"
                : chosen < optimum ? " (checkpoint.max_minutes)"
                                   : "",
                async ? "written in the background, the step does not wait for it"
                      : "checkpoint.async false, the step waits for each write");
  return {chosen, why};
}

std::string FormatMinutes(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f min", seconds / 60);
  return text;
}

double MedianSeconds(std::vector<double> seconds) {
  if (seconds.empty()) return 0;
  std::sort(seconds.begin(), seconds.end());
  const size_t mid = seconds.size() / 2;
  return seconds.size() % 2 == 1 ? seconds[mid] : (seconds[mid - 1] + seconds[mid]) / 2;
}

bool ProbeDue(int64_t since, int64_t samples) {
  return samples <= 0 || since >= (samples < kSettledSamples ? kEarlyProbeEvery : kProbeEvery);
}

double MeanTimeBetweenPreemptions(double seconds, int64_t preemptions) {
  if (preemptions > 0) return seconds / static_cast<double>(preemptions);
  return std::max(kPriorMtbfSeconds, seconds);
}

}  // namespace ft
