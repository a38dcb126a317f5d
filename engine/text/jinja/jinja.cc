#include "engine/text/jinja/jinja.h"

#include "engine/text/jinja/builtins.h"
#include "engine/text/jinja/interpreter.h"
#include "engine/text/jinja/lexer.h"
#include "engine/text/jinja/parser.h"

namespace ft {

namespace {

Status Named(const std::string& name, const Status& st) {
  if (st.ok()) return st;
  if (st.code() == Status::Code::kInternal) return st;
  if (st.code() == Status::Code::kCancelled) return Status::Cancelled(name + ": " + st.message());
  return Status::InvalidArgument(name + ": " + st.message());
}

}  // namespace

StatusOr<JinjaTemplate> JinjaTemplate::Parse(std::string_view source, std::string name) {
  StatusOr<std::vector<jinja::Token>> tokens = jinja::Lex(source);
  if (!tokens.ok()) return Named(name, tokens.status());
  StatusOr<jinja::NodeList> nodes = jinja::Parse(*tokens);
  if (!nodes.ok()) return Named(name, nodes.status());
  JinjaTemplate t;
  t.name_ = std::move(name);
  t.nodes_ = std::make_shared<const jinja::NodeList>(std::move(nodes).value());
  return t;
}

StatusOr<std::string> JinjaTemplate::Render(const jinja::Dict& variables,
                                            const std::function<bool()>& stop_requested) const {
  jinja::Scope root(nullptr);
  jinja::AddGlobals(&root);
  for (const auto& [k, v] : variables.items()) root.Set(k, v);
  jinja::Interpreter interp(&root, stop_requested);
  std::string out;
  Status st = interp.Render(*nodes_, &out);
  if (!st.ok()) return Named(name_, st);
  return out;
}

StatusOr<std::string> JinjaTemplate::Render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) {
    return Status::InvalidArgument(name_ + ": render variables must be a JSON object");
  }
  jinja::Dict d;
  for (auto it = variables.begin(); it != variables.end(); ++it) {
    StatusOr<jinja::Value> v = jinja::Value::FromJson(it.value());
    if (!v.ok())
      return Named(name_, Status::InvalidArgument("variable '" + it.key() + "': " + v.status().message()));
    d.Set(it.key(), std::move(v).value());
  }
  return Render(d);
}

}  // namespace ft
