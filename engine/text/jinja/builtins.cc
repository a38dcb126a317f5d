#include "engine/text/jinja/builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <initializer_list>
#include <optional>

#include "engine/text/jinja/pystr.h"

namespace ft::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit
constexpr int64_t kMaxPad = 4096;      // widths for indent/center/tojson

Status Err(std::string msg) { return Status::InvalidArgument(msg); }

// Binds CallArgs to a Python-style parameter list.
class Args {
 public:
  Args(std::string_view fn, const CallArgs& a, std::initializer_list<std::string_view> names)
      : fn_(fn), a_(a), names_(names) {
    if (a.pos.size() > names_.size()) {
      status_ = Err(fn_ + "() takes at most " + std::to_string(names_.size()) + " argument(s), " +
                    std::to_string(a.pos.size()) + " given");
      return;
    }
    for (const auto& [k, v] : a.kw) {
      const auto it = std::find(names_.begin(), names_.end(), k);
      if (it == names_.end()) {
        status_ = Err(fn_ + "() got an unexpected keyword argument '" + k + "'");
        return;
      }
      if (static_cast<size_t>(it - names_.begin()) < a.pos.size()) {
        status_ = Err(fn_ + "() got multiple values for argument '" + k + "'");
        return;
      }
    }
  }
  const Status& status() const { return status_; }

  const Value* Get(size_t i) const {
    if (i < a_.pos.size()) return &a_.pos[i];
    for (const auto& [k, v] : a_.kw) {
      if (k == names_[i]) return &v;
    }
    return nullptr;
  }
  bool Has(size_t i) const { return Get(i) != nullptr; }
  Value Or(size_t i, Value def) const {
    const Value* v = Get(i);
    return v ? *v : std::move(def);
  }
  bool Flag(size_t i, bool def) const {
    const Value* v = Get(i);
    return v ? v->Truthy() : def;
  }
  StatusOr<int64_t> Int(size_t i, int64_t def) const {
    const Value* v = Get(i);
    if (!v || v->is_none()) return def;
    if (!v->is_int() && !v->is_bool())
      return Err(fn_ + "(): '" + std::string(names_[i]) + "' must be an integer");
    return v->int_value();
  }
  StatusOr<std::optional<std::string>> OptStr(size_t i) const {
    const Value* v = Get(i);
    if (!v || v->is_none() || v->is_undefined()) return std::optional<std::string>();
    if (!v->is_string()) return Err(fn_ + "(): '" + std::string(names_[i]) + "' must be a string");
    return std::optional<std::string>(v->str());
  }
  StatusOr<std::string> Str(size_t i) const {
    const Value* v = Get(i);
    if (!v) return Err(fn_ + "() missing required argument '" + std::string(names_[i]) + "'");
    if (!v->is_string())
      return Err(fn_ + "(): '" + std::string(names_[i]) + "' must be a string, not " + v->TypeName());
    return v->str();
  }

 private:
  std::string fn_;
  const CallArgs& a_;
  std::vector<std::string_view> names_;
  Status status_;
};

#define FT_ARGS(var, fn, args, ...)  \
  Args var(fn, args, {__VA_ARGS__}); \
  FT_RETURN_IF_ERROR(var.status())

Value StrList(const std::vector<std::string>& parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value::Str(p));
  return Value::List(std::move(out));
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// jinja2's attribute getter: "a.b.0" walks dict keys / attributes / indices.
Value GetPath(const Value& item, std::string_view path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string_view part = path.substr(start, dot == std::string_view::npos ? path.npos : dot - start);
    if ((cur.is_dict() || cur.is_namespace())) {
      const Value* v = cur.dict().Find(part);
      cur = v ? *v : Value();
    } else if (cur.is_list() && AllDigits(part)) {
      const size_t idx = std::stoul(std::string(part));
      cur = idx < cur.list().size() ? cur.list()[idx] : Value();
    } else {
      return Value();
    }
    if (dot == std::string_view::npos) return cur;
    start = dot + 1;
  }
}

Value LowerIfStr(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::Str(AsciiLower(v.str()));
  return v;
}

// Stable sort by key; Compare errors surface.
StatusOr<std::vector<Value>> SortValues(std::vector<Value> items,
                                        const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  keyed.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
  Status err;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (!err.ok()) return false;
    StatusOr<int> c = Compare(a.first, b.first);
    if (!c.ok()) {
      err = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  FT_RETURN_IF_ERROR(err);
  std::vector<Value> out;
  out.reserve(items.size());
  for (const auto& k : keyed) out.push_back(items[k.second]);
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// A double as an int64 (truncated), or nullopt when out of range or NaN.
std::optional<int64_t> DoubleToInt(double f) {
  if (!(f > -9.2e18 && f < 9.2e18)) return std::nullopt;
  return static_cast<int64_t>(f);
}

StatusOr<Value> ToInt(const Value& v, const Value& def, int64_t base) {
  if (base != 0 && (base < 2 || base > 36)) return Err("int(): base must be 0 or between 2 and 36");
  if (v.is_int() || v.is_bool()) return Value::Int(v.int_value());
  if (v.is_float()) {
    const std::optional<int64_t> i = DoubleToInt(v.number());
    return i ? Value::Int(*i) : def;
  }
  if (v.is_string()) {
    const std::string s = PyStrip(v.str(), std::nullopt, true, true);
    std::string digits;
    for (char c : s) {
      if (c != '_') digits.push_back(c);
    }
    if (digits.empty()) return def;
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
    if (end == digits.c_str() + digits.size() && errno == 0) return Value::Int(i);
    end = nullptr;
    const double f = std::strtod(digits.c_str(), &end);
    if (end == digits.c_str() + digits.size()) {
      const std::optional<int64_t> j = DoubleToInt(f);
      if (j) return Value::Int(*j);
    }
  }
  return def;
}

StatusOr<Value> ToFloat(const Value& v, const Value& def) {
  if (v.is_number()) return Value::Float(v.number());
  if (v.is_string()) {
    const std::string s = PyStrip(v.str(), std::nullopt, true, true);
    char* end = nullptr;
    const double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value::Float(f);
  }
  return def;
}

// Python round() (half to even) at `precision` digits.
double PyRound(double x, int64_t precision) {
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double y = x * scale;
  double r = std::nearbyint(y);  // default FE_TONEAREST: half to even
  return r / scale;
}

StatusOr<std::string> Indent(const std::string& s, const Value& width, bool first, bool blank) {
  std::string indention;
  if (width.is_string()) {
    indention = width.str();
  } else if (width.is_int() || width.is_bool()) {
    if (width.int_value() > kMaxPad) return Err("indent(): width is too large");
    indention.assign(static_cast<size_t>(std::max<int64_t>(width.int_value(), 0)), ' ');
  } else {
    return Err("indent(): 'width' must be an integer or a string");
  }
  std::vector<std::string> lines = PySplitLines(s + "\n");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : indention + lines[i]);
  }
  if (first) rv = indention + rv;
  return rv;
}

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

void AddGlobals(Scope* scope) {
  auto add = [&](const std::string& name, NativeFunction::Fn fn) {
    scope->Set(name, Value::Func(std::make_shared<NativeFunction>(name, std::move(fn))));
  };
  add("range", [](Interpreter&, CallArgs a) -> StatusOr<Value> {
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
  });
  add("dict", [](Interpreter&, CallArgs a) -> StatusOr<Value> {
    Dict d;
    if (a.pos.size() > 1) return Err("dict() expects at most 1 positional argument");
    if (a.pos.size() == 1) {
      if (!a.pos[0].is_dict()) return Err("dict(): positional argument must be a dict");
      d = a.pos[0].dict();
    }
    for (auto& [k, v] : a.kw) d.Set(k, std::move(v));
    return Value::MakeDict(std::move(d));
  });
  add("namespace", [](Interpreter&, CallArgs a) -> StatusOr<Value> {
    Dict d;
    if (a.pos.size() > 1) return Err("namespace() expects at most 1 positional argument");
    if (a.pos.size() == 1) {
      if (!a.pos[0].is_dict()) return Err("namespace(): positional argument must be a dict");
      d = a.pos[0].dict();
    }
    for (auto& [k, v] : a.kw) d.Set(k, std::move(v));
    return Value::MakeNamespace(std::move(d));
  });
  add("raise_exception", [](Interpreter&, CallArgs a) -> StatusOr<Value> {
    std::string msg;
    if (!a.pos.empty()) msg = a.pos[0].ToStr();
    return Err("template raised an error: " + msg);
  });
  add("strftime_now", [](Interpreter&, CallArgs a) -> StatusOr<Value> {
    if (a.pos.size() != 1 || !a.pos[0].is_string()) return Err("strftime_now() expects one format string");
    const std::time_t now = std::time(nullptr);
    std::tm tm_buf{};
    localtime_r(&now, &tm_buf);
    std::string fmt = a.pos[0].str();
    std::vector<char> buf(256 + fmt.size() * 16);
    const size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm_buf);
    return Value::Str(std::string(buf.data(), n));
  });
}

// ---- tests ----

StatusOr<bool> CallTest(Interpreter& interp, std::string_view name, const Value& v, CallArgs args) {
  static constexpr std::string_view kWithArgument[] = {
      "divisibleby", "eq", "equalto", "==", "sameas",      "ne", "!=", "lt", "lessthan",
      "<",           "le", "<=",      "gt", "greaterthan", ">",  "ge", ">=", "in"};
  if ((!args.pos.empty() || !args.kw.empty()) &&
      std::find(std::begin(kWithArgument), std::end(kWithArgument), name) == std::end(kWithArgument)) {
    return Err("test '" + std::string(name) + "' takes no argument");
  }
  auto need_arg = [&]() -> StatusOr<Value> {
    if (args.pos.size() != 1) return Err("test '" + std::string(name) + "' expects one argument");
    return args.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "lower" || name == "upper") {
    const std::string s = v.ToStr();
    const bool lower = name == "lower";
    bool cased = false;
    for (char c : s) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        cased = true;
        if (lower ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
      }
    }
    return cased;
  }
  if (name == "even" || name == "odd") {
    if (!v.is_int() && !v.is_bool()) return Err("test '" + std::string(name) + "' needs an integer");
    const int64_t r = ((v.int_value() % 2) + 2) % 2;
    return name == "even" ? r == 0 : r == 1;
  }
  if (name == "divisibleby") {
    FT_ASSIGN_OR_RETURN(Value n, need_arg());
    if (!v.is_number() || !n.is_number()) return Err("test 'divisibleby' needs numbers");
    if (n.number() == 0) return Err("divisibleby: division by zero");
    return std::fmod(v.number(), n.number()) == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") {
    FT_ASSIGN_OR_RETURN(Value other, need_arg());
    return Equals(v, other);
  }
  if (name == "ne" || name == "!=") {
    FT_ASSIGN_OR_RETURN(Value other, need_arg());
    return !Equals(v, other);
  }
  if (name == "lt" || name == "lessthan" || name == "<" || name == "le" || name == "<=" || name == "gt" ||
      name == "greaterthan" || name == ">" || name == "ge" || name == ">=") {
    FT_ASSIGN_OR_RETURN(Value other, need_arg());
    FT_ASSIGN_OR_RETURN(int c, Compare(v, other));
    if (name == "lt" || name == "lessthan" || name == "<") return c < 0;
    if (name == "le" || name == "<=") return c <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return c > 0;
    return c >= 0;
  }
  if (name == "in") {
    FT_ASSIGN_OR_RETURN(Value seq, need_arg());
    return Contains(seq, v);
  }
  (void)interp;
  return Err("unknown test '" + std::string(name) + "'");
}

// ---- filters ----

namespace {

StatusOr<Value> SelectReject(Interpreter& interp, std::string_view fn, const Value& input, CallArgs args,
                             bool select, bool by_attr) {
  FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  std::string attr;
  size_t first = 0;
  if (by_attr) {
    if (args.pos.empty() || !args.pos[0].is_string()) {
      return Err(std::string(fn) + "() needs the attribute name as its first argument");
    }
    attr = args.pos[0].str();
    first = 1;
  }
  std::string test;
  if (args.pos.size() > first) {
    if (!args.pos[first].is_string()) return Err(std::string(fn) + "(): the test name must be a string");
    test = args.pos[first].str();
  }
  CallArgs test_args;
  for (size_t i = first + 1; i < args.pos.size(); ++i) test_args.pos.push_back(args.pos[i]);
  test_args.kw = args.kw;
  std::vector<Value> out;
  for (const Value& item : items) {
    const Value subject = by_attr ? GetPath(item, attr) : item;
    bool pass;
    if (test.empty()) {
      pass = subject.Truthy();
    } else {
      FT_ASSIGN_OR_RETURN(pass, interp.ApplyTest(test, subject, test_args));
    }
    if (pass == select) out.push_back(item);
  }
  return Value::List(std::move(out));
}

StatusOr<Value> MinMax(const Value& input, const CallArgs& args, bool is_max) {
  FT_ARGS(a, is_max ? "max" : "min", args, "case_sensitive", "attribute");
  FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  if (items.empty()) return Value();
  const bool cs = a.Flag(0, false);
  FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(1));
  auto key = [&](const Value& v) { return LowerIfStr(attr ? GetPath(v, *attr) : v, cs); };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    FT_ASSIGN_OR_RETURN(int c, Compare(key(items[i]), key(items[best])));
    if (is_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

}  // namespace

StatusOr<Value> CallFilter(Interpreter& interp, std::string_view name, const Value& v, CallArgs args) {
  const std::string fn(name);
  if (v.is_undefined() &&
      (name == "int" || name == "float" || name == "indent" || name == "abs" || name == "round")) {
    return Err("filter '" + fn + "' applied to an undefined value");
  }
  if (name == "tojson") {
    FT_ARGS(a, fn, args, "ensure_ascii", "indent", "separators", "sort_keys");
    JsonOptions o;
    o.ensure_ascii = a.Flag(0, false);
    if (a.Has(1) && !a.Get(1)->is_none()) {
      FT_ASSIGN_OR_RETURN(int64_t indent, a.Int(1, 0));
      if (indent > kMaxPad) return Err("tojson(): indent is too large");
      o.indent = indent;
    }
    if (a.Has(2) && !a.Get(2)->is_none()) {
      const Value& s = *a.Get(2);
      if (!s.is_list() || s.list().size() != 2 || !s.list()[0].is_string() || !s.list()[1].is_string()) {
        return Err("tojson(): 'separators' must be a pair of strings");
      }
      o.separators = std::make_pair(s.list()[0].str(), s.list()[1].str());
    }
    o.sort_keys = a.Flag(3, false);
    FT_ASSIGN_OR_RETURN(std::string json, ToJson(v, o));
    return Value::Str(std::move(json));
  }
  if (name == "default" || name == "d") {
    FT_ARGS(a, fn, args, "default_value", "boolean");
    const bool boolean = a.Flag(1, false);
    if (v.is_undefined() || (boolean && !v.Truthy())) return a.Or(0, Value::Str(""));
    return v;
  }
  if (name == "length" || name == "count") {
    FT_ARGS(a, fn, args);
    if (v.is_string()) return Value::Int(CodePointCount(v.str()));
    if (v.is_list()) return Value::Int(static_cast<int64_t>(v.list().size()));
    if (v.is_dict() || v.is_namespace()) return Value::Int(static_cast<int64_t>(v.dict().size()));
    if (v.is_undefined()) return Value::Int(0);
    return Err(std::string("object of type '") + v.TypeName() + "' has no len()");
  }
  if (name == "trim") {
    FT_ARGS(a, fn, args, "chars");
    FT_ASSIGN_OR_RETURN(std::optional<std::string> chars, a.OptStr(0));
    return Value::Str(PyStrip(v.ToStr(), chars, true, true));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    FT_ARGS(a, fn, args);
    const std::string s = v.ToStr();
    if (name == "upper") return Value::Str(AsciiUpper(s));
    if (name == "lower") return Value::Str(AsciiLower(s));
    if (name == "title") return Value::Str(PyTitle(s));
    return Value::Str(PyCapitalize(s));
  }
  if (name == "string") {
    FT_ARGS(a, fn, args);
    return Value::Str(v.ToStr());
  }
  if (name == "safe") return v;
  if (name == "escape" || name == "e") return Value::Str(HtmlEscape(v.ToStr()));
  if (name == "first" || name == "last") {
    FT_ARGS(a, fn, args);
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    FT_ARGS(a, fn, args);
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "reverse") {
    FT_ARGS(a, fn, args);
    if (v.is_string()) {
      FT_ASSIGN_OR_RETURN(std::vector<Value> chars, Iterate(v));
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->str();
      return Value::Str(std::move(out));
    }
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "join") {
    FT_ARGS(a, fn, args, "d", "attribute");
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    const std::string sep = a.Has(0) ? a.Get(0)->ToStr() : "";
    FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(1));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += sep;
      out += (attr ? GetPath(items[i], *attr) : items[i]).ToStr();
    }
    return Value::Str(std::move(out));
  }
  if (name == "replace") {
    FT_ARGS(a, fn, args, "old", "new", "count");
    FT_ASSIGN_OR_RETURN(std::string old_s, a.Str(0));
    FT_ASSIGN_OR_RETURN(std::string new_s, a.Str(1));
    FT_ASSIGN_OR_RETURN(int64_t count, a.Int(2, -1));
    return Value::Str(PyReplace(v.ToStr(), old_s, new_s, count));
  }
  if (name == "items") {
    FT_ARGS(a, fn, args);
    if (v.is_undefined()) return Value::List({});
    if (!v.is_dict()) return Err(std::string("items(): expected a dict, got '") + v.TypeName() + "'");
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict().items()) out.push_back(Value::Tuple({Value::Str(k), x}));
    return Value::List(std::move(out));
  }
  if (name == "dictsort") {
    FT_ARGS(a, fn, args, "case_sensitive", "by", "reverse");
    if (!v.is_dict()) return Err(std::string("dictsort(): expected a dict, got '") + v.TypeName() + "'");
    const bool cs = a.Flag(0, false);
    FT_ASSIGN_OR_RETURN(std::optional<std::string> by, a.OptStr(1));
    const int pos = (!by || *by == "key") ? 0 : (*by == "value" ? 1 : -1);
    if (pos < 0) return Err("dictsort(): 'by' must be 'key' or 'value'");
    std::vector<Value> pairs;
    for (const auto& [k, x] : v.dict().items()) pairs.push_back(Value::Tuple({Value::Str(k), x}));
    FT_ASSIGN_OR_RETURN(pairs,
                        SortValues(
                            std::move(pairs), [&](const Value& p) { return LowerIfStr(p.list()[pos], cs); },
                            a.Flag(2, false)));
    return Value::List(std::move(pairs));
  }
  if (name == "sort") {
    FT_ARGS(a, fn, args, "reverse", "case_sensitive", "attribute");
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    const bool cs = a.Flag(1, false);
    FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(2));
    FT_ASSIGN_OR_RETURN(
        items,
        SortValues(
            std::move(items), [&](const Value& x) { return LowerIfStr(attr ? GetPath(x, *attr) : x, cs); },
            a.Flag(0, false)));
    return Value::List(std::move(items));
  }
  if (name == "unique") {
    FT_ARGS(a, fn, args, "case_sensitive", "attribute");
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    const bool cs = a.Flag(0, false);
    FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(1));
    std::vector<Value> out, seen;
    for (const Value& x : items) {
      const Value key = LowerIfStr(attr ? GetPath(x, *attr) : x, cs);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
        seen.push_back(key);
        out.push_back(x);
      }
    }
    return Value::List(std::move(out));
  }
  if (name == "min" || name == "max") return MinMax(v, args, name == "max");
  if (name == "sum") {
    FT_ARGS(a, fn, args, "attribute", "start");
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(0));
    Value total = a.Or(1, Value::Int(0));
    for (const Value& x : items) {
      const Value y = attr ? GetPath(x, *attr) : x;
      if (!y.is_number() || !total.is_number()) return Err("sum(): items must be numbers");
      if (y.is_float() || total.is_float()) {
        total = Value::Float(total.number() + y.number());
      } else {
        int64_t t;
        if (__builtin_add_overflow(total.int_value(), y.int_value(), &t))
          return Err("sum(): integer overflow");
        total = Value::Int(t);
      }
    }
    return total;
  }
  if (name == "abs") {
    FT_ARGS(a, fn, args);
    if (v.is_float()) return Value::Float(std::fabs(v.number()));
    if (v.is_int() || v.is_bool()) {
      if (v.int_value() == INT64_MIN) return Err("abs(): integer overflow");
      return Value::Int(v.int_value() < 0 ? -v.int_value() : v.int_value());
    }
    return Err(std::string("abs(): bad operand type '") + v.TypeName() + "'");
  }
  if (name == "int") {
    FT_ARGS(a, fn, args, "default", "base");
    FT_ASSIGN_OR_RETURN(int64_t base, a.Int(1, 10));
    return ToInt(v, a.Or(0, Value::Int(0)), base);
  }
  if (name == "float") {
    FT_ARGS(a, fn, args, "default");
    return ToFloat(v, a.Or(0, Value::Float(0.0)));
  }
  if (name == "round") {
    FT_ARGS(a, fn, args, "precision", "method");
    FT_ASSIGN_OR_RETURN(int64_t precision, a.Int(0, 0));
    FT_ASSIGN_OR_RETURN(std::optional<std::string> method, a.OptStr(1));
    if (!v.is_number()) return Err(std::string("round(): expected a number, got '") + v.TypeName() + "'");
    const double x = v.number(), scale = std::pow(10.0, static_cast<double>(precision));
    if (!method || *method == "common") return Value::Float(PyRound(x, precision));
    if (*method == "ceil") return Value::Float(std::ceil(x * scale) / scale);
    if (*method == "floor") return Value::Float(std::floor(x * scale) / scale);
    return Err("round(): method must be 'common', 'ceil' or 'floor'");
  }
  if (name == "indent") {
    FT_ARGS(a, fn, args, "width", "first", "blank");
    if (!v.is_string()) return Err(std::string("indent(): expected a string, got '") + v.TypeName() + "'");
    FT_ASSIGN_OR_RETURN(std::string s,
                        Indent(v.ToStr(), a.Or(0, Value::Int(4)), a.Flag(1, false), a.Flag(2, false)));
    return Value::Str(std::move(s));
  }
  if (name == "center") {
    FT_ARGS(a, fn, args, "width");
    FT_ASSIGN_OR_RETURN(int64_t width, a.Int(0, 80));
    if (width > kMaxPad) return Err("center(): width is too large");
    const std::string s = v.ToStr();
    const int64_t n = CodePointCount(s);
    if (width <= n) return Value::Str(s);
    const int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
    return Value::Str(std::string(left, ' ') + s + std::string(pad - left, ' '));
  }
  if (name == "wordcount") {
    FT_ARGS(a, fn, args);
    return Value::Int(static_cast<int64_t>(PySplit(v.ToStr(), std::nullopt, -1).size()));
  }
  if (name == "attr") {
    FT_ARGS(a, fn, args, "name");
    FT_ASSIGN_OR_RETURN(std::string attr, a.Str(0));
    if (v.is_dict() || v.is_namespace()) {
      const Value* x = v.dict().Find(attr);
      return x ? *x : Value();
    }
    return Value();
  }
  if (name == "select" || name == "reject")
    return SelectReject(interp, name, v, std::move(args), name == "select", false);
  if (name == "selectattr" || name == "rejectattr") {
    return SelectReject(interp, name, v, std::move(args), name == "selectattr", true);
  }
  if (name == "map") {
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::vector<Value> out;
    if (args.pos.empty()) {
      std::optional<std::string> attr;
      Value def;
      bool has_default = false;
      for (const auto& [k, x] : args.kw) {
        if (k == "attribute" && x.is_string()) {
          attr = x.str();
        } else if (k == "default") {
          def = x;
          has_default = true;
        } else {
          return Err("map(): unexpected keyword argument '" + k + "'");
        }
      }
      if (!attr) return Err("map() needs a filter name or attribute=");
      for (const Value& x : items) {
        Value y = GetPath(x, *attr);
        out.push_back(y.is_undefined() && has_default ? def : y);
      }
      return Value::List(std::move(out));
    }
    if (!args.pos[0].is_string()) return Err("map(): the filter name must be a string");
    const std::string filter = args.pos[0].str();
    CallArgs rest;
    rest.pos.assign(args.pos.begin() + 1, args.pos.end());
    rest.kw = args.kw;
    for (const Value& x : items) {
      FT_ASSIGN_OR_RETURN(Value y, interp.ApplyFilter(filter, x, rest));
      out.push_back(std::move(y));
    }
    return Value::List(std::move(out));
  }
  return Err("unknown filter '" + fn + "'");
}

// ---- methods ----

bool HasMethod(const Value& obj, std::string_view name) {
  static constexpr std::string_view kStr[] = {
      "startswith", "endswith", "strip",   "lstrip",  "rstrip",     "split",   "rsplit",  "splitlines",
      "replace",    "upper",    "lower",   "title",   "capitalize", "find",    "rfind",   "index",
      "count",      "join",     "isdigit", "isalpha", "isalnum",    "isspace", "islower", "isupper"};
  static constexpr std::string_view kDict[] = {"items", "keys", "values", "get"};
  if (obj.is_string()) return std::find(std::begin(kStr), std::end(kStr), name) != std::end(kStr);
  if (obj.is_dict()) return std::find(std::begin(kDict), std::end(kDict), name) != std::end(kDict);
  return false;
}

StatusOr<Value> CallMethod(Interpreter& interp, const Value& obj, std::string_view name, CallArgs args) {
  (void)interp;
  const std::string fn(name);
  if (obj.is_dict()) {
    const Dict& d = obj.dict();
    if (name == "items" || name == "keys" || name == "values") {
      FT_ARGS(a, fn, args);
      std::vector<Value> out;
      for (const auto& [k, x] : d.items()) {
        if (name == "items") out.push_back(Value::Tuple({Value::Str(k), x}));
        if (name == "keys") out.push_back(Value::Str(k));
        if (name == "values") out.push_back(x);
      }
      return Value::List(std::move(out));
    }
    if (name == "get") {
      FT_ARGS(a, fn, args, "key", "default");
      if (!a.Has(0)) return Err("get() missing required argument 'key'");
      const Value& key = *a.Get(0);
      const Value* x = key.is_string() ? d.Find(key.str()) : nullptr;
      return x ? *x : a.Or(1, Value::None());
    }
  }
  if (!obj.is_string()) return Err(std::string("'") + obj.TypeName() + "' object has no method '" + fn + "'");
  const std::string& s = obj.str();
  if (name == "startswith" || name == "endswith") {
    FT_ARGS(a, fn, args, "prefix");
    if (!a.Has(0)) return Err(fn + "() takes at least 1 argument");
    return StrStartsEnds(s, *a.Get(0), name == "endswith", name);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    FT_ARGS(a, fn, args, "chars");
    FT_ASSIGN_OR_RETURN(std::optional<std::string> chars, a.OptStr(0));
    return Value::Str(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    FT_ARGS(a, fn, args, "sep", "maxsplit");
    FT_ASSIGN_OR_RETURN(std::optional<std::string> sep, a.OptStr(0));
    FT_ASSIGN_OR_RETURN(int64_t maxsplit, a.Int(1, -1));
    if (sep && sep->empty()) return Err(fn + "(): empty separator");
    return StrList(name == "split" ? PySplit(s, sep, maxsplit) : PyRSplit(s, sep, maxsplit));
  }
  if (name == "splitlines") {
    FT_ARGS(a, fn, args);
    return StrList(PySplitLines(s));
  }
  if (name == "replace") {
    FT_ARGS(a, fn, args, "old", "new", "count");
    FT_ASSIGN_OR_RETURN(std::string old_s, a.Str(0));
    FT_ASSIGN_OR_RETURN(std::string new_s, a.Str(1));
    FT_ASSIGN_OR_RETURN(int64_t count, a.Int(2, -1));
    return Value::Str(PyReplace(s, old_s, new_s, count));
  }
  if (name == "upper") return Value::Str(AsciiUpper(s));
  if (name == "lower") return Value::Str(AsciiLower(s));
  if (name == "title") return Value::Str(PyTitle(s));
  if (name == "capitalize") return Value::Str(PyCapitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    FT_ARGS(a, fn, args, "sub");
    FT_ASSIGN_OR_RETURN(std::string sub, a.Str(0));
    if (name == "count") return Value::Int(PyCount(s, sub));
    const int64_t at = PyFind(s, sub, name == "rfind");
    if (at < 0 && name == "index") return Err("index(): substring not found");
    return Value::Int(at);
  }
  if (name == "join") {
    FT_ARGS(a, fn, args, "iterable");
    if (!a.Has(0)) return Err("join() takes exactly one argument");
    FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a.Get(0)));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return Err("join(): sequence item " + std::to_string(i) + ": expected str, got " +
                   items[i].TypeName());
      }
      if (i) out += s;
      out += items[i].str();
    }
    return Value::Str(std::move(out));
  }
  FT_ARGS(a, fn, args);
  if (name == "isdigit") return Value::Bool(AllChars(s, [](char c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha") {
    return Value::Bool(AllChars(s, [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }));
  }
  if (name == "isalnum") {
    return Value::Bool(AllChars(s, [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    }));
  }
  if (name == "isspace") return Value::Bool(!s.empty() && PyStrip(s, std::nullopt, true, true).empty());
  if (name == "islower" || name == "isupper") {
    CallArgs none;
    FT_ASSIGN_OR_RETURN(bool r, CallTest(interp, name == "islower" ? "lower" : "upper", obj, none));
    return Value::Bool(r);
  }
  return Err("'str' object has no method '" + fn + "'");
}

}  // namespace ft::jinja
