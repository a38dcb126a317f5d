// A chat template → parse → render (engine/text/jinja/jinja.h). The input is
// the template, optionally followed by a NUL and a JSON object of variables;
// without one the variables are a short conversation. Any template renders
// or fails with its line and reason, inside the interpreter's limits (loop
// iterations, recursion depth, output size).
#include <nlohmann/json.hpp>

#include "engine/text/jinja/jinja.h"
#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json kConversation = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>&"},
                 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": ""}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": null,
    "n": 3, "x": 1.5, "flag": false, "items": [3, 1, 2], "d": {"b": 2, "a": 1}})");
  const std::vector<std::string> parts = ft::fuzz::SplitParts(ft::fuzz::AsText(data, size), 2);
  nlohmann::ordered_json vars = kConversation;
  if (parts.size() == 2) {
    nlohmann::ordered_json given =
        nlohmann::ordered_json::parse(parts[1], nullptr, /*allow_exceptions=*/false);
    if (given.is_object()) vars = std::move(given);
  }
  auto t = ft::JinjaTemplate::Parse(parts[0], "fuzz");
  if (t.ok()) (void)t->Render(vars);
  return 0;
}
