#include "ops/embedding.h"

#include <cstring>
#include <vector>

#include "ops/kernel_util.h"

namespace remat {

using namespace ops_detail;

namespace {

// ids as i64 in row-major order.
std::vector<std::int64_t> read_ids(const Tensor& ids) { return ids.detach().to_vector<std::int64_t>(); }

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
Tensor embedding_forward(const Tensor& weight, const std::vector<std::int64_t>& ids,
                         const Shape& out_shape) {
  NoGradGuard ng;
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

// grad[v] = sum of g rows k with ids[k] == v, added in increasing k. The rows
// are grouped by id (a stable counting sort), then each touched row is summed
// by one thread: no atomics, and the same order for any thread count.
Tensor embedding_backward(const Tensor& g, const Tensor& ids_t, std::int64_t vocab, std::int64_t d,
                          DType dtype) {
  NoGradGuard ng;
  const std::vector<std::int64_t> ids = read_ids(ids_t);  // checked by the forward
  const std::int64_t n = std::int64_t(ids.size());
  std::vector<std::int64_t> start(std::size_t(vocab) + 1, 0);
  for (std::int64_t v : ids) ++start[std::size_t(v) + 1];
  std::vector<std::int64_t> touched;
  for (std::int64_t v = 0; v < vocab; ++v) {
    if (start[std::size_t(v) + 1] > 0) touched.push_back(v);
    start[std::size_t(v) + 1] += start[std::size_t(v)];
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  {
    std::vector<std::int64_t> cursor(start.begin(), start.end() - 1);
    for (std::int64_t k = 0; k < n; ++k) order[std::size_t(cursor[std::size_t(ids[std::size_t(k)])]++)] = k;
  }
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
  check_cpu("embedding", weight);
  check_cpu("embedding", ids);
  REMAT_CHECK(weight.dim() == 2, ShapeError, "embedding: weight must be [V, d], got ",
              describe(weight));
  const std::int64_t vocab = weight.size(0), d = weight.size(1);
  const std::vector<std::int64_t> idv = read_ids(ids);
  check_ids(idv, weight);
  Shape out_shape = ids.sizes();
  out_shape.push_back(d);
  return dispatch1("embedding", {weight, ids}, [&] {
    Tensor out = embedding_forward(weight, idv, out_shape);
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
