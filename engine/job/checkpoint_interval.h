// checkpoint.every: auto (issue #31): the interval between checkpoints that
// minimises the expected time lost to preemptions, Young/Daly's first-order
// optimum sqrt(2·C·M) — C the checkpoint's measured cost (its write time, the
// time it takes to become durable), M the mean time between preemptions of the
// workers the job runs on (ftd's attempt history, handed to every attempt; the
// prior below before there is any) — kept within the job's
// [checkpoint.min_minutes, checkpoint.max_minutes].
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ft {

// M before any preemption was seen, and for a run ftd did not start.
constexpr double kPriorMtbfSeconds = 3600;

struct CheckpointInterval {
  double seconds = 0;  // checkpoint when this long has passed since the last one
  std::string why;     // "C = 0.80 s (...), M = 41.0 min -> every 8.1 min" (bounds and unknowns named)
};

// What a checkpoint costs: C is its fixed part when measured (back-to-back
// writes: the time a write takes no matter how long since the previous one;
// what grows with that time costs the same per second at any interval, so the
// optimum does not depend on it), else the mean of the recent writes.
struct CheckpointCost {
  double fixed_seconds = 0;   // median of recent back-to-back writes (0: none yet)
  double recent_seconds = 0;  // mean of recent writes at the interval in force (0: none yet)
  double c() const { return fixed_seconds > 0 ? fixed_seconds : recent_seconds; }
};

// The median of write times (0 for none): C's fixed part from the recent
// back-to-back writes. The median, not the mean: one slow write (the first
// probe, while the job starts; an fsync behind another process's) must not
// set the interval until sixteen more are measured.
double MedianSeconds(std::vector<double> seconds);

// C <= 0: not measured yet, so the first checkpoint comes at min_minutes (it
// measures C). `mtbf_seconds` <= 0: the prior. `async` (checkpoint.async)
// only changes `why`: whether the step waits for C.
CheckpointInterval ChooseCheckpointInterval(CheckpointCost cost, double mtbf_seconds, double min_minutes,
                                            double max_minutes, bool async = true);

// Whether the next automatic checkpoint is a probe: one the step after the
// checkpoint just taken (back to back), whose write time is C's fixed part.
// Due while that part is unmeasured (`samples`, the back-to-back writes
// measured, is 0), after every kEarlyProbeEvery automatic checkpoints none of
// which was back to back (`since` counts them, across resumes) while there are
// fewer than kSettledSamples (the first probe comes while the job starts, when
// a write costs several times more: the median needs three), then after every
// kProbeEvery. A probe costs one more write of the fixed cost per kProbeEvery.
constexpr int64_t kProbeEvery = 16;
constexpr int64_t kEarlyProbeEvery = 4;
constexpr int64_t kSettledSamples = 3;
bool ProbeDue(int64_t since, int64_t samples);

// M from an attempt history: `seconds` of attempts with `preemptions` among
// their ends: seconds / preemptions, or, with none, the larger of the prior
// and the time seen without one.
double MeanTimeBetweenPreemptions(double seconds, int64_t preemptions);

// "41.0 min".
std::string FormatMinutes(double seconds);

}  // namespace ft
