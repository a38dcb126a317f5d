#include "daemon/scheduler.h"

#include <algorithm>

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

ScheduleResult Schedule(const std::vector<const JobView*>& queued, const std::vector<WorkerView>& workers,
                        int64_t now_wall_ms, const SchedulerOptions& options) {
  const QueueOrder before;
  std::vector<const JobView*> sorted;
  const std::vector<const JobView*>* jobs = &queued;
  if (!std::is_sorted(queued.begin(), queued.end(), before)) {
    sorted = queued;
    std::stable_sort(sorted.begin(), sorted.end(), before);
    jobs = &sorted;
  }
  ScheduleResult result;
  result.waiting.reserve(jobs->size());
  WaitReason none_usable;
  std::vector<size_t> idle = UsableWorkers(workers, now_wall_ms, options, &none_usable);
  // The most free memory any available worker offers per device kind: a job
  // that needs more at micro-batch 1 waits without a walk over the workers.
  std::map<DeviceKind, int64_t> best_free;
  for (const WorkerView& w : workers) {
    if (!w.alive || w.busy || w.draining) continue;
    for (const DeviceView& d : w.devices) best_free[d.kind] = std::max(best_free[d.kind], d.free_bytes);
  }
  // A class that failed while `idle` had this many workers fails alike until one is taken.
  std::unordered_map<int64_t, std::pair<size_t, WaitReason>> failed;
  // Once every usable worker is taken: the workers taken this pass are busy now.
  const WaitReason all_taken =
      none_usable.why == Why::kSlotEndsSoon ? none_usable : WaitReason{Why::kEveryWorkerBusy};
  const bool any_usable = !idle.empty();
  for (const JobView* job : *jobs) {
    WaitReason why = WaitsBeforePlacement(*job, best_free, now_wall_ms);
    if (why.why == Why::kNone && idle.empty()) why = any_usable ? all_taken : none_usable;
    auto seen = job->placement_class >= 0 ? failed.find(job->placement_class) : failed.end();
    if (why.why == Why::kNone && seen != failed.end() && seen->second.first == idle.size()) {
      why = seen->second.second;
    }
    if (why.why != Why::kNone) {
      result.waiting.emplace_back(job, why);
      continue;
    }
    Placement placement;
    const std::vector<size_t> at = PlaceOn(*job, workers, idle, &placement, &why);
    if (at.empty()) {
      if (job->placement_class >= 0) failed[job->placement_class] = {idle.size(), why};
      result.waiting.emplace_back(job, why);
      continue;
    }
    result.placements.push_back(std::move(placement));
    std::erase_if(idle, [&](size_t i) { return std::find(at.begin(), at.end(), i) != at.end(); });
  }
  return result;
}

}  // namespace ft
