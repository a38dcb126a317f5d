// Values of the Jinja interpreter (engine/text/jinja/jinja.h), with Python semantics
// because Hugging Face renders chat templates with Python's jinja2: none,
// bool, int, float, str, list, dict (insertion-ordered, string keys), plus
// jinja2's Undefined, namespace() objects and callables (macros, globals).
//
// Strings, lists and dicts are immutable and shared, so copying a Value is
// cheap; a namespace is the one mutable object (`{% set ns.x = 1 %}` is seen
// through every reference to it).
//
// Values are bounded so that printing, comparing, serialising and freeing
// one never exhausts the stack or the memory: every value knows its depth
// (lists and dicts inside one another; a namespace counts as a leaf) and its
// size (bytes of its strings plus a few per item, counting a shared part as
// often as it appears: what printing it would write), and the interpreter
// refuses a value deeper than kMaxValueDepth or larger than kMaxValueBytes
// where an expression makes one; FromJson refuses JSON nested deeper.
// Namespaces, the one way to build a cycle or an unbounded chain, print as
// `<Namespace {...}>` where they recur or past that depth (Python prints the
// same for a cycle), and Repr stops a little past kMaxValueBytes, so what it
// returns is refused in turn.
//
// ToStr() is what `{{ value }}` prints (Python str(): None -> "None", True ->
// "True", lists and dicts as Python reprs, undefined -> ""). ToJson() is
// Hugging Face's `tojson` filter (json.dumps with ensure_ascii=False).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace ft::jinja {

class Value;
class Dict;
class Interpreter;

// Arguments of a call: positional, then keyword (in source order).
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Something a template can call: a global function, a macro, `caller`.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual const std::string& name() const = 0;
  // Errors carry no template line; the interpreter adds it.
  virtual StatusOr<Value> Call(Interpreter& interp, CallArgs args) const = 0;
};

struct Namespace;

// Lists and dicts nested deeper than this are refused (Python's jinja2 raises
// RecursionError near 1000; chat templates and tool schemas nest a handful).
constexpr int kMaxValueDepth = 256;
// Values (strings included) larger than this are refused (see above): the
// bound on a render's output, since a template prints what it is given.
constexpr uint64_t kMaxValueBytes = uint64_t{16} << 20;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value Str(std::string s);
  static Value List(std::vector<Value> items);
  // A list that prints as a Python tuple: (1, 2).
  static Value Tuple(std::vector<Value> items);
  static Value MakeDict(Dict d);
  static Value MakeNamespace(Dict attrs);
  static Value Func(std::shared_ptr<const Callable> fn);
  // JSON as values; InvalidArgument when it nests deeper than kMaxValueDepth.
  static StatusOr<Value> FromJson(const nlohmann::ordered_json& j);
  static StatusOr<Value> FromJson(const nlohmann::json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  // Accessors; calling the wrong one is a bug (FT_CHECK).
  bool bool_value() const;
  int64_t int_value() const;  // ints and bools
  double number() const;      // ints, floats and bools as double
  const std::string& str() const;
  const std::vector<Value>& list() const;
  const Dict& dict() const;  // dicts and namespaces
  Dict& mutable_namespace() const;
  const Callable& callable() const;

  bool Truthy() const;
  std::string ToStr() const;  // Python str()
  std::string Repr() const;   // Python repr()
  // Python's type name, for error messages: 'str', 'int', 'NoneType', ...
  const char* TypeName() const;
  // Lists and dicts inside one another: 0 for anything else (namespaces
  // included), 1 for a list or dict of those, and so on.
  int depth() const { return depth_; }
  // What printing the value writes, roughly: string bytes + 2, 8 per other
  // scalar or namespace, 2 per list or dict plus 2 per item and its key's
  // bytes; saturates instead of overflowing.
  uint64_t size() const { return size_; }

 private:
  struct NoneTag {};
  using Storage =
      std::variant<std::monostate, NoneTag, bool, int64_t, double, std::shared_ptr<const std::string>,
                   std::shared_ptr<const std::vector<Value>>, std::shared_ptr<const Dict>,
                   std::shared_ptr<Namespace>, std::shared_ptr<const Callable>>;
  // Repr into *out; `open` holds the attributes of the namespaces being
  // printed (see the file comment).
  void AppendRepr(std::vector<const Dict*>* open, std::string* out) const;
  static void AppendDictRepr(const Dict& d, std::vector<const Dict*>* open, std::string* out);
  explicit Value(Storage v, int depth = 0, uint64_t size = 8)
      : v_(std::move(v)), depth_(depth), size_(size) {}
  Storage v_;
  int depth_ = 0;
  uint64_t size_ = 8;
  bool tuple_ = false;  // a list that came from a tuple (affects Repr only)
};

// Insertion-ordered mapping from strings to values.
class Dict {
 public:
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);  // replaces in place, or appends
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

struct Namespace {
  Dict attrs;
};

// Python ==.
bool Equals(const Value& a, const Value& b);
// Python <, for numbers, strings and lists; -1/0/1. Errors name the types.
StatusOr<int> Compare(const Value& a, const Value& b);

// Hugging Face's tojson: json.dumps(v, ensure_ascii, indent, separators,
// sort_keys). Fails on undefined and callables.
struct JsonOptions {
  std::optional<int64_t> indent;  // none: one line
  bool ensure_ascii = false;
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
  bool sort_keys = false;
};
StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

}  // namespace ft::jinja
