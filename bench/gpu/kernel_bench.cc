// Times ft::cuda's flash attention (forward, backward), cuDNN's fused SDPA
// route beside it (kernels/cuda/attention_cudnn.h, "impl":"cudnn") and
// cuBLASLt GEMM on random bf16 inputs, for the cases in bench/gpu/cases.txt,
// and prints one JSON line per measurement:
//   {"impl":"ftune","op":"attn_fwd","case":"attn 4 2048 32 8 128","ms":..,"tflops":..}
// Time is the median of CUDA-event-timed runs after warm-up runs (inputs are
// random, never zeros). FLOP counts: GEMM 2MNK; causal attention forward
// 2 * 2 * B * Hq * T^2 * hd / 2 (two matmuls, half the scores), backward 2.5x
// the forward (FlashAttention's convention), so ratios against
// bench/gpu/torch_peer.py (same formulas) are like for like. A packed case
// ("docs N": N documents of T/N tokens per row, each causal and blind to the
// others) counts each document's triangle: 2 * 2 * B * Hq * N * (T/N)^2 * hd / 2.
// Both routes are timed as CudaBackend runs them: the backward takes dout
// and writes dq/dk/dv in fp32 (the Backend's convention), and cuDNN's time
// includes its per-call Prepare (lengths and offsets; with documents, an
// 8-byte read-back and a stream synchronisation) and its dtype conversions.
// cuDNN is dlopen'ed (FT_CUDNN_ROOT: the nvidia-cudnn wheel's folder); when it
// is unavailable, or refuses a case, one line says why ("error") and the
// other rows are still timed.
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

#include "kernels/cuda/attention_cudnn.h"
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

void Print(const char* impl, const char* op, const std::string& name, double ms, double flops) {
  std::printf("{\"impl\":\"%s\",\"op\":\"%s\",\"case\":\"%s\",\"ms\":%.4f,\"tflops\":%.2f}\n", impl, op,
              name.c_str(), ms, flops / (ms * 1e-3) / 1e12);
  std::fflush(stdout);
}

// A JSON line saying why cuDNN's route has no time for `name` (JSON-escaped enough: quotes, backslashes).
void PrintCudnnError(const std::string& name, const Status& st) {
  std::string why = st.ToString();
  for (char& c : why) {
    if (c == '"' || c == '\\' || c == '\n') c = '\'';
  }
  std::printf("{\"impl\":\"cudnn\",\"op\":\"error\",\"case\":\"%s\",\"error\":\"%s\"}\n", name.c_str(),
              why.c_str());
  std::fflush(stdout);
}

// The inputs of one attention case: bf16 q, k, v, out; fp32 lse, dout and
// gradients; the documents' segment ids (docs > 1) on the device.
struct AttentionCase {
  AttentionShape s;
  Buffer<bf16> q, k, v, out;
  Buffer<float> dout, dq, dk, dv, lse, ws;
  Buffer<int32_t> seg;
  const int32_t* segments;
  double fwd_flops;
  AttentionCase(const AttentionShape& shape, int64_t docs, std::mt19937& rng)
      : s(shape),
        q(s.batch * s.seq * s.q_heads * s.head_dim, rng),
        k(s.batch * s.seq * s.kv_heads * s.head_dim, rng),
        v(s.batch * s.seq * s.kv_heads * s.head_dim, rng),
        out(s.batch * s.seq * s.q_heads * s.head_dim, rng),
        dout(s.batch * s.seq * s.q_heads * s.head_dim, rng),
        dq(s.batch * s.seq * s.q_heads * s.head_dim, rng),
        dk(s.batch * s.seq * s.kv_heads * s.head_dim, rng),
        dv(s.batch * s.seq * s.kv_heads * s.head_dim, rng),
        lse(s.batch * s.q_heads * s.seq, rng),
        ws(AttentionBackwardWorkspaceFloats(s), rng),
        seg(docs > 1 ? s.batch * s.seq : 1, rng),
        segments(docs > 1 ? seg.ptr : nullptr) {
    const int64_t len =
        s.seq / docs;  // document d of a row: tokens [d*len, (d+1)*len), the last takes the rest
    std::vector<int32_t> ids(s.batch * s.seq);
    for (int64_t t = 0; t < s.batch * s.seq; ++t)
      ids[t] = static_cast<int32_t>(std::min(t % s.seq / len, docs - 1));
    if (docs > 1) BENCH_CHECK(cudaMemcpy(seg.ptr, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    fwd_flops = 4.0 * s.batch * s.q_heads * static_cast<double>(docs) * len * len * s.head_dim / 2.0;
  }
};

void BenchOurs(const std::string& name, AttentionCase& c, cudaStream_t stream) {
  const AttentionShape& s = c.s;
  const double fwd = MedianMs(stream, 5, [&] {
    CheckOk(AttentionForward<bf16>(s, c.q.ptr, c.k.ptr, c.v.ptr, c.segments, c.out.ptr, c.lse.ptr, stream),
            "AttentionForward");
  });
  Print("ftune", "attn_fwd", name, fwd, c.fwd_flops);
  const double bwd = MedianMs(stream, 5, [&] {
    CheckOk(AttentionBackward<bf16, float>(s, c.q.ptr, c.k.ptr, c.v.ptr, c.segments, c.out.ptr, c.lse.ptr,
                                           c.dout.ptr, c.dq.ptr, c.dk.ptr, c.dv.ptr, c.ws.ptr, stream),
            "AttentionBackward");
  });
  Print("ftune", "attn_bwd", name, bwd, 2.5 * c.fwd_flops);
}

// cuDNN's route on the same inputs; a failure (no engine, workspace over budget) is a line, not an exit.
void BenchCudnn(const std::string& name, AttentionCase& c, CudnnAttention& cudnn, cudaStream_t stream) {
  const AttentionShape& s = c.s;
  Status st;
  auto forward = [&] {
    if (!st.ok()) return;
    auto docs = cudnn.Prepare(s, c.segments, stream);
    st = docs.ok() ? cudnn.Forward<bf16>(s, c.q.ptr, c.k.ptr, c.v.ptr, c.out.ptr, c.lse.ptr, stream)
                   : docs.status();
  };
  forward();  // builds the plan; its error, if any, is the case's line
  if (!st.ok()) return PrintCudnnError(name, st);
  const double fwd = MedianMs(stream, 5, forward);
  auto backward = [&] {
    if (!st.ok()) return;
    auto docs = cudnn.Prepare(s, c.segments, stream);
    st = docs.ok() ? cudnn.Backward<bf16>(s, c.q.ptr, c.k.ptr, c.v.ptr, c.out.ptr, c.lse.ptr, c.dout.ptr,
                                          c.dq.ptr, c.dk.ptr, c.dv.ptr, stream)
                   : docs.status();
  };
  backward();
  if (!st.ok()) return PrintCudnnError(name, st);
  const double bwd = MedianMs(stream, 5, backward);
  if (!st.ok()) return PrintCudnnError(name, st);
  Print("cudnn", "attn_fwd", name, fwd, c.fwd_flops);
  Print("cudnn", "attn_bwd", name, bwd, 2.5 * c.fwd_flops);
}

void BenchAttention(const std::string& name, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd,
                    int64_t docs, CudnnAttention* cudnn, cudaStream_t stream, std::mt19937& rng) {
  AttentionCase c({B, T, Hq, Hkv, hd, 1.0 / std::sqrt(static_cast<double>(hd))}, docs, rng);
  BenchOurs(name, c, stream);
  if (cudnn != nullptr) BenchCudnn(name, c, *cudnn, stream);
}

void BenchGemm(const std::string& name, int64_t M, int64_t N, int64_t K, BlasLt& blas, cudaStream_t stream,
               std::mt19937& rng) {
  Buffer<bf16> x(M * K, rng), w(N * K, rng), y(M * N, rng);
  const double ms = MedianMs(stream, 20, [&] {
    CheckOk(blas.Gemm<bf16, bf16>(stream, false, true, M, N, K, 1.0f, x.ptr, K, w.ptr, K, 0.0f, y.ptr, N),
            "Gemm");
  });
  Print("ftune", "gemm", name, ms, 2.0 * M * N * K);
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
  auto cudnn = CudnnAttention::Create();
  if (cudnn.ok()) {
    std::printf("{\"impl\":\"cudnn\",\"op\":\"info\",\"version\":%lld}\n",
                static_cast<long long>(CudnnAttention::LoadedVersion(nullptr)));
  } else {
    PrintCudnnError("all", cudnn.status());
  }
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
      int64_t B = 0, T = 0, Hq = 0, Hkv = 0, hd = 0, docs = 1;
      std::string word;
      in >> B >> T >> Hq >> Hkv >> hd;
      if (in >> word && (word != "docs" || !(in >> docs) || docs < 1 || docs > T)) {
        std::fprintf(stderr, "bad case (want attn B T Hq Hkv hd [docs N]): %s\n", line.c_str());
        return 1;
      }
      BenchAttention(name, B, T, Hq, Hkv, hd, docs, cudnn.ok() ? cudnn->get() : nullptr, stream, rng);
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
