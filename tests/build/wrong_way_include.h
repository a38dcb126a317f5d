// A file that breaks the dependency rule on purpose: checked as if it were in
// engine/text (the tokenizer), it includes the trainer, a part above it.
// tests/CMakeLists.txt's layers_check_detects_wrong_way_include expects
// cmake/check_layers.cmake to refuse it. Never compiled.
#pragma once

#include "common/status.h"
#include "engine/train/trainer.h"
