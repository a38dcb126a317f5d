#include "engine/text/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>

#include "engine/text/jinja/builtins.h"
#include "engine/text/jinja/pystr.h"

namespace ft::jinja {

namespace {

constexpr int kMaxCallDepth = 64;
// Per render: a chat template from a downloaded model cannot hang or exhaust
// the trainer (nested loops, a huge output).
constexpr int64_t kMaxLoopIterations = 1'000'000;
constexpr size_t kMaxOutputBytes = size_t{16} << 20;
// Stack a render may use: macros calling macros inside deep expressions add
// up, and each bound above alone does not bound their product. Sanitizers
// make every frame about three times larger (redzones), so the same
// templates get three times the bytes there (the main thread has 8 MiB;
// FT_SANITIZED comes from the build: cmake/ftune.cmake).
#ifdef FT_SANITIZED
constexpr uintptr_t kStackFactor = 3;
#else
constexpr uintptr_t kStackFactor = 1;
#endif
constexpr uintptr_t kMaxStackBytes = kStackFactor * (uintptr_t{2} << 20);

uintptr_t StackPointer() { return reinterpret_cast<uintptr_t>(__builtin_frame_address(0)); }

// Expressions that return a value that already exists: their work is the operation alone.
bool Refers(Expr::Kind k) {
  return k == Expr::Kind::kLiteral || k == Expr::Kind::kName || k == Expr::Kind::kGetAttr ||
         k == Expr::Kind::kGetItem || k == Expr::Kind::kAnd || k == Expr::Kind::kOr || k == Expr::Kind::kCond;
}

// What reading the arguments of a call costs.
uint64_t ArgsWork(const CallArgs& args) {
  uint64_t units = 0;
  for (const Value& v : args.pos) units += ScanWork(v);
  for (const auto& [name, v] : args.kw) units += ScanWork(v);
  return units;
}

// Source-like text of simple expressions, for error messages.
std::string Describe(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kName: return e.name;
    case Expr::Kind::kLiteral: return e.value.Repr();
    case Expr::Kind::kGetAttr: return Describe(*e.target) + "." + e.name;
    case Expr::Kind::kGetItem: {
      const Expr& k = *e.items[0];
      return Describe(*e.target) + "[" + (k.kind == Expr::Kind::kLiteral ? k.value.Repr() : "...") + "]";
    }
    case Expr::Kind::kCall: return Describe(*e.target) + "(...)";
    case Expr::Kind::kFilter: return (e.target ? Describe(*e.target) : std::string("...")) + "|" + e.name;
    default: return "expression";
  }
}

// Built by appending, not as `"'" + std::string + ...`: GCC 12 at -O3 flags that chain with a false
// -Wrestrict (GCC bug 105329, fixed in GCC 13), which -Werror turned into a failed Release build.
Status Undefined(const Expr& e, const std::string& doing) {
  std::string message = "'";
  message += Describe(e);
  message += "' is undefined";
  if (!doing.empty()) message.append(" (").append(doing).append(")");
  return ErrorAt(e.line, message);
}

class MacroFn : public Callable {
 public:
  explicit MacroFn(const Node* node) : node_(node) {}
  const std::string& name() const override { return node_->name; }
  StatusOr<Value> Call(Interpreter& interp, CallArgs args) const override;

 private:
  const Node* node_;
};

class CallerFn : public Callable {
 public:
  CallerFn(const Node* node, Scope* scope) : node_(node), scope_(scope) {}
  const std::string& name() const override {
    static const std::string kName = "caller";
    return kName;
  }
  StatusOr<Value> Call(Interpreter& interp, CallArgs args) const override;

 private:
  const Node* node_;
  Scope* scope_;  // the call block's scope; caller() only runs while it is alive
};

}  // namespace

uint64_t CompareWork(const Value& v) { return kWorkPerCompare + v.size(); }

uint64_t ScanWork(const Value& v) {
  if (v.is_string()) return v.str().size();
  if (v.is_list()) return v.list().size();
  if (v.is_dict() || v.is_namespace()) return v.dict().size();
  return 0;
}

Status ErrorAt(int line, const std::string& message) {
  return Status::InvalidArgument("line " + std::to_string(line) + ": " + message);
}

Status AtLine(int line, const Status& status) {
  if (status.ok() || status.message().rfind("line ", 0) == 0) return status;
  if (status.code() == Status::Code::kInternal) return status;
  if (status.code() == Status::Code::kCancelled) {
    return Status::Cancelled("line " + std::to_string(line) + ": " + status.message());
  }
  return ErrorAt(line, status.message());
}

const Value* Scope::Lookup(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_) {
    for (const auto& [k, v] : s->vars_) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::Set(std::string_view name, Value value) {
  for (auto& [k, v] : vars_) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

// Binds macro/caller parameters into `scope`: positionals, keywords,
// defaults (evaluated in `scope`), the rest in varargs/kwargs.
static Status BindParams(const std::vector<MacroParam>& params, CallArgs args, Scope& scope,
                         const std::function<StatusOr<Value>(const Expr&, Scope&)>& eval) {
  for (size_t i = 0; i < params.size(); ++i) {
    const MacroParam& p = params[i];
    Value v;
    bool found = false;
    if (i < args.pos.size()) {
      v = args.pos[i];
      found = true;
    } else {
      for (auto it = args.kw.begin(); it != args.kw.end(); ++it) {
        if (it->first == p.name) {
          v = std::move(it->second);
          args.kw.erase(it);
          found = true;
          break;
        }
      }
    }
    if (!found && p.default_value) {
      FT_ASSIGN_OR_RETURN(v, eval(*p.default_value, scope));
    }
    scope.Set(p.name, std::move(v));
  }
  std::vector<Value> varargs;
  for (size_t i = params.size(); i < args.pos.size(); ++i) varargs.push_back(args.pos[i]);
  Dict kwargs;
  for (auto& [k, v] : args.kw) {
    if (k == "caller") {
      scope.Set("caller", v);
    } else {
      kwargs.Set(k, v);
    }
  }
  scope.Set("varargs", Value::List(std::move(varargs)));
  scope.Set("kwargs", Value::MakeDict(std::move(kwargs)));
  return Status::OK();
}

StatusOr<Value> Interpreter::CallMacro(const Node& macro, CallArgs args, Scope* parent) {
  if (call_depth_ >= kMaxCallDepth) {
    return Status::InvalidArgument("macro '" + macro.name + "' nested more than " +
                                   std::to_string(kMaxCallDepth) + " calls deep (runaway recursion?)");
  }
  ++call_depth_;
  Scope scope(parent ? parent : root_);
  Status st = BindParams(macro.params, std::move(args), scope,
                         [this](const Expr& e, Scope& s) { return Eval(e, s); });
  std::string out;
  const Flow saved = flow_;
  flow_ = Flow::kNormal;
  if (st.ok()) st = Exec(macro.body, scope, &out);
  flow_ = saved;
  --call_depth_;
  FT_RETURN_IF_ERROR(st);
  return Value::Str(std::move(out));
}

namespace {

StatusOr<Value> MacroFn::Call(Interpreter& interp, CallArgs args) const {
  return interp.CallMacro(*node_, std::move(args), nullptr);
}

StatusOr<Value> CallerFn::Call(Interpreter& interp, CallArgs args) const {
  return interp.CallMacro(*node_, std::move(args), scope_);
}

}  // namespace

Interpreter::~Interpreter() {
  for (const Value& ns : namespaces_) ns.mutable_namespace() = Dict();
}

Value Interpreter::NewNamespace(Dict attrs) {
  Value ns = Value::MakeNamespace(std::move(attrs));
  namespaces_.push_back(ns);
  return ns;
}

Status Interpreter::Render(const NodeList& nodes, std::string* out) {
  flow_ = Flow::kNormal;
  iterations_ = 0;
  work_ = 0;
  stack_base_ = StackPointer();
  return Exec(nodes, *root_, out);
}

Status Interpreter::CheckStack(int line) const {
  const uintptr_t here = StackPointer();
  const uintptr_t used = here < stack_base_ ? stack_base_ - here : here - stack_base_;
  if (used <= kMaxStackBytes) return Status::OK();
  return ErrorAt(line, "the template nests too deeply (more than " + std::to_string(kMaxStackBytes >> 20) +
                           " MiB of stack: macros calling macros inside deep expressions?)");
}

Status Interpreter::Charge(uint64_t units, int line) { return AtLine(line, ChargeWork(units)); }

Status Interpreter::ChargeWork(uint64_t units) {
  const uint64_t before = work_;
  work_ = units > kMaxRenderWork ? kMaxRenderWork + 1 : work_ + units;  // no overflow: work_ <= the budget
  if (work_ > kMaxRenderWork) {
    return Status::InvalidArgument("the render exceeds its work budget of " +
                                   std::to_string(kMaxRenderWork >> 20) +
                                   " Mi units (about a byte each of the values it makes, reads and prints, " +
                                   std::to_string(kWorkPerOperation) + " per operation, " +
                                   std::to_string(kWorkPerCompare) + " per comparison): a runaway template?");
  }
  if (stop_requested_ && before / kWorkPerPoll != work_ / kWorkPerPoll && stop_requested_()) {
    return Status::Cancelled("rendering stopped after " + std::to_string(work_ >> 20) +
                             " Mi units of work: a stop was requested");
  }
  return Status::OK();
}

Status Interpreter::Append(std::string_view text, int line, std::string* out) {
  FT_RETURN_IF_ERROR(Charge(text.size(), line));
  out->append(text);
  return Status::OK();
}

StatusOr<Value> Interpreter::CallValue(const Value& fn, CallArgs args) {
  if (!fn.is_callable())
    return Status::InvalidArgument(std::string("'") + fn.TypeName() + "' object is not callable");
  return fn.callable().Call(*this, std::move(args));
}

StatusOr<Value> Interpreter::ApplyFilter(std::string_view name, const Value& input, CallArgs args) {
  return CallFilter(*this, name, input, std::move(args));
}

StatusOr<bool> Interpreter::ApplyTest(std::string_view name, const Value& input, CallArgs args) {
  return CallTest(*this, name, input, std::move(args));
}

Status Interpreter::Exec(const NodeList& nodes, Scope& scope, std::string* out) {
  for (const NodePtr& n : nodes) {
    FT_RETURN_IF_ERROR(ExecNode(*n, scope, out));
    if (out->size() > kMaxOutputBytes) {
      return ErrorAt(
          n->line, "output exceeds " + std::to_string(kMaxOutputBytes >> 20) + " MiB (a runaway template?)");
    }
    if (flow_ != Flow::kNormal) return Status::OK();
  }
  return Status::OK();
}

Status Interpreter::ExecNode(const Node& node, Scope& scope, std::string* out) {
  FT_RETURN_IF_ERROR(CheckStack(node.line));
  FT_RETURN_IF_ERROR(Charge(kWorkPerOperation, node.line));
  switch (node.kind) {
    case Node::Kind::kText: return Append(node.text, node.line, out);
    case Node::Kind::kOutput: {
      FT_ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
      return Append(v.ToStr(), node.line, out);
    }
    case Node::Kind::kIf:
      for (size_t i = 0; i < node.conds.size(); ++i) {
        FT_ASSIGN_OR_RETURN(Value c, Eval(*node.conds[i], scope));
        if (c.Truthy()) return Exec(node.bodies[i], scope, out);
      }
      if (node.bodies.size() > node.conds.size()) return Exec(node.bodies.back(), scope, out);
      return Status::OK();
    case Node::Kind::kFor: return ExecFor(node, scope, out);
    case Node::Kind::kSet: {
      FT_ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
      return ExecSet(node, scope, std::move(v));
    }
    case Node::Kind::kSetBlock: {
      std::string s;
      FT_RETURN_IF_ERROR(Exec(node.body, scope, &s));
      Value v = Value::Str(std::move(s));
      if (node.expr) {
        FT_ASSIGN_OR_RETURN(v, EvalFilterChain(*node.expr, scope, &v));
      }
      scope.Set(node.targets[0], std::move(v));
      return Status::OK();
    }
    case Node::Kind::kMacro:
      scope.Set(node.name, Value::Func(std::make_shared<MacroFn>(&node)));
      return Status::OK();
    case Node::Kind::kCallBlock: return ExecCallBlock(node, scope, out);
    case Node::Kind::kFilterBlock: {
      std::string s;
      FT_RETURN_IF_ERROR(Exec(node.body, scope, &s));
      const Value body = Value::Str(std::move(s));
      FT_ASSIGN_OR_RETURN(Value v, EvalFilterChain(*node.expr, scope, &body));
      return Append(v.ToStr(), node.line, out);
    }
    case Node::Kind::kWith: {
      Scope inner(&scope);
      for (const auto& [name, e] : node.assignments) {
        FT_ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
        inner.Set(name, std::move(v));
      }
      return Exec(node.body, inner, out);
    }
    case Node::Kind::kBlock: return Exec(node.body, scope, out);
    case Node::Kind::kBreak: flow_ = Flow::kBreak; return Status::OK();
    case Node::Kind::kContinue: flow_ = Flow::kContinue; return Status::OK();
  }
  return Status::Internal("jinja: unknown statement kind");
}

Status Interpreter::ExecSet(const Node& node, Scope& scope, Value value) {
  if (!node.attr.empty()) {
    const Value* ns = scope.Lookup(node.targets[0]);
    if (ns == nullptr || !ns->is_namespace()) {
      return ErrorAt(node.line, "cannot assign attribute '" + node.attr + "': '" + node.targets[0] +
                                    "' is not a namespace() object");
    }
    ns->mutable_namespace().Set(node.attr, std::move(value));
    return Status::OK();
  }
  if (node.targets.size() == 1) {
    scope.Set(node.targets[0], std::move(value));
    return Status::OK();
  }
  StatusOr<std::vector<Value>> parts = Iterate(value);
  if (!parts.ok()) return AtLine(node.line, parts.status());
  if (parts->size() != node.targets.size()) {
    return ErrorAt(node.line, "cannot unpack " + std::to_string(parts->size()) + " values into " +
                                  std::to_string(node.targets.size()) + " names");
  }
  for (size_t i = 0; i < node.targets.size(); ++i) scope.Set(node.targets[i], (*parts)[i]);
  return Status::OK();
}

Status Interpreter::ExecFor(const Node& node, Scope& scope, std::string* out) {
  FT_ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr, scope));
  FT_RETURN_IF_ERROR(Charge(ScanWork(iterable), node.line));
  StatusOr<std::vector<Value>> all = Iterate(iterable);
  if (!all.ok()) return AtLine(node.line, all.status());
  auto bind = [&](Scope& s, const Value& item) -> Status {
    if (node.targets.size() == 1) {
      s.Set(node.targets[0], item);
      return Status::OK();
    }
    StatusOr<std::vector<Value>> parts = Iterate(item);
    if (!parts.ok()) return AtLine(node.line, parts.status());
    if (parts->size() != node.targets.size()) {
      return ErrorAt(node.line, "cannot unpack " + std::to_string(parts->size()) + " values into " +
                                    std::to_string(node.targets.size()) + " loop variables");
    }
    for (size_t i = 0; i < node.targets.size(); ++i) s.Set(node.targets[i], (*parts)[i]);
    return Status::OK();
  };
  std::vector<Value> items;
  if (node.loop_filter) {
    for (const Value& item : *all) {
      Scope fs(&scope);
      FT_RETURN_IF_ERROR(bind(fs, item));
      FT_ASSIGN_OR_RETURN(Value keep, Eval(*node.loop_filter, fs));
      if (keep.Truthy()) items.push_back(item);
    }
  } else {
    items = std::move(*all);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  if (n == 0) {
    Scope es(&scope);
    return Exec(node.else_body, es, out);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (++iterations_ > kMaxLoopIterations) {
      return ErrorAt(node.line, "more than " + std::to_string(kMaxLoopIterations) +
                                    " loop iterations in one render (a runaway template?)");
    }
    FT_RETURN_IF_ERROR(Charge(kWorkPerOperation, node.line));
    Scope s(&scope);
    FT_RETURN_IF_ERROR(bind(s, items[i]));
    Dict loop;
    loop.Set("index", Value::Int(i + 1));
    loop.Set("index0", Value::Int(i));
    loop.Set("revindex", Value::Int(n - i));
    loop.Set("revindex0", Value::Int(n - i - 1));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == n - 1));
    loop.Set("length", Value::Int(n));
    loop.Set("depth", Value::Int(1));
    loop.Set("depth0", Value::Int(0));
    if (i > 0) loop.Set("previtem", items[i - 1]);
    if (i + 1 < n) loop.Set("nextitem", items[i + 1]);
    loop.Set("cycle", Value::Func(std::make_shared<NativeFunction>(
                          "cycle", [i](Interpreter&, CallArgs a) -> StatusOr<Value> {
                            if (a.pos.empty())
                              return Status::InvalidArgument("loop.cycle() needs at least one value");
                            return a.pos[static_cast<size_t>(i) % a.pos.size()];
                          })));
    s.Set("loop", Value::MakeDict(std::move(loop)));
    FT_RETURN_IF_ERROR(Exec(node.body, s, out));
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  return Status::OK();
}

Status Interpreter::ExecCallBlock(const Node& node, Scope& scope, std::string* out) {
  const Expr& call = *node.expr;
  FT_ASSIGN_OR_RETURN(Value fn, Eval(*call.target, scope));
  if (!fn.is_callable()) return Undefined(*call.target, "not a macro");
  FT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call, scope));
  args.kw.emplace_back("caller", Value::Func(std::make_shared<CallerFn>(&node, &scope)));
  StatusOr<Value> r = CallValue(fn, std::move(args));
  if (!r.ok()) return AtLine(node.line, r.status());
  return Append(r->ToStr(), node.line, out);
}

StatusOr<CallArgs> Interpreter::EvalArgs(const Expr& e, Scope& scope) {
  CallArgs args;
  for (const ExprPtr& a : e.items) {
    FT_ASSIGN_OR_RETURN(Value v, Eval(*a, scope));
    args.pos.push_back(std::move(v));
  }
  for (const Kwarg& k : e.kwargs) {
    FT_ASSIGN_OR_RETURN(Value v, Eval(*k.value, scope));
    args.kw.emplace_back(k.name, std::move(v));
  }
  return args;
}

StatusOr<Value> Interpreter::GetAttr(const Expr& at, const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return Undefined(*at.target, "reading attribute '" + name + "'");
  if (obj.is_dict() || obj.is_namespace()) {
    const Value* v = obj.dict().Find(name);
    return v ? *v : Value();
  }
  return Value();
}

StatusOr<Value> Interpreter::GetItem(const Expr& at, const Value& obj, const Value& key) {
  if (obj.is_undefined()) return Undefined(*at.target, "reading item " + key.Repr());
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    if (obj.is_string()) FT_RETURN_IF_ERROR(Charge(ScanWork(obj), at.line));  // code points are counted
    int64_t i = key.int_value();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return obj.list()[static_cast<size_t>(i)];
    }
    const std::string& s = obj.str();
    const std::vector<size_t> starts = CodePointStarts(s);
    const int64_t n = static_cast<int64_t>(starts.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    const size_t b = starts[static_cast<size_t>(i)];
    const size_t e = i + 1 < n ? starts[static_cast<size_t>(i + 1)] : s.size();
    return Value::Str(s.substr(b, e - b));
  }
  if ((obj.is_dict() || obj.is_namespace()) && key.is_string()) {
    const Value* v = obj.dict().Find(key.str());
    return v ? *v : Value();
  }
  return Value();
}

StatusOr<Value> Interpreter::Eval(const Expr& e, Scope& scope) {
  FT_RETURN_IF_ERROR(CheckStack(e.line));
  StatusOr<Value> v = EvalExpr(e, scope);
  // Every value a template makes passes here, so a loop that wraps a value
  // in itself (`{% set ns.a = [ns.a] %}`) stops at the bound instead of
  // growing until printing or freeing it exhausts the stack, and every
  // operation is charged to the render's work.
  if (!v.ok()) return v;
  FT_RETURN_IF_ERROR(CheckValue(*v, e.line));
  FT_RETURN_IF_ERROR(Charge(kWorkPerOperation + (Refers(e.kind) ? 0 : ScanWork(*v)), e.line));
  return v;
}

Status Interpreter::CheckValue(const Value& v, int line) const {
  if (v.depth() > kMaxValueDepth) {
    return ErrorAt(line, std::string("a ") + v.TypeName() + " nested more than " +
                             std::to_string(kMaxValueDepth) + " levels deep (a runaway template?)");
  }
  if (v.size() > kMaxValueBytes) {
    return ErrorAt(line, std::string("a ") + v.TypeName() + " larger than " +
                             std::to_string(kMaxValueBytes >> 20) + " MiB (a runaway template?)");
  }
  return Status::OK();
}

StatusOr<Value> Interpreter::EvalExpr(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.value;
    case Expr::Kind::kName: {
      const Value* v = scope.Lookup(e.name);
      return v ? *v : Value();
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const ExprPtr& i : e.items) {
        FT_ASSIGN_OR_RETURN(Value v, Eval(*i, scope));
        items.push_back(std::move(v));
      }
      return e.kind == Expr::Kind::kTuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t i = 0; i < e.items.size(); ++i) {
        FT_ASSIGN_OR_RETURN(Value k, Eval(*e.keys[i], scope));
        if (!k.is_string())
          return ErrorAt(e.line, std::string("dict keys must be strings, not ") + k.TypeName());
        FT_ASSIGN_OR_RETURN(Value v, Eval(*e.items[i], scope));
        d.Set(k.str(), std::move(v));
      }
      return Value::MakeDict(std::move(d));
    }
    case Expr::Kind::kGetAttr: {
      FT_ASSIGN_OR_RETURN(Value obj, Eval(*e.target, scope));
      return GetAttr(e, obj, e.name);
    }
    case Expr::Kind::kGetItem: {
      FT_ASSIGN_OR_RETURN(Value obj, Eval(*e.target, scope));
      FT_ASSIGN_OR_RETURN(Value key, Eval(*e.items[0], scope));
      return GetItem(e, obj, key);
    }
    case Expr::Kind::kSlice: return EvalSlice(e, scope);
    case Expr::Kind::kCall: return EvalCall(e, scope);
    case Expr::Kind::kFilter: return EvalFilterChain(e, scope, nullptr);
    case Expr::Kind::kTest: {
      FT_ASSIGN_OR_RETURN(Value v, Eval(*e.target, scope));
      FT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope));
      FT_RETURN_IF_ERROR(Charge(ScanWork(v) + ArgsWork(args), e.line));
      StatusOr<bool> r = ApplyTest(e.name, v, std::move(args));
      if (!r.ok()) return AtLine(e.line, r.status());
      return Value::Bool(*r != e.negate);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: return EvalUnary(e, scope);
    case Expr::Kind::kNot: {
      FT_ASSIGN_OR_RETURN(Value v, Eval(*e.target, scope));
      return Value::Bool(!v.Truthy());
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      FT_ASSIGN_OR_RETURN(Value l, Eval(*e.items[0], scope));
      if (l.Truthy() == (e.kind == Expr::Kind::kOr)) return l;
      return Eval(*e.items[1], scope);
    }
    case Expr::Kind::kCompare: return EvalCompare(e, scope);
    case Expr::Kind::kBinary: return EvalBinary(e, scope);
    case Expr::Kind::kCond: {
      FT_ASSIGN_OR_RETURN(Value c, Eval(*e.items[1], scope));
      if (c.Truthy()) return Eval(*e.items[0], scope);
      if (e.items[2]) return Eval(*e.items[2], scope);
      return Value();
    }
  }
  return Status::Internal("jinja: unknown expression kind");
}

// obj[start:stop:step] of a list or string (code points).
StatusOr<Value> Interpreter::EvalSlice(const Expr& e, Scope& scope) {
  FT_ASSIGN_OR_RETURN(Value obj, Eval(*e.target, scope));
  if (obj.is_undefined()) return Undefined(*e.target, "slicing");
  std::optional<int64_t> parts[3];
  for (int k = 0; k < 3; ++k) {
    if (!e.slice[k]) continue;
    FT_ASSIGN_OR_RETURN(Value v, Eval(*e.slice[k], scope));
    if (v.is_none() || v.is_undefined()) continue;
    if (!v.is_int() && !v.is_bool()) return ErrorAt(e.line, "slice indices must be integers or none");
    parts[k] = v.int_value();
  }
  const int64_t step = parts[2].value_or(1);
  if (step == 0) return ErrorAt(e.line, "slice step cannot be zero");
  FT_RETURN_IF_ERROR(Charge(ScanWork(obj), e.line));
  if (obj.is_list()) {
    std::vector<Value> out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(obj.list().size()), parts[0], parts[1], step)) {
      out.push_back(obj.list()[static_cast<size_t>(i)]);
    }
    return Value::List(std::move(out));
  }
  if (obj.is_string()) {
    const std::string& s = obj.str();
    const std::vector<size_t> starts = CodePointStarts(s);
    std::string out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(starts.size()), parts[0], parts[1], step)) {
      const size_t b = starts[static_cast<size_t>(i)];
      const size_t end =
          static_cast<size_t>(i) + 1 < starts.size() ? starts[static_cast<size_t>(i) + 1] : s.size();
      out.append(s, b, end - b);
    }
    return Value::Str(std::move(out));
  }
  return ErrorAt(e.line, std::string("'") + obj.TypeName() + "' object is not subscriptable");
}

// -x and +x.
StatusOr<Value> Interpreter::EvalUnary(const Expr& e, Scope& scope) {
  FT_ASSIGN_OR_RETURN(Value v, Eval(*e.target, scope));
  if (v.is_undefined()) return Undefined(*e.target, "");
  const bool neg = e.kind == Expr::Kind::kNeg;
  if (v.is_float()) return Value::Float(neg ? -v.number() : v.number());
  if (v.is_int() || v.is_bool()) {
    if (neg && v.int_value() == INT64_MIN) return ErrorAt(e.line, "integer overflow in unary -");
    return Value::Int(neg ? -v.int_value() : v.int_value());
  }
  return ErrorAt(e.line,
                 std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + v.TypeName() + "'");
}

StatusOr<Value> Interpreter::EvalCall(const Expr& e, Scope& scope) {
  const Expr& callee = *e.target;
  Value fn;
  if (callee.kind == Expr::Kind::kGetAttr) {
    FT_ASSIGN_OR_RETURN(Value obj, Eval(*callee.target, scope));
    if (obj.is_undefined()) return Undefined(*callee.target, "calling '" + callee.name + "()' on it");
    if (HasMethod(obj, callee.name)) {
      FT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope));
      FT_RETURN_IF_ERROR(Charge(ScanWork(obj) + ArgsWork(args), e.line));
      StatusOr<Value> r = CallMethod(*this, obj, callee.name, std::move(args));
      if (!r.ok()) return AtLine(e.line, r.status());
      return r;
    }
    FT_ASSIGN_OR_RETURN(fn, GetAttr(callee, obj, callee.name));
    if (!fn.is_callable()) {
      return ErrorAt(e.line,
                     std::string("'") + obj.TypeName() + "' object has no method '" + callee.name + "'");
    }
  } else {
    FT_ASSIGN_OR_RETURN(fn, Eval(callee, scope));
    if (fn.is_undefined()) return Undefined(callee, "called as a function");
    if (!fn.is_callable()) {
      return ErrorAt(e.line, "'" + Describe(callee) + "' is a " + fn.TypeName() + ", not a function");
    }
  }
  FT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope));
  StatusOr<Value> r = CallValue(fn, std::move(args));
  if (!r.ok()) return AtLine(e.line, r.status());
  return r;
}

StatusOr<Value> Interpreter::EvalFilterChain(const Expr& e, Scope& scope, const Value* block_input) {
  Value input;
  if (!e.target) {
    input = *block_input;
  } else if (e.target->kind == Expr::Kind::kFilter) {
    FT_ASSIGN_OR_RETURN(input, EvalFilterChain(*e.target, scope, block_input));
  } else {
    FT_ASSIGN_OR_RETURN(input, Eval(*e.target, scope));
  }
  FT_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope));
  FT_RETURN_IF_ERROR(Charge(ScanWork(input) + ArgsWork(args), e.line));
  StatusOr<Value> r = ApplyFilter(e.name, input, std::move(args));
  if (!r.ok()) return AtLine(e.line, r.status());
  FT_RETURN_IF_ERROR(CheckValue(*r, e.line));  // each filter of a chain, not only the last
  return r;
}

StatusOr<Value> Interpreter::EvalCompare(const Expr& e, Scope& scope) {
  FT_ASSIGN_OR_RETURN(Value left, Eval(*e.items[0], scope));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    FT_ASSIGN_OR_RETURN(Value right, Eval(*e.items[i + 1], scope));
    // Comparisons and `in` read their operands as deep as they go.
    FT_RETURN_IF_ERROR(Charge(left.size() + right.size(), e.line));
    const std::string& op = e.ops[i];
    bool r;
    if (op == "==" || op == "!=") {
      r = Equals(left, right) == (op == "==");
    } else if (op == "in" || op == "notin") {
      StatusOr<bool> c = Contains(right, left);
      if (!c.ok()) return AtLine(e.line, c.status());
      r = *c == (op == "in");
    } else {
      if (left.is_undefined()) return Undefined(*e.items[i], "compared with " + op);
      if (right.is_undefined()) return Undefined(*e.items[i + 1], "compared with " + op);
      StatusOr<int> c = Compare(left, right);
      if (!c.ok()) return AtLine(e.line, c.status());
      r = op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0;
    }
    if (!r) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

namespace {

StatusOr<Value> Repeat(const Value& seq, int64_t n) {
  const size_t unit = seq.is_string() ? seq.str().size() : seq.list().size();
  if (unit == 0) n = 0;
  const uint64_t unit_bytes = seq.is_string() ? unit : seq.size();  // see Value::size()
  if (n > 0 && (static_cast<uint64_t>(n) > (uint64_t{1} << 26) / unit ||
                static_cast<uint64_t>(n) > kMaxValueBytes / unit_bytes)) {
    return Status::InvalidArgument("repetition result is too large");
  }
  if (seq.is_string()) {
    // By doubling: a copy per byte, not an append per repetition ('x' * 1000000 is a million of those).
    const size_t total = unit * static_cast<size_t>(std::max<int64_t>(n, 0));
    std::string out;
    out.reserve(total);
    if (total > 0) out = seq.str();
    while (out.size() < total) out.append(out, 0, std::min(out.size(), total - out.size()));
    return Value::Str(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::List(std::move(out));
}

StatusOr<Value> IntOp(const std::string& op, int64_t a, int64_t b) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") overflow = __builtin_add_overflow(a, b, &r);
  if (op == "-") overflow = __builtin_sub_overflow(a, b, &r);
  if (op == "*") overflow = __builtin_mul_overflow(a, b, &r);
  if (op == "//" || op == "%") {
    if (b == 0) return Status::InvalidArgument("integer division or modulo by zero");
    if (a == INT64_MIN && b == -1) return Status::InvalidArgument("integer overflow in '" + op + "'");
    int64_t q = a / b, m = a % b;
    if (m != 0 && ((m < 0) != (b < 0))) {
      --q;
      m += b;
    }
    r = op == "//" ? q : m;
  }
  if (op == "**") {
    if (b < 0) return Value::Float(std::pow(static_cast<double>(a), static_cast<double>(b)));
    r = 1;  // by squaring, so huge exponents of 0, 1, -1 end quickly
    int64_t base = a;
    for (int64_t e = b; e > 0 && !overflow; e >>= 1) {
      if (e & 1) overflow = __builtin_mul_overflow(r, base, &r);
      if (e > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
    }
  }
  if (overflow) return Status::InvalidArgument("integer overflow in '" + op + "'");
  return Value::Int(r);
}

}  // namespace

StatusOr<Value> Interpreter::EvalBinary(const Expr& e, Scope& scope) {
  const std::string& op = e.name;
  FT_ASSIGN_OR_RETURN(Value l, Eval(*e.items[0], scope));
  FT_ASSIGN_OR_RETURN(Value r, Eval(*e.items[1], scope));
  if (op == "~") return Value::Str(l.ToStr() + r.ToStr());
  if (l.is_undefined()) return Undefined(*e.items[0], "operand of '" + op + "'");
  if (r.is_undefined()) return Undefined(*e.items[1], "operand of '" + op + "'");
  auto unsupported = [&]() {
    return ErrorAt(e.line, "unsupported operand types for " + op + ": '" + l.TypeName() + "' and '" +
                               r.TypeName() + "'");
  };
  if (l.is_number() && r.is_number()) {
    if (op == "/") {
      if (r.number() == 0) return ErrorAt(e.line, "division by zero");
      return Value::Float(l.number() / r.number());
    }
    if (!l.is_float() && !r.is_float()) {
      StatusOr<Value> v = IntOp(op, l.int_value(), r.int_value());
      if (!v.ok()) return AtLine(e.line, v.status());
      return v;
    }
    const double a = l.number(), b = r.number();
    if (op == "+") return Value::Float(a + b);
    if (op == "-") return Value::Float(a - b);
    if (op == "*") return Value::Float(a * b);
    if (op == "**") return Value::Float(std::pow(a, b));
    if (b == 0) return ErrorAt(e.line, "float division by zero");
    if (op == "//") return Value::Float(std::floor(a / b));
    if (op == "%") {
      double m = std::fmod(a, b);
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return Value::Float(m);
    }
    return unsupported();
  }
  if (op == "+") {
    if (l.is_string() && r.is_string()) return Value::Str(l.str() + r.str());
    if (l.is_list() && r.is_list()) {
      std::vector<Value> out = l.list();
      out.insert(out.end(), r.list().begin(), r.list().end());
      return Value::List(std::move(out));
    }
    return unsupported();
  }
  if (op == "*") {
    StatusOr<Value> rep = Status::InvalidArgument("");
    if ((l.is_string() || l.is_list()) && (r.is_int() || r.is_bool())) rep = Repeat(l, r.int_value());
    if ((r.is_string() || r.is_list()) && (l.is_int() || l.is_bool())) rep = Repeat(r, l.int_value());
    if (rep.ok()) return rep;
    if (!rep.status().message().empty()) return AtLine(e.line, rep.status());
  }
  if (op == "%" && l.is_string())
    return ErrorAt(e.line, "printf-style string formatting ('%') is not supported");
  return unsupported();
}

}  // namespace ft::jinja
