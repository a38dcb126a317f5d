// The trainer's metrics.jsonl writer (engine/train/metrics_log.h): a resume
// keeps only the lines of the steps it holds, a superseded owner writes
// nothing, and a write the filesystem refuses is an error, never silence.
#include "engine/train/metrics_log.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "common/file_util.h"
#include "tests/support/temp_dir.h"

namespace ft {
namespace {

MetricsLine Step(int64_t step) {
  MetricsLine m;
  m.kind = MetricsLine::Kind::kStep;
  m.step = step;
  m.loss = 1.0 / static_cast<double>(step);
  return m;
}

TEST(MetricsLogTest, OpenKeepsTheStepsTheResumedStateHoldsAndStampsTheEpoch) {
  const std::string dir = testing_support::FreshDir("metrics-keep");
  const std::string path = dir + "/metrics.jsonl";
  {
    MetricsLog log(path, {}, 0);
    ASSERT_TRUE(log.Open(0).ok());
    for (int64_t s = 1; s <= 5; ++s) ASSERT_TRUE(log.Write(Step(s)).ok());
  }
  MetricsLog resumed(path, {}, 4);
  ASSERT_TRUE(resumed.Open(3).ok());
  ASSERT_TRUE(resumed.Write(Step(4)).ok());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  std::istringstream in(*text);
  std::vector<int64_t> steps, epochs;
  for (std::string line; std::getline(in, line);) {
    auto m = ParseMetricsLine(line);
    ASSERT_TRUE(m.ok()) << line;
    steps.push_back(m->step);
    epochs.push_back(m->epoch);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(epochs, (std::vector<int64_t>{0, 0, 0, 4}));
}

TEST(MetricsLogTest, ASupersededOwnerWritesNothing) {
  const std::string path = testing_support::FreshDir("metrics-fence") + "/metrics.jsonl";
  bool superseded = false;
  MetricsLog log(
      path, [&] { return superseded ? Status::Aborted("epoch 2 owns it") : Status::OK(); }, 1);
  ASSERT_TRUE(log.Open(0).ok());
  ASSERT_TRUE(log.Write(Step(1)).ok());
  superseded = true;
  EXPECT_TRUE(log.Write(Step(2)).IsAborted());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(std::count(text->begin(), text->end(), '\n'), 1);
}

TEST(MetricsLogTest, AWriteTheFilesystemRefusesIsAnErrorNamingTheFile) {
  const std::string path = testing_support::FreshDir("metrics-full") + "/metrics.jsonl";
  MetricsLog log(path, {}, 0);
  ASSERT_TRUE(log.Open(0).ok());
  ASSERT_TRUE(log.Write(Step(1)).ok());
  // A full disk, as the process sees it: no file may grow past its size now.
  const off_t size = static_cast<off_t>(std::filesystem::file_size(path));
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old;
  limit.rlim_cur = static_cast<rlim_t>(size);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  const Status s = log.Write(Step(2));
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
}

TEST(MetricsLogTest, WritingBeforeOpenIsRefused) {
  MetricsLog log(testing_support::FreshDir("metrics-closed") + "/metrics.jsonl", {}, 0);
  EXPECT_FALSE(log.Write(Step(1)).ok());
}

}  // namespace
}  // namespace ft
