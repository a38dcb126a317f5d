// The Jinja built-ins outside the filter and method tables (filters.cc,
// methods.cc): iteration and `in`, the tests table (`x is name`), the globals
// Hugging Face provides, and the listing of every table.
#include "engine/text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>

#include "engine/text/jinja/builtin_support.h"
#include "engine/text/jinja/pystr.h"

namespace ft::jinja {

namespace {

using builtin::Err;

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit

}  // namespace

StatusOr<std::vector<Value>> Iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_undefined()) return std::vector<Value>();
  if (v.is_dict()) {
    std::vector<Value> keys;
    for (const auto& [k, x] : v.dict().items()) keys.push_back(Value::Str(k));
    return keys;
  }
  if (v.is_string()) {
    std::vector<Value> chars;
    const std::string& s = v.str();
    const std::vector<size_t> starts = CodePointStarts(s);
    for (size_t i = 0; i < starts.size(); ++i) {
      const size_t end = i + 1 < starts.size() ? starts[i + 1] : s.size();
      chars.push_back(Value::Str(s.substr(starts[i], end - starts[i])));
    }
    return chars;
  }
  return Err(std::string("'") + v.TypeName() + "' object is not iterable");
}

StatusOr<bool> Contains(const Value& container, const Value& item) {
  if (container.is_list()) {
    for (const Value& v : container.list()) {
      if (Equals(v, item)) return true;
    }
    return false;
  }
  if (container.is_string()) {
    if (!item.is_string()) {
      return Err(std::string("'in <string>' requires string as left operand, not ") + item.TypeName());
    }
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_dict()) {
    return item.is_string() && container.dict().Find(item.str()) != nullptr;
  }
  if (container.is_undefined()) return false;
  return Err(std::string("argument of type '") + container.TypeName() + "' is not iterable");
}

// ---- globals ----

namespace {

StatusOr<Value> Range(Interpreter&, CallArgs a) {
  if (!a.kw.empty()) return Err("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) return Err("range() expects 1 to 3 integer arguments");
  for (const Value& v : a.pos) {
    if (!v.is_int() && !v.is_bool())
      return Err(std::string("range(): '") + v.TypeName() + "' is not an integer");
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].int_value();
  } else {
    start = a.pos[0].int_value();
    stop = a.pos[1].int_value();
    if (a.pos.size() == 3) step = a.pos[2].int_value();
  }
  if (step == 0) return Err("range() step must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      return Err("range() is too long (more than " + std::to_string(kMaxRange) + " items)");
    }
    out.push_back(Value::Int(i));
  }
  return Value::List(std::move(out));
}

// dict(mapping, **kwargs) and namespace(mapping, **kwargs): their entries.
StatusOr<Dict> Entries(const std::string& fn, CallArgs a) {
  Dict d;
  if (a.pos.size() > 1) return Err(fn + "() expects at most 1 positional argument");
  if (a.pos.size() == 1) {
    if (!a.pos[0].is_dict()) return Err(fn + "(): positional argument must be a dict");
    d = a.pos[0].dict();
  }
  for (auto& [k, v] : a.kw) d.Set(k, std::move(v));
  return d;
}

StatusOr<Value> DictGlobal(Interpreter&, CallArgs a) {
  FT_ASSIGN_OR_RETURN(Dict d, Entries("dict", std::move(a)));
  return Value::MakeDict(std::move(d));
}

StatusOr<Value> NamespaceGlobal(Interpreter& interp, CallArgs a) {
  FT_ASSIGN_OR_RETURN(Dict d, Entries("namespace", std::move(a)));
  return interp.NewNamespace(std::move(d));
}

StatusOr<Value> RaiseException(Interpreter&, CallArgs a) {
  std::string msg;
  if (!a.pos.empty()) msg = a.pos[0].ToStr();
  return Err("template raised an error: " + msg);
}

StatusOr<Value> StrftimeNow(Interpreter&, CallArgs a) {
  if (a.pos.size() != 1 || !a.pos[0].is_string()) return Err("strftime_now() expects one format string");
  const std::time_t now = std::time(nullptr);
  std::tm tm_buf{};
  localtime_r(&now, &tm_buf);
  std::string fmt = a.pos[0].str();
  std::vector<char> buf(256 + fmt.size() * 16);
  const size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm_buf);
  return Value::Str(std::string(buf.data(), n));
}

struct Global {
  std::string_view name;
  std::vector<std::string_view> params;
  std::string_view doc;
  StatusOr<Value> (*fn)(Interpreter&, CallArgs);
};

const std::vector<Global>& Globals() {
  static const std::vector<Global> kGlobals = {
      {"range",
       {"start", "stop", "step"},
       "the integers from start to stop by step (at most 100,000)",
       Range},
      {"dict", {"mapping", "**kwargs"}, "a dict of the mapping and the keyword arguments", DictGlobal},
      {"namespace",
       {"mapping", "**kwargs"},
       "a namespace whose attributes a template may set",
       NamespaceGlobal},
      {"raise_exception", {"message"}, "stops the render with the message (Hugging Face)", RaiseException},
      {"strftime_now", {"format"}, "the local time formatted by strftime (Hugging Face)", StrftimeNow},
  };
  return kGlobals;
}

}  // namespace

void AddGlobals(Scope* scope) {
  for (const Global& g : Globals()) {
    const std::string name(g.name);
    scope->Set(name, Value::Func(std::make_shared<NativeFunction>(name, g.fn)));
  }
}

// ---- tests ----

namespace {

// One test (`value is name` or `value is name(arg)`).
struct Test {
  std::vector<std::string_view> names;  // the name, then its aliases
  int arity;                            // 0: no argument; 1: exactly one
  std::string_view doc;
  StatusOr<bool> (*fn)(const Value& v, const Value& arg);
};

StatusOr<bool> Parity(const Value& v, std::string_view name, int remainder) {
  if (!v.is_int() && !v.is_bool()) return Err("test '" + std::string(name) + "' needs an integer");
  return ((v.int_value() % 2) + 2) % 2 == remainder;
}

StatusOr<bool> Ordered(const Value& v, const Value& other, bool (*holds)(int)) {
  FT_ASSIGN_OR_RETURN(int c, Compare(v, other));
  return holds(c);
}

const std::vector<Test>& Tests() {
  using V = Value;
  using R = StatusOr<bool>;
  static const std::vector<Test> kTests = {
      {{"defined"}, 0, "not undefined", [](const V& v, const V&) -> R { return !v.is_undefined(); }},
      {{"undefined"}, 0, "undefined", [](const V& v, const V&) -> R { return v.is_undefined(); }},
      {{"none"}, 0, "None", [](const V& v, const V&) -> R { return v.is_none(); }},
      {{"boolean"}, 0, "True or False", [](const V& v, const V&) -> R { return v.is_bool(); }},
      {{"false"}, 0, "False", [](const V& v, const V&) -> R { return v.is_bool() && !v.bool_value(); }},
      {{"true"}, 0, "True", [](const V& v, const V&) -> R { return v.is_bool() && v.bool_value(); }},
      {{"integer"}, 0, "an int", [](const V& v, const V&) -> R { return v.is_int(); }},
      {{"float"}, 0, "a float", [](const V& v, const V&) -> R { return v.is_float(); }},
      {{"number"}, 0, "an int, float or bool", [](const V& v, const V&) -> R { return v.is_number(); }},
      {{"string"}, 0, "a str", [](const V& v, const V&) -> R { return v.is_string(); }},
      {{"mapping"}, 0, "a dict", [](const V& v, const V&) -> R { return v.is_dict(); }},
      {{"iterable"},
       0,
       "a list, dict, str or undefined",
       [](const V& v, const V&) -> R {
         return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
       }},
      {{"sequence"},
       0,
       "a list, dict, str or undefined",
       [](const V& v, const V&) -> R {
         return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
       }},
      {{"callable"}, 0, "a function or macro", [](const V& v, const V&) -> R { return v.is_callable(); }},
      {{"lower"},
       0,
       "some cased character and no upper case one",
       [](const V& v, const V&) -> R { return builtin::AllCased(v.ToStr(), true); }},
      {{"upper"},
       0,
       "some cased character and no lower case one",
       [](const V& v, const V&) -> R { return builtin::AllCased(v.ToStr(), false); }},
      {{"even"}, 0, "an even integer", [](const V& v, const V&) { return Parity(v, "even", 0); }},
      {{"odd"}, 0, "an odd integer", [](const V& v, const V&) { return Parity(v, "odd", 1); }},
      {{"divisibleby"},
       1,
       "a number divisible by arg",
       [](const V& v, const V& n) -> R {
         if (!v.is_number() || !n.is_number()) return Err("test 'divisibleby' needs numbers");
         if (n.number() == 0) return Err("divisibleby: division by zero");
         return std::fmod(v.number(), n.number()) == 0;
       }},
      {{"eq", "equalto", "==", "sameas"},
       1,
       "equal to arg",
       [](const V& v, const V& o) -> R { return Equals(v, o); }},
      {{"ne", "!="}, 1, "not equal to arg", [](const V& v, const V& o) -> R { return !Equals(v, o); }},
      {{"lt", "lessthan", "<"},
       1,
       "less than arg",
       [](const V& v, const V& o) { return Ordered(v, o, [](int c) { return c < 0; }); }},
      {{"le", "<="},
       1,
       "less than or equal to arg",
       [](const V& v, const V& o) { return Ordered(v, o, [](int c) { return c <= 0; }); }},
      {{"gt", "greaterthan", ">"},
       1,
       "greater than arg",
       [](const V& v, const V& o) { return Ordered(v, o, [](int c) { return c > 0; }); }},
      {{"ge", ">="},
       1,
       "greater than or equal to arg",
       [](const V& v, const V& o) { return Ordered(v, o, [](int c) { return c >= 0; }); }},
      {{"in"},
       1,
       "an item of (or a substring of) arg",
       [](const V& v, const V& seq) { return Contains(seq, v); }},
  };
  return kTests;
}

}  // namespace

StatusOr<bool> CallTest(Interpreter&, std::string_view name, const Value& v, CallArgs args) {
  const std::string fn(name);
  for (const Test& t : Tests()) {
    if (std::find(t.names.begin(), t.names.end(), name) == t.names.end()) continue;
    if (t.arity == 0) {
      if (!args.pos.empty() || !args.kw.empty()) return Err("test '" + fn + "' takes no argument");
      return t.fn(v, Value());
    }
    if (args.pos.size() != 1) return Err("test '" + fn + "' expects one argument");
    return t.fn(v, args.pos[0]);
  }
  return Err("unknown test '" + fn + "'");
}

// ---- the listing ----

std::vector<BuiltinInfo> ListBuiltins() {
  std::vector<BuiltinInfo> out;
  const std::pair<std::string_view, const std::vector<builtin::Builtin>*> tables[] = {
      {"filter", &builtin::Filters()},
      {"str method", &builtin::StrMethods()},
      {"dict method", &builtin::DictMethods()}};
  for (const auto& [kind, table] : tables) {
    for (const builtin::Builtin& b : *table) out.push_back({kind, b.names, b.params, b.doc});
  }
  for (const Test& t : Tests()) {
    out.push_back({"test", t.names,
                   t.arity ? std::vector<std::string_view>{"arg"} : std::vector<std::string_view>{}, t.doc});
  }
  for (const Global& g : Globals()) out.push_back({"global", {g.name}, g.params, g.doc});
  return out;
}

}  // namespace ft::jinja
