// The MoE row movement's CUDA kernels (cuda/moe_dispatch.h) registered for
// ops/moe_rows.h. The combine sums each token's rows through the inverse of
// slot_of_row (row_of_slot), built on the device.
#include "cuda/moe_dispatch.h"
#include "cuda/op_util.h"
#include "ops/moe_rows.h"

namespace remat::cuda {
namespace {

void gather(Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w) {
  Tensor xc = contiguous_detached(x);
  Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
  moe_gather_rows(out.raw_data(), out.dtype(), xc.raw_data(), xc.dtype(), idx.data<std::int64_t>(),
                  wf.defined() ? wf.data<float>() : nullptr, out.size(0), xc.size(1), op_stream());
}

// CUDA keeps each row's slot.
Tensor routing_index(const Tensor&, const Tensor& slot_of_row, Device device) {
  return slot_of_row.to(device).contiguous();
}

// For every slot of `tokens` x `top_k`, its row in routing order or -1 (dropped).
Tensor row_of_slot(const Tensor& slot_of_row, std::int64_t tokens, std::int64_t top_k, Device device) {
  Tensor slots = slot_of_row.to(device).contiguous();
  Tensor out = empty({tokens * top_k}, TensorOptions(DType::i64, device));
  moe_invert_rows(out.data<std::int64_t>(), tokens * top_k, slots.data<std::int64_t>(), slots.numel(), op_stream());
  return out;
}

Tensor sum_rows(const Tensor& y, const Tensor& w, const Tensor& slot_of_row, std::int64_t tokens, std::int64_t top_k,
                DType dtype) {
  const Tensor rows = row_of_slot(slot_of_row, tokens, top_k, y.device());
  const std::int64_t d = y.size(1);
  Tensor yc = contiguous_detached(y);
  Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
  Tensor out = empty({tokens, d}, TensorOptions(dtype, y.device()));
  moe_combine_rows(out.raw_data(), dtype, yc.raw_data(), yc.dtype(), wf.defined() ? wf.data<float>() : nullptr,
                   rows.data<std::int64_t>(), tokens, top_k, d, op_stream());
  return out;
}

Tensor row_dots(const Tensor& a, const Tensor& a_rows, const Tensor& b) {
  const std::int64_t r = a_rows.size(0), d = a.size(1);
  Tensor ac = contiguous_detached(a), bc = contiguous_detached(b);
  Tensor out = empty({r}, TensorOptions(DType::f32, a.device()));
  moe_row_dots(out.data<float>(), ac.raw_data(), ac.dtype(), a_rows.data<std::int64_t>(), bc.raw_data(), bc.dtype(), r,
               d, op_stream());
  return out;
}

const KernelRegistration<MoeRowsKernels> kCuda(moe_rows_kernels(), DeviceType::CUDA,
                                               {gather, routing_index, sum_rows, row_dots}, KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
