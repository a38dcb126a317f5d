// Causal (optionally segment-masked) GQA attention.
//
// AttentionForward is the FlashAttention form: for a tile of queries it walks
// tiles of keys keeping, per query, a running max m, a running sum l of
// exp(s - m) and an unnormalised output acc; when a tile raises the max, l and
// acc are rescaled by exp(m_old - m_new). Extra memory is O(seq * head_dim)
// per (batch, head): a transposed copy of the keys, never a [seq, seq] matrix.
// AttentionBackward is FlashAttention-2's: probabilities are recomputed from
// the saved lse, p_ij = exp(s_ij - lse_i), and with D_i = dout_i · out_i
//   ds_ij = p_ij (dout_i · v_j - D_i),  dq_i = scale Σ_j ds_ij k_j,
//   dk_j = scale Σ_i ds_ij q_i,         dv_j = Σ_i p_ij dout_i.
//
// Inner loops run over contiguous memory without cross-lane reductions: a
// score row q·k_j for a tile of keys is Σ_d q[d] * kt[d, j] with kt the keys
// transposed, so every element still sums d = 0, 1, ... in order.
// Parallelism: forward over (batch, query head); backward over (batch, kv
// head) with the kv head's query heads looped in order inside, so dk and dv
// accumulate in a fixed order. Nothing depends on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

constexpr int64_t kQueryTile = 16;
constexpr int64_t kKeyTile = 64;

void CheckShape(const AttentionShape& s) {
  FT_CHECK(s.batch >= 0 && s.seq >= 0 && s.head_dim > 0);
  FT_CHECK(s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0);
}

// The rows of one (batch element, head) inside a [batch * seq, heads * hd] tensor.
template <typename P>
struct HeadRows {
  P* base;
  int64_t stride;
  P* operator[](int64_t i) const { return base + i * stride; }
};
template <typename P>
HeadRows<P> Rows(P* x, const AttentionShape& s, int64_t heads, int64_t b, int64_t h) {
  return {x + (b * s.seq * heads + h) * s.head_dim, heads * s.head_dim};
}

// xt[d, j] = x_j[d]: one kv head of one batch element transposed to [hd, seq].
template <typename T>
void PackTransposed(HeadRows<const T> x, int64_t seq, int64_t hd, std::vector<T>& xt) {
  xt.resize(hd * seq);
  for (int64_t j = 0; j < seq; ++j) {
    for (int64_t d = 0; d < hd; ++d) xt[d * seq + j] = x[j][d];
  }
}

// out[j - j0] = x · y_j for j in [j0, j1), from yt = y transposed ([hd, seq]).
template <typename T>
void DotsTransposed(const T* x, const T* yt, int64_t seq, int64_t hd, int64_t j0, int64_t j1, T* out) {
  const int64_t n = j1 - j0;
  std::fill(out, out + n, T(0));
  for (int64_t d = 0; d < hd; ++d) {
    const T xd = x[d];
    const T* y = yt + d * seq + j0;
    for (int64_t j = 0; j < n; ++j) out[j] += xd * y[j];
  }
}

// Scores of query i against keys [j0, j1) (all j <= i): scale * q·k_j, or
// -inf (probability exactly 0) for a key in another segment.
template <typename T>
void ScoreRow(const T* q, const T* kt, int64_t seq, int64_t hd, T scale, const int32_t* seg, int64_t i,
              int64_t j0, int64_t j1, T* sc) {
  DotsTransposed(q, kt, seq, hd, j0, j1, sc);
  for (int64_t j = j0; j < j1; ++j) {
    const bool visible = seg == nullptr || seg[j] == seg[i];
    sc[j - j0] = visible ? scale * sc[j - j0] : -std::numeric_limits<T>::infinity();
  }
}

// Running softmax state of one tile of queries.
template <typename T>
struct OnlineSoftmax {
  std::vector<T> m, l, acc;  // [tile], [tile], [tile * hd]
  void Reset(int64_t tile, int64_t hd) {
    m.assign(tile, -std::numeric_limits<T>::infinity());
    l.assign(tile, T(0));
    acc.assign(tile * hd, T(0));
  }
};

// Folds the scores sc[0, n) of keys j0... into query r's state.
template <typename T>
void OnlineUpdate(const T* sc, int64_t n, HeadRows<const T> v, int64_t j0, int64_t hd, T& m, T& l, T* acc) {
  T tile_max = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) tile_max = std::max(tile_max, sc[j]);
  if (tile_max == -std::numeric_limits<T>::infinity()) return;  // no visible key here
  const T new_m = std::max(m, tile_max);
  if (new_m != m) {
    const T correction = std::exp(m - new_m);  // 0 on the first visible tile (m = -inf)
    l *= correction;
    for (int64_t d = 0; d < hd; ++d) acc[d] *= correction;
    m = new_m;
  }
  for (int64_t j = 0; j < n; ++j) {
    const T p = std::exp(sc[j] - m);
    if (p == T(0)) continue;  // masked (or underflowed) key
    l += p;
    const T* vj = v[j0 + j];
    for (int64_t d = 0; d < hd; ++d) acc[d] += p * vj[d];
  }
}

template <typename T>
void FlashForwardHead(const AttentionShape& s, HeadRows<const T> q, const T* kt, HeadRows<const T> v,
                      const int32_t* seg, HeadRows<T> out, T* lse) {
  const int64_t seq = s.seq, hd = s.head_dim;
  const T scale = static_cast<T>(s.scale);
  OnlineSoftmax<T> st;
  std::vector<T> sc(kKeyTile);
  for (int64_t i0 = 0; i0 < seq; i0 += kQueryTile) {
    const int64_t i1 = std::min(seq, i0 + kQueryTile);
    st.Reset(i1 - i0, hd);
    // Causal: keys beyond the tile's last query are never visible.
    for (int64_t j0 = 0; j0 < i1; j0 += kKeyTile) {
      for (int64_t i = std::max(i0, j0); i < i1; ++i) {
        const int64_t j1 = std::min({j0 + kKeyTile, i + 1, seq});
        const int64_t r = i - i0;
        ScoreRow(q[i], kt, seq, hd, scale, seg, i, j0, j1, sc.data());
        OnlineUpdate(sc.data(), j1 - j0, v, j0, hd, st.m[r], st.l[r], &st.acc[r * hd]);
      }
    }
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i - i0;
      const bool any = st.l[r] > T(0);
      for (int64_t d = 0; d < hd; ++d) out[i][d] = any ? st.acc[r * hd + d] / st.l[r] : T(0);
      lse[i] = any ? st.m[r] + std::log(st.l[r]) : -std::numeric_limits<T>::infinity();
    }
  }
}

template <typename T>
void NaiveForwardHead(const AttentionShape& s, HeadRows<const T> q, HeadRows<const T> k, HeadRows<const T> v,
                      const int32_t* seg, HeadRows<T> out, T* lse) {
  const int64_t seq = s.seq, hd = s.head_dim;
  const T scale = static_cast<T>(s.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores(seq * seq, neg_inf);  // [query, key]; -inf = not visible
  for (int64_t i = 0; i < seq; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      if (seg != nullptr && seg[j] != seg[i]) continue;
      T dot = 0;
      for (int64_t d = 0; d < hd; ++d) dot += q[i][d] * k[j][d];
      scores[i * seq + j] = scale * dot;
    }
  }
  for (int64_t i = 0; i < seq; ++i) {
    T* row = &scores[i * seq];
    const T mx = *std::max_element(row, row + seq);
    std::fill(out[i], out[i] + hd, T(0));
    if (mx == neg_inf) {
      lse[i] = neg_inf;
      continue;
    }
    T sum = 0;
    for (int64_t j = 0; j < seq; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    for (int64_t j = 0; j < seq; ++j) {
      const T p = row[j] / sum;  // softmax, then P · V
      for (int64_t d = 0; d < hd; ++d) out[i][d] += p * v[j][d];
    }
    lse[i] = mx + std::log(sum);
  }
}

// Gradients of one query head; dq is overwritten, dk and dv accumulate.
template <typename T>
void FlashBackwardHead(const AttentionShape& s, HeadRows<const T> q, HeadRows<const T> k, const T* kt,
                       const T* vt, const int32_t* seg, HeadRows<const T> out, const T* lse,
                       HeadRows<const T> dout, HeadRows<T> dq, HeadRows<T> dk, HeadRows<T> dv) {
  const int64_t seq = s.seq, hd = s.head_dim;
  const T scale = static_cast<T>(s.scale);
  std::vector<T> delta(seq);  // D_i = dout_i · out_i
  for (int64_t i = 0; i < seq; ++i) {
    T sum = 0;
    for (int64_t d = 0; d < hd; ++d) sum += dout[i][d] * out[i][d];
    delta[i] = sum;
    std::fill(dq[i], dq[i] + hd, T(0));
  }
  std::vector<T> p(kKeyTile), dp(kKeyTile);
  for (int64_t i0 = 0; i0 < seq; i0 += kQueryTile) {
    const int64_t i1 = std::min(seq, i0 + kQueryTile);
    for (int64_t j0 = 0; j0 < i1; j0 += kKeyTile) {
      for (int64_t i = std::max(i0, j0); i < i1; ++i) {
        if (lse[i] == -std::numeric_limits<T>::infinity()) continue;  // row saw no key
        const int64_t j1 = std::min({j0 + kKeyTile, i + 1, seq});
        const int64_t n = j1 - j0;
        ScoreRow(q[i], kt, seq, hd, scale, seg, i, j0, j1, p.data());
        for (int64_t j = 0; j < n; ++j) p[j] = std::exp(p[j] - lse[i]);  // -inf -> 0
        DotsTransposed(dout[i], vt, seq, hd, j0, j1, dp.data());
        for (int64_t j = 0; j < n; ++j) {
          if (p[j] == T(0)) continue;
          const T ds = scale * p[j] * (dp[j] - delta[i]);  // carries dq's and dk's scale
          const T* kj = k[j0 + j];
          T* dkj = dk[j0 + j];
          T* dvj = dv[j0 + j];
          for (int64_t d = 0; d < hd; ++d) {
            dq[i][d] += ds * kj[d];
            dkj[d] += ds * q[i][d];
            dvj[d] += p[j] * dout[i][d];
          }
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void AttentionForward(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
                      T* out, T* lse) {
  CheckShape(s);
  const int64_t group = s.q_heads / s.kv_heads;
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < s.batch * s.q_heads; ++bh) {
    const int64_t b = bh / s.q_heads, h = bh % s.q_heads, kvh = h / group;
    std::vector<T> kt;
    PackTransposed(Rows(k, s, s.kv_heads, b, kvh), s.seq, s.head_dim, kt);
    FlashForwardHead(s, Rows(q, s, s.q_heads, b, h), kt.data(), Rows(v, s, s.kv_heads, b, kvh),
                     segments == nullptr ? nullptr : segments + b * s.seq, Rows(out, s, s.q_heads, b, h),
                     lse + bh * s.seq);
  }
}

template <typename T>
void AttentionForwardNaive(const AttentionShape& s, const T* q, const T* k, const T* v,
                           const int32_t* segments, T* out, T* lse) {
  CheckShape(s);
  const int64_t group = s.q_heads / s.kv_heads;
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < s.batch * s.q_heads; ++bh) {
    const int64_t b = bh / s.q_heads, h = bh % s.q_heads, kvh = h / group;
    NaiveForwardHead(s, Rows(q, s, s.q_heads, b, h), Rows(k, s, s.kv_heads, b, kvh),
                     Rows(v, s, s.kv_heads, b, kvh), segments == nullptr ? nullptr : segments + b * s.seq,
                     Rows(out, s, s.q_heads, b, h), lse + bh * s.seq);
  }
}

template <typename T>
void AttentionBackward(const AttentionShape& s, const T* q, const T* k, const T* v, const int32_t* segments,
                       const T* out, const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  CheckShape(s);
  const int64_t group = s.q_heads / s.kv_heads, hd = s.head_dim;
#pragma omp parallel for schedule(dynamic)
  for (int64_t bk = 0; bk < s.batch * s.kv_heads; ++bk) {
    const int64_t b = bk / s.kv_heads, kvh = bk % s.kv_heads;
    const HeadRows<const T> kr = Rows(k, s, s.kv_heads, b, kvh), vr = Rows(v, s, s.kv_heads, b, kvh);
    const HeadRows<T> dkr = Rows(dk, s, s.kv_heads, b, kvh), dvr = Rows(dv, s, s.kv_heads, b, kvh);
    for (int64_t j = 0; j < s.seq; ++j) {
      std::fill(dkr[j], dkr[j] + hd, T(0));
      std::fill(dvr[j], dvr[j] + hd, T(0));
    }
    std::vector<T> kt, vt;
    PackTransposed(kr, s.seq, hd, kt);
    PackTransposed(vr, s.seq, hd, vt);
    // The kv head's query heads in increasing order: dk and dv sum over them deterministically.
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      FlashBackwardHead(s, Rows(q, s, s.q_heads, b, h), kr, kt.data(), vt.data(),
                        segments == nullptr ? nullptr : segments + b * s.seq, Rows(out, s, s.q_heads, b, h),
                        lse + (b * s.q_heads + h) * s.seq, Rows(dout, s, s.q_heads, b, h),
                        Rows(dq, s, s.q_heads, b, h), dkr, dvr);
    }
  }
}

#define FT_INSTANTIATE_ATTENTION(T)                                                                          \
  template void AttentionForward<T>(const AttentionShape&, const T*, const T*, const T*, const int32_t*, T*, \
                                    T*);                                                                     \
  template void AttentionForwardNaive<T>(const AttentionShape&, const T*, const T*, const T*,                \
                                         const int32_t*, T*, T*);                                            \
  template void AttentionBackward<T>(const AttentionShape&, const T*, const T*, const T*, const int32_t*,    \
                                     const T*, const T*, const T*, T*, T*, T*);
FT_INSTANTIATE_ATTENTION(float)
FT_INSTANTIATE_ATTENTION(double)
#undef FT_INSTANTIATE_ATTENTION

}  // namespace ft::cpu
