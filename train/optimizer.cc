#include "train/optimizer.h"

#include <cmath>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/parallel_for.h"

namespace remat {

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> params, AdamWOptions opts) : opts_(opts) {
  CategoryScope cat(MemoryCategory::optimizer);
  for (auto& [name, p] : params) {
    REMAT_CHECK(p.dtype() == DType::f32 && p.device().is_cpu(), DTypeError, "AdamW: parameter '", name,
                "' must be an f32 CPU tensor (master weights), got ", p.dtype(), " on ", p.device());
    slots_.push_back(Slot{name, p, zeros(p.sizes()), zeros(p.sizes())});
  }
}

void AdamW::step(double lr) {
  NoGradGuard ng;
  ++step_;
  const double bc1 = 1.0 - std::pow(opts_.beta1, double(step_));
  const double bc2 = 1.0 - std::pow(opts_.beta2, double(step_));
  const float b1 = float(opts_.beta1), b2 = float(opts_.beta2);
  const float step_size = float(lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float eps = float(opts_.eps);
  for (Slot& s : slots_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    Tensor gc = g.to(DType::f32).contiguous();
    const float decay = s.param.dim() >= 2 ? float(1.0 - lr * opts_.weight_decay) : 1.0f;
    float* p = s.param.data<float>();
    float* m = s.exp_avg.data<float>();
    float* v = s.exp_avg_sq.data<float>();
    const float* gp = gc.data<float>();
    parallel_for(0, s.param.numel(), 1 << 14, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * gp[i];
        v[i] = b2 * v[i] + (1.0f - b2) * gp[i] * gp[i];
        const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
        p[i] = p[i] * decay - step_size * m[i] / denom;
      }
    });
    s.param.bump_version();
    s.exp_avg.bump_version();
    s.exp_avg_sq.bump_version();
  }
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Slot& s : slots_) {
    out.emplace_back("optimizer.exp_avg." + s.name, s.exp_avg);
    out.emplace_back("optimizer.exp_avg_sq." + s.name, s.exp_avg_sq);
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, Tensor>& tensors, std::int64_t step) {
  // Validate everything first: a bad file changes nothing.
  for (const Slot& s : slots_) {
    for (const std::string& key : {"optimizer.exp_avg." + s.name, "optimizer.exp_avg_sq." + s.name}) {
      auto it = tensors.find(key);
      REMAT_CHECK(it != tensors.end(), IOError, "optimizer state: missing tensor '", key, "'");
      REMAT_CHECK(it->second.sizes() == s.param.sizes() && it->second.dtype() == DType::f32, IOError,
                  "optimizer state: tensor '", key, "' is ", shape_str(it->second.sizes()), " ",
                  it->second.dtype(), ", expected ", shape_str(s.param.sizes()), " f32");
    }
  }
  NoGradGuard ng;
  for (Slot& s : slots_) {
    s.exp_avg.copy_(tensors.at("optimizer.exp_avg." + s.name));
    s.exp_avg_sq.copy_(tensors.at("optimizer.exp_avg_sq." + s.name));
  }
  step_ = step;
}

std::int64_t persistent_bytes(const std::vector<std::pair<std::string, Tensor>>& params, const AdamW& opt) {
  std::int64_t n = 0;
  for (const auto& [name, p] : params) n += 2 * std::int64_t(p.nbytes());  // weight + gradient
  for (const auto& [name, t] : opt.state()) n += std::int64_t(t.nbytes());
  return n;
}

double grad_sq_sum(const std::vector<Tensor>& params) {
  double total = 0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor gc = g.to(DType::f32).contiguous();
    const float* d = gc.data<float>();
    double s = 0;
    for (std::int64_t i = 0; i < gc.numel(); ++i) s += double(d[i]) * double(d[i]);
    total += s;
  }
  return total;
}

void clip_grads_to(const std::vector<Tensor>& params, double norm, double max_norm) {
  if (!(max_norm > 0 && norm > max_norm)) return;
  const float scale = float(max_norm / (norm + 1e-6));
  NoGradGuard ng;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    float* d = g.data<float>();
    for (std::int64_t i = 0; i < g.numel(); ++i) d[i] *= scale;
    g.bump_version();
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const double norm = std::sqrt(grad_sq_sum(params));
  clip_grads_to(params, norm, max_norm);
  return norm;
}

double cosine_lr(std::int64_t step, std::int64_t warmup, std::int64_t total, double max_lr, double min_lr) {
  if (warmup > 0 && step < warmup) return max_lr * double(step + 1) / double(warmup);
  if (step >= total) return min_lr;
  const double progress = double(step - warmup) / double(std::max<std::int64_t>(total - warmup, 1));
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace remat
