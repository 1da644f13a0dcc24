#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/error.h"
#include "engine/grad_mode.h"
#include "engine/rng.h"

namespace remat {

namespace {

// The last position's logits of a [1, S, V] tensor.
std::vector<float> last_row(const Tensor& logits) {
  const std::int64_t S = logits.size(1), V = logits.size(2);
  Tensor row = logits.narrow(1, S - 1, 1).contiguous().to(kCPU);
  std::vector<float> out = row.to_vector<float>();
  out.resize(std::size_t(V));
  return out;
}

void check(const DecoderModel& model, const std::vector<std::int32_t>& prompt, const GenerateOptions& o) {
  const std::int64_t V = model.config().vocab;
  REMAT_CHECK(!prompt.empty(), Error, "generate: the prompt has no tokens");
  for (auto id : prompt)
    REMAT_CHECK(id >= 0 && id < V, Error, "generate: prompt token ", id, " outside the vocabulary [0, ", V, ")");
  REMAT_CHECK(o.max_new >= 0, Error, "generate: --max-new must be >= 0, got ", o.max_new);
  REMAT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, Error,
              "generate: --temperature must be a finite number >= 0, got ", o.temperature);
  REMAT_CHECK(o.top_k >= 0, Error, "generate: --top-k must be >= 0, got ", o.top_k);
  REMAT_CHECK(o.top_p > 0 && o.top_p <= 1, Error, "generate: --top-p must be in (0, 1], got ", o.top_p);
}

Tensor ids_tensor(const std::vector<std::int32_t>& ids, Device device) {
  std::vector<std::int64_t> v(ids.begin(), ids.end());
  return from_vector<std::int64_t>(v, {1, std::int64_t(v.size())}).to(device);
}

}  // namespace

std::int32_t sample_token(const std::vector<float>& logits, const GenerateOptions& o, float u) {
  const std::size_t V = logits.size();
  if (o.temperature == 0) return std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<std::int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  // Most likely first (ties: the lower id), so top-k and top-p cut a prefix.
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b]; });
  std::size_t keep = o.top_k > 0 ? std::min<std::size_t>(V, std::size_t(o.top_k)) : V;
  const double mx = logits[std::size_t(order[0])];
  std::vector<double> p(keep);
  double sum = 0;
  for (std::size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((logits[std::size_t(order[i])] - mx) / o.temperature);
  if (o.top_p < 1) {
    double acc = 0;
    std::size_t cut = keep;
    for (std::size_t i = 0; i < keep; ++i) {
      acc += p[i] / sum;
      if (acc >= o.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(keep), 0.0);
  }
  double target = double(u) * sum, acc = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (target < acc) return order[i];
  }
  return order[keep - 1];
}

std::vector<std::int32_t> generate(const DecoderModel& model, const std::vector<std::int32_t>& prompt,
                                   const GenerateOptions& opts, const std::function<void(std::int32_t)>& on_token) {
  check(model, prompt, opts);
  NoGradGuard no_grad;
  const Device device = model.output_weight().device();
  Generator gen(opts.seed);
  KVCache cache;
  std::vector<std::int32_t> out;
  Tensor logits = model.forward_cached(ids_tensor(prompt, device), cache, /*last_only=*/true);
  for (std::int64_t i = 0; i < opts.max_new; ++i) {
    float u = 0;
    philox_fill_uniform(&u, 1, gen.reserve(1));
    const std::int32_t t = sample_token(last_row(logits), opts, u);
    out.push_back(t);
    if (on_token) on_token(t);
    if (opts.stop && t == *opts.stop) break;
    if (i + 1 < opts.max_new) logits = model.forward_cached(ids_tensor({t}, device), cache);
  }
  return out;
}

std::vector<std::int32_t> generate_greedy_uncached(const DecoderModel& model, const std::vector<std::int32_t>& prompt,
                                                   std::int64_t max_new) {
  GenerateOptions o;
  o.temperature = 0;
  o.max_new = max_new;
  check(model, prompt, o);
  NoGradGuard no_grad;
  const Device device = model.output_weight().device();
  std::vector<std::int32_t> seq = prompt, out;
  for (std::int64_t i = 0; i < max_new; ++i) {
    const std::int32_t t = sample_token(last_row(model.forward(ids_tensor(seq, device))), o, 0.0f);
    out.push_back(t);
    seq.push_back(t);
  }
  return out;
}

}  // namespace remat
