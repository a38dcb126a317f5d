#include "tests/fuzz/daemon_fixture.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/io/hf_model.h"
#include "engine/model/model.h"
#include "tests/fuzz/fuzz.h"

namespace ft::fuzz {

namespace fs = std::filesystem;

namespace {
[[noreturn]] void SetupFailed(const std::string& what) {
  std::fprintf(stderr, "fuzz fixture: %s\n", what.c_str());
  std::abort();
}

// A tiny random model and one line of data, made once per process.
const std::string& JobDir() {
  static const std::string dir = [] {
    const std::string d = fs::path(ScratchFile("job.keep", "")).parent_path().string() + "/job";
    fs::create_directories(d);
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, 1);
    if (Status s = SaveHfModel(d + "/model", model, DType::kF32); !s.ok()) SetupFailed(s.ToString());
    std::ofstream(d + "/data.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";
    return d;
  }();
  return dir;
}
}  // namespace

namespace {
// A daemon on `db` (opened as it is).
std::unique_ptr<DaemonFixture> OpenDaemon(const std::string& db, const std::string& name) {
  auto f = std::make_unique<DaemonFixture>();
  auto store = Store::Open(db);
  if (!store.ok()) SetupFailed(store.status().ToString());
  DaemonOptions o;
  o.data_dir = JobDir() + "/ftd-" + name;
  o.lease_ms = 3000;
  f->daemon = std::make_unique<Daemon>(std::move(*store), &f->clock, o);
  return f;
}

void RemoveDatabase(const std::string& db) {
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(db + suffix);
}

// A database holding the submitted job, made once per process (a submit
// loads and plans the model: copying the file is 20x faster than redoing it).
const std::pair<std::string, std::string>& Template() {
  static const std::pair<std::string, std::string> t = [] {
    const std::string db = ScratchFile("template.sqlite", "");
    RemoveDatabase(db);
    auto f = OpenDaemon(db, "template");
    ftune::v1::SubmitRequest req;
    req.set_spec_yaml(
        "name: fuzz\nmodel: {path: model, dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n"
        "data: {train: data.jsonl, format: tokens, seq_len: 64}\n"
        "train: {max_steps: 10, global_batch_size: 4}\ncheckpoint: {every_steps: 2}\noutput: {dir: out}\n");
    req.set_spec_dir(JobDir());
    auto reply = f->daemon->Submit(req);
    if (!reply.ok()) SetupFailed(reply.status().ToString());
    const std::string id = reply->job().id();
    f.reset();  // closes the database: its WAL is folded into the file
    return std::make_pair(db, id);
  }();
  return t;
}
}  // namespace

std::unique_ptr<DaemonFixture> MakeDaemon(const std::string& name) {
  const auto& [template_db, job_id] = Template();
  const std::string db = ScratchFile(name + ".sqlite", "");
  RemoveDatabase(db);
  fs::copy_file(template_db, db, fs::copy_options::overwrite_existing);
  auto f = OpenDaemon(db, name);
  f->job_id = job_id;
  if (!f->daemon->GetJob(job_id).ok()) SetupFailed("the template database lost its job");
  return f;
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

}  // namespace ft::fuzz
