// Fair share between teams (issue #44): each team's nominal quota of devices
// (Kueue's ClusterQueue quota), its weight, and its usage in device-seconds
// that decays with a half life (Slurm's fair-share idea), so what a team ran
// an hour ago counts half as much as what it runs now.
//
// A team's fair share is its weight over the sum of the weights of the teams
// with work (a queued or running job); its deficit is that share less its
// fraction of all usage. The scheduler places first the team furthest below
// its share in proportion: the least fraction / share, which is the least
// usage per unit of weight (Slurm's fair-share factor 2^(−U/S) orders teams
// the same way). Unlike the deficit, that standing does not move when another
// team's usage grows, so a pass that places a job moves only its own team
// (daemon/scheduler.h). Teams not named in the policies get the defaults (no
// quota, weight 1); the team "" (jobs without a team) is such a team.
//
// Thread safety: pure functions; a FairShare belongs to one pass.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace ft {

struct TeamPolicy {
  int64_t quota_devices = -1;  // devices it may run at once without borrowing; -1: no quota
  double weight = 1;           // its share against the other teams with work (> 0)
};

// What the daemon keeps per team between passes.
struct TeamUsage {
  int64_t running_devices = 0;  // devices its jobs held since the last AccrueUsage
  double device_seconds = 0;    // decayed: each device-second halves per half life since
};

// A pass's view of the teams: policies and usage by team name.
struct FairShareInput {
  std::map<std::string, TeamPolicy> policies;
  std::map<std::string, TeamUsage> usage;  // device_seconds is read; running devices come from the workers
};

// The usage `elapsed_ms` later, `running_devices` having run all along:
// old × 2^(−elapsed / half_life) plus the running devices' device-seconds,
// each decayed since it was used (≈ devices × seconds for a short elapsed),
// so the result does not depend on how often it is called. half_life_ms ≤ 0:
// no decay.
double DecayedUsage(double old_device_seconds, int64_t running_devices, int64_t elapsed_ms,
                    int64_t half_life_ms);

// What `devices` running from `start_ms` to `end_ms` add to a usage read at `now_ms` (each
// device-second decayed since, as DecayedUsage sums it): ftd rebuilds the teams' usage from the
// attempts' spans when it starts.
double SpanUsage(int64_t start_ms, int64_t end_ms, int64_t devices, int64_t now_ms, int64_t half_life_ms);

// Advances every team's usage by `elapsed_ms` at the devices it recorded as
// running, then records `running_now` (by team; a team absent runs none).
// Teams with no usage left and nothing running are dropped.
void AccrueUsage(std::map<std::string, TeamUsage>* usage, const std::map<std::string, int64_t>& running_now,
                 int64_t elapsed_ms, int64_t half_life_ms);

// One pass's account of the teams: shares among the teams with work, running
// devices as the pass places jobs, and each team's standing.
//
// A running device counts as the usage it would reach if it kept running
// (half_life / ln 2 device-seconds: the steady state of DecayedUsage), so a
// placement moves its team toward its share at once and one pass does not
// hand every free device to the team that was furthest behind.
class FairShare {
 public:
  FairShare(const FairShareInput& input, int64_t half_life_ms);

  // The team's index, added with its policy (or the defaults) when new.
  size_t Index(const std::string& team);
  // Marks the team as having work (a queued or running job): its weight
  // counts in every share. Call for every job before Share.
  void HasWork(size_t team);
  // The team runs `devices` more (a placement, or a running job).
  void AddRunning(size_t team, int64_t devices);

  // Its weight over the weights of the teams with work (0 without work).
  double Share(size_t team) const;
  // Its usage (decayed, and its running devices) over every team's.
  double Fraction(size_t team) const;
  // Share less fraction (positive: below its share).
  double Deficit(size_t team) const { return Share(team) - Fraction(team); }
  // Its usage per unit of weight: the team with the least is furthest below
  // its share in proportion (fraction / share, up to a factor common to every
  // team); a team of weight 0 comes last.
  double Standing(size_t team) const;
  // Whether it may run `devices` more within its quota (always, without one).
  bool WithinQuota(size_t team, int64_t devices) const;
  bool HasQuota(size_t team) const { return teams_[team].policy.quota_devices >= 0; }
  int64_t Quota(size_t team) const { return teams_[team].policy.quota_devices; }
  int64_t Running(size_t team) const { return teams_[team].running; }
  const std::string& Name(size_t team) const { return teams_[team].name; }
  size_t size() const { return teams_.size(); }

 private:
  struct Team {
    std::string name;
    TeamPolicy policy;
    double usage = 0;  // decayed device-seconds
    int64_t running = 0;
    bool has_work = false;
  };
  double Used(const Team& t) const {
    return t.usage + static_cast<double>(t.running) * running_device_seconds_;
  }
  const FairShareInput& input_;
  double running_device_seconds_;  // the usage one running device counts as
  std::vector<Team> teams_;
  std::unordered_map<std::string, size_t> index_;
  double total_weight_ = 0;  // of the teams with work
  double total_usage_ = 0;   // every team's usage and running devices
};

}  // namespace ft
