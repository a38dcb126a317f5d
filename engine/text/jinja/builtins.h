// Built-ins of the Jinja interpreter: jinja2's filters and tests, the Python
// str/dict methods templates call (`content.startswith('x')`,
// `message.get('k')`), and the globals Hugging Face provides (range, dict,
// namespace, raise_exception, strftime_now). Semantics are Python's and
// jinja2 3.1's; Hugging Face's `tojson` is json.dumps(ensure_ascii=False).
// Each kind is one table (filters.cc, methods.cc, builtins.cc) that lists
// every built-in once with its parameters and a one-line description.
//
// Errors carry no template line (the interpreter adds it) and say what was
// wrong with which argument.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/text/jinja/interpreter.h"
#include "engine/text/jinja/value.h"

namespace ft::jinja {

// A global function implemented in C++.
class NativeFunction : public Callable {
 public:
  using Fn = std::function<StatusOr<Value>(Interpreter&, CallArgs)>;
  NativeFunction(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  const std::string& name() const override { return name_; }
  StatusOr<Value> Call(Interpreter& interp, CallArgs args) const override {
    return fn_(interp, std::move(args));
  }

 private:
  std::string name_;
  Fn fn_;
};

// Adds range, dict, namespace, raise_exception and strftime_now to `scope`.
void AddGlobals(Scope* scope);

// `input | name(args)`. Unknown filters are an error naming the filter.
StatusOr<Value> CallFilter(Interpreter& interp, std::string_view name, const Value& input, CallArgs args);
// `input is name(args)`.
StatusOr<bool> CallTest(Interpreter& interp, std::string_view name, const Value& input, CallArgs args);

// Whether `obj.name(...)` is a method of obj's type (str or dict methods).
bool HasMethod(const Value& obj, std::string_view name);
StatusOr<Value> CallMethod(Interpreter& interp, const Value& obj, std::string_view name, CallArgs args);

// One built-in as its table lists it (each once, aliases with it), for the
// documentation and the tests.
struct BuiltinInfo {
  std::string_view kind;                 // "filter", "test", "str method", "dict method" or "global"
  std::vector<std::string_view> names;   // the name, then its aliases
  std::vector<std::string_view> params;  // its parameters, in order (the arity)
  std::string_view doc;                  // one line
};
std::vector<BuiltinInfo> ListBuiltins();

// Python `item in container`.
StatusOr<bool> Contains(const Value& container, const Value& item);
// Python iter(): list items, dict keys, string characters; undefined is empty.
StatusOr<std::vector<Value>> Iterate(const Value& v);

}  // namespace ft::jinja
