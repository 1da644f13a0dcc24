// Dynamic rematerialization in an embedding program: a 48-layer residual
// MLP trained one step under DynamicRematScope with a byte budget well below
// what its saved activations need. Saves are evicted when an allocation
// would pass the budget and computed again (bit for bit) when backward needs
// them; the gradients equal those of a run without a budget.
#include <cstdio>
#include <cstring>
#include <remat/remat.h>
using namespace remat;

int main() {
  Generator gen(0);
  std::vector<Tensor> w;
  for (int i = 0; i < 48; ++i) w.push_back(mul(randn({256, 256}, {}, &gen), 0.05).set_requires_grad(true));
  const Tensor x = randn({128, 256}, {}, &gen);
  auto step = [&] {
    for (Tensor& p : w)  // the gradient buffers stay: the budget is measured above them
      if (p.grad().defined()) p.grad().zero_();
    Tensor h = x;
    for (const Tensor& p : w) h = add(h, gelu(matmul(h, p)));
    sum(mul(h, h)).backward();
    return w[0].grad().clone();
  };
  CachingAllocator& alloc = allocator_for(kCPU);
  step();  // allocates the gradients
  const std::int64_t base = alloc.stats().allocated_bytes;
  alloc.reset_peak();
  const Tensor plain = step();
  const std::int64_t plain_peak = alloc.stats().allocated_peak - base;

  const std::int64_t budget = alloc.stats().allocated_bytes + plain_peak / 4;
  DynamicRematOptions options;
  options.budget = budget;
  auto dtr = std::make_shared<DynamicRemat>(options);
  alloc.reset_peak();
  Tensor dynamic;
  {
    DynamicRematScope scope(dtr);  // forward and backward under the budget
    dynamic = step();
  }
  const DynamicRematStats s = dtr->stats();
  const auto a = plain.to_vector<float>(), b = dynamic.to_vector<float>();
  const bool same = std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  std::printf("without a budget: %.1f MiB above the model and its gradients; with dynamic remat: peak %.1f MiB <= budget %.1f MiB\n",
              double(plain_peak) / 1048576.0, double(alloc.stats().allocated_peak) / 1048576.0,
              double(budget) / 1048576.0);
  std::printf("%lld evictions, %lld rebuilds (%.1f ms); gradients %s\n", (long long)s.evictions,
              (long long)s.rebuilds, s.rebuild_ms, same ? "bit-identical" : "DIFFER");
  return same ? 0 : 1;
}
