// The end of this node's time slot (a Slurm allocation, a reservation): when
// it is known, running trainers are told to checkpoint and stop early enough
// to finish before it, and no new attempt starts when too little time is left.
//
//   stop at  slot_end - (1.5 × the attempt's measured checkpoint seconds + 5 s)
//            or slot_end - 10 s before any checkpoint was measured
//
// Times are Unix milliseconds. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace ft::worker {

// --slot-end: Unix seconds ("1767225600") or relative to now_ms ("+90",
// "+20s", "+5m", "+2h"). InvalidArgument otherwise.
StatusOr<int64_t> ParseSlotEnd(std::string_view text, int64_t now_ms);

// SLURM_JOB_END_TIME (Unix seconds; nullptr or "" = unset → 0).
// InvalidArgument when it is not a number.
StatusOr<int64_t> SlotEndFromSlurm(const char* value);

// The earlier of two slot ends, where 0 means none.
int64_t EarlierSlotEnd(int64_t a_ms, int64_t b_ms);

// How long before the slot end an attempt must be told to stop;
// checkpoint_seconds <= 0: not measured yet.
int64_t SlotEndMarginMs(double checkpoint_seconds);

// True when slot_end_ms is known (> 0) and now_ms is past the stop point.
bool SlotEndReached(int64_t now_ms, int64_t slot_end_ms, double checkpoint_seconds);

}  // namespace ft::worker
