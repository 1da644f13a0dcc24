// embedding's CUDA kernels (cuda/embedding.h) registered for ops/embedding.h.
#include <algorithm>

#include "cuda/embedding.h"
#include "cuda/op_util.h"
#include "cuda/runtime.h"
#include "ops/embedding.h"

namespace remat::cuda {
namespace {

// The ids were checked on the host; the kernel reads the device copy.
Tensor forward(const Tensor& weight, const Tensor& ids, const std::vector<std::int64_t>&, const Shape& out_shape) {
  Tensor w = contiguous_detached(weight), ic = contiguous_detached(ids);
  Tensor out = empty(out_shape, TensorOptions(weight.dtype(), weight.device()));
  embedding_forward(out.raw_data(), w.raw_data(), w.dtype(), ic.raw_data(), ic.dtype(), ic.numel(), w.size(1),
                    op_stream());
  return out;
}

// The id lists are built on the host (ids are small) and uploaded as one i64
// buffer [touched rows | their list starts + end | order]; one block per
// touched row sums its token rows in list order, in f32, and rounds once, as
// the CPU kernel does. Rows no id touches stay zero.
//
// On meta (no ids to read) the lists are sized for every id a different row,
// their largest (docs/META.md's shape-only paths).
Tensor backward(const Tensor& g, const Tensor& ids_t, std::int64_t vocab, std::int64_t d, DType dtype) {
  std::vector<std::int64_t> lists;
  std::int64_t touched = 0;
  if (skip_compute(g)) {
    const std::int64_t n = ids_t.numel();
    touched = std::min(n, vocab);
    lists.resize(std::size_t(2 * touched + 1 + n));
  } else {
    const std::vector<std::int64_t> ids = host_ids(ids_t);
    const IdGroups grp = group_ids(ids, vocab);
    const std::int64_t n = std::int64_t(ids.size());
    touched = std::int64_t(grp.touched.size());
    lists.reserve(std::size_t(2 * touched + 1 + n));
    lists.insert(lists.end(), grp.touched.begin(), grp.touched.end());
    for (std::int64_t v : grp.touched) lists.push_back(grp.start[std::size_t(v)]);
    lists.push_back(n);
    lists.insert(lists.end(), grp.order.begin(), grp.order.end());
  }
  const Device dev = g.device();
  Tensor dev_lists = empty({std::int64_t(lists.size())}, TensorOptions(DType::i64, dev));
  copy_host_to_device(dev_lists.raw_data(), lists.data(), lists.size() * sizeof(std::int64_t), op_stream());
  // Sums in f32 either way; a gradient of another dtype is accumulated into
  // an f32 table and rounded to the weight's dtype at the end, as on the CPU.
  const DType acc = g.dtype() == dtype ? dtype : DType::f32;
  Tensor gc = contiguous_detached(g.dtype() == acc ? g : g.to(acc));
  Tensor grad = empty({vocab, d}, TensorOptions(acc, dev));
  memset_async(grad.raw_data(), 0, grad.nbytes(), op_stream());
  const std::int64_t* pl = dev_lists.data<std::int64_t>();
  embedding_backward(grad.raw_data(), gc.raw_data(), acc, pl, pl + touched, pl + 2 * touched + 1, touched, d,
                     op_stream());
  return grad;
}

const KernelRegistration<EmbeddingKernels> kCuda(embedding_kernels(), DeviceType::CUDA, {forward, backward},
                                                 KernelDTypes::native);

}  // namespace
}  // namespace remat::cuda
