// Printing a Tensor: values in nested brackets (long dims elided), then its
// shape, dtype and device.
#include <cstdio>
#include <ostream>
#include <string>

#include "engine/tensor.h"
#include "engine/tensor_internal.h"

namespace remat {

// ---------------------------------------------------------------------------
// Printing

namespace {
void format_value(std::ostream& os, DType t, double v) {
  char buf[32];
  if (t == DType::boolean)
    std::snprintf(buf, sizeof buf, "%s", v != 0.0 ? "true" : "false");
  else if (!is_floating(t) && t != DType::fp8_e4m3)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  else
    std::snprintf(buf, sizeof buf, "%.5g", v);
  os << buf;
}

// Prints dim `d` of `c` (contiguous, CPU) starting at element `base`; dims
// longer than 2*edge+1 show `edge` items at each end.
void print_dim(std::ostream& os, const Tensor& c, std::size_t d, std::int64_t base,
               const Shape& st, int indent, std::int64_t edge) {
  const std::int64_t n = c.sizes()[d];
  os << '[';
  const bool elide = n > 2 * edge + 1;
  for (std::int64_t i = 0; i < n; ++i) {
    if (elide && i == edge) {
      os << "...";
      i = n - edge - 1;
      os << (d + 1 == c.sizes().size() ? ", " : ",\n" + std::string(std::size_t(indent + 1), ' '));
      continue;
    }
    if (d + 1 == c.sizes().size())
      format_value(os, c.dtype(), detail::read_element(c, base + i * st[d]));
    else
      print_dim(os, c, d + 1, base + i * st[d], st, indent + 1, edge);
    if (i + 1 < n)
      os << (d + 1 == c.sizes().size() ? ", " : ",\n" + std::string(std::size_t(indent + 1), ' '));
  }
  os << ']';
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  detail::check_has_values(t, "printing values");
  Tensor c = t.to(kCPU).contiguous();
  os << "tensor(";
  if (c.dim() == 0) {
    format_value(os, c.dtype(), c.item());
  } else if (c.numel() == 0) {
    os << "[]";
  } else {
    const std::int64_t edge = c.numel() > 1000 ? 3 : 1 << 30;
    print_dim(os, c, 0, c.storage_offset(), c.strides(), 7, edge);
  }
  return os << ", shape=" << shape_str(t.sizes()) << ", dtype=" << t.dtype()
            << ", device=" << t.device() << ')';
}

}  // namespace remat
