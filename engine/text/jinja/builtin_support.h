// Internal to the Jinja built-ins (builtins.cc, filters.cc, methods.cc): the
// table entry every filter and method is, Python-style argument binding, and
// the helpers filters and methods share. Not for use outside engine/text/jinja.
//
// Errors are InvalidArgument without a template line (the interpreter adds
// it), naming the built-in and the argument.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/text/jinja/interpreter.h"
#include "engine/text/jinja/value.h"

namespace ft::jinja::builtin {

constexpr int64_t kMaxPad = 4096;  // widths for indent/center/tojson

inline Status Err(std::string msg) { return Status::InvalidArgument(std::move(msg)); }

// Builtins that multiply their input (join, replace, indent) check the size
// of what they build against kMaxValueBytes as they go, so a chain of them
// fails at the bound instead of first allocating gigabytes.
inline Status CheckResultSize(std::string_view fn, uint64_t bytes) {
  if (bytes <= kMaxValueBytes) return Status::OK();
  return Err(std::string(fn) + "(): the result would be larger than " + std::to_string(kMaxValueBytes >> 20) +
             " MiB");
}

// CallArgs bound to a Python-style parameter list: at most params.size()
// arguments, by position or by keyword. status() says what was wrong.
class Args {
 public:
  Args(std::string_view fn, const CallArgs& a, const std::vector<std::string_view>& params);
  const Status& status() const { return status_; }
  const std::string& name() const { return fn_; }  // the name it was called by (an alias too)
  const CallArgs& raw() const { return a_; }

  const Value* Get(size_t i) const;
  bool Has(size_t i) const { return Get(i) != nullptr; }
  Value Or(size_t i, Value def) const;
  bool Flag(size_t i, bool def) const;
  StatusOr<int64_t> Int(size_t i, int64_t def) const;
  StatusOr<std::optional<std::string>> OptStr(size_t i) const;
  StatusOr<std::string> Str(size_t i) const;

 private:
  std::string fn_;
  const CallArgs& a_;
  const std::vector<std::string_view>& names_;
  Status status_;
};

// One filter (`input | name(...)`) or method (`self.name(...)`).
struct Builtin {
  enum Flags : unsigned {
    kNone = 0,
    kVariadic = 1,      // takes any arguments as they come (args.raw()); params only document them
    kDefinedInput = 2,  // an undefined input is an error
  };
  using Fn = StatusOr<Value> (*)(Interpreter& interp, const Value& self, const Args& args);

  std::vector<std::string_view> names;   // the name, then its aliases
  std::vector<std::string_view> params;  // the arity: at most these, in this order
  std::string_view doc;                  // one line
  Fn fn;
  unsigned flags = kNone;
};

// The entry of `table` named `name` (or one of its aliases), or nullptr.
const Builtin* FindBuiltin(const std::vector<Builtin>& table, std::string_view name);
// Binds `args` to `b`'s parameters and calls it.
StatusOr<Value> CallBuiltin(const Builtin& b, Interpreter& interp, std::string_view name, const Value& self,
                            const CallArgs& args);

const std::vector<Builtin>& Filters();      // filters.cc
const std::vector<Builtin>& StrMethods();   // methods.cc
const std::vector<Builtin>& DictMethods();  // methods.cc

// ---- helpers shared by filters and methods ----
Value StrList(const std::vector<std::string>& parts);
// jinja2's attribute getter: "a.b.0" walks dict keys / attributes / indices.
Value GetPath(const Value& item, std::string_view path);
// `v` lowercased when it is a string and !case_sensitive.
Value LowerIfStr(const Value& v, bool case_sensitive);
// Stable sort by key; Compare errors surface. The comparisons are charged to
// the render's work first (CompareWork per comparison, n·log2(n) of them).
StatusOr<std::vector<Value>> SortValues(Interpreter& interp, std::vector<Value> items,
                                        const std::function<Value(const Value&)>& key, bool reverse);
// String built-ins that the filter and the str-method tables share (on
// self.ToStr(): a string's own text): upper, lower, title, capitalize,
// strip(chars) and replace(old, new, count).
StatusOr<Value> StrUpper(Interpreter&, const Value& self, const Args&);
StatusOr<Value> StrLower(Interpreter&, const Value& self, const Args&);
StatusOr<Value> StrTitle(Interpreter&, const Value& self, const Args&);
StatusOr<Value> StrCapitalize(Interpreter&, const Value& self, const Args&);
StatusOr<Value> StrStrip(Interpreter&, const Value& self, const Args& a);
StatusOr<Value> StrReplace(Interpreter&, const Value& self, const Args& a);
// Python's str.isupper()/islower() (ASCII): some cased character, none of the other case.
bool AllCased(const std::string& s, bool lower);

}  // namespace ft::jinja::builtin
