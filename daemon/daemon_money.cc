// Daemon: money (issue #44, point 4; common/money.h). Every attempt is priced when it starts (its
// ranks' workers' price per device-hour: ftd's for the worker's pool, else the worker's own), so its
// cost is its device-seconds at that price. A job's cost is its attempts' (split like its goodput),
// a pool's its ended attempts', and a team's spend its jobs': ended attempts summed in SQLite at
// start and added to as they end, running ones up to now. A team whose spend has reached its budget
// gets no new job, nor does one with as many jobs queued as its cap (AdmitTeamLimits: the teams'
// limits on submits).
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include "daemon/daemon.h"

namespace ft {

namespace {

std::string Money(double amount) {
  char text[48];
  std::snprintf(text, sizeof text, "$%.2f", amount);
  return text;
}

}  // namespace

double Daemon::PriceIn(const std::string& pool, double own_price) const {
  auto priced = options_.pool_prices.find(pool);
  return priced != options_.pool_prices.end() ? priced->second : own_price;
}

std::map<std::string, double> Daemon::SpendByTeam() const {
  std::map<std::string, double> spend = ended_spend_;
  const int64_t now = clock_->WallMs();
  for (const auto& [job_id, meta] : running_meta_) {
    if (meta.price <= 0) continue;
    const double seconds = static_cast<double>(std::max<int64_t>(0, now - meta.started_wall_ms)) / 1000.0;
    spend[TeamOf(job_id)] += seconds * static_cast<double>(meta.devices()) * meta.price / 3600.0;
  }
  return spend;
}

std::vector<Daemon::PendingSubmit*> Daemon::AdmitTeamLimits(const std::vector<PendingSubmit*>& batch) {
  std::vector<PendingSubmit*> admitted;
  std::map<std::string, int64_t> queued;  // per capped team in the batch: its queued jobs, counted once
  std::optional<std::map<std::string, double>> spend;  // every team's, once a budget is checked
  for (PendingSubmit* p : batch) {
    const std::string& team = p->row.team;
    auto limits = team_limits_.find(team);
    if (limits == team_limits_.end()) {
      admitted.push_back(p);
      continue;
    }
    const TeamLimits& l = limits->second;
    if (l.max_queued >= 0) {
      auto [n, fresh] = queued.try_emplace(team, 0);
      if (fresh)
        n->second =
            std::count_if(queued_.begin(), queued_.end(), [&](const JobView* v) { return v->team == team; });
      if (n->second >= l.max_queued) {
        p->status = Status::FailedPrecondition(
            "team " + team + " has " + std::to_string(n->second) + " jobs queued, its cap: submit when one " +
            "starts or ends, or an admin raises it (ftctl admin team set " + team + " --max-queued N)");
        continue;
      }
      n->second += 1;
    }
    if (l.budget) {
      if (!spend) spend = SpendByTeam();
      const double spent = (*spend)[team];
      if (spent >= *l.budget) {
        p->status = Status::FailedPrecondition(
            "team " + team + " has spent " + Money(spent) + " of its budget of " + Money(*l.budget) +
            ": no new job until an admin raises it (ftctl admin team set " + team +
            " --budget AMOUNT, or --budget none)");
        continue;
      }
    }
    admitted.push_back(p);
  }
  return admitted;
}

}  // namespace ft
