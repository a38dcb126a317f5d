#include "daemon/fair_share.h"

#include <cmath>
#include <limits>
#include <numbers>

namespace ft {

double DecayedUsage(double old_device_seconds, int64_t running_devices, int64_t elapsed_ms,
                    int64_t half_life_ms) {
  if (elapsed_ms <= 0) return old_device_seconds;
  const double devices = static_cast<double>(running_devices);
  if (half_life_ms <= 0) return old_device_seconds + devices * static_cast<double>(elapsed_ms) / 1000;
  const double kept = std::exp2(-static_cast<double>(elapsed_ms) / static_cast<double>(half_life_ms));
  // ∫₀ᵗ 2^(−(t−s)/h) ds = h / ln 2 × (1 − 2^(−t/h)): each second used, decayed since.
  const double steady = static_cast<double>(half_life_ms) / 1000 / std::numbers::ln2;
  return old_device_seconds * kept + devices * steady * (1 - kept);
}

double SpanUsage(int64_t start_ms, int64_t end_ms, int64_t devices, int64_t now_ms, int64_t half_life_ms) {
  const double used = DecayedUsage(0, devices, end_ms - start_ms, half_life_ms);
  return DecayedUsage(used, 0, now_ms - std::max(start_ms, end_ms), half_life_ms);
}

void AccrueUsage(std::map<std::string, TeamUsage>* usage, const std::map<std::string, int64_t>& running_now,
                 int64_t elapsed_ms, int64_t half_life_ms) {
  for (auto& [team, u] : *usage) {
    u.device_seconds = DecayedUsage(u.device_seconds, u.running_devices, elapsed_ms, half_life_ms);
    u.running_devices = 0;
  }
  for (const auto& [team, devices] : running_now) (*usage)[team].running_devices = devices;
  std::erase_if(
      *usage, [](const auto& e) { return e.second.running_devices == 0 && e.second.device_seconds < 1e-3; });
}

FairShare::FairShare(const FairShareInput& input, int64_t half_life_ms)
    : input_(input),
      running_device_seconds_(static_cast<double>(half_life_ms > 0 ? half_life_ms : 3'600'000) / 1000 /
                              std::numbers::ln2) {
  for (const auto& [team, u] : input.usage) Index(team);
}

size_t FairShare::Index(const std::string& team) {
  auto [it, added] = index_.try_emplace(team, teams_.size());
  if (!added) return it->second;
  Team t{team};
  if (auto policy = input_.policies.find(team); policy != input_.policies.end()) t.policy = policy->second;
  if (auto used = input_.usage.find(team); used != input_.usage.end()) t.usage = used->second.device_seconds;
  total_usage_ += t.usage;
  teams_.push_back(std::move(t));
  return it->second;
}

void FairShare::HasWork(size_t team) {
  if (teams_[team].has_work) return;
  teams_[team].has_work = true;
  total_weight_ += teams_[team].policy.weight;
}

void FairShare::AddRunning(size_t team, int64_t devices) {
  teams_[team].running += devices;
  total_usage_ += static_cast<double>(devices) * running_device_seconds_;
}

double FairShare::Share(size_t team) const {
  const Team& t = teams_[team];
  return t.has_work && total_weight_ > 0 ? t.policy.weight / total_weight_ : 0;
}

double FairShare::Fraction(size_t team) const {
  return total_usage_ > 0 ? Used(teams_[team]) / total_usage_ : 0;
}

double FairShare::Standing(size_t team) const {
  const Team& t = teams_[team];
  if (t.policy.weight <= 0) return std::numeric_limits<double>::infinity();
  return Used(t) / t.policy.weight;
}

bool FairShare::WithinQuota(size_t team, int64_t devices) const {
  const Team& t = teams_[team];
  return t.policy.quota_devices < 0 || t.running + devices <= t.policy.quota_devices;
}

}  // namespace ft
