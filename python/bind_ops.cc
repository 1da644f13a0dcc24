// The op set as module functions (remat.matmul, remat.softmax, ...) and as
// Tensor operators and methods (a + b, a @ b, t.sum()). Every function is
// the C++ op itself (ops/ops.h): differentiable, dispatched through the op
// table, seen by hooks, policies and checkpoint replays.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine/tensor.h"
#include "ops/ops.h"
#include "python/bindings.h"

namespace remat::python {
namespace {

// Dims for sum/mean: None (all), an int or a sequence.
Shape dims_arg(const py::object& dims) { return dims.is_none() ? Shape{} : shape_arg(dims); }

Tensor reduce(const Tensor& x, const py::object& dims, bool keepdim, bool is_mean) {
  if (dims.is_none()) return is_mean ? mean(x) : sum(x);
  return is_mean ? mean(x, dims_arg(dims), keepdim) : sum(x, dims_arg(dims), keepdim);
}

// scalar / t and scalar - t.
Tensor rdiv(const Tensor& t, double s) { return div(full(t.sizes(), s, TensorOptions(t.dtype(), t.device())), t); }

void bind_operators(py::module_& m) {
  py::class_<Tensor> c = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));
  c.def("__add__", [](const Tensor& a, const Tensor& b) { return add(a, b); }, py::is_operator())
      .def("__add__", [](const Tensor& a, double s) { return add(a, s); }, py::is_operator())
      .def("__radd__", [](const Tensor& a, double s) { return add(a, s); }, py::is_operator())
      .def("__sub__", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, py::is_operator())
      .def("__sub__", [](const Tensor& a, double s) { return sub(a, s); }, py::is_operator())
      .def("__rsub__", [](const Tensor& a, double s) { return rsub(a, s); }, py::is_operator())
      .def("__mul__", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, py::is_operator())
      .def("__mul__", [](const Tensor& a, double s) { return mul(a, s); }, py::is_operator())
      .def("__rmul__", [](const Tensor& a, double s) { return mul(a, s); }, py::is_operator())
      .def("__truediv__", [](const Tensor& a, const Tensor& b) { return div(a, b); }, py::is_operator())
      .def("__truediv__", [](const Tensor& a, double s) { return div(a, s); }, py::is_operator())
      .def("__rtruediv__", [](const Tensor& a, double s) { return rdiv(a, s); }, py::is_operator())
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, py::is_operator())
      .def("__neg__", [](const Tensor& a) { return neg(a); })
      .def("__pow__", [](const Tensor& a, double p) { return pow(a, p); }, py::is_operator())
      .def("__iadd__", [](Tensor& a, const Tensor& b) -> Tensor& { return add_(a, b); }, py::is_operator())
      .def("__imul__", [](Tensor& a, double s) -> Tensor& { return mul_(a, s); }, py::is_operator())
      .def("sum", [](const Tensor& x, const py::object& d, bool k) { return reduce(x, d, k, false); },
           py::arg("dim") = py::none(), py::arg("keepdim") = false)
      .def("mean", [](const Tensor& x, const py::object& d, bool k) { return reduce(x, d, k, true); },
           py::arg("dim") = py::none(), py::arg("keepdim") = false)
      .def("amax", &amax, py::arg("dim"), py::arg("keepdim") = false)
      .def("exp", &exp).def("log", &log).def("sqrt", &sqrt).def("abs", &abs).def("relu", &relu)
      .def("sigmoid", &sigmoid).def("tanh", &tanh)
      .def("softmax", &softmax, py::arg("dim") = -1)
      .def("matmul", &matmul, py::arg("other"));
}

void bind_elementwise(py::module_& m) {
  m.def("add", py::overload_cast<const Tensor&, const Tensor&>(&add), py::arg("a"), py::arg("b"));
  m.def("sub", py::overload_cast<const Tensor&, const Tensor&>(&sub), py::arg("a"), py::arg("b"));
  m.def("mul", py::overload_cast<const Tensor&, const Tensor&>(&mul), py::arg("a"), py::arg("b"));
  m.def("div", py::overload_cast<const Tensor&, const Tensor&>(&div), py::arg("a"), py::arg("b"));
  m.def("neg", &neg, py::arg("x"));
  m.def("exp", &exp, py::arg("x"));
  m.def("log", &log, py::arg("x"));
  m.def("sqrt", &sqrt, py::arg("x"));
  m.def("rsqrt", &rsqrt, py::arg("x"));
  m.def("pow", &pow, py::arg("x"), py::arg("exponent"));
  m.def("abs", &abs, py::arg("x"));
  m.def("relu", &relu, py::arg("x"));
  m.def("gelu", &gelu, py::arg("x"));
  m.def("silu", &silu, py::arg("x"));
  m.def("sigmoid", &sigmoid, py::arg("x"));
  m.def("tanh", &tanh, py::arg("x"));
  m.def("swiglu", &swiglu, py::arg("gate"), py::arg("up"));
  m.def("cast", &cast, py::arg("x"), py::arg("dtype"));
  m.def("dropout", [](const Tensor& x, double p, bool training) { return dropout(x, p, training); },
        py::arg("x"), py::arg("p"), py::arg("training") = true);
}

void bind_layers(py::module_& m) {
  m.def("matmul", &matmul, py::arg("a"), py::arg("b"));
  m.def("bmm", &bmm, py::arg("a"), py::arg("b"));
  m.def("linear", [](const Tensor& x, const Tensor& w, const py::object& b) {
    return linear(x, w, b.is_none() ? Tensor() : b.cast<Tensor>());
  }, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), "x @ weight.T (+ bias)");
  m.def("sum", [](const Tensor& x, const py::object& d, bool k) { return reduce(x, d, k, false); }, py::arg("x"),
        py::arg("dim") = py::none(), py::arg("keepdim") = false);
  m.def("mean", [](const Tensor& x, const py::object& d, bool k) { return reduce(x, d, k, true); }, py::arg("x"),
        py::arg("dim") = py::none(), py::arg("keepdim") = false);
  m.def("amax", &amax, py::arg("x"), py::arg("dim"), py::arg("keepdim") = false);
  m.def("softmax", &softmax, py::arg("x"), py::arg("dim") = -1);
  m.def("log_softmax", &log_softmax, py::arg("x"), py::arg("dim") = -1);
  m.def("rms_norm", &rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps") = 1e-5);
  m.def("layer_norm", &layer_norm, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps") = 1e-5);
  m.def("embedding", &embedding, py::arg("weight"), py::arg("ids"));
  m.def("cross_entropy", &cross_entropy, py::arg("logits"), py::arg("targets"), py::arg("ignore_index") = -100);
  m.def("linear_cross_entropy", &linear_cross_entropy, py::arg("h"), py::arg("weight"), py::arg("targets"),
        py::arg("chunk"), py::arg("ignore_index") = -100,
        "cross_entropy(linear(h, weight), targets) computed `chunk` rows at a time: the full logits are never held.");
  m.def("rotary_embedding", &rotary_embedding, py::arg("x"), py::arg("theta") = 10000.0,
        py::arg("position_offset") = 0);
  m.def("scaled_dot_product_attention", &scaled_dot_product_attention, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("causal") = true, py::arg("scale") = 0.0);
  m.def("cat", &cat, py::arg("tensors"), py::arg("dim") = 0);
  m.def("stack", &stack, py::arg("tensors"), py::arg("dim") = 0);
  m.def("index_select", &index_select, py::arg("x"), py::arg("dim"), py::arg("index"));
  m.def("gather", &gather, py::arg("x"), py::arg("dim"), py::arg("index"));
  m.def("topk", [](const Tensor& x, std::int64_t k, std::int64_t dim) { return topk(x, k, dim); }, py::arg("x"),
        py::arg("k"), py::arg("dim") = -1, "(values, indices) of the k largest along dim.");
}

}  // namespace

void bind_ops(py::module_& m) {
  bind_operators(m);
  bind_elementwise(m);
  bind_layers(m);
}

}  // namespace remat::python
