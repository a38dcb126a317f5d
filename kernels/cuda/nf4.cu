// NF4 dequantization on the device, bit for bit cpu::DequantizeNf4 (nf4.h).
//
// One thread per packed byte, i.e. per element pair (2p, 2p+1): the block
// size is even, so a pair never straddles two blocks. The byte's HIGH nibble
// is element 2p, the low nibble element 2p+1 (absent when n is odd).
// The value is Nf4Table()[code] * scale[b] with, under double quantization,
//   scale[b] = SignedDynamicMap()[absmax_q[b]] * absmax2[b / dq_block] + offset
// evaluated as two separately rounded float operations. nvcc would contract
// a*b + c into one FMA (one rounding), so the multiplies and the add are
// spelled __fmul_rn / __fadd_rn, which are never contracted.
// Both tables come from the CPU backend (one definition) and travel as a
// kernel parameter (1088 bytes), so there is no device state to initialise.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

struct Nf4Tables {
  float nf4[16];
  float dynamic_map[256];
};

constexpr int kThreads = 256;

template <typename T>
__global__ void DequantizeNf4Kernel(const __grid_constant__ Nf4Tables tables, Nf4DeviceTensor q, T* out) {
  const int64_t pairs = (q.n + 1) / 2;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = 2 * p;  // first element of the pair
    const int64_t b = i / q.config.block;
    float scale;
    if (q.config.double_quant) {
      const float unshifted = __fmul_rn(tables.dynamic_map[q.absmax_q[b]], q.absmax2[b / q.config.dq_block]);
      scale = __fadd_rn(unshifted, q.offset);
    } else {
      scale = q.absmax[b];
    }
    const uint8_t byte = q.packed[p];
    out[i] = internal::Store<T>(__fmul_rn(tables.nf4[byte >> 4], scale));
    if (i + 1 < q.n) out[i + 1] = internal::Store<T>(__fmul_rn(tables.nf4[byte & 0x0F], scale));
  }
}

Nf4Tables MakeTables() {
  Nf4Tables t;
  std::copy(cpu::Nf4Table(), cpu::Nf4Table() + 16, t.nf4);
  std::copy(cpu::SignedDynamicMap(), cpu::SignedDynamicMap() + 256, t.dynamic_map);
  return t;
}

}  // namespace

template <typename T>
Status DequantizeNf4(const Nf4DeviceTensor& q, T* out, cudaStream_t stream) {
  FT_CHECK(q.n >= 0);
  if (q.config.block <= 0 || q.config.block % 2 != 0) {
    return Status::InvalidArgument("DequantizeNf4: block size must be positive and even, got " +
                                   std::to_string(q.config.block));
  }
  if (q.config.double_quant && q.config.dq_block <= 0) {
    return Status::InvalidArgument("DequantizeNf4: dq_block must be positive");
  }
  if (q.n == 0) return Status::OK();
  static const Nf4Tables tables = MakeTables();
  DequantizeNf4Kernel<T>
      <<<internal::BlocksFor((q.n + 1) / 2, kThreads), kThreads, 0, stream>>>(tables, q, out);
  return internal::LaunchStatus("DequantizeNf4Kernel");
}

template Status DequantizeNf4<float>(const Nf4DeviceTensor&, float*, cudaStream_t);
template Status DequantizeNf4<bf16>(const Nf4DeviceTensor&, bf16*, cudaStream_t);
template Status DequantizeNf4<fp16>(const Nf4DeviceTensor&, fp16*, cudaStream_t);

}  // namespace ft::cuda
