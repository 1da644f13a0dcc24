// Elementwise arithmetic with numpy broadcasting: add, sub, mul, div, and
// their scalar forms. Floating dtypes; both operands must share dtype and
// device. Gradients reduce over broadcast dims back to each operand's shape.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "ops/kernel_table.h"

namespace remat {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// a + s, a - s, a * s, a / s, and s - a (rsub) for a scalar s.
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
Tensor rsub(const Tensor& a, double s);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(a, s); }

enum class BinaryFn : std::uint8_t { add, sub, mul, div };

// The kernels a device registers for the arithmetic ops.
struct BinaryKernels {
  // out = a (f) b with broadcasting (shapes already checked), a and b in any layout.
  Tensor (*binary)(BinaryFn f, const Tensor& a, const Tensor& b);
  // out = a (f) s, or s (f) a when scalar_first; s is already rounded to a's dtype.
  Tensor (*scalar)(BinaryFn f, const Tensor& a, float s, bool scalar_first);
};
KernelTable<BinaryKernels>& binary_kernels();

}  // namespace remat
