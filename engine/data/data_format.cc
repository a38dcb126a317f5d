#include "engine/data/data_format.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <tuple>
#include <utility>

namespace ft {

namespace {

Status Bad(const std::string& where, const std::string& msg) {
  return Status::InvalidArgument(where + ": " + msg);
}

// A tokenizer's result for the line at `where`: its error names the line too.
template <typename T>
StatusOr<T> Tokenized(StatusOr<T> result, const std::string& where) {
  if (!result.ok()) return Bad(where, "tokenizing: " + result.status().message());
  return result;
}

StatusOr<std::vector<int32_t>> ReadIds(const nlohmann::ordered_json& j, const char* key,
                                       const std::string& where, int64_t vocab_size, bool allow_ignore) {
  const auto& arr = j[key];
  if (!arr.is_array()) return Bad(where, std::string("'") + key + "' must be an array of integers");
  std::vector<int32_t> out;
  out.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const auto& v = arr[i];
    if (!v.is_number_integer()) {
      return Bad(where, std::string("'") + key + "'[" + std::to_string(i) + "] is not an integer");
    }
    const int64_t id = v.get<int64_t>();
    if ((id < 0 || id >= vocab_size) && !(allow_ignore && id == -100)) {
      return Bad(where, std::string("'") + key + "'[" + std::to_string(i) + "] = " + std::to_string(id) +
                            " is outside [0, " + std::to_string(vocab_size) + ") of the model's vocabulary" +
                            (allow_ignore ? " (use -100 for positions without loss)" : ""));
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

StatusOr<std::string> StringField(const nlohmann::ordered_json& r, const char* key, const std::string& where,
                                  const char* format_hint, bool required) {
  if (!r.contains(key) || r[key].is_null()) {
    if (!required) return std::string();
    return Bad(where, std::string("missing '") + key + "' (" + format_hint + ")");
  }
  if (!r[key].is_string()) {
    return Bad(where, std::string("'") + key + "' must be a string, not " + r[key].type_name());
  }
  return r[key].get<std::string>();
}

// A record's "tools" (the tool descriptions a chat template may render) into vars->tools.
Status TakeTools(const nlohmann::ordered_json& r, const std::string& where, ChatVars* vars) {
  if (!r.contains("tools") || r["tools"].is_null()) return Status::OK();
  if (!r["tools"].is_array()) return Bad(where, "'tools' must be an array of tool (function) descriptions");
  vars->tools = r["tools"];
  return Status::OK();
}

// A pair from its prompt and responses, truncated as TRL's DPOTrainer does (data_format.h).
StatusOr<TokenSequence> MakePair(std::vector<int32_t> prompt, std::vector<int32_t> chosen,
                                 std::vector<int32_t> rejected, const PairLimits& limits,
                                 const std::string& where, const char* suffix) {
  const std::string p = std::string("prompt") + suffix;
  if (prompt.empty()) return Bad(where, "'" + p + "' is empty (the responses need a prompt to follow)");
  for (const auto& [name, ids] : {std::pair{"chosen", &chosen}, std::pair{"rejected", &rejected}}) {
    if (ids->empty())
      return Bad(where, "'" + std::string(name) + suffix + "' is empty (a response needs a token)");
  }
  const int64_t max_prompt = limits.max_prompt_len;
  if (max_prompt > 0 && static_cast<int64_t>(prompt.size()) > max_prompt)
    prompt.erase(prompt.begin(), prompt.end() - max_prompt);  // keep_end
  const int64_t room = limits.seq_len > 0 ? limits.seq_len - static_cast<int64_t>(prompt.size()) : INT64_MAX;
  TokenSequence seq;
  for (auto [ids, labels, response] : {std::tuple{&seq.ids, &seq.labels, &chosen},
                                       std::tuple{&seq.rejected_ids, &seq.rejected_labels, &rejected}}) {
    if (static_cast<int64_t>(response->size()) > room) response->resize(static_cast<size_t>(room));
    *ids = prompt;
    ids->insert(ids->end(), response->begin(), response->end());
    labels->assign(prompt.size(), -100);
    labels->insert(labels->end(), response->begin(), response->end());
  }
  return seq;
}

}  // namespace

StatusOr<DataFormat> ParseDataFormat(std::string_view name) { return ParseEnum<DataFormat>(name); }

const char* DataFormatName(DataFormat format) { return EnumName(format).data(); }

std::string AlpacaPrompt(const std::string& instruction, const std::string& input) {
  if (!input.empty()) {
    return "Below is an instruction that describes a task, paired with an input that provides further "
           "context. "
           "Write a response that appropriately completes the request.\n\n### Instruction:\n" +
           instruction + "\n\n### Input:\n" + input + "\n\n### Response:";
  }
  return "Below is an instruction that describes a task. Write a response that appropriately completes the "
         "request.\n\n### Instruction:\n" +
         instruction + "\n\n### Response:";
}

StatusOr<TokenSequence> ParseTokensJson(const nlohmann::ordered_json& record, const std::string& where,
                                        int64_t vocab_size) {
  if (!record.is_object()) return Bad(where, "not a JSON object");
  if (!record.contains("input_ids")) {
    return Bad(where,
               "missing 'input_ids' (format: tokens expects {\"input_ids\": [...], \"labels\": [...]?})");
  }
  TokenSequence seq;
  FT_ASSIGN_OR_RETURN(seq.ids, ReadIds(record, "input_ids", where, vocab_size, false));
  if (record.contains("labels")) {
    FT_ASSIGN_OR_RETURN(seq.labels, ReadIds(record, "labels", where, vocab_size, true));
    if (seq.labels.size() != seq.ids.size()) {
      return Bad(where, "'labels' has " + std::to_string(seq.labels.size()) +
                            " entries but 'input_ids' has " + std::to_string(seq.ids.size()) +
                            " (give one label per token)");
    }
  }
  return seq;
}

StatusOr<DataEncoder> DataEncoder::Create(DataFormat format, const Tokenizer* tokenizer, int64_t vocab_size,
                                          const ChatOptions& chat, const PairLimits& pairs, FieldMap fields) {
  DataEncoder e;
  e.format_ = format;
  e.pairs_ = pairs;
  e.fields_ = std::move(fields);
  e.tokenizer_ = tokenizer;
  e.vocab_size_ = vocab_size;
  if (vocab_size <= 0) return Status::InvalidArgument("data format: the model's vocab_size must be positive");
  if (format == DataFormat::kTokens) return e;
  if (format == DataFormat::kPreference && tokenizer == nullptr) return e;  // token ids only
  const std::string name = DataFormatName(format);
  if (tokenizer == nullptr) {
    return Status::FailedPrecondition("format: " + name + " needs the model's tokenizer (tokenizer.json)");
  }
  if (format == DataFormat::kText || format == DataFormat::kAlpaca || format == DataFormat::kPreference) {
    const std::optional<int32_t> eos =
        tokenizer->eos_token().empty() ? std::nullopt : tokenizer->TokenToId(tokenizer->eos_token());
    if (!eos) {
      return Status::InvalidArgument(
          "format: " + name + " appends the EOS token, but the tokenizer " +
          (tokenizer->eos_token().empty()
               ? std::string("names no eos_token (set it in tokenizer_config.json)")
               : "has no id for eos_token '" + tokenizer->eos_token() + "'"));
    }
    e.eos_id_ = *eos;
  }
  const std::string& source = chat.chat_template.empty() ? tokenizer->chat_template() : chat.chat_template;
  if (format == DataFormat::kChat && source.empty()) {
    return Status::InvalidArgument(
        "format: chat needs a chat template, but tokenizer_config.json has no 'chat_template' (give one in "
        "the "
        "job's data section or use format: text/alpaca)");
  }
  // Preference rows take the template for their conversational form only (text rows need none).
  if (format == DataFormat::kChat || (format == DataFormat::kPreference && !source.empty())) {
    FT_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(source));
    e.chat_template_.emplace(std::move(t));
    e.chat_vars_.bos_token = tokenizer->bos_token();
    e.chat_vars_.eos_token = tokenizer->eos_token();
    if (!chat.extra_vars.is_null() && !chat.extra_vars.is_object()) {
      return Status::InvalidArgument("format: chat: extra template variables must be a JSON object");
    }
    e.chat_vars_.extra = chat.extra_vars.is_null() ? nlohmann::ordered_json::object() : chat.extra_vars;
    e.chat_vars_.stop_requested = chat.stop_requested;
  }
  return e;
}

StatusOr<TokenSequence> DataEncoder::EncodeLine(std::string_view line, const std::string& where) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(where, "not valid JSON (each line must hold one JSON object)");
  FT_RETURN_IF_ERROR(fields_.Apply(&j, where));
  return Encode(j, where);
}

StatusOr<TokenSequence> DataEncoder::Encode(const nlohmann::ordered_json& record,
                                            const std::string& where) const {
  if (!record.is_object())
    return Bad(where, std::string("not a JSON object (got ") + record.type_name() + ")");
  StatusOr<TokenSequence> seq = Status::Internal("unreachable");
  switch (format_) {
    case DataFormat::kTokens: return ParseTokensJson(record, where, vocab_size_);
    case DataFormat::kText: seq = EncodeText(record, where); break;
    case DataFormat::kAlpaca: seq = EncodeAlpaca(record, where); break;
    case DataFormat::kChat: seq = EncodeChat(record, where); break;
    case DataFormat::kPreference: seq = EncodePreference(record, where); break;
  }
  if (!seq.ok()) return seq;
  FT_RETURN_IF_ERROR(CheckVocab(*seq, where));
  return seq;
}

Status DataEncoder::CheckVocab(const TokenSequence& seq, const std::string& where) const {
  std::vector<int32_t> all = seq.ids;
  all.insert(all.end(), seq.rejected_ids.begin(), seq.rejected_ids.end());
  for (int32_t id : all) {
    if (id < 0 || id >= vocab_size_) {
      return Bad(where, "the tokenizer produced token id " + std::to_string(id) + ", outside [0, " +
                            std::to_string(vocab_size_) +
                            ") of the model's vocabulary (tokenizer and model do not match)");
    }
  }
  return Status::OK();
}

StatusOr<TokenSequence> DataEncoder::EncodeText(const nlohmann::ordered_json& r,
                                                const std::string& where) const {
  FT_ASSIGN_OR_RETURN(std::string text,
                      StringField(r, "text", where, "format: text expects {\"text\": \"...\"}", true));
  TokenSequence seq;
  FT_ASSIGN_OR_RETURN(seq.ids, Tokenized(tokenizer_->Encode(text, /*add_special_tokens=*/true), where));
  if (seq.ids.empty() || seq.ids.back() != eos_id_) seq.ids.push_back(eos_id_);
  seq.labels = seq.ids;
  return seq;
}

StatusOr<TokenSequence> DataEncoder::EncodePreference(const nlohmann::ordered_json& r,
                                                      const std::string& where) const {
  static constexpr char kHint[] =
      "format: preference expects {\"prompt_ids\", \"chosen_ids\", \"rejected_ids\"} or {\"prompt\", "
      "\"chosen\", \"rejected\"}";
  if (r.contains("prompt_ids")) {
    std::vector<int32_t> parts[3];
    const char* keys[] = {"prompt_ids", "chosen_ids", "rejected_ids"};
    for (int i = 0; i < 3; ++i) {
      if (!r.contains(keys[i])) return Bad(where, std::string("missing '") + keys[i] + "' (" + kHint + ")");
      FT_ASSIGN_OR_RETURN(parts[i], ReadIds(r, keys[i], where, vocab_size_, false));
    }
    return MakePair(parts[0], parts[1], parts[2], pairs_, where, "_ids");
  }
  if (tokenizer_ == nullptr) {
    return Bad(where,
               std::string("no 'prompt_ids': the text form needs the model's tokenizer (") + kHint + ")");
  }
  std::string texts[3];
  if (r.contains("prompt") && r["prompt"].is_array()) {
    FT_ASSIGN_OR_RETURN(auto rendered, RenderPreference(r, where));
    std::tie(texts[0], texts[1], texts[2]) = std::move(rendered);
  } else {
    const char* keys[] = {"prompt", "chosen", "rejected"};
    for (int i = 0; i < 3; ++i) {
      FT_ASSIGN_OR_RETURN(texts[i], StringField(r, keys[i], where, kHint, true));
    }
  }
  std::vector<int32_t> parts[3];
  for (int i = 0; i < 3; ++i) {
    FT_ASSIGN_OR_RETURN(parts[i],
                        Tokenized(tokenizer_->Encode(texts[i], /*add_special_tokens=*/false), where));
    if (i > 0 && !texts[i].empty()) parts[i].push_back(eos_id_);  // TRL: each response ends with EOS
  }
  return MakePair(parts[0], parts[1], parts[2], pairs_, where, "");
}

StatusOr<std::tuple<std::string, std::string, std::string>> DataEncoder::RenderPreference(
    const nlohmann::ordered_json& r, const std::string& where) const {
  static constexpr char kHint[] =
      "the conversational form is {\"prompt\": [messages ending with the user's], \"chosen\": [assistant "
      "messages], \"rejected\": [assistant messages]}";
  if (!chat_template_) {
    return Bad(where, std::string("'prompt' is a list of messages, but the tokenizer has no chat template "
                                  "(give data.chat_template, or use the text form: ") +
                          kHint + ")");
  }
  for (const char* key : {"prompt", "chosen", "rejected"}) {
    if (!r.contains(key)) return Bad(where, std::string("missing '") + key + "' (" + kHint + ")");
    const auto& list = r[key];
    if (!list.is_array() || list.empty())
      return Bad(where, std::string("'") + key + "' must be a non-empty list of messages (" + kHint + ")");
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& m = list[i];
      const std::string field = std::string("'") + key + "'[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content"))
        return Bad(where, field + " must be a message {\"role\": ..., \"content\": ...}");
      if (std::string(key) != "prompt" && m["role"] != "assistant")
        return Bad(where,
                   field + "'s role is " + m["role"].dump() + " (a response's messages are the assistant's)");
    }
  }
  if (r["prompt"].back()["role"] != "user") {
    return Bad(where, "'prompt' ends with a " + r["prompt"].back()["role"].dump() +
                          " message (it must end with the user's message the responses answer)");
  }
  ChatVars vars = chat_vars_;
  FT_RETURN_IF_ERROR(TakeTools(r, where, &vars));
  auto render = [&](const nlohmann::ordered_json& messages, bool generation_prompt) -> StatusOr<std::string> {
    vars.add_generation_prompt = generation_prompt;
    StatusOr<std::string> text = chat_template_->Render(messages, vars);
    if (text.status().code() == Status::Code::kCancelled)
      return Status::Cancelled(where + ": " + text.status().message());
    if (!text.ok()) return Bad(where, "rendering the chat template: " + text.status().message());
    return text;
  };
  // TRL's maybe_apply_chat_template: the prompt with its generation prompt; each response is what
  // render(prompt + response) adds to it, the prompt first cut to the prefix both share.
  FT_ASSIGN_OR_RETURN(std::string prompt, render(r["prompt"], true));
  std::string responses[2];
  for (int k = 0; k < 2; ++k) {
    nlohmann::ordered_json whole = r["prompt"];
    for (const auto& m : r[k == 0 ? "chosen" : "rejected"]) whole.push_back(m);
    FT_ASSIGN_OR_RETURN(const std::string full, render(whole, false));
    const size_t common = static_cast<size_t>(
        std::mismatch(prompt.begin(),
                      prompt.begin() + static_cast<std::ptrdiff_t>(std::min(prompt.size(), full.size())),
                      full.begin())
            .first -
        prompt.begin());
    prompt.resize(common);
    responses[k] = full.substr(common);
  }
  return std::tuple{std::move(prompt), std::move(responses[0]), std::move(responses[1])};
}

StatusOr<TokenSequence> DataEncoder::EncodeAlpaca(const nlohmann::ordered_json& r,
                                                  const std::string& where) const {
  static constexpr char kHint[] =
      "format: alpaca expects {\"instruction\": \"...\", \"input\": \"...\" (optional), \"output\": \"...\"}";
  FT_ASSIGN_OR_RETURN(std::string instruction, StringField(r, "instruction", where, kHint, true));
  FT_ASSIGN_OR_RETURN(std::string input, StringField(r, "input", where, kHint, false));
  FT_ASSIGN_OR_RETURN(std::string output, StringField(r, "output", where, kHint, true));
  const std::string prompt = AlpacaPrompt(instruction, input);
  FT_ASSIGN_OR_RETURN(
      const std::vector<TokenSpan> toks,
      Tokenized(tokenizer_->EncodeWithOffsets(prompt + output, /*add_special_tokens=*/true), where));
  const int64_t response_begin = static_cast<int64_t>(prompt.size());
  TokenSequence seq;
  for (const TokenSpan& t : toks) {
    seq.ids.push_back(t.id);
    seq.labels.push_back(t.begin != t.end && t.begin >= response_begin ? t.id : -100);
  }
  if (!toks.empty() && toks.back().id == eos_id_ && toks.back().begin == toks.back().end) {
    seq.labels.back() = eos_id_;  // the post-processor already appended EOS: train it
  } else {
    seq.ids.push_back(eos_id_);
    seq.labels.push_back(eos_id_);
  }
  return seq;
}

StatusOr<TokenSequence> DataEncoder::EncodeChat(const nlohmann::ordered_json& r,
                                                const std::string& where) const {
  static constexpr char kHint[] =
      "format: chat expects {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, {\"role\": "
      "\"assistant\", "
      "\"content\": \"...\"}]}";
  if (!r.contains("messages")) return Bad(where, std::string("missing 'messages' (") + kHint + ")");
  const auto& messages = r["messages"];
  if (!messages.is_array() || messages.empty()) {
    return Bad(where, std::string("'messages' must be a non-empty array (") + kHint + ")");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string field = "'messages'[" + std::to_string(i) + "]";
    if (!m.is_object()) return Bad(where, field + " must be an object with 'role' and 'content'");
    if (!m.contains("role") || !m["role"].is_string()) {
      return Bad(where, field + ": missing or non-string 'role' (e.g. \"user\", \"assistant\", \"system\")");
    }
    if (!m.contains("content") && !m.contains("tool_calls")) {
      return Bad(where, field + ": missing 'content'");
    }
  }
  ChatVars vars = chat_vars_;
  FT_RETURN_IF_ERROR(TakeTools(r, where, &vars));
  StatusOr<ChatRendering> rendering = chat_template_->RenderForTraining(messages, vars);
  if (rendering.status().code() == Status::Code::kCancelled) {
    return Status::Cancelled(where + ": " + rendering.status().message());  // a stop, not a bad line
  }
  if (!rendering.ok()) return Bad(where, "'messages': " + rendering.status().message());
  FT_ASSIGN_OR_RETURN(
      const std::vector<TokenSpan> toks,
      Tokenized(tokenizer_->EncodeWithOffsets(rendering->text, /*add_special_tokens=*/false), where));
  TokenSequence seq;
  seq.ids.reserve(toks.size());
  for (const TokenSpan& t : toks) seq.ids.push_back(t.id);
  seq.labels = AssistantLabels(toks, rendering->assistant_spans);
  if (std::all_of(seq.labels.begin(), seq.labels.end(), [](int32_t l) { return l == -100; })) {
    return Bad(where, "'messages': the assistant turns rendered to no tokens, so nothing would be trained");
  }
  return seq;
}

StatusOr<RecordEncoder> MakeRecordEncoder(DataFormat format, const Tokenizer* tokenizer, int64_t vocab_size,
                                          const ChatOptions& chat, const PairLimits& pairs, FieldMap fields) {
  FT_ASSIGN_OR_RETURN(DataEncoder e,
                      DataEncoder::Create(format, tokenizer, vocab_size, chat, pairs, std::move(fields)));
  auto shared = std::make_shared<const DataEncoder>(std::move(e));
  return RecordEncoder([shared](const std::string& line, const std::string& where) {
    return shared->EncodeLine(line, where);
  });
}

}  // namespace ft
