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
// (kMaxValueDepth) or larger than 16 MiB (kMaxValueBytes), 2 MiB of stack,
// and its total work (kMaxRenderWork): each bound above alone leaves a
// render that copies an 8 MiB string a million times running for minutes.
// Work is counted in units of about one byte: the bytes (strings) or items
// (lists, dicts) of every value an expression makes and of what filters,
// tests, methods, string subscripts and slices and loops read; both operands
// of a comparison or `in` in full (Value::size()); the bytes written to the
// output; and kWorkPerOperation for each expression, statement and loop
// iteration; for sort, dictsort, unique, min and max, CompareWork per
// comparison they make (n·log2(n) for a sort, n² for unique). Over budget,
// the render fails with "line N: the render exceeds its work budget of 1024
// Mi units ...".
//
// A render also stops when its caller asks (stop_requested, polled about
// every millisecond of work): Cancelled "line N: rendering stopped: ...", so a
// trainer asked to stop while it prepares its data stops within a second.
#pragma once

#include <cstdint>
#include <functional>
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
  explicit Interpreter(Scope* root, std::function<bool()> stop_requested = {})
      : root_(root), stop_requested_(std::move(stop_requested)) {}
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
  // Adds `units` to the render's work (for built-ins whose cost their input's
  // size does not show, e.g. a sort's comparisons). Errors carry no line (the
  // caller's AtLine adds it): over the budget (InvalidArgument), or Cancelled
  // when stop_requested said so.
  Status ChargeWork(uint64_t units);
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
  // Adds `units` to the render's work; fails once it exceeds kMaxRenderWork.
  Status Charge(uint64_t units, int line);
  // Appends `text` to *out, charging its bytes.
  Status Append(std::string_view text, int line, std::string* out);
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
  std::function<bool()> stop_requested_;  // polled every kWorkPerPoll units (unset: never)
  Flow flow_ = Flow::kNormal;
  int call_depth_ = 0;
  int64_t iterations_ = 0;         // loop iterations in this render (bounded)
  uint64_t work_ = 0;              // work units of this render (bounded, see Charge)
  uintptr_t stack_base_ = 0;       // the stack pointer where Render began
  std::vector<Value> namespaces_;  // every namespace NewNamespace made
};

// The work budget of one render (see the file comment) and what each
// expression, statement and loop iteration costs in it. 2^30 units take about
// a second or two; the real chat templates of tests/golden/chat use well
// under 1/1000 of it.
constexpr uint64_t kMaxRenderWork = uint64_t{1} << 30;
constexpr uint64_t kWorkPerOperation = 64;

// What reading `v` costs an operation: a string's bytes, a list's or dict's items.
uint64_t ScanWork(const Value& v);
// What comparing `v` with another value may cost: kWorkPerCompare (a
// comparison costs about 16 units of time on its own) plus what it may read,
// its whole size (Value::size()).
constexpr uint64_t kWorkPerCompare = 16;
uint64_t CompareWork(const Value& v);
// How often a render polls its stop_requested: every 2^20 units (about a millisecond).
constexpr uint64_t kWorkPerPoll = uint64_t{1} << 20;

// Makes a Status message carry the line: "line N: msg" (kept as is when it
// already names one).
Status AtLine(int line, const Status& status);
Status ErrorAt(int line, const std::string& message);

}  // namespace ft::jinja
