// The family table (engine/model/family.h) through config.json: each family's
// config as its HF model card publishes it (dimensions reduced, every other key
// as published) loads with the family's traits; known families the engine
// cannot train are refused naming model_type and why; unknown ones list the
// supported; every preset's written config.json reads back as the same config.
#include "engine/model/family.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/job/hf_config.h"

namespace ft {
namespace {

using testing::HasSubstr;

struct Published {
  const char* model;  // the model whose config.json this is
  const char* json;   // as published, hidden/intermediate/layers/vocab reduced
  bool qk_norm, attention_bias;
  int64_t head_dim, sliding_window;
  bool tied;
};

// Qwen/Qwen3-0.6B (transformers 4.51), Qwen/Qwen2.5-0.5B, mistralai/Mistral-7B-v0.1,
// meta-llama/Llama-3.2-1B, google/gemma-3-1b-pt; published values kept except the sizes.
const Published kPublished[] = {
    {"Qwen/Qwen3-0.6B",
     R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
         "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
         "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 384,
         "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
         "num_attention_heads": 16, "num_hidden_layers": 2, "num_key_value_heads": 8,
         "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
         "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
         "use_cache": true, "use_sliding_window": false, "vocab_size": 1024})",
     true, false, 128, 0, true},
    {"Qwen/Qwen2.5-0.5B",
     R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
         "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 112, "initializer_range": 0.02,
         "intermediate_size": 304, "max_position_embeddings": 32768, "max_window_layers": 24,
         "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 2, "num_key_value_heads": 2,
         "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
         "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
         "use_sliding_window": false, "vocab_size": 1024})",
     false, true, 8, 0, true},
    {"mistralai/Mistral-7B-v0.1",
     R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
         "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 448,
         "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
         "num_hidden_layers": 2, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
         "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
         "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 1024})",
     false, false, 4, 4096, false},
    {"meta-llama/Llama-3.2-1B",
     R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
         "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
         "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 512,
         "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
         "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1,
         "pretraining_tp": 1, "rms_norm_eps": 1e-05,
         "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
         "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 1024})",
     false, false, 64, 0, true},
    {"google/gemma-3-1b-pt",
     R"({"architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
         "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
         "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
         "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 384, "max_position_embeddings": 32768,
         "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 7, "num_key_value_heads": 1,
         "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
         "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
         "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 1024})",
     true, false, 256, 512, true},
};

TEST(FamilyTest, EachFamilysPublishedConfigLoadsWithItsTraits) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.model);
    auto c = ParseHfConfig(p.json, std::string(p.model) + "/config.json");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->qk_norm, p.qk_norm);
    EXPECT_EQ(c->attention_bias, p.attention_bias);
    EXPECT_EQ(c->head_dim, p.head_dim);
    EXPECT_EQ(c->sliding_window, p.sliding_window);
    EXPECT_EQ(c->tie_word_embeddings, p.tied);
    EXPECT_EQ(c->gemma, std::string(p.model).find("gemma") != std::string::npos);
    // What ftune writes for it (merged models, make-model) reads back as the same config.
    auto again = ParseHfConfig(HfConfigJson(*c), "written");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*again, *c);
  }
}

// Gemma 3's layer kinds from the older sliding_window_pattern (every sixth layer full) and from
// the newer layer_types; its activation and scales; soft-capping (Gemma 2's) refused by the key.
TEST(FamilyTest, GemmaLayerTypesScalesAndRefusedSoftCapping) {
  const Published& gemma = kPublished[4];
  auto c = ParseHfConfig(gemma.json, "gemma/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sliding_layers, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 1}));
  EXPECT_EQ(c->hidden_act, Activation::kGeluTanh);
  EXPECT_EQ(c->query_pre_attn_scalar, 256);
  EXPECT_EQ(c->rope_local_theta, 10000);
  const auto with_types = [&](const std::string& types) {
    std::string text = gemma.json;
    return text.replace(text.find(R"("sliding_window_pattern": 6)"), 27, R"("layer_types": )" + types);
  };
  auto t = ParseHfConfig(
      with_types(R"(["sliding_attention", "full_attention", "sliding_attention", "full_attention",
                                        "sliding_attention", "full_attention", "sliding_attention"])"),
      "typed.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->sliding_layers, (std::vector<uint8_t>{1, 0, 1, 0, 1, 0, 1}));
  EXPECT_THAT(HfConfigJson(*t), HasSubstr(R"("sliding_window_pattern": 2)"))
      << "older transformers read this";
  EXPECT_THAT(ParseHfConfig(with_types(R"(["sliding_attention"])"), "w.json").status().message(),
              HasSubstr("w.json: 'layer_types' must list num_hidden_layers (7) attention types"));
  EXPECT_THAT(
      ParseHfConfig(with_types(R"(["sliding_attention", "full_attention", "chunked_attention",
                                          "full_attention", "full_attention", "full_attention", "full_attention"])"),
                    "x.json")
          .status()
          .message(),
      HasSubstr("x.json: layer_types[2] 'chunked_attention' is not sliding_attention or full_attention"));
  // An absurd layer count is refused by its bound, not met by allocating per layer first.
  std::string huge = gemma.json;
  huge.replace(huge.find(R"("num_hidden_layers": 7)"), 22, R"("num_hidden_layers": 1000000000000)");
  EXPECT_THAT(ParseHfConfig(huge, "h.json").status().message(),
              HasSubstr("h.json: 'num_hidden_layers' must be an integer in [1, 1024]"));
  std::string capped = gemma.json;
  capped.replace(capped.find(R"("attn_logit_softcapping": null)"), 30, R"("attn_logit_softcapping": 50.0)");
  EXPECT_THAT(ParseHfConfig(capped, "c.json").status().message(),
              HasSubstr("c.json: 'attn_logit_softcapping' (50.0) asks for soft-capping"));
}

TEST(FamilyTest, KnownFamiliesTheEngineCannotTrainAreRefusedSayingWhy) {
  // Qwen/Qwen3-30B-A3B's config (reduced): a mixture of experts.
  auto moe = ParseHfConfig(R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
      "hidden_size": 128, "intermediate_size": 384, "moe_intermediate_size": 64, "num_experts": 128,
      "num_experts_per_tok": 8, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 4,
      "vocab_size": 1024})",
                           "Qwen3-30B-A3B/config.json");
  ASSERT_FALSE(moe.ok());
  EXPECT_THAT(moe.status().message(), HasSubstr("Qwen3-30B-A3B/config.json: model_type 'qwen3_moe'"));
  EXPECT_THAT(moe.status().message(), HasSubstr("mixture of experts"));
  EXPECT_THAT(moe.status().message(), HasSubstr("supported: llama, mistral, qwen2, qwen3, gemma3_text"));
  for (const char* type :
       {"mixtral", "qwen2_moe", "llava", "mllama", "qwen2_vl", "qwen2_5_vl", "deepseek_v3"}) {
    auto refused = FindFamily(type, "c.json");
    EXPECT_FALSE(refused.ok()) << type;
  }
  // Experts or a vision tower on a dense family's model_type are refused by the key.
  auto experts = ParseHfConfig(R"({"model_type": "qwen2", "num_experts": 8, "hidden_size": 64})", "e.json");
  EXPECT_THAT(experts.status().message(),
              HasSubstr("e.json: 'num_experts' (8) makes it a mixture of experts (MoE), which the engine "
                        "does not train (model_type 'qwen2')"));
  auto vision = ParseHfConfig(R"({"model_type": "llama", "vision_config": {"hidden_size": 8}})", "v.json");
  EXPECT_THAT(vision.status().message(),
              HasSubstr(R"(v.json: 'vision_config' ({"hidden_size":8}) makes it a vision tower)"));
  auto gemma_vl = ParseHfConfig(R"({"model_type": "gemma3", "text_config": {}})", "g.json");
  EXPECT_THAT(gemma_vl.status().message(), HasSubstr("model_type 'gemma3' is Gemma 3 with its vision tower"));
  // A null or zero count is no refusal (HF writes "num_experts": null on some dense configs).
  auto dense =
      ParseHfConfig(std::string(kPublished[0].json).replace(1, 0, R"("num_experts": null, )"), "d.json");
  EXPECT_TRUE(dense.ok()) << dense.status().ToString();
  auto gpt = ParseHfConfig(R"({"model_type": "gpt2"})", "c.json");
  EXPECT_THAT(gpt.status().message(), HasSubstr("c.json: model_type 'gpt2' is not supported (supported: "
                                                "llama, mistral, qwen2, qwen3, gemma3_text)"));
}

TEST(FamilyTest, EveryPresetWritesAConfigThatReadsBackTheSame) {
  for (const char* name : {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-tied", "bench"}) {
    SCOPED_TRACE(name);
    auto c = PresetModelConfig(name);
    ASSERT_TRUE(c.ok());
    auto again = ParseHfConfig(HfConfigJson(*c), "written");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*again, *c);
  }
  auto qwen3 = PresetModelConfig("tiny-qwen3");
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_NE(qwen3->head_dim, qwen3->hidden_size / qwen3->num_heads);
  EXPECT_THAT(HfConfigJson(*qwen3), HasSubstr("\"Qwen3ForCausalLM\""));
}

TEST(FamilyTest, AConfigWhoseTraitsContradictItsFamilyIsRefused) {
  auto c = PresetModelConfig("tiny-llama");
  ASSERT_TRUE(c.ok());
  c->qk_norm = true;
  EXPECT_THAT(c->Validate("m.json").message(), HasSubstr("model_type 'llama' has no q/k norms"));
}

}  // namespace
}  // namespace ft
