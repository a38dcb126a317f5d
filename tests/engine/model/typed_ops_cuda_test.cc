// Typed storage on CUDA: every backend op that reads or writes bf16/fp16
// activations (engine/model/backend.h's Act / ConstAct) run on the CUDA
// backend and on the CPU reference with the same inputs. Conversions, row
// gathers and dropout must match bit for bit; the other ops whose fp32 sums run in
// another order on the GPU within a few ulps of the stored type (bf16 2e-2,
// fp16 4e-3 relative, norm-wise) and 1e-4 for their fp32 outputs.
//
// Label gpu: skipped with the reason when no CUDA device is visible (or the
// build has no CUDA); with FT_REQUIRE_GPU=1 (bench/gpu/run.sh) that is a failure.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/backend.h"
#include "engine/model/rng.h"
#include "tests/support/cuda_or_skip.h"

namespace ft {
namespace {

using testing_support::CudaOrSkip;

// Host values representable in `t` (widened), deterministic.
std::vector<float> Values(int64_t n, uint64_t seed, ActDType t, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * (2.0f * UniformFloat(HashKeys(seed, i)) - 1.0f);
  if (t == ActDType::kBF16) cpu::RoundToBf16(v.data(), n);
  if (t == ActDType::kF16) cpu::RoundToFp16(v.data(), n);
  return v;
}

// One tensor on both backends.
struct Twin {
  DeviceBuffer cpu, gpu;
  ActDType dtype = ActDType::kF32;
  int64_t n = 0;
  Act On(bool on_gpu) { return Act(on_gpu ? gpu.data() : cpu.data(), dtype); }
};

class TypedOps {
 public:
  TypedOps(std::shared_ptr<Backend> gpu, ActDType t)
      : gpu_(std::move(gpu)), cpu_(CpuBackendInstance()), t_(t) {}
  Backend& On(bool on_gpu) { return on_gpu ? *gpu_ : *cpu_; }
  // A tensor of n elements in `dtype`, holding `values` (or zeros).
  Twin Make(int64_t n, ActDType dtype, const std::vector<float>& values = {}) {
    Twin w{cpu_->AllocBytes(n * ActDTypeBytes(dtype), MemCategory::kWorkspace),
           gpu_->AllocBytes(n * ActDTypeBytes(dtype), MemCategory::kWorkspace), dtype, n};
    if (values.empty()) return w;
    DeviceBuffer staging = cpu_->Alloc(n, MemCategory::kWorkspace);
    std::memcpy(staging.data(), values.data(), sizeof(float) * static_cast<size_t>(n));
    for (bool g : {false, true}) {
      DeviceBuffer f32 = On(g).Alloc(n, MemCategory::kWorkspace);
      On(g).CopyToDevice(f32.data(), staging.data(), n * 4);
      On(g).Convert(ConstAct(f32.data()), n, w.On(g));
      EXPECT_TRUE(On(g).Synchronize().ok());
    }
    return w;
  }
  Twin Typed(int64_t n, uint64_t seed, float scale = 1.0f) { return Make(n, t_, Values(n, seed, t_, scale)); }
  Twin Floats(int64_t n, uint64_t seed) { return Make(n, ActDType::kF32, Values(n, seed, ActDType::kF32)); }
  // Both copies widened to host floats.
  std::pair<std::vector<float>, std::vector<float>> Read(Twin& w) {
    std::pair<std::vector<float>, std::vector<float>> out;
    for (bool g : {false, true}) {
      DeviceBuffer f32 = On(g).Alloc(w.n, MemCategory::kWorkspace);
      On(g).Convert(ConstAct(w.On(g)), w.n, Act(f32.data()));
      std::vector<float>& host = g ? out.second : out.first;
      host.resize(static_cast<size_t>(w.n));
      On(g).CopyToHost(host.data(), f32.data(), w.n * 4);
      EXPECT_TRUE(On(g).Synchronize().ok()) << gpu_->Describe();
    }
    return out;
  }
  // Norm-wise relative difference, CUDA against the CPU.
  double Diff(Twin& w) {
    auto [c, g] = Read(w);
    double num = 0, den = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      num += (static_cast<double>(g[i]) - c[i]) * (static_cast<double>(g[i]) - c[i]);
      den += static_cast<double>(c[i]) * c[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  }
  bool Same(Twin& w) {
    auto [c, g] = Read(w);
    return std::memcmp(c.data(), g.data(), c.size() * sizeof(float)) == 0;
  }
  double Bound(const Twin& w) const {
    if (w.dtype == ActDType::kF32) return 1e-4;
    return w.dtype == ActDType::kBF16 ? 2e-2 : 4e-3;
  }
  // Expects w's copies within `bound`: the output's storage type's, unless the op's own math is coarser.
  void Check(Twin& w, const char* what, double bound = 0) {
    const double d = Diff(w);
    EXPECT_LE(d, bound > 0 ? bound : Bound(w)) << what << " (" << ActDTypeName(w.dtype) << ")";
    std::printf("TYPED_OP %s %s: %.2e\n", ActDTypeName(t_), what, d);
  }
  ActDType t() const { return t_; }

 private:
  std::shared_ptr<Backend> gpu_, cpu_;
  ActDType t_;
};

// The shapes every op runs on.
constexpr int64_t rows = 96, D = 256, I = 512, heads = 4, kv_heads = 2, hd = 64;
constexpr int64_t Q = heads * hd, KV = kv_heads * hd;

// Conversions (exact both ways) and RMSNorm forward and backward on the typed input x.
void CheckConvertAndRmsNorm(TypedOps& ops, Twin& x) {
  const ActDType t = ops.t();
  Twin f = ops.Floats(rows * D, 1), narrow = ops.Make(rows * D, t);
  for (bool g : {false, true}) ops.On(g).Convert(ConstAct(f.On(g)), rows * D, narrow.On(g));
  EXPECT_TRUE(ops.Same(narrow)) << "narrowing";

  Twin w = ops.Floats(D, 3), y = ops.Make(rows * D, t), rstd = ops.Make(rows, ActDType::kF32),
       dy = ops.Floats(rows * D, 4), dx = ops.Make(rows * D, ActDType::kF32);
  // The gradient stored as the activations are (backend.h), with the weight's gradient.
  Twin dy16 = ops.Typed(rows * D, 5), dx16 = ops.Make(rows * D, ActDType::kF32),
       dw = ops.Make(D, ActDType::kF32);
  for (bool g : {false, true}) {
    ops.On(g).RmsNormForward(x.On(g), w.On(g).as<float>(), rows, D, 1e-5f, y.On(g), rstd.On(g).as<float>());
    ops.On(g).RmsNormBackward(x.On(g), w.On(g).as<float>(), rstd.On(g).as<float>(), dy.On(g).as<float>(),
                              rows, D, dx.On(g).as<float>(), nullptr);
    ops.On(g).RmsNormBackward(x.On(g), w.On(g).as<float>(), rstd.On(g).as<float>(), dy16.On(g), rows, D,
                              dx16.On(g).as<float>(), dw.On(g).as<float>());
  }
  ops.Check(y, "rmsnorm y");
  ops.Check(dx, "rmsnorm dx");
  ops.Check(dx16, "rmsnorm dx from a 16-bit dy");
  ops.Check(dw, "rmsnorm dw from a 16-bit dy");
}

// RoPE in place on the typed q.
void CheckRope(TypedOps& ops, Twin& q) {
  Twin cos_t = ops.Floats(rows * hd / 2, 6), sin_t = ops.Floats(rows * hd / 2, 7);
  std::vector<float> pos_values(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) pos_values[i] = static_cast<float>(i % 48);
  std::vector<int32_t> positions(pos_values.begin(), pos_values.end());
  Twin pos = ops.Make(rows, ActDType::kF32);
  for (bool g : {false, true}) {
    ops.On(g).CopyToDevice(pos.On(g).data, positions.data(), rows * 4);
    ops.On(g).RopeApply(q.On(g), rows, heads, hd, hd, pos.On(g).as<int32_t>(), cos_t.On(g).as<float>(),
                        sin_t.On(g).as<float>(), false);
  }
  ops.Check(q, "rope");
}

// Attention forward and backward on typed q (as RoPE left it), k, v, out.
void CheckAttention(TypedOps& ops, Twin& q) {
  const ActDType t = ops.t();
  cpu::AttentionShape s{2, rows / 2, heads, kv_heads, hd, 1.0 / 8.0};
  Twin k = ops.Typed(rows * KV, 8), v = ops.Typed(rows * KV, 9), out = ops.Make(rows * Q, t),
       lse = ops.Make(rows * heads, ActDType::kF32),
       dout = ops.Make(rows * Q, ActDType::kF32, Values(rows * Q, 10, t)),
       dq = ops.Make(rows * Q, ActDType::kF32), dk = ops.Make(rows * KV, ActDType::kF32),
       dv = ops.Make(rows * KV, ActDType::kF32);
  const GemmOperands mode = t == ActDType::kBF16 ? GemmOperands::kBF16 : GemmOperands::kF16;
  for (bool g : {false, true}) {
    ops.On(g).AttentionForward(mode, s, q.On(g), k.On(g), v.On(g), nullptr, out.On(g), lse.On(g).as<float>(),
                               false);
    ops.On(g).AttentionBackward(mode, s, q.On(g), k.On(g), v.On(g), nullptr, out.On(g), lse.On(g).as<float>(),
                                dout.On(g).as<float>(), dq.On(g).as<float>(), dk.On(g).as<float>(),
                                dv.On(g).as<float>());
  }
  // bf16 attention multiplies P and dS as bf16 on CUDA (tensor cores), in fp32 on the CPU
  // (backend.h): its fp32 gradients agree to bf16's precision.
  const double grad_bound = t == ActDType::kBF16 ? ops.Bound(out) : 0;
  ops.Check(out, "attention out");
  ops.Check(dq, "attention dq", grad_bound);
  ops.Check(dk, "attention dk", grad_bound);
  ops.Check(dv, "attention dv", grad_bound);
}

// SwiGLU and GeGLU-tanh forward and backward; embeddings from an fp32 table (rounded) and
// from a 16-bit one (rows copied): exact.
void CheckSwiGluAndEmbedding(TypedOps& ops) {
  const ActDType t = ops.t();
  Twin gate = ops.Typed(rows * I, 11, 3.0f), up = ops.Typed(rows * I, 12), h = ops.Make(rows * I, t),
       dh = ops.Floats(rows * I, 13), dg = ops.Make(rows * I, ActDType::kF32),
       du = ops.Make(rows * I, ActDType::kF32);
  // The gradients stored as the activations are (backend.h): dh read, dgate and dup written in t.
  Twin dh16 = ops.Typed(rows * I, 20), dg16 = ops.Make(rows * I, t), du16 = ops.Make(rows * I, t);
  for (const Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    for (bool g : {false, true}) {
      ops.On(g).GluForward(act, gate.On(g), up.On(g), rows * I, h.On(g));
      ops.On(g).GluBackward(act, gate.On(g), up.On(g), dh.On(g).as<float>(), rows * I, dg.On(g).as<float>(),
                            du.On(g).as<float>());
      ops.On(g).GluBackward(act, gate.On(g), up.On(g), dh16.On(g), rows * I, dg16.On(g), du16.On(g));
    }
    const std::string name = ActivationName(act);
    ops.Check(h, (name + " glu h").c_str());
    ops.Check(dg, (name + " glu dgate").c_str());
    ops.Check(du, (name + " glu dup").c_str());
    ops.Check(dg16, (name + " glu dgate stored").c_str());
    ops.Check(du16, (name + " glu dup stored").c_str());
  }

  const int64_t vocab = 50;
  std::vector<int32_t> id_values(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) id_values[i] = static_cast<int32_t>(HashKeys(14, i) % vocab);
  Twin ids = ops.Make(rows, ActDType::kF32), table32 = ops.Floats(vocab * D, 15),
       table16 = ops.Typed(vocab * D, 16), e32 = ops.Make(rows * D, t), e16 = ops.Make(rows * D, t);
  for (bool g : {false, true}) {
    ops.On(g).CopyToDevice(ids.On(g).data, id_values.data(), rows * 4);
    ops.On(g).EmbeddingForward(table32.On(g), ids.On(g).as<int32_t>(), rows, D, e32.On(g));
    ops.On(g).EmbeddingForward(table16.On(g), ids.On(g).as<int32_t>(), rows, D, e16.On(g));
  }
  EXPECT_TRUE(ops.Same(e32)) << "embedding from an fp32 table";
  EXPECT_TRUE(ops.Same(e16)) << "embedding from a 16-bit table";
}

// Axpy of the typed x into fp32; dropout of it (exact: one product); the bias gradient of it as a
// stored dy (exact: the same adds in the same order); GEMMs:
// typed x typed in the compute dtype's mode, typed x fp32 (rounded), typed in an fp32 GEMM.
void CheckAxpyDropoutAndGemm(TypedOps& ops, Twin& x) {
  Twin acc = ops.Floats(rows * D, 17), dropped = ops.Make(rows * D, ActDType::kF32);
  const DropoutKey key{0.25, 42, 3, 48, 5};
  for (bool g : {false, true}) {
    ops.On(g).Axpy(rows * D, 0.5f, x.On(g), acc.On(g).as<float>());
    ops.On(g).Dropout(key, x.On(g), rows, D, dropped.On(g).as<float>());
  }
  ops.Check(acc, "axpy");
  EXPECT_TRUE(ops.Same(dropped)) << "dropout";
  Twin dbias = ops.Floats(D, 25);  // x as a 16-bit dy: each column's rows added in order, as the CPU
  for (bool g : {false, true}) ops.On(g).BiasGrad(x.On(g), rows, D, dbias.On(g).as<float>());
  EXPECT_TRUE(ops.Same(dbias)) << "bias gradient of a stored dy";

  const GemmOperands mode = ops.t() == ActDType::kBF16 ? GemmOperands::kBF16 : GemmOperands::kF16;
  Twin b16 = ops.Typed(I * D, 18), b32 = ops.Floats(I * D, 19), c1 = ops.Make(rows * I, ActDType::kF32),
       c2 = ops.Make(rows * I, ActDType::kF32), c3 = ops.Make(rows * I, ActDType::kF32);
  for (bool g : {false, true}) {
    ops.On(g).Gemm(mode, false, true, rows, I, D, 1.0f, x.On(g), D, b16.On(g), D, 0.0f, c1.On(g).as<float>(),
                   I);
    ops.On(g).Gemm(mode, false, true, rows, I, D, 1.0f, x.On(g), D, b32.On(g), D, 0.0f, c2.On(g).as<float>(),
                   I);
    ops.On(g).Gemm(GemmOperands::kF32, false, true, rows, I, D, 1.0f, x.On(g), D, b32.On(g), D, 0.0f,
                   c3.On(g).as<float>(), I);
  }
  ops.Check(c1, "gemm 16-bit x 16-bit");
  ops.Check(c2, "gemm 16-bit x fp32 rounded");
  ops.Check(c3, "gemm 16-bit in fp32");
}

// A linear's last step (LinearOutput): LoRA's product (r 16, and none), the rounding and a
// residual aliasing y, one kernel on CUDA against the CPU's GEMM, Round, Axpy and Convert; the
// output's storage type's precision (the product's fp32 sums run in another order).
void CheckLinearOutput(TypedOps& ops) {
  const ActDType t = ops.t();
  const int64_t r = 16;
  Twin xa = ops.Typed(rows * r, 20), b = ops.Typed(I * r, 21, 0.1f), y = ops.Make(rows * I, t),
       in_place = ops.Typed(rows * I, 22), plain = ops.Make(rows * I, t);
  for (bool g : {false, true}) {
    for (const int64_t rank : {r, int64_t{0}}) {
      Twin c = ops.Floats(rows * I, 23);  // consumed by each call
      const ConstAct residual = in_place.On(g);
      Act out = rank > 0 ? in_place.On(g) : plain.On(g);
      ops.On(g).LinearOutput(rows, I, rank, 2.0f, xa.On(g), b.On(g), c.On(g).as<float>(),
                             rank > 0 ? &residual : nullptr, out);
    }
    Twin c = ops.Floats(rows * I, 24);
    ops.On(g).LinearOutput(rows, I, r, 2.0f, xa.On(g), b.On(g), c.On(g).as<float>(), nullptr, y.On(g));
  }
  ops.Check(y, "linear output (lora)");
  ops.Check(in_place, "linear output (lora, residual in place)");
  EXPECT_TRUE(ops.Same(plain)) << "linear output without a product or residual is a conversion";
}

class TypedOpsCuda : public ::testing::TestWithParam<ActDType> {};

TEST_P(TypedOpsCuda, MatchTheCpuReference) {
  std::string skip;
  std::shared_ptr<Backend> gpu = CudaOrSkip(&skip);
  if (!gpu) GTEST_SKIP() << skip;
  TypedOps ops(gpu, GetParam());
  Twin x = ops.Typed(rows * D, 2), q = ops.Typed(rows * Q, 5);
  CheckConvertAndRmsNorm(ops, x);
  CheckRope(ops, q);
  CheckAttention(ops, q);
  CheckSwiGluAndEmbedding(ops);
  CheckAxpyDropoutAndGemm(ops, x);
  CheckLinearOutput(ops);
}

INSTANTIATE_TEST_SUITE_P(Storage, TypedOpsCuda, ::testing::Values(ActDType::kBF16, ActDType::kF16),
                         [](const auto& info) { return std::string(ActDTypeName(info.param)); });

}  // namespace
}  // namespace ft
