// Times ft::cuda's flash attention (forward, backward) and cuBLASLt GEMM on
// random bf16 inputs, for the cases in bench/gpu/cases.txt, and prints one
// JSON line per measurement:
//   {"impl":"ftune","op":"attn_fwd","case":"attn 4 2048 32 8 128","ms":..,"tflops":..}
// Time is the median of CUDA-event-timed runs after warm-up runs (inputs are
// random, never zeros). FLOP counts: GEMM 2MNK; causal attention forward
// 2 * 2 * B * Hq * T^2 * hd / 2 (two matmuls, half the scores), backward 2.5x
// the forward (FlashAttention's convention), so ratios against
// bench/gpu/torch_peer.py (same formulas) are like for like.
// Usage: ft_gpu_kernel_bench CASES_FILE. Exit 0 on success, 1 on an error
// (on stderr), 2 when no GPU is visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/device_info.h"
#include "kernels/cuda/ops.h"

namespace ft::cuda {
namespace {

constexpr int kWarmup = 2;

#define BENCH_CHECK(expr)                                                                           \
  do {                                                                                              \
    if (cudaError_t err_ = (expr); err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

void CheckOk(const Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

// A device buffer of n values drawn uniformly from [-1, 1), rounded to T.
template <typename T>
struct Buffer {
  T* ptr = nullptr;
  explicit Buffer(int64_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<T> host(n);
    for (auto& x : host) x = static_cast<T>(dist(rng));
    BENCH_CHECK(cudaMalloc(&ptr, sizeof(T) * std::max<int64_t>(n, 1)));
    BENCH_CHECK(cudaMemcpy(ptr, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice));
  }
  ~Buffer() { cudaFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// Median milliseconds of `reps` runs of fn on `stream`, each between two events.
double MedianMs(cudaStream_t stream, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  BENCH_CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    fn();
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void Print(const char* op, const std::string& name, double ms, double flops) {
  std::printf("{\"impl\":\"ftune\",\"op\":\"%s\",\"case\":\"%s\",\"ms\":%.4f,\"tflops\":%.2f}\n", op,
              name.c_str(), ms, flops / (ms * 1e-3) / 1e12);
  std::fflush(stdout);
}

void BenchAttention(const std::string& name, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                    cudaStream_t stream, std::mt19937& rng) {
  const AttentionShape s{B, T, Hq, Hkv, hd, 1.0 / std::sqrt(static_cast<double>(hd))};
  const int64_t rows = B * T;
  Buffer<bf16> q(rows * Hq * hd, rng), k(rows * Hkv * hd, rng), v(rows * Hkv * hd, rng),
      out(rows * Hq * hd, rng);
  Buffer<bf16> dout(rows * Hq * hd, rng), dq(rows * Hq * hd, rng), dk(rows * Hkv * hd, rng),
      dv(rows * Hkv * hd, rng);
  Buffer<float> lse(B * Hq * T, rng), ws(AttentionBackwardWorkspaceFloats(s), rng);
  const double fwd_flops = 4.0 * B * Hq * static_cast<double>(T) * T * hd / 2.0;
  const double fwd = MedianMs(stream, 5, [&] {
    CheckOk(AttentionForward<bf16>(s, q.ptr, k.ptr, v.ptr, nullptr, out.ptr, lse.ptr, stream),
            "AttentionForward");
  });
  Print("attn_fwd", name, fwd, fwd_flops);
  const double bwd = MedianMs(stream, 5, [&] {
    CheckOk(AttentionBackward<bf16>(s, q.ptr, k.ptr, v.ptr, nullptr, out.ptr, lse.ptr, dout.ptr, dq.ptr,
                                    dk.ptr, dv.ptr, ws.ptr, stream),
            "AttentionBackward");
  });
  Print("attn_bwd", name, bwd, 2.5 * fwd_flops);
}

void BenchGemm(const std::string& name, int64_t M, int64_t N, int64_t K, BlasLt& blas, cudaStream_t stream,
               std::mt19937& rng) {
  Buffer<bf16> x(M * K, rng), w(N * K, rng), y(M * N, rng);
  const double ms = MedianMs(stream, 20, [&] {
    CheckOk(blas.Gemm<bf16, bf16>(stream, false, true, M, N, K, 1.0f, x.ptr, K, w.ptr, K, 0.0f, y.ptr, N),
            "Gemm");
  });
  Print("gemm", name, ms, 2.0 * M * N * K);
}

int Main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CASES_FILE\n", argv[0]);
    return 1;
  }
  std::string reason;
  auto devices = QueryDevices(&reason);
  if (!devices.ok() || devices->empty()) {
    std::fprintf(stderr, "no CUDA device: %s\n",
                 devices.ok() ? reason.c_str() : devices.status().ToString().c_str());
    return 2;
  }
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreate(&stream));
  auto blas = BlasLt::Create();
  CheckOk(blas.status(), "BlasLt::Create");
  std::mt19937 rng(12345);
  std::ifstream cases(argv[1]);
  std::string line;
  while (std::getline(cases, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream in(line);
    std::string op;
    if (!(in >> op)) continue;
    const std::string name = line.substr(0, line.find_last_not_of(" \t") + 1);
    if (op == "attn") {
      int64_t B, T, Hq, Hkv, hd;
      in >> B >> T >> Hq >> Hkv >> hd;
      BenchAttention(name, B, T, Hq, Hkv, hd, stream, rng);
    } else if (op == "gemm") {
      int64_t M, N, K;
      in >> M >> N >> K;
      BenchGemm(name, M, N, K, **blas, stream, rng);
    } else {
      std::fprintf(stderr, "unknown case: %s\n", line.c_str());
      return 1;
    }
  }
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace ft::cuda

int main(int argc, char** argv) { return ft::cuda::Main(argc, argv); }
