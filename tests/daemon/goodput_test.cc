// Goodput (daemon/goodput.h) on timelines written out by hand: every
// category against the seconds the test itself lays out, the parts adding
// up to each attempt's device time, recovery and queue time.
#include "daemon/goodput.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ft {
namespace {

AttemptRow Attempt(int64_t number, int64_t started, int64_t ended, AttemptOutcomeCode outcome,
                   int64_t start_step, int64_t end_step, int64_t steps_lost, int64_t world = 1,
                   bool lost = false) {
  return AttemptRow{.job_id = "j",
                    .number = number,
                    .epoch = number,
                    .outcome = outcome,
                    .started_ms = started,
                    .ended_ms = ended,
                    .start_step = start_step,
                    .end_step = end_step,
                    .steps_lost = steps_lost,
                    .world = world,
                    .lost = lost};
}

MetricRow Step(int64_t epoch, int64_t step, int64_t end_ms, double seconds) {
  return MetricRow{.job_id = "j", .epoch = epoch, .step = step, .time_ms = end_ms, .step_seconds = seconds};
}

// Steps first..last of 1 s each from `start_ms`, with `gap_ms` after step `gap_after` (0: none).
void Steps(std::vector<MetricRow>* out, int64_t epoch, int64_t first, int64_t last, int64_t start_ms,
           int64_t gap_after = 0, int64_t gap_ms = 0) {
  int64_t t = start_ms;
  for (int64_t s = first; s <= last; ++s) {
    t += 1000;
    out->push_back(Step(epoch, s, t, 1.0));
    if (s == gap_after) t += gap_ms;
  }
}

JobRow Job(JobStateCode state) {
  JobRow j;
  j.id = "j";
  j.created_ms = 0;
  j.state = state;
  return j;
}

void ExpectSplit(const GoodputSplit& s, double productive, double checkpoint, double restart, double lost) {
  EXPECT_NEAR(s.productive_s, productive, 1e-9);
  EXPECT_NEAR(s.checkpoint_s, checkpoint, 1e-9);
  EXPECT_NEAR(s.restart_s, restart, 1e-9);
  EXPECT_NEAR(s.lost_s, lost, 1e-9);
}

// Attempt 1 (one rank): queued 1 s, 2 s to its first step, steps 1..10 of 1 s with a 0.5 s
// checkpoint wait after step 5, killed after step 10; ftd learns it at 16 s. Steps 6..10 are
// lost. Attempt 2 (two ranks) starts at 20 s, 1 s to its first step, steps 6..10 with a 0.3 s
// wait after step 8, finishes and spends 0.7 s on the final save.
TEST(GoodputTest, APreemptedThenFinishedJobSplitsAsLaidOut) {
  std::vector<AttemptRow> attempts = {
      Attempt(1, 1000, 16000, AttemptOutcomeCode::kPreempted, 0, 10, 5, 1, /*lost=*/true),
      Attempt(2, 20000, 27000, AttemptOutcomeCode::kFinished, 5, 10, 0, 2)};
  std::vector<MetricRow> metrics;
  Steps(&metrics, 1, 1, 10, 3000, 5, 500);
  Steps(&metrics, 2, 6, 10, 21000, 8, 300);
  const std::vector<CheckpointRow> checkpoints = {
      {"j", 1, 5, "", "", 0.1, 8100}, {"j", 2, 8, "", "", 0.1, 24100}, {"j", 2, 10, "", "", 0.1, 26500}};
  const JobGoodput g = ComputeGoodput(Job(JobStateCode::kSucceeded), attempts, metrics, checkpoints, 99000);
  ASSERT_EQ(g.attempts.size(), 2u);
  // 1: restart 2 s; steps 1..5 survive (3 s → 8 s); the rest, from 8 s to 16 s, is lost.
  ExpectSplit(g.attempts[0], 5, 0, 2, 8);
  // 2: ×2 ranks: restart 1 s; steps 6..10 (21 s → 26.3 s) less the 0.3 s wait; 0.3 + 0.7 s saving.
  ExpectSplit(g.attempts[1], 2 * 5.0, 2 * 1.0, 2 * 1.0, 0);
  EXPECT_NEAR(g.attempts[0].total_s(), 15, 1e-9) << "the parts add up to the attempt's device time";
  EXPECT_NEAR(g.attempts[1].total_s(), 2 * 7, 1e-9);
  ExpectSplit(g.device, 15, 2, 4, 8);
  EXPECT_NEAR(g.goodput(), 15.0 / 29.0, 1e-12);
  EXPECT_NEAR(g.queue_s, 1 + 4, 1e-9) << "created → first start, end → next start";
  ASSERT_EQ(g.recovery_s.size(), 1u);
  EXPECT_NEAR(g.recovery_s[0], 22.0 - 16.0, 1e-9) << "loss known at 16 s, first step again at 22 s";
  EXPECT_EQ(g.recovery_after, std::vector<int64_t>{1});
}

TEST(GoodputTest, RunningQueuedAndStepLessAttempts) {
  // A stop with a notice that made its checkpoint (nothing lost): the tail is the final save.
  std::vector<AttemptRow> attempts = {Attempt(1, 0, 9000, AttemptOutcomeCode::kPreempted, 0, 5, 0)};
  std::vector<MetricRow> metrics;
  Steps(&metrics, 1, 1, 5, 1000);                                               // 1 s → 6 s
  const std::vector<CheckpointRow> at_stop = {{"j", 1, 5, "", "", 0.1, 8900}};  // the stop's checkpoint
  JobGoodput g = ComputeGoodput(Job(JobStateCode::kQueued), attempts, metrics, at_stop, 20000);
  ExpectSplit(g.device, 5, 3, 1, 0);
  EXPECT_NEAR(g.queue_s, 11, 1e-9) << "queued since 9 s, now 20 s";
  EXPECT_TRUE(g.recovery_s.empty()) << "no step since";

  // The same end found by ftd (lease lost after the checkpoint at step 5): the tail is lost.
  attempts[0].lost = true;
  g = ComputeGoodput(Job(JobStateCode::kQueued), attempts, metrics, at_stop, 20000);
  ExpectSplit(g.device, 5, 0, 1, 3);
  // Its steps survive through the newest checkpoint committed by its end, whatever its last
  // progress report said (end_step may lag): one at step 3 only, so steps 4 and 5 are lost.
  attempts[0].end_step = 1;
  g = ComputeGoodput(Job(JobStateCode::kQueued), attempts, metrics, {{"j", 1, 3, "", "", 0.1, 4500}}, 20000);
  ExpectSplit(g.device, 3, 0, 1, 5);

  // A second attempt that died before its first step, then a running third one: recovery from
  // the first preemption to the third attempt's first step; the running one counts up to now.
  attempts.push_back(Attempt(2, 10000, 12000, AttemptOutcomeCode::kPreempted, 5, 5, 0, 1, true));
  attempts.push_back(Attempt(3, 13000, 0, AttemptOutcomeCode::kRunning, 5, 7, 0));
  Steps(&metrics, 3, 6, 7, 14000);  // 15 s, 16 s
  attempts[0].end_step = 5;
  g = ComputeGoodput(Job(JobStateCode::kRunning), attempts, metrics, at_stop, 16500);
  ExpectSplit(g.attempts[1], 0, 0, 2, 0);
  ExpectSplit(g.attempts[2], 2.5, 0, 1, 0);  // the step in flight counts as productive until it ends
  ASSERT_EQ(g.recovery_s.size(), 1u);
  EXPECT_NEAR(g.recovery_s[0], 15 - 9, 1e-9);
  EXPECT_EQ(g.recovery_after, std::vector<int64_t>{1}) << "attempt 2 trained nothing: it recovered nothing";
  EXPECT_NEAR(g.queue_s, 1 + 1, 1e-9);
}

TEST(GoodputTest, NoAttemptsIsAllQueueAndGoodputOne) {
  const JobGoodput g = ComputeGoodput(Job(JobStateCode::kQueued), {}, {}, {}, 4000);
  EXPECT_NEAR(g.queue_s, 4, 1e-9);
  EXPECT_EQ(g.device.total_s(), 0);
  EXPECT_EQ(g.goodput(), 1.0);
}

}  // namespace
}  // namespace ft
