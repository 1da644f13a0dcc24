// The CPU optimizer loops of train/optimizer: the gradient sum of squares
// (fixed chunks and lanes, the same bits for any thread count), the in-place
// gradient scale, and the multi-tensor AdamW, each against a plain reference
// loop written here, on odd sizes (not multiples of the lane count or of a
// chunk), an empty tensor, a view at an unaligned offset and a parameter
// without a gradient, with 1, 2, 3 and 7 threads.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/parallel_for.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "train/optimizer.h"

using namespace remat;

namespace {

const std::vector<int> kThreadCounts = {1, 2, 3, 7};

// Sets the CPU thread count for a scope and restores the previous one.
class ThreadsScope {
 public:
  explicit ThreadsScope(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadsScope() { set_num_threads(saved_); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int saved_;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Odd sizes: 16385 and 5 * 3 * 2111 = 31665 cross a chunk boundary (16384),
// 1000 * 1001 is 62 chunks; {0, 4} is empty. Index 6 never gets a gradient.
const std::vector<Shape> kShapes = {{7}, {33, 17}, {1, 16385}, {5, 3, 2111}, {0, 4}, {3}, {2, 5}, {1000, 1001}};
constexpr std::size_t kNoGrad = 6;

struct ParamSet {
  std::vector<std::pair<std::string, Tensor>> named;
  std::vector<Tensor> params;
};

// The same parameters on every call: kShapes, then a view at element offset 1
// of a larger buffer (not 16-byte aligned).
ParamSet make_params() {
  Generator gen(11);
  ParamSet s;
  for (std::size_t i = 0; i < kShapes.size(); ++i)
    s.named.emplace_back("p" + std::to_string(i), randn(kShapes[i], {}, &gen).detach());
  Tensor base = randn({1001}, {}, &gen);
  s.named.emplace_back("unaligned", base.narrow(0, 1, 1000).detach());
  for (auto& [name, p] : s.named) {
    p.set_requires_grad(true);
    s.params.push_back(p);
  }
  return s;
}

// Step `step`'s gradients, the same on every call ("p6" gets none).
void set_grads(const ParamSet& s, int step) {
  Generator gen(std::uint64_t(100 + step));
  for (std::size_t i = 0; i < s.named.size(); ++i) {
    Tensor g = randn(s.named[i].second.sizes(), {}, &gen);
    if (i != kNoGrad) s.named[i].second.set_grad(g);
  }
}

// grad_sq_sum's documented order, written out: per tensor, chunks of 16384;
// per chunk, 16 lanes (lane l takes the elements i = l mod 16 of the leading
// multiple of 16), combined pairwise (l + 8, then + 4, + 2, + 1), then the
// tail in order; chunk partials added in order.
double reference_sq_sum(const std::vector<std::vector<float>>& tensors) {
  double total = 0;
  for (const auto& t : tensors) {
    const auto n = std::int64_t(t.size());
    for (std::int64_t b = 0; b < n; b += 16384) {
      const std::int64_t len = std::min<std::int64_t>(16384, n - b);
      double lane[16] = {};
      std::int64_t i = 0;
      for (; i + 16 <= len; i += 16)
        for (int l = 0; l < 16; ++l) {
          const double v = double(t[std::size_t(b + i + l)]);
          lane[l] += v * v;
        }
      double tail = 0;
      for (; i < len; ++i) tail += double(t[std::size_t(b + i)]) * double(t[std::size_t(b + i)]);
      for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
      total += lane[0] + tail;
    }
  }
  return total;
}

// The AdamW update, one tensor at a time, the plain way.
struct RefState {
  std::vector<float> p, m, v;
};

void reference_adamw(std::vector<RefState>& st, const std::vector<std::vector<float>>& grads,
                     const std::vector<bool>& has_grad, const std::vector<bool>& decays, const AdamWOptions& o,
                     double lr, std::int64_t step) {
  const double bc1 = 1.0 - std::pow(o.beta1, double(step));
  const double bc2 = 1.0 - std::pow(o.beta2, double(step));
  const float b1 = float(o.beta1), b2 = float(o.beta2);
  const float step_size = float(lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float eps = float(o.eps);
  for (std::size_t t = 0; t < st.size(); ++t) {
    if (!has_grad[t]) continue;
    const float decay = decays[t] ? float(1.0 - lr * o.weight_decay) : 1.0f;
    RefState& s = st[t];
    const std::vector<float>& g = grads[t];
    for (std::size_t i = 0; i < s.p.size(); ++i) {
      s.m[i] = b1 * s.m[i] + (1.0f - b1) * g[i];
      s.v[i] = b2 * s.v[i] + (1.0f - b2) * g[i] * g[i];
      const float denom = std::sqrt(s.v[i]) * inv_sqrt_bc2 + eps;
      s.p[i] = s.p[i] * decay - step_size * s.m[i] / denom;
    }
  }
}

std::vector<std::vector<float>> grads_of(const ParamSet& s) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : s.params) out.push_back(p.grad().defined() ? p.grad().to_vector<float>() : std::vector<float>{});
  return out;
}

}  // namespace

TEST_CASE("grad_sq_sum: fixed chunks and lanes, the same bits for any thread count", "[train][optimizer]") {
  ParamSet s = make_params();
  set_grads(s, 0);
  // A bf16 gradient and a non-contiguous one are converted to contiguous f32 first.
  Generator gen(7);
  Tensor half = zeros({37, 3}).set_requires_grad();
  half.set_grad(randn({37, 3}, {}, &gen).to(DType::bf16));
  Tensor strided = zeros({19, 23}).set_requires_grad();
  strided.set_grad(randn({23, 19}, {}, &gen).t());
  REQUIRE(!strided.grad().is_contiguous());
  std::vector<Tensor> params = s.params;
  params.push_back(half);
  params.push_back(strided);

  std::vector<std::vector<float>> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad().to(DType::f32).contiguous().to_vector<float>());
  const double ref = reference_sq_sum(grads);
  double plain = 0;  // one serial double sum: the same value up to rounding
  for (const auto& g : grads)
    for (float x : g) plain += double(x) * double(x);
  CHECK(ref > 5e5);
  CHECK(std::fabs(ref - plain) <= 1e-12 * plain);

  for (int n : kThreadCounts) {
    ThreadsScope threads(n);
    INFO(n << " threads");
    CHECK(grad_sq_sum(params) == ref);
    CHECK(grad_sq_sum(params) == ref);
  }
  // Nothing at all, and only empty or missing gradients: 0.
  CHECK(grad_sq_sum({}) == 0.0);
  CHECK(grad_sq_sum({s.params[4], s.params[kNoGrad]}) == 0.0);
  // A single element.
  Tensor one = zeros({1}).set_requires_grad();
  one.set_grad(from_vector<float>({3.0f}, {1}));
  CHECK(grad_sq_sum({one}) == 9.0);
}

TEST_CASE("clip_grad_norm scales in place by max_norm / (norm + 1e-6) in f32", "[train][optimizer]") {
  for (int n : kThreadCounts) {
    ThreadsScope threads(n);
    INFO(n << " threads");
    ParamSet s = make_params();
    set_grads(s, 1);
    const std::vector<std::vector<float>> before = grads_of(s);
    const double norm = std::sqrt(grad_sq_sum(s.params));
    std::vector<std::uint64_t> versions;
    for (const Tensor& p : s.params) versions.push_back(p.grad().defined() ? p.grad().version() : 0);
    CHECK(clip_grad_norm(s.params, 1.0) == norm);
    const float scale = float(1.0 / (norm + 1e-6));
    for (std::size_t t = 0; t < s.params.size(); ++t) {
      INFO("parameter " << t);
      if (t == kNoGrad) {
        CHECK(!s.params[t].grad().defined());
        continue;
      }
      std::vector<float> want = before[t];
      for (float& x : want) x *= scale;
      CHECK(same_bits(s.params[t].grad().to_vector<float>(), want));
      CHECK(s.params[t].grad().version() > versions[t]);
    }
    CHECK(std::sqrt(grad_sq_sum(s.params)) == Approx(1.0).epsilon(1e-5));
    // Below the limit nothing changes.
    const std::vector<std::vector<float>> clipped = grads_of(s);
    clip_grad_norm(s.params, 10.0);
    const std::vector<std::vector<float>> after = grads_of(s);
    for (std::size_t t = 0; t < s.params.size(); ++t) CHECK(same_bits(after[t], clipped[t]));
  }
}

TEST_CASE("scale_grads refuses a gradient it cannot scale in place, changing nothing", "[train][optimizer]") {
  Tensor a = zeros({4}).set_requires_grad();
  a.set_grad(from_vector<float>({1, 2, 3, 4}));
  Tensor b = zeros({3, 2}).set_requires_grad();
  b.set_grad(from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).t());
  CHECK_THROWS_AS(scale_grads({a, b}, 0.5f), DTypeError);
  CHECK_THROWS_WITH(scale_grads({a, b}, 0.5f), Catch::Contains("scale_grads: gradients must be contiguous f32"));
  CHECK(a.grad().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor c = zeros({2}).set_requires_grad();
  c.set_grad(from_vector<float>({1, 2}).to(DType::bf16));
  CHECK_THROWS_AS(scale_grads({a, c}, 0.5f), DTypeError);
  CHECK(a.grad().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  scale_grads({a}, 0.5f);
  CHECK(a.grad().to_vector<float>() == std::vector<float>{0.5f, 1, 1.5f, 2});
}

TEST_CASE("AdamW on the CPU matches a plain per-tensor loop bit for bit, for any thread count", "[train][optimizer]") {
  AdamWOptions o;
  o.weight_decay = 0.1;
  const int steps = 3;
  // The reference, from the same initial values and gradients.
  ParamSet init = make_params();
  std::vector<RefState> ref;
  std::vector<bool> has_grad, decays;
  for (std::size_t t = 0; t < init.params.size(); ++t) {
    const Tensor& p = init.params[t];
    const auto n = std::size_t(p.numel());
    ref.push_back(RefState{p.to_vector<float>(), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)});
    has_grad.push_back(t != kNoGrad);
    decays.push_back(p.dim() >= 2);
  }
  for (int k = 0; k < steps; ++k) {
    set_grads(init, k);
    reference_adamw(ref, grads_of(init), has_grad, decays, o, 1e-2 * double(k + 1), k + 1);
  }

  for (int n : kThreadCounts) {
    ThreadsScope threads(n);
    INFO(n << " threads");
    ParamSet s = make_params();
    AdamW opt(s.named, o);
    std::vector<std::uint64_t> versions;
    for (const Tensor& p : s.params) versions.push_back(p.version());
    for (int k = 0; k < steps; ++k) {
      set_grads(s, k);
      opt.step(1e-2 * double(k + 1));
    }
    CHECK(opt.steps() == steps);
    const auto state = opt.state();
    REQUIRE(state.size() == 2 * s.params.size());
    for (std::size_t t = 0; t < s.params.size(); ++t) {
      INFO(s.named[t].first);
      CHECK(same_bits(s.params[t].to_vector<float>(), ref[t].p));
      CHECK(same_bits(state[2 * t].second.to_vector<float>(), ref[t].m));
      CHECK(same_bits(state[2 * t + 1].second.to_vector<float>(), ref[t].v));
      if (t == kNoGrad) {
        CHECK(s.params[t].version() == versions[t]);  // left alone
      } else {
        CHECK(s.params[t].version() == versions[t] + steps);
      }
    }
    CHECK(!same_bits(s.params[0].to_vector<float>(), init.params[0].to_vector<float>()));
  }
}

TEST_CASE("AdamW reads a bf16 or non-contiguous CPU gradient as contiguous f32", "[train][optimizer]") {
  Generator gen(3);
  Tensor g = randn({9, 5}, {}, &gen).t();  // [5, 9], non-contiguous
  Tensor gb = randn({70}, {}, &gen).to(DType::bf16);
  auto run = [&](bool direct) {
    Tensor w = full({5, 9}, 0.5).set_requires_grad();
    Tensor b = full({70}, -0.25).set_requires_grad();
    AdamW opt({{"w", w}, {"b", b}});
    w.set_grad(direct ? g : g.contiguous());
    b.set_grad(direct ? gb : gb.to(DType::f32));
    opt.step(0.1);
    return std::make_pair(w.to_vector<float>(), b.to_vector<float>());
  };
  const auto a = run(true), c = run(false);
  CHECK(same_bits(a.first, c.first));
  CHECK(same_bits(a.second, c.second));
}

TEST_CASE("AdamW refuses a non-contiguous parameter", "[train][optimizer]") {
  Tensor base = zeros({4, 6});
  Tensor w = base.t().detach().set_requires_grad();
  REQUIRE(!w.is_contiguous());
  CHECK_THROWS_AS(AdamW({{"w", w}}), DeviceError);
  CHECK_THROWS_WITH(AdamW({{"w", w}}), Catch::Contains("AdamW: parameter 'w' on cpu must be contiguous"));
}
