// job.yaml's data sources: data.train and data.eval as a list (weights or
// epochs, field mapping, a chat template per source), data.val_fraction; each
// bad value refused with file:line and the fix, the paths resolved and made
// absolute for a worker, and the math hash of a single-path job unchanged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/job/job_hash.h"
#include "engine/job/job_spec.h"

namespace ft {
namespace {

using ::testing::HasSubstr;

std::string Job(const std::string& data) {
  return "model: {path: m}\ndata:\n" + data + "train: {max_steps: 1}\noutput: {dir: o}\n";
}

std::string Error(const std::string& data) {
  auto spec = ParseJobSpec(Job(data), "/j/job.yaml");
  EXPECT_FALSE(spec.ok()) << data;
  return spec.ok() ? "" : std::string(spec.status().message());
}

TEST(DataSourcesTest, AListOfSourcesParsesWithWeightsFieldsAndTemplatesResolved) {
  auto spec = ParseJobSpec(Job("  format: chat\n"
                               "  train:\n"
                               "    - {path: a.jsonl, weight: 0.6}\n"
                               "    - path: b.jsonl\n"
                               "      weight: 0.3\n"
                               "      fields: sharegpt\n"
                               "      chat_template: t.jinja\n"
                               "    - {path: /abs/c.jsonl, weight: 0.1, format: alpaca,\n"
                               "       fields: {instruction: question, output: answer}}\n"
                               "  eval: [{path: e1.jsonl}, {path: e2.jsonl, format: text}]\n"),
                           "/j/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const auto& s = spec->data.train_sources;
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].path, "/j/a.jsonl");
  EXPECT_EQ(s[0].key, "data.train[0]");
  EXPECT_EQ(s[1].weight, 0.3);
  EXPECT_EQ(s[1].keys.at("messages"), "conversations");
  EXPECT_EQ(s[1].roles.at("gpt"), "assistant");
  EXPECT_EQ(s[1].chat_template, "/j/t.jinja");
  EXPECT_EQ(s[2].format, DataFormat::kAlpaca);
  EXPECT_EQ(s[2].keys.at("instruction"), "question");
  EXPECT_EQ(spec->data.train, "/j/a.jsonl") << "the first source's path";
  ASSERT_EQ(spec->data.eval_sources.size(), 2u);
  EXPECT_EQ(spec->data.eval_sources[1].format, DataFormat::kText);
  EXPECT_TRUE(JobHasEval(*spec));
  // Sources without weights count by epochs (1 each unless given).
  auto by_epochs =
      ParseJobSpec(Job("  train: [{path: a.jsonl}, {path: b.jsonl, epochs: 3}]\n"), "/j/job.yaml");
  ASSERT_TRUE(by_epochs.ok()) << by_epochs.status().ToString();
  EXPECT_EQ(by_epochs->data.train_sources[0].epochs, 1);
  EXPECT_EQ(by_epochs->data.train_sources[1].epochs, 3);
  EXPECT_EQ(by_epochs->data.train_sources[1].weight, 0);
}

TEST(DataSourcesTest, EveryBadSourceKeyIsRefusedWithItsLineAndTheFix) {
  EXPECT_THAT(Error("  train: []\n"), HasSubstr("job.yaml:3:10: data.train: lists 1 to 64 sources"));
  EXPECT_THAT(Error("  train: [{path: a, weight: 1}, {path: b}]\n"),
              HasSubstr("data.train: give every source a weight, or none"));
  EXPECT_THAT(Error("  train: [{path: a, weight: 1, epochs: 2}]\n"),
              HasSubstr("data.train[0].epochs: a source takes weight or epochs, not both"));
  EXPECT_THAT(Error("  train: [{path: a, weight: 0}]\n"),
              HasSubstr("data.train[0].weight: must be a number in (0"));
  EXPECT_THAT(Error("  train: [{path: a, wieght: 1}]\n"), HasSubstr("unknown key 'wieght' in data.train[0]"));
  EXPECT_THAT(Error("  train: [{weight: 1}]\n"), HasSubstr("missing required key 'data.train[0].path'"));
  EXPECT_THAT(Error("  train: [a.jsonl]\n"),
              HasSubstr("data.train[0]: expected a mapping of keys, got 'a.jsonl'"));
  EXPECT_THAT(Error("  format: chat\n  train: [{path: a, fields: {mesages: conversations}}]\n"),
              HasSubstr("job.yaml:4:39: data.train[0].fields.mesages: is not a key of format chat"));
  EXPECT_THAT(
      Error("  format: chat\n  train: [{path: a, fields: {roles: {human: person}}}]\n"),
      HasSubstr("data.train[0].fields.roles.human: maps a role value to system, user, assistant or tool"));
  EXPECT_THAT(Error("  format: text\n  train: [{path: a, fields: sharegpt}]\n"),
              HasSubstr("data.train[0].fields: the preset is 'sharegpt' (with format: chat)"));
  EXPECT_THAT(Error("  train: [{path: a, format: text, chat_template: t.jinja}]\n"),
              HasSubstr("data.train[0].chat_template: format text renders no messages"));
  EXPECT_THAT(Error("  train: [{path: a}, {path: b, format: preference}]\n"),
              HasSubstr("data.train[1].format: preference: preference pairs mix with no other format"));
  EXPECT_THAT(Error("  train: d\n  eval: [{path: e, weight: 1}]\n"),
              HasSubstr("unknown key 'weight' in data.eval[0]"));
  EXPECT_THAT(
      Error("  train: d\n  eval: e\n  val_fraction: 0.1\n"),
      HasSubstr("data.val_fraction: holds out training rows as the eval set, but data.eval names one"));
  EXPECT_THAT(Error("  train: d\n  val_fraction: 0.7\n"),
              HasSubstr("data.val_fraction: must be a number in [0, 0.5]"));
}

TEST(DataSourcesTest, AFullFineTunesDpoTakesOneFileEach) {
  auto spec = ParseJobSpec(
      "model: {path: m}\nadapter: {type: full}\ndata:\n  format: preference\n  train: d\n"
      "  eval: [{path: e}, {path: f}]\ntrain: {max_steps: 1, objective: dpo}\noutput: {dir: o}\n",
      "/j/job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(),
              HasSubstr("job.yaml:6:9: data.eval: a full fine-tune's DPO reference is stored per data file"));
}

TEST(DataSourcesTest, ValFractionMakesAnEvalSetAndTheEvalKeysValid) {
  auto spec = ParseJobSpec(
      "model: {path: m}\ndata: {train: d, val_fraction: 0.02}\ntrain: {max_steps: 1, eval_every_steps: 5}\n"
      "output: {dir: o}\n",
      "/j/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(JobHasEval(*spec));
  EXPECT_EQ(spec->train.eval_every_steps, 5);
  EXPECT_NE(JobMathKeys(*spec, "sha").count("data.val_fraction"), 0u) << "the split changes the trained rows";
}

TEST(DataSourcesTest, ASinglePathHashesAsItAlwaysHasAndAListHashesItsSources) {
  auto one = ParseJobSpec(Job("  train: d.jsonl\n"), "/j/job.yaml");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(JobMathKeys(*one, "abc").at("data.train"), "/j/d.jsonl");
  EXPECT_EQ(JobMathKeys(*one, "abc").at("data.train (SHA-256)"), "abc");
  EXPECT_EQ(JobMathKeys(*one, "abc").count("data.val_fraction"), 0u);
  auto list =
      ParseJobSpec(Job("  train: [{path: d.jsonl, weight: 2}, {path: e.jsonl, weight: 1}]\n"), "/j/job.yaml");
  auto reweighted =
      ParseJobSpec(Job("  train: [{path: d.jsonl, weight: 1}, {path: e.jsonl, weight: 1}]\n"), "/j/job.yaml");
  ASSERT_TRUE(list.ok() && reweighted.ok());
  EXPECT_NE(JobHash(*list, "x"), JobHash(*reweighted, "x")) << "a weight changes the math";
  EXPECT_EQ(SourcesSha256({"a"}), "a");
  EXPECT_NE(SourcesSha256({"a", "b"}), SourcesSha256({"b", "a"})) << "the sources' order matters";
}

TEST(DataSourcesTest, AWorkerGetsEverySourcePathAbsolute) {
  const std::string yaml =
      Job("  format: chat\n  train:\n    - {path: a.jsonl, weight: 1, chat_template: t.jinja}\n"
          "    - {path: b.jsonl, weight: 2}\n  eval: [{path: e.jsonl}]\n");
  auto spec = ParseJobSpec(yaml, "/j/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::string resolved = ResolvedJobYaml(*spec, yaml, 8, 8, 1);
  auto again = ParseJobSpec(resolved, "/elsewhere/job.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << resolved;
  EXPECT_EQ(again->data.train_sources[0].path, "/j/a.jsonl");
  EXPECT_EQ(again->data.train_sources[0].chat_template, "/j/t.jinja");
  EXPECT_EQ(again->data.train_sources[1].path, "/j/b.jsonl");
  EXPECT_EQ(again->data.train_sources[1].weight, 2);
  EXPECT_EQ(again->data.eval_sources[0].path, "/j/e.jsonl");
  std::vector<std::string> keys;
  for (const auto& [key, path] : JobInputPaths(*spec)) keys.push_back(key);
  EXPECT_THAT(keys, testing::IsSupersetOf({"data.train[0].path", "data.train[0].chat_template",
                                           "data.train[1].path", "data.eval[0].path"}));
}

}  // namespace
}  // namespace ft
