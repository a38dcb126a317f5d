// Tokenizer for Jinja template source, configured as Hugging Face configures
// jinja2 for chat templates: trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False, newlines normalised to "\n".
//
// Whitespace control follows jinja2's lexer: `{%-`/`{{-`/`{#-` strip all
// whitespace before the tag, `-%}`/`-}}`/`-#}` all whitespace after it;
// lstrip_blocks removes spaces/tabs between a line start and `{%`/`{#`
// (not `{{`, not `{%+`); trim_blocks removes one newline after `%}`/`#}`
// (not `+%}`). Comments vanish; `{% raw %}...{% endraw %}` becomes text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ft::jinja {

struct Token {
  enum class Type {
    kText,        // template data between tags
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,        // identifier or keyword
    kString,      // string literal, escapes resolved
    kInt,
    kFloat,
    kOp,  // operator or punctuation: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
    kEof,
  };
  Type type = Type::kEof;
  std::string text;  // kText/kName/kString/kOp contents
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;  // 1-based line in the template source
};

// Splits `source` into tokens. Errors are InvalidArgument "line N: ...".
StatusOr<std::vector<Token>> Lex(std::string_view source);

}  // namespace ft::jinja
