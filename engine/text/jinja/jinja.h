// A Jinja template interpreter for Hugging Face chat templates: renders a
// tokenizer_config.json `chat_template` exactly as transformers'
// apply_chat_template does (Python jinja2 in an ImmutableSandboxedEnvironment
// with trim_blocks=True, lstrip_blocks=True, loopcontrols; `tojson` as
// json.dumps(ensure_ascii=False); globals raise_exception, strftime_now).
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (- and +), raw; if/elif/
// else, for (tuple targets, `if` filter, else, loop.index/index0/revindex/
// first/last/length/previtem/nextitem/cycle), break/continue, set (names,
// tuples, ns.attr, block form), macro/call, filter blocks, with, generation;
// Python expressions (and/or/not, comparisons, in, + - * / // % ** ~,
// literals, subscripts, slices, attributes, calls), jinja2's filters and
// tests, the str/dict methods templates use. Not supported: include/extends/
// import/block, recursive loops, *args/**kwargs in calls, printf-style '%'
// formatting, str.format(), non-ASCII case mapping (upper()/lower() leave it
// unchanged). Python objects without a JSON-like value print differently:
// {{ range(3) }} and {{ d.items() }} print lists, {{ loop }} a dict; filters
// are eager (Python's return generators).
//
// Values follow Python: {{ none }} prints "None", {{ true }} "True"; strings
// are UTF-8 and indexed/sliced/measured in code points.
//
// Thread safety: a parsed JinjaTemplate is immutable; Render may run
// concurrently from several threads.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/text/jinja/value.h"

namespace ft {

namespace jinja {
struct Node;
}  // namespace jinja

class JinjaTemplate {
 public:
  // Parses `source`. Errors are InvalidArgument "<name>: line N: ..." naming
  // what the parser expected.
  static StatusOr<JinjaTemplate> Parse(std::string_view source, std::string name = "template");

  // Renders with `variables` (name -> value) as the top-level context, plus
  // the globals range, dict, namespace, raise_exception and strftime_now.
  // Errors (raise_exception, undefined values used, type errors, the work
  // budget of engine/text/jinja/interpreter.h) are InvalidArgument "<name>:
  // line N: ...", N the template source line. `stop_requested` (optional) is
  // polled about every millisecond of work: true ends the render with
  // Cancelled "<name>: line N: rendering stopped ...".
  StatusOr<std::string> Render(const jinja::Dict& variables,
                               const std::function<bool()>& stop_requested = {}) const;
  // Same, from a JSON object (insertion order of keys preserved); a variable
  // nested deeper than jinja::kMaxValueDepth is InvalidArgument naming it.
  StatusOr<std::string> Render(const nlohmann::ordered_json& variables) const;

  const std::string& name() const { return name_; }

 private:
  JinjaTemplate() = default;
  std::string name_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> nodes_;
};

}  // namespace ft
