// Checkpoints and exact resume, as a preempted user meets them: kill -9 at
// random moments, SIGTERM, a changed batch plan, damaged checkpoints, and a
// changed job. The reference is always the same job run without interruption.
#include "engine/train/checkpoint.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/file_util.h"
#include "engine/io/hf_model.h"
#include "engine/job/checkpoint_interval.h"
#include "engine/job/job_spec.h"
#include "engine/train/trainer.h"
#include "tests/support/ft_train.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace ::ft::testing_support;  // NOLINT: the harness is this test's vocabulary

// Long enough that 25 kills at random moments land before the end.
constexpr int64_t kChaosSteps = 240;

// The uninterrupted reference run (made once).
const std::string& ReferenceOut() {
  static const std::string out = [] {
    std::string dir = FreshDir("reference");
    EXPECT_EQ(RunToEnd(dir, WriteJob(dir, "", 3, kChaosSteps)), kExitFinished) << Slurp(dir + "/stderr.txt");
    return dir + "/out";
  }();
  return out;
}

std::string NewestCheckpoint(const std::string& out) {
  auto all = ListCheckpoints(out + "/checkpoints");
  return all.empty() ? "" : all.front().dir;
}

void ExpectSameFinalState(const std::string& out, const std::string& ref = ReferenceOut()) {
  EXPECT_EQ(Slurp(out + "/adapter/adapter_model.safetensors"),
            Slurp(ref + "/adapter/adapter_model.safetensors"))
      << "final adapter differs from the uninterrupted run";
  EXPECT_EQ(Slurp(NewestCheckpoint(out) + "/optimizer.safetensors"),
            Slurp(NewestCheckpoint(ref) + "/optimizer.safetensors"))
      << "final optimizer state differs from the uninterrupted run";
  auto a = StepLines(out), b = StepLines(ref);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i].value("loss", -1.0), b[i].value("loss", -1.0)) << "line " << i + 1;  // (-1: an eval line)
  }
}

std::set<std::string> TempDirs(const std::string& root) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) out.insert(e.path().filename().string());
  }
  return out;
}

// A temporary checkpoint directory that was not there before: a write in progress (or cut short).
bool HasNewTempDir(const std::string& root, const std::set<std::string>& before) {
  for (const std::string& name : TempDirs(root)) {
    if (!before.count(name)) return true;
  }
  return false;
}

// Runs `job` in `dir` to its end, killing ft-train (-9) `want` times along the way and restarting
// it: every third kill aims at a checkpoint write (it fires as soon as a temporary directory
// appears, waiting up to 5 s so that a slow start on a loaded machine still gets there); the
// others land at a random moment. Returns the kills and, in *during_write, how many landed inside
// a checkpoint write (a temporary directory left behind).
int KillNineAtRandomToTheEnd(const std::string& dir, const std::string& job, int want, uint32_t seed,
                             int* during_write) {
  std::mt19937 rng(seed);
  int kills = 0;
  *during_write = 0;
  for (int attempt = 0; attempt < 200; ++attempt) {
    const std::set<std::string> stale = TempDirs(dir + "/out/checkpoints");
    pid_t pid = Spawn(dir, {"run", job});
    if (kills < want) {
      const bool aim_at_write = kills % 3 == 0;
      const auto until =
          std::chrono::steady_clock::now() +
          std::chrono::milliseconds(aim_at_write ? 5000 : std::uniform_int_distribution<int>(10, 150)(rng));
      while (std::chrono::steady_clock::now() < until) {
        if (aim_at_write && HasNewTempDir(dir + "/out/checkpoints", stale)) break;
        std::this_thread::sleep_for(std::chrono::microseconds(aim_at_write ? 100 : 2000));
      }
      if (kill(pid, SIGKILL) == 0) {
        int code = WaitExit(pid);
        if (code == 128 + SIGKILL) {
          ++kills;
          if (HasNewTempDir(dir + "/out/checkpoints", stale)) ++*during_write;
          continue;
        }
        if (code == kExitFinished) break;
        ADD_FAILURE() << "ft-train exited " << code << ": " << Slurp(dir + "/stderr.txt");
        return kills;
      }
    }
    EXPECT_EQ(WaitExit(pid), kExitFinished) << Slurp(dir + "/stderr.txt");
    break;
  }
  return kills;
}

TEST(CheckpointChaosTest, TwentyFiveKillNineRestartsEndBitIdentical) {
  ASSERT_FALSE(ReferenceOut().empty());
  std::string dir = FreshDir("chaos");
  int during_write = 0;
  const int kills =
      KillNineAtRandomToTheEnd(dir, WriteJob(dir, "", 3, kChaosSteps), 25, 20261121, &during_write);
  std::printf("SIGKILLs: %d (%d during a checkpoint write)\n", kills, during_write);
  EXPECT_GE(kills, 20);
  EXPECT_GE(during_write, 1) << "no kill landed inside a checkpoint write; the test did not cover it";
  ExpectSameFinalState(dir + "/out");
}

// DPO (LoRA, and a full fine-tune whose reference is stored beside the data) killed (-9) at
// random moments, a checkpoint write among them, ends with the uninterrupted run's adapter (model)
// bytes, optimizer state and per-step losses.
TEST(CheckpointChaosTest, DpoKilledNineAtRandomEndsBitIdentical) {
  for (const std::string adapter : {"", "adapter: {type: full}"}) {
    SCOPED_TRACE(adapter.empty() ? "LoRA" : "full");
    const std::string name = adapter.empty() ? "dpo" : "dpo-full";
    const std::string ref = FreshDir(name + "-reference"), dir = FreshDir(name + "-chaos");
    ASSERT_EQ(RunToEnd(ref, WriteDpoJob(ref, "", 3, 60, 3, adapter)), kExitFinished)
        << Slurp(ref + "/stderr.txt");
    int during_write = 0;
    const int kills =
        KillNineAtRandomToTheEnd(dir, WriteDpoJob(dir, "", 3, 60, 3, adapter), 6, 43, &during_write);
    std::printf("%s: SIGKILLs: %d (%d during a checkpoint write)\n", name.c_str(), kills, during_write);
    EXPECT_GE(kills, 4);
    EXPECT_GE(during_write, 1) << "no kill landed inside a checkpoint write; the test did not cover it";
    const std::string trained =
        adapter.empty() ? "/adapter/adapter_model.safetensors" : "/model/model.safetensors";
    EXPECT_FALSE(Slurp(ref + "/out" + trained).empty());
    EXPECT_EQ(Slurp(dir + "/out" + trained), Slurp(ref + "/out" + trained)) << trained;
    if (adapter.empty()) ExpectSameFinalState(dir + "/out", ref + "/out");
  }
}

// A mixture of three sources (0.6 / 0.3 / 0.1) killed (-9) at random moments, a checkpoint write
// among them, ends with the uninterrupted run's adapter bytes, optimizer state and per-step
// losses; its checkpoints record each source's position, which the cursor alone determines.
TEST(CheckpointChaosTest, AMixtureKilledNineAtRandomEndsBitIdentical) {
  const std::string ref = FreshDir("mixture-reference"), dir = FreshDir("mixture-chaos");
  // A tenth of the rows held out (data.val_fraction) and evaluated every 6 steps.
  const auto job = [](const std::string& d) {
    const std::string path = WriteMixtureJob(d, "  micro_batch_size: 2\n  eval_every_steps: 6\n", 3, 36, 3);
    std::string text = Slurp(path);
    text.replace(text.find("packing: false"), 14, "packing: false, val_fraction: 0.1");
    std::ofstream(path) << text;
    return path;
  };
  ASSERT_EQ(RunToEnd(ref, job(ref)), kExitFinished) << Slurp(ref + "/stderr.txt");
  int during_write = 0;
  const int kills = KillNineAtRandomToTheEnd(dir, job(dir), 6, 45, &during_write);
  std::printf("mixture: SIGKILLs: %d (%d during a checkpoint write)\n", kills, during_write);
  EXPECT_GE(kills, 4);
  ExpectSameFinalState(dir + "/out", ref + "/out");
  const auto eval_lines = [](const std::string& out) {
    std::vector<nlohmann::json> lines;
    std::istringstream in(Slurp(out + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("eval_loss")) lines.push_back(j);
    }
    return lines;
  };
  const auto evals = eval_lines(ref + "/out"), resumed_evals = eval_lines(dir + "/out");
  ASSERT_EQ(evals.size(), 6u);
  ASSERT_EQ(resumed_evals.size(), evals.size());
  for (size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(resumed_evals[i]["eval_loss"], evals[i]["eval_loss"])
        << "the held-out rows evaluated, step " << evals[i]["step"];
  }
  auto state = ReadCheckpointState(NewestCheckpoint(ref + "/out"));
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_EQ(state->source_positions.size(), 3u);
  EXPECT_EQ(state->cursor, 36 * 8);
  const double want[] = {0.6, 0.3, 0.1};
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(static_cast<double>(state->source_positions[k]) / state->cursor, want[k], 1.0 / state->cursor)
        << "source " << k;
    // Each step line says how the mixture was realised so far (ftd, ftctl status, the dashboard).
    const auto lines = StepLines(ref + "/out");
    const auto last_step =
        std::find_if(lines.rbegin(), lines.rend(), [](const auto& l) { return l.contains("loss"); });
    ASSERT_NE(last_step, lines.rend());
    EXPECT_DOUBLE_EQ((*last_step)["data_share/" + std::to_string(k)].get<double>(),
                     static_cast<double>(state->source_positions[k]) / state->cursor);
  }
}

// DPO with every memory technique at once (activation checkpointing with the layer inputs in host
// memory, the frozen weights offloaded, paged AdamW) ends with the plain run's adapter bytes and
// losses; in bf16 and fp16 (loss scaling) it trains to within 5% of fp32's per-step losses.
TEST(DpoTechniquesTest, MemoryTechniquesLeaveDpoBitIdenticalAndHalfPrecisionFollowsFp32) {
  auto run = [](const std::string& name, const std::string& extra, const std::string& dtype) {
    const std::string dir = FreshDir(name);
    const std::string job = WriteDpoJob(dir, "  micro_batch_size: 2\n" + extra, 3, 12, 2);
    std::string text = Slurp(job);
    text.replace(text.find("dtype: fp32"), 11, "dtype: " + dtype);
    std::ofstream(job) << text;
    EXPECT_EQ(RunToEnd(dir, job), kExitFinished) << Slurp(dir + "/stderr.txt");
    return dir + "/out";
  };
  const std::string plain = run("dpo-plain", "", "fp32");
  const std::string techniques =
      run("dpo-techniques",
          "  activation_checkpointing: offload\n  cpu_offload: true\n  optimizer: paged_adamw\n", "fp32");
  EXPECT_EQ(Slurp(techniques + "/adapter/adapter_model.safetensors"),
            Slurp(plain + "/adapter/adapter_model.safetensors"));
  const auto want = StepLines(plain);
  ASSERT_EQ(want.size(), 12u);
  const auto got = StepLines(techniques);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i]["loss"], want[i]["loss"]) << "step " << i + 1;
  for (const std::string dtype : {"bf16", "fp16"}) {
    const auto half = StepLines(run("dpo-" + dtype, "", dtype));
    ASSERT_EQ(half.size(), want.size()) << dtype;
    for (size_t i = 0; i < want.size(); ++i) {
      const double x = half[i]["loss"].get<double>(), y = want[i]["loss"].get<double>();
      EXPECT_NEAR(x, y, 0.05 * y) << dtype << " step " << i + 1;
      EXPECT_TRUE(half[i].contains("rewards/margins")) << dtype;
    }
  }
}

TEST(CheckpointSignalTest, SigtermCheckpointsLosesNoStepAndResumesBitIdentical) {
  ASSERT_FALSE(ReferenceOut().empty());
  std::string dir = FreshDir("sigterm");
  std::string job = WriteJob(dir, "", 3, kChaosSteps);
  pid_t pid = Spawn(dir, {"run", job});
  // Wait until a few steps are logged (however loaded the machine), then ask it to stop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (StepLines(dir + "/out").size() < 10 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(StepLines(dir + "/out").size(), 10u) << Slurp(dir + "/stderr.txt");
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const size_t logged_at_signal = StepLines(dir + "/out").size();
  ASSERT_EQ(WaitExit(pid), kExitPreempted) << Slurp(dir + "/stderr.txt");
  auto steps = StepLines(dir + "/out");
  ASSERT_FALSE(steps.empty());
  const int64_t last_logged = steps.back()["step"].get<int64_t>();
  const std::string ckpt = NewestCheckpoint(dir + "/out");
  auto contents = ReadCheckpoint(ckpt);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  EXPECT_EQ(contents->state.step, last_logged) << "every finished step is in the checkpoint: zero steps lost";
  EXPECT_LE(contents->state.step, static_cast<int64_t>(logged_at_signal) + 1)
      << "at most one step after the signal";
  EXPECT_EQ(contents->state.reason, "SIGTERM");
  EXPECT_THAT(Slurp(dir + "/out/metrics.jsonl"), HasSubstr("\"event\":\"preempted\""));
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("stopped after checkpoint"));
  ASSERT_EQ(RunToEnd(dir, job), kExitFinished) << Slurp(dir + "/stderr.txt");
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("resumed from"));
  ExpectSameFinalState(dir + "/out");
}

TEST(CheckpointSignalTest, StopWithoutTimeToFinishSavesTheLastStepBoundary) {
  std::string dir = FreshDir("deadline");
  auto spec = LoadJobSpec(WriteJob(dir, "  micro_batch_size: 1\n"));
  ASSERT_TRUE(spec.ok());
  auto tr = Trainer::Create(*spec);
  ASSERT_TRUE(tr.ok());
  TrainControl control;
  (*tr)->set_control(&control);
  StepMetrics m;
  ASSERT_TRUE((*tr)->Step(&m).ok());
  auto weights = [&] {
    std::vector<float> all;
    for (const auto& p : (*tr)->model().TrainableParams()) {
      const std::vector<float> w = (*tr)->model().Download(p.data, p.numel);
      all.insert(all.end(), w.begin(), w.end());
    }
    return all;
  };
  const std::vector<float> before = weights();
  control.Post({true, std::chrono::steady_clock::now(), "test"});  // deadline already passed
  bool interrupted = false;
  ASSERT_TRUE((*tr)->Step(&m, &interrupted).ok());
  EXPECT_TRUE(interrupted);
  EXPECT_EQ((*tr)->steps_done(), 1);
  EXPECT_EQ(before, weights()) << "an abandoned step must not touch the weights";
  EXPECT_EQ((*tr)->Capture("test").state.cursor, 8) << "cursor stays at the step boundary";
  // With a generous deadline the step is finished instead.
  control.Clear();
  control.Post({true, std::chrono::steady_clock::now() + std::chrono::seconds(60), "test"});
  ASSERT_TRUE((*tr)->Step(&m, &interrupted).ok());
  EXPECT_FALSE(interrupted);
  EXPECT_EQ((*tr)->steps_done(), 2);
}

// The memory techniques (activation offload, CPU-offloaded frozen weights,
// paged AdamW; each alone, then together) under kill -9: each run is killed
// mid-way, resumed, and must end bit-identical to the uninterrupted reference
// run without any technique (the techniques move bytes, never the math).
TEST(CheckpointChaosTest, KillNineWithEachMemoryTechniqueResumesBitIdentical) {
  constexpr int64_t kSteps = 60;
  const std::string ref_dir = FreshDir("technique-reference");
  ASSERT_EQ(RunToEnd(ref_dir, WriteJob(ref_dir, "", 3, kSteps)), kExitFinished)
      << Slurp(ref_dir + "/stderr.txt");
  const std::pair<const char*, const char*> techniques[] = {
      {"offload", "  micro_batch_size: 2\n  activation_checkpointing: offload\n"},
      {"cpu-offload", "  micro_batch_size: 2\n  cpu_offload: true\n"},
      {"paged", "  micro_batch_size: 2\n  optimizer: paged_adamw\n"},
      {"all",
       "  micro_batch_size: 2\n  activation_checkpointing: offload\n  cpu_offload: true\n"
       "  optimizer: paged_adamw\n"}};
  for (const auto& [name, extra] : techniques) {
    SCOPED_TRACE(name);
    std::string dir = FreshDir(std::string("technique-") + name);
    std::string job = WriteJob(dir, extra, 3, kSteps);
    pid_t pid = Spawn(dir, {"run", job});
    // Killed once a checkpoint is committed and a few steps more are logged.
    for (int i = 0; i < 20000 && StepLines(dir + "/out").size() < 20; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(WaitExit(pid), 128 + SIGKILL) << "finished before the kill: " << Slurp(dir + "/stderr.txt");
    ASSERT_FALSE(NewestCheckpoint(dir + "/out").empty());
    ASSERT_EQ(RunToEnd(dir, job), kExitFinished) << Slurp(dir + "/stderr.txt");
    EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("resumed from"));
    ExpectSameFinalState(dir + "/out", ref_dir + "/out");
  }
}

TEST(CheckpointResumeTest, DifferentMicroBatchPlanKeepsTheMath) {
  std::string dir_a = FreshDir("plan-a"), dir_b = FreshDir("plan-b");
  auto spec_a = LoadJobSpec(WriteJob(dir_a, "  micro_batch_size: 4\n", 0, 12));
  ASSERT_TRUE(spec_a.ok());
  auto a = Trainer::Create(*spec_a);
  ASSERT_TRUE(a.ok());
  std::vector<double> ref;
  for (int s = 0; s < 12; ++s) {
    StepMetrics m;
    ASSERT_TRUE((*a)->Step(&m).ok());
    ref.push_back(m.loss);
  }
  // Same job, interrupted after 5 steps and resumed with micro-batch 1 x accumulation 8.
  auto spec_b = LoadJobSpec(WriteJob(dir_b, "  micro_batch_size: 4\n", 0, 12));
  auto b = Trainer::Create(*spec_b);
  ASSERT_TRUE(b.ok());
  std::vector<double> got;
  for (int s = 0; s < 5; ++s) {
    StepMetrics m;
    ASSERT_TRUE((*b)->Step(&m).ok());
    got.push_back(m.loss);
  }
  CheckpointContents saved = (*b)->Capture("test");
  JobSpec spec_c = *spec_b;
  spec_c.train.micro_batch_size = 1;
  auto c = Trainer::Create(spec_c);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->plan().accumulation, 8);
  ASSERT_TRUE((*c)->Restore(saved, "memory").ok());
  for (int s = 5; s < 12; ++s) {
    StepMetrics m;
    ASSERT_TRUE((*c)->Step(&m).ok());
    got.push_back(m.loss);
  }
  double worst = 0;
  for (size_t s = 0; s < ref.size(); ++s) worst = std::max(worst, std::fabs(got[s] - ref[s]) / ref[s]);
  std::printf("resume with plan 4x2 -> 1x8: worst loss rel diff %.3e\n", worst);
  EXPECT_LE(worst, 1e-6);
}

// An fp16 job whose first loss scale is far too large: gradients overflow
// fp16's range (65504) in the backward, the step is skipped (no update, the
// data still consumed), the scale halves until the gradients fit, then
// doubles after every 3 good steps (and overflows again). Resumed from a
// checkpoint taken mid-way, with a growth count and skipped steps in it, the
// run continues exactly: same losses, scales, skips and final weights.
struct Fp16Step {
  double loss, scale;
  bool skipped;
  bool operator==(const Fp16Step&) const = default;
};

std::unique_ptr<Trainer> Fp16Trainer(const std::string& dir) {
  const std::string job = WriteJob(
      dir, "  micro_batch_size: 2\n  loss_scale_init: 1.0e+12\n  loss_scale_growth_interval: 3\n", 0, 60);
  std::string text = Slurp(job);
  text.replace(text.find("dtype: fp32"), 11, "dtype: fp16");
  std::ofstream(job) << text;
  auto spec = LoadJobSpec(job);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto t = Trainer::Create(*spec);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<Fp16Step> Fp16Steps(Trainer& t, int n) {
  std::vector<Fp16Step> out;
  for (int i = 0; i < n; ++i) {
    StepMetrics m;
    EXPECT_TRUE(t.Step(&m).ok());
    EXPECT_EQ(m.skipped, !std::isfinite(m.grad_norm));
    out.push_back({m.loss, m.loss_scale, m.skipped});
  }
  return out;
}

std::vector<std::vector<float>> Weights(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const TrainableParam& p : t.model().TrainableParams())
    out.push_back(t.model().Download(p.data, p.numel));
  return out;
}

TEST(LossScalingTest, Fp16OverflowSkipsTheStepHalvesTheScaleAndResumesExactly) {
  constexpr int kSteps = 60, kCut = 31;
  auto a = Fp16Trainer(FreshDir("fp16-a"));
  ASSERT_NE(a, nullptr);
  const std::vector<std::vector<float>> initial = Weights(*a);
  StepMetrics first;
  ASSERT_TRUE(a->Step(&first).ok());
  EXPECT_TRUE(first.skipped) << "a loss scale of 1e12 must overflow fp16 gradients";
  EXPECT_EQ(first.loss_scale, 1e12);
  EXPECT_EQ(a->loss_scale(), 0.5e12);
  EXPECT_EQ(Weights(*a), initial) << "a skipped step changed the weights";
  EXPECT_EQ(a->optimizer().updates(), 0);
  std::vector<Fp16Step> ref = {{first.loss, first.loss_scale, first.skipped}};
  for (const Fp16Step& s : Fp16Steps(*a, kSteps - 1)) ref.push_back(s);
  // The scale follows GradScaler's rule at every step.
  int growths = 0, good_in_a_row = 0;
  const int skips =
      static_cast<int>(std::count_if(ref.begin(), ref.end(), [](const Fp16Step& s) { return s.skipped; }));
  for (size_t i = 0; i + 1 < ref.size(); ++i) {
    if (ref[i].skipped) {
      good_in_a_row = 0;
      EXPECT_EQ(ref[i + 1].scale, ref[i].scale / 2) << "step " << i + 1;
    } else if (++good_in_a_row == 3) {
      ++growths;
      good_in_a_row = 0;
      EXPECT_EQ(ref[i + 1].scale, ref[i].scale * 2) << "step " << i + 1;
    } else {
      EXPECT_EQ(ref[i + 1].scale, ref[i].scale) << "step " << i + 1;
    }
  }
  std::printf("fp16: %d of %d steps skipped, %d growths, final scale %g\n", skips, kSteps, growths,
              a->loss_scale());
  EXPECT_GE(skips, 2);
  EXPECT_GE(growths, 2);
  EXPECT_LT(skips, kSteps * 2 / 3) << "the scale never settled";
  EXPECT_EQ(a->optimizer().updates(), kSteps - skips);
  EXPECT_LT(ref.back().loss, ref.front().loss) << "fp16 training did not learn";

  const std::string dir_b = FreshDir("fp16-b");
  auto b = Fp16Trainer(dir_b);
  ASSERT_NE(b, nullptr);
  std::vector<Fp16Step> got = Fp16Steps(*b, kCut);
  CheckpointContents saved = b->Capture("test");
  EXPECT_GT(saved.state.skipped_steps, 0);
  EXPECT_EQ(saved.state.loss_scale, b->loss_scale());
  b.reset();
  auto c = Fp16Trainer(dir_b);  // the same job (its math keys name the data file)
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Restore(saved, "memory").ok());
  EXPECT_EQ(c->loss_scale(), saved.state.loss_scale);
  for (const Fp16Step& s : Fp16Steps(*c, kSteps - kCut)) got.push_back(s);
  EXPECT_EQ(got, ref) << "the resumed fp16 run differs from the uninterrupted one";
  EXPECT_EQ(Weights(*c), Weights(*a)) << "final weights differ after resume";
}

// Runs a job to the end with a checkpoint every 2 of 12 steps.
std::string TrainedOut(const std::string& name) {
  std::string dir = FreshDir(name);
  EXPECT_EQ(RunToEnd(dir, WriteJob(dir, "", 2, 12)), kExitFinished) << Slurp(dir + "/stderr.txt");
  return dir;
}

void ExpectFallbackFrom(const std::string& out, const std::function<void(const std::string&)>& damage,
                        const std::string& why) {
  auto all = ListCheckpoints(out + "/checkpoints");
  ASSERT_GE(all.size(), 2u);
  damage(all[0].dir);
  std::vector<std::string> skipped;
  auto found = FindNewestValidCheckpoint(out + "/checkpoints", &skipped);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->dir, all[1].dir);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr(why));
}

TEST(CheckpointCorruptionTest, TruncatedFlippedOrUnmanifestedCheckpointsFallBackLoudly) {
  std::string dir = TrainedOut("corrupt");
  const std::string out = dir + "/out";
  ExpectFallbackFrom(
      out,
      [](const std::string& d) {
        fs::resize_file(d + "/optimizer.safetensors", fs::file_size(d + "/optimizer.safetensors") / 2);
      },
      "optimizer.safetensors: ");
  ExpectFallbackFrom(
      out,
      [](const std::string& d) {
        std::fstream f(d + "/adapter_model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(200);
        char c = 0;
        f.read(&c, 1);
        f.seekp(200);
        c ^= 0x10;
        f.write(&c, 1);
      },
      "SHA-256 differs");
  ExpectFallbackFrom(
      out, [](const std::string& d) { fs::remove(d + "/MANIFEST.json"); }, "MANIFEST.json: missing");
  // ft-train itself says so on stderr, resumes from the valid one and finishes.
  fs::remove_all(out + "/adapter");
  fs::remove_all(out + "/merged");
  ASSERT_EQ(RunToEnd(dir, dir + "/job.yaml"), kExitFinished);
  const std::string err = Slurp(dir + "/stderr.txt");
  EXPECT_THAT(err, HasSubstr("WARNING: damaged checkpoint skipped"));
  EXPECT_THAT(err, HasSubstr("resumed from " + out + "/checkpoints/step-00000010"));
  // With none valid it starts over with a warning.
  for (const auto& c : ListCheckpoints(out + "/checkpoints")) fs::remove(c.dir + "/MANIFEST.json");
  ASSERT_EQ(RunToEnd(dir, dir + "/job.yaml"), kExitFinished);
  EXPECT_THAT(Slurp(dir + "/stderr.txt"), HasSubstr("no valid checkpoint left; starting from step 0"));
}

// checkpoint.every auto's C across resumes: the back-to-back writes themselves are kept (their
// median is C) and the probe count goes on, so a slow first probe (written while the job
// started) neither stays C for the whole job nor, with attempts shorter than sixteen automatic
// checkpoints, is never measured again.
TEST(CheckpointWriterTest, AResumedRunKeepsItsBackToBackWritesTheirMedianAndItsProbeCount) {
  TrainerState s;
  s.recent_fixed_seconds = {0.16, 0.03, 0.04};
  s.fixed_checkpoint_seconds = 0.04;
  s.checkpoints_since_probe = 7;
  auto back = TrainerStateFromJson(TrainerStateToJson(s), "trainer_state.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->recent_fixed_seconds, s.recent_fixed_seconds);
  EXPECT_EQ(back->checkpoints_since_probe, 7);
  // A file written before the writes were kept: its median stands in as one write.
  nlohmann::json older = nlohmann::json::parse(TrainerStateToJson(s));
  older.erase("recent_fixed_seconds");
  auto old_back = TrainerStateFromJson(older.dump(), "trainer_state.json");
  ASSERT_TRUE(old_back.ok()) << old_back.status().ToString();
  EXPECT_EQ(old_back->recent_fixed_seconds, std::vector<double>{0.04});
  CheckpointWriter writer(FreshDir("writer-seed"));
  writer.Seed(0.05, back->recent_fixed_seconds);
  EXPECT_EQ(writer.recent_fixed(), s.recent_fixed_seconds);
  EXPECT_EQ(MedianSeconds(writer.recent_fixed()), 0.04) << "the median: the slow first probe does not set C";
  std::vector<double> twenty;
  for (int i = 0; i < 20; ++i) twenty.push_back(0.01 * (i + 1));
  writer.Seed(0, twenty);
  EXPECT_EQ(writer.recent_fixed(), std::vector<double>(twenty.end() - 16, twenty.end())) << "the last 16";
}

TEST(CheckpointRetentionTest, KeepsNewestAndNeverTheOneInUse) {
  std::string dir = TrainedOut("retention");
  auto all = ListCheckpoints(dir + "/out/checkpoints");
  ASSERT_EQ(all.size(), 3u);  // keep: 3
  EXPECT_EQ(all[0].step, 12);
  EXPECT_EQ(all[2].step, 8);
  ASSERT_TRUE(PruneCheckpoints(dir + "/out/checkpoints", Retention{1, {all[2].dir}}).ok());
  auto left = ListCheckpoints(dir + "/out/checkpoints");
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].step, 12);
  EXPECT_EQ(left[1].step, 8) << "the protected checkpoint survives pruning";
}

// The line that records a checkpoint in metrics.jsonl is how ftd and the dashboard learn of it: a
// run that cannot write it fails (as an environment failure, exit 5) naming the file, instead of
// training on with the checkpoint unrecorded. The filesystem refuses only that line: a long
// output.dir makes it (it names the checkpoint's directory) longer than any step line, and a
// file-size limit just above what metrics.jsonl holds before it (512 KiB of step-0 lines kept from
// an earlier run, more than any file a checkpoint writes) refuses its growth.
TEST(CheckpointEventTest, ACheckpointWhoseEventLineCannotBeWrittenFailsTheRunNamingTheMetricsFile) {
  std::string dir = FreshDir("event-line");
  for (int i = 0; i < 10; ++i) dir += "/" + std::string(200, 'd');
  const std::string job = WriteJob(dir, "", /*every_steps=*/1, /*steps=*/6);
  fs::create_directories(dir + "/out");
  std::string kept;
  while (kept.size() < (size_t{512} << 10))
    kept += R"({"step":0,"event":"note","reason":")" + std::string(500, 'k') + "\"}\n";
  std::ofstream(dir + "/out/metrics.jsonl") << kept;
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit limit = old;
  limit.rlim_cur = static_cast<rlim_t>(kept.size() + 1500);  // room for three step lines, not the event
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  const pid_t pid = Spawn(dir, {"run", job});  // inherits the limit
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_EQ(WaitExit(pid), kExitEnvironment);
  const std::string err = Slurp(dir + "/stderr.txt");
  EXPECT_THAT(err, HasSubstr("the event line of checkpoint " + dir + "/out/checkpoints/step-00000001"));
  EXPECT_THAT(err, HasSubstr(dir + "/out/metrics.jsonl: write failed"));
  EXPECT_FALSE(fs::exists(dir + "/out/COMPLETE.json")) << err;
}

TEST(CheckpointResumeTest, IncompatibleJobChangeIsRefusedNamingTheKey) {
  std::string dir = FreshDir("incompatible");
  std::string job = WriteJob(dir, "", 2, 12);
  pid_t pid = Spawn(dir, {"run", job});
  for (int i = 0; i < 2000 && StepLines(dir + "/out").size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kill(pid, SIGTERM);
  ASSERT_EQ(WaitExit(pid), kExitPreempted);
  std::string text = Slurp(job);
  text.replace(text.find("lr: 1.0e-2"), 10, "lr: 2.0e-2");
  std::ofstream(job) << text;
  EXPECT_EQ(RunToEnd(dir, job), kExitBadInput);
  EXPECT_THAT(Slurp(dir + "/stderr.txt"),
              HasSubstr("train.lr is '0.02' but checkpoint " + dir + "/out/checkpoints/step-"));
  // Harmless changes pass: more steps and another micro-batch plan.
  text.replace(text.find("lr: 2.0e-2"), 10, "lr: 1.0e-2");
  text.replace(text.find("max_steps: 12"), 13, "max_steps: 14");
  text.replace(text.find("micro_batch_size: 2"), 19, "micro_batch_size: 8");
  std::ofstream(job) << text;
  EXPECT_EQ(RunToEnd(dir, job), kExitFinished) << Slurp(dir + "/stderr.txt");
  EXPECT_EQ(StepLines(dir + "/out").size(), 14u);
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

TEST(CheckpointControlTest, ControlChannelCheckpointThenStopWithReason) {
  std::string dir = FreshDir("control");
  std::string job = WriteJob(dir, "", 1000, 2000);  // long run, no periodic checkpoints
  int control = -1;
  const pid_t pid = SpawnWithControl(dir, {"run", job}, &control);
  for (int i = 0; i < 2000 && StepLines(dir + "/out").size() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::string checkpoint = "{\"cmd\": \"checkpoint\", \"deadline_s\": 30}\n";
  ASSERT_EQ(write(control, checkpoint.data(), checkpoint.size()), static_cast<ssize_t>(checkpoint.size()));
  for (int i = 0; i < 2000 && ListCheckpoints(dir + "/out/checkpoints").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_FALSE(ListCheckpoints(dir + "/out/checkpoints").empty()) << "checkpoint request ignored";
  // Let at least one more step finish, so the stop makes a second checkpoint.
  const size_t steps_at_first = StepLines(dir + "/out").size();
  for (int i = 0; i < 5000 && StepLines(dir + "/out").size() <= steps_at_first + 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::string stop = "{\"cmd\": \"stop\", \"deadline_s\": 30, \"reason\": \"slot end\"}\n";
  ASSERT_EQ(write(control, stop.data(), stop.size()), static_cast<ssize_t>(stop.size()));
  EXPECT_EQ(WaitExit(pid), kExitPreempted) << Slurp(dir + "/stderr.txt");
  close(control);
  auto all = ListCheckpoints(dir + "/out/checkpoints");
  ASSERT_EQ(all.size(), 2u);
  auto last = ReadCheckpoint(all[0].dir);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->state.reason, "slot end");
  EXPECT_EQ(last->state.step, StepLines(dir + "/out").back()["step"].get<int64_t>());
}

TEST(CheckpointResumeTest, FullFineTuneCheckpointHoldsTheWeightsAndResumesExactly) {
  auto spec = LoadJobSpec(std::string(FT_SOURCE_DIR) + "/tests/golden/llama_full/job.yaml");
  ASSERT_TRUE(spec.ok());
  spec->output.dir = FreshDir("full") + "/out";
  auto a = Trainer::Create(*spec);
  ASSERT_TRUE(a.ok());
  std::vector<double> want;
  for (int s = 0; s < 3; ++s) {
    StepMetrics m;
    ASSERT_TRUE((*a)->Step(&m).ok());
    want.push_back(m.loss);
  }
  auto b = Trainer::Create(*spec);
  StepMetrics m;
  ASSERT_TRUE((*b)->Step(&m).ok());
  const std::string root = spec->output.dir + "/checkpoints";
  ASSERT_TRUE(WriteCheckpoint(root, (*b)->Capture("test")).ok());
  auto saved = ReadCheckpoint(root + "/" + CheckpointName(1));
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_FALSE(saved->model_config_json.empty()) << "a full fine-tune stores config.json";
  EXPECT_NE(std::find_if(saved->model.begin(), saved->model.end(),
                         [](const HostTensor& t) { return t.name == "model.embed_tokens.weight"; }),
            saved->model.end())
      << "and every weight";
  auto c = Trainer::Create(*spec);
  ASSERT_TRUE((*c)->Restore(*saved, root).ok());
  std::vector<double> got = {m.loss};
  for (int s = 1; s < 3; ++s) {
    ASSERT_TRUE((*c)->Step(&m).ok());
    got.push_back(m.loss);
  }
  EXPECT_EQ(got, want);
  const auto pa = (*a)->model().TrainableParams(), pc = (*c)->model().TrainableParams();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ((*a)->model().Download(pa[i].data, pa[i].numel),
              (*c)->model().Download(pc[i].data, pc[i].numel))
        << pa[i].name;
  }
}

}  // namespace
}  // namespace ft
