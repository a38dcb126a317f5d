#include "engine/command/tokenize_command.h"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/text/tokenizer.h"
#include "engine/train/trainer.h"

namespace ft {
namespace {

using nlohmann::json;

// One input line -> one output line; false (with *error set) on bad input.
bool ProcessLine(const Tokenizer& tok, const std::string& line, bool add_special_tokens, bool decode,
                 std::string* out, std::string* error) {
  json in = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (decode) {
    if (!in.is_array()) {
      *error = "expected a JSON array of token ids";
      return false;
    }
    std::vector<int32_t> ids;
    for (const json& id : in) {
      if (!id.is_number_integer()) {
        *error = "expected a JSON array of integer token ids";
        return false;
      }
      ids.push_back(id.get<int32_t>());
    }
    *out = json(tok.Decode(ids, /*skip_special_tokens=*/false))
               .dump(-1, ' ', false, json::error_handler_t::replace);
    return true;
  }
  if (!in.is_string()) {
    *error = "expected a JSON string";
    return false;
  }
  auto ids = tok.Encode(in.get_ref<const std::string&>(), add_special_tokens);
  if (!ids.ok()) {
    *error = ids.status().message();
    return false;
  }
  *out = json(*ids).dump();
  return true;
}

}  // namespace

int RunTokenizeCommand(const std::string& model_or_file, bool add_special_tokens, bool decode) {
  auto tok = Tokenizer::Load(model_or_file);
  if (!tok.ok()) {
    std::fprintf(stderr, "ft-train tokenize: %s\n", tok.status().ToString().c_str());
    return kExitBadInput;
  }
  std::cin.tie(nullptr);  // (no sync_with_stdio(false): it would replace redirected stream buffers)
  std::string line, out, error;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    if (!ProcessLine(**tok, line, add_special_tokens, decode, &out, &error)) {
      std::fprintf(stderr, "ft-train tokenize: stdin line %lld: %s\n", static_cast<long long>(n),
                   error.c_str());
      return kExitBadInput;
    }
    std::cout << out << '\n';
  }
  std::cout.flush();
  return 0;
}

}  // namespace ft
