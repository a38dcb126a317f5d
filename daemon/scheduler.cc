#include "daemon/scheduler.h"

#include <algorithm>

namespace ft {

namespace {

// The device kind a job may use on `w`, or "" when none.
std::string UsableKind(const JobView& job, const WorkerView& w) {
  auto count = [&](const std::string& kind) {
    return std::count_if(w.devices.begin(), w.devices.end(),
                         [&](const DeviceView& d) { return d.kind == kind; });
  };
  if (job.device != "cpu" && count("cuda") >= job.gpus) return "cuda";
  if (job.device != "cuda" && count("cpu") >= 1 && job.gpus == 1) return "cpu";
  return "";
}

// The smallest free memory among the devices the job would use.
int64_t FreeForGang(const WorkerView& w, const std::string& kind, int64_t gpus) {
  std::vector<int64_t> free;
  for (const DeviceView& d : w.devices) {
    if (d.kind == kind) free.push_back(d.free_bytes);
  }
  std::sort(free.rbegin(), free.rend());
  return free.size() >= static_cast<size_t>(gpus) ? free[gpus - 1] : 0;
}

std::string DoesNotFit(int64_t needs, int64_t largest_free) {
  return "waits: does not fit: needs " + FormatBytes(needs) +
         " per device at micro-batch 1, the largest free is " + FormatBytes(largest_free);
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

// Places `job` on the first usable worker not yet taken: that worker's index,
// or -1 with why it waits in *why.
int PlaceOn(const JobView& job, const std::vector<WorkerView>& workers, const std::vector<bool>& taken,
            int64_t now_wall_ms, const SchedulerOptions& options, Placement* placement, std::string* why) {
  *why = "waits: no live worker";
  int64_t best_free = 0;
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
    const std::string kind = UsableKind(job, w);
    if (kind.empty()) {
      *why = "waits: no worker has " + std::to_string(job.gpus) + " " +
             (job.device == "auto" ? "" : job.device + " ") + "device(s)";
      continue;
    }
    const int64_t free = FreeForGang(w, kind, job.gpus);
    StatusOr<BatchPlanChoice> choice = ChoosePlan(job, kind, free);
    if (choice.ok() && kind == "cpu" && choice->memory.total() + choice->memory.host_total() > free) {
      // The host buffers share the CPU device's memory: a plan that leaves them room.
      choice = ChoosePlan(job, kind, free - choice->memory.host_total());
    }
    if (!choice.ok()) {
      best_free = std::max(best_free, free);
      PlanRequest request = job.plan;
      request.device = kind;
      request.world = job.gpus;
      *why = DoesNotFit(PredictMemory(request, 1).total(), best_free);
      continue;
    }
    // The memory techniques' host buffers: on a CPU device they come out of the same memory.
    // Each rank of a gang on this worker has its own host buffers.
    if (const int64_t host = choice->memory.host_total() * job.gpus; host > 0) {
      const int64_t offered = kind == "cpu" ? free - choice->memory.total() : w.host_free_bytes;
      if ((kind == "cpu" || w.host_free_bytes > 0) && host > offered) {
        *why = "waits: needs " + FormatBytes(host) +
               " of host memory for its memory techniques (cpu_offload, paged_adamw, activation offload); "
               "worker " +
               w.id + " has " + FormatBytes(std::max<int64_t>(offered, 0)) + " to spare";
        continue;
      }
    }
    *placement = {job.id, w.id, *choice, kind};
    return static_cast<int>(i);
  }
  return -1;
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
    const int at = PlaceOn(*job, workers, taken, now_wall_ms, options, &placement, &why);
    if (at < 0) {
      result.waiting[job->id] = why;
      continue;
    }
    result.placements.push_back(std::move(placement));
    taken[static_cast<size_t>(at)] = true;
  }
  return result;
}

}  // namespace ft
