// The scheduler's wait reasons (WaitReason + FormatWaitReason) and its device
// kinds (DeviceKind, converted from the wire at DeviceViewOf).
#include "daemon/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/model/model_config.h"

namespace ft {
namespace {

using Why = WaitReason::Why;

// Every reason reads as the text users saw when the reason was a string.
TEST(SchedulerTest, EveryWaitReasonFormatsAsBefore) {
  const struct {
    WaitReason reason;
    std::string text;
  } cases[] = {
      {{Why::kNone}, ""},
      {{Why::kBackoff, "", 7}, "waits: backing off after the last attempt (7 s)"},
      {{Why::kDoesNotFit, "", int64_t{3} << 30, int64_t{1} << 30},
       "waits: does not fit: needs 3.00 GiB per device at micro-batch 1, the largest free is 1.00 GiB"},
      {{Why::kNoLiveWorker}, "waits: no live worker"},
      {{Why::kEveryWorkerBusy}, "waits: every worker is busy"},
      {{Why::kSlotEndsSoon, "w1", 60}, "waits: worker w1's slot ends in less than 60 s"},
      {{Why::kNoWorkerHasDevices, "", 1}, "waits: no worker has 1 device"},
      {{Why::kNoWorkerHasDevices, "", 4, 0, DeviceKind::kCuda},
       "waits: no worker has 4 cuda devices (one per rank)"},
      {{Why::kWorkerNoRendezvous, "w2"}, "waits: worker w2 reports no rendezvous ports for a multi-rank job"},
      {{Why::kHostMemory, "w3", int64_t{2} << 30, int64_t{1} << 20},
       "waits: needs 2.00 GiB of host memory for its memory techniques (cpu_offload, paged_adamw, activation "
       "offload); worker w3 has 1.0 MiB to spare"},
      {{Why::kTooFewDevices, "", 4, 2, DeviceKind::kCpu},
       "waits: needs 4 cpu devices (one per rank); the idle workers offer 2"},
      {{Why::kNoRendezvousHost},
       "waits: no idle worker reports rendezvous ports to host rank 0 of a multi-rank job"},
  };
  for (const auto& c : cases) EXPECT_EQ(FormatWaitReason(c.reason), c.text);
}

// A worker's device kind comes as text on the wire: known kinds are placed on,
// an unknown one is left out of scheduling.
TEST(SchedulerTest, DeviceKindsAreReadAtTheEdgeAndUnknownOnesLeftOut) {
  DeviceRow cuda{.index = 1, .kind = "cuda", .total_bytes = 80, .free_bytes = 70};
  std::optional<DeviceView> view = DeviceViewOf(cuda);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->kind, DeviceKind::kCuda);
  EXPECT_EQ(view->index, 1);
  EXPECT_EQ(view->free_bytes, 70);
  EXPECT_FALSE(DeviceViewOf(DeviceRow{.kind = "tpu"}).has_value());
}

// A job asking for cpu waits on a worker that only has a GPU, naming the kind.
TEST(SchedulerTest, ACpuJobWaitsOnAGpuOnlyWorkerNamingTheKind) {
  JobView job;
  job.id = "j";
  job.device = DeviceRequest::kCpu;
  job.min_bytes_cpu = job.min_bytes_cuda = 1;
  WorkerView worker{.id = "w", .alive = true, .devices = {{DeviceKind::kCuda, 0, 1 << 30, 1 << 30}}};
  ScheduleResult r = Schedule({&job}, {worker}, 0, {});
  EXPECT_TRUE(r.placements.empty());
  ASSERT_EQ(r.waiting.size(), 1u);
  EXPECT_EQ(r.waiting[0].first, &job);
  EXPECT_EQ(FormatWaitReason(r.waiting[0].second), "waits: no worker has 1 cpu device");
}

// A LoRA job's view on the tiny preset (the planner's memory for it), of the class `classes` gives it.
JobView TinyJob(const std::string& id, int64_t created_ms, PlacementClasses& classes, int64_t seq_len = 64) {
  JobView job;
  job.id = id;
  job.created_ms = created_ms;
  job.device = DeviceRequest::kCpu;
  job.plan.model = *PresetModelConfig("tiny-llama");
  job.plan.seq_len = seq_len;
  job.plan.global_batch = 8;
  job.min_bytes_cpu = MinBytesPerDevice(job, DeviceKind::kCpu);
  job.placement_class = classes.Of(job);
  return job;
}

WorkerView CpuWorker(const std::string& id, int64_t bytes) {
  return {.id = id, .alive = true, .devices = {{DeviceKind::kCpu, 0, bytes, bytes}}};
}

// Jobs that differ only in id and time share a class; another plan request is another class.
TEST(SchedulerTest, JobsAlikeShareAPlacementClass) {
  PlacementClasses classes;
  const JobView a = TinyJob("a", 1, classes), b = TinyJob("b", 2, classes);
  const JobView longer = TinyJob("c", 3, classes, 128);
  EXPECT_EQ(a.placement_class, b.placement_class);
  EXPECT_NE(a.placement_class, longer.placement_class);
  JobView two_ranks = a;
  two_ranks.gpus = 2;
  EXPECT_NE(classes.Of(two_ranks), a.placement_class);
}

// A class's failure stands for its later jobs only while the usable workers are the same: here
// the small worker fits neither long job, the large one fits one; the class of the short jobs
// is placed on what is left, and in queue order (given out of order).
TEST(SchedulerTest, AClassThatFailedIsTriedAgainOnlyAfterAWorkerIsTaken) {
  PlacementClasses classes;
  const JobView shorter = TinyJob("s", 5, classes);
  const int64_t short_bytes = shorter.min_bytes_cpu;
  const JobView long1 = TinyJob("l1", 1, classes, 4096), long2 = TinyJob("l2", 2, classes, 4096);
  const JobView short1 = TinyJob("s1", 3, classes), short2 = TinyJob("s2", 4, classes);
  ASSERT_GT(long1.min_bytes_cpu, 2 * short_bytes);
  const std::vector<WorkerView> workers = {CpuWorker("small", 2 * short_bytes),
                                           CpuWorker("large", 2 * long1.min_bytes_cpu)};
  ScheduleResult r = Schedule({&short2, &long2, &short1, &long1}, workers, 0, {});
  ASSERT_EQ(r.placements.size(), 2u);
  EXPECT_EQ(r.placements[0].job_id, "l1");
  EXPECT_EQ(r.placements[0].worker_id, "large");
  EXPECT_EQ(r.placements[1].job_id, "s1") << "l2 failed on the small worker; s1 is another class";
  EXPECT_EQ(r.placements[1].worker_id, "small");
  ASSERT_EQ(r.waiting.size(), 2u);
  EXPECT_EQ(r.waiting[0].first->id, "l2");
  EXPECT_EQ(r.waiting[1].first->id, "s2");
  EXPECT_EQ(FormatWaitReason(r.waiting[1].second), "waits: every worker is busy");
}

// An elastic job (gpus 4, min_gpus 1, a fixed micro-batch of 2 in a global batch of 8: 4 units)
// gets the most ranks it can have now: 2 on two one-device workers, 4 once a worker with two more
// devices comes, 1 on one device; 3 devices give 2 (3 ranks would not split the 4 micro-batches);
// with none it waits for the least it needs. A rigid 4-rank job of the same shape waits on 3.
TEST(SchedulerTest, AnElasticJobStartsWithTheMostRanksThatSplitItsBatch) {
  PlacementClasses classes;
  JobView job = TinyJob("e", 1, classes);
  job.gpus = 4;
  job.min_gpus = 1;
  job.fixed_micro_batch = 2;
  job.batch_units = 4;
  job.placement_class = classes.Of(job);
  const int64_t bytes = 4 * job.min_bytes_cpu;
  const auto ranks_with = [&](const std::vector<WorkerView>& workers) -> std::vector<std::string> {
    ScheduleResult r = Schedule({&job}, workers, 0, {});
    if (r.placements.empty()) return {FormatWaitReason(r.waiting.at(0).second)};
    std::vector<std::string> out;
    for (const RankSlot& s : r.placements[0].ranks) out.push_back(s.worker_id);
    EXPECT_EQ(r.placements[0].plan.world, static_cast<int64_t>(out.size()));
    EXPECT_EQ(r.placements[0].plan.micro_batch, 2);
    EXPECT_EQ(r.placements[0].plan.accumulation, 4 / r.placements[0].plan.world);
    return out;
  };
  WorkerView pair = CpuWorker("pair", bytes);
  pair.devices.push_back({DeviceKind::kCpu, 1, bytes, bytes});
  EXPECT_EQ(ranks_with({CpuWorker("a", bytes), CpuWorker("b", bytes)}), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ranks_with({CpuWorker("a", bytes), CpuWorker("b", bytes), pair}).size(), 4u);
  EXPECT_EQ(ranks_with({CpuWorker("a", bytes)}), (std::vector<std::string>{"a"}));
  EXPECT_EQ(ranks_with({CpuWorker("a", bytes), pair}).size(), 2u) << "3 devices: 2 ranks, not 3";
  EXPECT_EQ(ranks_with({}), (std::vector<std::string>{"waits: no live worker"}));
  WorkerView gpu_only{.id = "g", .alive = true, .devices = {{DeviceKind::kCuda, 0, bytes, bytes}}};
  EXPECT_EQ(ranks_with({gpu_only}), (std::vector<std::string>{"waits: no worker has 1 cpu device"}))
      << "the reason names the smallest world";
  JobView rigid = job;
  rigid.min_gpus = 4;
  rigid.placement_class = classes.Of(rigid);
  EXPECT_NE(rigid.placement_class, job.placement_class);
  ScheduleResult r = Schedule({&rigid}, {CpuWorker("a", bytes), pair}, 0, {});
  EXPECT_TRUE(r.placements.empty());
  EXPECT_EQ(FormatWaitReason(r.waiting.at(0).second),
            "waits: needs 4 cpu devices (one per rank); the idle workers offer 3");
}

// 100,000 queued 4-rank jobs of four shapes, on 10,000 idle one-device workers of which none
// can host rank 0: every job passes the memory filter and fails only after a walk over the
// workers. One pass walks once per shape, not per job (100,000 walks over 10,000 workers would
// take minutes); bounded loosely for a loaded machine, printed for the record.
TEST(SchedulerTest, APassOverAHundredThousandJobsAndTenThousandWorkersWalksOncePerShape) {
  PlacementClasses classes;
  std::vector<JobView> views;
  for (int i = 0; i < 100'000; ++i) {
    JobView v = TinyJob("j" + std::to_string(i), i, classes, 64 << (i % 4));
    v.gpus = 4;
    v.placement_class = classes.Of(v);
    views.push_back(std::move(v));
  }
  std::vector<const JobView*> jobs;
  for (const JobView& v : views) jobs.push_back(&v);
  std::vector<WorkerView> workers;
  for (int i = 0; i < 10'000; ++i) {
    workers.push_back(CpuWorker("w" + std::to_string(i), int64_t{1} << 40));
    workers.back().serves_rendezvous = false;
  }
  const auto start = std::chrono::steady_clock::now();
  ScheduleResult r = Schedule(jobs, workers, 0, {});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("one pass over %zu jobs and %zu workers: %.1f ms\n", jobs.size(), workers.size(),
              seconds * 1e3);
  EXPECT_TRUE(r.placements.empty());
  ASSERT_EQ(r.waiting.size(), jobs.size());
  EXPECT_EQ(FormatWaitReason(r.waiting.back().second),
            "waits: no idle worker reports rendezvous ports to host rank 0 of a multi-rank job");
  EXPECT_LT(seconds, 2.0);
}

}  // namespace
}  // namespace ft
