// The fused multi-tensor optimizer kernels: the public entry points over a
// kernel table (CUDA registers them, cuda/multi_tensor_op.cc; the CPU runs
// its optimizer loops in train/optimizer.cc).
#include "ops/multi_tensor.h"

namespace remat {

KernelTable<MultiTensorKernels>& multi_tensor_kernels() {
  static KernelTable<MultiTensorKernels> t("multi-tensor kernels");
  return t;
}

void multi_tensor_adamw(const std::vector<AdamWTensors>& tensors, const AdamWStepScalars& s, Device device) {
  multi_tensor_kernels().run(device, &MultiTensorKernels::adamw, tensors, s, device);
}

double multi_tensor_sum_squares(const std::vector<Tensor>& tensors, Device device) {
  return multi_tensor_kernels().run(device, &MultiTensorKernels::sum_squares, tensors, device);
}

void multi_tensor_scale_(const std::vector<Tensor>& tensors, float scale, Device device) {
  multi_tensor_kernels().run(device, &MultiTensorKernels::scale, tensors, scale, device);
}

}  // namespace remat
