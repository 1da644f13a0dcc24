// The LM head's product and its cross-entropy as one op, computed a chunk of
// rows at a time, so the [rows, vocab] logits never exist whole (the chunked
// loss of docs/RECOMPUTE.md#chunked-loss).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace remat {

// cross_entropy(linear(h, w), targets, ignore_index), `chunk` rows of h at a
// time: h [..., d] floating, w [V, d] (h's dtype and device), targets [...]
// (h's leading shape) i32/i64 in [0, V) or ignore_index; chunk >= 1. Returns
// the mean over counted positions (0-dim f32). The loss is the terminal op,
// so its gradient is known in the forward: when grad is recorded, each
// chunk's logits give their softmax gradient at once, which gives the
// chunk's rows of dh and is added into dw; the forward saves dh (f32, h's
// shape) and dw (f32 [V, d]) and the backward scales them by the upstream
// gradient. No more GEMMs than the unchunked pair, and only one chunk's
// logits at a time. Logits are f32 whatever h's dtype. In f32 the bits are
// those of the unchunked pair when chunk is a multiple of loss_chunk_tile()
// (or covers every row) and the upstream gradient is a power of two (1, a
// loss scale); otherwise within rounding of them.
Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, std::int64_t chunk,
                            std::int64_t ignore_index = -100);

// Rows per chunk that keep linear_cross_entropy's weight gradient bit-identical
// to the unchunked product's on `device`: its multiples (the CPU GEMM's
// reduction block, 256 on AVX2 BLIS); 1 where the kernels promise no size.
std::int64_t loss_chunk_tile(Device device);

}  // namespace remat
