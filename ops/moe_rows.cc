#include "ops/moe_rows.h"

#include "cuda/moe_dispatch.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {
void check_on_cuda(const char* op, const Tensor& t) {
  REMAT_CHECK(t.defined() && on_cuda(t), DeviceError, op, ": takes CUDA tensors (the CPU loops are in ",
              "moe/dispatch.cc), got ", describe(t));
}
}  // namespace

Tensor moe_row_of_slot(const Tensor& slot_of_row, std::int64_t tokens, std::int64_t top_k, Device device) {
  constexpr const char* op = "moe_row_of_slot";
  REMAT_CHECK(device.is_cuda(), DeviceError, op, ": takes a CUDA device, got ", device);
  if constexpr (kHaveCuda) {
    Tensor slots = slot_of_row.to(device).contiguous();
    Tensor out = empty({tokens * top_k}, TensorOptions(DType::i64, device));
    cuda::moe_invert_rows(out.data<std::int64_t>(), tokens * top_k, slots.data<std::int64_t>(), slots.numel(),
                          cuda_stream());
    return out;
  } else {
    no_cuda_kernel(op);
  }
}

Tensor moe_sum_token_rows(const Tensor& y, const Tensor& w, const Tensor& row_of_slot, std::int64_t tokens,
                          std::int64_t top_k, DType dtype) {
  constexpr const char* op = "moe_sum_token_rows";
  check_on_cuda(op, y);
  if constexpr (kHaveCuda) {
    const std::int64_t d = y.size(1);
    Tensor yc = contiguous_detached(y);
    Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
    Tensor out = empty({tokens, d}, TensorOptions(dtype, y.device()));
    cuda::moe_combine_rows(out.raw_data(), dtype, yc.raw_data(), yc.dtype(), wf.defined() ? wf.data<float>() : nullptr,
                           row_of_slot.data<std::int64_t>(), tokens, top_k, d, cuda_stream());
    return out;
  } else {
    no_cuda_kernel(op);
  }
}

void moe_gather_rows_into(const Tensor& out, const Tensor& x, const Tensor& idx, const Tensor& w) {
  constexpr const char* op = "moe_gather_rows_into";
  check_on_cuda(op, out);
  if constexpr (kHaveCuda) {
    Tensor xc = contiguous_detached(x);
    Tensor wf = w.defined() ? f32_contiguous(w.detach()) : Tensor();
    cuda::moe_gather_rows(out.raw_data(), out.dtype(), xc.raw_data(), xc.dtype(), idx.data<std::int64_t>(),
                          wf.defined() ? wf.data<float>() : nullptr, out.size(0), xc.size(1), cuda_stream());
  } else {
    no_cuda_kernel(op);
  }
}

Tensor moe_row_dots(const Tensor& a, const Tensor& a_rows, const Tensor& b) {
  constexpr const char* op = "moe_row_dots";
  check_on_cuda(op, a);
  if constexpr (kHaveCuda) {
    const std::int64_t r = a_rows.size(0), d = a.size(1);
    Tensor ac = contiguous_detached(a), bc = contiguous_detached(b);
    Tensor out = empty({r}, TensorOptions(DType::f32, a.device()));
    cuda::moe_row_dots(out.data<float>(), ac.raw_data(), ac.dtype(), a_rows.data<std::int64_t>(), bc.raw_data(),
                       bc.dtype(), r, d, cuda_stream());
    return out;
  } else {
    no_cuda_kernel(op);
  }
}

}  // namespace remat
