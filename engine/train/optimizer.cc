#include "engine/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "kernels/cpu/ops.h"

namespace ft {

double LrMultiplier(const std::string& schedule, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  if (schedule == "constant") return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  if (schedule == "linear") return std::max(0.0, static_cast<double>(total - step) / span);
  // cosine, num_cycles = 0.5
  const double progress = static_cast<double>(step - warmup) / span;
  return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * 2.0 * 0.5 * progress)));
}

AdamWOptimizer::AdamWOptimizer(std::vector<TrainableParam> params, OptimizerConfig config,
                               std::shared_ptr<Backend> backend, bool paged)
    : params_(std::move(params)), config_(config), backend_(std::move(backend)), paged_(paged) {
  int64_t largest = 0;
  for (const TrainableParam& p : params_) {
    const int64_t bytes = p.numel * static_cast<int64_t>(sizeof(float));
    largest = std::max(largest, p.numel);
    m_.push_back(paged_ ? backend_->AllocHost(bytes, MemCategory::kOptimizer)
                        : backend_->Alloc(p.numel, MemCategory::kOptimizer));
    v_.push_back(paged_ ? backend_->AllocHost(bytes, MemCategory::kOptimizer)
                        : backend_->Alloc(p.numel, MemCategory::kOptimizer));
  }
  if (paged_) {
    for (DeviceBuffer& page : pages_) page = backend_->Alloc(2 * largest, MemCategory::kOptimizer);
  }
}

std::vector<float> AdamWOptimizer::Moment(size_t i, int which) const {
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
  if (paged_) {
    FT_CHECK(backend_->Synchronize().ok());  // no page-out is still writing it
    std::memcpy(b.data(), values, static_cast<size_t>(b.bytes()));
    return;
  }
  backend_->CopyToDevice(b.data(), values, b.bytes());
  FT_CHECK(backend_->Synchronize().ok());  // the caller may free `values` next
}

double AdamWOptimizer::GradNorm() const {
  double sum = 0;
  for (const TrainableParam& p : params_) sum += backend_->SumSquares(p.grad, p.numel);
  return std::sqrt(sum);
}

void AdamWOptimizer::ClipAndStep(double grad_norm, double lr, double grad_multiplier) {
  double coef = grad_multiplier;
  if (config_.max_grad_norm > 0) coef *= std::min(1.0, config_.max_grad_norm / (grad_norm + 1e-6));
  if (coef != 1.0) {
    for (const TrainableParam& p : params_) backend_->Scale(p.numel, static_cast<float>(coef), p.grad);
  }
  ++step_;
  const int64_t f = static_cast<int64_t>(sizeof(float));
  // Paged: parameter i's moments into page i % 2 (its previous user's page-out is
  // ahead of it on the copy stream).
  auto page_in = [&](size_t i) {
    float* page = pages_[i % 2].data();
    backend_->CopyToDeviceAsync(page, m_[i].data(), params_[i].numel * f);
    backend_->CopyToDeviceAsync(page + params_[i].numel, v_[i].data(), params_[i].numel * f);
  };
  if (paged_ && !params_.empty()) page_in(0);
  for (size_t i = 0; i < params_.size(); ++i) {
    const TrainableParam& p = params_[i];
    cpu::AdamWParams hp{
        lr,       config_.beta1, config_.beta2, config_.eps, p.weight_decay ? config_.weight_decay : 0.0,
        updates()};
    if (!paged_) {
      backend_->AdamW(hp, p.numel, p.data, p.grad, m_[i].data(), v_[i].data());
      continue;
    }
    backend_->WaitForCopies();  // this parameter's page is in; the other page's page-out is done
    if (i + 1 < params_.size()) page_in(i + 1);
    float* page = pages_[i % 2].data();
    backend_->AdamW(hp, p.numel, p.data, p.grad, page, page + p.numel);
    backend_->CopyToHostAsync(m_[i].data(), page, p.numel * f);
    backend_->CopyToHostAsync(v_[i].data(), page + p.numel, p.numel * f);
  }
}

}  // namespace ft
