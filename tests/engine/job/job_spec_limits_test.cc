// job.yaml built to exhaust memory (issue #41): yaml-cpp builds the whole
// tree, ~250 bytes a node, and recurses as deep as the nesting, so one 1 MiB
// file of "[a,a,a,...]" cost ~260 MB and 32 at once 550 MB. ftd and ftctl
// (ParseJobSpec) refuse a file past the size, node or depth limit before any
// tree is built, naming the file (and where), the limit and the fix; a
// hand-written job well within them still parses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/yaml_config.h"
#include "engine/job/job_spec.h"

namespace ft {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kJob[] =
    "model: {path: m}\ndata: {train: d, seq_len: 64}\ntrain: {max_steps: 1, global_batch_size: 4}\n"
    "output: {dir: o}\n";

// kJob with data.chat_template_vars.x holding `value`.
std::string WithVar(const std::string& value) {
  return "model: {path: m}\ndata: {train: d, seq_len: 64, chat_template_vars: {x: " + value +
         "}}\ntrain: {max_steps: 1, global_batch_size: 4}\noutput: {dir: o}\n";
}

TEST(JobSpecLimitsTest, AHugeOrDeepJobYamlIsRefusedBeforeParsing) {
  // Huge: over the size limit, refused on its size alone.
  const std::string huge = std::string(kJob) + "# " + std::string(300 << 10, 'x') + "\n";
  auto big = ParseJobSpec(huge, "job.yaml");
  ASSERT_TRUE(big.status().IsInvalidArgument()) << big.status().ToString();
  EXPECT_THAT(big.status().message(), StartsWith("job.yaml: " + std::to_string(huge.size()) +
                                                 " bytes; a job.yaml may have at most 256 KiB"));
  // Many nodes: within the size limit, a list of 100,000 values.
  std::string list = "[a";
  for (int i = 1; i < 100'000; ++i) list += ",a";
  auto many = ParseJobSpec(WithVar(list + "]"), "job.yaml");
  ASSERT_TRUE(many.status().IsInvalidArgument()) << many.status().ToString();
  EXPECT_THAT(many.status().message(), StartsWith("job.yaml:2:"));
  EXPECT_THAT(many.status().message(), HasSubstr("more than 10000 YAML nodes (values, lists, mappings)"));
  EXPECT_THAT(many.status().message(),
              HasSubstr("a configuration names its data files, it does not hold data"));
  // Deep: lists in lists, in flow and in block style.
  auto deep = ParseJobSpec(WithVar(std::string(50'000, '[') + std::string(50'000, ']')), "job.yaml");
  ASSERT_TRUE(deep.status().IsInvalidArgument()) << deep.status().ToString();
  EXPECT_THAT(deep.status().message(), StartsWith("job.yaml:2:"));
  EXPECT_THAT(deep.status().message(), HasSubstr("nested more than 32 deep; at most 32 levels are accepted"));
  std::string block = std::string(kJob) + "name:\n";
  for (int i = 0; i < 40; ++i) block += std::string(2 * i + 2, ' ') + "- \n";
  EXPECT_THAT(ParseJobSpec(block, "job.yaml").status().message(), HasSubstr("nested more than 32 deep"));
  // A real job's size: fine.
  std::string vars = "{";
  for (int i = 0; i < 50; ++i) vars += (i ? ", v" : "v") + std::to_string(i) + ": value " + std::to_string(i);
  auto fine = ParseJobSpec("model: {path: m}\ndata: {train: d, seq_len: 64, chat_template_vars: " + vars +
                               "}}\ntrain: {max_steps: 1, global_batch_size: 4}\noutput: {dir: o}\n",
                           "job.yaml");
  EXPECT_TRUE(fine.ok()) << fine.status().ToString();
}

TEST(JobSpecLimitsTest, TheLimitsAreTheCallersToChoose) {
  YamlLimits tight;
  tight.max_nodes = 3;
  tight.max_depth = 1;
  EXPECT_TRUE(CheckYamlLimits("a: b", "f", tight).ok());
  EXPECT_THAT(CheckYamlLimits("a: b\nc: d", "f", tight).message(), HasSubstr("more than 3 YAML nodes"));
  EXPECT_THAT(CheckYamlLimits("a: {b: c}", "f", tight).message(), HasSubstr("nested more than 1 deep"));
  EXPECT_TRUE(CheckYamlLimits("a: 'unclosed", "f", tight).ok()) << "syntax errors are the parser's to report";
}

}  // namespace
}  // namespace ft
