// The compute dtype of a model (job.yaml's model.dtype, ft-train generate's
// --dtype): fp32, or bf16/fp16 storage with fp32 arithmetic (activations
// stored in it, GEMM operands taken in it: backend.h). Header-only, so the
// job contract (engine/job) names it without linking the model.
#pragma once

#include <string_view>

#include "common/enum_table.h"

namespace ft {

enum class ComputeDType { kF32, kBF16, kF16 };

template <>
struct EnumTraits<ComputeDType> {
  static constexpr std::string_view kWhat = "dtype";
  static constexpr EnumEntry<ComputeDType> kTable[] = {
      {"fp32", ComputeDType::kF32, "32-bit floats throughout (the reference; most memory)"},
      {"bf16", ComputeDType::kBF16, "bfloat16 weights and activations, fp32 arithmetic and master weights"},
      {"fp16", ComputeDType::kF16, "float16 weights and activations with dynamic loss scaling"},
  };
};

}  // namespace ft
