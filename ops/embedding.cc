// embedding: its definition and CPU kernels.
#include "ops/embedding.h"

#include <cstring>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/op.h"

namespace remat {

using namespace ops_detail;

KernelTable<EmbeddingKernels>& embedding_kernels() {
  static KernelTable<EmbeddingKernels> t("embedding");
  return t;
}

std::vector<std::int64_t> host_ids(const Tensor& ids) {
  if (ids.device().is_meta()) {  // meta: shapes only (the read's copies on meta, no values)
    mirror_host_read(ids, DType::i64);
    return {};
  }
  return ids.detach().to(kCPU).to_vector<std::int64_t>();
}

IdGroups group_ids(const std::vector<std::int64_t>& ids, std::int64_t vocab) {
  const std::int64_t n = std::int64_t(ids.size());
  IdGroups r;
  r.start.assign(std::size_t(vocab) + 1, 0);
  for (std::int64_t v : ids) {
    // Checked by the forward; checked again here as the lists are built from it.
    REMAT_CHECK(v >= 0 && v < vocab, ShapeError, "embedding backward: id ", v, " is out of range for a table of ",
                vocab, " rows");
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

namespace {

// ---------------------------------------------------------------------------
// The op

void check(const OpDef& op, const std::vector<Tensor>& in, const NoState&) {
  const Tensor &weight = in[0], &ids = in[1];
  check_floating(op.name(), weight, "weight");
  check_index(op.name(), ids, "ids");
  REMAT_CHECK(ids.device() == weight.device(), DeviceError, op.name(), ": ids ", describe(ids), " and weight ",
              describe(weight), " must be on one device");
  REMAT_CHECK(weight.dim() == 2, ShapeError, op.name(), ": weight must be [V, d], got ", describe(weight));
}

OpResults forward(const std::vector<Tensor>& in, NoState&) {
  const Tensor &weight = in[0], &ids = in[1];
  const std::vector<std::int64_t> idv = host_ids(ids);  // none on meta: shapes only
  const std::int64_t vocab = weight.size(0);
  for (std::size_t i = 0; i < idv.size(); ++i)
    REMAT_CHECK(idv[i] >= 0 && idv[i] < vocab, ShapeError, "embedding: id ", idv[i], " at position ", i,
                " is out of range for a table of ", vocab, " rows (weight ", describe(weight),
                "; expected ids in 0..", vocab - 1, ")");
  Shape out_shape = ids.sizes();
  out_shape.push_back(weight.size(1));
  return {{embedding_kernels().run(weight.device(), &EmbeddingKernels::forward, weight, ids, idv, out_shape)}};
}

std::vector<Tensor> backward(const OpBackward<NoState>& b) {
  const Shape& w = b.input(0).sizes;
  return {embedding_kernels().run(b.grad().device(), &EmbeddingKernels::backward, b.grad(), b.saved("ids"), w[0],
                                  w[1], b.input(0).dtype),
          Tensor()};
}

OpCost cost(const std::vector<Tensor>& in, const NoState&) {
  return {0, 0, 2 * double(in[1].numel()) * double(in[0].size(1)) * double(element_size(in[0].dtype()))};
}

const Op<> kEmbedding({.name = "embedding",
                       .inputs = {"weight", "ids"},
                       .outputs = {{"out"}},
                       .saves = {{"ids", SaveFrom::input, 1}},
                       .summary = "rows of a table gathered by integer ids"},
                      {.check = check, .forward = forward, .backward = backward, .cost = cost},
                      &embedding_kernels());

// ---------------------------------------------------------------------------
// CPU kernels (rows copied in the weight's dtype; gradients summed in f32)

Tensor forward_cpu(const Tensor& weight, const Tensor&, const std::vector<std::int64_t>& ids,
                   const Shape& out_shape) {
  Tensor w = weight.detach().contiguous();
  const std::int64_t d = w.size(1);
  Tensor out = empty(out_shape, weight.dtype());
  if (skip_compute(out)) return out;
  const std::size_t row_bytes = std::size_t(d) * element_size(w.dtype());
  const char* src = static_cast<const char*>(w.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  parallel_rows(std::int64_t(ids.size()), d, [&](std::int64_t k0, std::int64_t k1) {
    for (std::int64_t k = k0; k < k1; ++k)
      std::memcpy(dst + std::size_t(k) * row_bytes, src + std::size_t(ids[std::size_t(k)]) * row_bytes, row_bytes);
  });
  return out;
}

// grad[v] = sum of g rows k with ids[k] == v, added in increasing k. The rows
// are grouped by id (a stable counting sort), then each touched row is summed
// by one thread: no atomics, and the same order for any thread count.
Tensor backward_cpu(const Tensor& g, const Tensor& ids_t, std::int64_t vocab, std::int64_t d, DType) {
  const std::vector<std::int64_t> ids = host_ids(ids_t);  // checked by the forward (none on meta)
  Tensor gf = f32_contiguous(g);
  Tensor grad = zeros({vocab, d}, DType::f32);
  if (skip_compute(grad)) return grad;
  const std::int64_t n = std::int64_t(ids.size());
  const IdGroups grp = group_ids(ids, vocab);
  const std::vector<std::int64_t>& start = grp.start;
  const std::vector<std::int64_t>& touched = grp.touched;
  const std::vector<std::int64_t>& order = grp.order;
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
  return grad;
}

// Native: the forward copies rows bit for bit; the backward sums in f32 itself.
const KernelRegistration<EmbeddingKernels> kCpu(embedding_kernels(), DeviceType::CPU, {forward_cpu, backward_cpu},
                                                KernelDTypes::native);

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) { return kEmbedding.call1({weight, ids}); }

}  // namespace remat
