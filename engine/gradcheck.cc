#include "engine/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/grad_mode.h"
#include "engine/rng.h"

namespace remat {

namespace {

double weighted_sum(const Tensor& out, const std::vector<float>& r) {
  const auto v = out.to(DType::f32).to_vector<float>();
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += double(v[i]) * double(r[i]);
  return s;
}

// f with input `which` replaced by `x`, weighted (no grad).
double loss_at(const GradcheckFn& f, std::vector<Tensor> inputs, std::size_t which, const Tensor& x,
               const std::vector<float>& r) {
  NoGradGuard ng;
  inputs[which] = x;
  return weighted_sum(f(inputs), r);
}

}  // namespace

std::string GradcheckResult::report() const {
  std::ostringstream o;
  o << "gradcheck: " << checked << " comparisons, max |error| " << max_abs_error;
  if (ok) {
    o << ", all within tolerance";
    return o.str();
  }
  o << ", " << failures.size() << " failed:";
  for (std::size_t i = 0; i < failures.size() && i < 20; ++i) o << "\n  " << failures[i];
  if (failures.size() > 20) o << "\n  ... and " << failures.size() - 20 << " more";
  return o.str();
}

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs, const GradcheckOptions& opt) {
  std::vector<bool> check = opt.check;
  if (check.empty())
    for (const auto& t : inputs) check.push_back(t.defined() && is_floating(t.dtype()));
  REMAT_CHECK(check.size() == inputs.size(), Error, "gradcheck: options.check has ", check.size(), " entries for ",
              inputs.size(), " inputs");
  // Leaves that require grad (fresh, so earlier graphs do not interfere).
  std::vector<Tensor> leaves;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i].defined() ? inputs[i].detach() : inputs[i];
    if (check[i]) t.set_requires_grad(true);
    leaves.push_back(t);
  }
  Tensor out = f(leaves);
  REMAT_CHECK(out.defined() && out.requires_grad(), AutogradError,
              "gradcheck: the function's output does not require grad (no checked input reaches it)");
  Generator gen(987654321);
  Tensor rt = randn(out.sizes(), DType::f32, &gen);
  const std::vector<float> r = rt.to_vector<float>();
  backward({out}, {rt.to(out.dtype())});

  GradcheckResult res;
  auto compare = [&](double num, double ana, double atol, const std::string& what) {
    ++res.checked;
    const double err = std::abs(num - ana);
    res.max_abs_error = std::max(res.max_abs_error, err);
    if (!(err <= atol + opt.rtol * std::max(std::abs(num), std::abs(ana)))) {
      res.ok = false;
      std::ostringstream o;
      o << what << ": numeric " << num << ", analytic " << ana;
      res.failures.push_back(o.str());
    }
  };
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (!check[i]) continue;
    Tensor g = leaves[i].grad();
    REMAT_CHECK(g.defined(), AutogradError, "gradcheck: input ", i, " of shape ", shape_str(leaves[i].sizes()),
                " received no gradient");
    REMAT_CHECK(g.sizes() == leaves[i].sizes(), AutogradError, "gradcheck: input ", i, " of shape ",
                shape_str(leaves[i].sizes()), " received a gradient of shape ", shape_str(g.sizes()));
    const auto ga = g.to(DType::f32).contiguous().to_vector<float>();
    Tensor base = leaves[i].detach().contiguous();
    const std::int64_t n = base.numel();
    std::vector<std::int64_t> idx;
    if (n <= opt.max_elements) {
      for (std::int64_t k = 0; k < n; ++k) idx.push_back(k);
    } else {
      for (std::int64_t k = 0; k < opt.max_elements; ++k) idx.push_back((k * 7919) % n);
    }
    const std::string in = "input " + std::to_string(i) + " " + shape_str(base.sizes());
    for (std::int64_t k : idx) {
      Tensor xp = base.clone(), xm = base.clone();
      Tensor fp = xp.view({-1}), fm = xm.view({-1});
      const double v = base.view({-1}).at({k});
      fp.set({k}, v + opt.eps);
      fm.set({k}, v - opt.eps);
      const double num = (loss_at(f, leaves, i, xp, r) - loss_at(f, leaves, i, xm, r)) / (2 * opt.eps);
      compare(num, ga[std::size_t(k)], opt.atol, in + " element " + std::to_string(k));
    }
    // One directional derivative over every element.
    Generator dgen(1234 + i);
    Tensor dir = randn(base.sizes(), DType::f32, &dgen);
    const auto dv = dir.to_vector<float>();
    double ana = 0;
    for (std::size_t k = 0; k < dv.size(); ++k) ana += double(dv[k]) * ga[k];
    Tensor xp, xm;
    {
      NoGradGuard ng;
      const auto bv = base.to(DType::f32).to_vector<float>();
      std::vector<float> pv(bv.size()), mv(bv.size());
      for (std::size_t k = 0; k < bv.size(); ++k) {
        pv[k] = float(bv[k] + opt.eps * dv[k]);
        mv[k] = float(bv[k] - opt.eps * dv[k]);
      }
      xp = from_vector<float>(pv, base.sizes()).to(base.dtype());
      xm = from_vector<float>(mv, base.sizes()).to(base.dtype());
    }
    const double num = (loss_at(f, leaves, i, xp, r) - loss_at(f, leaves, i, xm, r)) / (2 * opt.eps);
    compare(num, ana, 4 * opt.atol, in + " directional derivative");
  }
  return res;
}

}  // namespace remat
