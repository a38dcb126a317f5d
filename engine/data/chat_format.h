// Chat conversations rendered through a model's chat template (Hugging Face
// apply_chat_template semantics, engine/text/jinja/jinja.h), and the assistant-only loss
// mask for `format: chat` training data.
//
// Template variables: messages, add_generation_prompt, bos_token, eos_token,
// tools (none when not given, as transformers passes it), plus ChatVars::extra
// (e.g. {"enable_thinking": false} for Qwen3).
//
// Assistant spans (what gets loss) are found by rendering prefixes of the
// conversation, never by knowing a template's markers. With F the rendering
// of all messages (add_generation_prompt=false), for each assistant message i:
//   start = length of render(messages[:i], add_generation_prompt=true), which
//           must be a prefix of F;
//   end   = length of render(messages[:i+1]) when that is a prefix of F, so
//           the turn's end-of-turn token(s) are trained.
// Three template habits are handled on top of that rule; anything else that
// breaks it is an error ("not prefix-stable"):
//   * a constant trailer: text the template emits after the last message
//     whatever the conversation (the npm Llama 3 template appends the
//     assistant header even without add_generation_prompt). It is measured as
//     render([]) and, when F and every render(messages[:i+1]) end with it, is
//     cut from their ends, so it is never trained.
//   * a generation prompt only partly kept in history (Qwen3 with
//     enable_thinking=false adds an empty <think></think> block to the prompt
//     but not to earlier turns): when render(messages[:i]) is a prefix of F
//     and F follows the generation prompt right up to where message i's
//     content starts, the span starts at the content.
//   * a last message rendered differently from the same message in history
//     (Qwen3 adds an empty <think></think> block to the final assistant turn
//     only): render(messages[:i+1]) is then not a prefix of F, and the end is
//     where message i's content ends in F plus the text that F and
//     render(messages[:i+1]) both have right after the content (the
//     end-of-turn token).
// Content positions are found by rendering again with U+0001 before or after
// message i's content (which must be a string) and comparing.
// Spans are byte ranges of F, in message order, non-overlapping.
//
// Thread safety: a ChatTemplate is immutable; its methods may run
// concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/text/jinja/jinja.h"
#include "engine/text/tokenizer.h"

namespace ft {

struct ChatVars {
  std::string bos_token;
  std::string eos_token;
  bool add_generation_prompt = false;
  std::optional<nlohmann::ordered_json> tools;  // nullopt: `tools` is none
  // Further template variables; must be a JSON object and may not redefine
  // messages, add_generation_prompt, bos_token, eos_token or tools.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // Polled while a render runs (JinjaTemplate::Render): true stops it with
  // Cancelled. Not a template variable. Unset: never.
  std::function<bool()> stop_requested;
};

struct ByteSpan {
  int64_t begin = 0;  // [begin, end) in bytes
  int64_t end = 0;
};

struct ChatRendering {
  std::string text;                       // render(messages, add_generation_prompt=false)
  std::vector<ByteSpan> assistant_spans;  // one per assistant message, in order
};

class ChatTemplate {
 public:
  // Parses a chat template. Errors: InvalidArgument "chat template: line N: ...".
  static StatusOr<ChatTemplate> Parse(std::string_view source);

  // apply_chat_template(messages, tokenize=False, ...). `messages` must be a
  // JSON array. Errors name the template line (raise_exception included).
  StatusOr<std::string> Render(const nlohmann::ordered_json& messages, const ChatVars& vars) const;

  // The training rendering and its assistant spans (see the file comment);
  // vars.add_generation_prompt is ignored. Errors: the template fails, is not
  // prefix-stable at some assistant message, or `messages` has no assistant
  // message.
  StatusOr<ChatRendering> RenderForTraining(const nlohmann::ordered_json& messages,
                                            const ChatVars& vars) const;

 private:
  explicit ChatTemplate(JinjaTemplate t) : template_(std::move(t)) {}
  StatusOr<std::string> RenderValues(const std::vector<jinja::Value>& messages, const ChatVars& vars,
                                     bool add_generation_prompt) const;
  JinjaTemplate template_;
};

// Template variables given as text (job.yaml's data.chat_template_vars,
// ft-train generate's --chat-var) as JSON values: true/false, numbers, else
// strings.
nlohmann::ordered_json ChatVarsFromStrings(const std::map<std::string, std::string>& vars);

// One-shot rendering: parses `chat_template` and renders `messages`.
StatusOr<std::string> RenderChat(const std::string& chat_template, const nlohmann::ordered_json& messages,
                                 const ChatVars& vars);

// Labels for `tokens` (from Tokenizer::EncodeWithOffsets on the rendering):
// labels[t] = id when token t starts inside an assistant span
// (span.begin <= begin < span.end), else -100. A token straddling a span
// boundary therefore counts for the span it starts in: the token that starts
// an assistant reply is trained even if it swallowed preceding whitespace,
// and a token that starts before a span (e.g. a header merged with the
// reply's first characters) is not. Tokens with begin == end (added by a
// post-processor) are never labelled.
std::vector<int32_t> AssistantLabels(const std::vector<TokenSpan>& tokens,
                                     const std::vector<ByteSpan>& spans);

}  // namespace ft
