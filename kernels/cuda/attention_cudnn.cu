// cuDNN's SDPA route (attention_cudnn.h): the documents kernel, the dtype
// conversions of the backward, and the forward and backward graphs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_check.h"

#ifdef FT_HAVE_CUDNN
#include "kernels/cuda/cudnn_graph.h"
#endif

namespace ft::cuda {

using internal::CudaStatus;

#ifdef FT_HAVE_CUDNN

namespace {

constexpr int kDocThreads = 1024;

// One block: the documents of rows*seq tokens (a run of equal segment ids
// within a row, or the whole row when segments is null) as cuDNN's ragged
// entries. starts[N+1] is scratch; seq_len[d], and offsets in elements
// q_off / kv_off (token * width) and st_off (into lse [batch, hq, seq]) for
// d in [0, N], entries past the count being empty at the end; info = {count, longest}.
__global__ void DocumentsKernel(const int32_t* seg, int64_t rows, int64_t seq, int64_t q_width,
                                int64_t kv_width, int64_t hq, int32_t* starts, int32_t* seq_len,
                                int32_t* q_off, int32_t* kv_off, int32_t* st_off, int32_t* info) {
  __shared__ int32_t scan[kDocThreads];
  __shared__ int32_t longest;
  const int64_t n = rows * seq;
  const int64_t chunk = (n + kDocThreads - 1) / kDocThreads;
  const int64_t t0 = threadIdx.x * chunk, t1 = min(n, t0 + chunk);
  auto is_start = [&](int64_t t) { return t % seq == 0 || (seg != nullptr && seg[t] != seg[t - 1]); };
  int32_t mine = 0;
  for (int64_t t = t0; t < t1; ++t) mine += is_start(t) ? 1 : 0;
  scan[threadIdx.x] = mine;
  if (threadIdx.x == 0) longest = 0;
  __syncthreads();
  for (int step = 1; step < kDocThreads; step *= 2) {  // inclusive Hillis-Steele scan
    const int32_t add = threadIdx.x >= step ? scan[threadIdx.x - step] : 0;
    __syncthreads();
    scan[threadIdx.x] += add;
    __syncthreads();
  }
  const int32_t count = scan[kDocThreads - 1];
  int32_t d = scan[threadIdx.x] - mine;
  for (int64_t t = t0; t < t1; ++t) {
    if (is_start(t)) starts[d++] = static_cast<int32_t>(t);
  }
  if (threadIdx.x == 0) starts[count] = static_cast<int32_t>(n);
  __syncthreads();
  for (int64_t e = threadIdx.x; e <= n; e += kDocThreads) {
    const int64_t st = e < count ? starts[e] : n;
    const int32_t len = e < count ? starts[e + 1] - starts[e] : 0;
    seq_len[e] = len;
    q_off[e] = static_cast<int32_t>(st * q_width);
    kv_off[e] = static_cast<int32_t>(st * kv_width);
    st_off[e] = static_cast<int32_t>(st / seq * hq * seq + st % seq);
    atomicMax(&longest, len);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    info[0] = count;
    info[1] = longest;
  }
}

// The shapes the graphs express; attention_route.h refuses the rest before a
// call gets here, with the same words, and this guards a direct caller.
Status Expressible(const AttentionShape& s) {
  if (s.softcap > 0) return Status::Unimplemented("the cuDNN route takes no soft-capped scores");
  if (s.window > 0) return Status::Unimplemented("the cuDNN route does not express sliding windows");
  if (s.past() != 0)
    return Status::Unimplemented("the cuDNN route runs training attention only: no KV cache");
  return Status::OK();
}

int64_t NextPow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

// A device allocation that grows to the largest size asked for.
struct Scratch {
  void* ptr = nullptr;
  int64_t bytes = 0;
  Status Reserve(int64_t want, const char* what) {
    if (want <= bytes) return Status::OK();
    if (ptr != nullptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
    FT_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr, static_cast<size_t>(want)), what));
    bytes = want;
    return Status::OK();
  }
  template <typename T>
  T* as(int64_t offset_bytes = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr) + offset_bytes);
  }
  ~Scratch() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

using cudnn::Graph;
using cudnn::Tensor;
using cudnn::TensorSpec;

template <typename T>
constexpr cudnnDataType_t DataType() {
  return std::is_same_v<T, bf16> ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

// The uids of one graph's user tensors, in the variant pack's order.
enum Slot {
  kQ,
  kK,
  kV,
  kO,
  kStats,
  kSeqLen,
  kQOff,
  kKvOff,
  kStOff,
  kScale,
  kNegInf,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kOne,
  kSlots
};

// The shapes of one call in cuDNN's terms.
struct Dims {
  int64_t b, hq, hk, s, d, seq;  // seq: the row length (lse's head stride)
  double scale;
  cudnnDataType_t io;
};

// The tensors both graphs share: q, k, v, out (ragged [b, h, s, d] views of
// [tokens, h*d]), lse, the lengths, offsets and scalars.
struct Common {
  Tensor q, k_t, v, o, stats, seq_len, q_off, kv_off, st_off, scale, neg_inf;
};

TensorSpec Ragged(const Dims& x, int64_t heads, const Tensor* off, bool transposed) {
  const int64_t width = heads * x.d;
  if (transposed) return {{x.b, heads, x.d, x.s}, {x.s * width, x.d, 1, width}, x.io, false, false, off};
  return {{x.b, heads, x.s, x.d}, {x.s * width, x.d, width, 1}, x.io, false, false, off};
}

Common AddCommon(Graph& g, const Dims& x, std::vector<int64_t>* uids) {
  Common c;
  const std::vector<int64_t> one = {1, 1, 1, 1};
  const std::vector<int64_t> offs = {x.b + 1, 1, 1, 1};
  c.q_off = g.Add({offs, one, CUDNN_DATA_INT32});
  c.kv_off = g.Add({offs, one, CUDNN_DATA_INT32});
  c.st_off = g.Add({offs, one, CUDNN_DATA_INT32});
  c.seq_len = g.Add({{x.b, 1, 1, 1}, one, CUDNN_DATA_INT32});
  c.q = g.Add(Ragged(x, x.hq, &c.q_off, false));
  c.k_t = g.Add(Ragged(x, x.hk, &c.kv_off, true));
  c.v = g.Add(Ragged(x, x.hk, &c.kv_off, false));
  c.o = g.Add(Ragged(x, x.hq, &c.q_off, false));
  c.stats =
      g.Add({{x.b, x.hq, x.s, 1}, {x.hq * x.seq, x.seq, 1, 1}, CUDNN_DATA_FLOAT, false, false, &c.st_off});
  c.scale = g.Add({one, one, CUDNN_DATA_FLOAT, false, true});
  c.neg_inf = g.Add({one, one, CUDNN_DATA_FLOAT, false, true});
  uids->assign(kSlots, 0);
  (*uids)[kQ] = c.q.uid;
  (*uids)[kK] = c.k_t.uid;
  (*uids)[kV] = c.v.uid;
  (*uids)[kO] = c.o.uid;
  (*uids)[kStats] = c.stats.uid;
  (*uids)[kSeqLen] = c.seq_len.uid;
  (*uids)[kQOff] = c.q_off.uid;
  (*uids)[kKvOff] = c.kv_off.uid;
  (*uids)[kStOff] = c.st_off.uid;
  (*uids)[kScale] = c.scale.uid;
  (*uids)[kNegInf] = c.neg_inf.uid;
  return c;
}

// scores [b, hq, s, s] -> scores with -inf where row >= length, column >= length or column > row.
Tensor Masks(Graph& g, const Dims& x, const Common& c, Tensor scores, bool padding, bool causal) {
  const std::vector<int64_t> ss = {x.b, x.hq, x.s, x.s};
  auto index = [&](int64_t axis) {
    Tensor i = g.Virtual(ss, CUDNN_DATA_INT32);
    g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, i, axis);
    return i;
  };
  auto compare = [&](cudnnPointwiseMode_t mode, Tensor a, Tensor b) {
    Tensor m = g.Virtual(ss, CUDNN_DATA_BOOLEAN);
    g.Pointwise(mode, a, &b, nullptr, m);
    return m;
  };
  auto select = [&](Tensor in, Tensor keep) {  // keep ? in : -inf
    Tensor out = g.Virtual(ss);
    g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, in, &c.neg_inf, &keep, out);
    return out;
  };
  if (padding) {
    const Tensor rows = compare(CUDNN_POINTWISE_CMP_LT, index(2), c.seq_len);
    const Tensor cols = compare(CUDNN_POINTWISE_CMP_LT, index(3), c.seq_len);
    scores = select(scores, compare(CUDNN_POINTWISE_LOGICAL_AND, rows, cols));
  }
  if (causal) scores = select(scores, compare(CUDNN_POINTWISE_CMP_GE, index(2), index(3)));
  return scores;
}

Tensor Binary(Graph& g, cudnnPointwiseMode_t mode, Tensor a, Tensor b, std::vector<int64_t> dims,
              cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  Tensor y = g.Virtual(std::move(dims), type);
  g.Pointwise(mode, a, &b, nullptr, y);
  return y;
}

// scale * q k^T over [b, hq, s, s] (fp32), before any mask: both graphs' scores.
Tensor ScaledScores(Graph& g, const Dims& x, const Common& c) {
  const std::vector<int64_t> ss = {x.b, x.hq, x.s, x.s};
  Tensor s = g.Virtual(ss);
  g.Matmul(c.q, c.k_t, s, &c.seq_len, &c.seq_len, nullptr);
  return Binary(g, CUDNN_POINTWISE_MUL, s, c.scale, ss);
}

// S = scale * q k^T (masked); stats = max + log sum exp(S); out = softmax(S) v.
std::unique_ptr<Graph> ForwardGraph(const cudnn::Api* api, const Dims& x, std::vector<int64_t>* uids) {
  auto graph = std::make_unique<Graph>(api);
  Graph& g = *graph;
  const Common c = AddCommon(g, x, uids);
  const std::vector<int64_t> ss = {x.b, x.hq, x.s, x.s}, row = {x.b, x.hq, x.s, 1};
  Tensor s = Masks(g, x, c, ScaledScores(g, x, c), true, true);
  Tensor max = g.Virtual(row);
  g.Reduction(CUDNN_REDUCE_TENSOR_MAX, s, max);
  Tensor e = Binary(g, CUDNN_POINTWISE_SUB, s, max, ss);
  Tensor exp = g.Virtual(ss);
  g.Pointwise(CUDNN_POINTWISE_EXP, e, nullptr, nullptr, exp);
  Tensor sum = g.Virtual(row);
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, exp, sum);
  Tensor log = g.Virtual(row);
  g.Pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log);
  g.Pointwise(CUDNN_POINTWISE_ADD, max, &log, nullptr, c.stats);
  Tensor p = Binary(g, CUDNN_POINTWISE_DIV, exp, sum, ss, x.io);
  g.Matmul(p, c.v, c.o, &c.seq_len, nullptr, &c.seq_len);
  return graph;
}

// d = (heads == hq) ? a b : sum over each kv head's query heads of a b (grouped-query heads).
void GroupedMatmul(Graph& g, const Dims& x, int64_t heads, Tensor a, Tensor b, Tensor d, const Common& c) {
  if (heads == x.hq) {
    g.Matmul(a, b, d, &c.seq_len, nullptr, &c.seq_len);
    return;
  }
  Tensor full = g.Virtual({x.b, x.hq, x.s, x.d}, x.io);
  g.Matmul(a, b, full, &c.seq_len, nullptr, &c.seq_len);
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, full, d);
}

Tensor Transposed(Graph& g, const Dims& x, Tensor in) {  // [b, hq, s, s] viewed as its transpose, in io
  Tensor t = g.Add({{x.b, x.hq, x.s, x.s}, {x.hq * x.s * x.s, x.s * x.s, 1, x.s}, x.io, true});
  g.Reshape(in, t);
  return t;
}

// The deterministic backward: D = rowsum(dO * O); P = exp(S - stats);
// dV = P^T dO; dS = P * (dO V^T - D) * scale; dK = dS^T Q; dQ = dS K.
std::unique_ptr<Graph> BackwardGraph(const cudnn::Api* api, const Dims& x, std::vector<int64_t>* uids) {
  auto graph = std::make_unique<Graph>(api);
  Graph& g = *graph;
  const Common c = AddCommon(g, x, uids);
  const std::vector<int64_t> ss = {x.b, x.hq, x.s, x.s}, row = {x.b, x.hq, x.s, 1};
  const Tensor d_o = g.Add(Ragged(x, x.hq, &c.q_off, false));
  const Tensor d_q = g.Add(Ragged(x, x.hq, &c.q_off, false));
  const Tensor d_k = g.Add(Ragged(x, x.hk, &c.kv_off, false));
  const Tensor d_v = g.Add(Ragged(x, x.hk, &c.kv_off, false));
  const Tensor v_t = g.Add(Ragged(x, x.hk, &c.kv_off, true));
  const Tensor softmax_sum = g.Add({row, {x.hq * x.s, x.s, 1, 1}, CUDNN_DATA_FLOAT});
  const Tensor one = g.Add({{1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true});
  (*uids)[kDO] = d_o.uid;
  (*uids)[kDQ] = d_q.uid;
  (*uids)[kDK] = d_k.uid;
  (*uids)[kDV] = d_v.uid;
  (*uids)[kV] = v_t.uid;  // the backward reads v only transposed
  (*uids)[kSoftmaxSum] = softmax_sum.uid;
  (*uids)[kOne] = one.uid;
  Tensor dot = g.Virtual({x.b, x.hq, x.s, x.d});
  g.Pointwise(CUDNN_POINTWISE_MUL, d_o, &c.o, nullptr, dot);
  Tensor dsum = g.Virtual(row);
  g.Reduction(CUDNN_REDUCE_TENSOR_ADD, dot, dsum);
  g.Pointwise(CUDNN_POINTWISE_MUL, dsum, &one, nullptr, softmax_sum);
  Tensor s = Masks(g, x, c, ScaledScores(g, x, c), true, false);
  s = Binary(g, CUDNN_POINTWISE_SUB, s, c.stats, ss);
  s = Masks(g, x, c, s, false, true);
  Tensor p = g.Virtual(ss);
  g.Pointwise(CUDNN_POINTWISE_EXP, s, nullptr, nullptr, p);
  GroupedMatmul(g, x, x.hk, Transposed(g, x, p), d_o, d_v, c);
  Tensor dp = g.Virtual(ss);
  g.Matmul(d_o, v_t, dp, &c.seq_len, &c.seq_len, nullptr);
  Tensor ds = Binary(g, CUDNN_POINTWISE_SUB, dp, softmax_sum, ss);
  ds = Binary(g, CUDNN_POINTWISE_MUL, ds, p, ss);
  ds = Binary(g, CUDNN_POINTWISE_MUL, ds, c.scale, ss);
  GroupedMatmul(g, x, x.hk, Transposed(g, x, ds), c.q, d_k, c);
  Tensor k =
      g.Add({{x.b, x.hk, x.s, x.d}, {x.s * x.hk * x.d, x.d, x.hk * x.d, 1}, x.io, true, false, &c.kv_off});
  g.Reshape(c.k_t, k);
  g.Matmul(ds, k, d_q, &c.seq_len, nullptr, &c.seq_len);  // straight into dQ: no atomic fp32 accumulator
  return graph;
}

}  // namespace

struct CudnnAttention::Impl {
  const cudnn::Api* api = nullptr;
  cudnnHandle_t handle = nullptr;
  struct Entry {
    std::unique_ptr<cudnn::Plan> plan;
    std::vector<int64_t> uids;
  };
  std::map<std::string, Entry> plans;
  Scratch docs, workspace, grads, softmax_sum;
  int32_t* info_host = nullptr;  // pinned {count, longest}
  CudnnDocuments last;
  int64_t last_tokens = 0;
  float scale = 0, neg_inf = -INFINITY, one = 1;
  ~Impl() {
    if (handle != nullptr) api->Destroy(handle);
    if (info_host != nullptr) cudaFreeHost(info_host);
  }
  // The documents arrays: [N+1] each of starts, seq_len, q_off, kv_off, st_off, then info[2].
  int32_t* Array(int i) const { return docs.as<int32_t>() + i * (last_tokens + 1); }
};

int64_t CudnnAttention::LoadedVersion(std::string* why) {
  const cudnn::Api* api = cudnn::Library(why);
  return api == nullptr ? 0 : static_cast<int64_t>(api->GetVersion());
}

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create() {
  auto impl = std::make_unique<Impl>();
  std::string why;
  impl->api = cudnn::Library(&why);
  if (impl->api == nullptr) return Status::FailedPrecondition("cuDNN is not available: " + why);
  FT_RETURN_IF_ERROR(cudnn::Check(impl->api->Create(&impl->handle), "cudnnCreate"));
  FT_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&impl->info_host, 2 * sizeof(int32_t)), "cudaMallocHost"));
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
}

StatusOr<CudnnDocuments> CudnnAttention::Prepare(const AttentionShape& s, const int32_t* segments,
                                                 cudaStream_t stream) {
  FT_RETURN_IF_ERROR(Expressible(s));
  Impl& m = *impl_;
  const int64_t n = s.batch * s.seq;
  m.last_tokens = n;
  FT_RETURN_IF_ERROR(m.docs.Reserve((5 * (n + 1) + 2) * static_cast<int64_t>(sizeof(int32_t)),
                                    "cudaMalloc (cuDNN attention documents)"));
  int32_t* info = m.Array(5);
  DocumentsKernel<<<1, kDocThreads, 0, stream>>>(segments, s.batch, s.seq, s.q_heads * s.head_dim,
                                                 s.kv_heads * s.head_dim, s.q_heads, m.Array(0), m.Array(1),
                                                 m.Array(2), m.Array(3), m.Array(4), info);
  FT_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "attention_cudnn documents kernel"));
  CudnnDocuments d{s.batch, s.seq, s.batch, s.seq};
  if (segments != nullptr) {
    FT_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(m.info_host, info, 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync"));
    FT_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize (documents)"));
    d.count = m.info_host[0];
    d.max_len = m.info_host[1];
    d.batch = std::min(NextPow2(d.count), n);
    d.seq = std::min(NextPow2(std::max<int64_t>(d.max_len, 64)), s.seq);
  }
  m.last = d;
  return d;
}

namespace {

struct Call {
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  void Bind(const std::vector<int64_t>& all, Slot slot, const void* p) {
    uids.push_back(all[slot]);
    ptrs.push_back(const_cast<void*>(p));
  }
};

std::string PlanKey(bool backward, const Dims& x) {
  char key[160];
  std::snprintf(key, sizeof(key), "%s io%d b%lld hq%lld hk%lld s%lld d%lld seq%lld scale%.17g",
                backward ? "bwd" : "fwd", static_cast<int>(x.io), static_cast<long long>(x.b),
                static_cast<long long>(x.hq), static_cast<long long>(x.hk), static_cast<long long>(x.s),
                static_cast<long long>(x.d), static_cast<long long>(x.seq), x.scale);
  return key;
}

}  // namespace

// The cached plan for (direction, dims), built on first use; its workspace reserved.
static Status Planned(CudnnAttention::Impl& m, bool backward, const Dims& x, int64_t budget,
                      const CudnnAttention::Impl::Entry** entry_out) {
  const std::string key = PlanKey(backward, x);
  auto it = m.plans.find(key);
  if (it == m.plans.end()) {
    CudnnAttention::Impl::Entry e;
    auto graph = backward ? BackwardGraph(m.api, x, &e.uids) : ForwardGraph(m.api, x, &e.uids);
    FT_ASSIGN_OR_RETURN(e.plan, cudnn::Plan::Build(std::move(graph), m.handle, /*deterministic=*/true));
    if (e.plan->workspace_bytes() > budget) {
      return Status::ResourceExhausted("cuDNN's SDPA " + std::string(backward ? "backward" : "forward") +
                                       " plan needs " + std::to_string(e.plan->workspace_bytes() >> 20) +
                                       " MiB of workspace, over its " + std::to_string(budget >> 20) +
                                       " MiB budget (" + key + ")");
    }
    it = m.plans.emplace(key, std::move(e)).first;
  }
  FT_RETURN_IF_ERROR(m.workspace.Reserve(std::max<int64_t>(it->second.plan->workspace_bytes(), 1),
                                         "cudaMalloc (cuDNN workspace)"));
  *entry_out = &it->second;
  return Status::OK();
}

template <typename T>
Dims DimsOf(const AttentionShape& s, const CudnnDocuments& d) {
  return {d.batch, s.q_heads, s.kv_heads, d.seq, s.head_dim, s.seq, s.scale, DataType<T>()};
}

// Binds the tensors both directions read.
void BindCommon(CudnnAttention::Impl& m, const std::vector<int64_t>& uids, Call* call, const void* q,
                const void* k, const void* v, const void* out, const float* lse) {
  call->Bind(uids, kQ, q);
  call->Bind(uids, kK, k);
  call->Bind(uids, kV, v);
  call->Bind(uids, kO, out);
  call->Bind(uids, kStats, lse);
  call->Bind(uids, kSeqLen, m.Array(1));
  call->Bind(uids, kQOff, m.Array(2));
  call->Bind(uids, kKvOff, m.Array(3));
  call->Bind(uids, kStOff, m.Array(4));
  call->Bind(uids, kScale, &m.scale);
  call->Bind(uids, kNegInf, &m.neg_inf);
}

template <typename T>
Status CudnnAttention::Forward(const AttentionShape& s, const T* q, const T* k, const T* v, T* out,
                               float* lse, cudaStream_t stream) {
  Impl& m = *impl_;
  const Dims x = DimsOf<T>(s, m.last);
  const Impl::Entry* found = nullptr;
  FT_RETURN_IF_ERROR(Planned(m, false, x, workspace_budget_bytes, &found));
  const Impl::Entry& e = *found;
  m.scale = static_cast<float>(s.scale);
  Call call;
  BindCommon(m, e.uids, &call, q, k, v, out, lse);
  FT_RETURN_IF_ERROR(cudnn::Check(m.api->SetStream(m.handle, stream), "cudnnSetStream"));
  return e.plan->Execute(m.handle, call.uids, call.ptrs, m.workspace.ptr);
}

template <typename T>
Status CudnnAttention::Backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* out,
                                const float* lse, const float* dout, float* dq, float* dk, float* dv,
                                cudaStream_t stream) {
  Impl& m = *impl_;
  const Dims x = DimsOf<T>(s, m.last);
  const Impl::Entry* found = nullptr;
  FT_RETURN_IF_ERROR(Planned(m, true, x, workspace_budget_bytes, &found));
  const Impl::Entry& e = *found;
  const int64_t nq = s.batch * s.seq * s.q_heads * s.head_dim, nk = s.batch * s.seq * s.kv_heads * s.head_dim;
  const int64_t bytes = static_cast<int64_t>(sizeof(T));
  FT_RETURN_IF_ERROR(m.grads.Reserve((2 * nq + 2 * nk) * bytes, "cudaMalloc (cuDNN attention gradients)"));
  FT_RETURN_IF_ERROR(m.softmax_sum.Reserve(x.b * x.hq * x.s * 4, "cudaMalloc (cuDNN softmax sum)"));
  T* dout16 = m.grads.as<T>();
  T* dq16 = dout16 + nq;
  T* dk16 = dq16 + nq;
  T* dv16 = dk16 + nk;
  FT_RETURN_IF_ERROR(Convert(dout, nq, dout16, stream));
  m.scale = static_cast<float>(s.scale);
  Call call;
  BindCommon(m, e.uids, &call, q, k, v, out, lse);
  call.Bind(e.uids, kDO, dout16);
  call.Bind(e.uids, kDQ, dq16);
  call.Bind(e.uids, kDK, dk16);
  call.Bind(e.uids, kDV, dv16);
  call.Bind(e.uids, kSoftmaxSum, m.softmax_sum.ptr);
  call.Bind(e.uids, kOne, &m.one);
  FT_RETURN_IF_ERROR(cudnn::Check(m.api->SetStream(m.handle, stream), "cudnnSetStream"));
  FT_RETURN_IF_ERROR(e.plan->Execute(m.handle, call.uids, call.ptrs, m.workspace.ptr));
  FT_RETURN_IF_ERROR(Convert(dq16, nq, dq, stream));
  FT_RETURN_IF_ERROR(Convert(dk16, nk, dk, stream));
  return Convert(dv16, nk, dv, stream);
}

#else  // no cudnn_graph.h at build time: the route reports itself unavailable.

struct CudnnAttention::Impl {};

int64_t CudnnAttention::LoadedVersion(std::string* why) {
  if (why != nullptr)
    *why = "this build has no cuDNN headers (cudnn_graph.h; set FT_CUDNN_ROOT when configuring)";
  return 0;
}

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create() {
  std::string why;
  LoadedVersion(&why);
  return Status::FailedPrecondition("cuDNN is not available: " + why);
}

StatusOr<CudnnDocuments> CudnnAttention::Prepare(const AttentionShape&, const int32_t*, cudaStream_t) {
  return Create().status();
}
template <typename T>
Status CudnnAttention::Forward(const AttentionShape&, const T*, const T*, const T*, T*, float*,
                               cudaStream_t) {
  return Create().status();
}
template <typename T>
Status CudnnAttention::Backward(const AttentionShape&, const T*, const T*, const T*, const T*, const float*,
                                const float*, float*, float*, float*, cudaStream_t) {
  return Create().status();
}

#endif

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

template Status CudnnAttention::Forward<bf16>(const AttentionShape&, const bf16*, const bf16*, const bf16*,
                                              bf16*, float*, cudaStream_t);
template Status CudnnAttention::Forward<fp16>(const AttentionShape&, const fp16*, const fp16*, const fp16*,
                                              fp16*, float*, cudaStream_t);
template Status CudnnAttention::Backward<bf16>(const AttentionShape&, const bf16*, const bf16*, const bf16*,
                                               const bf16*, const float*, const float*, float*, float*,
                                               float*, cudaStream_t);
template Status CudnnAttention::Backward<fp16>(const AttentionShape&, const fp16*, const fp16*, const fp16*,
                                               const fp16*, const float*, const float*, float*, float*,
                                               float*, cudaStream_t);

}  // namespace ft::cuda
