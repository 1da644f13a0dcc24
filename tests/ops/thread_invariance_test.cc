// Same bits on any thread count (#43): every op case of op_cases.cc, and the
// products at the shapes the models use, large enough that a BLAS library's
// own threading would split them (2-D, batched, the 3-D linears with and
// without bias, an expert's ragged rows, grouped-query attention), give the
// same output and input gradients, bit for bit, at 1, 2 and 3 threads, on
// every CPU GEMM back end.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/parallel_for.h"
#include "engine/rng.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/matmul.h"
#include "tests/ops/op_cases.h"

using namespace remat;
using namespace remat::testing;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Sets the thread count for one scope.
class ThreadsScope {
 public:
  explicit ThreadsScope(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadsScope() { set_num_threads(saved_); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int saved_;
};

// f's output and the gradients of its floating inputs (upstream gradient
// from a fixed seed), as f32 values, at `threads` threads.
std::vector<std::vector<float>> run_at(int threads, const Fn& f, const std::vector<Tensor>& inputs) {
  ThreadsScope scope(threads);
  std::vector<Tensor> x;
  for (const Tensor& t : inputs) {
    Tensor c = t.defined() ? t.detach().contiguous() : t;
    if (c.defined() && is_floating(c.dtype())) c.set_requires_grad(true);
    x.push_back(c);
  }
  Tensor y = f(x);
  std::vector<std::vector<float>> out{y.to(DType::f32).to_vector<float>()};
  if (!y.requires_grad()) return out;
  Generator gen(7);
  backward({y}, {randn(y.sizes(), {}, &gen).to(y.dtype())});
  for (const Tensor& t : x)
    if (t.defined() && t.requires_grad()) out.push_back(t.grad().to(DType::f32).to_vector<float>());
  return out;
}

void require_same_bits(const std::string& what, const Fn& f, const std::vector<Tensor>& inputs) {
  INFO(what);
  const auto one = run_at(1, f, inputs);
  for (int threads : {2, 3}) {
    INFO("threads " << threads);
    const auto other = run_at(threads, f, inputs);
    REQUIRE(other.size() == one.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      INFO((i == 0 ? std::string("output") : "gradient of input " + std::to_string(i - 1)));
      CHECK(other[i] == one[i]);  // float == float: NaN never passes
    }
  }
}

Tensor normal(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, {}, &g);
}

}  // namespace

TEST_CASE("every op case gives the same bits at 1, 2 and 3 threads", "[ops][threads]") {
  for (const OpCase& c : op_cases()) require_same_bits(c.op + " (" + c.what + ")", c.fn, c.inputs());
}

TEST_CASE("products at model shapes give the same bits at 1, 2 and 3 threads", "[ops][threads]") {
  // Every CPU GEMM back end: BLIS (the default) by its own partitioning,
  // OpenBLAS and Eigen through ops/gemm.cc's fixed strips.
  const auto backend = GENERATE(ops_detail::GemmBackend::blis, ops_detail::GemmBackend::openblas,
                                ops_detail::GemmBackend::eigen);
  INFO("GEMM back end " << int(backend));
  ops_detail::set_gemm_backend(backend);
  require_same_bits("matmul [512, 256] @ [256, 384]", [](const auto& x) { return matmul(x[0], x[1]); },
                    {normal({512, 256}, 1), normal({256, 384}, 2)});
  require_same_bits("matmul [96, 1024] @ [1024, 80] (long reduction)",
                    [](const auto& x) { return matmul(x[0], x[1]); }, {normal({96, 1024}, 3), normal({1024, 80}, 4)});
  require_same_bits("bmm [3, 200, 128] @ [3, 128, 160]", [](const auto& x) { return bmm(x[0], x[1]); },
                    {normal({3, 200, 128}, 5), normal({3, 128, 160}, 6)});
  require_same_bits("linear [4, 128, 256] x [384, 256] + bias (weight gradient over 512 tokens)",
                    [](const auto& x) { return linear(x[0], x[1], x[2]); },
                    {normal({4, 128, 256}, 7), normal({384, 256}, 8), normal({384}, 9)});
  require_same_bits("linear [1024, 64] x [512, 64] (an LM head over 1024 tokens)",
                    [](const auto& x) { return linear(x[0], x[1]); }, {normal({1024, 64}, 10), normal({512, 64}, 11)});
  require_same_bits("linear [37, 256] x [512, 256] (an expert's ragged rows)",
                    [](const auto& x) { return linear(x[0], x[1]); }, {normal({37, 256}, 12), normal({512, 256}, 13)});
  require_same_bits("attention q [2, 8, 160, 32], k v [2, 2, 160, 32] (grouped-query, causal)",
                    [](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); },
                    {normal({2, 8, 160, 32}, 14), normal({2, 2, 160, 32}, 15), normal({2, 2, 160, 32}, 16)});
  ops_detail::set_gemm_backend(ops_detail::default_gemm_backend());
}
