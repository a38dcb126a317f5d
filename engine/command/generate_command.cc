#include "engine/command/generate_command.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "engine/train/trainer.h"

namespace ft {
namespace {

int BadInput(const Status& s) {
  std::fprintf(stderr, "ft-train generate: %s\n", s.ToString().c_str());
  return kExitBadInput;
}

StatusOr<std::string> ReadPrompt(const GenerateFlags& flags) {
  if (flags.has_prompt) return flags.prompt;
  if (!flags.prompt_file.empty()) return ReadFileToString(flags.prompt_file);
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
    text.pop_back();  // the shell's newline
  return text;
}

}  // namespace

int RunGenerateCommand(GenerateFlags flags) {
  auto device = ParseEnum<DeviceKind>(flags.device);
  if (!device.ok()) return BadInput(device.status().WithContext("--device"));
  auto dtype = ParseEnum<ComputeDType>(flags.dtype);
  if (!dtype.ok()) return BadInput(dtype.status().WithContext("--dtype"));
  flags.model.device = *device;
  flags.model.dtype = *dtype;
  for (const std::string& kv : flags.chat_vars) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return BadInput(
          Status::InvalidArgument("--chat-var '" + kv + "': expected KEY=VALUE, e.g. enable_thinking=false"));
    }
    flags.prompt_options.chat_vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  auto prompt = ReadPrompt(flags);
  if (!prompt.ok()) return BadInput(prompt.status().WithContext("the prompt"));
  if (prompt->empty())
    return BadInput(Status::InvalidArgument("the prompt is empty (--prompt, --prompt-file or stdin)"));
  auto loaded = LoadGenerationModel(flags.model);
  if (!loaded.ok()) return BadInput(loaded.status());
  auto ids = PromptIds(*loaded->tokenizer, *prompt, flags.prompt_options);
  if (!ids.ok()) return BadInput(ids.status());
  auto stream = [&](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  auto out = Generate(*loaded->model, *loaded->tokenizer, *ids, loaded->eos_ids, flags.generate,
                      flags.json ? std::function<void(std::string_view)>() : stream);
  if (!out.ok()) {
    if (out.status().IsInvalidArgument()) return BadInput(out.status());
    std::fprintf(stderr, "ft-train generate: %s\n", out.status().ToString().c_str());
    return kExitFailed;
  }
  if (flags.json) {
    const nlohmann::json j = {
        {"text", out->text}, {"ids", out->ids}, {"finish", out->finish}, {"prompt_tokens", ids->size()}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
  }
  std::fprintf(stderr, "ft-train generate: %zu prompt tokens, %zu new (%s)\n", ids->size(), out->ids.size(),
               out->finish.c_str());
  return kExitFinished;
}

}  // namespace ft
