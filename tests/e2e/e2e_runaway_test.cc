// Runaway work, end to end (issue #28): a cancelled job whose trainer is stuck
// outside its step loop, where it never reads the stop, is gone within the
// stated deadline (ftd's cancel gives it 10 s to checkpoint and stop, and
// ft-worker SIGKILLs its process group 5 s after that: 15 s), checked on the
// trainer's pid, and the same worker then runs the next job to success.
// One scenario per shard: a data file swapped for a FIFO nobody writes, and a
// chat template that does enormous total work (each render under the Jinja
// work budget, yet a tenth of a second or more per example over 1,000): since
// issue #41 the template interpreter polls the trainer's stop, so that trainer
// stops by itself within the cancel's checkpoint deadline, before any SIGKILL
// (ft-worker's kill after the deadline: worker_ft_worker_test).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "engine/io/hf_model.h"
#include "tests/e2e/cluster.h"
#include "tests/worker/process_gone.h"

namespace ft::e2e {
namespace {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using Clock = std::chrono::steady_clock;
using worker::testing_util::GoneWithin;

// ftd's cancel stop deadline (daemon.cc, Daemon::Cancel) + ft-worker's kill grace (worker/worker.h).
constexpr double kCancelDeadlineS = 10;
constexpr double kStatedDeadlineS = kCancelDeadlineS + 5;
// The worker's exit polling (200 ms), its report and a loaded 2-core machine.
constexpr double kSlackS = 3;

// The ft-train processes that run an attempt of job `id` on worker `worker`
// (their command line names the job file the worker wrote for it).
std::vector<pid_t> TrainerPids(const Cluster& c, const std::string& worker, const std::string& id) {
  const std::string job_file = c.dir() + "/w-" + worker + "/" + id + "-e";
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = Slurp(e.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.rfind(FT_TRAIN_BIN, 0) == 0 && cmdline.find(job_file) != std::string::npos) {
      pids.push_back(std::stoi(name));
    }
  }
  return pids;
}

// Waits (bounded) until an ft-train of job `id` runs on `worker`; its pids.
std::vector<pid_t> WaitForTrainer(const Cluster& c, const std::string& worker, const std::string& id) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  std::vector<pid_t> pids;
  while ((pids = TrainerPids(c, worker, id)).empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pids;
}

// Cancels `id` (unless it has already ended) and checks that each of `pids`
// is gone within the stated deadline; the seconds the last one took.
double CancelAndTimeTheTrainersEnd(Cluster& c, const std::string& id, const std::vector<pid_t>& pids) {
  const auto cancelled = Clock::now();
  auto reply = c.client().Cancel(id);
  EXPECT_TRUE(reply.ok() || reply.status().message().find("already ended") != std::string::npos)
      << reply.status().ToString();
  const auto limit = std::chrono::milliseconds(static_cast<int64_t>((kStatedDeadlineS + kSlackS) * 1000));
  for (pid_t pid : pids)
    EXPECT_TRUE(GoneWithin(pid, limit)) << "trainer pid " << pid << " outlived the deadline";
  const double took = std::chrono::duration<double>(Clock::now() - cancelled).count();
  std::printf("trainer gone %.2f s after the cancel (stated deadline %.0f s)\n", took, kStatedDeadlineS);
  return took;
}

// After the cancel: the job ended, and the same worker runs a next small job to success.
void ExpectTheWorkerRunsTheNextJob(Cluster& c, const std::string& id, const std::string& worker) {
  const pb::Job j = c.WaitFor(id, Done, 30'000);
  EXPECT_TRUE(Done(j)) << pb::JobState_Name(j.state()) << ": " << j.reason();
  const std::string next = c.Submit(c.WriteJob("next", 3, 100));
  const pb::Job n = c.WaitFor(next, Done, 90'000);
  ASSERT_EQ(n.state(), pb::SUCCEEDED) << n.reason() << "\n" << Slurp(c.dir() + "/worker-" + worker + ".log");
  ASSERT_GE(n.attempts_size(), 1);
  EXPECT_EQ(n.attempts(0).worker_id(), worker);
}

// A job's data file, a regular file when submitted (ftd checks that), is
// swapped for a FIFO nobody writes before the worker starts it. The trainer
// must neither hang on it past the cancel's deadline nor keep the worker busy
// (whether it refuses the FIFO at once or blocks in it until killed).
TEST(E2ERunaway, CancelledTrainerWhoseDataFileIsAFifoIsGoneByTheDeadlineAndTheWorkerRunsTheNextJob) {
  Cluster c("runaway-fifo");
  std::string yaml = Slurp(c.WriteJob("fifo", 20, 10));
  yaml = std::regex_replace(yaml, std::regex("train: data\\.jsonl"), "train: fifo.jsonl");
  const std::string job = c.dir() + "/job/fifo.yaml", fifo = c.dir() + "/job/fifo.jsonl";
  std::ofstream(job) << yaml;
  fs::copy_file(c.dir() + "/job/data.jsonl", fifo);
  const std::string id = c.Submit(job);
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  c.StartWorker("w");
  const pb::Job j = c.WaitFor(
      id, [](const pb::Job& j) { return j.attempts_size() > 0; }, 60'000);
  ASSERT_GT(j.attempts_size(), 0) << j.reason();
  // The attempt exists before its trainer does: cancel the trainer once it runs (stuck on the fifo).
  const std::vector<pid_t> pids = WaitForTrainer(c, "w", id);
  ASSERT_FALSE(pids.empty()) << "no trainer started for " << id;
  const double took = CancelAndTimeTheTrainersEnd(c, id, pids);
  EXPECT_LE(took, kStatedDeadlineS + kSlackS);
  EXPECT_TRUE(TrainerPids(c, "w", id).empty()) << "a trainer of the cancelled job still runs";
  ExpectTheWorkerRunsTheNextJob(c, id, "w");
}

// A chat job whose template does enormous total work: each render copies a
// 1 MB string 300 times (under the render's work budget, so it renders), and
// the data has 1,000 examples, so indexing takes many minutes, during which
// the trainer never reads its control channel; the renders poll its stop flag.
TEST(E2ERunaway,
     CancelledTrainerInAChatTemplateDoingEnormousWorkStopsBeforeTheDeadlineAndTheWorkerRunsTheNextJob) {
  Cluster c("runaway-template");
  const std::string dir = c.dir() + "/job/chat";
  fs::create_directories(dir + "/model");
  {
    ModelConfig config = *PresetModelConfig("tiny-llama");
    config.vocab_size = 384;  // the test tokenizer's 379 ids, rounded up
    Model model(config, {});
    RandomInitModel(&model, 5);
    ASSERT_TRUE(SaveHfModel(dir + "/model", model, DType::kF32).ok());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(fs::path(FT_SOURCE_DIR) / "tests/fuzz/data" / f, fs::path(dir) / "model" / f);
    }
  }
  {
    std::ofstream data(dir + "/chat.jsonl");
    for (int i = 0; i < 1000; ++i) {
      data << R"({"messages": [{"role": "user", "content": "hello )" << i
           << R"("}, {"role": "assistant", "content": "hi there"}]})"
           << "\n";
    }
  }
  std::ofstream(dir + "/slow.jinja")
      << "{%- for i in range(300) %}{%- set s = ('x' * 1000000) ~ i %}{%- endfor %}"
         "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
         "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";
  std::ofstream(dir + "/chat.yaml")
      << "name: chat\nmodel: {path: model, dtype: fp32}\nadapter: {type: lora, r: 8, alpha: 16}\n"
      // An absolute template path (ftd would make a relative one absolute too: JobInputPaths).
      << "data: {train: chat.jsonl, format: chat, chat_template: " << dir
      << "/slow.jinja, seq_len: 64, packing: false}\n"
      << "train: {max_steps: 20, global_batch_size: 8, micro_batch_size: 2, lr: 1.0e-2}\n"
      << "checkpoint: {every_steps: 10, every_minutes: 0, keep: 3}\noutput: {dir: out-chat}\n";
  c.StartWorker("w");
  const std::string id = c.Submit(dir + "/chat.yaml");
  const std::vector<pid_t> pids = WaitForTrainer(c, "w", id);
  ASSERT_FALSE(pids.empty()) << c.client().Get(id)->reason() << "\n" << Slurp(c.dir() + "/worker-w.log");
  const double took = CancelAndTimeTheTrainersEnd(c, id, pids);
  EXPECT_LE(took, kCancelDeadlineS + kSlackS);
  const pb::Job j = c.WaitFor(
      id,
      [](const pb::Job& j) {
        return j.attempts_size() > 0 && j.attempts(0).outcome() != pb::ATTEMPT_RUNNING;
      },
      30'000);
  ASSERT_GT(j.attempts_size(), 0);
  EXPECT_EQ(j.state(), pb::CANCELLED);
  EXPECT_THAT(j.attempts(0).reason(), ::testing::HasSubstr("stopped"))
      << "the trainer did not stop inside the template: " << Slurp(c.dir() + "/worker-w.log");
  EXPECT_THAT(j.attempts(0).reason(), ::testing::Not(::testing::HasSubstr("SIGKILL")));
  ExpectTheWorkerRunsTheNextJob(c, id, "w");
}

}  // namespace
}  // namespace ft::e2e
