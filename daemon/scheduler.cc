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
  for (const JobView* job_ptr : jobs) {
    const JobView& job = *job_ptr;
    if (job.not_before_ms <= now_wall_ms && !best_free.empty()) {
      bool may_fit = false;
      int64_t needs = 0, offered = 0;
      for (const auto& [kind, free] : best_free) {
        if ((job.device == "cpu" && kind != "cpu") || (job.device == "cuda" && kind != "cuda")) continue;
        needs = MinBytesPerDevice(job, kind);
        offered = std::max(offered, free);
        may_fit |= needs <= free;
      }
      if (!may_fit && offered > 0) {
        result.waiting[job.id] = DoesNotFit(needs, offered);
        continue;
      }
    }
    if (job.not_before_ms > now_wall_ms) {
      result.waiting[job.id] = "waits: backing off after the last attempt (" +
                               std::to_string((job.not_before_ms - now_wall_ms + 999) / 1000) + " s)";
      continue;
    }
    std::string why = "waits: no live worker";
    int64_t best_free = 0;
    int64_t needs = 0;
    bool placed = false;
    for (size_t i = 0; i < workers.size() && !placed; ++i) {
      const WorkerView& w = workers[i];
      if (!w.alive || taken[i] || w.busy || w.draining) {
        if (w.alive && why == "waits: no live worker") why = "waits: every worker is busy";
        continue;
      }
      if (w.slot_end_ms > 0 && w.slot_end_ms - now_wall_ms < options.min_slot_ms) {
        why = "waits: worker " + w.id + "'s slot ends in less than " +
              std::to_string(options.min_slot_ms / 1000) + " s";
        continue;
      }
      const std::string kind = UsableKind(job, w);
      if (kind.empty()) {
        why = "waits: no worker has " + std::to_string(job.gpus) + " " +
              (job.device == "auto" ? "" : job.device + " ") + "device(s)";
        continue;
      }
      PlanRequest request = job.plan;
      request.device = kind;
      request.world = job.gpus;
      const int64_t free = FreeForGang(w, kind, job.gpus);
      StatusOr<BatchPlanChoice> choice = Status::ResourceExhausted("does not fit");
      if (job.fixed_micro_batch > 0) {
        // The user's plan is kept as given; it only has to fit.
        MemoryBreakdown m = PredictMemory(request, job.fixed_micro_batch);
        if (m.total() <= free) {
          choice =
              BatchPlanChoice{job.fixed_micro_batch,
                              request.global_batch / (job.fixed_micro_batch * job.gpus), job.gpus, m, free};
        }
      } else {
        choice = ChooseMicroBatch(request, free);
      }
      if (!choice.ok()) {
        best_free = std::max(best_free, free);
        needs = PredictMemory(request, 1).total();
        why = DoesNotFit(needs, best_free);
        continue;
      }
      result.placements.push_back({job.id, w.id, *choice, kind});
      taken[i] = true;
      placed = true;
    }
    if (!placed) result.waiting[job.id] = why;
  }
  return result;
}

}  // namespace ft
