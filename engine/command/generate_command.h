// `ft-train generate`: text from a base model with an adapter (or merged
// weights), streamed to stdout as it is generated (engine/generate).
//
//   ft-train generate --model DIR [--adapter DIR] [--prompt TEXT | --prompt-file FILE]
//                     [--chat [--system TEXT] [--chat-var KEY=VALUE]...]
//                     [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
//                     [--seed S] [--stop TEXT]... [--device cpu|cuda] [--dtype fp32|bf16]
//                     [--nf4] [--json]
//
// The prompt comes from --prompt, --prompt-file, or else all of stdin. With
// --json, nothing is streamed and one JSON object is printed at the end:
// {"text", "ids", "finish" ("eos"|"stop"|"length"), "prompt_tokens"}.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/generate/generator.h"

namespace ft {

struct GenerateFlags {
  GenerationModelOptions model;  // device and dtype: parsed from the two names below
  std::string device = "cpu";    // --device: a DeviceKind's name
  std::string dtype = "fp32";    // --dtype: a ComputeDType's name
  std::string prompt;
  std::string prompt_file;
  bool has_prompt = false;  // --prompt given (an empty prompt is then an error, not stdin)
  PromptOptions prompt_options;
  std::vector<std::string> chat_vars;  // KEY=VALUE
  GenerateOptions generate;
  bool json = false;
};

// Returns the process exit code: 0; 2 (kExitBadInput) for bad flags (an
// unknown --device or --dtype: "--dtype: dtype 'fp8' is not one of: ..."), a
// prompt that cannot be read or a model that does not load (the message names
// the file or flag); 1 when generation fails.
int RunGenerateCommand(GenerateFlags flags);

}  // namespace ft
