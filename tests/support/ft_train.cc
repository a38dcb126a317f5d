#include "tests/support/ft_train.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/file_util.h"
#include "engine/io/hf_model.h"
#include "engine/model/model.h"

namespace ft::testing_support {

namespace fs = std::filesystem;

namespace {
std::string TempPath(const std::string& name) {
  return (fs::path(testing::TempDir()) / (std::string(program_invocation_short_name) + "-" + name))
      .lexically_normal()
      .string();
}

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

std::string FreshDir(const std::string& name) {
  std::string d = TempPath(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

pid_t Spawn(const std::string& dir, const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open((dir + "/stderr.txt").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 2);
    std::vector<char*> argv = {const_cast<char*>(FT_TRAIN_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(FT_TRAIN_BIN, argv.data());
    _exit(127);
  }
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int RunToEnd(const std::string& dir, const std::string& job) { return WaitExit(Spawn(dir, {"run", job})); }

std::string Slurp(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : std::string();
}

std::vector<nlohmann::json> StepLines(const std::string& out) { return Lines(out, false, ""); }

std::vector<nlohmann::json> EventLines(const std::string& out, const std::string& event) {
  return Lines(out, true, event);
}

}  // namespace ft::testing_support
