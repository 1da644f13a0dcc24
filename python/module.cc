// The `remat` Python module: one extension over the same library the C++
// API is (api/remat.h); no second engine behind it. Each part of the API is
// bound in its own file (python/bindings.h lists them).
#include <pybind11/pybind11.h>

#include "python/bindings.h"

namespace remat::python {

PyRef::PyRef(py::object obj)
    : obj_(new py::object(std::move(obj)), [](py::object* p) {
        // (the shared_ptr owns `p` from here: a deleter that takes the GIL)
        std::unique_ptr<py::object> owned(p);
        if (!Py_IsInitialized()) {  // the interpreter is gone: nothing to decrement
          owned->release();
          return;
        }
        py::gil_scoped_acquire gil;
        owned.reset();
      }) {}

DType dtype_arg(const py::handle& obj) {
  if (py::isinstance<DType>(obj)) return obj.cast<DType>();
  if (py::isinstance<py::str>(obj)) {
    return parse_dtype(obj.cast<std::string>());
  }
  throw py::type_error("a dtype is a remat.dtype or its name (\"f32\", \"bf16\", ...), not a " +
                       std::string(py::str(obj.get_type().attr("__name__"))));
}

Device device_arg(const py::handle& obj) {
  if (py::isinstance<Device>(obj)) return obj.cast<Device>();
  if (py::isinstance<py::str>(obj)) return Device::parse(obj.cast<std::string>());
  throw py::type_error("a device is a remat.Device or its name (\"cpu\", \"cuda:0\", \"meta\"), not a " +
                       std::string(py::str(obj.get_type().attr("__name__"))));
}

// An int, a NumPy integer, anything with __index__ (not a bool).
bool is_index(const py::handle& obj) { return PyIndex_Check(obj.ptr()) && !py::isinstance<py::bool_>(obj); }

Shape shape_arg(const py::handle& obj) {
  if (is_index(obj)) return {py::int_(py::reinterpret_borrow<py::object>(obj)).cast<std::int64_t>()};
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj))
    throw py::type_error("a shape is an int or a sequence of ints, not a " +
                         std::string(py::str(obj.get_type().attr("__name__"))));
  Shape s;
  for (const py::handle& d : obj) {
    if (!is_index(d)) throw py::type_error("a shape's entries are ints, not " + std::string(py::repr(d)));
    s.push_back(py::int_(py::reinterpret_borrow<py::object>(d)).cast<std::int64_t>());
  }
  return s;
}

py::tuple shape_tuple(const Shape& s) {
  py::tuple t(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) t[i] = py::int_(s[i]);
  return t;
}

std::vector<Tensor> tensors_from_result(const py::object& result, const std::string& what) {
  if (py::isinstance<Tensor>(result)) return {result.cast<Tensor>()};
  if (py::isinstance<py::tuple>(result) || py::isinstance<py::list>(result)) {
    std::vector<Tensor> out;
    for (const py::handle& h : result) {
      if (h.is_none()) {
        out.emplace_back();
        continue;
      }
      if (!py::isinstance<Tensor>(h))
        throw py::type_error(what + " must return remat.Tensor values (or None), got a " +
                             std::string(py::str(h.get_type().attr("__name__"))));
      out.push_back(h.cast<Tensor>());
    }
    return out;
  }
  throw py::type_error(what + " must return a remat.Tensor or a tuple of them, got a " +
                       std::string(py::str(result.get_type().attr("__name__"))));
}

py::object tensors_to_result(const std::vector<Tensor>& tensors) {
  if (tensors.size() == 1) return py::cast(tensors[0]);
  py::tuple t(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) t[i] = py::cast(tensors[i]);
  return t;
}

}  // namespace remat::python

PYBIND11_MODULE(remat, m) {
  using namespace remat::python;
  m.doc() = "remat: a tensor and autograd engine whose saved tensors are first-class (docs/PYTHON.md)";
  bind_errors(m);
  bind_tensor(m);
  bind_dlpack(m);
  bind_ops(m);
  bind_autograd(m);
  bind_checkpoint(m);
  bind_memory(m);
  bind_models(m);
  bind_training(m);
}
