#include "ops/norm.h"

#include <cmath>
#include <vector>

#include "cuda/norm.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// Deterministic sum of f(0) .. f(n - 1): the lane scheme of lane_sum.
template <typename F>
inline float lane_acc(std::int64_t n, F&& f) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += f(i + j);
  for (int j = 0; i < n; ++i, ++j) acc[j] += f(i);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Rows per block for parameter-gradient partial sums. Depends on d only, never
// on the thread count, so the partials and their in-order sum are fixed.
std::int64_t block_rows(std::int64_t d) {
  return std::max<std::int64_t>(32, (std::int64_t(1) << 16) / std::max<std::int64_t>(d, 1));
}

// out[j] = sum over blocks b (in order) of partial[b * d + j].
void sum_partials(const std::vector<float>& partial, std::int64_t blocks, std::int64_t d, float* out) {
  parallel_elementwise(d, [&](std::int64_t j0, std::int64_t j1) {
    for (std::int64_t j = j0; j < j1; ++j) out[j] = 0.0f;
    for (std::int64_t b = 0; b < blocks; ++b) {
      const float* p = partial.data() + b * d;
      for (std::int64_t j = j0; j < j1; ++j) out[j] += p[j];
    }
  });
}

// Rows of x [..., d] (the product of the leading dims).
std::int64_t num_rows(const Tensor& x) {
  return shape_numel(Shape(x.sizes().begin(), x.sizes().end() - 1));
}

void check_param(const char* op, const Tensor& x, const Tensor& p, const char* what) {
  check_floating(op, p, what);
  REMAT_CHECK(p.dtype() == x.dtype(), DTypeError, op, ": ", what, " ", describe(p),
              " must have the input's dtype (input ", describe(x), ")");
  REMAT_CHECK(p.device() == x.device(), DeviceError, op, ": ", what, " ", describe(p),
              " and input ", describe(x), " are on different devices");
  REMAT_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), ShapeError, op, ": ", what, " must be [",
              x.size(-1), "] (the input's last dim), got ", describe(p), " for input ", describe(x));
}

void check_input(const char* op, const Tensor& x) {
  check_floating(op, x, "input");
  check_kernel_device(op, x);
  REMAT_CHECK(x.dim() >= 1, ShapeError, op, ": input must have at least 1 dim (normalised over ",
              "the last), got ", describe(x));
}

// For the CUDA kernels: `t` detached and contiguous in `dtype` (undefined stays undefined).
Tensor cuda_operand(const Tensor& t, DType dtype) {
  if (!t.defined()) return t;
  return contiguous_detached(t.dtype() == dtype ? t : t.detach().to(dtype));
}

// Raw pointer of a possibly undefined tensor (null when undefined).
const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// A CUDA f32 workspace of n floats on `device` (undefined for n == 0).
Tensor cuda_workspace(std::int64_t n, Device device) {
  return n > 0 ? empty({n}, TensorOptions(DType::f32, device)) : Tensor();
}

// ---------------------------------------------------------------------------
// RMSNorm

struct RmsForward {
  Tensor y;     // x's shape; f32 on the CPU, x's dtype on CUDA
  Tensor rstd;  // f32 [rows]
};

RmsForward rms_forward(const Tensor& x, const Tensor& w, float eps) {
  NoGradGuard ng;
  const std::int64_t d = x.size(-1), rows = num_rows(x);
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) {
      Tensor xc = cuda_operand(x, x.dtype()), wc = cuda_operand(w, x.dtype());
      RmsForward f{empty(x.sizes(), TensorOptions(x.dtype(), x.device())),
                   empty({rows}, TensorOptions(DType::f32, x.device()))};
      cuda::rms_norm_forward(f.y.raw_data(), f.rstd.data<float>(), xc.raw_data(), wc.raw_data(), x.dtype(),
                             rows, d, eps, cuda_stream());
      return f;
    }
  }
  Tensor xf = f32_contiguous(x), wf = f32_contiguous(w);
  RmsForward f{empty(x.sizes(), DType::f32), empty({rows}, DType::f32)};
  const float* px = xf.data<float>();
  const float* pw = wf.data<float>();
  float* py = f.y.data<float>();
  float* pr = f.rstd.data<float>();
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * d;
      float* yr = py + r * d;
      const float rs = 1.0f / std::sqrt(lane_dot(xr, xr, d) * inv_d + eps);
      pr[r] = rs;
      for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] * rs) * pw[j];
    }
  });
  return f;
}

// dx = rstd * (g*w - x * rstd^2 * sum(g*w*x) / d); dw = sum over rows of g * x * rstd.
std::vector<Tensor> rms_backward(const Tensor& g, const Tensor& x, const Tensor& w,
                                 const Tensor& rstd, bool need_dx, bool need_dw) {
  NoGradGuard ng;
  const std::int64_t d = x.size(-1), rows = num_rows(x);
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) {
      const DType dt = x.dtype();
      const TensorOptions opts(dt, x.device());
      Tensor gc = cuda_operand(g, dt), xc = cuda_operand(x, dt);
      Tensor wc = need_dx ? cuda_operand(w, dt) : Tensor();
      Tensor rc = cuda_operand(rstd, DType::f32);
      Tensor dx = need_dx ? empty(x.sizes(), opts) : Tensor();
      Tensor dw = need_dw ? empty({d}, opts) : Tensor();
      Tensor work = cuda_workspace(need_dw ? cuda::norm_param_grad_workspace(rows, d) : 0, x.device());
      cuda::rms_norm_backward(need_dx ? dx.raw_data() : nullptr, need_dw ? dw.raw_data() : nullptr,
                              gc.raw_data(), xc.raw_data(), ptr_or_null(wc), rc.data<float>(), dt, rows, d,
                              work.defined() ? work.data<float>() : nullptr, cuda_stream());
      return {dx, dw};
    }
  }
  Tensor gf = f32_contiguous(g), xf = f32_contiguous(x), rf = f32_contiguous(rstd);
  Tensor wf = need_dx ? f32_contiguous(w) : Tensor();  // saved only when dx is needed
  const float* pg = gf.data<float>();
  const float* px = xf.data<float>();
  const float* pw = need_dx ? wf.data<float>() : nullptr;
  const float* pr = rf.data<float>();
  Tensor dx = need_dx ? empty(x.sizes(), DType::f32) : Tensor();
  float* pdx = need_dx ? dx.data<float>() : nullptr;
  const std::int64_t br = block_rows(d);
  const std::int64_t blocks = (rows + br - 1) / br;
  std::vector<float> partial(need_dw ? std::size_t(blocks * d) : 0, 0.0f);
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      float* part = need_dw ? partial.data() + b * d : nullptr;
      for (std::int64_t r = b * br; r < std::min(rows, (b + 1) * br); ++r) {
        const float* gr = pg + r * d;
        const float* xr = px + r * d;
        const float rs = pr[r];
        if (need_dx) {
          const float dot = lane_acc(d, [&](std::int64_t j) { return (gr[j] * pw[j]) * xr[j]; });
          const float c = rs * rs * dot * inv_d;
          float* o = pdx + r * d;
          for (std::int64_t j = 0; j < d; ++j) o[j] = rs * (gr[j] * pw[j] - xr[j] * c);
        }
        if (need_dw)
          for (std::int64_t j = 0; j < d; ++j) part[j] += gr[j] * (xr[j] * rs);
      }
    }
  });
  Tensor dw;
  if (need_dw) {
    dw = empty({d}, DType::f32);
    sum_partials(partial, blocks, d, dw.data<float>());
    dw = from_f32(dw, x.dtype());
  }
  if (need_dx) dx = from_f32(dx, x.dtype());
  return {dx, dw};
}

// ---------------------------------------------------------------------------
// LayerNorm

struct LnForward {
  Tensor y;     // x's shape; f32 on the CPU, x's dtype on CUDA
  Tensor mean;  // f32 [rows]
  Tensor rstd;  // f32 [rows]
};

LnForward ln_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  NoGradGuard ng;
  const std::int64_t d = x.size(-1), rows = num_rows(x);
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) {
      const DType dt = x.dtype();
      Tensor xc = cuda_operand(x, dt), wc = cuda_operand(w, dt), bc = cuda_operand(b, dt);
      LnForward f{empty(x.sizes(), TensorOptions(dt, x.device())),
                  empty({rows}, TensorOptions(DType::f32, x.device())),
                  empty({rows}, TensorOptions(DType::f32, x.device()))};
      cuda::layer_norm_forward(f.y.raw_data(), f.mean.data<float>(), f.rstd.data<float>(), xc.raw_data(),
                               ptr_or_null(wc), ptr_or_null(bc), dt, rows, d, eps, cuda_stream());
      return f;
    }
  }
  Tensor xf = f32_contiguous(x);
  Tensor wf = w.defined() ? f32_contiguous(w) : Tensor();
  Tensor bf = b.defined() ? f32_contiguous(b) : Tensor();
  LnForward f{empty(x.sizes(), DType::f32), empty({rows}, DType::f32), empty({rows}, DType::f32)};
  const float* px = xf.data<float>();
  const float* pw = w.defined() ? wf.data<float>() : nullptr;
  const float* pb = b.defined() ? bf.data<float>() : nullptr;
  float* py = f.y.data<float>();
  float* pm = f.mean.data<float>();
  float* pr = f.rstd.data<float>();
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  parallel_rows(rows, d, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * d;
      float* yr = py + r * d;
      const float m = lane_sum(xr, d) * inv_d;
      const float var = lane_acc(d, [&](std::int64_t j) { return (xr[j] - m) * (xr[j] - m); }) * inv_d;
      const float rs = 1.0f / std::sqrt(var + eps);
      pm[r] = m;
      pr[r] = rs;
      if (pw && pb) {
        for (std::int64_t j = 0; j < d; ++j) yr[j] = ((xr[j] - m) * rs) * pw[j] + pb[j];
      } else if (pw) {
        for (std::int64_t j = 0; j < d; ++j) yr[j] = ((xr[j] - m) * rs) * pw[j];
      } else if (pb) {
        for (std::int64_t j = 0; j < d; ++j) yr[j] = ((xr[j] - m) * rs) + pb[j];
      } else {
        for (std::int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - m) * rs;
      }
    }
  });
  return f;
}

// With xhat = (x - mean) * rstd and gw = g * w (g without weight):
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)); dw = sum g * xhat; db = sum g.
// x, mean and rstd are undefined when only db is needed; w when dx is not needed.
std::vector<Tensor> ln_backward(const Tensor& g, const Tensor& x, const Tensor& w,
                                const Tensor& mean, const Tensor& rstd, DType dtype,
                                bool need_dx, bool need_dw, bool need_db) {
  NoGradGuard ng;
  const std::int64_t d = g.size(-1), rows = num_rows(g);
  const bool need_x = need_dx || need_dw;
  if constexpr (kHaveCuda) {
    if (on_cuda(g)) {
      const TensorOptions opts(dtype, g.device());
      Tensor gc = cuda_operand(g, dtype);
      Tensor xc = need_x ? cuda_operand(x, dtype) : Tensor();
      Tensor wc = need_dx ? cuda_operand(w, dtype) : Tensor();
      Tensor mc = need_x ? cuda_operand(mean, DType::f32) : Tensor();
      Tensor rc = need_x ? cuda_operand(rstd, DType::f32) : Tensor();
      Tensor dx = need_dx ? empty(g.sizes(), opts) : Tensor();
      Tensor dw = need_dw ? empty({d}, opts) : Tensor();
      Tensor db = need_db ? empty({d}, opts) : Tensor();
      const std::int64_t per = cuda::norm_param_grad_workspace(rows, d);
      Tensor work = cuda_workspace(per * ((need_dw ? 1 : 0) + (need_db ? 1 : 0)), g.device());
      cuda::layer_norm_backward(need_dx ? dx.raw_data() : nullptr, need_dw ? dw.raw_data() : nullptr,
                                need_db ? db.raw_data() : nullptr, gc.raw_data(), ptr_or_null(xc),
                                ptr_or_null(wc), need_x ? mc.data<float>() : nullptr,
                                need_x ? rc.data<float>() : nullptr, dtype, rows, d,
                                work.defined() ? work.data<float>() : nullptr, cuda_stream());
      return {dx, dw, db};
    }
  }
  Tensor gf = f32_contiguous(g);
  Tensor xf = need_x ? f32_contiguous(x) : Tensor();
  Tensor wf = need_dx && w.defined() ? f32_contiguous(w) : Tensor();
  Tensor mf = need_x ? f32_contiguous(mean) : Tensor();
  Tensor rf = need_x ? f32_contiguous(rstd) : Tensor();
  const float* pg = gf.data<float>();
  const float* px = need_x ? xf.data<float>() : nullptr;
  const float* pw = wf.defined() ? wf.data<float>() : nullptr;
  const float* pm = need_x ? mf.data<float>() : nullptr;
  const float* pr = need_x ? rf.data<float>() : nullptr;
  Tensor dx = need_dx ? empty(g.sizes(), DType::f32) : Tensor();
  float* pdx = need_dx ? dx.data<float>() : nullptr;
  const std::int64_t br = block_rows(d);
  const std::int64_t blocks = (rows + br - 1) / br;
  std::vector<float> part_w(need_dw ? std::size_t(blocks * d) : 0, 0.0f);
  std::vector<float> part_b(need_db ? std::size_t(blocks * d) : 0, 0.0f);
  const float inv_d = d > 0 ? 1.0f / float(d) : 0.0f;
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      float* pwp = need_dw ? part_w.data() + b * d : nullptr;
      float* pbp = need_db ? part_b.data() + b * d : nullptr;
      for (std::int64_t r = b * br; r < std::min(rows, (b + 1) * br); ++r) {
        const float* gr = pg + r * d;
        const float* xr = need_x ? px + r * d : nullptr;
        const float m = need_x ? pm[r] : 0.0f, rs = need_x ? pr[r] : 0.0f;
        if (need_dx) {
          float* o = pdx + r * d;
          float s1, s2;
          if (pw) {
            s1 = lane_acc(d, [&](std::int64_t j) { return gr[j] * pw[j]; });
            s2 = lane_acc(d, [&](std::int64_t j) { return (gr[j] * pw[j]) * ((xr[j] - m) * rs); });
          } else {
            s1 = lane_sum(gr, d);
            s2 = lane_acc(d, [&](std::int64_t j) { return gr[j] * ((xr[j] - m) * rs); });
          }
          const float a = s1 * inv_d, c = s2 * inv_d;
          if (pw) {
            for (std::int64_t j = 0; j < d; ++j)
              o[j] = rs * ((gr[j] * pw[j] - a) - ((xr[j] - m) * rs) * c);
          } else {
            for (std::int64_t j = 0; j < d; ++j) o[j] = rs * ((gr[j] - a) - ((xr[j] - m) * rs) * c);
          }
        }
        if (need_dw)
          for (std::int64_t j = 0; j < d; ++j) pwp[j] += gr[j] * ((xr[j] - m) * rs);
        if (need_db)
          for (std::int64_t j = 0; j < d; ++j) pbp[j] += gr[j];
      }
    }
  });
  Tensor dw, db;
  if (need_dw) {
    dw = empty({d}, DType::f32);
    sum_partials(part_w, blocks, d, dw.data<float>());
    dw = from_f32(dw, dtype);
  }
  if (need_db) {
    db = empty({d}, DType::f32);
    sum_partials(part_b, blocks, d, db.data<float>());
    db = from_f32(db, dtype);
  }
  if (need_dx) dx = from_f32(dx, dtype);
  return {dx, dw, db};
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_input("rms_norm", x);
  check_param("rms_norm", x, weight, "weight");
  return dispatch1("rms_norm", {x, weight}, [&] {
    RmsForward f = rms_forward(x, weight, float(eps));
    Tensor out = from_f32(f.y, x.dtype());
    if (auto node = autograd::make_node("rms_norm", {&x, &weight})) {
      node->save(x);
      node->save(node->needs_input_grad(0) ? weight : Tensor());  // only dx needs it
      node->save(f.rstd);
      node->backward_fn = [](Node& n, std::vector<Tensor>& g) {
        return rms_backward(g[0], n.saved(0), n.saved(1), n.saved(2), n.needs_input_grad(0),
                            n.needs_input_grad(1));
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_input("layer_norm", x);
  if (weight.defined()) check_param("layer_norm", x, weight, "weight");
  if (bias.defined()) check_param("layer_norm", x, bias, "bias");
  std::vector<Tensor> inputs{x};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  return dispatch1("layer_norm", inputs, [&] {
    LnForward f = ln_forward(x, weight, bias, float(eps));
    Tensor out = from_f32(f.y, x.dtype());
    if (auto node = autograd::make_node("layer_norm", {&x, &weight, &bias})) {
      // db needs only the incoming gradient; dx and dw need x and the statistics.
      const bool need_x = node->needs_input_grad(0) || node->needs_input_grad(1);
      node->save(need_x ? x : Tensor());
      node->save(node->needs_input_grad(0) ? weight : Tensor());  // only dx needs it
      node->save(need_x ? f.mean : Tensor());
      node->save(need_x ? f.rstd : Tensor());
      node->backward_fn = [dt = x.dtype()](Node& n, std::vector<Tensor>& g) {
        return ln_backward(g[0], n.saved(0), n.saved(1), n.saved(2), n.saved(3), dt,
                           n.needs_input_grad(0), n.needs_input_grad(1), n.needs_input_grad(2));
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
