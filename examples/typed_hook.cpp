// A saved-tensor hook of your own, stacked with checkpoint(): it keeps the f32
// tensors that ops save for backward in bf16 (half the bytes). The checkpoint
// region's placeholders are not tensors, so they pass by the hook untouched.
#include <cmath>
#include <cstdio>
#include <remat/remat.h>

using namespace remat;

struct Bf16Saves : TypedSavedTensorHooks {
  std::int64_t packed = 0;
  bool wants(const Tensor& t, const SaveInfo&) const override { return t.dtype() == DType::f32; }
  std::any pack_tensor(const Tensor& t, const SaveInfo&) override {
    ++packed;
    return t.to(DType::bf16);
  }
  Tensor unpack_tensor(std::any packed_value, const SaveInfo&) override {
    return std::any_cast<Tensor>(packed_value).to(DType::f32);
  }
};

// Trains nothing: one forward and backward, returning w1's gradient and the
// peak of saved activation bytes.
std::pair<std::vector<float>, std::int64_t> step(std::shared_ptr<Bf16Saves> hooks) {
  Generator gen(0);
  Tensor x = randn({64, 256}, DType::f32, &gen);
  Tensor w1 = randn({256, 256}, DType::f32, &gen) * 0.06, w2 = randn({256, 256}, DType::f32, &gen) * 0.06;
  w1.set_requires_grad(true);
  w2.set_requires_grad(true);
  reset_saved_bytes_peak();
  Tensor loss;
  {
    std::optional<SavedTensorHooksScope> scope;
    if (hooks) scope.emplace(hooks);
    Tensor h = gelu(matmul(x, w1));                                          // saves go through the hook
    h = checkpoint([&](const Tensor& t) { return tanh(matmul(t, w2)); }, h);  // saves become placeholders
    loss = mean(h * h);
  }
  const std::int64_t peak = saved_bytes_report().activation_peak_bytes;
  loss.backward();
  return {w1.grad().to_vector<float>(), peak};
}

int main() {
  auto hooks = std::make_shared<Bf16Saves>();
  const auto [g32, peak32] = step(nullptr);
  const auto [g16, peak16] = step(hooks);
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < g32.size(); ++i) {
    err = std::max(err, double(std::abs(g32[i] - g16[i])));
    norm = std::max(norm, double(std::abs(g32[i])));
  }
  std::printf("hook packed %lld saves; saved activations peak %lld -> %lld bytes\n",
              static_cast<long long>(hooks->packed), static_cast<long long>(peak32), static_cast<long long>(peak16));
  std::printf("max |grad difference| / max |grad| = %.4f\n", err / norm);
  return hooks->packed > 0 && peak16 < peak32 && err / norm < 0.05 ? 0 : 1;
}
