// dropout: its definition and CPU kernel. No mask is saved: the backward
// replays the forward's Philox words.
#include "ops/dropout.h"

#include <cmath>

#include "engine/philox.h"
#include "ops/join.h"
#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<DropoutKernels>& dropout_kernels() {
  static KernelTable<DropoutKernels> t("dropout");
  return t;
}

namespace {

// ---------------------------------------------------------------------------
// CPU kernel (f32)

Tensor apply_cpu(const Tensor& x, double p, RngState state) {
  // u = (w >> 8) / 2^24 exactly, so u >= p  <=>  (w >> 8) >= ceil(p * 2^24).
  const auto threshold = std::uint32_t(std::ceil(p * 16777216.0));
  const float scale = float(1.0 / (1.0 - p));
  Tensor xf = f32_contiguous(x);
  Tensor out = empty(x.sizes(), DType::f32);
  if (skip_compute(out)) return out;
  const float* px = xf.data<float>();
  float* po = out.data<float>();
  const std::int64_t n = x.numel();
  const std::int64_t blocks = std::int64_t(philox_blocks(std::uint64_t(n)));
  parallel_for(0, blocks, 4096, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      const philox::Words w = philox::block(state.seed, state.offset + std::uint64_t(b));
      const std::int64_t first = b * 4;
      const int count = int(std::min<std::int64_t>(4, n - first));
      for (int j = 0; j < count; ++j) po[first + j] = (w.v[j] >> 8) >= threshold ? px[first + j] * scale : 0.0f;
    }
  });
  return out;
}

const KernelRegistration<DropoutKernels> kCpu(dropout_kernels(), DeviceType::CPU, {apply_cpu}, KernelDTypes::f32);

// ---------------------------------------------------------------------------
// The op

struct DropoutState {
  double p = 0;
  Generator* gen = nullptr;  // nullptr: the device's default generator
  RowPiece piece{};          // x's rows are these pieces of the drawn rows
  RngState rng{};            // the stream the forward drew, set by the forward
};

// The kernel on x, or on each row of x at its piece's words of the draw.
Tensor apply(const Tensor& x, const DropoutState& s) {
  if (s.piece.pieces == 1) return dropout_kernels().run(x.device(), &DropoutKernels::apply, x, s.p, s.rng);
  const std::int64_t rows = x.size(0), row = x.numel() / std::max<std::int64_t>(rows, 1);
  std::vector<Tensor> out;
  for (std::int64_t b = 0; b < rows; ++b) {
    const RngState at{s.rng.seed, s.rng.offset + std::uint64_t((b * s.piece.pieces + s.piece.index) * row / 4)};
    out.push_back(dropout_kernels().run(x.device(), &DropoutKernels::apply, x.narrow(0, b, 1), s.p, at));
  }
  return cat(out, 0);
}

OpResults forward(const std::vector<Tensor>& in, DropoutState& s) {
  const Tensor& x = in[0];
  // The default generator draws this rank's share of the batch's mask.
  const auto n = std::uint64_t(x.numel() * s.piece.pieces);
  s.rng = s.gen ? s.gen->reserve(n) : reserve_batch_draw(default_generator(x.device()), n);
  return {{apply(x, s)}};
}

std::vector<Tensor> backward(const OpBackward<DropoutState>& b) { return {apply(b.grad(), b.state())}; }

OpCost cost(const std::vector<Tensor>& in, const DropoutState&) {
  const double n = double(in[0].numel());
  return {0, 2 * n, 2 * n * double(element_size(in[0].dtype()))};
}

const Op<DropoutState> kDropout({.name = "dropout", .inputs = {"x"}, .outputs = {{"y"}},
                                 .summary = "zeroes each element with probability p (Philox), scales the rest"},
                                {.forward = forward, .backward = backward, .cost = cost}, &dropout_kernels());

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  check_floating("dropout", x, "input");
  REMAT_CHECK(p >= 0.0 && p < 1.0, Error, "dropout: probability p must be in [0, 1), got ", p, " (input ",
              describe(x), ")");
  if (!training || p == 0.0) return x;
  return kDropout.call1({x}, {p, gen, {}, {}});
}

Tensor dropout(const Tensor& x, double p, bool training, RowPiece piece) {
  check_floating("dropout", x, "input");
  REMAT_CHECK(piece.pieces >= 1 && piece.index >= 0 && piece.index < piece.pieces, Error, "dropout: piece ",
              piece.index, " of ", piece.pieces, " (expected 0 <= index < pieces)");
  if (piece.pieces == 1) return dropout(x, p, training);
  REMAT_CHECK(x.dim() >= 1 && x.size(0) > 0 && (x.numel() / x.size(0)) % 4 == 0, ShapeError, "dropout: ",
              describe(x), " as piece ", piece.index, " of ", piece.pieces,
              " of each row: a row piece must hold a multiple of 4 elements");
  REMAT_CHECK(p >= 0.0 && p < 1.0, Error, "dropout: probability p must be in [0, 1), got ", p, " (input ",
              describe(x), ")");
  if (!training || p == 0.0) return x;
  return kDropout.call1({x}, {p, nullptr, piece, {}});
}

}  // namespace remat
