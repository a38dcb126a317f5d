// CpuBackend: engine/model/backend.h on the host. Memory is 64-byte-aligned host
// memory; every op forwards to kernels/cpu (the reference), so a model run
// through it is bit-identical to one calling kernels/cpu directly.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/model/backend.h"
#include "engine/model/rng.h"

namespace ft {
namespace {

// Calls f(S{}) with S the storage type of `t`: float, cpu::Bf16 or cpu::Half.
template <typename F>
void WithStorage(ActDType t, F&& f) {
  switch (t) {
    case ActDType::kF32: return f(float{});
    case ActDType::kBF16: return f(cpu::Bf16{});
    case ActDType::kF16: return f(cpu::Half{});
  }
}

// Calls f(S{}, G{}) with S the storage type of `t` and G a gradient's, `g`: fp32, or the same 16
// bits as the activations it goes with (the only pairs the ops take: backend.h).
template <typename F>
void WithStorageAndGradient(ActDType t, ActDType g, F&& f) {
  FT_CHECK(g == ActDType::kF32 || g == t);
  WithStorage(t, [&](auto tag) {
    if (g == ActDType::kF32) return f(tag, float{});
    f(tag, tag);
  });
}

// x[rows, cols] (row stride ld) as floats, packed (row stride cols): widened
// from 16-bit storage, and fp32 values rounded to bf16 or fp16 when `to` says.
std::vector<float> OperandCopy(GemmOperands to, ConstAct x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  WithStorage(x.dtype, [&](auto tag) {
    using S = decltype(tag);
    for (int64_t r = 0; r < rows; ++r) {
      if constexpr (std::is_same_v<S, float>) {
        std::memcpy(out.data() + r * cols, x.as<float>() + r * ld, sizeof(float) * cols);
      } else {
        cpu::Convert(x.as<S>() + r * ld, cols, out.data() + r * cols);
      }
    }
  });
  if (x.dtype != ActDType::kF32) return out;  // 16-bit values: exact in either operand type
  if (to == GemmOperands::kF16) cpu::RoundToFp16(out.data(), rows * cols);
  if (to == GemmOperands::kBF16) cpu::RoundToBf16(out.data(), rows * cols);
  return out;
}

class CpuBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string Describe() const override { return "cpu"; }

  void CopyToDevice(void* dst, const void* host_src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host_src, static_cast<size_t>(bytes));
  }
  void CopyToHost(void* host_dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, src, static_cast<size_t>(bytes));
  }
  void Copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void Copy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
              int64_t rows) override {
    for (int64_t r = 0; r < rows && width > 0; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
                  static_cast<size_t>(width));
    }
  }
  void CopyToDeviceAsync(void* dst, const void* host_src, int64_t bytes) override {
    InlineCopy(dst, host_src, bytes, true, &stats_);
  }
  void CopyToHostAsync(void* host_dst, const void* src, int64_t bytes) override {
    InlineCopy(host_dst, src, bytes, false, &stats_);
  }
  void WaitForCopies() override {}
  CopyStats copy_stats() override { return stats_; }
  void Zero(float* x, int64_t n) override {
    if (n > 0) std::memset(x, 0, sizeof(float) * static_cast<size_t>(n));
  }
  Status Synchronize() override { return Status::OK(); }
  StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() override {
    FT_ASSIGN_OR_RETURN(int64_t available, HostAvailableBytes());
    return std::make_pair(available, int64_t{sysconf(_SC_PHYS_PAGES)} * sysconf(_SC_PAGESIZE));
  }

  void Gemm(GemmOperands operands, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            ConstAct A, int64_t lda, ConstAct B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    const bool as_is =
        (operands == GemmOperands::kF32 && A.dtype == ActDType::kF32 && B.dtype == ActDType::kF32);
    if (as_is || K == 0) {
      cpu::Gemm<float>(trans_a, trans_b, M, N, K, alpha, A.as<float>(), lda, B.as<float>(), ldb, beta, C,
                       ldc);
      return;
    }
    // 16-bit operands: packed float copies (widened, or rounded), then the fp32 GEMM (exact products, fp32
    // sums).
    const std::vector<float> a = OperandCopy(operands, A, trans_a ? K : M, trans_a ? M : K, lda);
    const std::vector<float> b = OperandCopy(operands, B, trans_b ? N : K, trans_b ? K : N, ldb);
    cpu::Gemm<float>(trans_a, trans_b, M, N, K, alpha, a.data(), trans_a ? M : K, b.data(), trans_b ? K : N,
                     beta, C, ldc);
  }
  void RmsNormForward(ConstAct x, const float* w, int64_t rows, int64_t D, float eps, Act y,
                      float* rstd) override {
    FT_CHECK(x.dtype == y.dtype);
    WithStorage(x.dtype, [&](auto tag) {
      using S = decltype(tag);
      cpu::RmsNormForward<float, S>(x.as<S>(), w, rows, D, eps, y.as<S>(), rstd);
    });
  }
  void RmsNormBackward(ConstAct x, const float* w, const float* rstd, ConstAct dy, int64_t rows, int64_t D,
                       float* dx, float* dw) override {
    WithStorageAndGradient(x.dtype, dy.dtype, [&](auto tag, auto grad_tag) {
      using S = decltype(tag);
      using G = decltype(grad_tag);
      cpu::RmsNormBackward<float, S, G>(x.as<S>(), w, rstd, dy.as<G>(), rows, D, dx, dw);
    });
  }
  void RopeApply(Act x, int64_t rows, int64_t heads, int64_t hd, int64_t rotary, const int32_t* positions,
                 const float* cos_table, const float* sin_table, bool inverse) override {
    WithStorage(x.dtype, [&](auto tag) {
      using S = decltype(tag);
      cpu::RopeApply<float, S>(x.as<S>(), rows, heads, hd, positions, cos_table, sin_table, inverse, rotary);
    });
  }
  void AttentionForward(GemmOperands /*fp32 math either way*/, const cpu::AttentionShape& s, ConstAct q,
                        ConstAct k, ConstAct v, const int32_t* segments, Act out, float* lse,
                        bool naive) override {
    FT_CHECK(q.dtype == k.dtype && k.dtype == v.dtype && v.dtype == out.dtype);
    WithStorage(q.dtype, [&](auto tag) {
      using S = decltype(tag);
      if (naive) {
        cpu::AttentionForwardNaive<float, S>(s, q.as<S>(), k.as<S>(), v.as<S>(), segments, out.as<S>(), lse);
      } else {
        cpu::AttentionForward<float, S>(s, q.as<S>(), k.as<S>(), v.as<S>(), segments, out.as<S>(), lse);
      }
    });
  }
  void AttentionBackward(GemmOperands /*fp32 math either way*/, const cpu::AttentionShape& s, ConstAct q,
                         ConstAct k, ConstAct v, const int32_t* segments, ConstAct out, const float* lse,
                         const float* dout, float* dq, float* dk, float* dv) override {
    FT_CHECK(q.dtype == k.dtype && k.dtype == v.dtype && v.dtype == out.dtype);
    WithStorage(q.dtype, [&](auto tag) {
      using S = decltype(tag);
      cpu::AttentionBackward<float, S>(s, q.as<S>(), k.as<S>(), v.as<S>(), segments, out.as<S>(), lse, dout,
                                       dq, dk, dv);
    });
  }
  void GluForward(Activation act, ConstAct gate, ConstAct up, int64_t n, Act h) override {
    FT_CHECK(gate.dtype == up.dtype && up.dtype == h.dtype);
    WithStorage(h.dtype, [&](auto tag) {
      using S = decltype(tag);
      (act == Activation::kSilu ? cpu::SwiGluForward<S>
                                : cpu::GeluTanhGluForward<S>)(gate.as<S>(), up.as<S>(), n, h.as<S>());
    });
  }
  void GluBackward(Activation act, ConstAct gate, ConstAct up, ConstAct dh, int64_t n, Act dgate,
                   Act dup) override {
    FT_CHECK(gate.dtype == up.dtype && dh.dtype == dgate.dtype && dgate.dtype == dup.dtype);
    WithStorageAndGradient(gate.dtype, dh.dtype, [&](auto tag, auto grad_tag) {
      using S = decltype(tag);
      using G = decltype(grad_tag);
      (act == Activation::kSilu ? cpu::SwiGluBackward<float, S, G>
                                : cpu::GeluTanhGluBackward<float, S, G>)(gate.as<S>(), up.as<S>(), dh.as<G>(),
                                                                         n, dgate.as<G>(), dup.as<G>());
    });
  }
  void EmbeddingForward(ConstAct table, const int32_t* ids, int64_t rows, int64_t D, Act out) override {
    FT_CHECK(table.dtype == ActDType::kF32 || table.dtype == out.dtype);
    WithStorage(out.dtype, [&](auto tag) {
      using S = decltype(tag);
      if (table.dtype == ActDType::kF32) {
        cpu::EmbeddingForward<float, S>(table.as<float>(), ids, rows, D, out.as<S>());
      } else {
        cpu::EmbeddingForward<S, S>(table.as<S>(), ids, rows, D, out.as<S>());  // rows of codes copied
      }
    });
  }
  void EmbeddingBackward(const float* dout, const int32_t* ids, int64_t rows, int64_t D,
                         float* dtable) override {
    cpu::EmbeddingBackward<float>(dout, ids, rows, D, dtable);
  }
  void CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V, float grad_scale,
                    float* dlogits, double* loss_sum, float softcap) override {
    *loss_sum += cpu::CrossEntropy<float>(logits, targets, rows, V, grad_scale, dlogits, softcap);
  }
  void DequantizeNf4(const cpu::Nf4Layout& layout, const void* blob, Act out) override {
    const auto* codes = static_cast<const uint8_t*>(blob);
    if (out.dtype == ActDType::kF32) {
      cpu::DequantizeNf4Blob(layout, codes, out.as<float>());
      return;
    }
    // fp32 values first (the definition), then narrowed: a scratch per thread, kept, so a model's
    // every weight use does not allocate (and fault in) its own.
    thread_local std::vector<float> values;
    if (values.size() < static_cast<size_t>(layout.n)) values.resize(static_cast<size_t>(layout.n));
    cpu::DequantizeNf4Blob(layout, codes, values.data());
    cpu::NarrowTo16(out.dtype == ActDType::kBF16, values.data(), layout.n, out.as<uint16_t>());
  }

  void Axpy(int64_t n, float alpha, ConstAct x, float* y) override {
    WithStorage(x.dtype, [&](auto tag) {
      using S = decltype(tag);
      cpu::Axpy<float, S>(n, alpha, x.as<S>(), y);
    });
  }
  void Scale(int64_t n, float alpha, float* x) override { cpu::Scale<float>(n, alpha, x); }
  void SoftCap(int64_t n, float cap, float* x) override { cpu::SoftCap<float>(n, cap, x); }
  void AddBias(float* y, const float* bias, int64_t rows, int64_t n) override {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) y[r * n + j] += bias[j];
    }
  }
  void BiasGrad(ConstAct dy, int64_t rows, int64_t n, float* dbias) override {
    WithStorage(dy.dtype, [&](auto tag) {
      using S = decltype(tag);
      const S* g = dy.as<S>();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < n; ++j) dbias[j] += cpu::Load(g[r * n + j]);
      }
    });
  }
  void RoundToBf16(float* x, int64_t n) override { cpu::RoundToBf16(x, n); }
  void RoundToFp16(float* x, int64_t n) override { cpu::RoundToFp16(x, n); }
  // The composition LinearOutput's definition names (backend.h).
  void LinearOutput(int64_t rows, int64_t n, int64_t r, float alpha, ConstAct xa, ConstAct b, float* c,
                    const ConstAct* residual, Act y) override {
    FT_CHECK(y.dtype != ActDType::kF32);
    const bool f16 = y.dtype == ActDType::kF16;
    if (r > 0)
      Gemm(f16 ? GemmOperands::kF16 : GemmOperands::kBF16, false, true, rows, n, r, alpha, xa, r, b, r, 1.0f,
           c, n);
    if (residual != nullptr) {
      f16 ? RoundToFp16(c, rows * n) : RoundToBf16(c, rows * n);
      Axpy(rows * n, 1.0f, *residual, c);
    }
    Convert(ConstAct(c), rows * n, y);
  }
  void Convert(ConstAct x, int64_t n, Act out) override {
    if (x.dtype == out.dtype) {
      Copy(out.data, x.data, n * ActDTypeBytes(x.dtype));
      return;
    }
    WithStorage(x.dtype, [&](auto in_tag) {
      WithStorage(out.dtype, [&](auto out_tag) {
        using SIn = decltype(in_tag);
        using SOut = decltype(out_tag);
        if constexpr (std::is_same_v<SIn, float> != std::is_same_v<SOut, float>) {
          cpu::Convert(x.as<SIn>(), n, out.as<SOut>());
        } else {
          FT_CHECK(false && "Convert: between two 16-bit types");
        }
      });
    });
  }
  void Dropout(const DropoutKey& key, ConstAct x_act, int64_t rows, int64_t in, float* out) override {
    // A typed input is widened first (into out: the same values, then masked in place).
    const float* x = x_act.as<float>();
    if (x_act.dtype != ActDType::kF32) {
      Convert(x_act, rows * in, out);
      x = out;
    }
    const double p = key.p;
    const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
    for (int64_t r = 0; r < rows; ++r) {
      // Keyed by (sequence, position, module, feature): independent of the batch plan.
      const uint64_t row_key = HashKeys(key.seed, static_cast<uint64_t>(key.first_sequence + r / key.seq),
                                        static_cast<uint64_t>(r % key.seq), key.module_key);
      for (int64_t c = 0; c < in; ++c) {
        const bool keep = UniformFloat(Mix64(row_key ^ static_cast<uint64_t>(c))) >= p;
        out[r * in + c] = keep ? x[r * in + c] * keep_scale : 0.0f;
      }
    }
  }
  void DropoutBackwardAdd(const DropoutKey& key, const float* d, int64_t rows, int64_t in,
                          float* dx) override {
    std::vector<float> mask(static_cast<size_t>(rows * in), 1.0f);
    Dropout(key, mask.data(), rows, in, mask.data());
    for (int64_t i = 0; i < rows * in; ++i) dx[i] += d[i] * mask[i];
  }
  double SumSquares(const std::vector<FloatRange>& tensors) override {
    double sum = 0;
    for (const FloatRange& t : tensors) sum += cpu::SumSquares<float>(t.data, t.n);
    return sum;
  }
  void AdamW(const cpu::AdamWParams& hp, int64_t n, float* param, const float* grad, float* m, float* v,
             Act copy) override {
    cpu::AdamW<float>(hp, n, param, grad, m, v);
    if (copy.data != nullptr) Convert(ConstAct(param), n, copy);
  }

 protected:
  void* RawAlloc(int64_t bytes) override {
    const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p != nullptr) std::memset(p, 0, rounded);
    return p;
  }
  void RawFree(void* p) override { std::free(p); }

 private:
  CopyStats stats_;
};

}  // namespace

std::shared_ptr<Backend> CpuBackendInstance() {
  static const std::shared_ptr<Backend> instance = std::make_shared<CpuBackend>();
  return instance;
}

}  // namespace ft
