// cross_entropy's CUDA kernels (cuda/softmax.h) registered for ops/loss.h:
// the targets were checked on the host; the per-row losses are summed in a
// fixed order on the device.
#include "cuda/op_util.h"
#include "cuda/softmax.h"
#include "ops/loss.h"

namespace remat::cuda {
namespace {

std::vector<Tensor> forward(const Tensor& logits, const Tensor& targets, const std::vector<std::int64_t>&,
                            std::int64_t count, std::int64_t ignore_index) {
  const std::int64_t c = logits.size(-1);
  const std::int64_t rows = targets.numel();
  Tensor lc = contiguous_detached(logits), tc = contiguous_detached(targets);
  Tensor loss = empty({}, TensorOptions(DType::f32, logits.device()));
  Tensor lse = empty({rows}, TensorOptions(DType::f32, logits.device()));
  Tensor row_loss = empty({rows}, TensorOptions(DType::f32, logits.device()));
  cross_entropy_forward(loss.data<float>(), lse.data<float>(), lc.raw_data(), lc.dtype(), tc.raw_data(), tc.dtype(),
                        rows, c, ignore_index, count, row_loss.data<float>(), op_stream());
  return {loss, lse, row_loss};
}

Tensor backward(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& lse, std::int64_t count,
                std::int64_t ignore_index) {
  const std::int64_t c = logits.size(-1);
  Tensor lc = contiguous_detached(logits), tc = contiguous_detached(targets);
  Tensor sc = contiguous_detached(lse);
  Tensor gc = contiguous_detached(g.dtype() == DType::f32 ? g : g.detach().to(DType::f32));
  Tensor dl = empty(logits.sizes(), TensorOptions(logits.dtype(), logits.device()));
  cross_entropy_backward(dl.raw_data(), gc.data<float>(), lc.raw_data(), sc.data<float>(), lc.dtype(), tc.raw_data(),
                         tc.dtype(), tc.numel(), c, ignore_index, count, op_stream());
  return dl;
}

const KernelRegistration<CrossEntropyKernels> kCuda(cross_entropy_kernels(), DeviceType::CUDA, {forward, backward},
                                                    KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
