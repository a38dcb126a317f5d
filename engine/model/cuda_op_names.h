// The names of the CUDA backend's op categories: what FT_CUDA_OP_TIMES reports
// a GPU's time under (engine/model/cuda_backend.cu's FT_TIME_OP scopes) and
// what the cost model predicts under (engine/model/cuda_cost.h), so that a
// measured profile and a prediction can be set side by side by name.
// Categories the CUDA backend does not time (its synchronous device->host
// copy, copy-stream transfers) are named here too, for the cost model alone.
#pragma once

namespace ft::cuda_op {

inline constexpr char kCopyToDevice[] = "copy host->device";
inline constexpr char kCopyToHost[] = "copy device->host";                 // not timed on the GPU
inline constexpr char kCopyStreamToDevice[] = "copy stream host->device";  // not timed: overlapped
inline constexpr char kCopyStreamToHost[] = "copy stream device->host";    // not timed: overlapped
inline constexpr char kCopy[] = "copy device->device";
inline constexpr char kZero[] = "zero";
inline constexpr char kGemmF32[] = "gemm fp32 (cuBLASLt)";
inline constexpr char kGemmBf16[] = "gemm bf16 (cuBLASLt)";
inline constexpr char kGemmF16[] = "gemm fp16 (cuBLASLt)";
inline constexpr char kOperandsToBf16[] = "gemm bf16: operands to bf16";
inline constexpr char kOperandsToF16[] = "gemm fp16: operands to fp16";
inline constexpr char kOperandToF32[] = "gemm: 16-bit operand to fp32";
inline constexpr char kRmsNormForward[] = "rmsnorm forward";
inline constexpr char kRmsNormBackward[] = "rmsnorm backward";
inline constexpr char kRope[] = "rope";
inline constexpr char kAttentionForward[] = "attention forward";
inline constexpr char kAttentionBackward[] = "attention backward";
inline constexpr char kSwiGluForward[] = "swiglu forward";
inline constexpr char kSwiGluBackward[] = "swiglu backward";
inline constexpr char kGeluGluForward[] = "geglu-tanh forward";
inline constexpr char kGeluGluBackward[] = "geglu-tanh backward";
inline constexpr char kEmbeddingForward16[] = "embedding forward (16-bit rows)";
inline constexpr char kEmbeddingForward[] = "embedding forward";
inline constexpr char kEmbeddingBackward[] = "embedding backward";
inline constexpr char kCrossEntropy[] = "cross entropy";
inline constexpr char kNf4Dequantize[] = "nf4 dequantize";
inline constexpr char kAxpy[] = "axpy";
inline constexpr char kScale[] = "scale";
inline constexpr char kSoftCap[] = "soft-cap";
inline constexpr char kBiasAdd[] = "bias add";
inline constexpr char kBiasGrad[] = "bias grad";
inline constexpr char kRoundBf16[] = "bf16 rounding";
inline constexpr char kRoundF16[] = "fp16 rounding";
inline constexpr char kConvert[] = "convert (typed storage)";
inline constexpr char kLinearOutput[] = "linear output (+lora, round)";
inline constexpr char kDropout[] = "dropout";
inline constexpr char kSumSquares[] = "sum of squares";
inline constexpr char kAdamW[] = "adamw";

}  // namespace ft::cuda_op
