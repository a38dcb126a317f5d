// The scheduler's wait reasons (WaitReason + FormatWaitReason) and its device
// kinds (DeviceKind, converted from the wire at DeviceViewOf).
#include "daemon/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

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
  EXPECT_EQ(r.waiting["j"], "waits: no worker has 1 cpu device");
}

}  // namespace
}  // namespace ft
