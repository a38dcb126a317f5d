#include "tests/support/ft_train.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/io/hf_model.h"
#include "engine/model/model.h"
#include "engine/model/rng.h"

namespace ft::testing_support {

namespace fs = std::filesystem;

namespace {
std::vector<nlohmann::json> Lines(const std::string& out, bool events, const std::string& event) {
  std::vector<nlohmann::json> v;
  std::istringstream in(Slurp(out + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || j.contains("event") != events) continue;
    if (events && j.value("event", "") != event) continue;
    v.push_back(j);
  }
  return v;
}
}  // namespace

const std::string& ModelDir() {
  static const std::string dir = [] {
    std::string d = TempPath("model");
    fs::remove_all(d);
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, 11);
    EXPECT_TRUE(SaveHfModel(d, model, DType::kF32).ok());
    return d;
  }();
  return dir;
}

std::string WriteJob(const std::string& dir, const std::string& train_extra, int64_t every_steps,
                     int64_t steps, int64_t keep) {
  fs::create_directories(dir);
  fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", dir + "/data.jsonl",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir + "/job.yaml")
      << "model: {path: " << ModelDir() << ", dtype: fp32}\n"
      << "adapter: {type: lora, r: 8, alpha: 16, dropout: 0.1}\n"
      << "data: {train: data.jsonl, format: tokens, seq_len: 64, packing: false, "
         "shuffle: true}\n"
      << "train:\n  max_steps: " << steps << "\n  global_batch_size: 8\n  lr: 1.0e-2\n  warmup_steps: 3\n"
      << "  weight_decay: 0.01\n"
      << (train_extra.empty() ? "  micro_batch_size: 2\n" : train_extra)
      << "checkpoint: {every_steps: " << every_steps << ", every_minutes: 0, keep: " << keep << "}\n"
      << "output: {dir: out}\n";
  return dir + "/job.yaml";
}

std::string WriteDpoJob(const std::string& dir, const std::string& train_extra, int64_t every_steps,
                        int64_t steps, int64_t keep, const std::string& adapter) {
  const std::string path =
      WriteJob(dir, train_extra + "  objective: dpo\n  dpo: {beta: 0.2}\n", every_steps, steps, keep);
  std::ofstream pairs(dir + "/pairs.jsonl");
  for (int i = 0; i < 40; ++i) {
    auto ids = [&](int salt, int n) {
      std::string out;
      for (int t = 0; t < n; ++t) out += (t ? ", " : "") + std::to_string(HashKeys(salt, i, t) % 250 + 1);
      return "[" + out + "]";
    };
    pairs << "{\"prompt_ids\": " << ids(1, 3 + i % 7) << ", \"chosen_ids\": " << ids(2, 2 + i % 5)
          << ", \"rejected_ids\": " << ids(3, 1 + i % 9) << "}\n";
  }
  pairs.close();
  std::string text = Slurp(path);
  text.replace(text.find("format: tokens"), 14, "format: preference");
  text.replace(text.find("train: data.jsonl"), 17, "train: pairs.jsonl");
  if (!adapter.empty()) {
    const size_t at = text.find("adapter:");
    text.replace(at, text.find('\n', at) - at, adapter);
  }
  std::ofstream(path) << text;
  return path;
}

std::string WriteMixtureJob(const std::string& dir, const std::string& train_extra, int64_t every_steps,
                            int64_t steps, int64_t keep) {
  const std::string path = WriteJob(dir, train_extra, every_steps, steps, keep);
  UseMixture(path);
  return path;
}

void UseMixture(const std::string& path) {
  const std::string dir = fs::path(path).parent_path().string();
  for (int k = 1; k <= 2; ++k) {
    std::ofstream rows(dir + (k == 1 ? "/b.jsonl" : "/c.jsonl"));
    for (int i = 0; i < 40; ++i) {
      std::string ids;
      for (int t = 0; t < 4 + (i * k) % 9; ++t)
        ids += (t ? ", " : "") + std::to_string(HashKeys(k, i, t) % 250 + 1);
      rows << "{\"input_ids\": [" << ids << "]}\n";
    }
  }
  std::string text = Slurp(path);
  text.replace(text.find("train: data.jsonl"), 17,
               "train: [{path: data.jsonl, weight: 0.6}, {path: b.jsonl, weight: 0.3}, "
               "{path: c.jsonl, weight: 0.1}]");
  std::ofstream(path) << text;
}

pid_t Spawn(const std::string& dir, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {FT_TRAIN_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing_support::Spawn(argv, {.log = dir + "/stderr.txt", .stdout_to_log = false}).pid;
}

pid_t SpawnWithControl(const std::string& dir, std::vector<std::string> args, int* control) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return -1;
  }
  std::vector<std::string> argv = {FT_TRAIN_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--control-fd", "3"});
  const pid_t pid =
      testing_support::Spawn(argv, {.log = dir + "/stderr.txt", .stdout_to_log = false, .fds = {{fds[0], 3}}})
          .pid;
  close(fds[0]);
  *control = fds[1];
  return pid;
}

int WaitExit(pid_t pid) { return Proc{pid, ""}.Wait(); }

int RunToEnd(const std::string& dir, const std::string& job) { return WaitExit(Spawn(dir, {"run", job})); }

std::vector<nlohmann::json> StepLines(const std::string& out) { return Lines(out, false, ""); }

std::vector<nlohmann::json> EventLines(const std::string& out, const std::string& event) {
  return Lines(out, true, event);
}

}  // namespace ft::testing_support
