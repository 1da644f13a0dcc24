#include "ops/dropout.h"

#include <cmath>

#include "cuda/dropout.h"
#include "engine/philox.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// x (any layout) times the dropout mask of stream `state`, scaled by
// 1 / (1 - p): out[i] = (u_i >= p) ? x[i] * scale : 0, in f32.
Tensor dropout_kernel(const Tensor& x, double p, RngState state) {
  NoGradGuard ng;
  // u = (w >> 8) / 2^24 exactly, so u >= p  <=>  (w >> 8) >= ceil(p * 2^24).
  const auto threshold = std::uint32_t(std::ceil(p * 16777216.0));
  const float scale = float(1.0 / (1.0 - p));
  if constexpr (kHaveCuda) {
    if (on_cuda(x)) {  // the same words of the same stream, x read through its strides
      Tensor xd = x.detach();
      Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), x.device()));
      cuda::dropout(out.raw_data(), xd.raw_data(), layout_of("dropout", xd), x.dtype(), state.seed,
                    state.offset, threshold, scale, cuda_stream());
      return out;
    }
  }
  Tensor xf = f32_contiguous(x);
  Tensor out = empty(x.sizes(), DType::f32);
  const float* px = xf.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = x.numel();
  const std::int64_t blocks = std::int64_t(philox_blocks(std::uint64_t(n)));
  parallel_for(0, blocks, 4096, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const philox::Words w = philox::block(state.seed, state.offset + std::uint64_t(b));
      const std::int64_t first = b * 4;
      const int count = int(std::min<std::int64_t>(4, n - first));
      for (int j = 0; j < count; ++j)
        po[first + j] = (w.v[j] >> 8) >= threshold ? px[first + j] * scale : 0.0f;
    }
  });
  return from_f32(out, x.dtype());
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  check_floating("dropout", x, "input");
  REMAT_CHECK(p >= 0.0 && p < 1.0, Error, "dropout: probability p must be in [0, 1), got ", p,
              " (input ", describe(x), ")");
  if (!training || p == 0.0) return x;
  check_kernel_device("dropout", x);
  return dispatch1("dropout", {x}, [&] {
    // The default generator draws this rank's share of the batch's mask.
    const RngState state = gen ? gen->reserve(std::uint64_t(x.numel()))
                               : reserve_batch_draw(default_generator(x.device()), std::uint64_t(x.numel()));
    Tensor out = dropout_kernel(x, p, state);
    if (auto node = autograd::make_node("dropout", {&x})) {
      // No mask is saved: backward replays the same Philox words.
      node->backward_fn = [state, p](Node&, std::vector<Tensor>& g) {
        return std::vector<Tensor>{dropout_kernel(g[0], p, state)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
