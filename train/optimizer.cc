#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/meta_mirror.h"
#include "engine/parallel_for.h"
#include "ops/multi_tensor.h"

namespace remat {

namespace {

// The CUDA devices of `params`' gradients (meta's, when it mirrors CUDA:
// engine/meta_mirror.h), each once, in order of first use.
std::vector<Device> cuda_devices(const std::vector<Tensor>& params) {
  std::vector<Device> out;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined() || !runs_cuda_kernels(g.device())) continue;
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

// ---- CPU multi-tensor loops ----
// Every CPU loop below splits each tensor into chunks of kCpuChunk elements
// (a tensor's last chunk may be shorter) and runs one parallel region over the
// flat list of all tensors' chunks. The chunking does not depend on the thread
// count, and each chunk's work is fixed, so the results do not either.
constexpr std::int64_t kCpuChunk = 16384;

// A contiguous run of f32 elements (one chunk of one tensor).
struct CpuSpan {
  float* data = nullptr;
  std::int64_t n = 0;
};

// Appends the chunks of the contiguous f32 buffer `data` of `numel` elements.
void append_chunks(std::vector<CpuSpan>& out, float* data, std::int64_t numel) {
  for (std::int64_t b = 0; b < numel; b += kCpuChunk) out.push_back(CpuSpan{data + b, std::min(kCpuChunk, numel - b)});
}

// Runs fn(c) for every chunk index c in [0, count), in parallel (any chunk on
// any thread, so fn(c) must depend on c alone).
template <typename Fn>
void for_each_chunk(std::size_t count, const Fn& fn) {
  parallel_for(0, std::int64_t(count), 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) fn(std::size_t(c));
  });
}

// The sum of double(x)^2 over one chunk, in a fixed order: 16 lanes, lane l
// taking the elements i with i % 16 == l of the leading multiple of 16,
// combined pairwise (lane l + lane l+8, then l+4, l+2, l+1), then the tail
// added in order. The lanes are four 4-wide double vectors held in registers
// (GCC/Clang vector extensions; the same arithmetic without AVX).
double chunk_sum_squares(const float* x, std::int64_t n) {
  using F4 = float __attribute__((vector_size(16)));
  using D4 = double __attribute__((vector_size(32)));
  const auto squares = [x](std::int64_t i) {
    F4 f;
    std::memcpy(&f, x + i, sizeof f);
    const D4 d = __builtin_convertvector(f, D4);
    return d * d;
  };
  D4 a0 = {}, a1 = {}, a2 = {}, a3 = {};  // lanes 0-3, 4-7, 8-11, 12-15
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 += squares(i);
    a1 += squares(i + 4);
    a2 += squares(i + 8);
    a3 += squares(i + 12);
  }
  double tail = 0;
  for (; i < n; ++i) tail += double(x[i]) * double(x[i]);
  const D4 c = (a0 + a2) + (a1 + a3);  // lane l + l+8, then + l+4
  return ((c[0] + c[2]) + (c[1] + c[3])) + tail;
}

// The sum of squares of the CPU gradients (any dtype and layout; converted to
// contiguous f32 first): chunk partials computed in parallel, added in chunk order.
std::vector<double> cpu_grad_sq_partials(const std::vector<Tensor>& params) {
  std::vector<Tensor> keep;  // the contiguous f32 gradients the chunks point into
  std::vector<CpuSpan> chunks;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined() || runs_cuda_kernels(g.device())) continue;
    Tensor gc = g.to(DType::f32).contiguous();
    const std::int64_t n = gc.numel();
    if (n == 0) continue;
    if (!gc.device().is_meta()) append_chunks(chunks, gc.data<float>(), n);  // meta: shapes only (a sum of 0)
    keep.push_back(std::move(gc));
  }
  std::vector<double> partial(chunks.size());
  for_each_chunk(chunks.size(), [&](std::size_t c) { partial[c] = chunk_sum_squares(chunks[c].data, chunks[c].n); });
  return partial;
}

double cpu_grad_sq_sum(const std::vector<Tensor>& params) {
  double total = 0;
  for (double s : cpu_grad_sq_partials(params)) total += s;
  return total;
}

// One chunk of one CPU parameter's AdamW update.
struct AdamWChunk {
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const float* grad = nullptr;
  std::int64_t n = 0;
  float decay = 1.0f;
};

// The AdamW update of one chunk, in f32, element by element with exactly the
// operations and order multi_tensor_adamw documents (no fused multiply-adds:
// the build uses -ffp-contract=off).
void adamw_chunk(const AdamWChunk& c, const AdamWStepScalars& s) {
  float* p = c.param;
  float* m = c.exp_avg;
  float* v = c.exp_avg_sq;
  const float* g = c.grad;
  const float b1 = s.beta1, b2 = s.beta2, one_minus_b1 = 1.0f - s.beta1, one_minus_b2 = 1.0f - s.beta2;
  const float step_size = s.step_size, inv_sqrt_bc2 = s.inv_sqrt_bc2, eps = s.eps, decay = c.decay;
  const std::int64_t n = c.n;
  // The four buffers are distinct tensors; elements are independent, so the
  // loop vectorizes with no change to any element's operations.
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
    p[i] = p[i] * decay - step_size * mi / denom;
  }
}

}  // namespace

namespace {
std::vector<AdamWParam> decay_by_dims(std::vector<std::pair<std::string, Tensor>> params) {
  std::vector<AdamWParam> out;
  for (auto& [name, p] : params) out.push_back(AdamWParam{std::move(name), p, p.dim() >= 2});
  return out;
}
}  // namespace

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> params, AdamWOptions opts)
    : AdamW(decay_by_dims(std::move(params)), opts) {}

AdamW::AdamW(std::vector<AdamWParam> params, AdamWOptions opts) : opts_(opts) {
  CategoryScope cat(MemoryCategory::optimizer);
  for (auto& [name, p, decay, m, v] : params) {
    REMAT_CHECK(p.dtype() == DType::f32 && (p.device().is_cpu() || p.device().is_cuda() || p.device().is_meta()),
                DTypeError, "AdamW: parameter '", name, "' must be an f32 CPU, CUDA or meta tensor (master weights), got ", p.dtype(),
                " on ", p.device());
    // The update runs over the parameter's buffer as a flat array.
    REMAT_CHECK(p.is_contiguous(), DeviceError, "AdamW: parameter '", name, "' on ", p.device(),
                " must be contiguous, got shape ", shape_str(p.sizes()), " with strides ", shape_str(p.strides()));
    // The state lives on the parameter's device.
    const TensorOptions state(DType::f32, p.device());
    for (const Tensor* given : {&m, &v})
      REMAT_CHECK(!given->defined() || (given->dtype() == DType::f32 && given->is_contiguous() &&
                                        given->numel() == p.numel() && given->device() == p.device()),
                  DTypeError, "AdamW: the state given for parameter '", name, "' must be contiguous f32 with ",
                  p.numel(), " elements on ", p.device(), ", got ", given->dtype(), " ", shape_str(given->sizes()),
                  " on ", given->device());
    slots_.push_back(Slot{name, p, m.defined() ? m.view(p.sizes()) : zeros(p.sizes(), state),
                          v.defined() ? v.view(p.sizes()) : zeros(p.sizes(), state), decay});
  }
}

void AdamW::step(double lr) {
  NoGradGuard ng;
  ++step_;
  const double bc1 = 1.0 - std::pow(opts_.beta1, double(step_));
  const double bc2 = 1.0 - std::pow(opts_.beta2, double(step_));
  AdamWStepScalars sc;
  sc.beta1 = float(opts_.beta1);
  sc.beta2 = float(opts_.beta2);
  sc.step_size = float(lr / bc1);
  sc.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  sc.eps = float(opts_.eps);
  // CPU parameters: one parallel region over the chunks of all of them.
  // CUDA parameters: one multi-tensor launch per device, after the CPU ones.
  std::vector<Tensor> cpu_grads;  // the contiguous f32 gradients the chunks read
  std::vector<AdamWChunk> cpu_chunks;
  std::vector<Device> devices;
  std::vector<std::vector<AdamWTensors>> device_slots;
  std::vector<Slot*> updated;
  for (Slot& s : slots_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    updated.push_back(&s);
    const std::int64_t n = s.param.numel();
    if (n == 0) continue;
    const float decay = s.decay ? float(1.0 - lr * opts_.weight_decay) : 1.0f;
    Tensor gc = g.to(DType::f32).to(s.param.device()).contiguous();
    REMAT_CHECK(gc.sizes() == s.param.sizes(), ShapeError, "AdamW: gradient of '", s.name, "' is ",
                shape_str(gc.sizes()), ", expected ", shape_str(s.param.sizes()));
    if (runs_cuda_kernels(s.param.device())) {
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
    if (s.param.device().is_meta()) {  // shapes only: the CPU's copies, no update
      cpu_grads.push_back(std::move(gc));
      continue;
    }
    float* p = s.param.data<float>();
    float* m = s.exp_avg.data<float>();
    float* v = s.exp_avg_sq.data<float>();
    const float* gp = gc.data<float>();
    for (std::int64_t b = 0; b < n; b += kCpuChunk)
      cpu_chunks.push_back(AdamWChunk{p + b, m + b, v + b, gp + b, std::min(kCpuChunk, n - b), decay});
    cpu_grads.push_back(std::move(gc));
  }
  for_each_chunk(cpu_chunks.size(), [&](std::size_t c) { adamw_chunk(cpu_chunks[c], sc); });
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
  fill_state([&](const std::string& prefix, const std::string& name, Tensor& dst) { dst.copy_(tensors.at(prefix + name)); },
             step);
}

void AdamW::fill_state(const StateFill& fill, std::int64_t step) {
  NoGradGuard ng;
  for (Slot& s : slots_) {
    fill("optimizer.exp_avg.", s.name, s.exp_avg);
    fill("optimizer.exp_avg_sq.", s.name, s.exp_avg_sq);
    s.exp_avg.bump_version();
    s.exp_avg_sq.bump_version();
  }
  step_ = step;
}

std::int64_t persistent_bytes(const std::vector<std::pair<std::string, Tensor>>& params, const AdamW& opt) {
  std::int64_t n = 0;
  for (const auto& [name, p] : params)  // weight + gradient (a frozen one: its weight, in its own dtype)
    n += (p.requires_grad() ? 2 : 1) * std::int64_t(p.nbytes());
  for (const auto& [name, t] : opt.state()) n += std::int64_t(t.nbytes());
  return n;
}

void give_gradient_buffers(const std::vector<Tensor>& params) {
  CategoryScope grad_cat(MemoryCategory::gradient);
  for (const Tensor& p : params)
    if (!p.grad().defined()) p.set_grad(zeros(p.sizes(), p.device()));
}

std::vector<double> grad_sq_partials(const std::vector<Tensor>& params) {
  REMAT_CHECK(cuda_devices(params).empty(), DeviceError,
              "grad_sq_partials: CPU gradients only (CUDA gradients are summed per device by grad_sq_sum)");
  return cpu_grad_sq_partials(params);
}

double grad_sq_sum(const std::vector<Tensor>& params) {
  double total = cpu_grad_sq_sum(params);
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
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    REMAT_CHECK(g.dtype() == DType::f32 && g.is_contiguous(), DTypeError,
                "scale_grads: gradients must be contiguous f32, got ", g.dtype(), " on ", g.device(), " of shape ",
                shape_str(g.sizes()), " with strides ", shape_str(g.strides()));
  }
  for (Device dev : cuda_devices(params)) {
    std::vector<Tensor> grads;
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined() && g.device() == dev && g.numel() > 0) grads.push_back(g);
    }
    if (!grads.empty()) multi_tensor_scale_(grads, scale, dev);
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined() && g.device() == dev) g.bump_version();
    }
  }
  // CPU gradients: one parallel region over the chunks of all of them.
  std::vector<CpuSpan> chunks;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined() || g.device().is_cuda() || g.device().is_meta()) continue;
    if (const std::int64_t n = g.numel(); n > 0) append_chunks(chunks, g.data<float>(), n);
  }
  for_each_chunk(chunks.size(), [&](std::size_t c) {
    float* d = chunks[c].data;
    const float k = scale;  // a local copy: it cannot alias d
    const std::int64_t n = chunks[c].n;
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) d[i] *= k;
  });
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined() && !g.device().is_cuda()) g.bump_version();
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

LrSchedule parse_lr_schedule(const std::string& name) {
  if (name == "cosine") return LrSchedule::cosine;
  if (name == "linear") return LrSchedule::linear;
  if (name == "constant") return LrSchedule::constant;
  throw Error("TrainOptions.schedule (--schedule) must be cosine, linear or constant, got '" + name + "'");
}

const char* lr_schedule_name(LrSchedule s) {
  return s == LrSchedule::cosine ? "cosine" : s == LrSchedule::linear ? "linear" : "constant";
}

double schedule_lr(LrSchedule schedule, std::int64_t step, std::int64_t warmup, std::int64_t total, double max_lr,
                   double min_lr) {
  if (schedule == LrSchedule::cosine) return cosine_lr(step, warmup, total, max_lr, min_lr);
  if (warmup > 0 && step < warmup) return max_lr * double(step + 1) / double(warmup);
  if (schedule == LrSchedule::constant) return max_lr;
  if (step >= total) return min_lr;
  const double progress = double(step - warmup) / double(std::max<std::int64_t>(total - warmup, 1));
  return max_lr + (min_lr - max_lr) * progress;
}

}  // namespace remat
