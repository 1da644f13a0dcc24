#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/parallel_for.h"
#include "ops/multi_tensor.h"

namespace remat {

namespace {

// The CUDA devices of `params`' gradients, each once, in order of first use.
std::vector<Device> cuda_devices(const std::vector<Tensor>& params) {
  std::vector<Device> out;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined() || !g.device().is_cuda()) continue;
    if (std::find(out.begin(), out.end(), g.device()) == out.end()) out.push_back(g.device());
  }
  return out;
}

// The sum of squares of the gradients on CUDA device `device` (one
// deterministic multi-tensor reduction).
double cuda_grad_sq_sum(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> grads;  // f32 contiguous
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined() || g.device() != device || g.numel() == 0) continue;
    grads.push_back(g.to(DType::f32).contiguous());
  }
  return multi_tensor_sum_squares(grads, device);
}

}  // namespace

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> params, AdamWOptions opts) : opts_(opts) {
  CategoryScope cat(MemoryCategory::optimizer);
  for (auto& [name, p] : params) {
    REMAT_CHECK(p.dtype() == DType::f32 && (p.device().is_cpu() || p.device().is_cuda()), DTypeError,
                "AdamW: parameter '", name, "' must be an f32 CPU or CUDA tensor (master weights), got ", p.dtype(),
                " on ", p.device());
    REMAT_CHECK(p.device().is_cpu() || p.is_contiguous(), DeviceError, "AdamW: CUDA parameter '", name,
                "' must be contiguous, got shape ", shape_str(p.sizes()), " with strides ", shape_str(p.strides()));
    // The state lives on the parameter's device.
    const TensorOptions state(DType::f32, p.device());
    slots_.push_back(Slot{name, p, zeros(p.sizes(), state), zeros(p.sizes(), state)});
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
  // Parameters on CUDA: one multi-tensor launch per device, after the CPU ones.
  std::vector<Device> devices;
  std::vector<std::vector<AdamWTensors>> device_slots;
  std::vector<Slot*> updated;
  for (Slot& s : slots_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    const float decay = s.param.dim() >= 2 ? float(1.0 - lr * opts_.weight_decay) : 1.0f;
    if (s.param.device().is_cuda()) {
      updated.push_back(&s);
      if (s.param.numel() == 0) continue;
      Tensor gc = g.to(DType::f32).to(s.param.device()).contiguous();
      REMAT_CHECK(gc.sizes() == s.param.sizes(), ShapeError, "AdamW: gradient of '", s.name, "' is ",
                  shape_str(gc.sizes()), ", expected ", shape_str(s.param.sizes()));
      const AdamWTensors d{s.param, gc, s.exp_avg, s.exp_avg_sq, decay};
      auto it = std::find(devices.begin(), devices.end(), s.param.device());
      if (it == devices.end()) {
        devices.push_back(s.param.device());
        device_slots.emplace_back();
        it = devices.end() - 1;
      }
      device_slots[std::size_t(it - devices.begin())].push_back(d);
      continue;
    }
    Tensor gc = g.to(DType::f32).contiguous();
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
  if (devices.empty()) return;
  AdamWStepScalars sc;
  sc.beta1 = b1;
  sc.beta2 = b2;
  sc.step_size = step_size;
  sc.inv_sqrt_bc2 = inv_sqrt_bc2;
  sc.eps = eps;
  for (std::size_t k = 0; k < devices.size(); ++k)
    if (!device_slots[k].empty()) multi_tensor_adamw(device_slots[k], sc, devices[k]);
  for (Slot* s : updated) {
    s->param.bump_version();
    s->exp_avg.bump_version();
    s->exp_avg_sq.bump_version();
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
    if (!g.defined() || g.device().is_cuda()) continue;
    Tensor gc = g.to(DType::f32).contiguous();
    const float* d = gc.data<float>();
    double s = 0;
    for (std::int64_t i = 0; i < gc.numel(); ++i) s += double(d[i]) * double(d[i]);
    total += s;
  }
  // CUDA gradients: one sum per device, added after the CPU ones.
  for (Device d : cuda_devices(params)) total += cuda_grad_sq_sum(params, d);
  return total;
}

void clip_grads_to(const std::vector<Tensor>& params, double norm, double max_norm) {
  if (!(max_norm > 0 && norm > max_norm)) return;
  scale_grads(params, float(max_norm / (norm + 1e-6)));
}

void scale_grads(const std::vector<Tensor>& params, float scale) {
  NoGradGuard ng;
  for (Device dev : cuda_devices(params)) {
    std::vector<Tensor> grads;
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (!g.defined() || g.device() != dev) continue;
      REMAT_CHECK(g.dtype() == DType::f32 && g.is_contiguous(), DTypeError,
                  "scale_grads: CUDA gradients must be contiguous f32, got ", g.dtype(), " of shape ",
                  shape_str(g.sizes()), " with strides ", shape_str(g.strides()));
      if (g.numel() == 0) continue;
      grads.push_back(g);
    }
    if (!grads.empty()) multi_tensor_scale_(grads, scale, dev);
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined() && g.device() == dev) g.bump_version();
    }
  }
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined() || g.device().is_cuda()) continue;
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
