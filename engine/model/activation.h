// The MLP's gate activation, h = act(gate(x)) * up(x): a family trait read from
// config.json (hidden_act, or Gemma's hidden_activation). C++17, for the CUDA
// backend's translation unit too.
#pragma once

#include <string>

#include "common/status.h"

namespace ft {

enum class Activation { kSilu, kGeluTanh };
// The name config.json spells: "silu", "gelu_pytorch_tanh".
const char* ActivationName(Activation a);
// The activation named `name`; InvalidArgument "<key> 'x' is not supported (supported: silu,
// gelu_pytorch_tanh)" for another.
StatusOr<Activation> ParseActivation(const std::string& name, const std::string& key);

}  // namespace ft
