// Tokenizer::Load and the encode/decode pipeline of a Hugging Face
// tokenizer.json: added tokens -> normalizer -> pre-tokenizer -> BPE model ->
// post-processor, and ids -> token strings -> decoders -> clean-up.
#include "engine/text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "engine/text/added_tokens.h"
#include "engine/text/bpe.h"
#include "engine/text/tokenizer_components.h"
#include "engine/text/unicode_text.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using text::AlignedText;

// Where encoded tokens go: ids only, or ids with original byte offsets.
struct TokenSink {
  std::vector<int32_t>* ids = nullptr;
  std::vector<TokenSpan>* spans = nullptr;
  bool track() const { return spans != nullptr; }
  void Add(int32_t id, int64_t begin, int64_t end) {
    if (spans) {
      spans->push_back({id, begin, end});
    } else {
      ids->push_back(id);
    }
  }
};

// The text transformations of transformers' clean_up_tokenization().
std::string CleanUpTokenization(std::string s) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    size_t prev = 0;
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, prev)) {
      out.append(s, prev, at - prev);
      out.append(to);
      prev = at + from.size();
    }
    if (prev == 0) continue;
    out.append(s, prev);
    s = std::move(out);
  }
  return s;
}

StatusOr<json> ReadJsonFile(const std::string& path) {
  FT_ASSIGN_OR_RETURN(std::string data, ReadFileToString(path));
  try {
    return json::parse(data);
  } catch (const json::parse_error& e) {
    return Status::InvalidArgument(path + ": malformed JSON: " + e.what());
  }
}

// A token field of tokenizer_config.json: "text", {"content": "text", ...} or null.
std::string ConfigToken(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

StatusOr<AddedToken> ParseAddedToken(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("id") || !j["id"].is_number_integer() || j["id"].get<int64_t>() < 0 ||
      !j.contains("content") || !j["content"].is_string()) {
    return Status::InvalidArgument(where +
                                   " must be an object with an integer \"id\" and a string \"content\"");
  }
  AddedToken t;
  t.id = j["id"].get<int32_t>();
  t.content = j["content"].get<std::string>();
  const std::pair<const char*, bool*> flags[] = {{"single_word", &t.single_word},
                                                 {"lstrip", &t.lstrip},
                                                 {"rstrip", &t.rstrip},
                                                 {"normalized", &t.normalized},
                                                 {"special", &t.special}};
  for (const auto& [key, field] : flags) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_boolean()) return Status::InvalidArgument(where + "." + key + " must be a boolean");
    *field = it->get<bool>();
  }
  return t;
}

class HfTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    TokenSink sink{&ids, nullptr};
    FT_RETURN_IF_ERROR(EncodeInto(text, add_special_tokens, &sink));
    return ids;
  }
  StatusOr<std::vector<TokenSpan>> EncodeWithOffsets(std::string_view text,
                                                     bool add_special_tokens) const override {
    std::vector<TokenSpan> spans;
    TokenSink sink{nullptr, &spans};
    FT_RETURN_IF_ERROR(EncodeInto(text, add_special_tokens, &sink));
    return spans;
  }
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    return Decode(ids, skip_special_tokens, clean_up_spaces_);
  }
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens, bool clean_up) const override;

  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = added_by_content_.find(std::string(token));
    if (it != added_by_content_.end()) return added_[it->second].id;
    return model_->TokenToId(token);
  }
  int64_t vocab_size() const override { return vocab_size_; }
  const std::string& chat_template() const override { return chat_template_; }
  const std::string& bos_token() const override { return bos_token_; }
  const std::string& eos_token() const override { return eos_token_; }
  const std::string& pad_token() const override { return pad_token_; }

 private:
  Status LoadTokenizerJson(const json& j, const std::string& file);
  Status LoadAddedTokens(const json& j, const std::string& file);
  Status LoadConfig(const json& config, const std::string& file);
  Status BuildSplitters();

  // Errors: a regex's work ran out (tok::Normalizer, tok::PreTokenizer).
  Status EncodeInto(std::string_view text, bool add_special_tokens, TokenSink* sink) const;
  Status EncodeUnnormalized(AlignedText section, bool at_input_start, TokenSink* sink) const;
  Status EncodeWords(AlignedText normalized, bool at_input_start, TokenSink* sink) const;

  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  tok::PostProcessor post_;
  std::unique_ptr<tok::Decoder> decoder_;

  std::vector<AddedToken> added_;
  std::unordered_map<std::string, size_t> added_by_content_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  AddedTokenSplitter raw_splitter_;         // tokens with normalized=false, on the input
  AddedTokenSplitter normalized_splitter_;  // tokens with normalized=true, on normalized text

  int64_t vocab_size_ = 0;
  bool clean_up_spaces_ = false;
  bool split_special_tokens_ = false;
  std::string chat_template_, bos_token_, eos_token_, pad_token_;
};

StatusOr<std::unique_ptr<Tokenizer>> HfTokenizer::Load(const std::string& path) {
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  if (!fs::exists(file, ec)) {
    return Status::NotFound(file.string() +
                            ": no such file (expected a tokenizer.json or a model directory holding one)");
  }
  FT_ASSIGN_OR_RETURN(json j, ReadJsonFile(file.string()));
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  FT_RETURN_IF_ERROR(t->LoadTokenizerJson(j, file.string()));
  const fs::path config_file = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_file, ec)) {
    FT_ASSIGN_OR_RETURN(json config, ReadJsonFile(config_file.string()));
    FT_RETURN_IF_ERROR(t->LoadConfig(config, config_file.string()));
  }
  FT_RETURN_IF_ERROR(t->BuildSplitters());
  return std::unique_ptr<Tokenizer>(std::move(t));
}

Status HfTokenizer::LoadTokenizerJson(const json& j, const std::string& file) {
  if (!j.is_object()) return Status::InvalidArgument(file + ": the top level must be a JSON object");
  auto field = [&](const char* key) -> const json& {
    static const json kNull;
    auto it = j.find(key);
    return it == j.end() ? kNull : *it;
  };
  FT_ASSIGN_OR_RETURN(normalizer_, tok::ParseNormalizer(field("normalizer"), file + ": normalizer"));
  FT_ASSIGN_OR_RETURN(pre_tokenizer_,
                      tok::ParsePreTokenizer(field("pre_tokenizer"), file + ": pre_tokenizer"));
  FT_ASSIGN_OR_RETURN(post_, tok::ParsePostProcessor(field("post_processor"), file + ": post_processor"));
  FT_ASSIGN_OR_RETURN(decoder_, tok::ParseDecoder(field("decoder"), file + ": decoder"));

  const json& model = field("model");
  if (!model.is_object()) return Status::InvalidArgument(file + ": model must be an object");
  // Old files have no "type"; a model with merges is BPE.
  const std::string type = model.contains("type") && model["type"].is_string()
                               ? model["type"].get<std::string>()
                           : model.contains("merges") ? "BPE"
                                                      : "";
  if (type != "BPE") {
    return Status::Unimplemented(file + ": model.type \"" + type + "\" is not supported (supported: BPE)");
  }
  const bool byte_level = pre_tokenizer_ && pre_tokenizer_->byte_level();
  FT_ASSIGN_OR_RETURN(model_, BpeModel::FromJson(model, byte_level, file + ": model"));
  vocab_size_ = model_->max_id() + 1;
  return LoadAddedTokens(field("added_tokens"), file);
}

Status HfTokenizer::LoadAddedTokens(const json& list, const std::string& file) {
  if (list.is_null()) return Status::OK();
  if (!list.is_array()) return Status::InvalidArgument(file + ": added_tokens must be an array");
  for (size_t i = 0; i < list.size(); ++i) {
    FT_ASSIGN_OR_RETURN(AddedToken t,
                        ParseAddedToken(list[i], file + ": added_tokens[" + std::to_string(i) + "]"));
    if (t.content.empty() || added_by_content_.count(t.content)) continue;
    added_by_content_[t.content] = added_.size();
    added_by_id_[t.id] = added_.size();
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{t.id} + 1);
    added_.push_back(std::move(t));
  }
  return Status::OK();
}

// Special tokens are matched before the others, as in HF (within a splitter
// the longest match wins anyway, so only equal contents could tell).
// Normalized tokens are looked for in normalized text, in normalized form.
Status HfTokenizer::BuildSplitters() {
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < added_.size(); ++i) {
      const AddedToken& t = added_[i];
      if (t.special != (pass == 0) || (t.special && split_special_tokens_)) continue;
      AlignedText content;
      content.text = t.content;
      if (t.normalized && normalizer_) FT_RETURN_IF_ERROR(normalizer_->Normalize(&content));
      (t.normalized ? normalized_splitter_ : raw_splitter_).Add(content.text, static_cast<int32_t>(i));
    }
  }
  return Status::OK();
}

Status HfTokenizer::LoadConfig(const json& config, const std::string& file) {
  if (!config.is_object()) return Status::InvalidArgument(file + ": the top level must be a JSON object");
  bos_token_ = ConfigToken(config, "bos_token");
  eos_token_ = ConfigToken(config, "eos_token");
  pad_token_ = ConfigToken(config, "pad_token");
  auto tmpl = config.find("chat_template");
  if (tmpl != config.end() && tmpl->is_string()) {
    chat_template_ = tmpl->get<std::string>();
  } else if (tmpl != config.end() && tmpl->is_array()) {  // [{"name": ..., "template": ...}]: take "default"
    for (const json& t : *tmpl) {
      if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) continue;
      if (chat_template_.empty() || t.value("name", "") == "default") {
        chat_template_ = t["template"].get<std::string>();
      }
    }
  }
  auto flag = [&](const char* key, bool fallback) {
    auto it = config.find(key);
    return it != config.end() && it->is_boolean() ? it->get<bool>() : fallback;
  };
  clean_up_spaces_ = flag("clean_up_tokenization_spaces", false);
  split_special_tokens_ = flag("split_special_tokens", false);  // special tokens in text are then plain text
  // transformers' LlamaTokenizerFast and GemmaTokenizerFast rebuild the
  // post-processor from add_bos_token (default true) and add_eos_token
  // (default false).
  std::string cls = config.value("tokenizer_class", "");
  if (cls.ends_with("Fast")) cls.resize(cls.size() - 4);
  if (cls == "LlamaTokenizer" || cls == "GemmaTokenizer") {
    tok::PostProcessor pp;
    const std::pair<bool, const std::string*> ends[] = {{flag("add_bos_token", true), &bos_token_},
                                                        {flag("add_eos_token", false), &eos_token_}};
    for (size_t k = 0; k < 2; ++k) {
      if (!ends[k].first) continue;
      std::optional<int32_t> id = TokenToId(*ends[k].second);
      if (!id) {
        return Status::InvalidArgument(file + ": " + (k == 0 ? "add_bos_token" : "add_eos_token") +
                                       " is set but the token '" + *ends[k].second + "' is not in the vocab");
      }
      (k == 0 ? pp.prefix : pp.suffix).push_back(*id);
    }
    post_ = std::move(pp);
  }
  return Status::OK();
}

Status HfTokenizer::EncodeInto(std::string_view input, bool add_special_tokens, TokenSink* sink) const {
  const AlignedText root = text::MakeAlignedText(input, 0, sink->track());
  if (add_special_tokens) {
    for (int32_t id : post_.prefix) sink->Add(id, 0, 0);
  }
  thread_local std::vector<TextSection> sections;
  sections.clear();
  raw_splitter_.Split(root.text, added_, &sections);
  for (const TextSection& s : sections) {
    if (s.token >= 0) {
      const text::SrcRange r = root.SrcSpan(s.begin, s.end);
      sink->Add(added_[s.token].id, r.begin, r.end);
    } else {
      FT_RETURN_IF_ERROR(EncodeUnnormalized(root.Slice(s.begin, s.end), s.begin == 0, sink));
    }
  }
  if (add_special_tokens) {
    const auto end = static_cast<int64_t>(input.size());
    for (int32_t id : post_.suffix) sink->Add(id, end, end);
  }
  return Status::OK();
}

// A section of the input without raw-matched added tokens: normalize it, then
// cut out the normalized added tokens.
Status HfTokenizer::EncodeUnnormalized(AlignedText section, bool at_input_start, TokenSink* sink) const {
  if (normalizer_) FT_RETURN_IF_ERROR(normalizer_->Normalize(&section));
  if (normalized_splitter_.empty()) return EncodeWords(std::move(section), at_input_start, sink);
  std::vector<TextSection> parts;
  normalized_splitter_.Split(section.text, added_, &parts);
  for (const TextSection& s : parts) {
    if (s.token >= 0) {
      const text::SrcRange r = section.SrcSpan(s.begin, s.end);
      sink->Add(added_[s.token].id, r.begin, r.end);
    } else {
      FT_RETURN_IF_ERROR(EncodeWords(section.Slice(s.begin, s.end), at_input_start && s.begin == 0, sink));
    }
  }
  return Status::OK();
}

Status HfTokenizer::EncodeWords(AlignedText normalized, bool at_input_start, TokenSink* sink) const {
  if (normalized.text.empty()) return Status::OK();
  tok::PreTokenized p;
  p.pieces.emplace_back(0, normalized.text.size());
  p.text = std::move(normalized);
  p.at_input_start = at_input_start;
  if (pre_tokenizer_) FT_RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(&p));
  thread_local std::vector<BpeToken> tokens;
  const std::string_view s = p.text.text;
  for (auto [pb, pe] : p.pieces) {
    tokens.clear();
    model_->Encode(s.substr(pb, pe - pb), &tokens);
    size_t at = pb;
    for (const BpeToken& t : tokens) {
      if (sink->track()) {
        const text::SrcRange r = p.text.SrcSpan(at, at + t.len);
        sink->Add(t.id, r.begin, r.end);
      } else {
        sink->Add(t.id, 0, 0);
      }
      at += t.len;
    }
  }
  return Status::OK();
}

std::string HfTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens,
                                bool clean_up) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      const AddedToken& t = added_[added->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(t.content);
    } else if (const std::string* s = model_->IdToToken(id)) {
      tokens.push_back(*s);
    }  // ids outside the vocab are skipped, as HF does
  }
  std::string out;
  if (decoder_) {
    decoder_->DecodeChain(&tokens);
    for (const std::string& t : tokens) out += t;
  } else {  // HF joins with spaces when there is no decoder
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
  }
  return clean_up ? CleanUpTokenization(std::move(out)) : out;
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  return HfTokenizer::Load(path);
}

}  // namespace ft
