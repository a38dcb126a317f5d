#include "common/yaml_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace ft {
namespace {

using ::testing::HasSubstr;

constexpr const char* kJob = R"(name: demo
model:
  path: /models/tiny
  dtype: bf16
train:
  max_steps: 100
  lr: 2.0e-4
  shuffle: true
  learning_rate: 3
adapter:
  target_modules: [q_proj, v_proj]
)";

TEST(YamlConfigTest, ReadsTypedValuesAndKeepsDefaults) {
  auto root = YamlMap::Parse(kJob, "job.yaml");
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  auto train = root->Child("train");
  ASSERT_TRUE(train.ok());
  int64_t steps = 0;
  double lr = 0;
  bool shuffle = false;
  int64_t warmup = 20;  // absent: default kept
  EXPECT_TRUE(train->Get("max_steps", &steps).ok());
  EXPECT_TRUE(train->Get("lr", &lr).ok());
  EXPECT_TRUE(train->Get("shuffle", &shuffle).ok());
  EXPECT_TRUE(train->Get("warmup_steps", &warmup).ok());
  EXPECT_EQ(steps, 100);
  EXPECT_DOUBLE_EQ(lr, 2.0e-4);
  EXPECT_TRUE(shuffle);
  EXPECT_EQ(warmup, 20);
  std::vector<std::string> targets;
  EXPECT_TRUE(root->Child("adapter")->Get("target_modules", &targets).ok());
  EXPECT_EQ(targets, (std::vector<std::string>{"q_proj", "v_proj"}));
}

TEST(YamlConfigTest, WrongTypeNamesFileLineColumnAndKey) {
  auto root = YamlMap::Parse("train:\n  lr: fast\n", "job.yaml");
  ASSERT_TRUE(root.ok());
  double lr = 0;
  Status s = root->Child("train")->Get("lr", &lr);
  ASSERT_TRUE(s.IsInvalidArgument());
  EXPECT_EQ(s.message(), "job.yaml:2:7: train.lr: expected a number, got 'fast'");
}

TEST(YamlConfigTest, NonFiniteNumbersAreRefusedNamingTheKey) {
  // YAML spells infinity and NaN .inf and .nan; no number read from a config may be either.
  for (const char* text : {".inf", "-.inf", ".nan", ".NaN", "+.Inf"}) {
    auto root = YamlMap::Parse(std::string("train:\n  lr: ") + text + "\n", "job.yaml");
    ASSERT_TRUE(root.ok());
    double lr = 1e-4;
    Status s = root->Child("train")->Get("lr", &lr);
    ASSERT_TRUE(s.IsInvalidArgument()) << text;
    EXPECT_EQ(s.message(),
              std::string("job.yaml:2:7: train.lr: '") + text +
                  "' is not a finite number; write a finite number (e.g. 1e-4), not .inf or .nan");
    EXPECT_EQ(lr, 1e-4) << "the default is kept";
  }
  // Beyond a double's range is no number at all.
  auto huge = YamlMap::Parse("lr: 1e999\n", "job.yaml");
  double lr = 0;
  EXPECT_EQ(huge->Get("lr", &lr).message(), "job.yaml:1:5: lr: expected a number, got '1e999'");
}

TEST(YamlConfigTest, DuplicatedKeyIsAnErrorNamingBothLines) {
  // yaml-cpp keeps both pairs and a lookup finds the first: the later value would be lost silently.
  auto top = YamlMap::Parse("name: a\ntrain: {lr: 1}\nname: b\n", "job.yaml");
  ASSERT_FALSE(top.ok());
  EXPECT_EQ(
      top.status().message(),
      "job.yaml:3:1: name: duplicate key (first at job.yaml:1:1); YAML keeps only one of them: remove one");
  auto root = YamlMap::Parse("train:\n  lr: 1.0e-4\n  max_steps: 5\n  lr: 3.0e-4\n", "job.yaml");
  ASSERT_TRUE(root.ok());
  auto train = root->Child("train");
  ASSERT_FALSE(train.ok());
  EXPECT_EQ(train.status().message(),
            "job.yaml:4:3: train.lr: duplicate key (first at job.yaml:2:3); YAML keeps only one of them: "
            "remove one");
}

TEST(YamlConfigTest, UnknownKeyGetsLineAndSuggestion) {
  auto root = YamlMap::Parse(kJob, "job.yaml");
  ASSERT_TRUE(root.ok());
  Status s = root->Child("train")->CheckKnownKeys({"max_steps", "lr", "shuffle", "warmup_steps"});
  ASSERT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:9:3: unknown key 'learning_rate' in train"));
  Status top = root->CheckKnownKeys({"name", "model", "adapter", "trian"});
  EXPECT_THAT(top.message(),
              HasSubstr("job.yaml:5:1: unknown key 'train' in the top level (did you mean 'trian'?)"));
}

TEST(YamlConfigTest, SyntaxErrorHasLineNumber) {
  auto root = YamlMap::Parse("model:\n  path: [unclosed\n  dtype: bf16\n", "bad.yaml");
  ASSERT_FALSE(root.ok());
  EXPECT_THAT(root.status().message(), HasSubstr("bad.yaml:"));
  EXPECT_THAT(root.status().message(), HasSubstr("YAML syntax error"));
}

TEST(YamlConfigTest, RequiredAndEnumErrors) {
  auto root = YamlMap::Parse("model:\n  dtype: bf61\n", "job.yaml");
  ASSERT_TRUE(root.ok());
  auto model = root->Child("model");
  std::string path;
  Status missing = model->Get("path", &path, /*required=*/true);
  EXPECT_THAT(missing.message(), HasSubstr("job.yaml:2:3: missing required key 'model.path'"));
  std::string dtype = "fp32";
  Status bad = model->GetEnum("dtype", {"fp32", "bf16", "fp16"}, &dtype);
  EXPECT_THAT(
      bad.message(),
      HasSubstr(
          "job.yaml:2:10: model.dtype: 'bf61' is not one of fp32 | bf16 | fp16 (did you mean 'bf16'?)"));
  EXPECT_EQ(dtype, "fp32");
  EXPECT_TRUE(root->Child("data").status().IsNotFound());
}

TEST(YamlConfigTest, TopLevelMustBeMapping) {
  auto root = YamlMap::Parse("- a\n- b\n", "list.yaml");
  EXPECT_THAT(root.status().message(), HasSubstr("list.yaml: expected a mapping"));
}

TEST(YamlConfigTest, LoadFileReportsMissingFile) {
  auto root = YamlMap::LoadFile("/nonexistent/job.yaml");
  EXPECT_TRUE(root.status().IsNotFound());
  EXPECT_THAT(root.status().message(), HasSubstr("/nonexistent/job.yaml"));
  std::string path = testing::TempDir() + "/ok.yaml";
  std::ofstream(path) << "a: 1\n";
  auto ok = YamlMap::LoadFile(path);
  ASSERT_TRUE(ok.ok());
  int64_t a = 0;
  EXPECT_TRUE(ok->Get("a", &a).ok());
  EXPECT_EQ(a, 1);
  std::remove(path.c_str());
}

TEST(YamlConfigTest, ClosestMatch) {
  EXPECT_EQ(ClosestMatch("max_step", {"max_steps", "lr"}), "max_steps");
  EXPECT_EQ(ClosestMatch("zzzzzz", {"max_steps", "lr"}), "");
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace ft
