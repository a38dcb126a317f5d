// Generation (engine/generate, Model::Decode): the KV-cache path against a
// full recomputation, greedy decoding against the training-time forward,
// seeded sampling, stop strings, EOS and chat prompts, on a tiny random
// model with the small byte-level BPE tokenizer of tests/fuzz/data.
#include "engine/generate/generator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"
#include "engine/model/model.h"
#include "engine/model/rng.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 384;  // the tokenizer's 379 ids, rounded up

ModelConfig TinyConfig() {
  ModelConfig c = *PresetModelConfig("tiny-llama");
  c.vocab_size = kVocab;
  return c;
}

// LoRA on every module with random A and B (B = 0 would hide the adapter), no dropout.
void AddRandomLora(Model* model) {
  LoraSpec lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  ASSERT_TRUE(model->EnableLora(lora).ok());
  for (TrainableParam& p : model->TrainableParams()) {
    std::vector<float> v(p.numel);
    for (int64_t i = 0; i < p.numel; ++i) v[i] = 0.3f * (UniformFloat(HashKeys(5, i, p.numel)) - 0.5f);
    model->Upload(p.data, v.data(), p.numel);
  }
}

MicroBatch Sequence(const std::vector<int32_t>& ids) {
  MicroBatch mb;
  mb.batch = 1;
  mb.seq = static_cast<int64_t>(ids.size());
  mb.ids = ids;
  mb.targets.assign(ids.size(), -100);
  for (size_t i = 0; i < ids.size(); ++i) mb.positions.push_back(static_cast<int32_t>(i));
  return mb;
}

// A base model directory (random weights, the test tokenizer) and an adapter directory beside it.
struct ModelDirs {
  std::string base, adapter;
};

const ModelDirs& Dirs() {
  static const ModelDirs dirs = [] {
    const fs::path root = fs::path(testing::TempDir()) / "generator-test";
    fs::remove_all(root);
    ModelDirs d{(root / "base").string(), (root / "adapter").string()};
    Model model(TinyConfig(), {});
    RandomInitModel(&model, 11);
    EXPECT_TRUE(SaveHfModel(d.base, model, DType::kF32).ok());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(fs::path(FT_SOURCE_DIR) / "tests/fuzz/data" / f, fs::path(d.base) / f);
    }
    AddRandomLora(&model);
    EXPECT_TRUE(SavePeftAdapter(d.adapter, model, d.base).ok());
    return d;
  }();
  return dirs;
}

GenerationModel Load(bool adapter = true) {
  auto g = LoadGenerationModel({.model_dir = Dirs().base, .adapter_dir = adapter ? Dirs().adapter : ""});
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::move(*g);
}

float MaxAbsDiff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Acceptance 1: the KV-cache path gives the full recomputation's logits at every
// position, whether the prefix goes in at once or token by token.
TEST(GeneratorTest, KvCacheLogitsEqualAFullForwardAtEveryPosition) {
  for (const bool checkpointing : {false, true}) {
    ModelOptions o;
    o.activation_checkpointing = checkpointing;
    Model model(TinyConfig(), o);
    RandomInitModel(&model, 3);
    AddRandomLora(&model);
    std::vector<int32_t> ids;
    for (int i = 0; i < 70; ++i)
      ids.push_back(static_cast<int32_t>(HashKeys(9, i) % kVocab));  // > one key tile
    std::vector<float> full;
    model.Forward(Sequence(ids), &full);
    const int64_t V = kVocab;
    KvCache cache(model, static_cast<int64_t>(ids.size()));
    const size_t prefix = 5;
    auto logits = model.Decode({ids.begin(), ids.begin() + prefix}, &cache);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    float worst = MaxAbsDiff(logits->data(), &full[(prefix - 1) * V], V);
    for (size_t p = prefix; p < ids.size(); ++p) {
      logits = model.Decode({ids[p]}, &cache);
      ASSERT_TRUE(logits.ok());
      worst = std::max(worst, MaxAbsDiff(logits->data(), &full[p * V], V));
    }
    EXPECT_EQ(cache.length(), static_cast<int64_t>(ids.size()));
    EXPECT_LE(worst, 1e-5f) << "checkpointing " << checkpointing;
    std::printf("KV cache vs full forward (checkpointing %d): max |logit diff| %.2e\n", checkpointing, worst);
    EXPECT_TRUE(model.Decode({1}, &cache).status().IsInvalidArgument()) << "past the cache's capacity";
  }
}

// Decoding far past a sliding window (every layer's: Mistral; the sliding layers': Gemma 2 and 3,
// with Gemma 2's soft-capping) gives, token by token through the KV cache, the logits of one
// full forward over the same ids; and the window does change them (a model without it differs).
TEST(GeneratorTest, DecodingPastTheSlidingWindowMatchesTheFullForward) {
  ModelConfig mistral = *PresetModelConfig("tiny-llama");
  mistral.model_type = "mistral";
  mistral.sliding_window = 8;
  for (const ModelConfig& c : {mistral, *PresetModelConfig("tiny-gemma2"), *PresetModelConfig("tiny-gemma3"),
                               *PresetModelConfig("tiny-phi3")}) {
    SCOPED_TRACE(c.model_type);
    ASSERT_GT(c.sliding_window, 0);
    Model model(c, {});
    RandomInitModel(&model, 3);
    std::vector<int32_t> ids;
    for (int i = 0; i < 3 * c.sliding_window + 5; ++i)
      ids.push_back(static_cast<int32_t>(HashKeys(11, i) % c.vocab_size));
    std::vector<float> full;
    model.Forward(Sequence(ids), &full);
    const int64_t V = c.vocab_size;
    KvCache cache(model, static_cast<int64_t>(ids.size()));
    float worst = 0;
    for (size_t p = 0; p < ids.size(); ++p) {
      auto logits = model.Decode({ids[p]}, &cache);
      ASSERT_TRUE(logits.ok()) << logits.status().ToString();
      worst = std::max(worst, MaxAbsDiff(logits->data(), &full[p * V], V));
    }
    EXPECT_LE(worst, 1e-5f);
    ModelConfig unwindowed = c;
    unwindowed.sliding_window = 0;
    Model plain(unwindowed, {});
    RandomInitModel(&plain, 3);
    std::vector<float> plain_full;
    plain.Forward(Sequence(ids), &plain_full);
    const size_t last = (ids.size() - 1) * V;
    EXPECT_GT(MaxAbsDiff(&plain_full[last], &full[last], V), 1e-4f) << "the window changes the last logits";
  }
}

// Acceptance 1: greedy decoding picks, at every position, the argmax of the
// training-time forward over the same tokens.
TEST(GeneratorTest, GreedyIsTheArgmaxOfTheTrainingForwardAtEveryPosition) {
  GenerationModel g = Load();
  auto prompt = PromptIds(*g.tokenizer, "the quick brown fox", {});
  ASSERT_TRUE(prompt.ok());
  auto out = Generate(*g.model, *g.tokenizer, *prompt, /*eos_ids=*/{}, {.max_new_tokens = 24});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->ids.size(), 24u);
  EXPECT_EQ(out->finish, "length");
  EXPECT_EQ(out->text, g.tokenizer->Decode(out->ids, true));
  std::vector<int32_t> all = *prompt;
  all.insert(all.end(), out->ids.begin(), out->ids.end());
  std::vector<float> logits;
  g.model->Forward(Sequence(all), &logits);
  for (size_t i = 0; i < out->ids.size(); ++i) {
    const size_t pos = prompt->size() - 1 + i;
    const std::vector<float> row(logits.begin() + pos * kVocab, logits.begin() + (pos + 1) * kVocab);
    EXPECT_EQ(out->ids[i], Argmax(row)) << "new token " << i;
  }
}

// The adapter changes what the model says (it is loaded, not ignored).
TEST(GeneratorTest, TheAdapterIsApplied) {
  GenerationModel with = Load(true), without = Load(false);
  auto prompt = PromptIds(*with.tokenizer, "hello world", {});
  ASSERT_TRUE(prompt.ok());
  auto a = Generate(*with.model, *with.tokenizer, *prompt, {}, {.max_new_tokens = 12});
  auto b = Generate(*without.model, *without.tokenizer, *prompt, {}, {.max_new_tokens = 12});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->ids, b->ids);
}

TEST(GeneratorTest, SamplingWithASeedIsReproducible) {
  GenerationModel g = Load();
  auto prompt = PromptIds(*g.tokenizer, "the model", {});
  ASSERT_TRUE(prompt.ok());
  auto run = [&](uint64_t seed, double top_p) {
    GenerateOptions o{.max_new_tokens = 16,
                      .sampling = {.temperature = 1.0, .top_k = 50, .top_p = top_p, .seed = seed}};
    auto out = Generate(*g.model, *g.tokenizer, *prompt, {}, o);
    EXPECT_TRUE(out.ok());
    return out->ids;
  };
  EXPECT_EQ(run(7, 0.9), run(7, 0.9));
  EXPECT_NE(run(7, 0.9), run(8, 0.9));
  EXPECT_NE(run(7, 1.0), run(7, 0.05)) << "top_p 0.05 keeps only the likeliest token";
  GenerateOptions bad{.sampling = {.temperature = -1}};
  EXPECT_TRUE(Generate(*g.model, *g.tokenizer, *prompt, {}, bad).status().IsInvalidArgument());
}

TEST(GeneratorTest, TopPCutsToTheNucleusAndTopKToTheLikeliest) {
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f, 4.9f};  // p ≈ [.003, .51, .008, .47]
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Sampler nucleus({.temperature = 1, .top_p = 0.5, .seed = seed});
    EXPECT_EQ(nucleus.Next(logits), 1) << "top_p 0.5: only the first token reaches it";
    Sampler top2({.temperature = 1, .top_k = 2, .seed = seed});
    const int32_t t = top2.Next(logits);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  EXPECT_EQ(Argmax({1.0f, 3.0f, 3.0f}), 1) << "ties go to the lowest id";
}

// Acceptance 1: stop strings and EOS end the output.
TEST(GeneratorTest, StopStringsAndEosEndTheOutput) {
  GenerationModel g = Load();
  auto prompt = PromptIds(*g.tokenizer, "fine-tuning the", {});
  ASSERT_TRUE(prompt.ok());
  auto free_run = Generate(*g.model, *g.tokenizer, *prompt, {}, {.max_new_tokens = 24});
  ASSERT_TRUE(free_run.ok());
  const std::vector<int32_t>& ids = free_run->ids;

  // EOS: the first token that did not occur before it, made an EOS id, ends the output there.
  size_t k = 1;
  while (k < ids.size() && std::find(ids.begin(), ids.begin() + k, ids[k]) != ids.begin() + k) ++k;
  ASSERT_LT(k, ids.size());
  auto eos = Generate(*g.model, *g.tokenizer, *prompt, {ids[k]}, {.max_new_tokens = 24});
  ASSERT_TRUE(eos.ok());
  EXPECT_EQ(eos->finish, "eos");
  EXPECT_EQ(eos->ids, std::vector<int32_t>(ids.begin(), ids.begin() + k + 1)) << "the EOS token is the last";
  EXPECT_EQ(eos->text, g.tokenizer->Decode({ids.begin(), ids.begin() + k}, true)) << "and has no text";

  // A stop string: text from the middle of the free run's; the output ends before it, and
  // what was streamed is exactly the output.
  const std::string& text = free_run->text;
  ASSERT_GE(text.size(), 8u) << text;
  const std::string stop = text.substr(text.size() / 2, 3);
  std::string streamed;
  auto stopped = Generate(*g.model, *g.tokenizer, *prompt, {}, {.max_new_tokens = 24, .stop = {"", stop}},
                          [&](std::string_view piece) { streamed += piece; });
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish, "stop");
  EXPECT_EQ(stopped->text, text.substr(0, text.find(stop)));
  EXPECT_EQ(streamed, stopped->text);
  EXPECT_LT(stopped->ids.size(), ids.size());

  // Streaming without a stop string gives the whole text too.
  streamed.clear();
  auto again = Generate(*g.model, *g.tokenizer, *prompt, {}, {.max_new_tokens = 24},
                        [&](std::string_view piece) { streamed += piece; });
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(streamed, text);
}

TEST(GeneratorTest, ChatPromptsGoThroughTheChatTemplate) {
  GenerationModel g = Load();
  auto ids = PromptIds(*g.tokenizer, "hi there", {.chat = true, .system = "be brief"});
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(g.tokenizer->Decode(*ids, false),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi "
            "there<|im_end|>\n<|im_start|>assistant\n");
  // The EOS ids: config.json's eos_token_id and the tokenizer's eos_token.
  EXPECT_THAT(g.eos_ids, ::testing::ElementsAre(2, *g.tokenizer->TokenToId("<|im_end|>")));
}

TEST(GeneratorTest, BadInputIsNamed) {
  GenerationModel g = Load();
  EXPECT_TRUE(Generate(*g.model, *g.tokenizer, {}, {}, {}).status().IsInvalidArgument());
  const Status long_prompt =
      Generate(*g.model, *g.tokenizer, {1, 2, 3}, {}, {.max_new_tokens = 600}).status();
  EXPECT_THAT(long_prompt.message(), ::testing::HasSubstr("max_position_embeddings 512"));
  auto missing = LoadGenerationModel({.model_dir = Dirs().base, .adapter_dir = "/nonexistent-adapter"});
  EXPECT_THAT(missing.status().ToString(), ::testing::HasSubstr("/nonexistent-adapter"));
}

}  // namespace
}  // namespace ft
