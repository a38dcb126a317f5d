#include "engine/text/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

namespace ft::jinja {

namespace {

using TT = Token::Type;

ExprPtr NewExpr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

NodePtr NewNode(Node::Kind kind, int line) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

std::string Describe(const Token& t) {
  switch (t.type) {
    case TT::kText: return "template text";
    case TT::kVarBegin: return "'{{'";
    case TT::kVarEnd: return "'}}'";
    case TT::kBlockBegin: return "'{%'";
    case TT::kBlockEnd: return "'%}'";
    case TT::kName: return "'" + t.text + "'";
    case TT::kString: return "a string";
    case TT::kInt:
    case TT::kFloat: return "number " + t.text;
    case TT::kOp: return "'" + t.text + "'";
    case TT::kEof: return "end of template";
  }
  return "?";
}

constexpr int kMaxNesting = 200;  // nested expressions/blocks; deeper templates are refused

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  StatusOr<NodeList> Run() {
    NodeList out;
    std::string which;
    FT_RETURN_IF_ERROR(ParseBody({}, &out, &which, 0, ""));
    return out;
  }

 private:
  // Counts recursion depth for the lifetime of a parse function.
  class Nest {
   public:
    explicit Nest(int* depth) : depth_(depth) { ++*depth_; }
    ~Nest() { --*depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    int* depth_;
  };
  Status TooDeep() const {
    return Error("template nested more than " + std::to_string(kMaxNesting) + " levels deep");
  }
  // Sets e->height from its children's. Chains (`a.b.c...`, `x|f|g...`,
  // `1+1+...`) grow a tree without recursing in the parser, so every node
  // that takes children passes here: a tree taller than kMaxNesting is
  // refused before evaluating or freeing it could exhaust the stack.
  Status Seal(Expr* e) const {
    int tallest = 0;
    auto see = [&](const ExprPtr& c) {
      if (c) tallest = std::max(tallest, c->height);
    };
    see(e->target);
    for (const ExprPtr& c : e->items) see(c);
    for (const ExprPtr& c : e->keys) see(c);
    for (const Kwarg& k : e->kwargs) see(k.value);
    for (const ExprPtr& c : e->slice) see(c);
    e->height = tallest + 1;
    if (e->height > kMaxNesting) {
      return Error("expression nested more than " + std::to_string(kMaxNesting) + " levels deep");
    }
    return Status::OK();
  }

  const Token& Cur() const { return t_[p_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool IsOp(std::string_view op) const { return Cur().type == TT::kOp && Cur().text == op; }
  bool IsName(std::string_view n) const { return Cur().type == TT::kName && Cur().text == n; }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    ++p_;
    return true;
  }
  bool SkipName(std::string_view n) {
    if (!IsName(n)) return false;
    ++p_;
    return true;
  }

  Status Error(const std::string& msg) const {
    return Status::InvalidArgument("line " + std::to_string(Cur().line) + ": " + msg + " (found " +
                                   Describe(Cur()) + ")");
  }
  Status ExpectOp(std::string_view op) {
    if (SkipOp(op)) return Status::OK();
    return Error("expected '" + std::string(op) + "'");
  }
  Status ExpectBlockEnd(std::string_view what) {
    if (Cur().type == TT::kBlockEnd) {
      ++p_;
      return Status::OK();
    }
    return Error("expected '%}' to end " + std::string(what));
  }
  StatusOr<std::string> ExpectName(std::string_view what) {
    if (Cur().type != TT::kName) return Error("expected " + std::string(what));
    return t_[p_++].text;
  }

  // Parses nodes until `{% <one of ends>`, consumed up to and including the
  // end name (returned in *which); at top level (no ends) until EOF.
  Status ParseBody(std::initializer_list<std::string_view> ends, NodeList* out, std::string* which,
                   int open_line, std::string_view opener) {
    while (true) {
      const Token& tok = Cur();
      switch (tok.type) {
        case TT::kEof: {
          if (ends.size() == 0) return Status::OK();
          std::string expected;
          for (std::string_view e : ends)
            expected += (expected.empty() ? "" : " or ") + ("{% " + std::string(e) + " %}");
          return Status::InvalidArgument("line " + std::to_string(open_line) + ": '{% " +
                                         std::string(opener) + " %}' is never closed: expected " + expected +
                                         " before the end of the template");
        }
        case TT::kText: {
          auto n = NewNode(Node::Kind::kText, tok.line);
          n->text = tok.text;
          out->push_back(std::move(n));
          ++p_;
          break;
        }
        case TT::kVarBegin: {
          auto n = NewNode(Node::Kind::kOutput, tok.line);
          ++p_;
          FT_ASSIGN_OR_RETURN(n->expr, ParseTuple(/*with_condexpr=*/true, /*explicit_parens=*/false));
          if (Cur().type != TT::kVarEnd) return Error("expected '}}' to end the expression");
          ++p_;
          out->push_back(std::move(n));
          break;
        }
        case TT::kBlockBegin: {
          const Token& name = Peek();
          if (name.type == TT::kName &&
              std::find(ends.begin(), ends.end(), std::string_view(name.text)) != ends.end()) {
            *which = name.text;
            p_ += 2;
            return Status::OK();
          }
          ++p_;
          FT_ASSIGN_OR_RETURN(NodePtr n, ParseStatement());
          out->push_back(std::move(n));
          break;
        }
        default: return Error("unexpected token");
      }
    }
  }

  StatusOr<NodePtr> ParseStatement() {
    Nest nest(&depth_);
    if (depth_ > kMaxNesting) return TooDeep();
    if (Cur().type != TT::kName) return Error("expected a statement name after '{%'");
    const std::string name = Cur().text;
    const int line = Cur().line;
    ++p_;
    if (name == "if") return ParseIf(line);
    if (name == "for") return ParseFor(line);
    if (name == "set") return ParseSet(line);
    if (name == "macro") return ParseMacro(line);
    if (name == "call") return ParseCallBlock(line);
    if (name == "filter") return ParseFilterBlock(line);
    if (name == "with") return ParseWith(line);
    if (name == "generation") return ParseGeneration(line);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) {
        return Status::InvalidArgument("line " + std::to_string(line) + ": '{% " + name +
                                       " %}' outside a for loop");
      }
      FT_RETURN_IF_ERROR(ExpectBlockEnd("'" + name + "'"));
      return NewNode(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, line);
    }
    static constexpr std::string_view kUnsupported[] = {"include", "extends", "block",      "import",
                                                        "from",    "do",      "autoescape", "trans"};
    if (std::find(std::begin(kUnsupported), std::end(kUnsupported), name) != std::end(kUnsupported)) {
      return Status::InvalidArgument("line " + std::to_string(line) + ": '{% " + name +
                                     " %}' is not supported in chat templates");
    }
    if (name.rfind("end", 0) == 0 || name == "else" || name == "elif") {
      return Status::InvalidArgument("line " + std::to_string(line) + ": unexpected '{% " + name +
                                     " %}': no open block expects it here");
    }
    return Status::InvalidArgument("line " + std::to_string(line) + ": unknown statement '{% " + name +
                                   " %}'");
  }

  StatusOr<NodePtr> ParseIf(int line) {
    auto n = NewNode(Node::Kind::kIf, line);
    FT_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(/*with_condexpr=*/false, false));
    FT_RETURN_IF_ERROR(ExpectBlockEnd("the 'if' condition"));
    while (true) {
      NodeList body;
      std::string which;
      FT_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &which, line, "if"));
      n->conds.push_back(std::move(cond));
      n->bodies.push_back(std::move(body));
      if (which == "elif") {
        FT_ASSIGN_OR_RETURN(cond, ParseTuple(false, false));
        FT_RETURN_IF_ERROR(ExpectBlockEnd("the 'elif' condition"));
        continue;
      }
      FT_RETURN_IF_ERROR(ExpectBlockEnd("'" + which + "'"));
      if (which == "else") {
        NodeList else_body;
        FT_RETURN_IF_ERROR(ParseBody({"endif"}, &else_body, &which, line, "if"));
        FT_RETURN_IF_ERROR(ExpectBlockEnd("'endif'"));
        n->bodies.push_back(std::move(else_body));
      }
      return n;
    }
  }

  // name | name, name | (name, name)
  StatusOr<std::vector<std::string>> ParseAssignNames() {
    std::vector<std::string> names;
    const bool paren = SkipOp("(");
    while (true) {
      FT_ASSIGN_OR_RETURN(std::string name, ExpectName("a variable name"));
      names.push_back(std::move(name));
      if (!SkipOp(",")) break;
      if (Cur().type != TT::kName) break;  // trailing comma
    }
    if (paren) FT_RETURN_IF_ERROR(ExpectOp(")"));
    return names;
  }

  StatusOr<NodePtr> ParseFor(int line) {
    auto n = NewNode(Node::Kind::kFor, line);
    FT_ASSIGN_OR_RETURN(n->targets, ParseAssignNames());
    if (!SkipName("in")) return Error("expected 'in' after the loop variable");
    FT_ASSIGN_OR_RETURN(n->expr, ParseTuple(/*with_condexpr=*/false, false));
    if (SkipName("if")) {
      FT_ASSIGN_OR_RETURN(n->loop_filter, ParseExpression(true));
    }
    if (IsName("recursive")) return Error("recursive for loops are not supported");
    FT_RETURN_IF_ERROR(ExpectBlockEnd("the 'for' header"));
    std::string which;
    ++loop_depth_;
    Status st = ParseBody({"endfor", "else"}, &n->body, &which, line, "for");
    --loop_depth_;
    FT_RETURN_IF_ERROR(st);
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'" + which + "'"));
    if (which == "else") {
      FT_RETURN_IF_ERROR(ParseBody({"endfor"}, &n->else_body, &which, line, "for"));
      FT_RETURN_IF_ERROR(ExpectBlockEnd("'endfor'"));
    }
    return n;
  }

  StatusOr<NodePtr> ParseSet(int line) {
    if (Cur().type == TT::kName && Peek().type == TT::kOp && Peek().text == "." &&
        Peek(2).type == TT::kName) {
      auto n = NewNode(Node::Kind::kSet, line);
      n->targets.push_back(Cur().text);
      n->attr = Peek(2).text;
      p_ += 3;
      FT_RETURN_IF_ERROR(ExpectOp("="));
      FT_ASSIGN_OR_RETURN(n->expr, ParseTuple(true, false));
      FT_RETURN_IF_ERROR(ExpectBlockEnd("'set'"));
      return n;
    }
    FT_ASSIGN_OR_RETURN(std::vector<std::string> names, ParseAssignNames());
    if (SkipOp("=")) {
      auto n = NewNode(Node::Kind::kSet, line);
      n->targets = std::move(names);
      FT_ASSIGN_OR_RETURN(n->expr, ParseTuple(true, false));
      FT_RETURN_IF_ERROR(ExpectBlockEnd("'set'"));
      return n;
    }
    if (names.size() != 1) return Error("a block '{% set %}' assigns exactly one name");
    auto n = NewNode(Node::Kind::kSetBlock, line);
    n->targets = std::move(names);
    if (SkipOp("|")) {
      FT_ASSIGN_OR_RETURN(n->expr, ParseFilterChain(nullptr, /*start_inline=*/true));
    }
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'set'"));
    std::string which;
    FT_RETURN_IF_ERROR(ParseBody({"endset"}, &n->body, &which, line, "set"));
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'endset'"));
    return n;
  }

  Status ParseParams(std::vector<MacroParam>* params) {
    FT_RETURN_IF_ERROR(ExpectOp("("));
    bool seen_default = false;
    while (!IsOp(")")) {
      if (!params->empty()) FT_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      MacroParam p;
      FT_ASSIGN_OR_RETURN(p.name, ExpectName("a parameter name"));
      if (SkipOp("=")) {
        FT_ASSIGN_OR_RETURN(p.default_value, ParseExpression(true));
        seen_default = true;
      } else if (seen_default) {
        return Error("parameter without a default follows one with a default");
      }
      params->push_back(std::move(p));
    }
    return ExpectOp(")");
  }

  StatusOr<NodePtr> ParseMacro(int line) {
    auto n = NewNode(Node::Kind::kMacro, line);
    FT_ASSIGN_OR_RETURN(n->name, ExpectName("the macro name"));
    FT_RETURN_IF_ERROR(ParseParams(&n->params));
    FT_RETURN_IF_ERROR(ExpectBlockEnd("the 'macro' header"));
    const int saved = loop_depth_;
    loop_depth_ = 0;
    std::string which;
    Status st = ParseBody({"endmacro"}, &n->body, &which, line, "macro");
    loop_depth_ = saved;
    FT_RETURN_IF_ERROR(st);
    if (Cur().type == TT::kName) ++p_;  // {% endmacro name %}
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'endmacro'"));
    return n;
  }

  StatusOr<NodePtr> ParseCallBlock(int line) {
    auto n = NewNode(Node::Kind::kCallBlock, line);
    if (IsOp("(")) FT_RETURN_IF_ERROR(ParseParams(&n->params));
    FT_ASSIGN_OR_RETURN(n->expr, ParseExpression(true));
    if (n->expr->kind != Expr::Kind::kCall) return Error("expected a call after '{% call'");
    FT_RETURN_IF_ERROR(ExpectBlockEnd("the 'call' header"));
    std::string which;
    FT_RETURN_IF_ERROR(ParseBody({"endcall"}, &n->body, &which, line, "call"));
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'endcall'"));
    return n;
  }

  StatusOr<NodePtr> ParseFilterBlock(int line) {
    auto n = NewNode(Node::Kind::kFilterBlock, line);
    FT_ASSIGN_OR_RETURN(n->expr, ParseFilterChain(nullptr, /*start_inline=*/true));
    FT_RETURN_IF_ERROR(ExpectBlockEnd("the 'filter' header"));
    std::string which;
    FT_RETURN_IF_ERROR(ParseBody({"endfilter"}, &n->body, &which, line, "filter"));
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'endfilter'"));
    return n;
  }

  StatusOr<NodePtr> ParseWith(int line) {
    auto n = NewNode(Node::Kind::kWith, line);
    while (Cur().type != TT::kBlockEnd) {
      if (!n->assignments.empty()) FT_RETURN_IF_ERROR(ExpectOp(","));
      FT_ASSIGN_OR_RETURN(std::string name, ExpectName("a variable name"));
      FT_RETURN_IF_ERROR(ExpectOp("="));
      FT_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      n->assignments.emplace_back(std::move(name), std::move(value));
    }
    ++p_;
    std::string which;
    FT_RETURN_IF_ERROR(ParseBody({"endwith"}, &n->body, &which, line, "with"));
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'endwith'"));
    return n;
  }

  StatusOr<NodePtr> ParseGeneration(int line) {
    auto n = NewNode(Node::Kind::kBlock, line);
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'generation'"));
    std::string which;
    FT_RETURN_IF_ERROR(ParseBody({"endgeneration"}, &n->body, &which, line, "generation"));
    FT_RETURN_IF_ERROR(ExpectBlockEnd("'endgeneration'"));
    return n;
  }

  // ---- expressions ----

  bool IsTupleEnd() const {
    return Cur().type == TT::kVarEnd || Cur().type == TT::kBlockEnd || IsOp(")") || Cur().type == TT::kEof;
  }

  StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) FT_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd()) break;
      FT_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
      args.push_back(std::move(e));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) return Error("expected an expression");
    }
    auto t = NewExpr(Expr::Kind::kTuple, line);
    t->items = std::move(args);
    FT_RETURN_IF_ERROR(Seal(t.get()));
    return t;
  }

  StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    Nest nest(&depth_);
    if (depth_ > kMaxNesting) return TooDeep();
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  StatusOr<ExprPtr> ParseCondExpr() {
    FT_ASSIGN_OR_RETURN(ExprPtr e1, ParseOr());
    while (IsName("if")) {
      const int line = Cur().line;
      ++p_;
      FT_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      ExprPtr e3;
      if (SkipName("else")) {
        FT_ASSIGN_OR_RETURN(e3, ParseCondExpr());
      }
      auto c = NewExpr(Expr::Kind::kCond, line);
      c->items.push_back(std::move(e1));
      c->items.push_back(std::move(test));
      c->items.push_back(std::move(e3));
      FT_RETURN_IF_ERROR(Seal(c.get()));
      e1 = std::move(c);
    }
    return e1;
  }

  StatusOr<ExprPtr> ParseOr() {
    FT_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const int line = Cur().line;
      ++p_;
      FT_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      FT_ASSIGN_OR_RETURN(left, Binary(Expr::Kind::kOr, "or", std::move(left), std::move(right), line));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseAnd() {
    FT_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const int line = Cur().line;
      ++p_;
      FT_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      FT_ASSIGN_OR_RETURN(left, Binary(Expr::Kind::kAnd, "and", std::move(left), std::move(right), line));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseNot() {
    Nest nest(&depth_);
    if (depth_ > kMaxNesting) return TooDeep();
    if (IsName("not")) {
      auto n = NewExpr(Expr::Kind::kNot, Cur().line);
      ++p_;
      FT_ASSIGN_OR_RETURN(n->target, ParseNot());
      FT_RETURN_IF_ERROR(Seal(n.get()));
      return n;
    }
    return ParseCompare();
  }

  StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    FT_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TT::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                    Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        ++p_;
      } else if (IsName("in")) {
        op = "in";
        ++p_;
      } else if (IsName("not") && Peek().type == TT::kName && Peek().text == "in") {
        op = "notin";
        p_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = NewExpr(Expr::Kind::kCompare, line);
        cmp->items.push_back(std::move(first));
      }
      FT_ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      cmp->ops.push_back(op);
      cmp->items.push_back(std::move(right));
    }
    if (!cmp) return first;
    FT_RETURN_IF_ERROR(Seal(cmp.get()));
    return cmp;
  }

  StatusOr<ExprPtr> Binary(Expr::Kind kind, std::string op, ExprPtr l, ExprPtr r, int line) const {
    auto e = NewExpr(kind, line);
    e->name = std::move(op);
    e->items.push_back(std::move(l));
    e->items.push_back(std::move(r));
    FT_RETURN_IF_ERROR(Seal(e.get()));
    return e;
  }

  StatusOr<ExprPtr> ParseMath1() {
    FT_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      ++p_;
      FT_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      FT_ASSIGN_OR_RETURN(left, Binary(Expr::Kind::kBinary, op, std::move(left), std::move(right), line));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseConcat() {
    FT_ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (IsOp("~")) {
      const int line = Cur().line;
      ++p_;
      FT_ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      FT_ASSIGN_OR_RETURN(left, Binary(Expr::Kind::kBinary, "~", std::move(left), std::move(right), line));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseMath2() {
    FT_ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().text;
      const int line = Cur().line;
      ++p_;
      FT_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      FT_ASSIGN_OR_RETURN(left, Binary(Expr::Kind::kBinary, op, std::move(left), std::move(right), line));
    }
    return left;
  }

  StatusOr<ExprPtr> ParsePow() {
    FT_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const int line = Cur().line;
      ++p_;
      FT_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      FT_ASSIGN_OR_RETURN(left, Binary(Expr::Kind::kBinary, "**", std::move(left), std::move(right), line));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Nest nest(&depth_);
    if (depth_ > kMaxNesting) return TooDeep();
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = NewExpr(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Cur().line);
      ++p_;
      FT_ASSIGN_OR_RETURN(node->target, ParseUnary(false));
      FT_RETURN_IF_ERROR(Seal(node.get()));
    } else {
      FT_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    FT_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      FT_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  StatusOr<ExprPtr> ParsePrimary() {
    const Token& tok = Cur();
    const int line = tok.line;
    switch (tok.type) {
      case TT::kName: {
        ++p_;
        if (tok.text == "true" || tok.text == "True" || tok.text == "false" || tok.text == "False") {
          auto e = NewExpr(Expr::Kind::kLiteral, line);
          e->value = Value::Bool(tok.text[0] == 't' || tok.text[0] == 'T');
          return e;
        }
        if (tok.text == "none" || tok.text == "None") {
          auto e = NewExpr(Expr::Kind::kLiteral, line);
          e->value = Value::None();
          return e;
        }
        auto e = NewExpr(Expr::Kind::kName, line);
        e->name = tok.text;
        return e;
      }
      case TT::kString: {
        std::string s;
        while (Cur().type == TT::kString) s += t_[p_++].text;
        auto e = NewExpr(Expr::Kind::kLiteral, line);
        e->value = Value::Str(std::move(s));
        return e;
      }
      case TT::kInt:
      case TT::kFloat: {
        auto e = NewExpr(Expr::Kind::kLiteral, line);
        e->value = tok.type == TT::kInt ? Value::Int(tok.int_value) : Value::Float(tok.float_value);
        ++p_;
        return e;
      }
      case TT::kOp:
        if (tok.text == "(") {
          ++p_;
          FT_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, /*explicit_parens=*/true));
          FT_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (tok.text == "[") {
          ++p_;
          auto e = NewExpr(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            if (!e->items.empty()) FT_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            FT_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
            e->items.push_back(std::move(item));
          }
          ++p_;
          FT_RETURN_IF_ERROR(Seal(e.get()));
          return e;
        }
        if (tok.text == "{") {
          ++p_;
          auto e = NewExpr(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            if (!e->items.empty()) FT_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            FT_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
            FT_RETURN_IF_ERROR(ExpectOp(":"));
            FT_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
            e->keys.push_back(std::move(key));
            e->items.push_back(std::move(value));
          }
          ++p_;
          FT_RETURN_IF_ERROR(Seal(e.get()));
          return e;
        }
        break;
      default: break;
    }
    return Error("expected an expression");
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        FT_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        FT_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        ++p_;
        FT_ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node), /*start_inline=*/true, /*single=*/true));
      } else if (IsName("is")) {
        FT_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        FT_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  StatusOr<std::string> ParseDottedName(std::string_view what) {
    FT_ASSIGN_OR_RETURN(std::string name, ExpectName(what));
    while (IsOp(".") && Peek().type == TT::kName) {
      name += "." + Peek().text;
      p_ += 2;
    }
    return name;
  }

  // `name(args) | name2 ...` applied to `target` (null: a block's output).
  StatusOr<ExprPtr> ParseFilterChain(ExprPtr target, bool start_inline, bool single = false) {
    while (start_inline || SkipOp("|")) {
      start_inline = false;
      auto f = NewExpr(Expr::Kind::kFilter, Cur().line);
      FT_ASSIGN_OR_RETURN(f->name, ParseDottedName("a filter name"));
      f->target = std::move(target);
      if (IsOp("(")) FT_RETURN_IF_ERROR(ParseCallArgs(f.get()));
      FT_RETURN_IF_ERROR(Seal(f.get()));
      target = std::move(f);
      if (single) break;
    }
    return target;
  }

  StatusOr<ExprPtr> ParseTest(ExprPtr node) {
    auto t = NewExpr(Expr::Kind::kTest, Cur().line);
    ++p_;  // 'is'
    t->negate = SkipName("not");
    FT_ASSIGN_OR_RETURN(t->name, ParseDottedName("a test name"));
    t->target = std::move(node);
    if (IsOp("(")) {
      FT_RETURN_IF_ERROR(ParseCallArgs(t.get()));
    } else if ((Cur().type == TT::kName || Cur().type == TT::kString || Cur().type == TT::kInt ||
                Cur().type == TT::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return Error("tests cannot be chained with 'is'");
      FT_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      FT_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      t->items.push_back(std::move(arg));
    }
    FT_RETURN_IF_ERROR(Seal(t.get()));
    return t;
  }

  StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const int line = Cur().line;
    if (SkipOp(".")) {
      if (Cur().type == TT::kName) {
        auto e = NewExpr(Expr::Kind::kGetAttr, line);
        e->name = t_[p_++].text;
        e->target = std::move(node);
        FT_RETURN_IF_ERROR(Seal(e.get()));
        return e;
      }
      if (Cur().type == TT::kInt) {
        auto e = NewExpr(Expr::Kind::kGetItem, line);
        auto idx = NewExpr(Expr::Kind::kLiteral, line);
        idx->value = Value::Int(t_[p_++].int_value);
        e->items.push_back(std::move(idx));
        e->target = std::move(node);
        FT_RETURN_IF_ERROR(Seal(e.get()));
        return e;
      }
      return Error("expected an attribute name after '.'");
    }
    FT_RETURN_IF_ERROR(ExpectOp("["));
    std::vector<ExprPtr> args;
    while (!IsOp("]")) {
      if (!args.empty()) FT_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      FT_ASSIGN_OR_RETURN(ExprPtr a, ParseSubscribed());
      args.push_back(std::move(a));
    }
    FT_RETURN_IF_ERROR(ExpectOp("]"));
    if (args.empty()) return Error("expected an index or slice inside '[]'");
    if (args.size() == 1 && args[0]->kind == Expr::Kind::kSlice && !args[0]->target) {
      args[0]->target = std::move(node);
      FT_RETURN_IF_ERROR(Seal(args[0].get()));
      return std::move(args[0]);
    }
    for (const ExprPtr& a : args) {
      if (a->kind == Expr::Kind::kSlice && !a->target) {  // x[1, :2]: a tuple holding a slice object
        return Error("a slice inside a tuple index ('x[1, :2]') is not supported");
      }
    }
    auto e = NewExpr(Expr::Kind::kGetItem, line);
    if (args.size() == 1) {
      e->items.push_back(std::move(args[0]));
    } else {
      auto tuple = NewExpr(Expr::Kind::kTuple, line);
      tuple->items = std::move(args);
      FT_RETURN_IF_ERROR(Seal(tuple.get()));
      e->items.push_back(std::move(tuple));
    }
    e->target = std::move(node);
    FT_RETURN_IF_ERROR(Seal(e.get()));
    return e;
  }

  // An index or a slice (a kSlice expression without target).
  StatusOr<ExprPtr> ParseSubscribed() {
    auto s = NewExpr(Expr::Kind::kSlice, Cur().line);
    if (!SkipOp(":")) {
      FT_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      if (!SkipOp(":")) return e;
      s->slice[0] = std::move(e);
    }
    if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
      FT_ASSIGN_OR_RETURN(s->slice[1], ParseExpression(true));
    }
    if (SkipOp(":")) {
      if (!IsOp("]") && !IsOp(",")) {
        FT_ASSIGN_OR_RETURN(s->slice[2], ParseExpression(true));
      }
    }
    FT_RETURN_IF_ERROR(Seal(s.get()));
    return s;
  }

  StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto c = NewExpr(Expr::Kind::kCall, Cur().line);
    c->target = std::move(callee);
    FT_RETURN_IF_ERROR(ParseCallArgs(c.get()));
    FT_RETURN_IF_ERROR(Seal(c.get()));
    return c;
  }

  Status ParseCallArgs(Expr* e) {
    FT_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) FT_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) return Error("'*args' / '**kwargs' in calls are not supported");
      if (Cur().type == TT::kName && Peek().type == TT::kOp && Peek().text == "=") {
        Kwarg kw;
        kw.name = Cur().text;
        p_ += 2;
        FT_ASSIGN_OR_RETURN(kw.value, ParseExpression(true));
        e->kwargs.push_back(std::move(kw));
      } else {
        if (!e->kwargs.empty()) return Error("positional argument after a keyword argument");
        FT_ASSIGN_OR_RETURN(ExprPtr a, ParseExpression(true));
        e->items.push_back(std::move(a));
      }
    }
    return ExpectOp(")");
  }

  const std::vector<Token>& t_;
  size_t p_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<NodeList> Parse(const std::vector<Token>& tokens) {
  if (tokens.empty() || tokens.back().type != Token::Type::kEof) {
    return Status::Internal("jinja parser: token stream without end marker");
  }
  return Parser(tokens).Run();
}

}  // namespace ft::jinja
