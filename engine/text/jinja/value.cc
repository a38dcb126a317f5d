#include "engine/text/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/text/jinja/pystr.h"

namespace ft::jinja {

Value Value::None() { return Value(NoneTag{}); }
Value Value::Bool(bool b) { return Value(b); }
Value Value::Int(int64_t i) { return Value(i); }
Value Value::Float(double f) { return Value(f); }
namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace

Value Value::Str(std::string s) {
  const uint64_t size = s.size() + 2;
  return Value(std::make_shared<const std::string>(std::move(s)), 0, size);
}
Value Value::List(std::vector<Value> items) {
  int depth = 0;
  uint64_t size = 2;
  for (const Value& v : items) {
    depth = std::max(depth, v.depth_);
    size = SaturatingAdd(size, SaturatingAdd(v.size_, 2));
  }
  return Value(std::make_shared<const std::vector<Value>>(std::move(items)), depth + 1, size);
}
Value Value::Tuple(std::vector<Value> items) {
  Value v = List(std::move(items));
  v.tuple_ = true;
  return v;
}
Value Value::MakeDict(Dict d) {
  int depth = 0;
  uint64_t size = 2;
  for (const auto& [key, v] : d.items()) {
    depth = std::max(depth, v.depth_);
    size = SaturatingAdd(size, SaturatingAdd(v.size_, key.size() + 4));
  }
  return Value(std::make_shared<const Dict>(std::move(d)), depth + 1, size);
}
Value Value::MakeNamespace(Dict attrs) {
  return Value(std::make_shared<Namespace>(Namespace{std::move(attrs)}));
}
Value Value::Func(std::shared_ptr<const Callable> fn) { return Value(std::move(fn)); }

namespace {

template <typename Json>
StatusOr<Value> ConvertJson(const Json& j, int depth) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::None();
    case nlohmann::json::value_t::boolean: return Value::Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::Float(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::Str(j.template get<std::string>());
    default: break;  // containers below; binary and discarded are None
  }
  if (!j.is_array() && !j.is_object()) return Value::None();
  if (depth >= kMaxValueDepth) {
    return Status::InvalidArgument("JSON value nested more than " + std::to_string(kMaxValueDepth) +
                                   " levels deep");
  }
  if (j.is_array()) {
    std::vector<Value> items;
    items.reserve(j.size());
    for (const auto& e : j) {
      FT_ASSIGN_OR_RETURN(Value v, ConvertJson(e, depth + 1));
      items.push_back(std::move(v));
    }
    return Value::List(std::move(items));
  }
  Dict d;
  for (auto it = j.begin(); it != j.end(); ++it) {
    FT_ASSIGN_OR_RETURN(Value v, ConvertJson(it.value(), depth + 1));
    d.Set(it.key(), std::move(v));
  }
  return Value::MakeDict(std::move(d));
}

}  // namespace

StatusOr<Value> Value::FromJson(const nlohmann::ordered_json& j) { return ConvertJson(j, 0); }
StatusOr<Value> Value::FromJson(const nlohmann::json& j) { return ConvertJson(j, 0); }

bool Value::bool_value() const {
  FT_CHECK(is_bool());
  return std::get<bool>(v_);
}
int64_t Value::int_value() const {
  if (is_bool()) return std::get<bool>(v_) ? 1 : 0;
  FT_CHECK(is_int());
  return std::get<int64_t>(v_);
}
double Value::number() const {
  if (is_float()) return std::get<double>(v_);
  return static_cast<double>(int_value());
}
const std::string& Value::str() const {
  FT_CHECK(is_string());
  return *std::get<std::shared_ptr<const std::string>>(v_);
}
const std::vector<Value>& Value::list() const {
  FT_CHECK(is_list());
  return *std::get<std::shared_ptr<const std::vector<Value>>>(v_);
}
const Dict& Value::dict() const {
  if (is_namespace()) return std::get<std::shared_ptr<Namespace>>(v_)->attrs;
  FT_CHECK(is_dict());
  return *std::get<std::shared_ptr<const Dict>>(v_);
}
Dict& Value::mutable_namespace() const {
  FT_CHECK(is_namespace());
  return std::get<std::shared_ptr<Namespace>>(v_)->attrs;
}
const Callable& Value::callable() const {
  FT_CHECK(is_callable());
  return *std::get<std::shared_ptr<const Callable>>(v_);
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return bool_value();
    case Kind::kInt: return int_value() != 0;
    case Kind::kFloat: return number() != 0.0;
    case Kind::kString: return !str().empty();
    case Kind::kList: return !list().empty();
    case Kind::kDict: return !dict().empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "?";
}

std::string Value::ToStr() const {
  switch (kind()) {
    case Kind::kUndefined: return "";
    case Kind::kString: return str();
    default: return Repr();
  }
}

std::string Value::Repr() const {
  std::vector<const Dict*> open;
  std::string out;
  AppendRepr(&open, &out);
  return out;
}

void Value::AppendDictRepr(const Dict& d, std::vector<const Dict*>* open, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : d.items()) {
    if (out->size() > kMaxValueBytes) return;
    if (!first) *out += ", ";
    first = false;
    *out += PyStrRepr(k);
    *out += ": ";
    v.AppendRepr(open, out);
  }
  out->push_back('}');
}

void Value::AppendRepr(std::vector<const Dict*>* open, std::string* out) const {
  if (out->size() > kMaxValueBytes) return;  // refused by whoever takes it (see value.h)
  switch (kind()) {
    case Kind::kUndefined: *out += "Undefined"; return;
    case Kind::kNone: *out += "None"; return;
    case Kind::kBool: *out += bool_value() ? "True" : "False"; return;
    case Kind::kInt: *out += std::to_string(int_value()); return;
    case Kind::kFloat: *out += PyFloatRepr(number()); return;
    case Kind::kString: *out += PyStrRepr(str()); return;
    case Kind::kList: {
      out->push_back(tuple_ ? '(' : '[');
      bool first = true;
      for (const Value& v : list()) {
        if (out->size() > kMaxValueBytes) return;
        if (!first) *out += ", ";
        first = false;
        v.AppendRepr(open, out);
      }
      if (tuple_ && list().size() == 1) out->push_back(',');
      out->push_back(tuple_ ? ')' : ']');
      return;
    }
    case Kind::kDict: AppendDictRepr(dict(), open, out); return;
    case Kind::kNamespace: {
      const Dict* attrs = &dict();
      if (std::find(open->begin(), open->end(), attrs) != open->end() ||
          open->size() >= static_cast<size_t>(kMaxValueDepth)) {
        *out += "<Namespace {...}>";
        return;
      }
      *out += "<Namespace ";
      open->push_back(attrs);
      AppendDictRepr(*attrs, open, out);
      open->pop_back();
      out->push_back('>');
      return;
    }
    case Kind::kCallable: *out += "<function " + callable().name() + ">"; return;
  }
}

const Value* Dict::Find(std::string_view key) const {
  for (const auto& item : items_) {
    if (item.first == key) return &item.second;
  }
  return nullptr;
}

void Dict::Set(std::string key, Value value) {
  for (auto& item : items_) {
    if (item.first == key) {
      item.second = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

bool Equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number() == b.number();
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.str() == b.str();
    case K::kList: {
      const auto &x = a.list(), &y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      const Dict &x = a.dict(), &y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const Value* w = y.Find(k);
        if (w == nullptr || !Equals(v, *w)) return false;
      }
      return true;
    }
    case K::kNamespace: return &a.mutable_namespace() == &b.mutable_namespace();
    case K::kCallable: return &a.callable() == &b.callable();
    default: return false;
  }
}

StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      const int64_t x = a.int_value(), y = b.int_value();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const double x = a.number(), y = b.number();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return Status::InvalidArgument(std::string("cannot order values of types '") + a.TypeName() + "' and '" +
                                 b.TypeName() + "'");
}

namespace {

void JsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t pos = 0;
  char buf[16];
  while (pos < s.size()) {
    const size_t b = pos;
    const uint32_t cp = DecodeCodePoint(s, &pos);
    switch (cp) {
      case '"': *out += "\\\""; continue;
      case '\\': *out += "\\\\"; continue;
      case '\n': *out += "\\n"; continue;
      case '\r': *out += "\\r"; continue;
      case '\t': *out += "\\t"; continue;
      case '\b': *out += "\\b"; continue;
      case '\f': *out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      *out += buf;
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      *out += buf;
    } else {
      out->append(s.substr(b, pos - b));
    }
  }
  out->push_back('"');
}

Status TooLarge() {
  return Status::InvalidArgument("tojson: the result would be larger than " +
                                 std::to_string(kMaxValueBytes >> 20) + " MiB");
}

Status JsonValue(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  using K = Value::Kind;
  const std::string item_sep = o.separators ? o.separators->first : (o.indent ? "," : ", ");
  const std::string key_sep = o.separators ? o.separators->second : ": ";
  auto newline = [&](int d) {
    if (!o.indent) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(std::max<int64_t>(*o.indent, 0) * d), ' ');
  };
  switch (v.kind()) {
    case K::kNone: *out += "null"; return Status::OK();
    case K::kBool: *out += v.bool_value() ? "true" : "false"; return Status::OK();
    case K::kInt: *out += std::to_string(v.int_value()); return Status::OK();
    case K::kFloat: {
      const double f = v.number();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f < 0 ? "-Infinity" : "Infinity";
      } else {
        *out += PyFloatRepr(f);
      }
      return Status::OK();
    }
    case K::kString: JsonString(v.str(), o.ensure_ascii, out); return Status::OK();
    case K::kList: {
      const auto& items = v.list();
      if (items.empty()) {
        *out += "[]";
        return Status::OK();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (out->size() > kMaxValueBytes) return TooLarge();
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        FT_RETURN_IF_ERROR(JsonValue(items[i], o, depth + 1, out));
      }
      newline(depth);
      out->push_back(']');
      return Status::OK();
    }
    case K::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict().items()) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      if (items.empty()) {
        *out += "{}";
        return Status::OK();
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (out->size() > kMaxValueBytes) return TooLarge();
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, o.ensure_ascii, out);
        *out += key_sep;
        FT_RETURN_IF_ERROR(JsonValue(items[i]->second, o, depth + 1, out));
      }
      newline(depth);
      out->push_back('}');
      return Status::OK();
    }
    default:
      return Status::InvalidArgument(std::string("tojson: object of type '") + v.TypeName() +
                                     "' is not JSON serializable");
  }
}

}  // namespace

StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  FT_RETURN_IF_ERROR(JsonValue(v, options, 0, &out));
  return out;
}

}  // namespace ft::jinja
