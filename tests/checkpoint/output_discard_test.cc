#include <catch2/catch.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/output_discard.h"
#include "engine/autograd.h"
#include "ops/ops.h"

using namespace remat;

TEST_CASE("an output-discarded tensor is regenerated for the backward that needs it", "[checkpoint][discard]") {
  Generator g(1);
  Tensor x = randn({64, 32}, DType::f32, &g).to(DType::bf16);  // like a router's bf16 input
  x.set_requires_grad(true);
  Tensor w = randn({8, 32}, DType::f32, &g);
  w.set_requires_grad(true);

  // Plain: cast then linear; linear saves the f32 cast for the weight gradient.
  Tensor xf = cast(x, DType::f32);
  Tensor plain = linear(xf, w);
  sum(mul(plain, plain)).backward();
  const auto gw = w.grad().to_vector<float>();
  const auto gx = x.grad().to_vector<float>();
  xf = Tensor();
  w.set_grad(Tensor());
  x.set_grad(Tensor());

  // Output-discard: the f32 copy is gone after the forward.
  const std::int64_t base = saved_bytes_live();
  const std::int64_t regen0 = DiscardedOutput::regenerations();
  Tensor y;
  std::int64_t held_after_forward = 0;
  {
    DiscardedOutput d("router_cast", [](const std::vector<Tensor>& in) { return cast(in[0], DType::f32); }, {x});
    {
      SavedTensorHooksScope scope(d.hooks());
      y = linear(d.output(), w);
    }
    d.release_output();
    held_after_forward = saved_bytes_live() - base;
  }
  // Held: the bf16 input (recipe) and the f32 weight; not the f32 copy of x.
  CHECK(held_after_forward == std::int64_t(x.nbytes() + w.nbytes()));
  sum(mul(y, y)).backward();
  CHECK(DiscardedOutput::regenerations() - regen0 == 1);
  CHECK(w.grad().to_vector<float>() == gw);
  CHECK(x.grad().to_vector<float>() == gx);
  CHECK(saved_bytes_live() == base);
}
