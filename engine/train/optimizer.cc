#include "engine/train/optimizer.h"

#include <algorithm>
#include <cmath>
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
                               std::shared_ptr<Backend> backend)
    : params_(std::move(params)), config_(config), backend_(std::move(backend)) {
  for (const TrainableParam& p : params_) {
    m_.push_back(backend_->Alloc(p.numel, MemCategory::kOptimizer));
    v_.push_back(backend_->Alloc(p.numel, MemCategory::kOptimizer));
  }
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
  for (size_t i = 0; i < params_.size(); ++i) {
    const TrainableParam& p = params_[i];
    cpu::AdamWParams hp{
        lr,       config_.beta1, config_.beta2, config_.eps, p.weight_decay ? config_.weight_decay : 0.0,
        updates()};
    backend_->AdamW(hp, p.numel, p.data, p.grad, m_[i].data(), v_[i].data());
  }
}

}  // namespace ft
