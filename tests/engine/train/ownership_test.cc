// Split-brain safety of output.dir (docs/ARCHITECTURE.md "Who owns
// output.dir"), as the chaos of a real cluster meets it: a trainer that
// outlives its attempt, retention racing commits, a prune cut by kill -9, a
// committed checkpoint that is gone, and a finished run whose report was
// lost. Real ft-train processes on a tiny model; the reference is always the
// same job run without interruption.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "common/file_util.h"
#include "engine/job/completion.h"
#include "engine/job/job_spec.h"
#include "engine/train/checkpoint.h"
#include "engine/train/output_owner.h"
#include "engine/train/trainer.h"
#include "tests/support/ft_train.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace ::ft::testing_support;  // NOLINT: the harness is this test's vocabulary

constexpr int64_t kSteps = 24;

// ft-train run JOB as attempt `epoch` of job "j-1".
std::vector<std::string> Attempt(const std::string& job, int64_t epoch, const std::string& resume = "") {
  std::vector<std::string> args = {"run", job, "--job-id", "j-1", "--epoch", std::to_string(epoch)};
  if (!resume.empty()) args.insert(args.end(), {"--resume", resume});
  return args;
}

void WaitForSteps(const std::string& out, size_t n) {
  for (int i = 0; i < 20000 && StepLines(out).size() < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Every file under `dir` (path → size), leaving out a process's own temporaries.
std::map<std::string, uintmax_t> Snapshot(const std::string& dir) {
  std::map<std::string, uintmax_t> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string rel = it->path().string().substr(dir.size());
    if (rel.find(".tmp") != std::string::npos) continue;
    std::error_code size_ec;
    const uintmax_t size = it->is_regular_file(size_ec) ? it->file_size(size_ec) : 0;
    out[rel] = size_ec ? 0 : size;
  }
  return out;
}

size_t Differences(const std::map<std::string, uintmax_t>& a, const std::map<std::string, uintmax_t>& b) {
  size_t n = 0;
  for (const auto& [k, v] : b) n += !a.count(k) || a.at(k) != v;
  for (const auto& [k, v] : a) n += !b.count(k);
  return n;
}

// The same job uninterrupted (made once).
const std::string& ReferenceAdapter() {
  static const std::string adapter = [] {
    std::string dir = FreshDir("reference");
    EXPECT_EQ(RunToEnd(dir, WriteJob(dir, "", 3, kSteps)), kExitFinished) << Slurp(dir + "/stderr.txt");
    return Slurp(dir + "/out/adapter/adapter_model.safetensors");
  }();
  return adapter;
}

TEST(OwnershipTest, SupersededTrainerStopsBeforeItsNextWrite) {
  const std::string dir = FreshDir("superseded"), out = dir + "/out";
  const std::string job = WriteJob(dir, "", 1, 400, 2);  // a checkpoint every step: a write is always due
  const pid_t pid = Spawn(dir, Attempt(job, 1));
  WaitForSteps(out, 3);
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  OutputOwner newer(out, "j-1", 2);
  ASSERT_TRUE(newer.Claim().ok());
  const auto before = Snapshot(out);
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  EXPECT_EQ(WaitExit(pid), kExitSuperseded) << Slurp(dir + "/stderr.txt");
  // At most the one write that had passed its check before the takeover.
  EXPECT_LE(Differences(before, Snapshot(out)), 1u) << "the superseded trainer kept writing";
  EXPECT_LT(StepLines(out).size(), 400u);
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("epoch 1 is superseded"));
  auto token = ReadOwnerToken(out);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->epoch, 2) << "the new owner's token stands";
  EXPECT_TRUE(newer.Check().ok());
}

TEST(OwnershipTest, AnAttemptOlderThanTheOwnerNeverWrites) {
  const std::string dir = FreshDir("older"), out = dir + "/out";
  const std::string job = WriteJob(dir, "", 1, 10);
  ASSERT_TRUE(OutputOwner(out, "j-1", 5).Claim().ok());
  EXPECT_EQ(WaitExit(Spawn(dir, Attempt(job, 3))), kExitSuperseded);
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(out + "/checkpoints"));
}

// Two jobs, one output.dir (issue #41): job j-0 finished in it; job j-1, the
// same file with other settings, is started on it. Its trainer refuses the
// directory as another job's (bad input naming j-0 and the fix) and leaves
// j-0's COMPLETE.json and token alone; a trainer of j-1 that finds j-0's
// token at a check is not the owner either.
TEST(OwnershipTest, ADifferentJobInTheDirIsNotOwnerAndLeavesItsCompletionAlone) {
  const std::string dir = FreshDir("another-job"), out = dir + "/out";
  const std::string first = WriteJob(dir, "", 2, 4);
  ASSERT_EQ(WaitExit(Spawn(dir, {"run", first, "--job-id", "j-0", "--epoch", "1"})), kExitFinished)
      << Slurp(dir + "/stderr.txt");
  const std::string complete = Slurp(out + "/COMPLETE.json");
  ASSERT_FALSE(complete.empty());
  const std::string second = WriteJob(dir, "", 2, 6);  // other settings: not j-0's completed run
  EXPECT_EQ(WaitExit(Spawn(dir, {"run", second, "--job-id", "j-1", "--epoch", "1"})), kExitBadInput);
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("output.dir belongs to job j-0"));
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("choose another output.dir for job j-1"));
  EXPECT_EQ(Slurp(out + "/COMPLETE.json"), complete) << "job j-0's completion record was touched";
  auto token = ReadOwnerToken(out);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->job_id, "j-0");
  // A trainer of j-1 already running when j-0's token appears: superseded, not the owner.
  fs::remove(out + "/OWNER.json");
  OutputOwner mine(out, "j-1", 1);
  ASSERT_TRUE(mine.Claim().ok());
  fs::remove(out + "/OWNER.json");
  ASSERT_TRUE(OutputOwner(out, "j-0", 9).Claim().ok());
  const Status check = mine.Check();
  EXPECT_TRUE(check.IsAborted()) << check.ToString();
  EXPECT_THAT(check.message(), HasSubstr("job j-0"));
}

// Checkpoints at steps 1..n written by `epoch` (synthetic contents).
std::string WriteSyntheticCheckpoints(const std::string& root, int64_t n, int64_t epoch, int64_t first = 1) {
  for (int64_t step = first; step < first + n; ++step) {
    CheckpointContents c;
    c.state.step = step;
    c.state.epoch = epoch;
    c.state.job_hash = "h";
    c.adapter_config_json = "{}";
    c.model.push_back({"w", {64, 64}, std::vector<float>(64 * 64, static_cast<float>(step))});
    c.optimizer.push_back({"w.exp_avg", {64, 64}, std::vector<float>(64 * 64, 1.0f)});
    EXPECT_TRUE(WriteCheckpoint(root, c).ok());
  }
  return root;
}

TEST(OwnershipTest, RetentionKeepsTheCommittedCheckpointAndNeverANewerEpochs) {
  const std::string root = FreshDir("retention") + "/checkpoints";
  WriteSyntheticCheckpoints(root, 5, 1);
  WriteSyntheticCheckpoints(root, 2, 3, 6);  // steps 6 and 7 by a newer epoch
  const std::string committed = root + "/" + CheckpointName(2);
  Retention r{1, {}, [committed] { return committed; }, 2, {}};
  ASSERT_TRUE(PruneCheckpoints(root, r).ok());
  std::vector<int64_t> steps;
  for (const auto& c : ListCheckpoints(root)) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{7, 6, 2})) << "newest, the newer epoch's, and the committed one";
  // A fence that fails stops the prune before any removal.
  Retention fenced{0, {}, {}, 3, [] { return Status::Aborted("superseded"); }};
  EXPECT_FALSE(PruneCheckpoints(root, fenced).ok());
  EXPECT_EQ(ListCheckpoints(root).size(), 3u);
}

TEST(OwnershipTest, TheTrainerKeepsTheCheckpointFtdCommitted) {
  const std::string dir = FreshDir("committed"), out = dir + "/out";
  const std::string job = WriteJob(dir, "", 1, kSteps, 1);
  int control = -1;
  const pid_t pid = SpawnWithControl(dir, {"run", job, "--job-id", "j-1", "--epoch", "1"}, &control);
  // ftd's commit of step 6 reaches the trainer before that checkpoint is
  // written; keep: 1 would rotate it away three steps later.
  const std::string committed = out + "/checkpoints/" + CheckpointName(6);
  const std::string cmd = "{\"cmd\": \"committed\", \"step\": 6, \"dir\": \"" + committed + "\"}\n";
  ASSERT_EQ(write(control, cmd.data(), cmd.size()), static_cast<ssize_t>(cmd.size()));
  EXPECT_EQ(WaitExit(pid), kExitFinished) << Slurp(dir + "/stderr.txt");
  close(control);
  std::vector<int64_t> steps;
  for (const auto& c : ListCheckpoints(out + "/checkpoints")) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{kSteps, 6})) << "keep: 1 plus the committed one";
  EXPECT_TRUE(VerifyCheckpoint(committed).ok());
}

TEST(OwnershipTest, APruneCutByKillNineNeverLeavesACheckpointWithoutItsManifest) {
  std::mt19937 rng(7);
  int cut = 0;
  for (int round = 0; round < 30; ++round) {
    const std::string root = FreshDir("prune-" + std::to_string(round)) + "/checkpoints";
    WriteSyntheticCheckpoints(root, 8, 1);
    pid_t pid = fork();
    if (pid == 0) {
      _exit(PruneCheckpoints(root, Retention{0, {}, {}, 0, {}}).ok() ? 0 : 1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    kill(pid, SIGKILL);
    cut += WaitExit(pid) == 128 + SIGKILL;
    for (const auto& c : ListCheckpoints(root)) {
      EXPECT_TRUE(VerifyCheckpoint(c.dir).ok()) << c.dir << " keeps a checkpoint's name but does not verify";
    }
  }
  std::printf("prunes cut by kill -9: %d of 30\n", cut);
}

TEST(OwnershipTest, ResumeFallsBackToTheNewestVerifiedCheckpointAndSaysSo) {
  const std::string dir = FreshDir("fallback"), out = dir + "/out";
  const std::string job = WriteJob(dir, "", 3, kSteps);
  const pid_t pid = Spawn(dir, Attempt(job, 1));
  WaitForSteps(out, 10);
  kill(pid, SIGTERM);
  ASSERT_EQ(WaitExit(pid), kExitPreempted);
  auto all = ListCheckpoints(out + "/checkpoints");
  ASSERT_GE(all.size(), 2u);
  // The committed checkpoint (ftd's resume point) lost a file.
  const std::string committed = all[1].dir;
  fs::remove(committed + "/adapter_config.json");
  ASSERT_EQ(WaitExit(Spawn(dir, Attempt(job, 2, committed))), kExitFinished) << Slurp(dir + "/stderr.txt");
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("committed checkpoint unusable"));
  auto notes = EventLines(out, "resume");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0]["kind"], "resume_fallback");
  EXPECT_EQ(notes[0]["dir"], all[0].dir);
  EXPECT_EQ(notes[0]["epoch"], 2);
  EXPECT_EQ(Slurp(out + "/adapter/adapter_model.safetensors"), ReferenceAdapter())
      << "any verified checkpoint is a correct state: the result is the uninterrupted one";

  // Nothing verifies: it starts over, loudly, and still ends at the same adapter.
  for (const auto& c : ListCheckpoints(out + "/checkpoints")) fs::remove(c.dir + "/MANIFEST.json");
  fs::remove(out + "/COMPLETE.json");
  ASSERT_EQ(WaitExit(Spawn(dir, Attempt(job, 3, committed))), kExitFinished);
  notes = EventLines(out, "resume");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0]["kind"], "restart_from_zero");
  EXPECT_EQ(Slurp(out + "/adapter/adapter_model.safetensors"), ReferenceAdapter());
}

TEST(OwnershipTest, ACompletedOutputIsRecognisedWithoutRerunning) {
  const std::string dir = FreshDir("complete"), out = dir + "/out";
  const std::string job = WriteJob(dir, "", 3, kSteps);
  ASSERT_EQ(WaitExit(Spawn(dir, Attempt(job, 1))), kExitFinished);
  auto spec = LoadJobSpec(job);
  ASSERT_TRUE(spec.ok());
  auto record = VerifyCompletion(out, JobHash(*spec), /*checksums=*/true);
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(record->steps, kSteps);
  EXPECT_EQ(record->epoch, 1);
  EXPECT_TRUE(record->files.count("adapter/adapter_model.safetensors"));
  EXPECT_FALSE(VerifyCompletion(out, "another-hash", false).ok()) << "another job's record never counts";

  // The report of that run was lost: the next attempt finds the output and stops at once.
  const std::string metrics = Slurp(out + "/metrics.jsonl");
  ASSERT_EQ(WaitExit(Spawn(dir, Attempt(job, 2))), kExitFinished);
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("already complete at step 24"));
  EXPECT_EQ(Slurp(out + "/metrics.jsonl"), metrics) << "nothing was re-run";

  // A damaged output is not complete: the next attempt writes it again (from the final checkpoint).
  std::ofstream(out + "/adapter/adapter_model.safetensors", std::ios::app) << "x";
  EXPECT_FALSE(VerifyCompletion(out, JobHash(*spec), false).ok());
  ASSERT_EQ(WaitExit(Spawn(dir, Attempt(job, 3))), kExitFinished);
  EXPECT_TRUE(VerifyCompletion(out, JobHash(*spec), true).ok());
  EXPECT_EQ(Slurp(out + "/adapter/adapter_model.safetensors"), ReferenceAdapter());
}

TEST(OwnershipTest, AnIoErrorExitsAsAnEnvironmentFailureNotAUserOne) {
  const std::string dir = FreshDir("environment"), out = dir + "/out";
  const std::string job = WriteJob(dir, "", 2, 6);
  fs::create_directories(out);
  std::ofstream(out + "/checkpoints") << "a file where the checkpoint directory goes";
  EXPECT_EQ(WaitExit(Spawn(dir, Attempt(job, 1))), kExitEnvironment) << Slurp(dir + "/stderr.txt");
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("IOError"));
  // Bad input stays a user error (exit 2), fast.
  std::ofstream(job, std::ios::app) << "bogus_key: 1\n";
  EXPECT_EQ(WaitExit(Spawn(dir, Attempt(job, 2))), kExitBadInput);
}

}  // namespace
}  // namespace ft
