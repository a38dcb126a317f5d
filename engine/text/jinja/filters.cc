// The filter table: jinja2 3.1's filters that chat templates use, each once
// with its parameters and a one-line description, and CallFilter over it.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "engine/text/jinja/builtin_support.h"
#include "engine/text/jinja/builtins.h"
#include "engine/text/jinja/pystr.h"

namespace ft::jinja {

namespace {

using builtin::Args;
using builtin::Builtin;
using builtin::CheckResultSize;
using builtin::Err;
using I = Interpreter;
using V = Value;
using A = Args;
using builtin::GetPath;
using builtin::kMaxPad;
using builtin::LowerIfStr;
using builtin::SortValues;

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
  FT_RETURN_IF_ERROR(CheckResultSize("indent", s.size() + (lines.size() + 1) * uint64_t{indention.size()}));
  // Appended piece by piece: GCC 12 at -O3 flags `"\n" + std::string` chains with a false
  // -Wrestrict (GCC bug 105329), which failed Release builds.
  std::string rv = first ? indention : std::string();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) rv += '\n';
    if (i > 0 && (blank || !lines[i].empty())) rv += indention;
    rv += lines[i];
  }
  return rv;
}

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

StatusOr<Value> MinMax(Interpreter& interp, const Value& input, const Args& a, bool is_max) {
  FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  if (items.empty()) return Value();
  const bool cs = a.Flag(0, false);
  FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(1));
  auto key = [&](const Value& v) { return LowerIfStr(attr ? GetPath(v, *attr) : v, cs); };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    FT_RETURN_IF_ERROR(interp.ChargeWork(CompareWork(items[i])));
    FT_ASSIGN_OR_RETURN(int c, Compare(key(items[i]), key(items[best])));
    if (is_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

StatusOr<Value> ToJsonFilter(Interpreter&, const Value& v, const Args& a) {
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

StatusOr<Value> Length(Interpreter&, const Value& v, const Args&) {
  if (v.is_string()) return Value::Int(CodePointCount(v.str()));
  if (v.is_list()) return Value::Int(static_cast<int64_t>(v.list().size()));
  if (v.is_dict() || v.is_namespace()) return Value::Int(static_cast<int64_t>(v.dict().size()));
  if (v.is_undefined()) return Value::Int(0);
  return Err(std::string("object of type '") + v.TypeName() + "' has no len()");
}

StatusOr<Value> Reverse(Interpreter&, const Value& v, const Args&) {
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

StatusOr<Value> Join(Interpreter&, const Value& v, const Args& a) {
  const std::string sep = a.Has(0) ? a.Get(0)->ToStr() : "";
  if (v.is_string()) {  // one item per code point: refuse a result too large before splitting
    const uint64_t n = CodePointCount(v.str());
    FT_RETURN_IF_ERROR(CheckResultSize("join", v.str().size() + (n > 0 ? n - 1 : 0) * uint64_t{sep.size()}));
  }
  FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(1));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += (attr ? GetPath(items[i], *attr) : items[i]).ToStr();
    FT_RETURN_IF_ERROR(CheckResultSize("join", out.size()));
  }
  return Value::Str(std::move(out));
}

StatusOr<Value> Items(Interpreter&, const Value& v, const Args&) {
  if (v.is_undefined()) return Value::List({});
  if (!v.is_dict()) return Err(std::string("items(): expected a dict, got '") + v.TypeName() + "'");
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict().items()) out.push_back(Value::Tuple({Value::Str(k), x}));
  return Value::List(std::move(out));
}

StatusOr<Value> DictSort(Interpreter& interp, const Value& v, const Args& a) {
  if (!v.is_dict()) return Err(std::string("dictsort(): expected a dict, got '") + v.TypeName() + "'");
  const bool cs = a.Flag(0, false);
  FT_ASSIGN_OR_RETURN(std::optional<std::string> by, a.OptStr(1));
  const int pos = (!by || *by == "key") ? 0 : (*by == "value" ? 1 : -1);
  if (pos < 0) return Err("dictsort(): 'by' must be 'key' or 'value'");
  std::vector<Value> pairs;
  for (const auto& [k, x] : v.dict().items()) pairs.push_back(Value::Tuple({Value::Str(k), x}));
  auto key = [&](const Value& p) { return LowerIfStr(p.list()[pos], cs); };
  FT_ASSIGN_OR_RETURN(pairs, SortValues(interp, std::move(pairs), key, a.Flag(2, false)));
  return Value::List(std::move(pairs));
}

StatusOr<Value> Sort(Interpreter& interp, const Value& v, const Args& a) {
  FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  const bool cs = a.Flag(1, false);
  FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(2));
  auto key = [&](const Value& x) { return LowerIfStr(attr ? GetPath(x, *attr) : x, cs); };
  FT_ASSIGN_OR_RETURN(items, SortValues(interp, std::move(items), key, a.Flag(0, false)));
  return Value::List(std::move(items));
}

StatusOr<Value> Unique(Interpreter& interp, const Value& v, const Args& a) {
  FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  const bool cs = a.Flag(0, false);
  FT_ASSIGN_OR_RETURN(std::optional<std::string> attr, a.OptStr(1));
  std::vector<Value> out, seen;
  for (const Value& x : items) {
    const Value key = LowerIfStr(attr ? GetPath(x, *attr) : x, cs);
    // Compared with every key kept so far: quadratic in the items, so charged as it goes.
    FT_RETURN_IF_ERROR(interp.ChargeWork(seen.size() * CompareWork(key)));
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
      seen.push_back(key);
      out.push_back(x);
    }
  }
  return Value::List(std::move(out));
}

StatusOr<Value> Sum(Interpreter&, const Value& v, const Args& a) {
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
      if (__builtin_add_overflow(total.int_value(), y.int_value(), &t)) return Err("sum(): integer overflow");
      total = Value::Int(t);
    }
  }
  return total;
}

StatusOr<Value> Abs(Interpreter&, const Value& v, const Args&) {
  if (v.is_float()) return Value::Float(std::fabs(v.number()));
  if (v.is_int() || v.is_bool()) {
    if (v.int_value() == INT64_MIN) return Err("abs(): integer overflow");
    return Value::Int(v.int_value() < 0 ? -v.int_value() : v.int_value());
  }
  return Err(std::string("abs(): bad operand type '") + v.TypeName() + "'");
}

StatusOr<Value> Round(Interpreter&, const Value& v, const Args& a) {
  FT_ASSIGN_OR_RETURN(int64_t precision, a.Int(0, 0));
  FT_ASSIGN_OR_RETURN(std::optional<std::string> method, a.OptStr(1));
  if (!v.is_number()) return Err(std::string("round(): expected a number, got '") + v.TypeName() + "'");
  const double x = v.number(), scale = std::pow(10.0, static_cast<double>(precision));
  if (!method || *method == "common") return Value::Float(PyRound(x, precision));
  if (*method == "ceil") return Value::Float(std::ceil(x * scale) / scale);
  if (*method == "floor") return Value::Float(std::floor(x * scale) / scale);
  return Err("round(): method must be 'common', 'ceil' or 'floor'");
}

StatusOr<Value> Center(Interpreter&, const Value& v, const Args& a) {
  FT_ASSIGN_OR_RETURN(int64_t width, a.Int(0, 80));
  if (width > kMaxPad) return Err("center(): width is too large");
  const std::string s = v.ToStr();
  const int64_t n = CodePointCount(s);
  if (width <= n) return Value::Str(s);
  const int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
  return Value::Str(std::string(left, ' ') + s + std::string(pad - left, ' '));
}

StatusOr<Value> Attr(Interpreter&, const Value& v, const Args& a) {
  FT_ASSIGN_OR_RETURN(std::string attr, a.Str(0));
  if (v.is_dict() || v.is_namespace()) {
    const Value* x = v.dict().Find(attr);
    return x ? *x : Value();
  }
  return Value();
}

// map(attribute=..., default=...): each item's attribute.
StatusOr<Value> MapAttribute(const std::vector<Value>& items, const CallArgs& args) {
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
  std::vector<Value> out;
  for (const Value& x : items) {
    Value y = GetPath(x, *attr);
    out.push_back(y.is_undefined() && has_default ? def : y);
  }
  return Value::List(std::move(out));
}

StatusOr<Value> Map(Interpreter& interp, const Value& v, const Args& a) {
  const CallArgs& args = a.raw();
  FT_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (args.pos.empty()) return MapAttribute(items, args);
  if (!args.pos[0].is_string()) return Err("map(): the filter name must be a string");
  const std::string filter = args.pos[0].str();
  CallArgs rest;
  rest.pos.assign(args.pos.begin() + 1, args.pos.end());
  rest.kw = args.kw;
  std::vector<Value> out;
  for (const Value& x : items) {
    FT_ASSIGN_OR_RETURN(Value y, interp.ApplyFilter(filter, x, rest));
    out.push_back(std::move(y));
  }
  return Value::List(std::move(out));
}

const std::vector<Builtin> kFilters = {
    {{"tojson"},
     {"ensure_ascii", "indent", "separators", "sort_keys"},
     "JSON text (json.dumps, ensure_ascii=False: Hugging Face's tojson)",
     ToJsonFilter},
    {{"default", "d"},
     {"default_value", "boolean"},
     "the value, or default_value when undefined (or falsy)",
     [](I&, const V& v, const A& a) -> StatusOr<V> {
       if (v.is_undefined() || (a.Flag(1, false) && !v.Truthy())) return a.Or(0, V::Str(""));
       return v;
     }},
    {{"length", "count"}, {}, "len(): code points of a string, items of a list or dict", Length},
    {{"trim"}, {"chars"}, "str.strip(chars)", builtin::StrStrip},
    {{"upper"}, {}, "ASCII upper case", builtin::StrUpper},
    {{"lower"}, {}, "ASCII lower case", builtin::StrLower},
    {{"title"}, {}, "str.title()", builtin::StrTitle},
    {{"capitalize"}, {}, "str.capitalize()", builtin::StrCapitalize},
    {{"string"}, {}, "str(value)", [](I&, const V& v, const A&) -> StatusOr<V> { return V::Str(v.ToStr()); }},
    {{"safe"},
     {},
     "the value unchanged (no autoescaping here)",
     [](I&, const V& v, const A&) -> StatusOr<V> { return v; },
     Builtin::kVariadic},
    {{"escape", "e"},
     {},
     "HTML-escaped string (& < > \" ')",
     [](I&, const V& v, const A&) -> StatusOr<V> { return V::Str(HtmlEscape(v.ToStr())); },
     Builtin::kVariadic},
    {{"first"},
     {},
     "the first item (undefined when empty)",
     [](I&, const V& v, const A&) -> StatusOr<V> {
       FT_ASSIGN_OR_RETURN(std::vector<V> items, Iterate(v));
       return items.empty() ? V() : items.front();
     }},
    {{"last"},
     {},
     "the last item (undefined when empty)",
     [](I&, const V& v, const A&) -> StatusOr<V> {
       FT_ASSIGN_OR_RETURN(std::vector<V> items, Iterate(v));
       return items.empty() ? V() : items.back();
     }},
    {{"list"},
     {},
     "list(value): items, dict keys or characters",
     [](I&, const V& v, const A&) -> StatusOr<V> {
       FT_ASSIGN_OR_RETURN(std::vector<V> items, Iterate(v));
       return V::List(std::move(items));
     }},
    {{"reverse"}, {}, "the items (or characters) in reverse order", Reverse},
    {{"join"}, {"d", "attribute"}, "the items (or their attribute) as strings joined by d", Join},
    {{"replace"}, {"old", "new", "count"}, "str.replace(old, new, count)", builtin::StrReplace},
    {{"items"}, {}, "a dict's (key, value) pairs", Items},
    {{"dictsort"},
     {"case_sensitive", "by", "reverse"},
     "a dict's (key, value) pairs sorted by key or value",
     DictSort},
    {{"sort"}, {"reverse", "case_sensitive", "attribute"}, "the items sorted (stable)", Sort},
    {{"unique"}, {"case_sensitive", "attribute"}, "the items without repeats, first kept", Unique},
    {{"min"},
     {"case_sensitive", "attribute"},
     "the smallest item",
     [](I& in, const V& v, const A& a) { return MinMax(in, v, a, false); }},
    {{"max"},
     {"case_sensitive", "attribute"},
     "the largest item",
     [](I& in, const V& v, const A& a) { return MinMax(in, v, a, true); }},
    {{"sum"}, {"attribute", "start"}, "start + the sum of the items (or their attribute)", Sum},
    {{"abs"}, {}, "the absolute value", Abs, Builtin::kDefinedInput},
    {{"int"},
     {"default", "base"},
     "int(value, base), or default when it does not convert",
     [](I&, const V& v, const A& a) -> StatusOr<V> {
       FT_ASSIGN_OR_RETURN(int64_t base, a.Int(1, 10));
       return ToInt(v, a.Or(0, V::Int(0)), base);
     },
     Builtin::kDefinedInput},
    {{"float"},
     {"default"},
     "float(value), or default when it does not convert",
     [](I&, const V& v, const A& a) { return ToFloat(v, a.Or(0, V::Float(0.0))); },
     Builtin::kDefinedInput},
    {{"round"},
     {"precision", "method"},
     "rounded: common (half to even), ceil or floor",
     Round,
     Builtin::kDefinedInput},
    {{"indent"},
     {"width", "first", "blank"},
     "every line but the first (and blank ones) indented",
     [](I&, const V& v, const A& a) -> StatusOr<V> {
       if (!v.is_string()) return Err(std::string("indent(): expected a string, got '") + v.TypeName() + "'");
       FT_ASSIGN_OR_RETURN(std::string s,
                           Indent(v.ToStr(), a.Or(0, V::Int(4)), a.Flag(1, false), a.Flag(2, false)));
       return V::Str(std::move(s));
     },
     Builtin::kDefinedInput},
    {{"center"}, {"width"}, "the string centered in width spaces", Center},
    {{"wordcount"},
     {},
     "the number of whitespace-separated words",
     [](I&, const V& v, const A&) -> StatusOr<V> {
       return V::Int(static_cast<int64_t>(PySplit(v.ToStr(), std::nullopt, -1).size()));
     }},
    {{"attr"}, {"name"}, "a dict's or namespace's attribute (undefined when missing)", Attr},
    {{"select"},
     {"test", "*args"},
     "the items that pass the test (truthy ones without a test)",
     [](I& in, const V& v, const A& a) { return SelectReject(in, "select", v, a.raw(), true, false); },
     Builtin::kVariadic},
    {{"reject"},
     {"test", "*args"},
     "the items that fail the test (falsy ones without a test)",
     [](I& in, const V& v, const A& a) { return SelectReject(in, "reject", v, a.raw(), false, false); },
     Builtin::kVariadic},
    {{"selectattr"},
     {"attribute", "test", "*args"},
     "the items whose attribute passes the test",
     [](I& in, const V& v, const A& a) { return SelectReject(in, "selectattr", v, a.raw(), true, true); },
     Builtin::kVariadic},
    {{"rejectattr"},
     {"attribute", "test", "*args"},
     "the items whose attribute fails the test",
     [](I& in, const V& v, const A& a) { return SelectReject(in, "rejectattr", v, a.raw(), false, true); },
     Builtin::kVariadic},
    {{"map"},
     {"filter", "*args", "attribute", "default"},
     "a filter applied to each item, or each item's attribute",
     Map,
     Builtin::kVariadic},
};

}  // namespace

namespace builtin {

const std::vector<Builtin>& Filters() { return kFilters; }

}  // namespace builtin

StatusOr<Value> CallFilter(Interpreter& interp, std::string_view name, const Value& v, CallArgs args) {
  const Builtin* f = builtin::FindBuiltin(builtin::Filters(), name);
  if (!f) return Err("unknown filter '" + std::string(name) + "'");
  if ((f->flags & Builtin::kDefinedInput) && v.is_undefined()) {
    return Err("filter '" + std::string(name) + "' applied to an undefined value");
  }
  return builtin::CallBuiltin(*f, interp, name, v, args);
}

}  // namespace ft::jinja
