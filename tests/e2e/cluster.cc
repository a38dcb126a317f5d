#include "tests/e2e/cluster.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "engine/io/hf_model.h"

namespace ft::e2e {

namespace fs = std::filesystem;
namespace pb = ftune::v1;

Cluster::Cluster(const std::string& name, int64_t lease_ms)
    : Cluster(name, ClusterOptions{lease_ms, {}, "", "", ""}) {}

Cluster::Cluster(const std::string& name, ClusterOptions options) : options_(std::move(options)) {
  dir_ = TempPath(name);
  fs::remove_all(dir_);
  fs::create_directories(dir_ + "/job");
  StartDaemon();
}

Cluster::~Cluster() {
  for (auto& [id, w] : workers_) {
    w.Signal(SIGKILL);
    w.Wait();
  }
  daemon_.Signal(SIGKILL);
  daemon_.Wait();
  // ft-train children run in their own process groups: make sure none outlives the test.
  std::system(("pkill -9 -f '" + dir_ + "[/]' >/dev/null 2>&1").c_str());
}

void Cluster::StartDaemon() {
  const std::string log = dir_ + "/ftd.log";
  const size_t before = Slurp(log).size();
  const std::string listen = port_ ? "127.0.0.1:" + std::to_string(port_) : "127.0.0.1:0";
  std::vector<std::string> argv = {FTD_BIN,
                                   "--listen",
                                   listen,
                                   "--data-dir",
                                   data_dir(),
                                   "--lease-ms",
                                   std::to_string(options_.lease_ms),
                                   "--heartbeat-ms",
                                   "300",
                                   "--tick-ms",
                                   "100",
                                   "--requeue-backoff-ms",
                                   "200",
                                   "--min-slot-ms",
                                   "10000",
                                   "--http",
                                   "127.0.0.1:0"};  // never a fixed port: test binaries run side by side
  if (!options_.client_token.empty()) argv.insert(argv.end(), {"--client-token", options_.client_token});
  if (!options_.worker_token.empty()) argv.insert(argv.end(), {"--worker-token", options_.worker_token});
  argv.insert(argv.end(), options_.daemon_args.begin(), options_.daemon_args.end());
  if (!options_.daemon_wrapper.empty()) {
    fs::create_directories(data_dir());
    std::vector<std::string> wrapped = options_.daemon_wrapper;
    for (std::string& arg : wrapped) {
      if (size_t at = arg.find("{data_dir}"); at != std::string::npos) arg.replace(at, 10, data_dir());
    }
    argv.insert(argv.begin(), wrapped.begin(), wrapped.end());
  }
  daemon_ = Spawn(argv, {.log = log});
  std::regex re("ftd: listening on 127\\.0\\.0\\.1:([0-9]+)");
  std::regex http_re("ftd: dashboard at (http://127\\.0\\.0\\.1:[0-9]+/)");
  for (int i = 0; i < 800; ++i) {  // 20 s: a loaded 2-core CI machine starts it slowly
    std::smatch m;
    const std::string text = Slurp(log).substr(before);
    // Serving once both are up (ftd prints the gRPC line first, then starts HTTP).
    if (std::regex_search(text, m, re) && text.find("ftd: dashboard at ") != std::string::npos) {
      port_ = std::stoi(m[1]);
      address_ = "127.0.0.1:" + std::to_string(port_);
      if (std::regex_search(text, m, http_re)) http_url_ = m[1];
      ClientOptions client{address_, options_.client_token, 10'000, options_.tls_ca, nullptr};
      auto resolved = ResolveClientOptions(client);
      if (!resolved.ok()) throw std::runtime_error(resolved.status().ToString());
      client_ = std::make_unique<JobsClient>(*resolved);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  throw std::runtime_error("ftd did not start: " + Slurp(log));
}

Proc& Cluster::StartWorker(const std::string& id, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {WORKER_BIN,   "--daemon",   address_,     "--id",           id,
                                   "--ft-train", FT_TRAIN_BIN, "--work-dir", dir_ + "/w-" + id};
  if (std::find(extra.begin(), extra.end(), "--cpu-memory") == extra.end()) {
    argv.insert(argv.end(), {"--cpu-memory", "4GiB"});  // a known size, whatever the host has
  }
  if (!options_.worker_token.empty()) argv.insert(argv.end(), {"--token", options_.worker_token});
  argv.insert(argv.end(), extra.begin(), extra.end());
  workers_[id] = Spawn(argv, {.log = dir_ + "/worker-" + id + ".log"});
  return workers_[id];
}

void Cluster::SignalTrainers(const std::string& id, int sig) {
  std::system(
      ("pkill -" + std::to_string(sig) + " -f '" + dir_ + "[/]w-" + id + "/' >/dev/null 2>&1").c_str());
}

void Cluster::KillNode(const std::string& id) {
  worker(id).Signal(SIGKILL);
  SignalTrainers(id, SIGKILL);
  worker(id).Wait();
  const std::string pgrep = "pgrep -f '" + dir_ + "[/]w-" + id + "/' >/dev/null";
  for (int i = 0; i < 200 && std::system(pgrep.c_str()) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string Cluster::WriteJob(const std::string& name, int64_t steps, int64_t every_steps,
                              const std::string& extra, double dropout, int64_t keep) {
  const std::string job = dir_ + "/job";
  if (!fs::exists(job + "/model/config.json")) {
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, 5);
    if (!SaveHfModel(job + "/model", model, DType::kF32).ok()) throw std::runtime_error("make model");
    fs::copy_file(std::string(FT_SOURCE_DIR) + "/examples/tiny-lora/data.jsonl", job + "/data.jsonl");
  }
  std::ofstream(job + "/" + name + ".yaml")
      << "name: " << name << "\nmodel: {path: model, dtype: fp32}\nadapter: {type: lora, r: 8, alpha: 16"
      << (dropout > 0 ? ", dropout: " + std::to_string(dropout) : std::string()) << "}\n"
      << "data: {train: data.jsonl, format: tokens, seq_len: 64, packing: false, shuffle: true}\n"
      << "train: {max_steps: " << steps
      << ", global_batch_size: 8, micro_batch_size: 2, lr: 1.0e-2, warmup_steps: 3}\n"
      << "checkpoint: {every_steps: " << every_steps << ", every_minutes: 0, keep: " << keep << "}\n"
      << "output: {dir: out-" << name << "}\n"
      << extra;
  return job + "/" + name + ".yaml";
}

std::string Cluster::CopyJob(const std::string& job_yaml, const std::string& name) {
  std::string text = Slurp(job_yaml);
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("^name: (\\S+)\n")))
    throw std::runtime_error("no name: " + job_yaml);
  const std::string old = m[1].str();
  for (const auto& [from, to] : {std::pair{"name: " + old + "\n", "name: " + name + "\n"},
                                 std::pair{"{dir: out-" + old + "}", "{dir: out-" + name + "}"}}) {
    const size_t at = text.find(from);
    if (at == std::string::npos) throw std::runtime_error("no '" + from + "' in " + job_yaml);
    text.replace(at, from.size(), to);
  }
  const std::string copy = fs::path(job_yaml).parent_path().string() + "/" + name + ".yaml";
  std::ofstream(copy) << text;
  return copy;
}

std::pair<Proc, std::string> Cluster::StartReference(const std::string& job_yaml) {
  std::string text = Slurp(job_yaml);
  const std::string base = job_yaml.substr(0, job_yaml.size() - 5);
  const std::string ref = base + "-reference.yaml";
  text = std::regex_replace(text, std::regex("output: \\{dir: ([^}]*)\\}"), "output: {dir: $1-reference}");
  std::ofstream(ref) << text;
  std::smatch m;
  std::regex_search(text, m, std::regex("output: \\{dir: ([^}]*)\\}"));
  return {Spawn({FT_TRAIN_BIN, "run", ref}, {.log = base + "-reference.log"}), dir_ + "/job/" + m[1].str()};
}

std::string Cluster::RunReference(const std::string& job_yaml) {
  auto [p, out] = StartReference(job_yaml);
  if (p.Wait() != 0) throw std::runtime_error("reference run failed: " + Slurp(p.log));
  return out;
}

StatusOr<pb::SubmitReply> Cluster::TrySubmit(const std::string& job_yaml) {
  pb::SubmitRequest req;
  req.set_spec_yaml(Slurp(job_yaml));
  req.set_spec_dir(fs::path(job_yaml).parent_path().string());
  return client_->Submit(req);
}

std::string Cluster::Submit(const std::string& job_yaml) {
  auto r = TrySubmit(job_yaml);
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  return r->job().id();
}

pb::Job Cluster::WaitFor(const std::string& id, const std::function<bool(const pb::Job&)>& pred,
                         int64_t timeout_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  pb::Job last;
  while (std::chrono::steady_clock::now() < end) {
    auto j = client_->Get(id);
    if (j.ok()) {
      last = *j;
      if (pred(last)) return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return last;
}

}  // namespace ft::e2e
