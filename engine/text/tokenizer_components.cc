#include "engine/text/tokenizer_components.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "common/utf8.h"
#include "engine/text/tokenizer_regex.h"

namespace ft::tok {
namespace {

using nlohmann::json;
using text::AlignedText;
using text::SrcRange;

// ---- JSON field helpers --------------------------------------------------------

StatusOr<std::string> TypeOf(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return Status::InvalidArgument(where + " must be an object with a string \"type\"");
  }
  return j["type"].get<std::string>();
}

StatusOr<bool> BoolField(const json& j, const char* key, bool fallback, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Status::InvalidArgument(where + "." + key + " must be a boolean");
  return it->get<bool>();
}

StatusOr<std::string> StringField(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return Status::InvalidArgument(where + "." + key + " must be a string");
  }
  return it->get<std::string>();
}

StatusOr<int64_t> IntField(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    return Status::InvalidArgument(where + "." + key + " must be a non-negative integer");
  }
  return it->get<int64_t>();
}

StatusOr<const json*> ArrayField(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) {
    return Status::InvalidArgument(where + "." + key + " must be an array");
  }
  return &*it;
}

// A pattern object: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;                    // used when regex is null
  std::unique_ptr<TokenizerRegex> regex;  // set for {"Regex": ...}

  // Errors: a regex's work ran out on `s` (TokenizerRegex::FindAll).
  Status FindAll(std::string_view s, std::vector<std::pair<size_t, size_t>>* out) const {
    if (regex) return regex->FindAll(s, out);
    if (literal.empty()) return Status::OK();
    for (size_t at = s.find(literal); at != std::string_view::npos;
         at = s.find(literal, at + literal.size())) {
      out->emplace_back(at, at + literal.size());
    }
    return Status::OK();
  }
};

StatusOr<Pattern> PatternField(const json& j, const std::string& where) {
  auto it = j.find("pattern");
  Pattern p;
  if (it != j.end() && it->is_object() && it->contains("String") && (*it)["String"].is_string()) {
    p.literal = (*it)["String"].get<std::string>();
    return p;
  }
  if (it != j.end() && it->is_object() && it->contains("Regex") && (*it)["Regex"].is_string()) {
    auto re =
        TokenizerRegex::Compile((*it)["Regex"].get<std::string>(), /*literal=*/false, where + ".pattern");
    if (!re.ok()) return re.status().WithContext(where + ".pattern");
    p.regex = std::move(re).value();
    return p;
  }
  return Status::InvalidArgument(where + ".pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

// A one-character string field (Metaspace replacement, Strip content).
StatusOr<std::string> CharField(const json& j, const char* key, const std::string& where) {
  FT_ASSIGN_OR_RETURN(std::string s, StringField(j, key, where));
  if (s.empty() || static_cast<size_t>(text::Utf8SeqLength(static_cast<uint8_t>(s[0]))) != s.size()) {
    return Status::InvalidArgument(where + "." + key + " must be a single character, not '" + s + "'");
  }
  return s;
}

enum class Prepend { kAlways, kFirst, kNever };

// Metaspace's prepend_scheme, or the older add_prefix_space boolean.
StatusOr<Prepend> PrependSchemeField(const json& j, const std::string& where) {
  Prepend scheme = Prepend::kAlways;
  auto it = j.find("prepend_scheme");
  if (it != j.end() && !it->is_null()) {
    const std::string s = it->is_string() ? it->get<std::string>() : "";
    if (s == "always") {
      scheme = Prepend::kAlways;
    } else if (s == "first") {
      scheme = Prepend::kFirst;
    } else if (s == "never") {
      scheme = Prepend::kNever;
    } else {
      return Status::InvalidArgument(where + ".prepend_scheme must be \"always\", \"first\" or \"never\"");
    }
  }
  FT_ASSIGN_OR_RETURN(bool add_prefix_space, BoolField(j, "add_prefix_space", true, where));
  if (!add_prefix_space) scheme = Prepend::kNever;
  return scheme;
}

// ---- normalizers ------------------------------------------------------------------

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(text::NormForm form) : form_(form) {}
  Status Normalize(AlignedText* t) const override {
    text::Normalize(form_, t);
    return Status::OK();
  }

 private:
  text::NormForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  Status Normalize(AlignedText* t) const override {
    text::Lowercase(t);
    return Status::OK();
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Normalize(AlignedText* t) const override {
    size_t b = 0, e = t->text.size();
    while (left_ && b < e) {
      size_t i = b;
      if (!text::IsWhiteSpace(text::NextCodePoint(t->text, &i))) break;
      b = i;
    }
    while (right_ && e > b) {
      const size_t start = Utf8CharStart(t->text, e - 1, b);
      size_t i = start;
      if (!text::IsWhiteSpace(text::NextCodePoint(t->text, &i))) break;
      e = start;
    }
    if (b != 0 || e != t->text.size()) *t = t->Slice(b, e);
    return Status::OK();
  }

 private:
  bool left_, right_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  Status Normalize(AlignedText* t) const override {
    if (t->text.empty()) return Status::OK();
    AlignedText out;
    out.track = t->track;
    const int64_t at = t->Src(0).begin;  // prepended text sits before the first character
    out.AppendWithSrc(prepend_, SrcRange{at, at});
    out.AppendFrom(*t, 0, t->text.size());
    *t = std::move(out);
    return Status::OK();
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status Normalize(AlignedText* t) const override {
    thread_local std::vector<std::pair<size_t, size_t>> matches;
    matches.clear();
    FT_RETURN_IF_ERROR(pattern_.FindAll(t->text, &matches));
    if (matches.empty()) return Status::OK();
    AlignedText out;
    out.track = t->track;
    out.text.reserve(t->text.size() + matches.size() * content_.size());
    size_t prev = 0;
    for (auto [b, e] : matches) {
      out.AppendFrom(*t, prev, b);
      out.AppendWithSrc(content_, t->SrcSpan(b, e));
      prev = e;
    }
    out.AppendFrom(*t, prev, t->text.size());
    *t = std::move(out);
    return Status::OK();
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  Status Normalize(AlignedText* t) const override {
    for (const auto& p : parts_) FT_RETURN_IF_ERROR(p->Normalize(t));
    return Status::OK();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---- pre-tokenizers -------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits piece [pb, pe) of `text` at `matches` (relative to pb) the way HF's
// NormalizedString::split does for `behavior`, appending the resulting
// non-empty pieces.
void SplitPiece(size_t pb, size_t pe, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
                SplitBehavior behavior, std::vector<std::pair<size_t, size_t>>* out) {
  struct Span {
    size_t b, e;
    bool is_match;
  };
  thread_local std::vector<Span> spans;
  spans.clear();
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev < b) spans.push_back({pb + prev, pb + b, invert});
    spans.push_back({pb + b, pb + e, !invert});
    prev = e;
  }
  if (pb + prev < pe) spans.push_back({pb + prev, pe, invert});

  thread_local std::vector<std::pair<size_t, size_t>> merged;
  merged.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) merged.emplace_back(s.b, s.e);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) merged.emplace_back(s.b, s.e);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().second = s.e;
        } else {
          merged.emplace_back(s.b, s.e);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().first = s.b;
        } else {
          merged.emplace_back(s.b, s.e);
        }
        previous_match = s.is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t k = 0; k < spans.size(); ++k) {
        const Span& s = spans[k];
        if (k > 0 && s.is_match == previous_match) {
          merged.back().second = s.e;
        } else {
          merged.emplace_back(s.b, s.e);
        }
        previous_match = s.is_match;
      }
      break;
  }
  for (auto piece : merged) {
    if (piece.second > piece.first) out->push_back(piece);
  }
}

// Splits every piece of `p` at the matches of `pattern`. Errors: Pattern::FindAll's.
Status SplitAll(PreTokenized* p, const Pattern& pattern, bool invert, SplitBehavior behavior) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(p->pieces.size() * 4);
  const std::string_view s = p->text.text;
  for (auto [pb, pe] : p->pieces) {
    matches.clear();
    FT_RETURN_IF_ERROR(pattern.FindAll(s.substr(pb, pe - pb), &matches));
    SplitPiece(pb, pe, matches, invert, behavior, &out);
  }
  p->pieces = std::move(out);
  return Status::OK();
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, bool invert, SplitBehavior behavior)
      : pattern_(std::move(pattern)), invert_(invert), behavior_(behavior) {}
  Status PreTokenize(PreTokenized* p) const override { return SplitAll(p, pattern_, invert_, behavior_); }

 private:
  Pattern pattern_;
  bool invert_;
  SplitBehavior behavior_;
};

// Rebuilds p->text piece by piece through `edit`, which appends a piece's new
// bytes to the output text and returns nothing; pieces keep their order.
template <typename Edit>
void RewritePieces(PreTokenized* p, Edit edit) {
  AlignedText out;
  out.track = p->text.track;
  out.text.reserve(p->text.text.size() + p->pieces.size() * 3);
  std::vector<std::pair<size_t, size_t>> pieces;
  pieces.reserve(p->pieces.size());
  for (size_t k = 0; k < p->pieces.size(); ++k) {
    const size_t begin = out.text.size();
    edit(k, p->pieces[k].first, p->pieces[k].second, &out);
    if (out.text.size() > begin) pieces.emplace_back(begin, out.text.size());
  }
  p->text = std::move(out);
  p->pieces = std::move(pieces);
}

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) {
      // GPT-2's pattern; compiling a fixed pattern cannot fail.
      auto re = TokenizerRegex::Compile(
          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", false,
          where + " (ByteLevel's GPT-2 pattern)");
      FT_CHECK(re.ok());
      pattern_.regex = std::move(re).value();
    }
  }
  Status PreTokenize(PreTokenized* p) const override {
    // Bytes stay raw bytes here: the BPE model reads them through the GPT-2 map.
    if (add_prefix_space_) {
      RewritePieces(p, [&](size_t, size_t b, size_t e, AlignedText* out) {
        if (p->text.text[b] != ' ') {
          const int64_t at = p->text.Src(b).begin;
          out->AppendWithSrc(" ", SrcRange{at, at});
        }
        out->AppendFrom(p->text, b, e);
      });
    }
    if (pattern_.regex) return SplitAll(p, pattern_, false, SplitBehavior::kIsolated);
    return Status::OK();
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  Pattern pattern_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, Prepend scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    pattern_.literal = replacement_;
  }
  Status PreTokenize(PreTokenized* p) const override {
    RewritePieces(p, [&](size_t k, size_t b, size_t e, AlignedText* out) {
      const std::string_view piece = std::string_view(p->text.text).substr(b, e - b);
      // Spaces become the replacement first, so a leading space counts as the prefix.
      const bool has_prefix = piece.front() == ' ' || piece.substr(0, replacement_.size()) == replacement_;
      const bool first = k == 0 && p->at_input_start;
      if (!has_prefix && (scheme_ == Prepend::kAlways || (scheme_ == Prepend::kFirst && first))) {
        const int64_t at = p->text.Src(b).begin;
        out->AppendWithSrc(replacement_, SrcRange{at, at});
      }
      for (size_t i = b; i < e; ++i) {
        if (p->text.text[i] == ' ') {
          out->AppendWithSrc(replacement_, p->text.Src(i));
        } else {
          out->AppendFrom(p->text, i, i + 1);
        }
      }
    });
    if (split_) return SplitAll(p, pattern_, false, SplitBehavior::kMergedWithNext);
    return Status::OK();
  }

 private:
  std::string replacement_;
  Prepend scheme_;
  bool split_;
  Pattern pattern_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  Status PreTokenize(PreTokenized* p) const override {
    for (const auto& part : parts_) FT_RETURN_IF_ERROR(part->PreTokenize(p));
    return Status::OK();
  }
  bool byte_level() const override { return !parts_.empty() && parts_.back()->byte_level(); }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// ---- decoders -----------------------------------------------------------------------------

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    // Each token maps back to bytes through the GPT-2 map; a token with a
    // character outside the map (an added token, say) contributes its UTF-8.
    std::string bytes, token_bytes;
    for (const std::string& t : *tokens) {
      if (text::ByteLevelToBytes(t, &token_bytes)) {
        bytes += token_bytes;
      } else {
        bytes += t;
      }
    }
    tokens->assign(1, text::Utf8Lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for (std::string& t : *tokens) {
      matches.clear();
      if (Status s = pattern_.FindAll(t, &matches); !s.ok()) {
        // Decoding is output, never training input: the token is kept as it is, loudly.
        FT_LOG(ERROR) << s.message() << " (decoding: the token is left unreplaced)";
        continue;
      }
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (auto [b, e] : matches) {
        out.append(t, prev, b - prev);
        out += content_;
        prev = e;
      }
      out.append(t, prev);
      t = std::move(out);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Parses "<0xXX>" into its byte value, or -1.
int ByteFallbackValue(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string bytes;
    size_t byte_count = 0;
    auto flush = [&] {
      if (byte_count == 0) return;
      // As HF: bytes that do not form valid UTF-8 become one U+FFFD each.
      if (text::IsValidUtf8(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t k = 0; k < byte_count; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
      byte_count = 0;
    };
    for (std::string& t : *tokens) {
      const int b = ByteFallbackValue(t);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
        ++byte_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const std::string& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && b < e && t.compare(b, content_.size(), content_) == 0; ++k) {
        b += content_.size();
      }
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k) {
        e -= content_.size();
      }
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t k = 0; k < tokens->size(); ++k) {
      std::string& t = (*tokens)[k];
      std::string out;
      for (size_t at = 0; at < t.size();) {
        if (t.compare(at, replacement_.size(), replacement_) == 0) {
          // HF drops the replacement characters of the first token (its prefix space).
          if (!(k == 0 && strip_first_)) out.push_back(' ');
          at += replacement_.size();
        } else {
          out.push_back(t[at++]);
        }
      }
      t = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts_) p->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

template <typename T>
StatusOr<std::vector<std::unique_ptr<T>>> ParseList(
    const json& j, const char* key, const std::string& where,
    StatusOr<std::unique_ptr<T>> (*parse)(const json&, const std::string&)) {
  FT_ASSIGN_OR_RETURN(const json* list, ArrayField(j, key, where));
  std::vector<std::unique_ptr<T>> parts;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string at = where + "." + key + "[" + std::to_string(i) + "]";
    if ((*list)[i].is_null()) return Status::InvalidArgument(at + " is null");
    FT_ASSIGN_OR_RETURN(auto part, parse((*list)[i], at));
    parts.push_back(std::move(part));
  }
  return parts;
}

Status UnsupportedType(const std::string& where, const std::string& type, const char* supported) {
  return Status::Unimplemented(where + ".type \"" + type + "\" is not supported (supported: " + supported +
                               ")");
}

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& j, const std::string& where) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  FT_ASSIGN_OR_RETURN(std::string type, TypeOf(j, where));
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(text::NormForm::kNFC));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(text::NormForm::kNFD));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(text::NormForm::kNFKC));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(text::NormForm::kNFKD));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Strip") {
    FT_ASSIGN_OR_RETURN(bool left, BoolField(j, "strip_left", true, where));
    FT_ASSIGN_OR_RETURN(bool right, BoolField(j, "strip_right", true, where));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "Prepend") {
    FT_ASSIGN_OR_RETURN(std::string prepend, StringField(j, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prepend)));
  }
  if (type == "Replace") {
    FT_ASSIGN_OR_RETURN(Pattern pattern, PatternField(j, where));
    FT_ASSIGN_OR_RETURN(std::string content, StringField(j, "content", where));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), std::move(content)));
  }
  if (type == "Sequence") {
    FT_ASSIGN_OR_RETURN(auto parts, ParseList<Normalizer>(j, "normalizers", where, &ParseNormalizer));
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  return UnsupportedType(where, type, "NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, Sequence");
}

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  FT_ASSIGN_OR_RETURN(std::string type, TypeOf(j, where));
  if (type == "Split") {
    FT_ASSIGN_OR_RETURN(Pattern pattern, PatternField(j, where));
    FT_ASSIGN_OR_RETURN(bool invert, BoolField(j, "invert", false, where));
    FT_ASSIGN_OR_RETURN(std::string behavior, StringField(j, "behavior", where));
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    for (const auto& [name, b] : kBehaviors) {
      if (behavior == name) {
        return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(pattern), invert, b));
      }
    }
    return Status::InvalidArgument(
        where + ".behavior \"" + behavior +
        "\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
  }
  if (type == "ByteLevel") {
    FT_ASSIGN_OR_RETURN(bool add_prefix_space, BoolField(j, "add_prefix_space", true, where));
    FT_ASSIGN_OR_RETURN(bool use_regex, BoolField(j, "use_regex", true, where));
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, use_regex, where));
  }
  if (type == "Metaspace") {
    FT_ASSIGN_OR_RETURN(std::string replacement, CharField(j, "replacement", where));
    FT_ASSIGN_OR_RETURN(Prepend scheme, PrependSchemeField(j, where));
    FT_ASSIGN_OR_RETURN(bool split, BoolField(j, "split", true, where));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(std::move(replacement), scheme, split));
  }
  if (type == "Sequence") {
    FT_ASSIGN_OR_RETURN(auto parts, ParseList<PreTokenizer>(j, "pretokenizers", where, &ParsePreTokenizer));
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i]->byte_level()) {
        return Status::Unimplemented(where + ".pretokenizers[" + std::to_string(i) +
                                     "]: ByteLevel is supported only as the last pre-tokenizer");
      }
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  return UnsupportedType(where, type, "Split, ByteLevel, Metaspace, Sequence");
}

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& j, const std::string& where) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  FT_ASSIGN_OR_RETURN(std::string type, TypeOf(j, where));
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Replace") {
    FT_ASSIGN_OR_RETURN(Pattern pattern, PatternField(j, where));
    FT_ASSIGN_OR_RETURN(std::string content, StringField(j, "content", where));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), std::move(content)));
  }
  if (type == "Strip") {
    FT_ASSIGN_OR_RETURN(std::string content, CharField(j, "content", where));
    FT_ASSIGN_OR_RETURN(int64_t start, IntField(j, "start", where));
    FT_ASSIGN_OR_RETURN(int64_t stop, IntField(j, "stop", where));
    return std::unique_ptr<Decoder>(new StripDecoder(std::move(content), start, stop));
  }
  if (type == "Metaspace") {
    FT_ASSIGN_OR_RETURN(std::string replacement, CharField(j, "replacement", where));
    FT_ASSIGN_OR_RETURN(Prepend scheme, PrependSchemeField(j, where));
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(replacement), scheme != Prepend::kNever));
  }
  if (type == "Sequence") {
    FT_ASSIGN_OR_RETURN(auto parts, ParseList<Decoder>(j, "decoders", where, &ParseDecoder));
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  return UnsupportedType(where, type, "ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence");
}

namespace {

// TemplateProcessing's "single" template: special-token ids before and after $A.
StatusOr<PostProcessor> ParseTemplate(const json& j, const std::string& where) {
  FT_ASSIGN_OR_RETURN(const json* single, ArrayField(j, "single", where));
  auto specials = j.find("special_tokens");
  PostProcessor pp;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string at = where + ".single[" + std::to_string(i) + "]";
    if (item.is_object() && item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
        !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
      return Status::InvalidArgument(at +
                                     " must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    if (specials == j.end() || !specials->is_object() || !specials->contains(name) ||
        !(*specials)[name].contains("ids") || !(*specials)[name]["ids"].is_array()) {
      return Status::InvalidArgument(at + ": special token '" + name + "' has no entry with \"ids\" in " +
                                     where + ".special_tokens");
    }
    for (const json& id : (*specials)[name]["ids"]) {
      if (!id.is_number_integer()) {
        return Status::InvalidArgument(where + ".special_tokens['" + name + "'].ids must be integers");
      }
      (seen_sequence ? pp.suffix : pp.prefix).push_back(id.get<int32_t>());
    }
  }
  if (!seen_sequence) {
    return Status::InvalidArgument(where + ".single has no {\"Sequence\": {\"id\": \"A\"}} item");
  }
  return pp;
}

// RobertaProcessing / BertProcessing: "cls": [token, id], "sep": [token, id].
StatusOr<int32_t> TokenPairId(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
    return Status::InvalidArgument(where + "." + key + " must be [token, id]");
  }
  return (*it)[1].get<int32_t>();
}

}  // namespace

StatusOr<PostProcessor> ParsePostProcessor(const json& j, const std::string& where) {
  if (j.is_null()) return PostProcessor{};
  FT_ASSIGN_OR_RETURN(std::string type, TypeOf(j, where));
  if (type == "ByteLevel") return PostProcessor{};  // only trims offsets
  if (type == "TemplateProcessing") return ParseTemplate(j, where);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    FT_ASSIGN_OR_RETURN(int32_t cls, TokenPairId(j, "cls", where));
    FT_ASSIGN_OR_RETURN(int32_t sep, TokenPairId(j, "sep", where));
    return PostProcessor{{cls}, {sep}};
  }
  if (type == "Sequence") {
    FT_ASSIGN_OR_RETURN(const json* list, ArrayField(j, "processors", where));
    PostProcessor all;
    for (size_t i = 0; i < list->size(); ++i) {
      FT_ASSIGN_OR_RETURN(PostProcessor p,
                          ParsePostProcessor((*list)[i], where + ".processors[" + std::to_string(i) + "]"));
      // Each processor wraps what the previous ones produced.
      all.prefix.insert(all.prefix.begin(), p.prefix.begin(), p.prefix.end());
      all.suffix.insert(all.suffix.end(), p.suffix.begin(), p.suffix.end());
    }
    return all;
  }
  return UnsupportedType(where, type,
                         "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence");
}

}  // namespace ft::tok
