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
// meta-llama/Llama-3.2-1B, google/gemma-3-1b-pt, google/gemma-2-2b, microsoft/Phi-3-mini-4k-instruct,
// microsoft/phi-4; published values kept except the sizes.
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
    {"google/gemma-2-2b",
     R"({"architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
         "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
         "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 256,
         "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 128,
         "initializer_range": 0.02, "intermediate_size": 384, "max_position_embeddings": 8192,
         "model_type": "gemma2", "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 2,
         "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
         "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": true,
         "vocab_size": 1024})",
     false, false, 256, 4096, true},
    {"microsoft/Phi-3-mini-4k-instruct",
     R"({"_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0,
         "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                      "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
         "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 128,
         "initializer_range": 0.02, "intermediate_size": 256, "max_position_embeddings": 4096, "model_type": "phi3",
         "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 4,
         "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
         "rope_scaling": null, "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
         "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": true, "attention_bias": false,
         "vocab_size": 1024})",
     false, false, 32, 2047, false},
    {"microsoft/phi-4",
     R"({"architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
         "bos_token_id": 100257, "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu",
         "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 448, "max_position_embeddings": 16384,
         "model_type": "phi3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 1,
         "original_max_position_embeddings": 16384, "pad_token_id": 100349, "resid_pdrop": 0.0,
         "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 250000, "sliding_window": null,
         "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.47.0",
         "use_cache": true, "vocab_size": 1024})",
     false, false, 32, 0, false},
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
// the newer layer_types; its activation and scales; soft-capping read when a config sets it.
TEST(FamilyTest, GemmaLayerTypesScalesAndSoftCapping) {
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
  EXPECT_EQ(c->attn_softcap, 0);  // null: none
  EXPECT_EQ(c->final_softcap, 0);
  std::string capped = gemma.json;
  capped.replace(capped.find(R"("attn_logit_softcapping": null)"), 30, R"("attn_logit_softcapping": 50.0)");
  auto with_cap = ParseHfConfig(capped, "c.json");
  ASSERT_TRUE(with_cap.ok()) << with_cap.status().ToString();
  EXPECT_EQ(with_cap->attn_softcap, 50);
  EXPECT_EQ(*ParseHfConfig(HfConfigJson(*with_cap), "written"), *with_cap);
  std::string negative = gemma.json;
  negative.replace(negative.find(R"("final_logit_softcapping": null)"), 31,
                   R"("final_logit_softcapping": -1)");
  EXPECT_THAT(ParseHfConfig(negative, "n.json").status().message(),
              HasSubstr("n.json: 'final_logit_softcapping' must be a finite number in (0, 1e+06]"));
}

// Gemma 2 (google/gemma-2-2b): soft-capping 50 / 30, layers alternating sliding and full from the
// first (transformers 4.42 has no key for it), one RoPE base; eos as a list.
TEST(FamilyTest, GemmaTwoAlternatesItsLayersAndSoftCaps) {
  auto c = ParseHfConfig(kPublished[5].json, "gemma2/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->attn_softcap, 50);
  EXPECT_EQ(c->final_softcap, 30);
  EXPECT_EQ(c->sliding_layers, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(c->LayerWindow(0), 4096);
  EXPECT_EQ(c->LayerWindow(1), 0);
  EXPECT_EQ(c->rope_local_theta, 0) << "one RoPE base";
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->eos_token_id, 1);
  const std::string written = HfConfigJson(*c);
  EXPECT_THAT(written, HasSubstr("\"Gemma2ForCausalLM\""));
  EXPECT_THAT(written, testing::Not(HasSubstr("rope_local_base_freq")));
}

// Phi-3 and Phi-4: fused projections under PEFT's names, a window on every layer; Phi-4-mini's
// partial rotary; its longrope scaling (as published) refused naming the key and value.
TEST(FamilyTest, PhiFusesItsProjectionsAndTurnsPartOfEachHead) {
  auto phi3 = ParseHfConfig(kPublished[6].json, "phi3/config.json");
  ASSERT_TRUE(phi3.ok()) << phi3.status().ToString();
  EXPECT_TRUE(phi3->fused_projections);
  EXPECT_EQ(phi3->LayerWindow(1), 2047);
  EXPECT_STREQ(ModuleName(*phi3, ModuleKind::kQ), "qkv_proj");
  EXPECT_STREQ(ModuleName(*phi3, ModuleKind::kGate), "gate_up_proj");
  EXPECT_EQ(ModuleShape(*phi3, ModuleKind::kQ).out, 3 * 128);  // q, k and v of 4 heads of 32
  EXPECT_EQ(ModuleShape(*phi3, ModuleKind::kGate).out, 2 * 256);
  EXPECT_FALSE(ModuleShape(*phi3, ModuleKind::kK).present());
  EXPECT_FALSE(ModuleShape(*phi3, ModuleKind::kUp).present());
  EXPECT_EQ(*ParseModuleName(*phi3, "gate_up_proj"), ModuleKind::kGate);
  EXPECT_THAT(ParseModuleName(*phi3, "q_proj").status().message(),
              HasSubstr("module 'q_proj' is not a module of a phi3 model (its modules: qkv_proj, o_proj, "
                        "gate_up_proj, down_proj, or all-linear for all)"));
  auto llama = PresetModelConfig("tiny-llama");
  EXPECT_THAT(ParseModuleName(*llama, "qkv_proj").status().message(),
              HasSubstr("module 'qkv_proj' is not a module of a llama model"));
  auto phi4 = ParseHfConfig(kPublished[7].json, "phi4/config.json");
  ASSERT_TRUE(phi4.ok()) << phi4.status().ToString();
  EXPECT_EQ(ModuleShape(*phi4, ModuleKind::kQ).out, 128 + 2 * 32);  // GQA: 4 query heads, 1 kv head
  EXPECT_EQ(phi4->sliding_window, 0);
  std::string mini = kPublished[7].json;
  mini.replace(mini.find(R"("rope_scaling": null)"), 20,
               R"("partial_rotary_factor": 0.75, "rope_scaling": null)");
  auto partial = ParseHfConfig(mini, "mini/config.json");
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  EXPECT_EQ(partial->rotary_dim(), 24);
  EXPECT_EQ(RopeInverseFrequencies(*partial).size(), 12u);
  EXPECT_EQ(*ParseHfConfig(HfConfigJson(*partial), "written"), *partial);
  std::string longrope = kPublished[7].json;
  longrope.replace(longrope.find(R"("rope_scaling": null)"), 20,
                   R"("rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]})");
  EXPECT_THAT(ParseHfConfig(longrope, "l.json").status().message(),
              HasSubstr("l.json: rope_scaling type 'longrope' is not supported"));
  std::string odd = kPublished[7].json;
  odd.replace(odd.find(R"("rope_scaling": null)"), 20,
              R"("partial_rotary_factor": 0.3, "rope_scaling": null)");
  EXPECT_THAT(ParseHfConfig(odd, "o.json").status().message(),
              HasSubstr("o.json: 'partial_rotary_factor' 0.3"));
}

// Qwen's sliding window applies from max_window_layers on (HF's Qwen2Config rule), to every layer
// of a Mistral; each written config reads back the same.
TEST(FamilyTest, SlidingLayersFollowEachFamilysRule) {
  std::string qwen = kPublished[1].json;
  qwen.replace(qwen.find(R"("use_sliding_window": false)"), 27, R"("use_sliding_window": true)");
  qwen.replace(qwen.find(R"("max_window_layers": 24)"), 23, R"("max_window_layers": 1)");
  auto q = ParseHfConfig(qwen, "qwen/config.json");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->sliding_window, 32768);
  EXPECT_EQ(q->sliding_layers, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(*ParseHfConfig(HfConfigJson(*q), "written"), *q);
  auto mistral = ParseHfConfig(kPublished[2].json, "mistral/config.json");
  ASSERT_TRUE(mistral.ok());
  EXPECT_TRUE(mistral->sliding_layers.empty());
  EXPECT_EQ(mistral->LayerWindow(0), 4096);
  EXPECT_EQ(mistral->LayerWindow(1), 4096);
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
  EXPECT_THAT(moe.status().message(),
              HasSubstr("supported: llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3"));
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
                                                "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3)"));
}

TEST(FamilyTest, EveryPresetWritesAConfigThatReadsBackTheSame) {
  for (const char* name : {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3",
                           "tiny-phi3", "tiny-tied", "bench"}) {
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
