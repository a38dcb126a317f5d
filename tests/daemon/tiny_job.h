// The daemon tests' smallest job: a job directory DIR/job with a random
// tiny-llama model (fp32, seed 1) and a one-line token data file, and a submit
// of a LoRA job over it named NAME whose output.dir is out-NAME (one dir per
// job: ftd refuses two jobs in one output.dir).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/daemon.h"
#include "engine/io/hf_model.h"

namespace ft::testing_support {

// Writes DIR/job/model and DIR/job/data.jsonl; a failed model write fails the test.
inline void WriteTinyJobDir(const std::string& dir) {
  std::filesystem::create_directories(dir + "/job");
  Model model(*PresetModelConfig("tiny-llama"), {});
  RandomInitModel(&model, 1);
  ASSERT_TRUE(SaveHfModel(dir + "/job/model", model, DType::kF32).ok());
  std::ofstream(dir + "/job/data.jsonl") << "{\"input_ids\": [1, 2, 3]}\n";
}

// Submits the tiny job NAME from DIR/job; its id, or "" (and a test failure) when refused.
inline std::string SubmitTinyJob(Daemon& daemon, const std::string& dir, const std::string& name) {
  ftune::v1::SubmitRequest req;
  req.set_spec_yaml("name: " + name +
                    "\nmodel: {path: model, dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n"
                    "data: {train: data.jsonl, format: tokens, seq_len: 64}\n"
                    "train: {max_steps: 10, global_batch_size: 4}\noutput: {dir: out-" +
                    name + "}\n");
  req.set_spec_dir(dir + "/job");
  auto r = daemon.Submit(req);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->job().id() : "";
}

}  // namespace ft::testing_support
