// The method tables: the Python str and dict methods chat templates call
// (`content.startswith('x')`, `message.get('k')`), each once with its
// parameters and a one-line description, and CallMethod over them.
#include <algorithm>
#include <optional>

#include "engine/text/jinja/builtin_support.h"
#include "engine/text/jinja/builtins.h"
#include "engine/text/jinja/pystr.h"

namespace ft::jinja {

namespace {

using builtin::AllCased;
using builtin::Args;
using builtin::Builtin;
using builtin::CheckResultSize;
using builtin::Err;
using I = Interpreter;
using V = Value;
using A = Args;
using builtin::StrList;

StatusOr<Value> StrStartsEnds(const std::string& s, const Value& arg, bool ends, std::string_view fn) {
  auto check = [&](const std::string& p) {
    return ends ? (s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
                : s.rfind(p, 0) == 0;
  };
  if (arg.is_string()) return Value::Bool(check(arg.str()));
  if (arg.is_list()) {
    for (const Value& p : arg.list()) {
      if (!p.is_string()) return Err(std::string(fn) + "(): tuple items must be strings");
      if (check(p.str())) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  return Err(std::string(fn) + "() argument must be a string or a tuple of strings, not " + arg.TypeName());
}

bool AllChars(const std::string& s, bool (*pred)(char)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), pred);
}

StatusOr<Value> DictList(const Value& obj, int which) {  // 0 items, 1 keys, 2 values
  std::vector<Value> out;
  for (const auto& [k, x] : obj.dict().items()) {
    out.push_back(which == 0 ? Value::Tuple({Value::Str(k), x}) : which == 1 ? Value::Str(k) : x);
  }
  return Value::List(std::move(out));
}

StatusOr<Value> Split(const Value& obj, const Args& a, bool right) {
  FT_ASSIGN_OR_RETURN(std::optional<std::string> sep, a.OptStr(0));
  FT_ASSIGN_OR_RETURN(int64_t maxsplit, a.Int(1, -1));
  if (sep && sep->empty()) return Err(a.name() + "(): empty separator");
  return StrList(right ? PyRSplit(obj.str(), sep, maxsplit) : PySplit(obj.str(), sep, maxsplit));
}

StatusOr<Value> Find(const Value& obj, const Args& a, bool right, bool must_find) {
  FT_ASSIGN_OR_RETURN(std::string sub, a.Str(0));
  const int64_t at = PyFind(obj.str(), sub, right);
  if (at < 0 && must_find) return Err("index(): substring not found");
  return Value::Int(at);
}

StatusOr<Value> JoinMethod(Interpreter&, const Value& obj, const Args& a) {
  if (!a.Has(0)) return Err("join() takes exactly one argument");
  FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a.Get(0)));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return Err("join(): sequence item " + std::to_string(i) + ": expected str, got " + items[i].TypeName());
    }
    if (i) out += obj.str();
    out += items[i].str();
    FT_RETURN_IF_ERROR(CheckResultSize("join", out.size()));
  }
  return Value::Str(std::move(out));
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

const std::vector<Builtin> kStr = {
    {{"startswith"},
     {"prefix"},
     "whether it starts with prefix (or one of a tuple of them)",
     [](I&, const V& s, const A& a) -> StatusOr<V> {
       if (!a.Has(0)) return Err("startswith() takes at least 1 argument");
       return StrStartsEnds(s.str(), *a.Get(0), false, "startswith");
     }},
    {{"endswith"},
     {"suffix"},
     "whether it ends with suffix (or one of a tuple of them)",
     [](I&, const V& s, const A& a) -> StatusOr<V> {
       if (!a.Has(0)) return Err("endswith() takes at least 1 argument");
       return StrStartsEnds(s.str(), *a.Get(0), true, "endswith");
     }},
    {{"strip"}, {"chars"}, "without leading and trailing chars (whitespace)", builtin::StrStrip},
    {{"lstrip"},
     {"chars"},
     "without leading chars (whitespace)",
     [](I&, const V& s, const A& a) -> StatusOr<V> {
       FT_ASSIGN_OR_RETURN(std::optional<std::string> chars, a.OptStr(0));
       return V::Str(PyStrip(s.str(), chars, true, false));
     }},
    {{"rstrip"},
     {"chars"},
     "without trailing chars (whitespace)",
     [](I&, const V& s, const A& a) -> StatusOr<V> {
       FT_ASSIGN_OR_RETURN(std::optional<std::string> chars, a.OptStr(0));
       return V::Str(PyStrip(s.str(), chars, false, true));
     }},
    {{"split"},
     {"sep", "maxsplit"},
     "the parts between sep (runs of whitespace)",
     [](I&, const V& s, const A& a) { return Split(s, a, false); }},
    {{"rsplit"},
     {"sep", "maxsplit"},
     "split from the right",
     [](I&, const V& s, const A& a) { return Split(s, a, true); }},
    {{"splitlines"},
     {},
     "the lines, without their line breaks",
     [](I&, const V& s, const A&) -> StatusOr<V> { return StrList(PySplitLines(s.str())); }},
    {{"replace"},
     {"old", "new", "count"},
     "with old replaced by new (the first count times)",
     builtin::StrReplace},
    {{"upper"}, {}, "ASCII upper case", builtin::StrUpper, Builtin::kVariadic},
    {{"lower"}, {}, "ASCII lower case", builtin::StrLower, Builtin::kVariadic},
    {{"title"}, {}, "each word capitalized", builtin::StrTitle, Builtin::kVariadic},
    {{"capitalize"},
     {},
     "the first character upper case, the rest lower",
     builtin::StrCapitalize,
     Builtin::kVariadic},
    {{"find"},
     {"sub"},
     "the index of the first sub, or -1",
     [](I&, const V& s, const A& a) { return Find(s, a, false, false); }},
    {{"rfind"},
     {"sub"},
     "the index of the last sub, or -1",
     [](I&, const V& s, const A& a) { return Find(s, a, true, false); }},
    {{"index"},
     {"sub"},
     "the index of the first sub (an error when absent)",
     [](I&, const V& s, const A& a) { return Find(s, a, false, true); }},
    {{"count"},
     {"sub"},
     "the number of non-overlapping sub",
     [](I&, const V& s, const A& a) -> StatusOr<V> {
       FT_ASSIGN_OR_RETURN(std::string sub, a.Str(0));
       return V::Int(PyCount(s.str(), sub));
     }},
    {{"join"}, {"iterable"}, "the strings of iterable joined by this one", JoinMethod},
    {{"isdigit"},
     {},
     "non-empty and all ASCII digits",
     [](I&, const V& s, const A&) -> StatusOr<V> { return V::Bool(AllChars(s.str(), IsDigit)); }},
    {{"isalpha"},
     {},
     "non-empty and all ASCII letters",
     [](I&, const V& s, const A&) -> StatusOr<V> { return V::Bool(AllChars(s.str(), IsAlpha)); }},
    {{"isalnum"},
     {},
     "non-empty and all ASCII letters or digits",
     [](I&, const V& s, const A&) -> StatusOr<V> {
       return V::Bool(AllChars(s.str(), [](char c) { return IsAlpha(c) || IsDigit(c); }));
     }},
    {{"isspace"},
     {},
     "non-empty and all whitespace",
     [](I&, const V& s, const A&) -> StatusOr<V> {
       return V::Bool(!s.str().empty() && PyStrip(s.str(), std::nullopt, true, true).empty());
     }},
    {{"islower"},
     {},
     "some cased character and no upper case one",
     [](I&, const V& s, const A&) -> StatusOr<V> { return V::Bool(AllCased(s.str(), true)); }},
    {{"isupper"},
     {},
     "some cased character and no lower case one",
     [](I&, const V& s, const A&) -> StatusOr<V> { return V::Bool(AllCased(s.str(), false)); }},
};

const std::vector<Builtin> kDict = {
    {{"items"}, {}, "the (key, value) pairs", [](I&, const V& d, const A&) { return DictList(d, 0); }},
    {{"keys"}, {}, "the keys", [](I&, const V& d, const A&) { return DictList(d, 1); }},
    {{"values"}, {}, "the values", [](I&, const V& d, const A&) { return DictList(d, 2); }},
    {{"get"},
     {"key", "default"},
     "the value at key, or default (None)",
     [](I&, const V& d, const A& a) -> StatusOr<V> {
       if (!a.Has(0)) return Err("get() missing required argument 'key'");
       const V& key = *a.Get(0);
       const V* x = key.is_string() ? d.dict().Find(key.str()) : nullptr;
       return x ? *x : a.Or(1, V::None());
     }},
};

}  // namespace

namespace builtin {

const std::vector<Builtin>& DictMethods() { return kDict; }

const std::vector<Builtin>& StrMethods() { return kStr; }

}  // namespace builtin

namespace {
const std::vector<builtin::Builtin>* MethodsOf(const Value& obj) {
  if (obj.is_string()) return &builtin::StrMethods();
  if (obj.is_dict()) return &builtin::DictMethods();
  return nullptr;
}
}  // namespace

bool HasMethod(const Value& obj, std::string_view name) {
  const std::vector<Builtin>* table = MethodsOf(obj);
  return table && builtin::FindBuiltin(*table, name) != nullptr;
}

StatusOr<Value> CallMethod(Interpreter& interp, const Value& obj, std::string_view name, CallArgs args) {
  const std::vector<Builtin>* table = MethodsOf(obj);
  const Builtin* m = table ? builtin::FindBuiltin(*table, name) : nullptr;
  if (!m)
    return Err(std::string("'") + obj.TypeName() + "' object has no method '" + std::string(name) + "'");
  return builtin::CallBuiltin(*m, interp, name, obj, args);
}

}  // namespace ft::jinja
