// What the CUDA kernels take, readable without the CUDA toolkit: the engine
// checks a model against it before it loads anything (engine/model/backend.h,
// CheckHeadDimForDevice), so a model the kernels would refuse is named at the
// start of a run instead of failing its first forward.
#pragma once

#include <cstdint>

namespace ft::cuda {

// The head dims the flash attention kernels are instantiated for
// (attention_forward.cu, attention_backward.cu and their tensor-core forms;
// their launchers refuse any other with InvalidArgument). 256 is Gemma's.
inline constexpr int64_t kAttentionHeadDims[] = {64, 128, 256};

inline bool AttentionTakesHeadDim(int64_t head_dim) {
  for (int64_t d : kAttentionHeadDims)
    if (d == head_dim) return true;
  return false;
}

// Dynamic shared memory one block of the attention kernels may use: 99 KiB,
// the opt-in limit of sm_86 and sm_89 (RTX 30xx/40xx, A10, L40S), which run
// the build's sm_80 code; sm_80 allows 163 KiB and sm_90 227 KiB. Every
// attention kernel's tiles are sized to fit it (static_assert in its
// launcher), so each head dim runs on every GPU the build targets, and two
// blocks of the largest fit an sm_90 multiprocessor.
inline constexpr int kMaxSmemPerBlock = 99 * 1024;

}  // namespace ft::cuda
