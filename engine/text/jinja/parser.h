// Parser from tokens (engine/text/jinja/lexer.h) to a syntax tree
// (engine/text/jinja/ast.h), following jinja2's grammar and operator precedence
// (lowest first): `x if c else y`, or, and, not, comparisons and `in`, + -,
// ~, * / // %, **, unary - +, then postfix `.attr` `[i]` `[a:b:c]` `(args)`,
// `| filter` and `is test`.
//
// Statements: if/elif/else, for (tuple targets, `if` filter, else), set
// (name, tuple, ns.attr, block form with filters), macro, call, filter,
// with, break/continue (loopcontrols), generation (Hugging Face's tag,
// rendered as plain content). include/extends/block/import are refused, as
// are `*args`/`**kwargs` in calls and recursive loops.
#pragma once

#include <vector>

#include "common/status.h"
#include "engine/text/jinja/ast.h"
#include "engine/text/jinja/lexer.h"

namespace ft::jinja {

// Errors are InvalidArgument "line N: ..." naming what was expected.
StatusOr<NodeList> Parse(const std::vector<Token>& tokens);

}  // namespace ft::jinja
