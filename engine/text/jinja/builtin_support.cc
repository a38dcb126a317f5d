#include "engine/text/jinja/builtin_support.h"

#include <algorithm>

#include "engine/text/jinja/pystr.h"

namespace ft::jinja::builtin {

Args::Args(std::string_view fn, const CallArgs& a, const std::vector<std::string_view>& params)
    : fn_(fn), a_(a), names_(params) {
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

const Value* Args::Get(size_t i) const {
  if (i < a_.pos.size()) return &a_.pos[i];
  for (const auto& [k, v] : a_.kw) {
    if (i < names_.size() && k == names_[i]) return &v;
  }
  return nullptr;
}

Value Args::Or(size_t i, Value def) const {
  const Value* v = Get(i);
  return v ? *v : std::move(def);
}

bool Args::Flag(size_t i, bool def) const {
  const Value* v = Get(i);
  return v ? v->Truthy() : def;
}

StatusOr<int64_t> Args::Int(size_t i, int64_t def) const {
  const Value* v = Get(i);
  if (!v || v->is_none()) return def;
  if (!v->is_int() && !v->is_bool())
    return Err(fn_ + "(): '" + std::string(names_[i]) + "' must be an integer");
  return v->int_value();
}

StatusOr<std::optional<std::string>> Args::OptStr(size_t i) const {
  const Value* v = Get(i);
  if (!v || v->is_none() || v->is_undefined()) return std::optional<std::string>();
  if (!v->is_string()) return Err(fn_ + "(): '" + std::string(names_[i]) + "' must be a string");
  return std::optional<std::string>(v->str());
}

StatusOr<std::string> Args::Str(size_t i) const {
  const Value* v = Get(i);
  if (!v) return Err(fn_ + "() missing required argument '" + std::string(names_[i]) + "'");
  if (!v->is_string()) {
    return Err(fn_ + "(): '" + std::string(names_[i]) + "' must be a string, not " + v->TypeName());
  }
  return v->str();
}

const Builtin* FindBuiltin(const std::vector<Builtin>& table, std::string_view name) {
  for (const Builtin& b : table) {
    if (std::find(b.names.begin(), b.names.end(), name) != b.names.end()) return &b;
  }
  return nullptr;
}

StatusOr<Value> CallBuiltin(const Builtin& b, Interpreter& interp, std::string_view name, const Value& self,
                            const CallArgs& args) {
  static const std::vector<std::string_view> kAny;
  Args a(name, args, (b.flags & Builtin::kVariadic) ? kAny : b.params);
  if (!(b.flags & Builtin::kVariadic)) FT_RETURN_IF_ERROR(a.status());
  return b.fn(interp, self, a);
}

Value StrList(const std::vector<std::string>& parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value::Str(p));
  return Value::List(std::move(out));
}

namespace {
bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

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

StatusOr<std::vector<Value>> SortValues(Interpreter& interp, std::vector<Value> items,
                                        const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  keyed.reserve(items.size());
  uint64_t compare_work = 0;  // one comparison of each key
  for (size_t i = 0; i < items.size(); ++i) {
    keyed.emplace_back(key(items[i]), i);
    compare_work += CompareWork(keyed.back().first);
  }
  uint64_t rounds = 1;  // ceil(log2(n)): the passes a merge sort makes over the keys
  while (rounds < 64 && (uint64_t{1} << rounds) < items.size()) ++rounds;
  FT_RETURN_IF_ERROR(
      interp.ChargeWork(compare_work > UINT64_MAX / rounds ? UINT64_MAX : compare_work * rounds));
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

StatusOr<Value> StrUpper(Interpreter&, const Value& self, const Args&) {
  return Value::Str(AsciiUpper(self.ToStr()));
}
StatusOr<Value> StrLower(Interpreter&, const Value& self, const Args&) {
  return Value::Str(AsciiLower(self.ToStr()));
}
StatusOr<Value> StrTitle(Interpreter&, const Value& self, const Args&) {
  return Value::Str(PyTitle(self.ToStr()));
}
StatusOr<Value> StrCapitalize(Interpreter&, const Value& self, const Args&) {
  return Value::Str(PyCapitalize(self.ToStr()));
}

StatusOr<Value> StrStrip(Interpreter&, const Value& self, const Args& a) {
  FT_ASSIGN_OR_RETURN(std::optional<std::string> chars, a.OptStr(0));
  return Value::Str(PyStrip(self.ToStr(), chars, true, true));
}

StatusOr<Value> StrReplace(Interpreter&, const Value& self, const Args& a) {
  FT_ASSIGN_OR_RETURN(std::string old_s, a.Str(0));
  FT_ASSIGN_OR_RETURN(std::string new_s, a.Str(1));
  FT_ASSIGN_OR_RETURN(int64_t count, a.Int(2, -1));
  const std::string s = self.ToStr();
  if (new_s.size() > old_s.size()) {  // the result grows by this much per replacement
    uint64_t hits = static_cast<uint64_t>(PyCount(s, old_s));
    if (count >= 0) hits = std::min<uint64_t>(hits, static_cast<uint64_t>(count));
    FT_RETURN_IF_ERROR(CheckResultSize("replace", s.size() + hits * (new_s.size() - old_s.size())));
  }
  return Value::Str(PyReplace(s, old_s, new_s, count));
}

bool AllCased(const std::string& s, bool lower) {
  bool cased = false;
  for (char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      cased = true;
      if (lower ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
    }
  }
  return cased;
}

}  // namespace ft::jinja::builtin
