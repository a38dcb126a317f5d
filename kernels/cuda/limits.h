// What the CUDA kernels take, readable without the CUDA toolkit: the engine
// checks a model against it before it loads anything (engine/model/backend.h,
// CheckHeadDimForDevice), so a model the kernels would refuse is named at the
// start of a run instead of failing its first forward.
#pragma once

#include <cstdint>

namespace ft::cuda {

// The head dims the flash attention kernels are instantiated for
// (attention_forward.cu, attention_backward.cu and their tensor-core forms;
// their launchers refuse any other with InvalidArgument).
inline constexpr int64_t kAttentionHeadDims[] = {64, 128};

inline bool AttentionTakesHeadDim(int64_t head_dim) {
  for (int64_t d : kAttentionHeadDims)
    if (d == head_dim) return true;
  return false;
}

}  // namespace ft::cuda
