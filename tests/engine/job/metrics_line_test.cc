// metrics.jsonl's lines (engine/job/metrics_line.h): what the trainer writes
// is what the worker reads, key for key, for every kind of line.
#include "engine/job/metrics_line.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

namespace ft {
namespace {

MetricsLine FullStepLine() {
  MetricsLine m;
  m.kind = MetricsLine::Kind::kStep;
  m.step = 7;
  m.epoch = 3;
  m.loss = 2.5;
  m.lr = 1e-4;
  m.grad_norm = 0.75;
  m.tokens = 512;
  m.tokens_seen = 4096;
  m.tokens_per_s = 1234.5;
  m.step_seconds = 0.4;
  m.copy_wait_seconds = 0.01;
  m.peak_bytes = 1 << 20;
  m.peak_bytes_by_category = {{"weights", 100}, {"adapter", 7}};
  m.checkpoint_seconds = 0.2;
  m.world = 2;
  m.allreduce_seconds = 0.05;
  m.gather_seconds = 0.03;
  m.sharded = true;
  m.fp16 = true;
  m.loss_scale = 65536;
  m.skipped = false;
  return m;
}

TEST(MetricsLineTest, EveryKeyOfAStepLineWrittenIsReadBack) {
  const MetricsLine m = FullStepLine();
  auto back = ParseMetricsLine(FormatMetricsLine(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, MetricsLine::Kind::kStep);
  EXPECT_EQ(back->step, 7);
  EXPECT_EQ(back->epoch, 3);
  EXPECT_EQ(back->loss, m.loss);
  EXPECT_EQ(back->lr, m.lr);
  EXPECT_EQ(back->grad_norm, m.grad_norm);
  EXPECT_EQ(back->tokens, m.tokens);
  EXPECT_EQ(back->tokens_seen, m.tokens_seen);
  EXPECT_EQ(back->tokens_per_s, m.tokens_per_s);
  EXPECT_EQ(back->step_seconds, m.step_seconds);
  EXPECT_EQ(back->copy_wait_seconds, m.copy_wait_seconds);
  EXPECT_EQ(back->peak_bytes, m.peak_bytes);
  EXPECT_EQ(back->peak_bytes_by_category, m.peak_bytes_by_category);
  EXPECT_EQ(back->checkpoint_seconds, m.checkpoint_seconds);
  EXPECT_EQ(back->world, 2);
  EXPECT_EQ(back->allreduce_seconds, m.allreduce_seconds);
  EXPECT_EQ(back->gather_seconds, m.gather_seconds);
  EXPECT_TRUE(back->sharded);
  EXPECT_TRUE(back->fp16);
  EXPECT_EQ(back->loss_scale, m.loss_scale);
  EXPECT_FALSE(back->skipped);
}

TEST(MetricsLineTest, OptionalKeysAreLeftOutWhenTheyDoNotApply) {
  MetricsLine m = FullStepLine();
  m.world = 1;
  m.fp16 = false;
  m.checkpoint_seconds = 0;
  m.epoch = 0;
  const nlohmann::json j = nlohmann::json::parse(FormatMetricsLine(m));
  for (const char* key : {"world", "allreduce_seconds", "gather_seconds", "loss_scale", "skipped",
                          "checkpoint_seconds", "epoch"}) {
    EXPECT_FALSE(j.contains(key)) << key;
  }
  EXPECT_TRUE(j.contains("peak_bytes_by_category"));
}

TEST(MetricsLineTest, ASkippedFp16StepHasANullGradNormReadAsNaN) {
  MetricsLine m = FullStepLine();
  m.skipped = true;
  m.grad_norm = std::nan("");
  const std::string text = FormatMetricsLine(m);
  EXPECT_TRUE(nlohmann::json::parse(text)["grad_norm"].is_null()) << text;
  auto back = ParseMetricsLine(text);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(std::isnan(back->grad_norm));
  EXPECT_TRUE(back->skipped);
}

TEST(MetricsLineTest, EvalAndEventLinesRoundTrip) {
  MetricsLine eval;
  eval.kind = MetricsLine::Kind::kEval;
  eval.step = 20;
  eval.eval_loss = 1.75;
  eval.eval_tokens = 640;
  eval.eval_seconds = 0.3;
  eval.objective_metrics = {{"eval_rewards/margins", 0.125}, {"eval_logps/chosen", -30.5}};  // DPO's
  auto e = ParseMetricsLine(FormatMetricsLine(eval));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->kind, MetricsLine::Kind::kEval);
  EXPECT_EQ(e->objective_metrics, eval.objective_metrics);
  EXPECT_EQ(e->eval_loss, 1.75);
  EXPECT_EQ(e->eval_tokens, 640);
  EXPECT_EQ(e->eval_seconds, 0.3);

  const MetricsLine::Kind kinds[] = {MetricsLine::Kind::kCheckpoint, MetricsLine::Kind::kPreempted,
                                     MetricsLine::Kind::kFailed, MetricsLine::Kind::kResume};
  for (MetricsLine::Kind kind : kinds) {
    MetricsLine ev;
    ev.kind = kind;
    ev.step = 12;
    ev.reason = "why";
    ev.dir = kind == MetricsLine::Kind::kCheckpoint || kind == MetricsLine::Kind::kResume ? "/o/step-12" : "";
    ev.resume_kind = kind == MetricsLine::Kind::kResume ? "resume_fallback" : "";
    ev.checkpoint_seconds = kind == MetricsLine::Kind::kCheckpoint ? 0.5 : 0;
    ev.back_to_back = kind == MetricsLine::Kind::kCheckpoint;
    const std::string text = FormatMetricsLine(ev);
    auto back = ParseMetricsLine(text);
    ASSERT_TRUE(back.ok()) << text;
    EXPECT_EQ(back->kind, kind) << text;
    EXPECT_EQ(back->step, 12);
    EXPECT_EQ(back->reason, "why") << text;
    EXPECT_EQ(back->dir, ev.dir) << text;
    EXPECT_EQ(back->resume_kind, ev.resume_kind) << text;
    EXPECT_EQ(back->checkpoint_seconds, ev.checkpoint_seconds) << text;
    EXPECT_EQ(back->back_to_back, ev.back_to_back) << text;
    EXPECT_EQ(text.find("back_to_back") != std::string::npos, ev.back_to_back) << "written when true";
  }
}

TEST(MetricsLineTest, TheResumeNoteTravelsUnderItsOwnKey) {
  // Older workers and the dashboard read a resume's note as "note" and its kind as "kind".
  MetricsLine ev;
  ev.kind = MetricsLine::Kind::kResume;
  ev.reason = "resumed from step 4";
  ev.resume_kind = "resume";
  const nlohmann::json j = nlohmann::json::parse(FormatMetricsLine(ev));
  EXPECT_EQ(j["event"], "resume");
  EXPECT_EQ(j["note"], "resumed from step 4");
  EXPECT_EQ(j["kind"], "resume");
  EXPECT_FALSE(j.contains("reason"));
}

}  // namespace
}  // namespace ft
