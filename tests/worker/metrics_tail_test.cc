// MetricsTail follows ft-train's metrics.jsonl: appends, partial lines,
// truncation and the atomic rewrite ft-train does on resume.
#include "worker/metrics_tail.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/job/metrics_line.h"

namespace ft::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

class MetricsTailTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / "metrics-tail";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "metrics.jsonl").string();
  }
  void Append(const std::string& text) { std::ofstream(path_, std::ios::app) << text; }
  // As ft-train's resume does: a new file with `text` renamed over the old one.
  void Replace(const std::string& text) {
    std::ofstream(path_ + ".tmp") << text;
    fs::rename(path_ + ".tmp", path_);
  }
  std::vector<std::string> Poll(MetricsTail* tail) {
    std::vector<std::string> lines;
    EXPECT_TRUE(tail->Poll(&lines).ok());
    return lines;
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(MetricsTailTest, MissingFileIsFineAndItsLinesArriveOnceCreated) {
  MetricsTail tail(path_);
  ASSERT_TRUE(tail.SkipExisting().ok());
  EXPECT_THAT(Poll(&tail), IsEmpty());
  Append("a\nb\n");
  EXPECT_THAT(Poll(&tail), ElementsAre("a", "b"));
  EXPECT_THAT(Poll(&tail), IsEmpty());
}

TEST_F(MetricsTailTest, StartsFromTheCurrentEnd) {
  Append("old1\nold2\n");
  MetricsTail tail(path_);
  ASSERT_TRUE(tail.SkipExisting().ok());
  EXPECT_THAT(Poll(&tail), IsEmpty());
  Append("new1\n");
  Append("new2\n");
  EXPECT_THAT(Poll(&tail), ElementsAre("new1", "new2"));
}

TEST_F(MetricsTailTest, HoldsBackAPartialLineUntilItsNewline) {
  MetricsTail tail(path_);
  ASSERT_TRUE(tail.SkipExisting().ok());
  Append("{\"step\": 1}\n{\"st");
  EXPECT_THAT(Poll(&tail), ElementsAre("{\"step\": 1}"));
  EXPECT_THAT(Poll(&tail), IsEmpty());
  Append("ep\": 2}\n");
  EXPECT_THAT(Poll(&tail), ElementsAre("{\"step\": 2}"));
}

TEST_F(MetricsTailTest, TruncationRereadsFromTheStartSkippingLinesSeenBefore) {
  Append("s1\ns2\ns3\n");
  MetricsTail tail(path_);
  ASSERT_TRUE(tail.SkipExisting().ok());
  Append("s4\n");
  EXPECT_THAT(Poll(&tail), ElementsAre("s4"));
  // Truncated in place to the restored step (seen at a poll), then new lines appended.
  fs::resize_file(path_, 6);  // "s1\ns2\n"
  EXPECT_THAT(Poll(&tail), IsEmpty());
  Append("s3'\ns4'\n");
  EXPECT_THAT(Poll(&tail), ElementsAre("s3'", "s4'"));
  Append("s5'\n");
  EXPECT_THAT(Poll(&tail), ElementsAre("s5'"));
}

TEST_F(MetricsTailTest, ReplacedFileKeepsItsPrefixQuietAndReportsWhatFollows) {
  Append("s1\ns2\nckpt2\ns3\ns4\n");  // a killed run's lines
  MetricsTail tail(path_);
  ASSERT_TRUE(tail.SkipExisting().ok());
  // The resumed trainer keeps steps <= 2 (a new inode), then logs from step 3 on.
  Replace("s1\ns2\nckpt2\n");
  EXPECT_THAT(Poll(&tail), IsEmpty());
  Append("s3 again\n");
  EXPECT_THAT(Poll(&tail), ElementsAre("s3 again"));
}

TEST_F(MetricsTailTest, ReplacementSeenAfterNewLinesWereAppended) {
  Append("s1\ns2\ns3\n");
  MetricsTail tail(path_);
  ASSERT_TRUE(tail.SkipExisting().ok());
  Replace("s1\ns2\ns3 new\ns4 new\n");  // rewritten and appended between two polls
  EXPECT_THAT(Poll(&tail), ElementsAre("s3 new", "s4 new"));
}

TEST(MetricsLineTest, ParsesStepLines) {
  auto m = ParseMetricsLine(
      R"({"step":7,"loss":2.5,"lr":0.001,"grad_norm":1.5,"tokens":512,"tokens_seen":4096,"tokens_per_s":1000.5,)"
      R"("step_seconds":0.5,"copy_wait_seconds":0.125,"peak_bytes":1048576,"checkpoint_seconds":0.25})");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, MetricsLine::Kind::kStep);
  EXPECT_EQ(m->step, 7);
  EXPECT_DOUBLE_EQ(m->loss, 2.5);
  EXPECT_DOUBLE_EQ(m->lr, 0.001);
  EXPECT_DOUBLE_EQ(m->grad_norm, 1.5);
  EXPECT_EQ(m->tokens, 512);
  EXPECT_EQ(m->tokens_seen, 4096);
  EXPECT_DOUBLE_EQ(m->tokens_per_s, 1000.5);
  EXPECT_EQ(m->peak_bytes, 1048576);
  EXPECT_DOUBLE_EQ(m->checkpoint_seconds, 0.25);
  EXPECT_DOUBLE_EQ(m->step_seconds, 0.5);
  EXPECT_DOUBLE_EQ(m->copy_wait_seconds, 0.125);
  // An fp16 step skipped for overflow: its norm was not finite, written as null.
  auto skipped =
      ParseMetricsLine(R"({"step":8,"loss":2.4,"grad_norm":null,"loss_scale":65536,"skipped":true})");
  ASSERT_TRUE(skipped.ok());
  EXPECT_TRUE(std::isnan(skipped->grad_norm));
  EXPECT_DOUBLE_EQ(skipped->loss, 2.4);
}

TEST(MetricsLineTest, ParsesEvalLines) {
  auto e = ParseMetricsLine(R"({"step":20,"eval_loss":1.75,"eval_tokens":640,"eval_seconds":0.3})");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->kind, MetricsLine::Kind::kEval);
  EXPECT_EQ(e->step, 20);
  EXPECT_DOUBLE_EQ(e->eval_loss, 1.75);
  EXPECT_EQ(e->eval_tokens, 640);
  EXPECT_EQ(e->loss, 0) << "not a step line: no training fields";
  auto diverged = ParseMetricsLine(R"({"step":21,"eval_loss":null,"eval_tokens":640})");
  ASSERT_TRUE(diverged.ok());
  EXPECT_EQ(diverged->kind, MetricsLine::Kind::kEval);
  EXPECT_TRUE(std::isnan(diverged->eval_loss)) << "NaN is written as null";
}

TEST(MetricsLineTest, ParsesEvents) {
  auto c = ParseMetricsLine(
      R"({"event":"checkpoint","step":4,"reason":"every 2 steps","dir":"/o/checkpoints/step-4","checkpoint_seconds":0.1})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->kind, MetricsLine::Kind::kCheckpoint);
  EXPECT_EQ(c->step, 4);
  EXPECT_EQ(c->dir, "/o/checkpoints/step-4");
  EXPECT_DOUBLE_EQ(c->checkpoint_seconds, 0.1);
  auto p = ParseMetricsLine(R"({"event":"preempted","step":5,"reason":"slot end"})");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, MetricsLine::Kind::kPreempted);
  EXPECT_EQ(p->reason, "slot end");
  auto f = ParseMetricsLine(R"({"event":"failed","step":0,"reason":"IOError: disk full"})");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, MetricsLine::Kind::kFailed);
  EXPECT_EQ(f->reason, "IOError: disk full");
}

TEST(MetricsLineTest, RejectsGarbage) {
  EXPECT_TRUE(ParseMetricsLine("not json").status().IsInvalidArgument());
  EXPECT_TRUE(ParseMetricsLine("[1,2]").status().IsInvalidArgument());
  EXPECT_TRUE(ParseMetricsLine(R"({"loss": 1})").status().IsInvalidArgument());
}

}  // namespace
}  // namespace ft::worker
