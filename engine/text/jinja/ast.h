// Syntax tree of a parsed Jinja template (engine/text/jinja/parser.h builds it,
// engine/text/jinja/interpreter.h walks it). Plain data: one struct per layer
// (expressions, statements) with a kind tag; every node keeps its 1-based
// source line for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/jinja/value.h"

namespace ft::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Kwarg {
  std::string name;
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // [items...]
    kTuple,    // (items...)
    kDict,     // {keys[i]: items[i]}
    kGetAttr,  // target.name
    kGetItem,  // target[items[0]]
    kSlice,    // target[slice[0]:slice[1]:slice[2]] (null parts are omitted)
    kCall,     // target(items..., kwargs...)
    kFilter,   // target | name(items..., kwargs...); target is null in {% filter %}/{% set %} blocks
    kTest,     // target is [not] name(items...)
    kNeg,      // -target
    kPos,      // +target
    kNot,      // not target
    kBinary,   // items[0] name items[1], name one of + - * / // % ** ~
    kAnd,      // items[0] and items[1]
    kOr,       // items[0] or items[1]
    kCompare,  // items[0] ops[0] items[1] ops[1] items[2] ... (==, !=, <, <=, >, >=, in, notin)
    kCond,     // items[0] if items[1] else items[2] (items[2] null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  int height = 1;  // 1 + the tallest child's height (the parser bounds it)
  Value value;
  std::string name;
  bool negate = false;
  ExprPtr target;
  std::vector<ExprPtr> items;
  std::vector<ExprPtr> keys;
  std::vector<Kwarg> kwargs;
  std::vector<std::string> ops;
  ExprPtr slice[3];
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] -> bodies[i]; an extra trailing body is the else
    kFor,          // for targets in expr [if loop_filter]: body [else else_body]
    kSet,          // set targets = expr; or set targets[0].attr = expr (attr non-empty)
    kSetBlock,     // set targets[0] [| expr filter chain] %} body {% endset
    kMacro,        // macro name(params) body
    kCallBlock,    // call(params) expr: body is `caller()`
    kFilterBlock,  // filter expr (filter chain with a null innermost target): body
    kWith,         // with names = values: body
    kBlock,        // a block rendered as is ({% generation %})
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<ExprPtr> conds;
  std::vector<NodeList> bodies;
  std::vector<std::string> targets;
  std::string attr;
  ExprPtr loop_filter;
  NodeList body;
  NodeList else_body;
  std::string name;
  std::vector<MacroParam> params;
  std::vector<std::pair<std::string, ExprPtr>> assignments;  // kWith
};

}  // namespace ft::jinja
