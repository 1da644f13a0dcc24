// A routed MoE block on CUDA against the CPU: the dispatch/combine row
// movement (cuda/moe_dispatch) bit for bit in f32 and bf16, and the whole
// MoELayer (router, top-K or random routes, capacity drops, expert bias,
// shared expert, z-loss) forward and backward, with equal routing metrics.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/tensor.h"
#include "models/moe_layer.h"
#include "moe/dispatch.h"
#include "moe/router.h"
#include "ops/ops.h"
#include "tests/cuda/device_compare.h"

using namespace remat;
using remat::testing::check_close;
using remat::testing::compare_on_cuda;
using remat::testing::DeviceTolerance;
using remat::testing::same_bits;

namespace {

constexpr DeviceTolerance kExact{0.0, 0.0};

// `tokens` x `top_k` distinct experts per token, from a fixed pattern.
Tensor fixed_indices(std::int64_t tokens, std::int64_t top_k, std::int64_t experts) {
  std::vector<std::int64_t> idx;
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t k = 0; k < top_k; ++k) idx.push_back((t * 7 + k * 3 + (t % 3) * k) % experts);
  // Make each token's experts distinct (the pattern may repeat one).
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t k = 1; k < top_k; ++k)
      for (std::int64_t j = 0; j < k; ++j)
        if (idx[std::size_t(t * top_k + k)] == idx[std::size_t(t * top_k + j)]) {
          idx[std::size_t(t * top_k + k)] = (idx[std::size_t(t * top_k + k)] + 1) % experts;
          j = -1;  // check again from the start
        }
  return from_vector<std::int64_t>(idx, {tokens, top_k});
}

// dispatch -> combine over a fixed routing, compared on both devices with
// zero tolerance (forward and both input gradients).
void check_dispatch_combine(std::int64_t tokens, std::int64_t top_k, std::int64_t experts, std::int64_t d,
                            double capacity, DType dtype, bool transposed_x) {
  INFO("tokens " << tokens << " top_k " << top_k << " d " << d << " capacity " << capacity << " "
                 << dtype_name(dtype) << (transposed_x ? " transposed" : ""));
  const Tensor idx = fixed_indices(tokens, top_k, experts);
  const Routing rc = make_routing(idx, experts, capacity);
  const Routing rd = make_routing(idx.to(cuda_device(0)), experts, capacity);
  CHECK(rd.token_of_row.device().is_cuda());
  CHECK(rd.slot_of_row.device().is_cuda());
  CHECK(rc.counts == rd.counts);
  CHECK(rc.dropped == rd.dropped);
  if (capacity > 0) CHECK(rc.dropped > 0);
  Generator gen(3);
  Tensor x = transposed_x ? randn({d, tokens}, {}, &gen).to(dtype) : randn({tokens, d}, {}, &gen).to(dtype);
  Tensor w = rand({rc.rows()}, {}, &gen).to(dtype);
  compare_on_cuda(
      [&](const std::vector<Tensor>& in) {
        const Routing& r = in[0].device().is_cuda() ? rd : rc;
        Tensor xi = transposed_x ? in[0].t() : in[0];
        Tensor rows = moe_dispatch_rows(xi, r, /*lease=*/true);
        return moe_combine_rows(rows, in[1], r);
      },
      {x, w}, kExact);
}

struct BlockRun {
  Tensor y, x_grad;
  std::vector<std::pair<std::string, Tensor>> params;  // gradients in .grad
  std::vector<MoELayerStats> stats;
  Tensor aux, z;
};

ModelConfig block_config() {
  ModelConfig c = ModelConfig::named("tiny-moe");
  c.d_model = 40;
  c.experts = 5;
  c.top_k = 2;
  c.moe_ffn = 24;
  c.shared = 0;
  c.z_coef = 0.0;
  c.capacity_factor = 0.0;
  c.random_routing = false;
  return c;
}

// One forward and backward of a MoE layer on `device` from fixed weights and
// input; the loss is sum(y * seed) + aux (+ z).
BlockRun run_block(const ModelConfig& c, Device device, bool expert_bias, RngState rng) {
  Generator wgen(21);
  MoELayer layer(c, 0, wgen);
  if (device.is_cuda()) layer.to(device);
  if (expert_bias) {
    std::vector<float> b;
    for (std::int64_t e = 0; e < c.experts; ++e) b.push_back(0.02f * float(e % 3) - 0.02f);
    layer.expert_bias = from_vector<float>(b, {c.experts}, device);
  }
  BlockRun out;
  Generator gen(8);
  const std::int64_t B = 2, S = 11;
  Tensor x = randn({B, S, c.d_model}, {}, &gen).to(device).detach();
  x.set_requires_grad(true);
  Tensor seed = randn({B, S, c.d_model}, {}, &gen).to(device);
  default_generator(device).set_state(rng);  // random routes draw from the device's generator
  MoETerms terms;
  {
    MoETermsScope collect(terms);
    out.y = layer.forward(x);
  }
  out.stats = terms.stats;
  if (!terms.aux.empty()) out.aux = terms.aux.back();
  if (!terms.z.empty()) out.z = terms.z.back();
  Tensor loss = sum(mul(out.y, seed));
  REQUIRE(out.aux.defined());
  loss = add(loss, out.aux);
  if (out.z.defined()) loss = add(loss, out.z);
  loss.backward();
  out.x_grad = x.grad();
  out.params = layer.named_parameters();
  return out;
}

// |dev - cpu| <= rtol * (|cpu| + max |cpu|): relative to the tensor's scale.
void check_scaled(const std::string& what, const Tensor& cpu, const Tensor& dev, double rtol = 1e-4) {
  const auto v = cpu.to(DType::f32).to_vector<float>();
  double scale = 0;
  for (float f : v) scale = std::max(scale, double(std::fabs(f)));
  check_close(what, cpu, dev, DeviceTolerance{rtol, rtol * scale + 1e-12});
}

void compare_block(const ModelConfig& c, bool expert_bias) {
  const RngState rng{1234, 0};
  const BlockRun cpu = run_block(c, kCPU, expert_bias, rng);
  const BlockRun dev = run_block(c, cuda_device(0), expert_bias, rng);
  check_scaled("block output", cpu.y, dev.y);
  check_scaled("input gradient", cpu.x_grad, dev.x_grad);
  REQUIRE(cpu.params.size() == dev.params.size());
  for (std::size_t i = 0; i < cpu.params.size(); ++i) {
    INFO(cpu.params[i].first);
    REQUIRE(cpu.params[i].second.grad().defined() == dev.params[i].second.grad().defined());
    if (cpu.params[i].second.grad().defined())
      check_scaled("gradient of " + cpu.params[i].first, cpu.params[i].second.grad(), dev.params[i].second.grad());
  }
  // Router metrics: the same routes, so the same counts and drops.
  REQUIRE(cpu.stats.size() == 1);
  REQUIRE(dev.stats.size() == 1);
  CHECK(cpu.stats[0].tokens_per_expert == dev.stats[0].tokens_per_expert);
  CHECK(cpu.stats[0].dropped == dev.stats[0].dropped);
  CHECK(cpu.stats[0].imbalance == dev.stats[0].imbalance);
  CHECK(dev.stats[0].aux == Approx(cpu.stats[0].aux).epsilon(1e-5));
  CHECK(dev.stats[0].z == Approx(cpu.stats[0].z).epsilon(1e-5));
  if (c.capacity_factor > 0) CHECK(cpu.stats[0].dropped > 0);
  // The CUDA block is deterministic: a second run gives the same bits.
  const BlockRun again = run_block(c, cuda_device(0), expert_bias, rng);
  CHECK(same_bits(dev.y, again.y));
  CHECK(same_bits(dev.x_grad, again.x_grad));
}

}  // namespace

TEST_CASE("MoE dispatch and combine on CUDA equal the CPU bit for bit (f32)", "[cuda][moe]") {
  check_dispatch_combine(13, 3, 5, 37, 0.0, DType::f32, false);
  check_dispatch_combine(13, 3, 5, 64, 0.0, DType::f32, false);   // 128-bit row copies
  check_dispatch_combine(29, 2, 7, 33, 0.6, DType::f32, false);   // capacity drops
  check_dispatch_combine(17, 1, 4, 9, 0.0, DType::f32, true);     // strided x
}

TEST_CASE("MoE dispatch and combine on CUDA equal the CPU bit for bit (bf16)", "[cuda][moe]") {
  check_dispatch_combine(13, 3, 5, 37, 0.0, DType::bf16, false);
  check_dispatch_combine(13, 3, 5, 64, 0.0, DType::bf16, false);
  check_dispatch_combine(29, 2, 7, 33, 0.6, DType::bf16, false);
}

TEST_CASE("MoE routing on CUDA keeps the CPU's rows", "[cuda][moe]") {
  const Tensor idx = fixed_indices(23, 3, 6);
  const Routing rc = make_routing(idx, 6, 0.8);
  const Routing rd = make_routing(idx.to(cuda_device(0)), 6, 0.8);
  CHECK(rc.token_of_row.to_vector<std::int64_t>() == rd.token_of_row.to_vector<std::int64_t>());
  CHECK(rc.slot_of_row.to_vector<std::int64_t>() == rd.slot_of_row.to_vector<std::int64_t>());
  CHECK(rc.counts == rd.counts);
  CHECK(rc.offsets == rd.offsets);
  CHECK(rc.dropped == rd.dropped);
}

TEST_CASE("the router on CUDA picks the CPU's experts", "[cuda][moe]") {
  Generator g(4);
  Tensor x = randn({19, 12}, {}, &g);
  Tensor w = randn({6, 12}, {}, &g);
  RouterOptions o;
  o.top_k = 2;
  o.compute_z_loss = true;
  RouterOutput rc = route(x, w, o);
  RouterOutput rd = route(x.to(cuda_device(0)), w.to(cuda_device(0)), o);
  CHECK(rd.indices.device().is_cuda());
  CHECK(rc.indices.to_vector<std::int64_t>() == rd.indices.to_vector<std::int64_t>());
  CHECK(rc.slots_per_expert == rd.slots_per_expert);
  check_close("weights", rc.weights, rd.weights, {});
  check_close("probs", rc.probs, rd.probs, {});
  CHECK(rd.aux.item() == Approx(rc.aux.item()).epsilon(1e-5));
  CHECK(rd.z.item() == Approx(rc.z.item()).epsilon(1e-5));
  // Random routes: the same draws from the same generator state on either device.
  o.random_routing = true;
  const RngState s{77, 0};
  default_generator(kCPU).set_state(s);
  Tensor ic = route(x, w, o).indices;
  default_generator(cuda_device(0)).set_state(s);
  Tensor id = route(x.to(cuda_device(0)), w.to(cuda_device(0)), o).indices;
  CHECK(id.device().is_cuda());
  CHECK(ic.to_vector<std::int64_t>() == id.to_vector<std::int64_t>());
}

TEST_CASE("a routed MoE block on CUDA matches the CPU (top-2, dropless)", "[cuda][moe]") {
  compare_block(block_config(), false);
}

TEST_CASE("a routed MoE block on CUDA matches the CPU (shared expert, z-loss, expert bias)", "[cuda][moe]") {
  ModelConfig c = block_config();
  c.shared = 1;
  c.z_coef = 1e-3;
  compare_block(c, true);
}

TEST_CASE("a routed MoE block on CUDA matches the CPU (capacity drops)", "[cuda][moe]") {
  ModelConfig c = block_config();
  c.capacity_factor = 0.5;
  compare_block(c, false);
}

TEST_CASE("a routed MoE block on CUDA matches the CPU (random routing, top-3)", "[cuda][moe]") {
  ModelConfig c = block_config();
  c.random_routing = true;
  c.top_k = 3;
  compare_block(c, false);
}
