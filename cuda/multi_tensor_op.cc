// The fused multi-tensor optimizer kernels (cuda/adamw.h) registered for
// ops/multi_tensor.h: one launch over many contiguous f32 tensors on one
// device, the tensors' pointers uploaded as slots.
#include <cstring>
#include <type_traits>

#include "cuda/adamw.h"
#include "cuda/op_util.h"
#include "engine/allocator.h"
#include "engine/meta_mirror.h"
#include "ops/multi_tensor.h"

namespace remat::cuda {

namespace {

void check_operand(const char* op, const Tensor& t, Device device) {
  REMAT_CHECK(t.defined() && t.device() == device && runs_cuda_kernels(device) && t.dtype() == DType::f32 &&
                  t.is_contiguous(),
              DeviceError, op, ": expected a contiguous f32 tensor on the CUDA device ", device, ", got ",
              describe(t));
}

// A host array of plain structs as a device tensor (i64 words) from the
// caching allocator, for a multi-tensor kernel's slots. The copy is complete
// on return; frees after the launch are ordered on the same stream.
template <typename T>
Tensor upload_slots(const std::vector<T>& slots, Device device) {
  static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 8);
  CategoryScope cat(MemoryCategory::workspace);
  const std::size_t bytes = slots.size() * sizeof(T);
  Tensor host = empty({std::int64_t((bytes + 7) / 8)}, TensorOptions(DType::i64, kCPU));
  std::memcpy(host.raw_data(), slots.data(), bytes);
  return host.to(device);
}

// The non-empty tensors of `tensors` (each checked as an operand of `op`) as
// the slots of a multi-tensor kernel.
std::vector<TensorSlot> tensor_slots(const char* op, const std::vector<Tensor>& tensors, Device device) {
  std::vector<TensorSlot> slots;
  for (const Tensor& t : tensors) {
    check_operand(op, t, device);
    if (t.numel() == 0) continue;
    TensorSlot s;
    s.data = t.data<float>();
    s.numel = t.numel();
    slots.push_back(s);
  }
  return slots;
}

void adamw_kernel(const std::vector<AdamWTensors>& tensors, const AdamWStepScalars& s, Device device) {
  constexpr const char* op = "multi_tensor_adamw";
  std::vector<AdamWSlot> slots;
  for (const AdamWTensors& t : tensors) {
    for (const Tensor* x : {&t.param, &t.grad, &t.exp_avg, &t.exp_avg_sq}) check_operand(op, *x, device);
    REMAT_CHECK(t.grad.numel() == t.param.numel() && t.exp_avg.numel() == t.param.numel() &&
                    t.exp_avg_sq.numel() == t.param.numel(),
                ShapeError, op, ": parameter ", describe(t.param), " with gradient ", describe(t.grad),
                " and state ", describe(t.exp_avg), ", ", describe(t.exp_avg_sq), " differ in size");
    if (t.param.numel() == 0) continue;
    AdamWSlot d;
    d.param = t.param.data<float>();
    d.grad = t.grad.data<float>();
    d.exp_avg = t.exp_avg.data<float>();
    d.exp_avg_sq = t.exp_avg_sq.data<float>();
    d.numel = t.param.numel();
    d.decay = t.decay;
    slots.push_back(d);
  }
  if (slots.empty()) return;
  AdamWScalars sc;
  sc.beta1 = s.beta1;
  sc.beta2 = s.beta2;
  sc.one_minus_beta1 = 1.0f - s.beta1;
  sc.one_minus_beta2 = 1.0f - s.beta2;
  sc.step_size = s.step_size;
  sc.inv_sqrt_bc2 = s.inv_sqrt_bc2;
  sc.eps = s.eps;
  const std::int64_t chunks = multi_tensor_layout(slots.data(), std::int64_t(slots.size()));
  Tensor dev = upload_slots(slots, device);
  adamw_step(static_cast<const AdamWSlot*>(dev.raw_data()), std::int64_t(slots.size()), chunks, sc,
                   op_stream());
}

double sum_squares_kernel(const std::vector<Tensor>& tensors, Device device) {
  constexpr const char* op = "multi_tensor_sum_squares";
  std::vector<TensorSlot> slots = tensor_slots(op, tensors, device);
  if (slots.empty()) return 0.0;
  const std::int64_t chunks = multi_tensor_layout(slots.data(), std::int64_t(slots.size()));
  Tensor dev = upload_slots(slots, device);
  CategoryScope cat(MemoryCategory::workspace);
  Tensor scratch = empty({chunks + 1}, TensorOptions(DType::i64, device));  // doubles
  return cuda::sum_squares(static_cast<const TensorSlot*>(dev.raw_data()), std::int64_t(slots.size()),
                           chunks, static_cast<double*>(scratch.raw_data()), op_stream());
}

void scale_kernel(const std::vector<Tensor>& tensors, float scale, Device device) {
  constexpr const char* op = "multi_tensor_scale_";
  std::vector<TensorSlot> slots = tensor_slots(op, tensors, device);
  if (slots.empty()) return;
  const std::int64_t chunks = multi_tensor_layout(slots.data(), std::int64_t(slots.size()));
  Tensor devslots = upload_slots(slots, device);
  scale_tensors(static_cast<const TensorSlot*>(devslots.raw_data()), std::int64_t(slots.size()), chunks,
                      scale, op_stream());
}

const KernelRegistration<MultiTensorKernels> kCuda(multi_tensor_kernels(), DeviceType::CUDA,
                                                   {adamw_kernel, sum_squares_kernel, scale_kernel}, KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
