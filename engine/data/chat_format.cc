#include "engine/data/chat_format.h"

#include <algorithm>
#include <functional>

namespace ft {

namespace {

constexpr std::string_view kReserved[] = {"messages", "add_generation_prompt", "bos_token", "eos_token",
                                          "tools"};
constexpr char kContentMark[] = "\x01";  // appended to a message's content to find where it ends

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}
bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
size_t CommonPrefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

StatusOr<std::vector<jinja::Value>> MessageValues(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return Status::InvalidArgument("chat: 'messages' must be a JSON array");
  std::vector<jinja::Value> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    StatusOr<jinja::Value> v = jinja::Value::FromJson(messages[i]);
    if (!v.ok())
      return Status::InvalidArgument("chat: message " + std::to_string(i) + ": " + v.status().message());
    out.push_back(std::move(v).value());
  }
  return out;
}

std::string Role(const nlohmann::ordered_json& m) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return "";
  return m["role"].get<std::string>();
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  FT_ASSIGN_OR_RETURN(JinjaTemplate t, JinjaTemplate::Parse(source, "chat template"));
  return ChatTemplate(std::move(t));
}

StatusOr<std::string> ChatTemplate::RenderValues(const std::vector<jinja::Value>& messages,
                                                 const ChatVars& vars, bool add_generation_prompt) const {
  jinja::Dict d;
  d.Set("messages", jinja::Value::List(messages));
  d.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  d.Set("bos_token", jinja::Value::Str(vars.bos_token));
  d.Set("eos_token", jinja::Value::Str(vars.eos_token));
  jinja::Value tools = jinja::Value::None();
  if (vars.tools) {
    StatusOr<jinja::Value> v = jinja::Value::FromJson(*vars.tools);
    if (!v.ok()) return Status::InvalidArgument("chat: 'tools': " + v.status().message());
    tools = std::move(v).value();
  }
  d.Set("tools", std::move(tools));
  if (!vars.extra.is_null()) {
    if (!vars.extra.is_object())
      return Status::InvalidArgument("chat: extra template variables must be an object");
    for (auto it = vars.extra.begin(); it != vars.extra.end(); ++it) {
      if (std::find(std::begin(kReserved), std::end(kReserved), it.key()) != std::end(kReserved)) {
        return Status::InvalidArgument("chat: extra template variable '" + it.key() +
                                       "' would replace a standard one; set it through ChatVars instead");
      }
      StatusOr<jinja::Value> v = jinja::Value::FromJson(it.value());
      if (!v.ok())
        return Status::InvalidArgument("chat: template variable '" + it.key() + "': " + v.status().message());
      d.Set(it.key(), std::move(v).value());
    }
  }
  return template_.Render(d, vars.stop_requested);
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                           const ChatVars& vars) const {
  FT_ASSIGN_OR_RETURN(std::vector<jinja::Value> values, MessageValues(messages));
  return RenderValues(values, vars, vars.add_generation_prompt);
}

namespace {

// The state of one RenderForTraining: the conversation, its full rendering,
// and the constant trailer (see the header) when every rendering ends with it.
class TrainingRender {
 public:
  using RenderFn = std::function<StatusOr<std::string>(const std::vector<jinja::Value>&, bool)>;
  TrainingRender(RenderFn render, const nlohmann::ordered_json& messages, std::vector<jinja::Value> all)
      : render_(std::move(render)), messages_(messages), all_(std::move(all)) {}

  // Renders the whole conversation and each assistant turn's prefix, and
  // decides whether to cut the trailer. InvalidArgument without an assistant.
  Status Start() {
    FT_ASSIGN_OR_RETURN(full_, render_(all_, false));
    for (size_t i = 0; i < messages_.size(); ++i) {
      if (Role(messages_[i]) == "assistant") assistants_.push_back(i);
    }
    if (assistants_.empty()) {
      return Status::InvalidArgument("chat: no message has role 'assistant', so nothing would be trained");
    }
    StatusOr<std::string> empty = render_({}, false);  // the constant trailer: render([])
    if (empty.ok()) trailer_ = *empty;
    for (size_t i : assistants_) {
      FT_ASSIGN_OR_RETURN(std::string r, render_(Prefix(i + 1), false));
      turn_renders_.push_back(std::move(r));
    }
    strip_trailer_ = !trailer_.empty() && EndsWith(full_, trailer_);
    for (const std::string& r : turn_renders_) strip_trailer_ = strip_trailer_ && EndsWith(r, trailer_);
    if (strip_trailer_) {
      for (std::string& r : turn_renders_) r.resize(r.size() - trailer_.size());
    }
    return Status::OK();
  }

  const std::string& full() const { return full_; }
  size_t turns() const { return assistants_.size(); }
  size_t message(size_t k) const { return assistants_[k]; }  // assistant turn k's message index

  // The byte span of assistant turn k in full().
  StatusOr<ByteSpan> Span(size_t k) {
    const size_t i = assistants_[k];
    const std::string where = "chat: assistant message " + std::to_string(i) + ": ";
    FT_ASSIGN_OR_RETURN(const size_t start, TurnStart(i, where));
    FT_ASSIGN_OR_RETURN(const int64_t end, TurnEnd(k, start, where));
    const int64_t begin = static_cast<int64_t>(start);
    return ByteSpan{begin, std::max(begin, end)};
  }

 private:
  std::vector<jinja::Value> Prefix(size_t n) const { return {all_.begin(), all_.begin() + n}; }

  std::string CutTrailer(std::string r) const {
    if (strip_trailer_ && EndsWith(r, trailer_)) r.resize(r.size() - trailer_.size());
    return r;
  }

  // Where message i's string content starts (`at_end` false) or ends in the
  // rendering of `msgs`, found by marking the content; npos if not found.
  StatusOr<size_t> ContentEdge(const std::vector<jinja::Value>& msgs, size_t i, bool at_end,
                               const std::string& rendered) const {
    const nlohmann::ordered_json& msg = messages_[i];
    if (!msg.contains("content") || !msg["content"].is_string()) return std::string::npos;
    nlohmann::ordered_json marked = msg;
    const std::string content = msg["content"].get<std::string>();
    marked["content"] = at_end ? content + kContentMark : kContentMark + content;
    std::vector<jinja::Value> marked_msgs = msgs;
    FT_ASSIGN_OR_RETURN(marked_msgs[i], jinja::Value::FromJson(marked));  // checked by MessageValues
    FT_ASSIGN_OR_RETURN(std::string r, render_(marked_msgs, false));
    r = CutTrailer(std::move(r));
    const size_t at = CommonPrefix(rendered, r);
    if (r.compare(at, 1, kContentMark) != 0) return std::string::npos;
    return at;
  }

  // Where assistant message i's turn starts: after the messages before it
  // rendered with the generation prompt.
  StatusOr<size_t> TurnStart(size_t i, const std::string& where) const {
    const Status not_stable = Status::InvalidArgument(
        where +
        "the chat template is not prefix-stable: the messages before it, rendered with "
        "add_generation_prompt=true, are not a prefix of the whole conversation's rendering, so the "
        "assistant turn cannot be located");
    FT_ASSIGN_OR_RETURN(std::string head, render_(Prefix(i), true));
    if (StartsWith(full_, head)) return head.size();
    // The full rendering keeps only part of the generation prompt (Qwen3 with
    // enable_thinking=false drops the empty think block from history): start
    // where the content starts, if the two agree up to there.
    FT_ASSIGN_OR_RETURN(std::string base, render_(Prefix(i), false));
    base = CutTrailer(std::move(base));
    if (!StartsWith(full_, base)) return not_stable;
    FT_ASSIGN_OR_RETURN(const size_t start, ContentEdge(all_, i, /*at_end=*/false, full_));
    if (start == std::string::npos || start <= base.size() || start > CommonPrefix(head, full_))
      return not_stable;
    return start;
  }

  // Where assistant turn k ends in full().
  StatusOr<int64_t> TurnEnd(size_t k, size_t start, const std::string& where) const {
    const size_t i = assistants_[k];
    const std::string& turn = turn_renders_[k];
    if (StartsWith(full_, turn)) return static_cast<int64_t>(turn.size());
    // The final message renders differently from history: locate the end of
    // message i's content in both renderings and take the text both have
    // right after it (the end-of-turn marker).
    FT_ASSIGN_OR_RETURN(const size_t content_end_full, ContentEdge(all_, i, /*at_end=*/true, full_));
    FT_ASSIGN_OR_RETURN(const size_t content_end_turn, ContentEdge(Prefix(i + 1), i, /*at_end=*/true, turn));
    if (content_end_full == std::string::npos || content_end_turn == std::string::npos ||
        content_end_full < start) {
      return Status::InvalidArgument(
          where +
          "the chat template renders the conversation's last message differently from the same "
          "message in history, and the message's content cannot be located to find where its turn "
          "ends (it needs a string 'content')");
    }
    const std::string_view after_turn = std::string_view(turn).substr(content_end_turn);
    const std::string_view after_full = std::string_view(full_).substr(content_end_full);
    return static_cast<int64_t>(content_end_full + CommonPrefix(after_turn, after_full));
  }

  RenderFn render_;
  const nlohmann::ordered_json& messages_;
  std::vector<jinja::Value> all_;
  std::string full_;
  std::vector<size_t> assistants_;
  std::string trailer_;
  bool strip_trailer_ = false;
  std::vector<std::string> turn_renders_;  // render(messages[:i+1]) per assistant, trailer cut
};

}  // namespace

StatusOr<ChatRendering> ChatTemplate::RenderForTraining(const nlohmann::ordered_json& messages,
                                                        const ChatVars& vars) const {
  FT_ASSIGN_OR_RETURN(std::vector<jinja::Value> all, MessageValues(messages));
  TrainingRender r(
      [&](const std::vector<jinja::Value>& msgs, bool prompt) { return RenderValues(msgs, vars, prompt); },
      messages, std::move(all));
  FT_RETURN_IF_ERROR(r.Start());
  ChatRendering out;
  out.text = r.full();
  for (size_t k = 0; k < r.turns(); ++k) {
    FT_ASSIGN_OR_RETURN(ByteSpan span, r.Span(k));
    if (!out.assistant_spans.empty() && span.begin < out.assistant_spans.back().end) {
      return Status::InvalidArgument("chat: assistant message " + std::to_string(r.message(k)) +
                                     ": its span overlaps the previous assistant message's span");
    }
    out.assistant_spans.push_back(span);
  }
  return out;
}

StatusOr<std::string> RenderChat(const std::string& chat_template, const nlohmann::ordered_json& messages,
                                 const ChatVars& vars) {
  FT_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(chat_template));
  return t.Render(messages, vars);
}

std::vector<int32_t> AssistantLabels(const std::vector<TokenSpan>& tokens,
                                     const std::vector<ByteSpan>& spans) {
  std::vector<int32_t> labels(tokens.size(), -100);
  size_t s = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const TokenSpan& tok = tokens[t];
    if (tok.begin == tok.end) continue;
    while (s < spans.size() && spans[s].end <= tok.begin) ++s;
    if (s < spans.size() && spans[s].begin <= tok.begin && tok.begin < spans[s].end) labels[t] = tok.id;
  }
  return labels;
}

nlohmann::ordered_json ChatVarsFromStrings(const std::map<std::string, std::string>& vars) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [k, v] : vars) {
    if (v == "true" || v == "false") {
      out[k] = v == "true";
      continue;
    }
    nlohmann::json number = nlohmann::json::parse(v, nullptr, false);
    out[k] = number.is_number() ? nlohmann::ordered_json(number) : nlohmann::ordered_json(v);
  }
  return out;
}

}  // namespace ft
