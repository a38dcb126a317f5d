// checkpoint.every auto's interval (engine/job/checkpoint_interval.h):
// Young/Daly's sqrt(2·C·M) against hand-computed values, its bounds, the
// unmeasured first checkpoint, C's fixed part, and M from an attempt history.
#include "engine/job/checkpoint_interval.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

namespace ft {
namespace {

using ::testing::HasSubstr;

TEST(CheckpointIntervalTest, YoungDalyWithinTheBoundsAndSaysWhy) {
  // C = 0.8 s, M = 41 min: sqrt(2 · 0.8 · 2460) = 62.74 s.
  CheckpointInterval i = ChooseCheckpointInterval({0, 0.8}, 41 * 60, 0, 60);
  EXPECT_NEAR(i.seconds, std::sqrt(2 * 0.8 * 2460), 1e-9);
  EXPECT_EQ(i.why,
            "C = 0.8 s, M = 41.0 min -> every 1.05 min; written in the background, the step does not wait "
            "for it");
  // checkpoint.async false: the same interval, and the step waits (said so).
  const CheckpointInterval sync = ChooseCheckpointInterval({0, 0.0123}, 41 * 60, 0, 60, /*async=*/false);
  EXPECT_NEAR(sync.seconds, std::sqrt(2 * 0.0123 * 2460), 1e-9);
  EXPECT_THAT(sync.why, HasSubstr("C = 0.0123 s"));
  EXPECT_THAT(sync.why, HasSubstr("checkpoint.async false, the step waits for each write"));
  // C's fixed part (back-to-back writes) measured: it is C; the mean at the interval is said.
  const CheckpointInterval fixed =
      ChooseCheckpointInterval({.fixed_seconds = 0.01, .recent_seconds = 0.024}, 12, 0, 60, /*async=*/false);
  EXPECT_NEAR(fixed.seconds, std::sqrt(2 * 0.01 * 12), 1e-12);
  EXPECT_THAT(fixed.why, HasSubstr("C = 0.01 s back to back (0.024 s at the interval), M = 0.2 min"));
  // Bounded: a tiny C would checkpoint every 2 s; min_minutes 1 holds it at 60 s.
  i = ChooseCheckpointInterval({0, 0.002}, 1000, 1, 60);
  EXPECT_EQ(i.seconds, 60);
  EXPECT_THAT(i.why, HasSubstr("(checkpoint.min_minutes)"));
  i = ChooseCheckpointInterval({0, 50}, 1e6, 0, 10);
  EXPECT_EQ(i.seconds, 600);
  EXPECT_THAT(i.why, HasSubstr("(checkpoint.max_minutes)"));
  // No M from ftd: the prior.
  i = ChooseCheckpointInterval({0, 2}, 0, 0, 600);
  EXPECT_NEAR(i.seconds, std::sqrt(2 * 2 * kPriorMtbfSeconds), 1e-9);
  EXPECT_THAT(i.why, HasSubstr("(prior)"));
  // C not measured yet: the first checkpoint at min_minutes, to measure it.
  i = ChooseCheckpointInterval({0, 0}, 600, 0.5, 60);
  EXPECT_EQ(i.seconds, 30);
  EXPECT_THAT(i.why, HasSubstr("C not measured yet"));
}

TEST(CheckpointIntervalTest, AProbeWhileTheFixedPartIsUnmeasuredEveryFourUntilThreeAndThenEverySixteen) {
  EXPECT_TRUE(ProbeDue(1, 0)) << "after the first automatic checkpoint";
  EXPECT_FALSE(ProbeDue(1, 1));
  EXPECT_FALSE(ProbeDue(3, 2));
  EXPECT_TRUE(ProbeDue(4, 2)) << "fewer than three measured: every fourth";
  EXPECT_FALSE(ProbeDue(4, 3));
  EXPECT_FALSE(ProbeDue(kProbeEvery - 1, 3));
  EXPECT_TRUE(ProbeDue(kProbeEvery, 3));
  EXPECT_EQ(kProbeEvery, 16);
  EXPECT_EQ(kEarlyProbeEvery, 4);
}

TEST(CheckpointIntervalTest, TheFixedPartIsTheMedianSoOneSlowWriteDoesNotSetIt) {
  EXPECT_EQ(MedianSeconds({}), 0);
  EXPECT_EQ(MedianSeconds({0.16}), 0.16);
  EXPECT_EQ(MedianSeconds({0.16, 0.03, 0.04}), 0.04) << "the first probe, while the job started, was slow";
  EXPECT_DOUBLE_EQ(MedianSeconds({0.16, 0.03, 0.04, 0.05}), 0.045);
}

TEST(CheckpointIntervalTest, MeanTimeBetweenPreemptionsFromHistory) {
  EXPECT_EQ(MeanTimeBetweenPreemptions(3000, 4), 750);
  EXPECT_EQ(MeanTimeBetweenPreemptions(0, 0), kPriorMtbfSeconds) << "no history: the prior";
  EXPECT_EQ(MeanTimeBetweenPreemptions(7200, 0), 7200) << "two hours without one: at least that";
  EXPECT_EQ(FormatMinutes(90), "1.5 min");
}

}  // namespace
}  // namespace ft
