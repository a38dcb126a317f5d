// Causal (optionally segment-masked) GQA attention.
//
// AttentionForward is the FlashAttention form. For a tile of queries it walks
// tiles of keys; per query it keeps a running max m, a running sum l of
// exp(s - m) and an unnormalised output acc. A tile's scores S = scale Q Kᵀ
// raise m to m' = max(m, rowmax S); l and acc are rescaled by exp(m - m'),
// then P = exp(S - m') adds l += rowsum P and acc += P V. At the end
// out = acc / l and lse = m + log l. Extra memory is O(tile * head_dim) per
// (batch, head), never a [seq, seq] matrix.
//
// AttentionBackward is FlashAttention-2's. Per tile it recomputes
// P = exp(S - lse) from the saved lse and, with D_i = dout_i · out_i,
//   dS = P ∘ (dout Vᵀ - D),  dQ += scale dS K,  dK += scale dSᵀ Q,  dV += Pᵀ dout.
//
// A sliding window (s.window) hides key j from query i when i + past - j >=
// window: key tiles wholly before the window are skipped, so the cost is
// O(seq * window). Soft-capping (s.softcap = c) replaces a scaled score x by
// c tanh(x / c) before the mask; the backward multiplies dS by its derivative
// 1 - tanh² = 1 - (S / c)², computed from the recomputed capped S.
//
// The tile products are Gemm calls on strided views of the [rows, heads * hd]
// tensors (no copies); exp is internal::FastExp (fast_math.h), which
// vectorises. AttentionForwardNaive, the reference, uses std::exp.
//
// Parallelism: the forward over (batch, query head), the backward over (batch,
// kv head) with that kv head's query heads looped in order inside, so dK and
// dV accumulate in a fixed order. Each task runs the same operations whichever
// thread takes it, so nothing depends on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/openmp_start.h"
#include "common/status.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

// Tiles of 32 queries x 64 keys: products big enough for BLAS to run well,
// scores small enough (8 KiB of floats) to stay in L1.
constexpr int64_t kQueryTile = 32;
constexpr int64_t kKeyTile = 64;

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

void CheckShape(const AttentionShape& s, const int32_t* segments) {
  FT_CHECK(s.batch >= 0 && s.seq >= 0 && s.head_dim > 0 && s.past() >= 0);
  FT_CHECK(s.window >= 0 && s.softcap >= 0);
  FT_CHECK(s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0);
  FT_CHECK(segments == nullptr || s.past() == 0);  // no segments with a KV cache
}

// One (batch element, head) of a [batch * rows, heads * hd] tensor (rows per
// sequence: seq for queries, keys() for keys and values): row i of the head
// starts at ptr + i * ld.
template <typename P>
struct HeadView {
  P* ptr;
  int64_t ld;
  P* Row(int64_t i) const { return ptr + i * ld; }
};
template <typename P>
HeadView<P> Head(P* x, const AttentionShape& s, int64_t rows, int64_t heads, int64_t b, int64_t h) {
  return {x + (b * rows * heads + h) * s.head_dim, heads * s.head_dim};
}

// A tile: queries [i0, i0 + rows) against keys [j0, j0 + cols).
struct Tile {
  int64_t i0, rows, j0, cols;
};

// The first key query i (at position i + past) sees: 0, or the window's start.
int64_t FirstVisibleKey(const AttentionShape& s, int64_t i) {
  return s.window > 0 ? std::max<int64_t>(0, i + s.past() - s.window + 1) : 0;
}

// x -> c tanh(x / c) in place (Gemma 2's soft-capping); c = 0: unchanged.
template <typename T>
void SoftCap(T* x, int64_t n, double softcap) {
  if (softcap <= 0) return;
  const T c = static_cast<T>(softcap);
  for (int64_t e = 0; e < n; ++e) x[e] = c * std::tanh(x[e] / c);
}

// S[rows, cols] = scale * Q_tile K_tileᵀ (soft-capped), with -inf where key j
// is not visible to query i (j > i + past, before the window, or another segment).
template <typename T>
void TileScores(const Tile& t, const AttentionShape& s, HeadView<const T> q, HeadView<const T> k,
                const int32_t* seg, T* S) {
  const int64_t past = s.past();
  Gemm<T>(false, true, t.rows, t.cols, s.head_dim, static_cast<T>(s.scale), q.Row(t.i0), q.ld, k.Row(t.j0),
          k.ld, T(0), S, t.cols);
  SoftCap(S, t.rows * t.cols, s.softcap);
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t i = t.i0 + r;
    T* row = S + r * t.cols;
    const int64_t causal_end = std::clamp<int64_t>(i + past - t.j0 + 1, 0, t.cols);  // keys j <= i + past
    const int64_t window_begin = std::clamp<int64_t>(FirstVisibleKey(s, i) - t.j0, 0, causal_end);
    std::fill(row, row + window_begin, kNegInf<T>);
    std::fill(row + causal_end, row + t.cols, kNegInf<T>);
    if (seg == nullptr) continue;
    for (int64_t c = window_begin; c < causal_end; ++c) {
      if (seg[t.j0 + c] != seg[i]) row[c] = kNegInf<T>;
    }
  }
}

// Online softmax for one query row: folds scores s[0, n) into (m, l, acc[hd])
// and turns s into the probabilities exp(s - m_new) that acc must still add.
template <typename T>
void OnlineSoftmaxRow(T* s, int64_t n, int64_t hd, T& m, T& l, T* acc) {
  const T new_m = std::max(m, internal::Max(s, n));
  if (new_m == kNegInf<T>) {  // no visible key so far: nothing to add
    std::fill(s, s + n, T(0));
    return;
  }
  if (new_m != m) {
    const T correction = internal::FastExp(m - new_m);  // 0 on the first visible tile (m = -inf)
    l *= correction;
    for (int64_t d = 0; d < hd; ++d) acc[d] *= correction;
    m = new_m;
  }
  internal::ExpShiftedInPlace(s, n, m);  // masked: exp(-inf) = 0
  l += internal::LaneSum<T>(s, n);
}

template <typename T>
void FlashForwardHead(const AttentionShape& s, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v,
                      const int32_t* seg, HeadView<T> out, T* lse) {
  const int64_t hd = s.head_dim, past = s.past();
  std::vector<T> m, l, acc, S(kQueryTile * kKeyTile);
  for (int64_t i0 = 0; i0 < s.seq; i0 += kQueryTile) {
    const int64_t rows = std::min(kQueryTile, s.seq - i0);
    m.assign(rows, kNegInf<T>);
    l.assign(rows, T(0));
    acc.assign(rows * hd, T(0));
    // Causal: keys past the tile's last query are never visible; with a
    // window, nor keys before its first query's window.
    const int64_t key_end = i0 + rows + past;
    for (int64_t j0 = FirstVisibleKey(s, i0); j0 < key_end; j0 += kKeyTile) {
      const Tile t{i0, rows, j0, std::min(kKeyTile, key_end - j0)};
      TileScores(t, s, q, k, seg, S.data());
      for (int64_t r = 0; r < rows; ++r) {
        OnlineSoftmaxRow(&S[r * t.cols], t.cols, hd, m[r], l[r], &acc[r * hd]);
      }
      Gemm<T>(false, false, rows, hd, t.cols, T(1), S.data(), t.cols, v.Row(j0), v.ld, T(1), acc.data(), hd);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const bool any = l[r] > T(0);
      T* o = out.Row(i0 + r);
      for (int64_t d = 0; d < hd; ++d) o[d] = any ? acc[r * hd + d] / l[r] : T(0);
      lse[i0 + r] = any ? m[r] + std::log(l[r]) : kNegInf<T>;
    }
  }
}

template <typename T>
void NaiveForwardHead(const AttentionShape& s, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v,
                      const int32_t* seg, HeadView<T> out, T* lse) {
  const int64_t seq = s.seq, keys = s.keys(), hd = s.head_dim;
  const T scale = static_cast<T>(s.scale);
  std::vector<T> scores(seq * keys, kNegInf<T>);  // [query, key]; -inf = not visible
  for (int64_t i = 0; i < seq; ++i) {
    for (int64_t j = FirstVisibleKey(s, i); j <= i + s.past(); ++j) {
      if (seg != nullptr && seg[j] != seg[i]) continue;
      T dot = 0;
      for (int64_t d = 0; d < hd; ++d) dot += q.Row(i)[d] * k.Row(j)[d];
      scores[i * keys + j] = scale * dot;
      SoftCap(&scores[i * keys + j], 1, s.softcap);
    }
  }
  for (int64_t i = 0; i < seq; ++i) {
    T* row = &scores[i * keys];
    T* o = out.Row(i);
    const T mx = *std::max_element(row, row + keys);
    std::fill(o, o + hd, T(0));
    if (mx == kNegInf<T>) {
      lse[i] = kNegInf<T>;
      continue;
    }
    T sum = 0;
    for (int64_t j = 0; j < keys; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    for (int64_t j = 0; j < keys; ++j) {
      const T p = row[j] / sum;  // softmax, then P · V
      for (int64_t d = 0; d < hd; ++d) o[d] += p * v.Row(j)[d];
    }
    lse[i] = mx + std::log(sum);
  }
}

// Inputs and gradients of one query head and of the kv head it reads.
template <typename T>
struct BackwardHead {
  HeadView<const T> q, k, v, out, dout;
  const T* lse;
  const int32_t* seg;
  HeadView<T> dq, dk, dv;
};

// Turns the tile's scores S into P = exp(S - lse) and dP = dout Vᵀ into
// dS = scale * P ∘ (dP - D) (scale carried for dQ and dK), times the
// soft-cap's derivative 1 - (S / c)² when there is one.
template <typename T>
void TileProbabilitiesAndScoreGrad(const Tile& t, const AttentionShape& s, const T* lse, const T* delta, T* P,
                                   T* dS) {
  const T scale = static_cast<T>(s.scale), inv_cap = s.softcap > 0 ? static_cast<T>(1 / s.softcap) : T(0);
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t i = t.i0 + r;
    T* p = &P[r * t.cols];
    T* ds = &dS[r * t.cols];
    for (int64_t c = 0; c < t.cols; ++c) ds[c] -= delta[i];
    if (inv_cap != T(0)) {  // while P still holds the capped scores S
      for (int64_t c = 0; c < t.cols; ++c) {
        const T tanh = p[c] * inv_cap;  // -inf where masked (P = 0 there: dS is 0 whatever this gives)
        ds[c] = p[c] == kNegInf<T> ? T(0) : ds[c] * (T(1) - tanh * tanh);
      }
    }
    if (lse[i] == kNegInf<T>) {
      std::fill(p, p + t.cols, T(0));  // the row saw no key (its scores are all -inf)
    } else {
      internal::ExpShiftedInPlace(p, t.cols, lse[i]);
    }
    for (int64_t c = 0; c < t.cols; ++c) ds[c] = scale * p[c] * ds[c];
  }
}

// Gradients of one query head; dq is overwritten, dk and dv accumulate.
template <typename T>
void FlashBackwardHead(const AttentionShape& s, const BackwardHead<T>& h) {
  const int64_t hd = s.head_dim;
  std::vector<T> delta(s.seq);  // D_i = dout_i · out_i
  for (int64_t i = 0; i < s.seq; ++i) {
    T sum = 0;
    for (int64_t d = 0; d < hd; ++d) sum += h.dout.Row(i)[d] * h.out.Row(i)[d];
    delta[i] = sum;
    std::fill(h.dq.Row(i), h.dq.Row(i) + hd, T(0));
  }
  std::vector<T> P(kQueryTile * kKeyTile), dS(kQueryTile * kKeyTile);
  for (int64_t i0 = 0; i0 < s.seq; i0 += kQueryTile) {
    const int64_t rows = std::min(kQueryTile, s.seq - i0);
    for (int64_t j0 = FirstVisibleKey(s, i0); j0 < i0 + rows; j0 += kKeyTile) {
      const Tile t{i0, rows, j0, std::min(kKeyTile, i0 + rows - j0)};
      TileScores(t, s, h.q, h.k, h.seg, P.data());
      // dP = dout_tile V_tileᵀ, into dS's buffer.
      Gemm<T>(false, true, rows, t.cols, hd, T(1), h.dout.Row(i0), h.dout.ld, h.v.Row(j0), h.v.ld, T(0),
              dS.data(), t.cols);
      TileProbabilitiesAndScoreGrad(t, s, h.lse, delta.data(), P.data(), dS.data());
      // dQ_tile += dS K_tile;  dK_tile += dSᵀ Q_tile;  dV_tile += Pᵀ dout_tile.
      Gemm<T>(false, false, rows, hd, t.cols, T(1), dS.data(), t.cols, h.k.Row(j0), h.k.ld, T(1),
              h.dq.Row(i0), h.dq.ld);
      Gemm<T>(true, false, t.cols, hd, rows, T(1), dS.data(), t.cols, h.q.Row(i0), h.q.ld, T(1), h.dk.Row(j0),
              h.dk.ld);
      Gemm<T>(true, false, t.cols, hd, rows, T(1), P.data(), t.cols, h.dout.Row(i0), h.dout.ld, T(1),
              h.dv.Row(j0), h.dv.ld);
    }
  }
}

const int32_t* BatchSegments(const int32_t* segments, const AttentionShape& s, int64_t b) {
  return segments == nullptr ? nullptr : segments + b * s.seq;
}

// One (batch, head) of a stored tensor as float rows: the tensor itself when
// it is stored as T, else widened into `buf` (rows x head_dim, packed).
template <typename T, typename S>
HeadView<const T> HeadAsT(const S* x, const AttentionShape& s, int64_t rows, int64_t heads, int64_t b,
                          int64_t h, std::vector<T>& buf) {
  const HeadView<const S> view = Head(x, s, rows, heads, b, h);
  if constexpr (std::is_same_v<S, T>) {
    return view;
  } else {
    buf.resize(static_cast<size_t>(rows * s.head_dim));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t d = 0; d < s.head_dim; ++d) buf[i * s.head_dim + d] = Load(view.Row(i)[d]);
    }
    return {buf.data(), s.head_dim};
  }
}

}  // namespace

// Runs `head_fn` (the flash or the naive form) on every (batch, query head),
// in parallel: the outputs of different heads are disjoint. With 16-bit
// storage a head's q, k and v are widened first and its output computed in
// float, then stored.
template <typename T, typename S, typename HeadFn>
void ForwardEachHead(const AttentionShape& s, const S* q, const S* k, const S* v, const int32_t* segments,
                     S* out, T* lse, HeadFn head_fn) {
  CheckShape(s, segments);
  const int64_t group = s.q_heads / s.kv_heads, keys = s.keys(), hd = s.head_dim;
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < s.batch * s.q_heads; ++bh) {
    const int64_t b = bh / s.q_heads, h = bh % s.q_heads, kvh = h / group;
    std::vector<T> qb, kb, vb;
    const HeadView<const T> qv = HeadAsT(q, s, s.seq, s.q_heads, b, h, qb),
                            kv = HeadAsT(k, s, keys, s.kv_heads, b, kvh, kb),
                            vv = HeadAsT(v, s, keys, s.kv_heads, b, kvh, vb);
    const HeadView<S> ov = Head(out, s, s.seq, s.q_heads, b, h);
    if constexpr (std::is_same_v<S, T>) {
      head_fn(s, qv, kv, vv, BatchSegments(segments, s, b), ov, lse + bh * s.seq);
    } else {
      std::vector<T> ob(static_cast<size_t>(s.seq * hd));
      head_fn(s, qv, kv, vv, BatchSegments(segments, s, b), HeadView<T>{ob.data(), hd}, lse + bh * s.seq);
      for (int64_t i = 0; i < s.seq; ++i) {
        for (int64_t d = 0; d < hd; ++d) Store(ob[i * hd + d], ov.Row(i) + d);
      }
    }
  }
}

template <typename T, typename S>
void AttentionForward(const AttentionShape& s, const S* q, const S* k, const S* v, const int32_t* segments,
                      S* out, T* lse) {
  ForwardEachHead(s, q, k, v, segments, out, lse, [](auto&&... args) { FlashForwardHead<T>(args...); });
}

template <typename T, typename S>
void AttentionForwardNaive(const AttentionShape& s, const S* q, const S* k, const S* v,
                           const int32_t* segments, S* out, T* lse) {
  ForwardEachHead(s, q, k, v, segments, out, lse, [](auto&&... args) { NaiveForwardHead<T>(args...); });
}

template <typename T, typename S>
void AttentionBackward(const AttentionShape& s, const S* q, const S* k, const S* v, const int32_t* segments,
                       const S* out, const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  CheckShape(s, segments);
  FT_CHECK(s.past() == 0);  // no backward with a KV cache
  const int64_t group = s.q_heads / s.kv_heads;
#pragma omp parallel for schedule(dynamic)
  for (int64_t bk = 0; bk < s.batch * s.kv_heads; ++bk) {
    const int64_t b = bk / s.kv_heads, kvh = bk % s.kv_heads;
    std::vector<T> kb, vb, qb, ob;
    BackwardHead<T> h{.k = HeadAsT(k, s, s.seq, s.kv_heads, b, kvh, kb),
                      .v = HeadAsT(v, s, s.seq, s.kv_heads, b, kvh, vb),
                      .seg = BatchSegments(segments, s, b),
                      .dk = Head(dk, s, s.seq, s.kv_heads, b, kvh),
                      .dv = Head(dv, s, s.seq, s.kv_heads, b, kvh)};
    for (int64_t j = 0; j < s.seq; ++j) {
      std::fill(h.dk.Row(j), h.dk.Row(j) + s.head_dim, T(0));
      std::fill(h.dv.Row(j), h.dv.Row(j) + s.head_dim, T(0));
    }
    // The kv head's query heads in increasing order: dK and dV sum over them deterministically.
    for (int64_t qh = kvh * group; qh < (kvh + 1) * group; ++qh) {
      h.q = HeadAsT(q, s, s.seq, s.q_heads, b, qh, qb);
      h.out = HeadAsT(out, s, s.seq, s.q_heads, b, qh, ob);
      h.dout = Head(dout, s, s.seq, s.q_heads, b, qh);
      h.dq = Head(dq, s, s.seq, s.q_heads, b, qh);
      h.lse = lse + (b * s.q_heads + qh) * s.seq;
      FlashBackwardHead(s, h);
    }
  }
}

#define FT_INSTANTIATE_ATTENTION(T, S)                                                                       \
  template void AttentionForward<T, S>(const AttentionShape&, const S*, const S*, const S*, const int32_t*,  \
                                       S*, T*);                                                              \
  template void AttentionForwardNaive<T, S>(const AttentionShape&, const S*, const S*, const S*,             \
                                            const int32_t*, S*, T*);                                         \
  template void AttentionBackward<T, S>(const AttentionShape&, const S*, const S*, const S*, const int32_t*, \
                                        const S*, const T*, const T*, T*, T*, T*);
FT_INSTANTIATE_ATTENTION(float, float)
FT_INSTANTIATE_ATTENTION(double, double)
FT_INSTANTIATE_ATTENTION(float, Bf16)
FT_INSTANTIATE_ATTENTION(float, Half)
#undef FT_INSTANTIATE_ATTENTION

}  // namespace ft::cpu
