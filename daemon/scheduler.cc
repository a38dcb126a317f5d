#include "daemon/scheduler.h"

#include <algorithm>

namespace ft {

namespace {

std::string DoesNotFit(int64_t needs, int64_t largest_free) {
  return "waits: does not fit: needs " + FormatBytes(needs) +
         " per device at micro-batch 1, the largest free is " + FormatBytes(largest_free);
}

bool KindAllowed(const JobView& job, const std::string& kind) {
  return job.device == "auto" || job.device == kind;
}

// The devices of `kind` on `w`, most free memory first.
std::vector<const DeviceView*> DevicesOf(const WorkerView& w, const std::string& kind) {
  std::vector<const DeviceView*> out;
  for (const DeviceView& d : w.devices)
    if (d.kind == kind) out.push_back(&d);
  std::stable_sort(out.begin(), out.end(),
                   [](const DeviceView* a, const DeviceView* b) { return a->free_bytes > b->free_bytes; });
  return out;
}

}  // namespace

int64_t MinBytesPerDevice(const JobView& job, const std::string& kind) {
  const int64_t cached = kind == "cuda" ? job.min_bytes_cuda : job.min_bytes_cpu;
  if (cached > 0) return cached;
  PlanRequest request = job.plan;
  request.device = kind;
  request.world = job.gpus;
  return PredictMemory(request, job.fixed_micro_batch > 0 ? job.fixed_micro_batch : 1).total();
}

namespace {

// Why `job` waits before any worker is tried (backoff, or more memory than
// any available worker offers at micro-batch 1), or "" when it may be placed.
std::string WaitsBeforePlacement(const JobView& job, const std::map<std::string, int64_t>& best_free,
                                 int64_t now_wall_ms) {
  if (job.not_before_ms > now_wall_ms) {
    return "waits: backing off after the last attempt (" +
           std::to_string((job.not_before_ms - now_wall_ms + 999) / 1000) + " s)";
  }
  if (best_free.empty()) return "";
  bool may_fit = false;
  int64_t needs = 0, offered = 0;
  for (const auto& [kind, free] : best_free) {
    if ((job.device == "cpu" && kind != "cpu") || (job.device == "cuda" && kind != "cuda")) continue;
    needs = MinBytesPerDevice(job, kind);
    offered = std::max(offered, free);
    may_fit |= needs <= free;
  }
  return !may_fit && offered > 0 ? DoesNotFit(needs, offered) : "";
}

// The batch plan for `job` on `kind` devices with `free` bytes each: the
// user's fixed micro-batch when it fits, else the largest that fits.
StatusOr<BatchPlanChoice> ChoosePlan(const JobView& job, const std::string& kind, int64_t free) {
  PlanRequest request = job.plan;
  request.device = kind;
  request.world = job.gpus;
  if (job.fixed_micro_batch <= 0) return ChooseMicroBatch(request, free);
  MemoryBreakdown m = PredictMemory(request, job.fixed_micro_batch);
  if (m.total() > free) return Status::ResourceExhausted("does not fit");
  return BatchPlanChoice{job.fixed_micro_batch, request.global_batch / (job.fixed_micro_batch * job.gpus),
                         job.gpus, m, free};
}

// The ranks of `job` on `kind` devices: rank r on workers[worker_of[r]]'s
// device device_of[r]. Fits the plan to the least free memory among them and
// checks each worker's host memory for its ranks' technique buffers. The
// placement, or why it waits in *why.
bool FitGang(const JobView& job, const std::vector<WorkerView>& workers, const std::string& kind,
             const std::vector<size_t>& worker_of, const std::vector<const DeviceView*>& device_of,
             Placement* placement, std::string* why) {
  int64_t free = device_of.front()->free_bytes;
  for (const DeviceView* d : device_of) free = std::min(free, d->free_bytes);
  StatusOr<BatchPlanChoice> choice = ChoosePlan(job, kind, free);
  if (choice.ok() && kind == "cpu" && choice->memory.total() + choice->memory.host_total() > free) {
    // The host buffers share the CPU device's memory: a plan that leaves them room.
    choice = ChoosePlan(job, kind, free - choice->memory.host_total());
  }
  if (!choice.ok()) {
    PlanRequest request = job.plan;
    request.device = kind;
    request.world = job.gpus;
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
      const int64_t offered = kind == "cpu" ? (free - choice->memory.total()) * ranks : w.host_free_bytes;
      if ((kind == "cpu" || w.host_free_bytes > 0) && host > offered) {
        *why = "waits: needs " + FormatBytes(host) +
               " of host memory for its memory techniques (cpu_offload, paged_adamw, activation offload); "
               "worker " +
               w.id + " has " + FormatBytes(std::max<int64_t>(offered, 0)) + " to spare";
        return false;
      }
    }
  }
  *placement = {job.id, workers[worker_of.front()].id, *choice, kind, {}};
  for (size_t r = 0; r < worker_of.size(); ++r)
    placement->ranks.push_back({workers[worker_of[r]].id, device_of[r]->index});
  return true;
}

// Places `job` on usable workers not yet taken: on one worker with enough
// devices when there is one, else (multi-rank jobs) across several. The
// workers' indices (rank 0's first), or none with why it waits in *why.
std::vector<size_t> PlaceOn(const JobView& job, const std::vector<WorkerView>& workers,
                            const std::vector<bool>& taken, int64_t now_wall_ms,
                            const SchedulerOptions& options, Placement* placement, std::string* why) {
  *why = "waits: no live worker";
  std::vector<size_t> idle;  // usable workers, in order
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerView& w = workers[i];
    if (!w.alive || taken[i] || w.busy || w.draining) {
      if (w.alive && *why == "waits: no live worker") *why = "waits: every worker is busy";
      continue;
    }
    if (w.slot_end_ms > 0 && w.slot_end_ms - now_wall_ms < options.min_slot_ms) {
      *why = "waits: worker " + w.id + "'s slot ends in less than " +
             std::to_string(options.min_slot_ms / 1000) + " s";
      continue;
    }
    idle.push_back(i);
  }
  if (idle.empty()) return {};
  const bool gang = job.gpus > 1;
  const std::string devices = std::to_string(job.gpus) + " " +
                              (job.device == "auto" ? "" : job.device + " ") +
                              (gang ? "devices (one per rank)" : "device");
  *why = "waits: no worker has " + devices;
  // One worker with every device the job needs.
  for (size_t i : idle) {
    for (const std::string kind : {"cuda", "cpu"}) {
      if (!KindAllowed(job, kind)) continue;
      std::vector<const DeviceView*> mine = DevicesOf(workers[i], kind);
      if (mine.size() < static_cast<size_t>(job.gpus)) continue;
      if (gang && !workers[i].serves_rendezvous) {
        *why = "waits: worker " + workers[i].id + " reports no rendezvous ports for a multi-rank job";
        continue;
      }
      mine.resize(static_cast<size_t>(job.gpus));
      if (FitGang(job, workers, kind, std::vector<size_t>(mine.size(), i), mine, placement, why)) return {i};
      break;  // the other kind is tried only where this worker has none of this one
    }
  }
  if (!gang) return {};
  // Across workers: those with the most free devices first, rank 0 on one that serves the rendezvous.
  for (const std::string kind : {"cuda", "cpu"}) {
    if (!KindAllowed(job, kind)) continue;
    std::vector<std::pair<size_t, std::vector<const DeviceView*>>> offers;
    int64_t offered = 0;
    for (size_t i : idle) {
      std::vector<const DeviceView*> mine = DevicesOf(workers[i], kind);
      if (mine.empty()) continue;
      offered += static_cast<int64_t>(mine.size());
      offers.emplace_back(i, std::move(mine));
    }
    if (offered < job.gpus) {
      if (offered > 0 || job.device == kind) {
        *why = "waits: needs " + std::to_string(job.gpus) + " " + kind +
               " devices (one per rank); the idle workers offer " + std::to_string(offered);
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
      *why = "waits: no idle worker reports rendezvous ports to host rank 0 of a multi-rank job";
      continue;
    }
    std::vector<size_t> worker_of, chosen;
    std::vector<const DeviceView*> device_of;
    for (const auto& [i, mine] : offers) {
      chosen.push_back(i);
      for (const DeviceView* d : mine) {
        if (device_of.size() == static_cast<size_t>(job.gpus)) break;
        worker_of.push_back(i);
        device_of.push_back(d);
      }
      if (device_of.size() == static_cast<size_t>(job.gpus)) break;
    }
    if (FitGang(job, workers, kind, worker_of, device_of, placement, why)) return chosen;
  }
  return {};
}

}  // namespace

ScheduleResult Schedule(const std::vector<const JobView*>& queued, const std::vector<WorkerView>& workers,
                        int64_t now_wall_ms, const SchedulerOptions& options) {
  std::vector<const JobView*> jobs = queued;
  std::stable_sort(jobs.begin(), jobs.end(), [](const JobView* a, const JobView* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->created_ms < b->created_ms;
  });
  ScheduleResult result;
  std::vector<bool> taken(workers.size(), false);
  // The most free memory any available worker offers per device kind: a job
  // that needs more at micro-batch 1 waits without a walk over the workers.
  std::map<std::string, int64_t> best_free;
  for (const WorkerView& w : workers) {
    if (!w.alive || w.busy || w.draining) continue;
    for (const DeviceView& d : w.devices) best_free[d.kind] = std::max(best_free[d.kind], d.free_bytes);
  }
  for (const JobView* job : jobs) {
    if (std::string why = WaitsBeforePlacement(*job, best_free, now_wall_ms); !why.empty()) {
      result.waiting[job->id] = why;
      continue;
    }
    Placement placement;
    std::string why;
    const std::vector<size_t> at = PlaceOn(*job, workers, taken, now_wall_ms, options, &placement, &why);
    if (at.empty()) {
      result.waiting[job->id] = why;
      continue;
    }
    result.placements.push_back(std::move(placement));
    for (size_t i : at) taken[i] = true;
  }
  return result;
}

}  // namespace ft
