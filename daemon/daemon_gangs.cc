// The daemon's gangs: a multi-rank attempt's ranks, how their exits decide
// the attempt, and the ranks still running when it ends.
#include <algorithm>
#include <filesystem>

#include "daemon/daemon.h"
#include "daemon/daemon_internal.h"

namespace ft {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

using daemon_internal::ToOutcomeCode;

void Daemon::OnRankExited(const std::string& worker_id, Session& s, Gang& g, const pb::AttemptExited& e) {
  const int rank = e.rank();
  if (rank < 0 || static_cast<size_t>(rank) >= g.workers.size() || g.workers[rank] != worker_id) {
    Event(e.job_id(), worker_id, "refused",
          "exit report of rank " + std::to_string(rank) + ", which does not run on " + worker_id, e.step());
    return;
  }
  if (g.ended[rank] >= 0) return;  // already known (a journal replay)
  g.ended[rank] = e.outcome();
  const std::string why = "rank " + std::to_string(rank) + " on " + worker_id + ": " +
                          (e.reason().empty() ? pb::AttemptOutcome_Name(e.outcome()) : e.reason());
  if (g.first_end_mono == 0) {
    g.first_end_mono = clock_->MonotonicMs();
    g.first_end_credit = stall_credit_ms_.load();
    g.first_reason = why;
  }
  Event(e.job_id(), worker_id, "rank_exited", pb::AttemptOutcome_Name(e.outcome()) + ": " + why, e.step());
  bool still_here = false;
  for (size_t r = 0; r < g.workers.size(); ++r) still_here |= g.workers[r] == worker_id && g.ended[r] < 0;
  if (!still_here && s.running_job == e.job_id()) {
    s.running_job.clear();
    s.running_epoch = 0;
  }
  const std::string job_id = e.job_id();
  const int64_t epoch = e.epoch();
  switch (e.outcome()) {
    case pb::ATTEMPT_FAILED:
    case pb::ATTEMPT_SUPERSEDED:
    case pb::ATTEMPT_ENVIRONMENT:
    case pb::ATTEMPT_BAD_INPUT:
      // This rank's own failure decides the attempt; the others stop.
      return EndRunning(job_id, epoch, ToOutcomeCode(e.outcome()), why, e.step());
    case pb::ATTEMPT_FINISHED:
    case pb::ATTEMPT_PREEMPTED:
      // Rank 0 wrote the outputs or the checkpoint; the others' exits follow its word.
      if (rank == 0) return EndRunning(job_id, epoch, ToOutcomeCode(e.outcome()), e.reason(), e.step());
      break;
    default: break;
  }
  if (std::find(g.ended.begin(), g.ended.end(), -1) != g.ended.end()) return;  // wait for the others
  // Every rank ended without a decisive report.
  const bool all_lost_peers =
      std::all_of(g.ended.begin(), g.ended.end(), [](int o) { return o == pb::ATTEMPT_RANK_LOST; });
  if (all_lost_peers) {
    return EndRunning(job_id, epoch, AttemptOutcomeCode::kEnvironment,
                      "every rank lost the others (" + g.first_reason + ")", e.step());
  }
  EndLostAttempt(job_id, epoch, g.first_reason, e.step());
}

void Daemon::ExpireGangs() {
  const int64_t now = clock_->MonotonicMs();
  std::vector<std::pair<std::string, Gang>> late;
  for (const auto& [job_id, g] : gangs_) {
    const int64_t waited = now - g.first_end_mono - (stall_credit_ms_.load() - g.first_end_credit);
    if (g.first_end_mono > 0 && waited > 2 * options_.lease_ms) late.emplace_back(job_id, g);
  }
  for (const auto& [job_id, g] : late) {
    int64_t step = 0;
    if (auto a = store_->ListAttempts(job_id); a.ok() && !a->empty()) step = a->back().end_step;
    EndLostAttempt(job_id, g.epoch,
                   g.first_reason + "; the other ranks did not end within " +
                       std::to_string(2 * options_.lease_ms / 1000) + " s",
                   step);
  }
}

void Daemon::TrackGang(const AttemptRow& a) {
  if (a.ranks.size() <= 1) return;
  Gang& g = gangs_[a.job_id];
  if (g.epoch > a.epoch) return;  // a crash may have left an older one marked running
  g = Gang{a.epoch, {}, std::vector<int>(a.ranks.size(), -1), 0, ""};
  for (const RankSlot& r : a.ranks) g.workers.push_back(r.worker_id);
}

void Daemon::ReleaseGang(const std::string& job_id, int64_t epoch, const std::string& reason) {
  auto it = gangs_.find(job_id);
  if (it == gangs_.end() || it->second.epoch != epoch) return;
  const Gang g = std::move(it->second);
  gangs_.erase(it);
  std::set<std::string> refused;
  for (size_t r = 0; r < g.workers.size(); ++r) {
    auto session = sessions_.find(g.workers[r]);
    if (session == sessions_.end()) continue;
    Session& s = session->second;
    if (g.ended[r] < 0 && refused.insert(g.workers[r]).second) {
      Refuse(s.sink, job_id, epoch, "the attempt ended (" + reason + "): stopping its other ranks");
    }
    if (s.running_job == job_id && s.running_epoch == epoch) {
      s.running_job.clear();
      s.running_epoch = 0;
    }
  }
}

}  // namespace ft
