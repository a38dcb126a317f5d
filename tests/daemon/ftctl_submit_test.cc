// ftctl submit parses the job locally: a job no trainer can run is refused
// with the job file's line before anything is sent (no ftd needed: the
// address below has no server, so a job that passed would fail to connect).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/support/process.h"

namespace ft {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_support::FreshDir;
using testing_support::Proc;
using testing_support::Spawn;

// Runs `ftctl submit <dir>/job.yaml` holding `yaml` against an address nothing listens on.
Proc Submit(const std::string& dir, const std::string& yaml) {
  std::ofstream(dir + "/job.yaml") << yaml;
  return Spawn({FTCTL_BIN, "--addr", "127.0.0.1:1", "submit", dir + "/job.yaml"},
               {.log = dir + "/ftctl.log", .truncate_log = true});
}

// A full fine-tune of NF4 weights used to reach ftd (and, before ftd refused
// it, a trainer); ftctl refuses it itself, naming the file, line and column.
TEST(FtctlSubmitTest, FullFineTuneOfNf4WeightsIsRefusedLocallyWithFileLine) {
  const std::string dir = FreshDir("ftctl-submit-nf4-full");
  Proc refused = Submit(dir,
                        "model:\n  path: model\n  quantization: nf4\nadapter:\n  type: full\n"
                        "data:\n  train: d.jsonl\ntrain:\n  max_steps: 1\noutput:\n  dir: o\n");
  EXPECT_NE(refused.Wait(), 0);
  EXPECT_THAT(refused.Log(), HasSubstr(dir + "/job.yaml:3:17: model.quantization: nf4 freezes the base "
                                             "weights, so it needs adapter.type: lora (QLoRA)"));
  // The same job with LoRA passes the local checks and fails only to reach the (absent) ftd.
  Proc sent = Submit(dir,
                     "model:\n  path: model\n  quantization: nf4\nadapter:\n  type: lora\n"
                     "data:\n  train: d.jsonl\ntrain:\n  max_steps: 1\noutput:\n  dir: o\n");
  EXPECT_NE(sent.Wait(), 0);
  EXPECT_THAT(sent.Log(), Not(HasSubstr("job.yaml:"))) << sent.Log();
}

}  // namespace
}  // namespace ft
