#include "daemon/scheduler.h"

#include <algorithm>
#include <set>
#include <span>

namespace ft {

namespace {

using Why = WaitReason::Why;

// "" for any kind, else "cuda " or "cpu ".
std::string KindWord(const std::optional<DeviceKind>& kind) {
  return kind ? std::string(DeviceKindName(*kind)) + " " : "";
}

// The text of each reason, by Why (FormatWaitReason).
struct WaitText {
  Why why;
  std::string (*text)(const WaitReason& r);
};
constexpr WaitText kWaitTexts[] = {
    {Why::kBackoff,
     [](const WaitReason& r) {
       return "waits: backing off after the last attempt (" + std::to_string(r.needs) + " s)";
     }},
    {Why::kDoesNotFit,
     [](const WaitReason& r) {
       return "waits: does not fit: needs " + FormatBytes(r.needs) +
              " per device at micro-batch 1, the largest free is " + FormatBytes(r.offered);
     }},
    {Why::kNoLiveWorker, [](const WaitReason&) { return std::string("waits: no live worker"); }},
    {Why::kEveryWorkerBusy, [](const WaitReason&) { return std::string("waits: every worker is busy"); }},
    {Why::kSlotEndsSoon,
     [](const WaitReason& r) {
       return "waits: worker " + r.worker + "'s slot ends in less than " + std::to_string(r.needs) + " s";
     }},
    {Why::kNoWorkerHasDevices,
     [](const WaitReason& r) {
       return "waits: no worker has " + std::to_string(r.needs) + " " + KindWord(r.device) +
              (r.needs > 1 ? "devices (one per rank)" : "device");
     }},
    {Why::kWorkerNoRendezvous,
     [](const WaitReason& r) {
       return "waits: worker " + r.worker + " reports no rendezvous ports for a multi-rank job";
     }},
    {Why::kHostMemory,
     [](const WaitReason& r) {
       return "waits: needs " + FormatBytes(r.needs) +
              " of host memory for its memory techniques (cpu_offload, paged_adamw, activation offload); "
              "worker " +
              r.worker + " has " + FormatBytes(r.offered) + " to spare";
     }},
    {Why::kTooFewDevices,
     [](const WaitReason& r) {
       return "waits: needs " + std::to_string(r.needs) + " " + KindWord(r.device) +
              "devices (one per rank); the idle workers offer " + std::to_string(r.offered);
     }},
    {Why::kNoRendezvousHost,
     [](const WaitReason&) {
       return std::string(
           "waits: no idle worker reports rendezvous ports to host rank 0 of a multi-rank job");
     }},
    {Why::kTeamQuota,
     [](const WaitReason& r) {
       return "waits: team " + r.name + " runs " + std::to_string(r.needs) + " of its quota of " +
              std::to_string(r.offered) + " devices";
     }},
    {Why::kPreempting,
     [](const WaitReason& r) {
       const bool reclaim = r.needs == static_cast<int64_t>(Preemption::Why::kReclaim);
       return "waits: preempting job " + r.name + (reclaim ? " (reclaim)" : " (priority)") + " on worker " +
              r.worker + (r.offered > 0 ? " and " + std::to_string(r.offered) + " more" : "");
     }},
};

WaitReason DoesNotFit(int64_t needs, int64_t largest_free) {
  return {Why::kDoesNotFit, "", needs, largest_free, std::nullopt};
}

bool KindAllowed(const JobView& job, DeviceKind kind) { return DeviceRequestAccepts(job.device, kind); }

// The devices of `kind` on `w`, most free memory first.
std::vector<const DeviceView*> DevicesOf(const WorkerView& w, DeviceKind kind) {
  std::vector<const DeviceView*> out;
  for (const DeviceView& d : w.devices)
    if (d.kind == kind) out.push_back(&d);
  std::stable_sort(out.begin(), out.end(),
                   [](const DeviceView* a, const DeviceView* b) { return a->free_bytes > b->free_bytes; });
  return out;
}

}  // namespace

std::optional<DeviceView> DeviceViewOf(const DeviceRow& d) {
  StatusOr<DeviceKind> kind = ParseDeviceKind(d.kind);
  if (!kind.ok()) return std::nullopt;
  return DeviceView{*kind, d.index, d.total_bytes, d.free_bytes};
}

std::string FormatWaitReason(const WaitReason& reason) {
  for (const WaitText& t : kWaitTexts) {
    if (t.why == reason.why) return t.text(reason);
  }
  return "";
}

int64_t MinBytesPerDevice(const JobView& job, DeviceKind kind) {
  const int64_t cached = kind == DeviceKind::kCuda ? job.min_bytes_cuda : job.min_bytes_cpu;
  if (cached > 0) return cached;
  PlanRequest request = job.plan;
  request.device = kind;
  request.world = job.gpus;
  return PredictMemory(request, job.fixed_micro_batch > 0 ? job.fixed_micro_batch : 1).total();
}

namespace {

// Why `job` waits before any worker is tried (backoff, or more memory than
// any available worker offers at micro-batch 1), or kNone when it may be placed.
WaitReason WaitsBeforePlacement(const JobView& job, const std::map<DeviceKind, int64_t>& best_free,
                                int64_t now_wall_ms) {
  if (job.not_before_ms > now_wall_ms) {
    return {Why::kBackoff, "", (job.not_before_ms - now_wall_ms + 999) / 1000, 0, std::nullopt};
  }
  if (best_free.empty()) return {};
  bool may_fit = false;
  int64_t needs = 0, offered = 0;
  for (const auto& [kind, free] : best_free) {
    if (!KindAllowed(job, kind)) continue;
    needs = MinBytesPerDevice(job, kind);
    offered = std::max(offered, free);
    may_fit |= needs <= free;
  }
  return !may_fit && offered > 0 ? DoesNotFit(needs, offered) : WaitReason{};
}

// The batch plan for `job` on `kind` devices with `free` bytes each: the
// user's fixed micro-batch when it fits, else the largest that fits.
StatusOr<BatchPlanChoice> ChoosePlan(const JobView& job, DeviceKind kind, int64_t free, int64_t world) {
  PlanRequest request = job.plan;
  request.device = kind;
  request.world = world;
  if (job.fixed_micro_batch <= 0) return ChooseMicroBatch(request, free);
  MemoryBreakdown m = PredictMemory(request, job.fixed_micro_batch);
  if (m.total() > free) return Status::ResourceExhausted("does not fit");
  return BatchPlanChoice{job.fixed_micro_batch, request.global_batch / (job.fixed_micro_batch * world), world,
                         m, free};
}

// The ranks of `job` on `kind` devices: rank r on workers[worker_of[r]]'s
// device device_of[r]. Fits the plan to the least free memory among them and
// checks each worker's host memory for its ranks' technique buffers. The
// placement, or why it waits in *why.
bool FitGang(const JobView& job, const std::vector<WorkerView>& workers, DeviceKind kind,
             const std::vector<size_t>& worker_of, const std::vector<const DeviceView*>& device_of,
             Placement* placement, WaitReason* why) {
  const int64_t world = static_cast<int64_t>(device_of.size());
  int64_t free = device_of.front()->free_bytes;
  for (const DeviceView* d : device_of) free = std::min(free, d->free_bytes);
  StatusOr<BatchPlanChoice> choice = ChoosePlan(job, kind, free, world);
  const bool on_cpu = kind == DeviceKind::kCpu;
  if (choice.ok() && on_cpu && choice->memory.total() + choice->memory.host_total() > free) {
    // The host buffers share the CPU device's memory: a plan that leaves them room.
    choice = ChoosePlan(job, kind, free - choice->memory.host_total(), world);
  }
  if (!choice.ok()) {
    PlanRequest request = job.plan;
    request.device = kind;
    request.world = world;
    *why = DoesNotFit(PredictMemory(request, 1).total(), free);
    return false;
  }
  // The memory techniques' host buffers: on a CPU device they come out of the
  // device's memory; each rank on a worker has its own.
  if (const int64_t per_rank = choice->memory.host_total(); per_rank > 0) {
    std::map<size_t, int64_t> ranks_on;
    for (size_t w : worker_of) ranks_on[w] += 1;
    for (const auto& [index, ranks] : ranks_on) {
      const WorkerView& w = workers[index];
      const int64_t host = per_rank * ranks;
      const int64_t offered = on_cpu ? (free - choice->memory.total()) * ranks : w.host_free_bytes;
      if ((on_cpu || w.host_free_bytes > 0) && host > offered) {
        *why = {Why::kHostMemory, w.id, host, std::max<int64_t>(offered, 0), std::nullopt};
        return false;
      }
    }
  }
  *placement = {job.id, workers[worker_of.front()].id, *choice, kind, {}};
  for (size_t r = 0; r < worker_of.size(); ++r)
    placement->ranks.push_back({workers[worker_of[r]].id, device_of[r]->index});
  return true;
}

// The workers a job may start on this pass (alive, idle, not draining, with
// slot enough), in order; *none says why there is none when so.
std::vector<size_t> UsableWorkers(const std::vector<WorkerView>& workers, int64_t now_wall_ms,
                                  const SchedulerOptions& options, WaitReason* none) {
  *none = {Why::kNoLiveWorker};
  std::vector<size_t> usable;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerView& w = workers[i];
    if (!w.alive || w.busy || w.draining) {
      if (w.alive && none->why == Why::kNoLiveWorker) *none = {Why::kEveryWorkerBusy};
      continue;
    }
    if (w.slot_end_ms > 0 && w.slot_end_ms - now_wall_ms < options.min_slot_ms) {
      *none = {Why::kSlotEndsSoon, w.id, options.min_slot_ms / 1000, 0, std::nullopt};
      continue;
    }
    usable.push_back(i);
  }
  return usable;
}

// Places `job` with `world` ranks on `idle` workers (usable, not yet taken
// this pass): on one worker with enough devices when there is one, else
// (multi-rank) across several. The workers' indices (rank 0's first), or
// none with why it waits in *why.
std::vector<size_t> PlaceWorld(const JobView& job, int64_t world, const std::vector<WorkerView>& workers,
                               const std::vector<size_t>& idle, Placement* placement, WaitReason* why) {
  const bool gang = world > 1;
  *why = {Why::kNoWorkerHasDevices, "", world, 0, RequiredDeviceKind(job.device)};
  // One worker with every device the job needs.
  for (size_t i : idle) {
    for (const DeviceKind kind : {DeviceKind::kCuda, DeviceKind::kCpu}) {
      if (!KindAllowed(job, kind)) continue;
      std::vector<const DeviceView*> mine = DevicesOf(workers[i], kind);
      if (mine.size() < static_cast<size_t>(world)) continue;
      if (gang && !workers[i].serves_rendezvous) {
        *why = {Why::kWorkerNoRendezvous, workers[i].id};
        continue;
      }
      mine.resize(static_cast<size_t>(world));
      if (FitGang(job, workers, kind, std::vector<size_t>(mine.size(), i), mine, placement, why)) return {i};
      break;  // the other kind is tried only where this worker has none of this one
    }
  }
  if (!gang) return {};
  // Across workers: those with the most free devices first, rank 0 on one that serves the rendezvous.
  for (const DeviceKind kind : {DeviceKind::kCuda, DeviceKind::kCpu}) {
    if (!KindAllowed(job, kind)) continue;
    std::vector<std::pair<size_t, std::vector<const DeviceView*>>> offers;
    int64_t offered = 0;
    for (size_t i : idle) {
      std::vector<const DeviceView*> mine = DevicesOf(workers[i], kind);
      if (mine.empty()) continue;
      offered += static_cast<int64_t>(mine.size());
      offers.emplace_back(i, std::move(mine));
    }
    if (offered < world) {
      if (offered > 0 || RequiredDeviceKind(job.device) == kind) {
        *why = {Why::kTooFewDevices, "", world, offered, kind};
      }
      continue;
    }
    std::stable_sort(offers.begin(), offers.end(), [&](const auto& a, const auto& b) {
      if (workers[a.first].serves_rendezvous != workers[b.first].serves_rendezvous) {
        return workers[a.first].serves_rendezvous;
      }
      return a.second.size() > b.second.size();
    });
    if (!workers[offers.front().first].serves_rendezvous) {
      *why = {Why::kNoRendezvousHost};
      continue;
    }
    std::vector<size_t> worker_of, chosen;
    std::vector<const DeviceView*> device_of;
    for (const auto& [i, mine] : offers) {
      chosen.push_back(i);
      for (const DeviceView* d : mine) {
        if (device_of.size() == static_cast<size_t>(world)) break;
        worker_of.push_back(i);
        device_of.push_back(d);
      }
      if (device_of.size() == static_cast<size_t>(world)) break;
    }
    if (FitGang(job, workers, kind, worker_of, device_of, placement, why)) return chosen;
  }
  return {};
}

// Places `job` with the most ranks it may have (an elastic job: the largest
// allowed world that can be placed now, resources.gpus first). Why it waits
// is the smallest world's reason: the least it needs.
std::vector<size_t> PlaceOn(const JobView& job, const std::vector<WorkerView>& workers,
                            const std::vector<size_t>& idle, Placement* placement, WaitReason* why) {
  const int64_t fewest = std::max<int64_t>(1, job.min_gpus > 0 ? std::min(job.min_gpus, job.gpus) : job.gpus);
  if (fewest >= job.gpus) return PlaceWorld(job, job.gpus, workers, idle, placement, why);  // a fixed world
  // An elastic job. A world above the devices the idle workers offer cannot be placed, so it is
  // skipped (one walk over the workers per world that could fit, not per world allowed), except
  // the smallest allowed, tried regardless: its reason is the one the job shows.
  int64_t offered = 0;
  for (size_t i : idle) {
    for (const DeviceView& d : workers[i].devices) offered += KindAllowed(job, d.kind) ? 1 : 0;
  }
  int64_t smallest = job.gpus;
  for (int64_t world = fewest; world < job.gpus && smallest == job.gpus; ++world) {
    if (job.batch_units % world == 0) smallest = world;
  }
  for (int64_t world = job.gpus; world >= smallest; --world) {
    const bool allowed = world == job.gpus || job.batch_units % world == 0;
    if (!allowed || (world > offered && world != smallest)) continue;
    std::vector<size_t> at = PlaceWorld(job, world, workers, idle, placement, why);
    if (!at.empty()) return at;
  }
  return {};
}

}  // namespace

bool QueueOrder::operator()(const JobView* a, const JobView* b) const {
  if (a->priority != b->priority) return a->priority > b->priority;
  if (a->created_ms != b->created_ms) return a->created_ms < b->created_ms;
  return a->id < b->id;
}

int64_t PlacementClasses::Of(const JobView& job) {
  const PlanRequest& p = job.plan;
  const size_t hash =
      std::hash<int64_t>()(job.gpus * 1'000'003 + job.min_gpus * 65'537 + job.fixed_micro_batch * 8191 +
                           p.model.hidden_size * 127 + p.model.num_layers * 31 + p.seq_len * 7 +
                           p.global_batch + p.lora_r * 3 + static_cast<int64_t>(job.device));
  std::vector<Entry>& bucket = by_hash_[hash];
  for (const Entry& e : bucket) {
    if (e.gpus == job.gpus && e.min_gpus == job.min_gpus && e.device == job.device &&
        e.fixed_micro_batch == job.fixed_micro_batch && e.plan == p) {
      return e.id;
    }
  }
  bucket.push_back({job.gpus, job.min_gpus, job.device, job.fixed_micro_batch, p, next_});
  return next_++;
}

namespace {

// A queued job, its team (FairShare's index) and its priority (read once: a pass over 100,000
// jobs is bound by the reads of their views).
struct Queued {
  const JobView* job;
  size_t team;
  int64_t priority;
};

// A running job that may be stopped for a queued one.
struct Victim {
  const RunningView* view;  // as its rank 0's worker reports it
  size_t team;
  int64_t work_ms;               // since its last checkpoint (or its start)
  std::vector<size_t> workers;   // every worker it runs on
  std::vector<size_t> reusable;  // those a job may start on once it stopped (live, slot enough)
  bool stoppable = true;         // ran min_runtime_ms, not stopping already, every worker live
  bool taken = false;            // chosen this pass
};

// Victims are chosen lowest class first, then borrowed before nominal, then least work since the
// last checkpoint (then by id, so the choice is the same every pass).
bool VictimBefore(const Victim& a, const Victim& b) {
  if (a.view->priority != b.view->priority) return a.view->priority < b.view->priority;
  if (a.view->borrowed != b.view->borrowed) return a.view->borrowed;
  if (a.work_ms != b.work_ms) return a.work_ms < b.work_ms;
  return a.view->job_id < b.view->job_id;
}

// A team's FIFO list of one priority class, in the heap that merges the class's teams.
struct Lane {
  size_t team;
  std::vector<const Queued*> jobs;
  size_t next = 0;
  double standing = 0;  // FairShare::Standing: the least goes first
};

// One pass (Schedule): the state its steps share.
class Pass {
 public:
  Pass(const std::vector<WorkerView>& workers, int64_t now_wall_ms, const SchedulerOptions& options,
       const FairShareInput& teams);
  ScheduleResult Run(const std::vector<const JobView*>& jobs);

 private:
  bool Reusable(const WorkerView& w) const;
  void CountRunning();
  void RunClasses(const std::vector<Queued>& jobs, bool borrowing);
  void MergeClass(std::span<const Queued> jobs, bool borrowing);
  void Try(const Queued& q, bool borrowing);
  bool PlaceNow(const Queued& q, bool borrowing, WaitReason* why);
  void Take(const std::vector<size_t>& at);
  bool MayPreempt(const Queued& q);
  bool EligibleFor(const Victim& v, const Queued& q) const;
  std::vector<size_t> FirstVictims(const Queued& q, size_t count, bool* all) const;
  std::vector<size_t> FitWith(const Queued& q, const std::vector<size_t>& stopping,
                              const std::vector<size_t>& victims, Placement* placement);
  bool Preempt(const Queued& q, WaitReason* why);
  WaitReason Decide(const Queued& q, const std::vector<size_t>& stopping, const std::vector<size_t>& victims,
                    const std::vector<size_t>& at, int64_t devices);

  const std::vector<WorkerView>& workers_;
  const int64_t now_;
  const SchedulerOptions& options_;
  FairShare fair_;
  ScheduleResult result_;
  std::vector<size_t> idle_;  // usable workers not taken (nor kept for a preempting job) this pass
  WaitReason none_usable_;    // why no worker is usable (when none is)
  WaitReason all_taken_;      // why a job waits once every usable worker is taken
  bool any_usable_ = false;
  // The most free memory any available worker offers per device kind: a job
  // that needs more at micro-batch 1 waits without a walk over the workers.
  std::map<DeviceKind, int64_t> best_free_;
  // A class that failed while `idle_` had this many workers fails alike until one is taken.
  std::unordered_map<int64_t, std::pair<size_t, WaitReason>> failed_;
  std::vector<Queued> deferred_;  // over their team's quota: tried on what is left, borrowing
  // Preemption: the victims (VictimBefore order), the first one not taken, the borrowed ones not
  // taken by team, the workers stopping for each queued job, and the (placement class, team)
  // pairs for which even every eligible victim was not enough.
  std::vector<Victim> victims_;
  size_t first_untaken_ = 0;
  std::vector<int64_t> borrowed_by_team_;
  int64_t borrowed_ = 0;
  std::unordered_map<std::string, std::vector<size_t>> stopping_for_;
  std::set<std::pair<int64_t, size_t>> no_victims_;
  std::vector<WorkerView> freed_;  // the workers as they will be once stopped (copied at first use)
};

Pass::Pass(const std::vector<WorkerView>& workers, int64_t now_wall_ms, const SchedulerOptions& options,
           const FairShareInput& teams)
    : workers_(workers), now_(now_wall_ms), options_(options), fair_(teams, options.fair_share_half_life_ms) {
  idle_ = UsableWorkers(workers, now_, options, &none_usable_);
  any_usable_ = !idle_.empty();
  all_taken_ = none_usable_.why == Why::kSlotEndsSoon ? none_usable_ : WaitReason{Why::kEveryWorkerBusy};
  for (const WorkerView& w : workers) {
    if (!w.alive || w.busy || w.draining) continue;
    for (const DeviceView& d : w.devices) best_free_[d.kind] = std::max(best_free_[d.kind], d.free_bytes);
  }
  CountRunning();
}

bool Pass::Reusable(const WorkerView& w) const {
  return w.alive && (w.slot_end_ms <= 0 || w.slot_end_ms - now_ >= options_.min_slot_ms);
}

// The running jobs: their devices count for their teams; those that may be stopped become
// victims, and the workers already stopping are set aside for the job they stop for.
void Pass::CountRunning() {
  std::unordered_map<std::string_view, size_t> victim_of;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const WorkerView& w = workers_[i];
    if (!w.busy || !w.running) continue;
    const RunningView& r = *w.running;
    const size_t team = fair_.Index(r.team);
    fair_.HasWork(team);
    fair_.AddRunning(team, r.devices);
    auto [it, added] = victim_of.try_emplace(r.job_id, victims_.size());
    if (added) {
      const int64_t since = std::max(r.started_ms, r.last_checkpoint_ms);
      victims_.push_back({&r, team, now_ - since});
      victims_.back().stoppable = now_ - r.started_ms >= options_.min_runtime_ms;
    }
    Victim& victim = victims_[it->second];
    victim.workers.push_back(i);
    if (Reusable(w)) victim.reusable.push_back(i);
    if (!r.preempted_for.empty() && Reusable(w)) stopping_for_[r.preempted_for].push_back(i);
    if (w.draining || !w.alive || !r.preempted_for.empty()) victim.stoppable = false;
  }
  std::erase_if(victims_, [](const Victim& v) { return !v.stoppable; });
  std::sort(victims_.begin(), victims_.end(), VictimBefore);
  borrowed_by_team_.assign(fair_.size(), 0);
  for (const Victim& v : victims_) {
    borrowed_by_team_[v.team] += v.view->borrowed ? 1 : 0;
    borrowed_ += v.view->borrowed ? 1 : 0;
  }
}

ScheduleResult Pass::Run(const std::vector<const JobView*>& jobs) {
  // One walk over the views: their teams, and whether they are in queue order (the daemon keeps them so).
  const QueueOrder before;
  bool sorted = true;
  std::vector<Queued> queue;
  queue.reserve(jobs.size());
  size_t team = fair_.Index(jobs.empty() ? "" : jobs.front()->team);
  for (const JobView* job : jobs) {
    if (job->team != fair_.Name(team)) team = fair_.Index(job->team);  // most runs of jobs share a team
    fair_.HasWork(team);
    sorted = sorted && (queue.empty() || !before(job, queue.back().job));
    queue.push_back({job, team, job->priority});
  }
  if (!sorted) {
    std::stable_sort(queue.begin(), queue.end(),
                     [&](const Queued& a, const Queued& b) { return before(a.job, b.job); });
  }
  borrowed_by_team_.resize(fair_.size(), 0);
  result_.waiting.reserve(jobs.size());
  RunClasses(queue, false);
  const std::vector<Queued> borrowing = std::move(deferred_);
  RunClasses(borrowing, true);
  return std::move(result_);
}

// Each priority class in turn (the jobs are in queue order: a class is a run of them).
void Pass::RunClasses(const std::vector<Queued>& jobs, bool borrowing) {
  for (size_t begin = 0, end = 0; begin < jobs.size(); begin = end) {
    while (end < jobs.size() && jobs[end].priority == jobs[begin].priority) ++end;
    MergeClass(std::span<const Queued>(jobs).subspan(begin, end - begin), borrowing);
  }
}

// One class: its teams' FIFO lists merged by standing (a heap over the teams: a placement moves
// only its own team's standing, that of the team just tried), ties to the earlier submission.
void Pass::MergeClass(std::span<const Queued> jobs, bool borrowing) {
  const auto one_team = [&](const Queued& q) { return q.team == jobs.front().team; };
  if (std::all_of(jobs.begin(), jobs.end(), one_team)) {  // no order to merge
    for (const Queued& q : jobs) Try(q, borrowing);
    return;
  }
  std::vector<Lane> lanes;
  std::unordered_map<size_t, size_t> lane_of;
  for (const Queued& q : jobs) {
    auto [it, added] = lane_of.try_emplace(q.team, lanes.size());
    if (added) lanes.push_back({q.team, {}, 0, fair_.Standing(q.team)});
    lanes[it->second].jobs.push_back(&q);
  }
  const QueueOrder sooner;
  const auto after = [&](size_t a, size_t b) {  // the heap's order: b is tried before a
    if (lanes[a].standing != lanes[b].standing) return lanes[a].standing > lanes[b].standing;
    return sooner(lanes[b].jobs[lanes[b].next]->job, lanes[a].jobs[lanes[a].next]->job);
  };
  std::vector<size_t> heap(lanes.size());
  for (size_t l = 0; l < lanes.size(); ++l) heap[l] = l;
  std::make_heap(heap.begin(), heap.end(), after);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    Lane& lane = lanes[heap.back()];
    Try(*lane.jobs[lane.next++], borrowing);
    if (lane.next == lane.jobs.size()) {
      heap.pop_back();
    } else {
      lane.standing = fair_.Standing(lane.team);
      std::push_heap(heap.begin(), heap.end(), after);
    }
  }
}

// Places one job, defers it (over its team's quota, before borrowing), or says why it waits
// (choosing victims for it when that lets it be placed).
void Pass::Try(const Queued& q, bool borrowing) {
  const JobView& job = *q.job;
  WaitReason why = WaitsBeforePlacement(job, best_free_, now_);
  const bool over_quota = !borrowing && !fair_.WithinQuota(q.team, job.gpus);
  if (why.why == Why::kNone && over_quota) return deferred_.push_back(q);
  if (why.why == Why::kNone && PlaceNow(q, borrowing, &why)) return;
  if (borrowing) {
    why = {Why::kTeamQuota, "", fair_.Running(q.team), fair_.Quota(q.team), std::nullopt, fair_.Name(q.team)};
  } else if (why.why != Why::kBackoff && !over_quota) {
    Preempt(q, &why);
  }
  result_.waiting.emplace_back(&job, why);
}

// Removes `at` from the idle workers (each is usually near the front: jobs take the first that fits).
void Pass::Take(const std::vector<size_t>& at) {
  for (size_t w : at) {
    if (auto it = std::find(idle_.begin(), idle_.end(), w); it != idle_.end()) idle_.erase(it);
  }
}

bool Pass::PlaceNow(const Queued& q, bool borrowing, WaitReason* why) {
  const JobView& job = *q.job;
  if (idle_.empty()) {
    *why = any_usable_ ? all_taken_ : none_usable_;
    return false;
  }
  auto seen = job.placement_class >= 0 ? failed_.find(job.placement_class) : failed_.end();
  if (seen != failed_.end() && seen->second.first == idle_.size()) {
    *why = seen->second.second;
    return false;
  }
  Placement placement;
  const std::vector<size_t> at = PlaceOn(job, workers_, idle_, &placement, why);
  if (at.empty()) {
    if (job.placement_class >= 0) failed_[job.placement_class] = {idle_.size(), *why};
    return false;
  }
  placement.borrowed = borrowing;
  fair_.AddRunning(q.team, static_cast<int64_t>(placement.ranks.size()));
  result_.placements.push_back(std::move(placement));
  Take(at);
  return true;
}

// Whether any victim could be chosen for `q` (cheap: no walk over the victims).
bool Pass::MayPreempt(const Queued& q) {
  if (!stopping_for_.empty() && stopping_for_.count(q.job->id)) return true;
  while (first_untaken_ < victims_.size() && victims_[first_untaken_].taken) ++first_untaken_;
  if (first_untaken_ < victims_.size() && victims_[first_untaken_].view->priority < q.job->priority)
    return true;
  return fair_.HasQuota(q.team) && borrowed_ - borrowed_by_team_[q.team] > 0;
}

// A lower class's job, or (its team having a quota it is within) another team's borrowed job.
bool Pass::EligibleFor(const Victim& v, const Queued& q) const {
  if (v.view->priority < q.job->priority) return true;
  return v.view->borrowed && v.team != q.team && fair_.HasQuota(q.team);
}

// The first `count` victims eligible for `q` not yet taken (VictimBefore order); *all: there are no more.
std::vector<size_t> Pass::FirstVictims(const Queued& q, size_t count, bool* all) const {
  std::vector<size_t> out;
  size_t i = first_untaken_;
  for (; i < victims_.size() && out.size() < count; ++i) {
    if (!victims_[i].taken && EligibleFor(victims_[i], q)) out.push_back(i);
  }
  *all = true;
  for (; i < victims_.size() && *all; ++i) *all = victims_[i].taken || !EligibleFor(victims_[i], q);
  return out;
}

// Where `q` would be placed once `stopping` (workers) and `victims` stopped, with the idle
// workers: the workers it would use, or none.
std::vector<size_t> Pass::FitWith(const Queued& q, const std::vector<size_t>& stopping,
                                  const std::vector<size_t>& victims, Placement* placement) {
  if (freed_.empty()) {
    freed_ = workers_;  // a stopped job's memory comes back: its devices count whole
    for (WorkerView& w : freed_) {
      if (!w.busy) continue;
      for (DeviceView& d : w.devices) d.free_bytes = std::max(d.free_bytes, d.total_bytes);
    }
  }
  std::vector<size_t> pool = idle_;
  pool.insert(pool.end(), stopping.begin(), stopping.end());
  for (size_t v : victims) pool.insert(pool.end(), victims_[v].reusable.begin(), victims_[v].reusable.end());
  WaitReason ignored;
  return PlaceOn(*q.job, freed_, pool, placement, &ignored);
}

// Chooses the victims for `q` (none already stopping for it, then 1, 2, 4, ... of the eligible
// ones, until it fits or even all do not): those its placement would use. True with *why
// kPreempting when it will be placed once they stopped; false (nothing decided) otherwise.
bool Pass::Preempt(const Queued& q, WaitReason* why) {
  if (!MayPreempt(q)) return false;
  auto mine = stopping_for_.find(q.job->id);
  const std::vector<size_t> stopping = mine == stopping_for_.end() ? std::vector<size_t>{} : mine->second;
  const std::pair<int64_t, size_t> shape{q.job->placement_class, q.team};
  const bool alike = shape.first >= 0 && stopping.empty();  // later jobs of its class and team choose alike
  if (alike && no_victims_.count(shape)) return false;
  Placement placement;
  std::vector<size_t> at, victims;
  bool all = false;
  for (size_t count = stopping.empty() ? 1 : 0; at.empty() && !all; count = std::max<size_t>(1, 2 * count)) {
    victims = FirstVictims(q, count, &all);
    at = FitWith(q, stopping, victims, &placement);
  }
  if (at.empty()) {
    if (alike) no_victims_.insert(shape);
    return false;
  }
  const WaitReason decided = Decide(q, stopping, victims, at, static_cast<int64_t>(placement.ranks.size()));
  if (decided.why == Why::kNone) return false;
  *why = decided;
  return true;
}

// Records the victims `q`'s placement on `at` uses, keeps the idle workers it uses from later
// jobs of the pass, and counts its devices for its team. Its wait reason (kNone: it uses none).
WaitReason Pass::Decide(const Queued& q, const std::vector<size_t>& stopping,
                        const std::vector<size_t>& victims, const std::vector<size_t>& at, int64_t devices) {
  const auto uses = [&](size_t w) { return std::find(at.begin(), at.end(), w) != at.end(); };
  const auto why_of = [&](const RunningView& r) {
    return r.priority < q.job->priority ? Preemption::Why::kPriority : Preemption::Why::kReclaim;
  };
  WaitReason why;
  std::set<std::string_view> named;
  const auto name = [&](const RunningView& r, const WorkerView& w) {
    if (!named.insert(r.job_id).second) return;
    if (named.size() == 1)
      why = {Why::kPreempting, w.id, static_cast<int64_t>(why_of(r)), 0, std::nullopt, r.job_id};
    why.offered = static_cast<int64_t>(named.size()) - 1;
  };
  for (size_t w : stopping) {
    if (uses(w)) name(*workers_[w].running, workers_[w]);
  }
  for (size_t v : victims) {
    Victim& victim = victims_[v];
    auto used = std::find_if(victim.reusable.begin(), victim.reusable.end(), uses);
    if (used == victim.reusable.end()) continue;
    victim.taken = true;
    borrowed_by_team_[victim.team] -= victim.view->borrowed ? 1 : 0;
    borrowed_ -= victim.view->borrowed ? 1 : 0;
    Preemption p{victim.view->job_id, {}, q.job->id, why_of(*victim.view)};
    for (size_t w : victim.workers) p.worker_ids.push_back(workers_[w].id);
    result_.preemptions.push_back(std::move(p));
    name(*victim.view, workers_[*used]);
  }
  if (why.why == Why::kNone) return why;
  Take(at);
  fair_.AddRunning(q.team, devices);
  return why;
}

}  // namespace

ScheduleResult Schedule(const std::vector<const JobView*>& queued, const std::vector<WorkerView>& workers,
                        int64_t now_wall_ms, const SchedulerOptions& options, const FairShareInput& teams) {
  return Pass(workers, now_wall_ms, options, teams).Run(queued);
}

std::map<std::string, int64_t> RunningDevicesByTeam(const std::vector<WorkerView>& workers) {
  std::map<std::string, int64_t> out;
  for (const WorkerView& w : workers) {
    if (w.busy && w.running) out[w.running->team] += w.running->devices;
  }
  return out;
}

}  // namespace ft
