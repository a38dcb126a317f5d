#include "engine/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ft {

double LrMultiplier(LrSchedule schedule, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  switch (schedule) {
    case LrSchedule::kConstant: return 1.0;
    case LrSchedule::kLinear: return std::max(0.0, static_cast<double>(total - step) / span);
    case LrSchedule::kCosine:  // num_cycles = 0.5
      break;
  }
  const double progress = static_cast<double>(step - warmup) / span;
  return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * 2.0 * 0.5 * progress)));
}

AdamWOptimizer::AdamWOptimizer(std::vector<TrainableParam> params, OptimizerConfig config,
                               std::shared_ptr<Backend> backend, bool paged, OptimizerSharding shard)
    : params_(std::move(params)),
      config_(config),
      backend_(std::move(backend)),
      paged_(paged),
      shard_(std::move(shard)) {
  for (const TrainableParam& p : params_) total_ += p.numel;
  const int64_t world = std::max(1, shard_.world);
  range_ = (total_ + world - 1) / world;
  const int64_t first = shard_.rank * range_, last = std::min(total_, first + range_);
  int64_t at = 0, largest = 0;
  for (const TrainableParam& p : params_) {
    offset_.push_back(at);
    const int64_t lo = std::clamp(first - at, int64_t{0}, p.numel);
    const int64_t hi = std::clamp(last - at, lo, p.numel);
    lo_.push_back(lo);
    hi_.push_back(hi);
    at += p.numel;
    const int64_t count = hi - lo;
    largest = std::max(largest, count);
    if (count == 0) {
      m_.emplace_back();
      v_.emplace_back();
      continue;
    }
    const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
    m_.push_back(paged_ ? backend_->AllocHost(bytes, MemCategory::kOptimizer)
                        : backend_->Alloc(count, MemCategory::kOptimizer));
    v_.push_back(paged_ ? backend_->AllocHost(bytes, MemCategory::kOptimizer)
                        : backend_->Alloc(count, MemCategory::kOptimizer));
  }
  if (paged_) {
    for (DeviceBuffer& page : pages_) page = backend_->Alloc(2 * largest, MemCategory::kOptimizer);
  }
}

int64_t AdamWOptimizer::moment_floats() const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i) n += hi_[i] - lo_[i];
  return n;
}

std::vector<float> AdamWOptimizer::Moment(size_t i, int which) const {
  if (sharded()) {
    FT_CHECK(gathered_valid_);  // GatherMoments first
    const float* from = gathered_[which].data() + offset_[i];
    return std::vector<float>(from, from + params_[i].numel);
  }
  const DeviceBuffer& b = which == 0 ? m_[i] : v_[i];
  std::vector<float> out(static_cast<size_t>(params_[i].numel));
  if (paged_) {
    FT_CHECK(backend_->Synchronize().ok());  // the last page-out has landed
    std::memcpy(out.data(), b.data(), out.size() * sizeof(float));
  } else {
    backend_->CopyToHost(out.data(), b.data(), b.bytes());
  }
  return out;
}

void AdamWOptimizer::SetMoment(size_t i, int which, const float* values) {
  DeviceBuffer& b = which == 0 ? m_[i] : v_[i];
  gathered_valid_ = false;
  if (b.empty()) return;  // no piece of this parameter here
  values += lo_[i];
  if (paged_) {
    FT_CHECK(backend_->Synchronize().ok());  // no page-out is still writing it
    std::memcpy(b.data(), values, static_cast<size_t>(b.bytes()));
    return;
  }
  backend_->CopyToDevice(b.data(), values, b.bytes());
  FT_CHECK(backend_->Synchronize().ok());  // the caller may free `values` next
}

void AdamWOptimizer::PackRange(const std::vector<const float*>& pieces, bool host_memory, float* host) const {
  std::fill(host, host + range_, 0.0f);
  float* out = host;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t count = hi_[i] - lo_[i];
    if (count == 0) continue;
    if (host_memory) {
      std::memcpy(out, pieces[i], static_cast<size_t>(count) * sizeof(float));
    } else {
      backend_->CopyToHost(out, pieces[i], count * static_cast<int64_t>(sizeof(float)));
    }
    out += count;
  }
}

Status AdamWOptimizer::GatherMoments() {
  if (!sharded()) return Status::OK();
  if (paged_) FT_CHECK(backend_->Synchronize().ok());  // the last page-outs have landed
  std::vector<float> mine(static_cast<size_t>(range_));
  for (int which = 0; which < 2; ++which) {
    std::vector<const float*> pieces;
    for (size_t i = 0; i < params_.size(); ++i) pieces.push_back((which == 0 ? m_[i] : v_[i]).data());
    PackRange(pieces, paged_, mine.data());
    gathered_[which].assign(static_cast<size_t>(range_ * shard_.world), 0.0f);
    if (!shard_.all_gather(mine.data(), range_ * static_cast<int64_t>(sizeof(float)),
                           gathered_[which].data())) {
      return Status::Unavailable("gathering the optimizer's moments from every rank failed");
    }
  }
  gathered_valid_ = true;
  return Status::OK();
}

double AdamWOptimizer::GradNorm() const {
  std::vector<FloatRange> grads;
  for (const TrainableParam& p : params_) grads.push_back({p.grad, p.numel});
  return std::sqrt(backend_->SumSquares(grads));
}

Status AdamWOptimizer::ClipAndStep(double grad_norm, double lr, double grad_multiplier) {
  double coef = grad_multiplier;
  if (config_.max_grad_norm > 0) coef *= std::min(1.0, config_.max_grad_norm / (grad_norm + 1e-6));
  ++step_;
  gathered_valid_ = false;
  const int64_t f = static_cast<int64_t>(sizeof(float));
  std::vector<size_t> mine;  // the parameters with a piece here (all of them when not sharded)
  for (size_t i = 0; i < params_.size(); ++i)
    if (hi_[i] > lo_[i]) mine.push_back(i);
  // Paged: the k-th piece's moments into page k % 2 (its previous user's page-out is
  // ahead of it on the copy stream).
  auto page_in = [&](size_t k) {
    const size_t i = mine[k];
    const int64_t count = hi_[i] - lo_[i];
    float* page = pages_[k % 2].data();
    backend_->CopyToDeviceAsync(page, m_[i].data(), count * f);
    backend_->CopyToDeviceAsync(page + count, v_[i].data(), count * f);
  };
  if (paged_ && !mine.empty()) page_in(0);
  for (size_t k = 0; k < mine.size(); ++k) {
    const size_t i = mine[k];
    const TrainableParam& p = params_[i];
    const int64_t lo = lo_[i], count = hi_[i] - lo_[i];
    if (coef != 1.0) backend_->Scale(count, static_cast<float>(coef), p.grad + lo);
    cpu::AdamWParams hp{
        lr,       config_.beta1, config_.beta2, config_.eps, p.weight_decay ? config_.weight_decay : 0.0,
        updates()};
    const Act copy = p.copy.data != nullptr ? p.copy.At(lo) : Act();
    if (!paged_) {
      backend_->AdamW(hp, count, p.data + lo, p.grad + lo, m_[i].data(), v_[i].data(), copy);
      continue;
    }
    backend_->WaitForCopies();  // this piece's page is in; the other page's page-out is done
    if (k + 1 < mine.size()) page_in(k + 1);
    float* page = pages_[k % 2].data();
    backend_->AdamW(hp, count, p.data + lo, p.grad + lo, page, page + count, copy);
    backend_->CopyToHostAsync(m_[i].data(), page, count * f);
    backend_->CopyToHostAsync(v_[i].data(), page + count, count * f);
  }
  if (!sharded()) return Status::OK();
  // Every rank's updated range to every rank.
  std::vector<float> range(static_cast<size_t>(range_)), all(static_cast<size_t>(range_ * shard_.world));
  std::vector<const float*> pieces;
  for (size_t i = 0; i < params_.size(); ++i) pieces.push_back(params_[i].data + lo_[i]);
  PackRange(pieces, /*host_memory=*/false, range.data());
  if (!shard_.all_gather(range.data(), range_ * f, all.data())) {
    return Status::Unavailable("gathering the updated parameters from every rank failed");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const TrainableParam& p = params_[i];
    backend_->CopyToDevice(p.data, all.data() + offset_[i], p.numel * f);
    if (p.copy.data != nullptr) backend_->Convert(ConstAct(p.data), p.numel, p.copy);  // the others' ranges
  }
  return backend_->Synchronize();
}

}  // namespace ft
