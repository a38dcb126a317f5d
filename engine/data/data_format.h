// Training data formats: one JSONL record -> one TokenSequence (ids and
// labels of the same length; label -100 = no loss at that position; see
// engine/data/dataset.h, which streams a file through the RecordEncoder made here).
//
//   tokens  {"input_ids": [...], "labels": [...]?}  ids as given; labels as
//           given (each -100 or an id) or, when absent, left empty (= ids).
//   text    {"text": "..."}  tokenized with add_special_tokens=true (the
//           tokenizer's BOS, if it adds one), then the EOS token id appended
//           (not twice when the post-processor already ended with it); loss
//           on every token.
//   alpaca  {"instruction", "input"?, "output"}  Stanford Alpaca's prompt
//           (the with-input form when "input" is a non-empty string) followed
//           by the output, tokenized with add_special_tokens=true, EOS
//           appended; loss only on tokens that start inside the output, and
//           on the EOS.
//   chat    {"messages": [{"role", "content"}, ...], "tools"?: [...]}
//           rendered with the model's chat template (engine/data/chat_format.h),
//           tokenized once with add_special_tokens=false (the template writes
//           BOS itself where the model wants one); loss only on tokens that
//           start inside an assistant turn (its end-of-turn token included).
//   preference  TRL's preference rows, one pair (TokenSequence::rejected_*):
//           {"prompt_ids", "chosen_ids", "rejected_ids"}  token ids as given (no BOS or EOS);
//           {"prompt", "chosen", "rejected"} strings: each tokenized without special tokens, EOS
//           appended to each response (TRL's tokenize_row for a decoder-only model);
//           conversational: "prompt" a list of messages ending with the user's, "chosen" and
//           "rejected" lists of assistant messages, rendered as TRL's maybe_apply_chat_template
//           does (the prompt with add_generation_prompt; a response = what rendering prompt +
//           response adds to the prefix the two renderings share), then tokenized as text.
//           A prompt longer than max_prompt_len keeps its last max_prompt_len tokens (TRL's
//           keep_end); each response is then cut to seq_len - prompt. Loss on the responses.
//
// Every id must lie in [0, vocab_size) of the model. Errors are
// InvalidArgument "<where>: <field>: <problem> (<how to fix>)", `where` being
// the caller's "file:line".
//
// Thread safety: a DataEncoder is immutable; Encode may run concurrently
// (the tokenizer is thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "common/status.h"
#include "engine/data/chat_format.h"
#include "engine/data/dataset.h"
#include "engine/data/field_map.h"
#include "engine/job/job_choices.h"
#include "engine/text/tokenizer.h"

namespace ft {

// DataFormat and its table (job.yaml's data.format): engine/job/job_choices.h.
// "tokens", "text", "alpaca", "chat"; InvalidArgument naming them otherwise.
StatusOr<DataFormat> ParseDataFormat(std::string_view name);
const char* DataFormatName(DataFormat format);

// Stanford Alpaca's prompts (everything before the response).
std::string AlpacaPrompt(const std::string& instruction, const std::string& input);

// A parsed `tokens` record: input_ids (integers in [0, vocab_size)),
// optional labels (same length; each -100 or in [0, vocab_size)).
StatusOr<TokenSequence> ParseTokensJson(const nlohmann::ordered_json& record, const std::string& where,
                                        int64_t vocab_size);

struct ChatOptions {
  // Replaces the tokenizer's chat template when non-empty.
  std::string chat_template;
  // Extra template variables, e.g. {"enable_thinking": false}.
  nlohmann::ordered_json extra_vars = nlohmann::ordered_json::object();
  // Polled while a template renders (ChatVars::stop_requested): true ends
  // the line's encoding with Cancelled, which is not a bad line.
  std::function<bool()> stop_requested;
};

// data.format: preference's truncation (data.max_prompt_len, data.seq_len).
struct PairLimits {
  int64_t max_prompt_len = 0;  // 0 = no prompt truncation
  int64_t seq_len = 0;         // 0 = none
};

class DataEncoder {
 public:
  // `tokenizer` is needed by text, alpaca and chat (not tokens); it is
  // borrowed and must outlive the encoder. Fails when the format needs what
  // the tokenizer lacks (no EOS token for text/alpaca, no chat template for
  // chat) or the chat template does not parse.
  static StatusOr<DataEncoder> Create(DataFormat format, const Tokenizer* tokenizer, int64_t vocab_size,
                                      const ChatOptions& chat = {}, const PairLimits& pairs = {},
                                      FieldMap fields = {});

  // One JSONL line (parsed with key order kept, its fields renamed by the FieldMap). `where` is "file:line".
  StatusOr<TokenSequence> EncodeLine(std::string_view line, const std::string& where) const;
  StatusOr<TokenSequence> Encode(const nlohmann::ordered_json& record, const std::string& where) const;

  DataFormat format() const { return format_; }

 private:
  DataEncoder() = default;
  StatusOr<TokenSequence> EncodeText(const nlohmann::ordered_json& r, const std::string& where) const;
  StatusOr<TokenSequence> EncodeAlpaca(const nlohmann::ordered_json& r, const std::string& where) const;
  StatusOr<TokenSequence> EncodeChat(const nlohmann::ordered_json& r, const std::string& where) const;
  StatusOr<TokenSequence> EncodePreference(const nlohmann::ordered_json& r, const std::string& where) const;
  // The conversational form's prompt, chosen and rejected texts (TRL's maybe_apply_chat_template).
  StatusOr<std::tuple<std::string, std::string, std::string>> RenderPreference(
      const nlohmann::ordered_json& r, const std::string& where) const;
  Status CheckVocab(const TokenSequence& seq, const std::string& where) const;

  DataFormat format_ = DataFormat::kTokens;
  const Tokenizer* tokenizer_ = nullptr;
  int64_t vocab_size_ = 0;
  int32_t eos_id_ = -1;
  std::optional<ChatTemplate> chat_template_;
  ChatVars chat_vars_;
  PairLimits pairs_;
  FieldMap fields_;
};

// The encoder engine/data/dataset.h streams a file through: DataEncoder::EncodeLine
// behind a std::function (the DataEncoder is owned by the function; the
// tokenizer is still borrowed).
StatusOr<RecordEncoder> MakeRecordEncoder(DataFormat format, const Tokenizer* tokenizer, int64_t vocab_size,
                                          const ChatOptions& chat = {}, const PairLimits& pairs = {},
                                          FieldMap fields = {});

}  // namespace ft
