#include "worker/slot_end.h"

#include <algorithm>
#include <charconv>
#include <string>

namespace ft::worker {

namespace {

constexpr int64_t kUnmeasuredMarginMs = 10'000;
constexpr int64_t kFixedMarginMs = 5'000;
constexpr double kCheckpointFactor = 1.5;

// A whole non-negative number filling `text`.
bool ParseCount(std::string_view text, int64_t* value) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return ec == std::errc() && end == text.data() + text.size() && *value >= 0;
}

Status Bad(std::string_view text) {
  return Status::InvalidArgument("slot end '" + std::string(text) +
                                 "': expected Unix seconds or +N[s|m|h] (e.g. +20s, +5m)");
}

}  // namespace

StatusOr<int64_t> ParseSlotEnd(std::string_view text, int64_t now_ms) {
  int64_t n = 0;
  if (text.empty() || text[0] != '+') {
    if (!ParseCount(text, &n) || n == 0) return Bad(text);
    return n * 1000;
  }
  text.remove_prefix(1);
  int64_t unit_ms = 1000;
  if (!text.empty() && (text.back() == 's' || text.back() == 'm' || text.back() == 'h')) {
    unit_ms = text.back() == 's' ? 1000 : text.back() == 'm' ? 60'000 : 3'600'000;
    text.remove_suffix(1);
  }
  if (!ParseCount(text, &n)) return Bad("+" + std::string(text));
  return now_ms + n * unit_ms;
}

StatusOr<int64_t> SlotEndFromSlurm(const char* value) {
  if (value == nullptr || *value == '\0') return int64_t{0};
  int64_t seconds = 0;
  if (!ParseCount(value, &seconds)) {
    return Status::InvalidArgument(std::string("SLURM_JOB_END_TIME='") + value + "': not Unix seconds");
  }
  return seconds * 1000;
}

int64_t EarlierSlotEnd(int64_t a_ms, int64_t b_ms) {
  if (a_ms <= 0) return b_ms;
  if (b_ms <= 0) return a_ms;
  return std::min(a_ms, b_ms);
}

int64_t SlotEndMarginMs(double checkpoint_seconds) {
  if (checkpoint_seconds <= 0) return kUnmeasuredMarginMs;
  return static_cast<int64_t>(kCheckpointFactor * checkpoint_seconds * 1000.0) + kFixedMarginMs;
}

bool SlotEndReached(int64_t now_ms, int64_t slot_end_ms, double checkpoint_seconds) {
  return slot_end_ms > 0 && now_ms >= slot_end_ms - SlotEndMarginMs(checkpoint_seconds);
}

}  // namespace ft::worker
