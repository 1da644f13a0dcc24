#include "tests/ops/op_cases.h"

#include "engine/grad_mode.h"
#include "engine/rng.h"
#include "moe/dispatch.h"
#include "ops/ops.h"
#include "parallel/comm_ops.h"
#include "parallel/tensor_parallel_ops.h"
#include "parallel/vocab_parallel.h"
#include "parallel/process_group.h"

namespace remat::testing {

namespace {

using Inputs = std::vector<Tensor>;

// Standard normal values of `shape` times `scale`, from `seed`.
Tensor randn_f32(const Shape& shape, std::uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, DType::f32, &g), scale);
}

// Uniform values in [lo, hi).
Tensor uniform_f32(const Shape& shape, std::uint64_t seed, double lo, double hi) {
  Generator g(seed);
  return add(mul(rand(shape, DType::f32, &g), hi - lo), lo);
}

// Values of magnitude in [0.2, 1] with random signs: away from the kinks of
// abs and relu, where finite differences would straddle them.
Tensor signed_away_from_zero(const Shape& shape, std::uint64_t seed) {
  const Tensor m = uniform_f32(shape, seed, 0.2, 1.0);
  const Tensor s = uniform_f32(shape, seed + 1, -1.0, 1.0);
  std::vector<float> v = m.to_vector<float>(), sv = s.to_vector<float>();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = sv[i] < 0 ? -v[i] : v[i];
  return from_vector<float>(v, shape);
}

Tensor i64(const std::vector<std::int64_t>& v, const Shape& shape) { return from_vector<std::int64_t>(v, shape); }

// The routing of 4 tokens, top 2 of 3 experts, every slot kept.
Routing small_routing() {
  const Tensor indices = i64({0, 1, 2, 0, 1, 2, 0, 2}, {4, 2});
  return make_routing(indices, 3, 0.0);
}

// A case whose op is not differentiable: it runs forward (without grad, so
// in-place writes are allowed on the compared devices' leaves).
OpCase forward_only(std::string op, std::string what, std::function<Inputs()> inputs, GradcheckFn fn) {
  return OpCase{std::move(op), std::move(what), std::move(inputs),
                [fn = std::move(fn)](const Inputs& in) {
                  NoGradGuard ng;
                  Inputs d;
                  for (const Tensor& t : in) d.push_back(t.detach());
                  return fn(d);
                },
                std::nullopt, CaseTolerance{}};
}

// A gradcheck with a wide step (a cast to f16 rounds every output).
GradcheckOptions wide_step() {
  GradcheckOptions o;
  o.eps = 0.25;
  o.rtol = 5e-2;
  return o;
}

constexpr CaseTolerance kTranscendental{1e-4, 1e-5};
constexpr CaseTolerance kSums{1e-4, 1e-5};

std::vector<OpCase> make_cases() {
  std::vector<OpCase> c;
  auto unary = [&](const char* op, GradcheckFn fn, std::function<Inputs()> in) {
    c.push_back({op, "[3, 5]", std::move(in), std::move(fn), GradcheckOptions{}, kTranscendental});
  };
  auto normal35 = [] { return Inputs{randn_f32({3, 5}, 1)}; };
  auto positive35 = [] { return Inputs{uniform_f32({3, 5}, 2, 0.5, 2.0)}; };
  // Distinct values 0.25 apart: a finite-difference step never changes which entries win.
  auto spread35 = [] {
    std::vector<float> v(15);
    for (int i = 0; i < 15; ++i) v[std::size_t(i)] = float((i * 7) % 15) * 0.25f - 1.8f;
    return Inputs{from_vector<float>(v, {3, 5})};
  };

  // Arithmetic, with broadcasting.
  c.push_back({"add", "[3, 4] + [4]", [] { return Inputs{randn_f32({3, 4}, 1), randn_f32({4}, 2)}; },
               [](const Inputs& x) { return add(x[0], x[1]); }, GradcheckOptions{}, kSums});
  c.push_back({"sub", "[3, 4] - [3, 1]", [] { return Inputs{randn_f32({3, 4}, 3), randn_f32({3, 1}, 4)}; },
               [](const Inputs& x) { return sub(x[0], x[1]); }, GradcheckOptions{}, kSums});
  c.push_back({"mul", "[3, 4] * [1, 4]", [] { return Inputs{randn_f32({3, 4}, 5), randn_f32({1, 4}, 6)}; },
               [](const Inputs& x) { return mul(x[0], x[1]); }, GradcheckOptions{}, kSums});
  c.push_back({"div", "[3, 4] / [3, 4]", [] { return Inputs{randn_f32({3, 4}, 7), uniform_f32({3, 4}, 8, 0.5, 2)}; },
               [](const Inputs& x) { return div(x[0], x[1]); }, GradcheckOptions{}, kSums});
  c.push_back({"add_scalar", "x + 1.5", normal35, [](const Inputs& x) { return add(x[0], 1.5); }});
  c.push_back({"mul_scalar", "x * -2.5", normal35, [](const Inputs& x) { return mul(x[0], -2.5); }});
  c.push_back({"rsub_scalar", "3 - x", normal35, [](const Inputs& x) { return rsub(x[0], 3.0); }});

  // Unary functions.
  unary("neg", [](const Inputs& x) { return neg(x[0]); }, normal35);
  unary("exp", [](const Inputs& x) { return exp(x[0]); }, normal35);
  unary("log", [](const Inputs& x) { return log(x[0]); }, positive35);
  unary("sqrt", [](const Inputs& x) { return sqrt(x[0]); }, positive35);
  unary("rsqrt", [](const Inputs& x) { return rsqrt(x[0]); }, positive35);
  unary("pow", [](const Inputs& x) { return pow(x[0], 3.0); }, normal35);
  unary("abs", [](const Inputs& x) { return abs(x[0]); }, [] { return Inputs{signed_away_from_zero({3, 5}, 3)}; });
  unary("relu", [](const Inputs& x) { return relu(x[0]); }, [] { return Inputs{signed_away_from_zero({3, 5}, 5)}; });
  unary("gelu", [](const Inputs& x) { return gelu(x[0]); }, normal35);
  unary("silu", [](const Inputs& x) { return silu(x[0]); }, normal35);
  unary("sigmoid", [](const Inputs& x) { return sigmoid(x[0]); }, normal35);
  unary("tanh", [](const Inputs& x) { return tanh(x[0]); }, normal35);
  c.push_back({"swiglu", "[3, 6]", [] { return Inputs{randn_f32({3, 6}, 9, 2.0), randn_f32({3, 6}, 10)}; },
               [](const Inputs& x) { return swiglu(x[0], x[1]); }, GradcheckOptions{}, kTranscendental});

  // Products and attention.
  c.push_back({"matmul", "[3, 4] @ [4, 5]", [] { return Inputs{randn_f32({3, 4}, 11), randn_f32({4, 5}, 12)}; },
               [](const Inputs& x) { return matmul(x[0], x[1]); }, GradcheckOptions{}, kSums});
  c.push_back({"matmul", "[2, 3, 4] @ [2, 4, 5]",
               [] { return Inputs{randn_f32({2, 3, 4}, 13), randn_f32({2, 4, 5}, 14)}; },
               [](const Inputs& x) { return matmul(x[0], x[1]); }, GradcheckOptions{}, kSums});
  c.push_back({"scaled_dot_product_attention", "q [1, 2, 5, 4], k v [1, 1, 5, 4], causal",
               [] { return Inputs{randn_f32({1, 2, 5, 4}, 15), randn_f32({1, 1, 5, 4}, 16), randn_f32({1, 1, 5, 4}, 17)}; },
               [](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }, GradcheckOptions{},
               CaseTolerance{1e-3, 1e-4}});

  // Normalisations.
  c.push_back({"rms_norm", "[3, 8]", [] { return Inputs{randn_f32({3, 8}, 18), uniform_f32({8}, 19, 0.5, 1.5)}; },
               [](const Inputs& x) { return rms_norm(x[0], x[1]); }, GradcheckOptions{}, kSums});
  c.push_back({"add_rms_norm", "[3, 8], 0.5 h + y",
               [] { return Inputs{randn_f32({3, 8}, 20), randn_f32({3, 8}, 21), uniform_f32({8}, 22, 0.5, 1.5)}; },
               [](const Inputs& x) {
                 const AddRmsNorm r = add_rms_norm(x[0], x[1], x[2]);
                 return add(mul(r.h, 0.5), r.y);
               },
               GradcheckOptions{}, kSums});
  c.push_back({"layer_norm", "[3, 8] with weight and bias",
               [] { return Inputs{randn_f32({3, 8}, 23), uniform_f32({8}, 24, 0.5, 1.5), randn_f32({8}, 25)}; },
               [](const Inputs& x) { return layer_norm(x[0], x[1], x[2]); }, GradcheckOptions{}, kSums});
  c.push_back({"softmax", "[3, 5] over dim 1", normal35, [](const Inputs& x) { return softmax(x[0], 1); },
               GradcheckOptions{}, kTranscendental});
  c.push_back({"log_softmax", "[3, 5] over dim 0", normal35, [](const Inputs& x) { return log_softmax(x[0], 0); },
               GradcheckOptions{}, kTranscendental});

  // Reductions and selection.
  c.push_back({"sum", "[3, 5] over dim 1", normal35, [](const Inputs& x) { return sum(x[0], {1}); },
               GradcheckOptions{}, kSums});
  c.push_back({"mean", "[3, 5], all", normal35, [](const Inputs& x) { return mean(x[0]); }, GradcheckOptions{},
               kSums});
  c.push_back({"max", "[3, 5] over dim 1", spread35, [](const Inputs& x) { return max(x[0], 1).first; }});
  c.push_back({"topk", "top 2 of [3, 5]", spread35, [](const Inputs& x) { return topk(x[0], 2).first; }});

  // Indexing.
  c.push_back({"embedding", "[6, 4] table, ids [2, 3]",
               [] { return Inputs{randn_f32({6, 4}, 26), i64({5, 0, 2, 2, 1, 5}, {2, 3})}; },
               [](const Inputs& x) { return embedding(x[0], x[1]); }});
  c.push_back({"index_select", "[5, 3], index [3] (repeats)",
               [] { return Inputs{randn_f32({5, 3}, 27), i64({4, 0, 4}, {3})}; },
               [](const Inputs& x) { return index_select(x[0], 0, x[1]); }});
  c.push_back({"gather", "[3, 4] along dim 1, index [3, 2]",
               [] { return Inputs{randn_f32({3, 4}, 28), i64({3, 0, 1, 1, 2, 0}, {3, 2})}; },
               [](const Inputs& x) { return gather(x[0], 1, x[1]); }});
  c.push_back({"scatter_add", "[3, 4] along dim 1, src [3, 2]",
               [] { return Inputs{randn_f32({3, 4}, 29), i64({3, 3, 1, 2, 0, 0}, {3, 2}), randn_f32({3, 2}, 30)}; },
               [](const Inputs& x) { return scatter_add(x[0], 1, x[1], x[2]); }, GradcheckOptions{}, kSums});
  c.push_back({"index_add", "[5, 3] along dim 0, index [4] (repeats)",
               [] { return Inputs{randn_f32({5, 3}, 31), i64({1, 4, 1, 0}, {4}), randn_f32({4, 3}, 32)}; },
               [](const Inputs& x) { return index_add(x[0], 0, x[1], x[2]); }, GradcheckOptions{}, kSums});
  c.push_back({"cat", "[2, 3] and [4, 3] along dim 0",
               [] { return Inputs{randn_f32({2, 3}, 33), randn_f32({4, 3}, 34)}; },
               [](const Inputs& x) { return cat({x[0], x[1]}, 0); }});
  c.push_back({"split", "[5, 3] in chunks of 2, the second", [] { return Inputs{randn_f32({5, 3}, 35)}; },
               [](const Inputs& x) { return split(x[0], 2, 0)[1]; }});

  // Loss, noise, positions, dtypes.
  c.push_back({"cross_entropy", "[4, 6], one target ignored",
               [] { return Inputs{randn_f32({4, 6}, 36), i64({2, -100, 5, 0}, {4})}; },
               [](const Inputs& x) { return cross_entropy(x[0], x[1]); }, GradcheckOptions{}, kTranscendental});
  c.push_back({"linear_cross_entropy", "h [2, 3, 4], w [7, 4], chunks of 2 rows, one target ignored",
               [] { return Inputs{randn_f32({2, 3, 4}, 51), randn_f32({7, 4}, 52), i64({2, -100, 6, 0, 1, 3}, {2, 3})}; },
               [](const Inputs& x) { return linear_cross_entropy(x[0], x[1], x[2], 2); }, GradcheckOptions{},
               kTranscendental});
  c.push_back({"dropout", "p 0.3, a fixed generator", [] { return Inputs{randn_f32({4, 6}, 37)}; },
               [](const Inputs& x) {
                 Generator g(11);
                 return dropout(x[0], 0.3, true, &g);
               }});
  c.push_back({"rotary_embedding", "[2, 5, 4]", [] { return Inputs{randn_f32({2, 5, 4}, 38)}; },
               [](const Inputs& x) { return rotary_embedding(x[0]); }, GradcheckOptions{}, kTranscendental});
  // The output is f16: a wide finite-difference step averages its rounding.
  c.push_back({"cast", "f32 to f16", normal35, [](const Inputs& x) { return cast(x[0], DType::f16); },
               wide_step(), CaseTolerance{}});

  // In-place updates: not differentiable.
  auto pair34 = [] { return Inputs{randn_f32({3, 4}, 39), randn_f32({3, 4}, 40)}; };
  c.push_back(forward_only("add_", "x += 0.5 y", pair34, [](const Inputs& x) {
    Tensor d = x[0].clone();
    return add_(d, x[1], 0.5);
  }));
  c.push_back(forward_only("mul_", "x *= y", pair34, [](const Inputs& x) {
    Tensor d = x[0].clone();
    return mul_(d, x[1]);
  }));
  c.push_back(forward_only("mul_scalar_", "x *= 3", pair34, [](const Inputs& x) {
    Tensor d = x[0].clone();
    return mul_(d, 3.0);
  }));
  c.push_back(forward_only("zero_", "x = 0", pair34, [](const Inputs& x) {
    Tensor d = x[0].clone();
    return zero_(d);
  }));
  c.push_back(forward_only("copy_", "dst = src", pair34, [](const Inputs& x) {
    Tensor d = x[0].clone();
    return copy_(d, x[1]);
  }));

  // A routed MoE block's dispatch and combine (4 tokens, top 2 of 3 experts).
  c.push_back({"moe_dispatch", "4 tokens, top 2 of 3", [] { return Inputs{randn_f32({4, 3}, 41)}; },
               [](const Inputs& x) { return moe_dispatch_rows(x[0], small_routing(), true); }});
  c.push_back({"moe_combine", "8 rows to 4 tokens",
               [] { return Inputs{randn_f32({8, 3}, 42), uniform_f32({8}, 43, 0.1, 1.0)}; },
               [](const Inputs& x) { return moe_combine_rows(x[0], x[1], small_routing()); }, GradcheckOptions{},
               kSums});

  // Collectives on a one-rank group (several ranks: tests/parallel). Not
  // compared on CUDA: CUDA tensors go through NCCL groups.
  auto comm = [&](const char* op, GradcheckFn fn) {
    c.push_back({op, "one rank", [] { return Inputs{randn_f32({3, 4}, 44)}; }, std::move(fn), GradcheckOptions{},
                 std::nullopt});
  };
  comm("all_to_all", [](const Inputs& x) {
    std::vector<std::int64_t> recv;
    return all_to_all(single_process_group(), x[0], {x[0].size(0)}, recv);
  });
  comm("all_reduce", [](const Inputs& x) { return all_reduce_sum(single_process_group(), x[0]); });
  comm("all_gather", [](const Inputs& x) { return all_gather(single_process_group(), x[0]); });
  comm("reduce_scatter", [](const Inputs& x) { return reduce_scatter(single_process_group(), x[0]); });
  comm("tp_copy", [](const Inputs& x) { return tp_copy(single_process_group(), x[0]); });
  comm("tp_reduce", [](const Inputs& x) { return tp_reduce(single_process_group(), x[0]); });
  comm("tp_gather", [](const Inputs& x) { return tp_gather(single_process_group(), x[0], 1); });
  comm("tp_scatter", [](const Inputs& x) { return tp_scatter(single_process_group(), x[0], 1); });
  comm("tp_gather_whole", [](const Inputs& x) { return tp_gather_whole(single_process_group(), x[0], 1); });
  comm("tp_split", [](const Inputs& x) { return tp_split(single_process_group(), x[0], 1); });
  c.push_back({"sp_column_linears", "one rank: x [2, 3, 4], weights [5, 4] and [3, 4] (both outputs)",
               [] { return Inputs{randn_f32({2, 3, 4}, 55), randn_f32({5, 4}, 56), randn_f32({3, 4}, 57)}; },
               [](const Inputs& x) {
                 const std::vector<Tensor> y = sp_column_linears(single_process_group(), x[0], {x[1], x[2]});
                 return cat({y[0], mul(y[1], 0.5)}, 2);
               },
               GradcheckOptions{}, std::nullopt});
  c.push_back({"vocab_parallel_cross_entropy", "one rank: h [2, 3, 4], w [7, 4], chunks of 2 rows, one target ignored",
               [] { return Inputs{randn_f32({2, 3, 4}, 53), randn_f32({7, 4}, 54), i64({2, -100, 6, 0, 1, 3}, {2, 3})}; },
               [](const Inputs& x) { return vocab_parallel_cross_entropy(single_process_group(), x[0], x[1], x[2], 0, 7, 2); },
               GradcheckOptions{}, std::nullopt});
  c.push_back({"dropout", "p 0.3, row piece 1 of 2 (sequence parallel), the default generator reseeded",
               [] { return Inputs{randn_f32({2, 3, 4}, 55)}; },
               [](const Inputs& x) {
                 manual_seed(11);
                 return dropout(x[0], 0.3, true, RowPiece{1, 2});
               }});
  return c;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = make_cases();
  return cases;
}

}  // namespace remat::testing
