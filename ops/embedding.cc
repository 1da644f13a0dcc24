#include "ops/embedding.h"

#include <cstring>
#include <vector>

#include "cuda/embedding.h"
#include "cuda/runtime.h"
#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// ids as i64 in row-major order (CUDA ids are copied to the host on the op's
// stream, which waits for them).
std::vector<std::int64_t> read_ids(const Tensor& ids) {
  if constexpr (kHaveCuda) {
    if (on_cuda(ids)) {
      Tensor c = contiguous_detached(ids);
      Tensor host = empty(c.sizes(), TensorOptions(c.dtype(), kCPU));
      cuda::copy_device_to_host(host.raw_data(), c.raw_data(), c.nbytes(), cuda_stream());
      return host.to_vector<std::int64_t>();
    }
  }
  return ids.detach().to_vector<std::int64_t>();
}

void check_ids(const std::vector<std::int64_t>& ids, const Tensor& weight) {
  const std::int64_t vocab = weight.size(0);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t v = ids[i];
    REMAT_CHECK(v >= 0 && v < vocab, ShapeError, "embedding: id ", v, " at position ", i,
                " is out of range for a table of ", vocab, " rows (weight ", describe(weight),
                "; expected ids in 0..", vocab - 1, ")");
  }
}

// out[k] = weight[ids[k]], copied in weight's dtype.
Tensor embedding_forward(const Tensor& weight, const Tensor& ids_t, const std::vector<std::int64_t>& ids,
                         const Shape& out_shape) {
  NoGradGuard ng;
  if constexpr (kHaveCuda) {
    if (on_cuda(weight)) {
      // The ids were checked on the host; the kernel reads the device copy.
      Tensor w = contiguous_detached(weight), ic = contiguous_detached(ids_t);
      Tensor out = empty(out_shape, TensorOptions(weight.dtype(), weight.device()));
      cuda::embedding_forward(out.raw_data(), w.raw_data(), w.dtype(), ic.raw_data(), ic.dtype(), ic.numel(),
                              w.size(1), cuda_stream());
      return out;
    }
  }
  Tensor w = weight.detach().contiguous();
  const std::int64_t d = w.size(1);
  Tensor out = empty(out_shape, weight.dtype());
  const std::size_t row_bytes = std::size_t(d) * element_size(w.dtype());
  const char* src = static_cast<const char*>(w.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  parallel_rows(std::int64_t(ids.size()), d, [&](std::int64_t k0, std::int64_t k1) {
    for (std::int64_t k = k0; k < k1; ++k)
      std::memcpy(dst + std::size_t(k) * row_bytes, src + std::size_t(ids[std::size_t(k)]) * row_bytes,
                  row_bytes);
  });
  return out;
}

// The token positions of each id, grouped by id in increasing id and, within
// an id, in increasing position (a stable counting sort): the rows of id v
// are order[start[v] .. start[v + 1]); touched lists the ids that occur.
struct IdGroups {
  std::vector<std::int64_t> start, touched, order;
};

IdGroups group_ids(const std::vector<std::int64_t>& ids, std::int64_t vocab) {
  const std::int64_t n = std::int64_t(ids.size());
  IdGroups r;
  r.start.assign(std::size_t(vocab) + 1, 0);
  for (std::int64_t v : ids) {
    // Checked by the forward; checked again here as the lists are built from it.
    REMAT_CHECK(v >= 0 && v < vocab, ShapeError, "embedding backward: id ", v,
                " is out of range for a table of ", vocab, " rows");
    ++r.start[std::size_t(v) + 1];
  }
  for (std::int64_t v = 0; v < vocab; ++v) {
    if (r.start[std::size_t(v) + 1] > 0) r.touched.push_back(v);
    r.start[std::size_t(v) + 1] += r.start[std::size_t(v)];
  }
  r.order.resize(static_cast<std::size_t>(n));
  std::vector<std::int64_t> cursor(r.start.begin(), r.start.end() - 1);
  for (std::int64_t k = 0; k < n; ++k) r.order[std::size_t(cursor[std::size_t(ids[std::size_t(k)])]++)] = k;
  return r;
}

// The CUDA backward: the id lists are built on the host (ids are small) and
// uploaded as one i64 buffer [touched rows | their list starts + end | order];
// one block per touched row sums its token rows in list order, in f32, and
// rounds once, as the CPU kernel below does. Rows no id touches stay zero.
Tensor embedding_backward_cuda(const Tensor& g, const Tensor& ids_t, std::int64_t vocab, std::int64_t d,
                               DType dtype) {
  if constexpr (kHaveCuda) {
    NoGradGuard ng;
    const std::vector<std::int64_t> ids = read_ids(ids_t);
    const IdGroups grp = group_ids(ids, vocab);
    const std::int64_t n = std::int64_t(ids.size()), touched = std::int64_t(grp.touched.size());
    std::vector<std::int64_t> lists;
    lists.reserve(std::size_t(2 * touched + 1 + n));
    lists.insert(lists.end(), grp.touched.begin(), grp.touched.end());
    for (std::int64_t v : grp.touched) lists.push_back(grp.start[std::size_t(v)]);
    lists.push_back(n);
    lists.insert(lists.end(), grp.order.begin(), grp.order.end());
    const Device dev = g.device();
    Tensor dev_lists = empty({std::int64_t(lists.size())}, TensorOptions(DType::i64, dev));
    cuda::copy_host_to_device(dev_lists.raw_data(), lists.data(), lists.size() * sizeof(std::int64_t),
                              cuda_stream());
    // Sums in f32 either way; a gradient of another dtype is accumulated into
    // an f32 table and rounded to the weight's dtype at the end, as on the CPU.
    const DType acc = g.dtype() == dtype ? dtype : DType::f32;
    Tensor gc = contiguous_detached(g.dtype() == acc ? g : g.to(acc));
    Tensor grad = empty({vocab, d}, TensorOptions(acc, dev));
    cuda::memset_async(grad.raw_data(), 0, grad.nbytes(), cuda_stream());
    const std::int64_t* pl = dev_lists.data<std::int64_t>();
    cuda::embedding_backward(grad.raw_data(), gc.raw_data(), acc, pl, pl + touched, pl + 2 * touched + 1,
                             touched, d, cuda_stream());
    return acc == dtype ? grad : grad.to(dtype);
  } else {
    no_cuda_kernel("embedding backward");
  }
}

// grad[v] = sum of g rows k with ids[k] == v, added in increasing k. The rows
// are grouped by id (a stable counting sort), then each touched row is summed
// by one thread: no atomics, and the same order for any thread count.
Tensor embedding_backward(const Tensor& g, const Tensor& ids_t, std::int64_t vocab, std::int64_t d,
                          DType dtype) {
  if constexpr (kHaveCuda) {
    if (on_cuda(g)) return embedding_backward_cuda(g, ids_t, vocab, d, dtype);
  }
  NoGradGuard ng;
  const std::vector<std::int64_t> ids = read_ids(ids_t);  // checked by the forward
  const std::int64_t n = std::int64_t(ids.size());
  const IdGroups grp = group_ids(ids, vocab);
  const std::vector<std::int64_t>& start = grp.start;
  const std::vector<std::int64_t>& touched = grp.touched;
  const std::vector<std::int64_t>& order = grp.order;
  Tensor gf = f32_contiguous(g);
  Tensor grad = zeros({vocab, d}, DType::f32);
  const float* pg = gf.data<float>();
  float* pw = grad.data<float>();
  const std::int64_t avg = std::max<std::int64_t>(1, n / std::max<std::int64_t>(std::int64_t(touched.size()), 1));
  parallel_rows(std::int64_t(touched.size()), d * avg, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t v = touched[std::size_t(t)];
      float* dst = pw + v * d;
      for (std::int64_t i = start[std::size_t(v)]; i < start[std::size_t(v) + 1]; ++i) {
        const float* src = pg + order[std::size_t(i)] * d;
        for (std::int64_t j = 0; j < d; ++j) dst[j] += src[j];
      }
    }
  });
  return from_f32(grad, dtype);
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  check_floating("embedding", weight, "weight");
  check_index("embedding", ids, "ids");
  check_kernel_device("embedding", weight);
  check_kernel_device("embedding", ids);
  REMAT_CHECK(ids.device() == weight.device(), DeviceError, "embedding: ids ", describe(ids),
              " and weight ", describe(weight), " must be on one device");
  REMAT_CHECK(weight.dim() == 2, ShapeError, "embedding: weight must be [V, d], got ",
              describe(weight));
  const std::int64_t vocab = weight.size(0), d = weight.size(1);
  const std::vector<std::int64_t> idv = read_ids(ids);
  check_ids(idv, weight);
  Shape out_shape = ids.sizes();
  out_shape.push_back(d);
  return dispatch1("embedding", {weight, ids}, [&] {
    Tensor out = embedding_forward(weight, ids, idv, out_shape);
    if (auto node = autograd::make_node("embedding", {&weight, &ids})) {
      node->save(ids);
      node->backward_fn = [vocab, d, dt = weight.dtype()](Node& n, std::vector<Tensor>& g) {
        return std::vector<Tensor>{embedding_backward(g[0], n.saved(0), vocab, d, dt), Tensor()};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
