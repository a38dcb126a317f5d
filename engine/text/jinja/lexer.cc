#include "engine/text/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "engine/text/jinja/pystr.h"

namespace ft::jinja {

namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// True when `s` is non-empty and all Python whitespace.
bool AllSpace(std::string_view s) {
  if (s.empty()) return false;
  size_t pos = 0;
  while (pos < s.size()) {
    if (!IsPySpace(DecodeCodePoint(s, &pos))) return false;
  }
  return true;
}

// Index just past the Python whitespace starting at `pos`.
size_t SkipPySpace(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsPySpace(DecodeCodePoint(s, &next))) break;
    pos = next;
  }
  return pos;
}

std::string RStripPySpace(std::string_view s) { return PyStrip(s, std::nullopt, false, true); }

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();  // keep_trailing_newline=False
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      size_t tag = FindTag(pos_);
      if (tag == std::string::npos) {
        EmitText(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];
      const char sign =
          (tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')) ? src_[tag + 2] : 0;
      std::string text = src_.substr(pos_, tag - pos_);
      const size_t text_begin = pos_;
      ApplyLeftControl(&text, kind, sign);
      EmitText(std::move(text), text_begin);
      pos_ = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        FT_RETURN_IF_ERROR(SkipComment(tag));
      } else if (kind == '%' && IsRawBegin()) {
        FT_RETURN_IF_ERROR(LexRaw(tag));
      } else {
        FT_RETURN_IF_ERROR(LexTag(kind, tag));
      }
    }
    Token eof;
    eof.type = Token::Type::kEof;
    eof.line = LineAt(src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t p) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), p) - newlines_.begin());
  }

  Status Error(size_t p, const std::string& msg) const {
    return Status::InvalidArgument("line " + std::to_string(LineAt(p)) + ": " + msg);
  }

  size_t FindTag(size_t from) const {
    size_t t = from;
    while ((t = src_.find('{', t)) != std::string::npos) {
      if (t + 1 < src_.size() && (src_[t + 1] == '{' || src_[t + 1] == '%' || src_[t + 1] == '#')) return t;
      ++t;
    }
    return std::string::npos;
  }

  // `{%-` strips all whitespace before the tag; otherwise lstrip_blocks
  // removes the whitespace between a line start and a block/comment tag.
  void ApplyLeftControl(std::string* text, char kind, char sign) const {
    if (sign == '-') {
      *text = RStripPySpace(*text);
    } else if (sign != '+' && kind != '{') {
      const size_t nl = text->rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && AllSpace(std::string_view(*text).substr(l_pos)))
        text->resize(l_pos);
    }
  }

  void EmitText(std::string text, size_t at) {
    if (text.empty()) return;
    Token t;
    t.type = Token::Type::kText;
    t.text = std::move(text);
    t.line = LineAt(at);
    tokens_.push_back(std::move(t));
  }

  // After a tag's closing delimiter at `pos_`: '-' eats all whitespace,
  // '+' nothing, otherwise trim_blocks eats one newline (blocks/comments).
  void ApplyRightControl(char sign, bool trim_newline) {
    if (sign == '-') {
      pos_ = SkipPySpace(src_, pos_);
    } else if (sign != '+' && trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  Status SkipComment(size_t tag) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return Error(tag, "missing end of comment tag '#}'");
    char sign = 0;
    if (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    pos_ = end + 2;
    ApplyRightControl(sign, /*trim_newline=*/true);
    return Status::OK();
  }

  // At pos_ just after "{%" (and its sign): is this `raw %}`?
  bool IsRawBegin() const {
    size_t p = pos_;
    while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && IsNameChar(src_[p])) return false;
    while (p < src_.size() && IsAsciiSpace(src_[p])) ++p;
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  Status LexRaw(size_t tag) {
    // Close the raw-begin tag: "raw", optional '-', "%}" (no trim_blocks here, as in jinja2).
    size_t p = src_.find("%}", pos_);
    const bool minus = src_[p - 1] == '-';
    pos_ = p + 2;
    if (minus) pos_ = SkipPySpace(src_, pos_);
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
    // Find "{%[-+]? endraw [-+]?%}".
    size_t search = pos_;
    while (true) {
      const size_t t = src_.find("{%", search);
      if (t == std::string::npos) return Error(tag, "missing {% endraw %} for this {% raw %}");
      size_t q = t + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && IsAsciiSpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0 || (q + 6 < src_.size() && IsNameChar(src_[q + 6]))) {
        search = t + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && IsAsciiSpace(src_[q])) ++q;
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) return Error(t, "expected '%}' after endraw");
      std::string body = src_.substr(pos_, t - pos_);
      ApplyLeftControl(&body, '%', sign);
      EmitText(std::move(body), pos_);
      pos_ = q + 2;
      ApplyRightControl(end_sign, /*trim_newline=*/true);
      return Status::OK();
    }
  }

  Status LexTag(char kind, size_t tag) {
    Token begin;
    begin.type = kind == '{' ? Token::Type::kVarBegin : Token::Type::kBlockBegin;
    begin.line = LineAt(tag);
    tokens_.push_back(begin);
    std::vector<char> balance;
    while (true) {
      while (pos_ < src_.size() && IsAsciiSpace(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        return Error(tag, std::string("unexpected end of template: missing '") + (kind == '{' ? "}}" : "%}") +
                              "' for the tag opened here");
      }
      if (balance.empty() && CloseTag(kind)) return Status::OK();
      FT_RETURN_IF_ERROR(LexOne(&balance));
    }
  }

  // Recognises the end of the current tag at pos_; emits it.
  bool CloseTag(char kind) {
    const std::string_view end = kind == '{' ? "}}" : "%}";
    char sign = 0;
    size_t p = pos_;
    if (src_[p] == '-' || (src_[p] == '+' && kind == '%')) {
      sign = src_[p];
      ++p;
    }
    if (src_.compare(p, 2, end) != 0) return false;
    Token t;
    t.type = kind == '{' ? Token::Type::kVarEnd : Token::Type::kBlockEnd;
    t.line = LineAt(pos_);
    tokens_.push_back(t);
    pos_ = p + 2;
    ApplyRightControl(sign, /*trim_newline=*/kind == '%');
    return true;
  }

  Status LexOne(std::vector<char>* balance) {
    const size_t start = pos_;
    const char c = src_[pos_];
    Token t;
    t.line = LineAt(start);
    if (c == '\'' || c == '"') {
      FT_RETURN_IF_ERROR(LexString(&t));
    } else if (IsDigit(c)) {
      FT_RETURN_IF_ERROR(LexNumber(&t));
    } else if (IsNameStart(c)) {
      size_t p = pos_;
      while (p < src_.size() && IsNameChar(src_[p])) ++p;
      t.type = Token::Type::kName;
      t.text = src_.substr(pos_, p - pos_);
      pos_ = p;
    } else {
      static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
      t.type = Token::Type::kOp;
      for (std::string_view op : kTwo) {
        if (src_.compare(pos_, 2, op) == 0) t.text = op;
      }
      if (t.text.empty()) {
        if (std::string_view("+-*/%~<>=()[]{},.:|;").find(c) == std::string_view::npos) {
          return Error(start, std::string("unexpected character '") + c + "' in tag");
        }
        t.text = std::string(1, c);
      }
      pos_ += t.text.size();
      if (c == '(' || c == '[' || c == '{') {
        balance->push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
      } else if (c == ')' || c == ']' || c == '}') {
        if (balance->empty()) return Error(start, std::string("unexpected '") + c + "'");
        if (balance->back() != c) {
          return Error(start, std::string("unexpected '") + c + "', expected '" + balance->back() + "'");
        }
        balance->pop_back();
      }
    }
    tokens_.push_back(std::move(t));
    return Status::OK();
  }

  Status LexString(Token* t) {
    const size_t start = pos_;
    const char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) return Error(start, "unterminated string literal");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= src_.size()) return Error(start, "unterminated string literal");
      const char e = src_[pos_++];
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = pos_ + k < src_.size() ? src_[pos_ + k] : 0;
            int d = -1;
            if (h >= '0' && h <= '9') d = h - '0';
            if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
            if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
            if (d < 0) return Error(start, std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<uint32_t>(d);
          }
          if (cp > 0x10FFFF) return Error(start, "escape outside the Unicode range in string literal");
          pos_ += n;
          AppendUtf8(cp, &out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[pos_++] - '0');
            }
            AppendUtf8(cp, &out);
          } else {  // unknown escapes stay as written
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    t->type = Token::Type::kString;
    t->text = std::move(out);
    return Status::OK();
  }

  Status LexNumber(Token* t) {
    const size_t start = pos_;
    auto digits = [&](std::string* out) {
      while (pos_ < src_.size() && (IsDigit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                                            IsDigit(src_[pos_ + 1]) && !out->empty()))) {
        if (src_[pos_] != '_') out->push_back(src_[pos_]);
        ++pos_;
      }
    };
    std::string num;
    digits(&num);
    // jinja2 lexes no float right after a '.', so `foo.0.1` is foo[0][1].
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    bool is_float = false;
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && IsDigit(src_[pos_ + 1])) {
      ++pos_;
      num.push_back('.');
      digits(&num);
      is_float = true;
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && IsDigit(src_[p])) {
        num.push_back('e');
        num.append(src_, pos_ + 1, p - pos_ - 1);
        pos_ = p;
        digits(&num);
        is_float = true;
      }
    }
    if (is_float) {
      t->type = Token::Type::kFloat;
      t->float_value = std::strtod(num.c_str(), nullptr);
    } else {
      t->type = Token::Type::kInt;
      errno = 0;
      const long long v = std::strtoll(num.c_str(), nullptr, 10);
      if (errno == ERANGE) return Error(start, "integer literal " + num + " is too large");
      t->int_value = v;
    }
    t->text = num;
    return Status::OK();
  }

  std::string src_;
  std::vector<size_t> newlines_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

StatusOr<std::vector<Token>> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace ft::jinja
