// Evaluator for parsed Jinja templates (engine/text/jinja/ast.h) with jinja2's
// semantics as Hugging Face runs them: attribute access falls back to item
// access, undefined values print as "" but fail when used (attribute of
// undefined, arithmetic), `set` inside a for loop stays in that iteration,
// namespace() objects carry state out of loops, macros see the template's
// top-level variables.
//
// Errors are InvalidArgument "line N: ..." with N the template source line of
// the failing expression or statement. A render is bounded: 64 nested macro
// calls, 1,000,000 loop iterations, 16 MiB of output, values nested 256 deep
// (kMaxValueDepth) or larger than 16 MiB (kMaxValueBytes), 2 MiB of stack.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/text/jinja/ast.h"
#include "engine/text/jinja/value.h"

namespace ft::jinja {

// Variables visible at one level (template, loop iteration, macro call).
class Scope {
 public:
  explicit Scope(const Scope* parent) : parent_(parent) {}
  const Value* Lookup(std::string_view name) const;
  void Set(std::string_view name, Value value);

 private:
  const Scope* parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};

class Interpreter {
 public:
  // `root` holds the render's variables and globals; it must outlive the
  // interpreter. Top-level `set` writes into it.
  explicit Interpreter(Scope* root) : root_(root) {}
  // Empties every namespace this interpreter made (NewNamespace), so one that
  // holds itself (`{% set ns.x = ns %}`, directly or through a macro or
  // another namespace) is freed with the render instead of leaking.
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `nodes` at top level, appending to *out.
  Status Render(const NodeList& nodes, std::string* out);

  // Used by builtins (filters that apply filters/tests, macros, caller()).
  StatusOr<Value> CallValue(const Value& fn, CallArgs args);
  StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, CallArgs args);
  StatusOr<bool> ApplyTest(std::string_view name, const Value& input, CallArgs args);
  // Calls a macro (or a call block's body, as `caller`): parameters bound in
  // a scope whose parent is `parent` (null: the template's top level).
  StatusOr<Value> CallMacro(const Node& macro, CallArgs args, Scope* parent);
  Scope& root() { return *root_; }
  // namespace(...): a mutable attribute holder, owned by this render.
  Value NewNamespace(Dict attrs);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Status Exec(const NodeList& nodes, Scope& scope, std::string* out);
  Status ExecNode(const Node& node, Scope& scope, std::string* out);
  Status ExecFor(const Node& node, Scope& scope, std::string* out);
  Status ExecSet(const Node& node, Scope& scope, Value value);
  Status ExecCallBlock(const Node& node, Scope& scope, std::string* out);

  // EvalExpr, then CheckValue; both under CheckStack.
  StatusOr<Value> Eval(const Expr& e, Scope& scope);
  // The bounds on a value a template makes: kMaxValueDepth, kMaxValueBytes.
  Status CheckValue(const Value& v, int line) const;
  // Fails once the render has used more than 2 MiB of stack.
  Status CheckStack(int line) const;
  StatusOr<Value> EvalExpr(const Expr& e, Scope& scope);
  StatusOr<Value> EvalCall(const Expr& e, Scope& scope);
  StatusOr<Value> EvalSlice(const Expr& e, Scope& scope);
  StatusOr<Value> EvalUnary(const Expr& e, Scope& scope);
  StatusOr<Value> EvalCompare(const Expr& e, Scope& scope);
  StatusOr<Value> EvalBinary(const Expr& e, Scope& scope);
  StatusOr<Value> EvalFilterChain(const Expr& e, Scope& scope, const Value* block_input);
  StatusOr<CallArgs> EvalArgs(const Expr& e, Scope& scope);
  StatusOr<Value> GetAttr(const Expr& at, const Value& obj, const std::string& name);
  StatusOr<Value> GetItem(const Expr& at, const Value& obj, const Value& key);

  Scope* root_;
  Flow flow_ = Flow::kNormal;
  int call_depth_ = 0;
  int64_t iterations_ = 0;         // loop iterations in this render (bounded)
  uintptr_t stack_base_ = 0;       // the stack pointer where Render began
  std::vector<Value> namespaces_;  // every namespace NewNamespace made
};

// Makes a Status message carry the line: "line N: msg" (kept as is when it
// already names one).
Status AtLine(int line, const Status& status);
Status ErrorAt(int line, const std::string& message);

}  // namespace ft::jinja
