#include "ops/kernel_util.h"

#include <sstream>


namespace remat::ops_detail {

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream os;
  os << shape_str(t.sizes()) << ' ' << t.dtype() << ' ' << t.device();
  return os.str();
}

void check_defined(const char* op, const Tensor& t, const char* what) {
  REMAT_CHECK(t.defined(), Error, op, ": ", what, " is an undefined tensor");
}

void check_floating(const char* op, const Tensor& t, const char* what) {
  check_defined(op, t, what);
  REMAT_CHECK(is_floating(t.dtype()), DTypeError, op, ": ", what, " must be floating (f32, bf16, ",
              "f16), got ", describe(t));
}

void check_index(const char* op, const Tensor& t, const char* what) {
  check_defined(op, t, what);
  REMAT_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, DTypeError, op, ": ", what,
              " must be an index tensor (i32 or i64), got ", describe(t));
}

void check_same(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "first operand");
  check_defined(op, b, "second operand");
  REMAT_CHECK(a.dtype() == b.dtype(), DTypeError, op, ": operands have different dtypes: ",
              describe(a), " and ", describe(b), " (cast one with .to(dtype))");
  REMAT_CHECK(a.device() == b.device(), DeviceError, op, ": operands are on different devices: ",
              describe(a), " and ", describe(b));
}

Tensor contiguous_detached(const Tensor& t) {
  Tensor d = t.detach();
  return d.is_contiguous() ? d : d.contiguous();
}

void check_dim(const char* op, const Tensor& t, std::int64_t n, const char* what) {
  REMAT_CHECK(t.dim() == n, ShapeError, op, ": ", what, " must have ", n, " dims, got ",
              describe(t));
}

Tensor f32_contiguous(const Tensor& t) {
  Tensor c = t.dtype() == DType::f32 ? t : t.detach().to(DType::f32);
  return c.is_contiguous() ? c : c.detach().contiguous();
}

Tensor from_f32(const Tensor& t, DType dtype) { return dtype == DType::f32 ? t : t.to(dtype); }

std::int64_t read_class_targets(const char* op, const Tensor& targets, std::int64_t classes,
                                std::int64_t ignore_index, std::vector<std::int64_t>& out) {
  if (targets.device().is_meta()) {  // meta: shapes only, and every target counts (no padding)
    mirror_host_read(targets, DType::i64);
    out.assign(std::size_t(targets.numel()), 0);
    return targets.numel();
  }
  out = targets.detach().to_vector<std::int64_t>();
  const auto n = std::int64_t(out.size());
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t v = out[std::size_t(i)];
    if (v == ignore_index) continue;
    REMAT_CHECK(v >= 0 && v < classes, ShapeError, op, ": target ", v, " at position ", i, " is out of range for ",
                classes, " classes (expected 0..", classes - 1, " or ignore_index ", ignore_index, ")");
    ++count;
  }
  return count;
}

double mean_of_row_losses(const float* row_loss, std::int64_t rows, std::int64_t count) {
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) total += double(row_loss[r]);
  return count > 0 ? total / double(count) : 0.0;
}

}  // namespace remat::ops_detail
