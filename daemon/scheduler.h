// One scheduling pass: which queued job goes to which worker, and which
// running jobs to stop for a queued one.
//
// Pure logic over snapshots (no I/O, no locks), so a pass over 10,000 queued
// jobs can be timed and tested on its own. Order: priority classes (higher
// first); within a class, the team furthest below its fair share first
// (FairShare::Standing: its usage per unit of weight, a running device
// counting as the usage it will reach, so each placement of the pass moves
// its team back); within a team, submission time (FIFO). A job is placed only
// on a live, idle worker whose device memory fits the job at micro-batch ≥ 1
// according to the memory planner (and, for a job using memory techniques,
// whose host memory fits what they keep there: on a CPU device the host is
// the device, so both count against it), whose remaining slot is long
// enough, and (multi-GPU jobs) which has enough devices of the right kind. A
// multi-rank job (resources.gpus = N) is a gang: its N ranks go to N devices
// of one worker when one has them, else across several idle workers (rank 0
// on one that can serve the rendezvous; every device of the gang must fit the
// plan) — placed whole or not at all. An elastic job (resources.min_gpus <
// gpus) gets the largest world it can be placed with now; while it waits, its
// reason is the smallest world's.
// A job that is not placed gets a reason (WaitReason, shown as "waits: ...").
//
// Quotas and borrowing (Kueue's nominal quota and cohort borrowing): a job
// whose team would run more than its quota with it (resources.gpus counted)
// is tried only after every job of the pass within quota, on what is still
// idle; placed so, it is borrowed (Placement::borrowed), else it waits for
// its team's quota.
//
// Preemption: a job within its team's quota that cannot be placed (backoff
// aside) may have running jobs stopped for it, when freeing them (with the
// idle workers) lets it be placed: jobs of a lower priority class, and, when
// its team has a quota, other teams' borrowed jobs. Chosen in order: lowest
// class, borrowed before nominal, least work since the last checkpoint; only
// as many as its placement uses, all or none; never a job younger than
// min_runtime_ms, nor one on a draining worker (already stopping). The job
// waits this pass (kPreempting), the idle workers it counts on are kept from
// later jobs of the pass, and in later passes the workers stopping for it
// (RunningView::preempted_for) count as its own, so no further victims are
// chosen while those stop.
//
// Cost of a pass (100,000 queued jobs, 10,000 workers): the jobs come in
// queue order (the daemon keeps them so: no sort) and are split once into
// FIFO lists per (priority, team), merged by a heap over the class's teams
// (a placement moves only its own team: O(log teams)); the usable workers are
// listed once, a job needing more than any of them offers waits without a
// walk over the workers, and jobs of one placement class (PlacementClasses:
// the same devices, micro-batch and plan request) that fail to be placed fail
// alike until a worker is taken, so one walk stands for all of them (and one
// failed search for victims stands for the class's later jobs of the team).
// Wait reasons are structs; the caller formats only those that changed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/device_kind.h"
#include "daemon/fair_share.h"
#include "daemon/store.h"
#include "engine/job/planner.h"

namespace ft {

struct DeviceView {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  // the worker's device index
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
};

// The scheduler's view of a device a worker reported (its kind as on the
// wire); nullopt for a kind this ftd does not know, which no job is placed on.
std::optional<DeviceView> DeviceViewOf(const DeviceRow& d);

// A job running on a worker (a gang's ranks on several workers appear on each
// of them, with the same job_id).
struct RunningView {
  std::string job_id;
  std::string team;  // "" = no team
  int64_t priority = 0;
  int64_t devices = 0;             // devices it holds on this worker
  bool borrowed = false;           // placed beyond its team's quota (Placement::borrowed)
  int64_t started_ms = 0;          // wall time its attempt started
  int64_t last_checkpoint_ms = 0;  // wall time of its last committed checkpoint; 0 = none yet
  std::string preempted_for;       // the queued job it is being stopped for (Preemption); "" = none
};

struct WorkerView {
  std::string id;
  bool alive = false;
  bool busy = false;        // runs an attempt already (one job per worker)
  bool draining = false;    // preempted / slot ending: no new work
  int64_t slot_end_ms = 0;  // 0 = none
  std::vector<DeviceView> devices;
  int64_t host_free_bytes = 0;         // the node's available host memory; 0 = not reported (not checked)
  bool serves_rendezvous = true;       // may host rank 0 of a multi-rank job (reports rendezvous ports)
  std::optional<RunningView> running;  // the job it runs (busy); none: not known, never preempted
};

// The fields a pass reads for every queued job come first, the planner's
// request last: a pass over 100,000 jobs is bound by reading their views.
struct JobView {
  std::string id;
  int64_t priority = 0;
  int64_t created_ms = 0;
  std::string team;           // "" = no team (a team with the default policy)
  int64_t not_before_ms = 0;  // backoff after a preemption or failure
  DeviceRequest device = DeviceRequest::kAuto;
  // The least memory the job needs per device of each kind (its smallest
  // plan), cached by whoever builds the view (MakeJobView); 0 = not known,
  // the pass computes it. Lets a pass skip a job that fits nowhere cheaply.
  int64_t min_bytes_cpu = 0;
  int64_t min_bytes_cuda = 0;
  // Jobs of one class are placed alike (PlacementClasses::Of); -1: a class of its own.
  int64_t placement_class = -1;
  int64_t gpus = 1;
  // An elastic job (min_gpus < gpus) starts with the most ranks in
  // [min_gpus, gpus] that can be placed now and that split its batch_units
  // (global batch / fixed micro-batch, or the global batch) evenly. 0: gpus.
  int64_t min_gpus = 0;
  int64_t batch_units = 1;
  int64_t fixed_micro_batch = 0;  // the job's own micro_batch_size (0 = auto: the planner picks)
  PlanRequest plan;               // model shape and job settings for the planner
};

// The queue's order: priority (higher first), then submission time, then id.
struct QueueOrder {
  bool operator()(const JobView* a, const JobView* b) const;
};

// Interns placement classes: jobs whose gpus, device request, fixed
// micro-batch and plan request are all equal get one id, so a pass that
// failed to place one of them knows the others fail too (until a worker is
// taken). Ids are never reused; distinct classes are few (one per job shape).
class PlacementClasses {
 public:
  int64_t Of(const JobView& job);

 private:
  struct Entry {
    int64_t gpus;
    int64_t min_gpus;
    DeviceRequest device;
    int64_t fixed_micro_batch;
    PlanRequest plan;
    int64_t id;
  };
  std::unordered_map<size_t, std::vector<Entry>> by_hash_;
  int64_t next_ = 0;
};

// The least memory `job` needs per device of `kind`: the planner's
// prediction at its fixed micro-batch, or at micro-batch 1.
int64_t MinBytesPerDevice(const JobView& job, DeviceKind kind);

struct Placement {
  std::string job_id;
  std::string worker_id;  // rank 0's
  BatchPlanChoice plan;
  DeviceKind device_kind = DeviceKind::kCpu;
  // Where every rank runs, by rank (one entry for a one-rank job).
  std::vector<RankSlot> ranks;
  bool borrowed = false;  // beyond its team's quota, on devices no team within quota took this pass
};

// Why a queued job is not placed in a pass: the state the pass keeps while
// it tries workers (a later reason replaces an earlier one), shown to the
// user through FormatWaitReason.
struct WaitReason {
  enum class Why {
    kNone,                // placed, or not yet tried
    kBackoff,             // needs = seconds left
    kDoesNotFit,          // needs = bytes per device at micro-batch 1, offered = the largest free
    kNoLiveWorker,        //
    kEveryWorkerBusy,     //
    kSlotEndsSoon,        // worker; needs = the least slot (seconds)
    kNoWorkerHasDevices,  // needs = devices; device = the kind asked for (none: any)
    kWorkerNoRendezvous,  // worker (a multi-rank job on one worker)
    kHostMemory,          // worker; needs = host bytes, offered = bytes to spare
    kTooFewDevices,       // needs = devices, offered = devices the idle workers have; device
    kNoRendezvousHost,    // no idle worker can host rank 0
    kTeamQuota,           // name = the team; needs = its running devices, offered = its quota
    kPreempting,  // name = a victim job, on worker; needs = its Preemption::Why, offered = other victims
  };
  Why why = Why::kNone;
  std::string worker;
  int64_t needs = 0;
  int64_t offered = 0;
  std::optional<DeviceKind> device;
  std::string name;  // kTeamQuota: the team; kPreempting: the victim job
  bool operator==(const WaitReason&) const = default;
};

// The user's text: "waits: every worker is busy", "waits: does not fit:
// needs 2.00 GiB per device at micro-batch 1, the largest free is ..."; ""
// for kNone.
std::string FormatWaitReason(const WaitReason& reason);

// A running job to stop (checkpoint, exit, requeue) so that a queued one can be placed.
struct Preemption {
  enum class Why {
    kPriority,  // the queued job is of a higher priority class
    kReclaim,   // the queued job's team reclaims its quota from a borrowed job
  };
  std::string victim_job_id;
  std::vector<std::string> worker_ids;  // every worker the victim runs on: all of them are freed
  std::string for_job_id;
  Why why = Why::kPriority;
};

struct ScheduleResult {
  std::vector<Placement> placements;
  std::vector<std::pair<const JobView*, WaitReason>> waiting;  // every job not placed, and why
  std::vector<Preemption> preemptions;                         // decided this pass (none twice: see above)
};

struct SchedulerOptions {
  int64_t min_slot_ms = 60'000;                 // don't start on a worker whose slot ends sooner
  int64_t fair_share_half_life_ms = 3'600'000;  // team usage halves per this (DecayedUsage)
  int64_t min_runtime_ms = 300'000;             // a job younger than this is never preempted
};

// `jobs` best in QueueOrder (sorted here when not); `now_wall_ms` for slot
// ends, backoff and running times; `teams`: policies and decayed usage (none:
// every team has the defaults and no usage).
ScheduleResult Schedule(const std::vector<const JobView*>& jobs, const std::vector<WorkerView>& workers,
                        int64_t now_wall_ms, const SchedulerOptions& options,
                        const FairShareInput& teams = {});

// The devices each team's running jobs hold (RunningView::devices summed over
// the workers), for AccrueUsage.
std::map<std::string, int64_t> RunningDevicesByTeam(const std::vector<WorkerView>& workers);

}  // namespace ft
