// A new op, whole: `square` is defined here in one place (its record, checks,
// forward, backward formula reading its save by name, cost, and a CPU kernel
// registered in its own kernel table) and tested here. Nothing else in the
// tree knows it. The tests also pin the machinery every op shares: the op
// table, the dtype rule, saves and their names, kernels missing on a device,
// replay-cacheable outputs and bad records.
#include <catch2/catch.hpp>

#include <string>

#include "engine/op_def.h"
#include "engine/op_hooks.h"
#include "ops/kernel_util.h"
#include "ops/op.h"
#include "ops/ops.h"
#include "tests/ops/gradcheck.h"

using namespace remat;
using namespace remat::testing;

namespace {

// ---- The op: y = x * x.

struct SquareKernels {
  Tensor (*forward)(const Tensor& x);               // x^2
  Tensor (*backward)(const Tensor& g, const Tensor& x);  // 2 x g
};

KernelTable<SquareKernels>& square_kernels() {
  static KernelTable<SquareKernels> t("square");
  return t;
}

// How many floating operands of another dtype than f32 the CPU kernels saw.
int non_f32_seen = 0;

Tensor square_cpu(const Tensor& x) {
  non_f32_seen += x.dtype() != DType::f32;
  const Tensor xf = ops_detail::f32_contiguous(x);
  Tensor y = empty(x.sizes(), DType::f32);
  const float* px = xf.data<float>();
  float* py = y.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) py[i] = px[i] * px[i];
  return y;
}

Tensor square_backward_cpu(const Tensor& g, const Tensor& x) {
  non_f32_seen += (g.dtype() != DType::f32) + (x.dtype() != DType::f32);
  const Tensor gf = ops_detail::f32_contiguous(g), xf = ops_detail::f32_contiguous(x);
  Tensor dx = empty(x.sizes(), DType::f32);
  for (std::int64_t i = 0; i < x.numel(); ++i) dx.data<float>()[i] = 2.0f * xf.data<float>()[i] * gf.data<float>()[i];
  return dx;
}

const KernelRegistration<SquareKernels> kCpu(square_kernels(), DeviceType::CPU, {square_cpu, square_backward_cpu},
                                             KernelDTypes::f32);

void check(const OpDef& op, const std::vector<Tensor>& in, const NoState&) {
  ops_detail::check_floating(op.name(), in[0], "input");
}

OpResults forward(const std::vector<Tensor>& in, NoState&) {
  return {{square_kernels().run(in[0].device(), &SquareKernels::forward, in[0])}};
}

std::vector<Tensor> backward(const OpBackward<NoState>& b) {
  return {square_kernels().run(b.grad().device(), &SquareKernels::backward, b.grad(), b.saved("x"))};
}

OpCost cost(const std::vector<Tensor>& in, const NoState&) { return {0, double(in[0].numel()), 0}; }

const Op<> kSquare({.name = "test_square",
                    .inputs = {"x"},
                    .outputs = {{"y"}},
                    .saves = {{"x", SaveFrom::input, 0}},
                    .summary = "x * x (a test's op)"},
                   {.check = check, .forward = forward, .backward = backward, .cost = cost}, &square_kernels());

Tensor square(const Tensor& x) { return kSquare.call1({x}); }

// Records the ops called and their costs.
struct CallLog final : OpHook {
  void after(const OpCall& c, const std::vector<Tensor>&) override {
    names.push_back(c.name);
    if (c.op) vector_flops += c.op->cost(c).vector_flops;
  }
  std::vector<std::string> names;
  double vector_flops = 0;
};

}  // namespace

TEST_CASE("a new op: one definition, and it computes, differentiates and saves by name", "[ops][op_table]") {
  const Tensor x = from_vector<float>({1, -2, 3, 0.5f}, {2, 2});
  CHECK(square(x).to_vector<float>() == std::vector<float>{1, 4, 9, 0.25f});
  check_gradients([](auto& v) { return square(v[0]); }, {normal({3, 5}, 1)});
  check_gradients([](auto& v) { return square(v[0].t()); }, {normal({4, 2}, 2)});
  // Saved under the op's name; the save is x's bytes.
  Tensor leaf = x.detach().set_requires_grad();
  const std::int64_t live0 = saved_bytes_live();
  Tensor y = square(leaf);
  CHECK(op_bytes(saved_bytes_report(), "test_square") == std::int64_t(x.nbytes()));
  CHECK(y.grad_fn()->name() == std::string("test_square"));
  backward({y}, {ones(y.sizes())});
  CHECK(saved_bytes_live() == live0);
  CHECK(leaf.grad().to_vector<float>() == std::vector<float>{2, -4, 6, 1});
}

TEST_CASE("the op table lists every op once, with its record", "[ops][op_table]") {
  const OpDef* sq = find_op("test_square");
  REQUIRE(sq != nullptr);
  CHECK(sq->spec().inputs.size() == 1);
  CHECK(sq->save_index("x") == 0);
  CHECK(sq->save_index("nope") == -1);
  // meta runs the CPU's kernels, so it has them whenever the CPU has
  CHECK(sq->kernel_devices() == std::vector<DeviceType>{DeviceType::CPU, DeviceType::Meta});
  // Built-in ops are in it too, sorted by name, each name once.
  const auto table = op_table();
  std::vector<std::string> names;
  for (const OpDef* op : table) names.push_back(op->name());
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
  for (const char* n : {"matmul", "swiglu", "scaled_dot_product_attention", "cross_entropy", "add_rms_norm", "cat"})
    CHECK(find_op(n) != nullptr);
  // The replay-cacheable ops are exactly the ones whose records say so.
  std::vector<std::string> cacheable;
  for (const OpDef* op : table)
    if (op->spec().replay_cacheable) cacheable.push_back(op->name());
  CHECK(cacheable == std::vector<std::string>{"matmul", "scaled_dot_product_attention"});
}

TEST_CASE("the dtype rule: an f32 kernel sees f32, outputs and gradients keep their dtypes", "[ops][op_table]") {
  non_f32_seen = 0;
  Tensor x = from_vector<float>({1.5f, -2}, {2}).to(DType::bf16).set_requires_grad();
  Tensor y = square(x);
  CHECK(y.dtype() == DType::bf16);
  CHECK(y.to(DType::f32).to_vector<float>() == std::vector<float>{2.25f, 4});
  backward({y}, {ones(y.sizes(), DType::bf16)});
  CHECK(x.grad().dtype() == DType::bf16);
  CHECK(x.grad().to(DType::f32).to_vector<float>() == std::vector<float>{3, -4});
  CHECK(non_f32_seen == 0);
  // The table says what a device computes in.
  CHECK(square_kernels().compute_dtype(kCPU, DType::bf16) == DType::f32);
  CHECK(square_kernels().compute_dtype(kCPU, DType::i64) == DType::i64);
}

TEST_CASE("op hooks see the call with its record and cost", "[ops][op_table]") {
  auto log = std::make_shared<CallLog>();
  {
    OpHookScope scope(log);
    square(zeros({3, 4}));
  }
  REQUIRE(log->names.size() == 1);
  CHECK(log->names[0] == "test_square");
  CHECK(log->vector_flops == 12);
}

TEST_CASE("a device without kernels is a DeviceError naming the op and the device", "[ops][op_table]") {
  CHECK_THROWS_AS(square_kernels().on(cuda_device(0)), DeviceError);
  CHECK_THROWS_WITH(square_kernels().on(cuda_device(0)),
                    Catch::Contains("square: no kernel for cuda:0 (kernels registered for: cpu, meta)"));
  // A second registration for a device is refused.
  CHECK_THROWS_WITH(square_kernels().add(DeviceType::CPU, {square_cpu, square_backward_cpu}, KernelDTypes::f32),
                    Catch::Contains("square: cpu kernels registered twice"));
  CHECK_THROWS_WITH(square(zeros({2}, DType::i32)), Catch::Contains("test_square: input must be floating"));
}

TEST_CASE("bad records are refused when they are made", "[ops][op_table]") {
  const OpFns<NoState> fns{.forward = forward, .backward = backward};
  CHECK_THROWS_WITH(Op<>({.name = "test_square", .inputs = {"x"}, .outputs = {{"y"}}}, fns),
                    Catch::Contains("op 'test_square' is defined twice"));
  CHECK_THROWS_WITH(Op<>({.name = "test_bad_save", .inputs = {"x"}, .outputs = {{"y"}},
                          .saves = {{"z", SaveFrom::input, 1}}},
                         fns),
                    Catch::Contains("save 'z' names input 1 of 1"));
  CHECK_THROWS_WITH(Op<>({.name = "test_bad_cache", .inputs = {"x"}, .outputs = {{"y"}},
                          .saves = {{"s", SaveFrom::intermediate, 0}}, .replay_cacheable = true},
                         fns),
                    Catch::Contains("a replay-cacheable op cannot save intermediates"));
  CHECK_THROWS_WITH(Op<>({.name = "test_no_backward", .inputs = {"x"}, .outputs = {{"y"}}}, {.forward = forward}),
                    Catch::Contains("records a node but has no backward"));
  // A record that is destroyed leaves the table.
  {
    const Op<> temp({.name = "test_temporary", .inputs = {"x"}, .outputs = {{"y"}},
                     .autograd = OpAutograd::none},
                    {.forward = forward});
    CHECK(find_op("test_temporary") != nullptr);
  }
  CHECK(find_op("test_temporary") == nullptr);
}
