// MXFP8: e4m3 values with one power-of-two scale per block of 32 consecutive
// values (the OCP Microscaling Formats v1.0 layout, MXFP8 E4M3), used to
// compress saved tensors. Not differentiable: these are storage codecs.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

inline constexpr std::int64_t kMxBlock = 32;

// A tensor in MXFP8 is one flat fp8_e4m3 tensor of mxfp8_packed_numel(n)
// bytes: the n e4m3 codes in the source's row-major order, then one biased
// E8M0 exponent byte per block (the block's scale is 2^(byte - 127)). One
// tensor, so hooks further out (offload) can move it like any other.
std::int64_t mxfp8_packed_numel(std::int64_t n);

// Quantizes x (f32, bf16 or f16, any layout, on the CPU or a CUDA device:
// the packed tensor is on x's device, with the same bits either way). Each block's
// exponent is the smallest one that brings the block's largest magnitude to
// <= 448 (e4m3's largest finite value), so nothing saturates; values round to
// nearest even. NaN stays NaN; a block holding +-inf gets the largest
// exponent, so the inf comes back as inf (and the block's finite values as 0).
// CPU: one pass over x, each block scanned for its maximum and then encoded
// while in cache; CUDA: one warp per block (cuda/mxfp8.h), queued on the
// current stream. Throws DTypeError for other dtypes.
Tensor mxfp8_quantize(const Tensor& x);

// The values back as a contiguous tensor of shape `sizes` and `dtype` (f32,
// bf16 or f16) on packed's device (the same bits on the CPU and CUDA). Throws
// Error if `packed` does not fit `sizes`.
Tensor mxfp8_dequantize(const Tensor& packed, const Shape& sizes, DType dtype);

// The kernels a device registers for the codec (the same bits on every device).
struct Mxfp8Kernels {
  // x (contiguous f32, bf16 or f16) packed as above.
  Tensor (*quantize)(const Tensor& x);
  // The values of `packed` as a contiguous tensor of shape `sizes` and `dtype`.
  Tensor (*dequantize)(const Tensor& packed, const Shape& sizes, DType dtype);
};
KernelTable<Mxfp8Kernels>& mxfp8_kernels();

namespace ops_detail {
// One value to e4m3 bits, round to nearest even, saturating at 448
// (bit-identical to fp8_e4m3's constructor, faster).
std::uint8_t e4m3_encode(float v);
}  // namespace ops_detail

}  // namespace remat
