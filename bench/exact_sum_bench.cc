// Order-independent gradient sums measured side by side (issue #30): for A
// micro-batch "gradients" of gradient-like values (seeded: normal values
// times a per-element scale 2^uniform(-20, 0), some exact zeros), each
// technique's cost (accumulator memory and all-reduce bytes per value, time
// per value of the per-micro-batch add and of the final rounding, best of 3)
// and its ORDER test: the sum of the same A micro-batches on one rank in
// order and on two ranks (the first A/2 and the rest) combined the way the
// technique combines ranks; how many elements differ bitwise between the two
// splits, and how many differ from the correctly rounded true sum.
//
// Techniques: fp32 in order; fp64 accumulation rounded once; ExactSum<float>
// (engine/dist/exact_sum.h, what ftune uses); and, written here only as the
// alternative measured, a per-element exponent agreed first (max over the
// kept micro-batches, across ranks an int8 max all-reduce) followed by an
// exact int64 fixed-point sum and one rounding.
//
// The true sum: each element's A values added in __float128, exact whenever
// their bits span at most 113 - ceil(log2(A)) bits (checked per element and
// printed), then rounded once to fp32 (libgcc's conversion rounds correctly).
//
//   exact_sum_bench [--values N] [--micro A] [--seed S] [--spread B]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine/dist/exact_sum.h"

namespace ft {
namespace {

__extension__ typedef __float128 Quad;
using Grads = std::vector<std::vector<float>>;
constexpr int kRepetitions = 3;
constexpr int kMaxRanks = 1024;  // the alternative's headroom: A × kMaxRanks values per element

struct Row {
  std::string name;
  double memory_bytes = 0, wire_bytes = 0, add_ns = 0, round_ns = 0;
  int64_t split_differ = 0, true_differ = 0;
};

// ---- data -------------------------------------------------------------------------------------

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double Unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1p-53; }  // [0, 1)

// Value i of element k: a pure function of (seed, k, i), so threads never change the data.
// `spread` > 0 multiplies it by 2^uniform(-spread, 0) as well: one element's values then differ in
// magnitude across micro-batches (a token seen in one micro-batch only), fp64's hard case.
float GradientValue(uint64_t seed, int64_t k, int i, double scale, double spread) {
  const uint64_t h = Mix(seed ^ Mix(static_cast<uint64_t>(k) * 64 + static_cast<uint64_t>(i)));
  if (Unit(Mix(h ^ 1)) < 0.01) return 0;  // 1% exact zeros
  const double u1 = 1 - Unit(h), u2 = Unit(Mix(h ^ 2));
  const double normal = std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
  return static_cast<float>(normal * scale * std::exp2(-spread * Unit(Mix(h ^ 4))));
}

Grads MakeGradients(int64_t n, int micro, uint64_t seed, double spread) {
  Grads g(static_cast<size_t>(micro), std::vector<float>(static_cast<size_t>(n)));
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t h = Mix(seed ^ Mix(~static_cast<uint64_t>(k)));
    const bool frozen = Unit(Mix(h ^ 3)) < 0.005;  // 0.5% of elements: zero in every micro-batch
    const double scale = std::exp2(-20 * Unit(h));
    for (int i = 0; i < micro; ++i)
      g[static_cast<size_t>(i)][static_cast<size_t>(k)] =
          frozen ? 0 : GradientValue(seed, k, i, scale, spread);
  }
  return g;
}

int BiasedExponent(float x) {  // IEEE exponent field, 1 for subnormals and zero (same grid)
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return std::max(1, static_cast<int>((bits >> 23) & 0xff));
}

// The correctly rounded sums; `inexact` counts elements whose __float128 sum might have rounded.
std::vector<float> TrueSums(const Grads& g, int64_t* inexact) {
  const int64_t n = static_cast<int64_t>(g[0].size());
  const int guard = static_cast<int>(std::ceil(std::log2(static_cast<double>(g.size())))) + 1;
  std::vector<float> out(static_cast<size_t>(n));
  int64_t wide = 0;
#pragma omp parallel for schedule(static) reduction(+ : wide)
  for (int64_t k = 0; k < n; ++k) {
    Quad sum = 0;
    int high = 0, low = 255;
    for (const auto& v : g) {
      const float x = v[static_cast<size_t>(k)];
      sum += static_cast<Quad>(x);
      if (x != 0) high = std::max(high, BiasedExponent(x)), low = std::min(low, BiasedExponent(x));
    }
    if (high > 0 && high - low + 24 + guard > 113) ++wide;
    out[static_cast<size_t>(k)] = static_cast<float>(sum);
  }
  *inexact = wide;
  return out;
}

int64_t Differing(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t d = 0;
  for (size_t k = 0; k < a.size(); ++k) d += std::memcmp(&a[k], &b[k], sizeof(float)) != 0;
  return d;
}

// ---- timing -----------------------------------------------------------------------------------

// The best of kRepetitions runs of `timed`, each after `reset` (not timed), in seconds.
double BestSeconds(const std::function<void()>& reset, const std::function<void()>& timed) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < kRepetitions; ++r) {
    reset();
    const auto start = std::chrono::steady_clock::now();
    timed();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// ---- 1, 2: floating-point accumulators (fp32 in order; fp64, rounded once) --------------------

template <typename Acc>
void AddInto(std::vector<Acc>& acc, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(acc.size());
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k) acc[static_cast<size_t>(k)] += static_cast<Acc>(x[static_cast<size_t>(k)]);
}

template <typename Acc>
void RoundInto(const std::vector<Acc>& acc, std::vector<float>& out) {
  const int64_t n = static_cast<int64_t>(acc.size());
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k)
    out[static_cast<size_t>(k)] = static_cast<float>(acc[static_cast<size_t>(k)]);
}

template <typename Acc>
std::vector<float> RoundedCopy(const std::vector<Acc>& acc) {
  std::vector<float> out(acc.size());
  RoundInto(acc, out);
  return out;
}

// Micro-batches [begin, end) added in order into a zeroed accumulator.
template <typename Acc>
std::vector<Acc> Partial(const Grads& g, int begin, int end) {
  std::vector<Acc> acc(g[0].size(), Acc{0});
  for (int i = begin; i < end; ++i) AddInto(acc, g[static_cast<size_t>(i)]);
  return acc;
}

template <typename Acc>
Row MeasureFloat(const char* name, const Grads& g, const std::vector<float>& truth) {
  const int micro = static_cast<int>(g.size());
  const double values = static_cast<double>(truth.size());
  Row row{name, sizeof(Acc), sizeof(Acc)};
  std::vector<Acc> acc;
  row.add_ns = BestSeconds([&] { acc.assign(truth.size(), Acc{0}); },
                           [&] {
                             for (const auto& v : g) AddInto(acc, v);
                           }) *
               1e9 / (values * micro);
  std::vector<float> one(truth.size());
  // fp32 needs no rounding (the accumulator is the result); fp64 rounds once.
  if (!std::is_same_v<Acc, float>)
    row.round_ns = BestSeconds([] {}, [&] { RoundInto(acc, one); }) * 1e9 / values;
  one = RoundedCopy(Partial<Acc>(g, 0, micro));
  std::vector<Acc> two = Partial<Acc>(g, 0, micro / 2);
  const std::vector<Acc> second = Partial<Acc>(g, micro / 2, micro);
  for (size_t k = 0; k < two.size(); ++k) two[k] += second[k];  // the all-reduce of two partials
  row.split_differ = Differing(one, RoundedCopy(two));
  row.true_differ = Differing(one, truth);
  return row;
}

// ---- 3: ExactSum<float> (ours) ----------------------------------------------------------------

// Two ranks as two threads of this process, doing what ExactSum::AllReduce asks of Gloo (an int8
// max, then an int64 sum) through shared memory: the bench measures arithmetic, not the network.
struct PairShared {
  std::barrier<> sync{2};
  const void* posted[2] = {nullptr, nullptr};
};

class PairCollective : public Collective {
 public:
  PairCollective(PairShared* shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return 2; }
  Status AllReduceSum(float*, int64_t) override { return Unused(); }
  Status AllReduceSum(double*, int64_t) override { return Unused(); }
  Status AllReduceSum(int64_t* x, int64_t n) override { return Combine(x, n, std::plus<int64_t>()); }
  Status AllReduceMax(int8_t* x, int64_t n) override {
    return Combine(x, n, [](int8_t a, int8_t b) { return std::max(a, b); });
  }
  Status Broadcast(void*, int64_t, int) override { return Unused(); }
  Status AllGather(const void*, int64_t, void*) override { return Unused(); }
  Status Barrier(std::chrono::milliseconds) override { return Unused(); }

 private:
  static Status Unused() { return Status::Unimplemented("exact_sum_bench: not used by ExactSum"); }
  template <typename V, typename Op>
  Status Combine(V* x, int64_t n, Op op) {
    shared_->posted[rank_] = x;
    shared_->sync.arrive_and_wait();  // both inputs posted
    const V* peer = static_cast<const V*>(shared_->posted[1 - rank_]);
    std::vector<V> out(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) out[static_cast<size_t>(k)] = op(x[k], peer[k]);
    shared_->sync.arrive_and_wait();  // both inputs read: each rank may overwrite its own
    std::copy(out.begin(), out.end(), x);
    return Status::OK();
  }
  PairShared* shared_;
  int rank_;
};

std::vector<float> ExactRounded(const ExactSum<float>& s) {
  std::vector<float> out(static_cast<size_t>(s.size()));
  s.Round(out.data());
  return out;
}

// Rank r of 2 adds its half of the micro-batches, then all-reduces; rank 0's rounded result.
std::vector<float> ExactOnTwoRanks(const Grads& g) {
  const int micro = static_cast<int>(g.size());
  PairShared shared;
  std::vector<float> result;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ExactSum<float> s(static_cast<int64_t>(g[0].size()));
      for (int i = r == 0 ? 0 : micro / 2; i < (r == 0 ? micro / 2 : micro); ++i)
        s.Add(g[static_cast<size_t>(i)].data());
      PairCollective ranks_of_two(&shared, r);
      const Status st = s.AllReduce(&ranks_of_two);
      if (!st.ok()) std::fprintf(stderr, "exact_sum_bench: %s\n", st.ToString().c_str());
      if (r == 0) result = ExactRounded(s);
    });
  }
  for (std::thread& t : ranks) t.join();
  return result;
}

Row MeasureExact(const Grads& g, const std::vector<float>& truth) {
  const int micro = static_cast<int>(g.size());
  const double values = static_cast<double>(truth.size());
  Row row{"ExactSum<float> (ours)", ExactSum<float>::kWireBytesPerElement,
          ExactSum<float>::kWireBytesPerElement};
  ExactSum<float> s(static_cast<int64_t>(truth.size()));
  row.add_ns = BestSeconds([&] { s.Clear(); },
                           [&] {
                             for (const auto& v : g) s.Add(v.data());
                           }) *
               1e9 / (values * micro);
  std::vector<float> one(truth.size());
  row.round_ns = BestSeconds([] {}, [&] { s.Round(one.data()); }) * 1e9 / values;
  row.split_differ = Differing(one, ExactOnTwoRanks(g));
  row.true_differ = Differing(one, truth);
  return row;
}

// ---- 4: THE ALTERNATIVE MEASURED: a per-element exponent, then an exact int64 sum --------------

// Not ftune's code: the technique docs/ENGINE.md compares ExactSum against. One rank keeps every
// micro-batch it adds (the exponent must be agreed before any value is converted); at the step's
// end, pass 1 takes each element's largest exponent (across ranks: an int8 max all-reduce),
// pass 2 converts each value to int64 fixed point relative to it and sums (across ranks: an int64
// sum), and one rounding gives fp32. Fixed point: 2^(that exponent) maps to 2^(62 - H) with
// H = ceil(log2(A · kMaxRanks)), so A · kMaxRanks values never overflow; bits of a value below
// 2^(-62 + H) of the largest are truncated (its magnitude, on the grid: never order-dependent).
// Data with NaN/inf is out of scope here.
class PerElementExponentSum {
 public:
  // Room to keep `capacity` micro-batches; the grid leaves headroom for a step of `micro` per rank.
  PerElementExponentSum(int64_t n, int capacity, int micro)
      : headroom_(static_cast<int>(std::ceil(std::log2(static_cast<double>(micro) * kMaxRanks)))),
        kept_(static_cast<size_t>(capacity), std::vector<float>(static_cast<size_t>(n))),
        exponent_(static_cast<size_t>(n)),
        fixed_(static_cast<size_t>(n)) {}
  static double MemoryBytes(int micro) { return micro * 4.0 + 8 + 1; }
  static constexpr double kWireBytes = 8 + 1;  // int64 sum + int8 max

  void Clear() { used_ = 0; }
  // The per-micro-batch cost: a copy into the next kept buffer.
  void Add(const std::vector<float>& x) {
    float* to = kept_[static_cast<size_t>(used_++)].data();
    const int64_t n = static_cast<int64_t>(x.size());
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; ++k) to[k] = x[static_cast<size_t>(k)];
  }
  // Pass 1: the rank's own maximum exponents.
  void Exponents() {
    const int64_t n = static_cast<int64_t>(exponent_.size());
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; ++k) {
      int e = 1;
      for (int i = 0; i < used_; ++i)
        e = std::max(e, BiasedExponent(kept_[static_cast<size_t>(i)][static_cast<size_t>(k)]));
      exponent_[static_cast<size_t>(k)] = static_cast<int8_t>(e - 128);
    }
  }
  // Across ranks: the int8 max all-reduce, here of two ranks in one process.
  void AgreeWith(PerElementExponentSum& other) {
    for (size_t k = 0; k < exponent_.size(); ++k)
      exponent_[k] = other.exponent_[k] = std::max(exponent_[k], other.exponent_[k]);
  }
  void FixedPointSum();
  void AddFixed(const PerElementExponentSum& other) {  // the int64 all-reduce
    for (size_t k = 0; k < fixed_.size(); ++k) fixed_[k] += other.fixed_[k];
  }
  // Correct rounding: int64 → float rounds once; scaling by a power of two in double and the
  // cast back are exact wherever the result is a normal float (always, for these data).
  void Round(float* out) const {
    RoundWith(out, [](int64_t q, double scale) {
      return static_cast<float>(static_cast<double>(static_cast<float>(q)) * scale);
    });
  }
  // The double rounding (int64 → double → float) a careless implementation would do.
  void RoundViaDouble(float* out) const {
    RoundWith(out,
              [](int64_t q, double scale) { return static_cast<float>(static_cast<double>(q) * scale); });
  }

 private:
  template <typename F>
  void RoundWith(float* out, F convert) const {
    // q · 2^s with s = (e - 126) - (62 - H): the value 2^(e - 126) was mapped to 2^(62 - H).
    double scale[256];
    for (int e = 0; e < 256; ++e) scale[e] = std::ldexp(1.0, e - 126 - (62 - headroom_));
    const int64_t n = static_cast<int64_t>(fixed_.size());
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; ++k)
      out[k] = convert(fixed_[static_cast<size_t>(k)], scale[exponent_[static_cast<size_t>(k)] + 128]);
  }
  int headroom_;
  Grads kept_;
  int used_ = 0;
  std::vector<int8_t> exponent_;  // biased fp32 exponent - 128
  std::vector<int64_t> fixed_;
};

void PerElementExponentSum::FixedPointSum() {
  const int64_t n = static_cast<int64_t>(fixed_.size());
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k) {
    const int top = exponent_[static_cast<size_t>(k)] + 128;
    int64_t sum = 0;
    for (int i = 0; i < used_; ++i) {
      const float x = kept_[static_cast<size_t>(i)][static_cast<size_t>(k)];
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof(bits));
      const uint64_t field = (bits >> 23) & 0xff, fraction = bits & 0x7fffff;
      const uint64_t mantissa = field == 0 ? fraction : fraction | 0x800000;
      // x = ±mantissa · 2^(e_x - 150); |x| < 2^(top - 126) ↦ 2^(62 - H).
      const int shift = BiasedExponent(x) - top + 38 - headroom_;
      const uint64_t q = shift >= 0 ? mantissa << shift : shift > -64 ? mantissa >> -shift : 0;
      sum += (bits >> 31) ? -static_cast<int64_t>(q) : static_cast<int64_t>(q);
    }
    fixed_[static_cast<size_t>(k)] = sum;
  }
}

// Ranks 0 and 1 with micro-batches [0, A/2) and [A/2, A): their partials combined.
std::vector<float> AlternativeOnTwoRanks(const Grads& g) {
  const int64_t n = static_cast<int64_t>(g[0].size());
  const int micro = static_cast<int>(g.size());
  PerElementExponentSum r0(n, micro / 2, micro), r1(n, micro - micro / 2, micro);
  for (int i = 0; i < micro; ++i) (i < micro / 2 ? r0 : r1).Add(g[static_cast<size_t>(i)]);
  r0.Exponents();
  r1.Exponents();
  r0.AgreeWith(r1);
  r0.FixedPointSum();
  r1.FixedPointSum();
  r0.AddFixed(r1);
  std::vector<float> out(static_cast<size_t>(n));
  r0.Round(out.data());
  return out;
}

Row MeasureAlternative(const Grads& g, const std::vector<float>& truth, int64_t* double_rounding) {
  const int micro = static_cast<int>(g.size());
  const double values = static_cast<double>(truth.size());
  Row row{"alternative: per-element exponent + int64", PerElementExponentSum::MemoryBytes(micro),
          PerElementExponentSum::kWireBytes};
  PerElementExponentSum s(static_cast<int64_t>(truth.size()), micro, micro);
  row.add_ns = BestSeconds([&] { s.Clear(); },
                           [&] {
                             for (const auto& v : g) s.Add(v);
                           }) *
               1e9 / (values * micro);
  std::vector<float> one(truth.size()), careless(truth.size());
  // The step's end: both passes and the rounding (a single rank: no all-reduce between).
  row.round_ns = BestSeconds([] {},
                             [&] {
                               s.Exponents();
                               s.FixedPointSum();
                               s.Round(one.data());
                             }) *
                 1e9 / values;
  s.RoundViaDouble(careless.data());
  *double_rounding = Differing(one, careless);
  row.split_differ = Differing(one, AlternativeOnTwoRanks(g));
  row.true_differ = Differing(one, truth);
  return row;
}

// ---- report -----------------------------------------------------------------------------------

void PrintTable(const std::vector<Row>& rows, int64_t values) {
  std::printf("%-42s | %8s | %6s | %8s | %8s | %14s | %14s\n", "technique", "memory", "wire", "add", "round",
              "differ between", "differ from");
  std::printf("%-42s | %8s | %6s | %8s | %8s | %14s | %14s\n", "", "B/value", "B/value", "ns/value",
              "ns/value", "splits", "true sum");
  for (const Row& r : rows) {
    std::printf("%-42s | %8.0f | %6.0f | %8.2f | %8.2f | %14lld | %14lld\n", r.name.c_str(), r.memory_bytes,
                r.wire_bytes, r.add_ns, r.round_ns, static_cast<long long>(r.split_differ),
                static_cast<long long>(r.true_differ));
  }
  std::printf("(differences counted over %lld elements; add: per value per micro-batch)\n",
              static_cast<long long>(values));
}

int Run(int64_t values, int micro, uint64_t seed, double spread) {
  const int threads =
#ifdef _OPENMP
      omp_get_max_threads();
#else
      1;
#endif
  std::printf(
      "config: %lld values, %d micro-batches (ranks split %d + %d), seed %llu, per-value spread 2^-%g, "
      "%d OpenMP threads\n",
      static_cast<long long>(values), micro, micro / 2, micro - micro / 2,
      static_cast<unsigned long long>(seed), spread, threads);
  const Grads g = MakeGradients(values, micro, seed, spread);
  int64_t inexact = 0, double_rounding = 0;
  const std::vector<float> truth = TrueSums(g, &inexact);
  std::vector<Row> rows;
  rows.push_back(MeasureFloat<float>("fp32 in order", g, truth));
  rows.push_back(MeasureFloat<double>("fp64 accumulation, rounded once", g, truth));
  rows.push_back(MeasureExact(g, truth));
  rows.push_back(MeasureAlternative(g, truth, &double_rounding));
  PrintTable(rows, values);
  std::printf("true sum: __float128, exact for all but %lld elements (their bits span > 113 - guard bits)\n",
              static_cast<long long>(inexact));
  std::printf(
      "alternative: add = keeping a copy of the micro-batch; round = exponent pass + int64 pass + "
      "rounding; rounding via double (int64 -> double -> float) differs from correct rounding in %lld\n",
      static_cast<long long>(double_rounding));
  return 0;
}

}  // namespace
}  // namespace ft

int main(int argc, char** argv) {
  CLI::App app{"exact_sum_bench: order-independent gradient sums measured side by side"};
  int64_t values = 41943040;  // Llama-3-8B, LoRA r=16 on every linear
  int micro = 4;
  uint64_t seed = 30;
  double spread = 0;
  app.add_option("--values", values, "values per gradient (default: the 8B r=16 all-linear LoRA count)");
  app.add_option("--micro", micro, "micro-batches A per step (split over two ranks for the order test)");
  app.add_option("--seed", seed, "data seed");
  app.add_option("--spread", spread,
                 "also scale each value by 2^uniform(-spread, 0) (default 0: per element only)");
  CLI11_PARSE(app, argc, argv);
  if (values < 1 || micro < 2 || micro > 64 || spread < 0 || spread > 60) {
    std::fprintf(stderr, "exact_sum_bench: need --values >= 1, 2 <= --micro <= 64 and 0 <= --spread <= 60\n");
    return 2;
  }
  return ft::Run(values, micro, seed, spread);
}
