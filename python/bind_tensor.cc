// remat.Tensor, dtypes and devices, factories, and NumPy in and out.
//
// NumPy interop is zero-copy both ways for CPU tensors: a Tensor exports the
// buffer protocol (np.asarray(t) and t.numpy() view its elements, keeping it
// alive), and remat.from_numpy(a) wraps a writable array's buffer as a
// tensor's storage (engine/tensor.h from_blob), holding the buffer until the
// last view goes. bf16 and fp8 have no NumPy dtype: exporting them is a
// DTypeError that says to convert first.
#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <sstream>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "ops/ops.h"
#include "python/bindings.h"

namespace remat::python {
namespace {

// The buffer-protocol format of a dtype NumPy has.
std::string buffer_format(DType t) {
  switch (t) {
    case DType::f32: return py::format_descriptor<float>::format();
    case DType::f16: return "e";
    case DType::i32: return py::format_descriptor<std::int32_t>::format();
    case DType::i64: return py::format_descriptor<std::int64_t>::format();
    case DType::boolean: return "?";
    default:
      throw DTypeError(std::string("a ") + dtype_name(t) + " tensor has no NumPy dtype: convert it first, e.g. "
                       "t.to(remat.f32).numpy()");
  }
}

// The dtype of a buffer's format and item size (DTypeError for the others).
DType buffer_dtype(const py::buffer_info& b) {
  const std::string& f = b.format;
  if (!f.empty() && (f[0] == '>' || f[0] == '!'))  // (this build is little-endian: x86-64)
    throw DTypeError("remat.from_numpy: a big-endian array (format '" + f + "') would be misread; convert it to "
                     "the native byte order first, e.g. a.astype(a.dtype.newbyteorder('='))");
  const char c = f.empty() ? '?' : f.back();  // (a leading byte-order mark such as '<' or '=')
  if (c == 'f' && b.itemsize == 4) return DType::f32;
  if (c == 'e' && b.itemsize == 2) return DType::f16;
  if ((c == 'i' || c == 'l') && b.itemsize == 4) return DType::i32;
  if ((c == 'l' || c == 'q') && b.itemsize == 8) return DType::i64;
  if (c == '?' && b.itemsize == 1 && !f.empty()) return DType::boolean;
  throw DTypeError("remat.from_numpy: arrays of format '" + f + "' (" + std::to_string(b.itemsize) +
                   "-byte items) have no remat dtype; remat takes float32, float16, int32, int64 and bool "
                   "(convert, e.g. a.astype(numpy.float32))");
}

// The description of a CPU tensor's elements for NumPy. A tensor that
// requires grad is refused: writes through NumPy would bypass the version
// counter that keeps saved tensors honest.
py::buffer_info tensor_buffer(const Tensor& t) {
  REMAT_CHECK(t.device().is_cpu(), DeviceError, "a tensor on ", t.device().str(),
              " cannot be viewed from NumPy: copy it to the CPU first (t.to(\"cpu\"))");
  REMAT_CHECK(!t.requires_grad(), AutogradError, "a tensor that requires grad (shape ", shape_str(t.sizes()),
              ") cannot be viewed from NumPy, whose writes autograd would not see: use t.detach().numpy()");
  const std::string format = buffer_format(t.dtype());
  const auto item = py::ssize_t(element_size(t.dtype()));
  std::vector<py::ssize_t> shape, strides;
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    shape.push_back(t.size(d));
    strides.push_back(t.stride(d) * item);
  }
  return py::buffer_info(t.numel() == 0 ? nullptr : t.raw_data(), item, format, py::ssize_t(t.dim()), shape,
                         strides, /*readonly=*/false);
}

// The buffer protocol, by hand: pybind11 2.10's def_buffer lets an
// exception thrown while describing the buffer (a bf16 tensor, a CUDA one)
// escape a C callback and abort the interpreter; here it becomes the Python
// error it stands for. The view keeps the tensor object (view->obj) and,
// through a detached handle, the storage itself: an in-place move of the
// tensor (Module::to, convert_) must not free memory a view still reads.
struct BufferView {
  py::buffer_info info;
  Tensor pinned;
};

extern "C" int tensor_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
  view->obj = nullptr;
  try {
    const Tensor& t = py::handle(obj).cast<const Tensor&>();
    auto internal = std::make_unique<BufferView>(BufferView{tensor_buffer(t), t.detach()});
    py::buffer_info* info = &internal->info;
    const bool c_order_only = (flags & PyBUF_STRIDES) != PyBUF_STRIDES ||
                              (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS ||
                              (flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS;
    const bool f_order = (flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && (flags & PyBUF_ANY_CONTIGUOUS) !=
                         PyBUF_ANY_CONTIGUOUS;
    if ((c_order_only && !t.is_contiguous()) || (f_order && (t.dim() > 1 || !t.is_contiguous())))
      throw py::buffer_error("the consumer asked for a contiguous buffer and this tensor of shape " +
                             shape_str(t.sizes()) + " with strides " + shape_str(t.strides()) +
                             " is not (t.contiguous() is)");
    view->buf = info->ptr;
    view->len = info->itemsize * info->size;
    view->itemsize = info->itemsize;
    view->readonly = 0;
    view->ndim = int(info->ndim);
    view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT ? const_cast<char*>(info->format.c_str()) : nullptr;
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? info->shape.data() : nullptr;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? info->strides.data() : nullptr;
    view->suboffsets = nullptr;
    view->internal = internal.release();  // (owned by the view: tensor_releasebuffer)
    view->obj = obj;
    Py_INCREF(obj);
    return 0;
  } catch (...) {
    set_python_error(std::current_exception());
    return -1;
  }
}

extern "C" void tensor_releasebuffer(PyObject*, Py_buffer* view) {
  std::unique_ptr<BufferView> owned(static_cast<BufferView*>(view->internal));
}

// A NumPy array over a CPU tensor's elements, no copy; its base is a
// detached handle, which keeps the storage (see BufferView).
py::array tensor_to_numpy(const py::object& self) {
  const Tensor& t = self.cast<const Tensor&>();
  const py::buffer_info b = tensor_buffer(t);
  return py::array(py::dtype(b), b.shape, b.strides, b.ptr, py::cast(t.detach()));
}

// `p` owned through a shared_ptr<void> whose deleter takes the GIL (a
// keeper remat may drop on any thread; leaked after the interpreter ends).
template <typename T>
std::shared_ptr<void> gil_owned(std::unique_ptr<T> p) {
  return std::shared_ptr<void>(p.release(), [](void* raw) {
    std::unique_ptr<T> owned(static_cast<T*>(raw));
    if (!Py_IsInitialized()) {
      (void)owned.release();
      return;
    }
    py::gil_scoped_acquire gil;
    owned.reset();
  });
}

// The tensor over `buffer`'s memory, no copy; it keeps the buffer (and so
// the exporting object) until its last view goes.
Tensor from_buffer(const py::buffer& buffer) {
  auto info = std::make_unique<py::buffer_info>(buffer.request(/*writable=*/false));
  const DType dtype = buffer_dtype(*info);
  Shape sizes, strides;
  for (py::ssize_t d = 0; d < info->ndim; ++d) {
    const py::ssize_t st = info->strides[std::size_t(d)];
    REMAT_CHECK(st >= 0 && st % info->itemsize == 0, ShapeError, "remat.from_numpy: stride ", st,
                " bytes of dim ", d, " is negative or not a multiple of the ", info->itemsize,
                "-byte item (copy the array first: numpy.ascontiguousarray(a))");
    sizes.push_back(info->shape[std::size_t(d)]);
    strides.push_back(st / info->itemsize);
  }
  void* data = info->ptr;
  // Copied while we hold it: a read-only buffer (remat's tensors are
  // writable) or a misaligned one (the kernels assume aligned elements).
  if (info->readonly || reinterpret_cast<std::uintptr_t>(data) % std::uintptr_t(info->itemsize) != 0)
    return from_blob(data, sizes, strides, dtype, std::make_shared<int>(0)).clone();
  return from_blob(data, sizes, strides, dtype, gil_owned(std::move(info)));
}

// remat.tensor(data): a copy of a buffer, a nested list or a number.
Tensor tensor_from_data(const py::object& data, const py::object& dtype, bool requires_grad) {
  Tensor t;
  if (py::isinstance<Tensor>(data)) {
    t = data.cast<Tensor>().detach().clone();
  } else {
    // Through NumPy: Python floats (and float64 arrays) become f32, remat's
    // default floating dtype; ints int64.
    py::module_ np = py::module_::import("numpy");
    py::object array = np.attr("asarray")(data);
    const py::object dt = array.attr("dtype");
    if (std::string(py::str(dt.attr("kind"))) == "f" && dt.attr("itemsize").cast<int>() == 8)
      array = array.attr("astype")(np.attr("float32"));
    t = from_buffer(array.cast<py::buffer>()).clone();
  }
  if (!dtype.is_none()) t = t.to(dtype_arg(dtype));
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

std::string tensor_repr(const Tensor& t) {
  if (!t.defined()) return "remat.Tensor(undefined)";
  std::ostringstream os;
  os << t;
  return os.str();
}

// t[key] for key an int, a slice (step >= 1) or a tuple of them, one per
// leading dim: a view (select for ints, slice for slices).
Tensor index_view(const Tensor& t, const py::object& key) {
  const py::tuple keys = py::isinstance<py::tuple>(key) ? key.cast<py::tuple>() : py::make_tuple(key);
  REMAT_CHECK(std::int64_t(keys.size()) <= t.dim(), ShapeError, "index: ", keys.size(), " indices for a tensor of shape ",
              shape_str(t.sizes()));
  Tensor v = t;
  std::int64_t d = 0;  // the dim of v the next key indexes
  for (const py::handle& k : keys) {
    if (py::isinstance<py::bool_>(k))
      throw py::type_error("a tensor index is an int or a slice; a bool (" + std::string(py::repr(k)) + ") is neither");
    if (PyIndex_Check(k.ptr())) {  // an int, a NumPy integer, anything with __index__
      std::int64_t i = py::int_(py::reinterpret_borrow<py::object>(k)).cast<std::int64_t>();
      const std::int64_t n = v.size(d);
      if (i < -n || i >= n)  // IndexError: what ends Python's iteration over t
        throw py::index_error("index " + std::to_string(i) + " is out of range for dim " + std::to_string(d) +
                              " of size " + std::to_string(n) + " (shape " + shape_str(t.sizes()) + ")");
      v = v.select(d, i < 0 ? i + n : i);
    } else if (py::isinstance<py::slice>(k)) {
      py::ssize_t start = 0, stop = 0, step = 0, len = 0;
      if (!k.cast<py::slice>().compute(py::ssize_t(v.size(d)), &start, &stop, &step, &len))
        throw py::error_already_set();
      REMAT_CHECK(step >= 1, ShapeError, "index: slice step ", step, " (remat's views take steps >= 1)");
      v = v.slice(d, start, start + len * step - (len > 0 ? step - 1 : 0), step);
      ++d;
    } else {
      throw py::type_error("a tensor index is an int, a slice or a tuple of them, not " + std::string(py::repr(k)));
    }
  }
  return v;
}

// view(2, 3), view((2, 3)) and view(6) alike.
Shape sizes_args(const py::args& s) { return s.size() == 1 ? shape_arg(s[0]) : shape_arg(s); }

void bind_tensor_views(py::class_<Tensor>& c) {
  c.def("view", [](const Tensor& t, const py::args& s) { return t.view(sizes_args(s)); })
      .def("reshape", [](const Tensor& t, const py::args& s) { return t.reshape(sizes_args(s)); })
      .def("permute", [](const Tensor& t, const py::args& s) { return t.permute(sizes_args(s)); })
      .def("expand", [](const Tensor& t, const py::args& s) { return t.expand(sizes_args(s)); })
      .def("transpose", &Tensor::transpose, py::arg("dim0"), py::arg("dim1"))
      .def("t", &Tensor::t)
      .def_property_readonly("T", &Tensor::t)
      .def("narrow", &Tensor::narrow, py::arg("dim"), py::arg("start"), py::arg("length"))
      .def("select", &Tensor::select, py::arg("dim"), py::arg("index"))
      .def("unsqueeze", &Tensor::unsqueeze, py::arg("dim"))
      .def("squeeze", [](const Tensor& t, std::optional<std::int64_t> d) { return d ? t.squeeze(*d) : t.squeeze(); },
           py::arg("dim") = py::none())
      .def("flatten", &Tensor::flatten, py::arg("start_dim") = 0, py::arg("end_dim") = -1)
      .def("contiguous", &Tensor::contiguous)
      .def("clone", &Tensor::clone)
      .def("detach", &Tensor::detach)
      .def("to", [](const Tensor& t, const py::object& where) {
        if (py::isinstance<DType>(where)) return t.to(where.cast<DType>());
        if (py::isinstance<py::str>(where)) {
          const std::string s = where.cast<std::string>();
          if (s == "cpu" || s == "meta" || s.rfind("cuda", 0) == 0) return t.to(Device::parse(s));
        }
        if (py::isinstance<Device>(where)) return t.to(where.cast<Device>());
        return t.to(dtype_arg(where));
      }, py::arg("dtype_or_device"), "A copy in another dtype (remat.f32, \"bf16\", ...) or on another device "
         "(\"cpu\", \"cuda:0\"); the tensor itself if it already is.")
      .def("copy_", &Tensor::copy_, py::arg("src"), py::return_value_policy::reference_internal)
      .def("fill_", &Tensor::fill_, py::arg("value"), py::return_value_policy::reference_internal)
      .def("zero_", &Tensor::zero_, py::return_value_policy::reference_internal);
}

void bind_tensor_autograd(py::class_<Tensor>& c) {
  c.def_property("requires_grad", &Tensor::requires_grad,
                 [](Tensor& t, bool on) { t.set_requires_grad(on); })
      .def("requires_grad_", [](Tensor& t, bool on) -> Tensor& { return t.set_requires_grad(on); },
           py::arg("requires_grad") = true, py::return_value_policy::reference_internal)
      .def_property("grad", [](const Tensor& t) -> py::object {
                      Tensor g = t.grad();
                      return g.defined() ? py::cast(g) : py::none();
                    },
                    [](const Tensor& t, const py::object& g) { t.set_grad(g.is_none() ? Tensor() : g.cast<Tensor>()); })
      .def_property_readonly("is_leaf", &Tensor::is_leaf)
      .def_property_readonly("grad_fn", [](const Tensor& t) -> py::object {
        auto fn = t.grad_fn();
        return fn ? py::str(fn->name()) : py::object(py::none());
      }, "The name of the op that made this tensor (None for leaves).")
      .def("backward", [](const Tensor& t, const py::object& seed, bool retain) {
        const Tensor s = seed.is_none() ? Tensor() : seed.cast<Tensor>();
        py::gil_scoped_release nogil;  // hooks written in Python take it back
        t.backward(s, retain);
      }, py::arg("gradient") = py::none(), py::arg("retain_graph") = false)
      .def("register_hook", [](const Tensor& t, const py::function& fn) {
        PyRef hook(fn);
        t.register_hook([hook](const Tensor& g) -> Tensor {
          py::gil_scoped_acquire gil;
          py::object r = call_python(hook.get(), g);
          if (r.is_none()) return Tensor();
          if (!py::isinstance<Tensor>(r))
            throw py::type_error("a gradient hook must return a remat.Tensor or None, got a " +
                                 std::string(py::str(r.get_type().attr("__name__"))));
          return r.cast<Tensor>();
        });
      }, py::arg("hook"), "Calls hook(grad) when a gradient flows into this tensor; a Tensor it returns "
         "replaces the gradient.")
      .def_property_readonly("version", &Tensor::version);
}

void bind_tensor_class(py::module_& m) {
  py::class_<Tensor> c(m, "Tensor", py::buffer_protocol(),
                       "A handle to sizes, strides and an offset over shared storage (engine/tensor.h).");
  // The buffer slots are ours (tensor_getbuffer above), not pybind11's.
  PyBufferProcs* buffer = reinterpret_cast<PyTypeObject*>(c.ptr())->tp_as_buffer;
  buffer->bf_getbuffer = &tensor_getbuffer;
  buffer->bf_releasebuffer = &tensor_releasebuffer;
  c.def_property_readonly("shape", [](const Tensor& t) { return shape_tuple(t.sizes()); })
      .def("size", [](const Tensor& t, std::optional<std::int64_t> d) -> py::object {
        return d ? py::object(py::int_(t.size(*d))) : py::object(shape_tuple(t.sizes()));
      }, py::arg("dim") = py::none())
      .def_property_readonly("strides", [](const Tensor& t) { return shape_tuple(t.strides()); },
                             "Strides in elements (NumPy's are in bytes).")
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("ndim", &Tensor::dim)
      .def("dim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.raw_data()); })
      .def("numpy", &tensor_to_numpy, "The elements as a NumPy array over the same memory (CPU tensors; no copy).")
      .def("__array__", [](const py::object& self, const py::object& dtype, const py::object&) -> py::object {
        py::array a = tensor_to_numpy(self);
        return dtype.is_none() ? py::object(a) : a.attr("astype")(dtype);
      }, py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("item", &Tensor::item)
      .def("tolist", [](py::object self) {
        const Tensor t = self.cast<Tensor>().detach();
        py::object src = py::cast(t);
        if (!t.device().is_cpu() || t.dtype() == DType::bf16 || t.dtype() == DType::fp8_e4m3)
          src = py::cast(t.to(kCPU).to(DType::f32));
        return tensor_to_numpy(src).attr("tolist")();
      })
      .def("__len__", [](const Tensor& t) {
        if (t.dim() == 0) throw py::type_error("len() of a 0-dim tensor");
        return t.size(0);
      })
      .def("__repr__", &tensor_repr)
      .def("__bool__", [](const Tensor& t) {
        REMAT_CHECK(t.numel() == 1, ShapeError, "the truth value of a tensor of shape ", shape_str(t.sizes()),
                    " is ambiguous (one element needed)");
        return t.item() != 0;
      })
      .def("__float__", &Tensor::item)
      .def("__int__", [](const Tensor& t) {
        const double v = t.item();
        if (!std::isfinite(v) || v < -9.2233720368547758e18 || v >= 9.2233720368547758e18)
          throw py::value_error("int() of " + std::to_string(v) + ": not a finite value within int64");
        return std::int64_t(v);
      })
      .def_property_readonly_static("__array_ufunc__", [](const py::object&) { return py::none(); },
                                    "None: NumPy operators defer to remat's (t + array raises, not a silent ndarray)")
      .def("shares_memory", &Tensor::shares_storage_with, py::arg("other"));
  c.def("__getitem__", &index_view, py::arg("key"), "A view: ints select, slices (step >= 1) narrow.")
      .def("__setitem__", [](const Tensor& t, const py::object& key, const py::object& value) {
        Tensor v = index_view(t, key);
        if (py::isinstance<Tensor>(value))
          v.copy_(value.cast<Tensor>());
        else
          v.fill_(value.cast<double>());
      }, py::arg("key"), py::arg("value"), "Writes a number or a tensor (broadcast) into the view t[key].");
  bind_tensor_views(c);
  bind_tensor_autograd(c);
}

}  // namespace

void bind_tensor(py::module_& m) {
  py::enum_<DType>(m, "dtype", "Element types.")
      .value("f32", DType::f32).value("bf16", DType::bf16).value("f16", DType::f16)
      .value("i32", DType::i32).value("i64", DType::i64).value("bool", DType::boolean)
      .value("fp8_e4m3", DType::fp8_e4m3);
  for (const char* n : {"f32", "bf16", "f16", "i32", "i64", "fp8_e4m3"}) m.attr(n) = m.attr("dtype").attr(n);
  m.attr("float32") = m.attr("f32");
  m.attr("bfloat16") = m.attr("bf16");
  m.attr("float16") = m.attr("f16");
  m.attr("int32") = m.attr("i32");
  m.attr("int64") = m.attr("i64");
  py::class_<Device>(m, "Device", "A device: cpu, cuda:N or meta (shapes only).")
      .def(py::init([](const std::string& s) { return Device::parse(s); }))
      .def("__str__", &Device::str)
      .def("__repr__", [](Device d) { return "remat.Device(\"" + d.str() + "\")"; })
      .def(py::self == py::self);
  bind_tensor_class(m);
  m.def("from_numpy", [](const py::buffer& b) { return from_buffer(b); }, py::arg("array"),
        "A tensor over a NumPy array's memory, no copy (a read-only array is copied). Float32, float16, "
        "int32, int64 and bool arrays; strides must be non-negative multiples of the item size.");
  m.def("tensor", &tensor_from_data, py::arg("data"), py::arg("dtype") = py::none(),
        py::arg("requires_grad") = false, "A new tensor holding a copy of data (a NumPy array, a nested list, a "
        "number or a Tensor); Python floats become f32.");
  const auto factory = [&m](const char* name, Tensor (*fn)(const Shape&, TensorOptions)) {
    m.def(name, [fn](const py::object& shape, const py::object& dtype, const py::object& device, bool rg) {
      Tensor t = fn(shape_arg(shape), TensorOptions(dtype_arg(dtype), device_arg(device)));
      if (rg) t.set_requires_grad(true);
      return t;
    }, py::arg("shape"), py::arg("dtype") = "f32", py::arg("device") = "cpu", py::arg("requires_grad") = false);
  };
  factory("zeros", &zeros);
  factory("ones", &ones);
  factory("empty", &empty);
  m.def("full", [](const py::object& shape, double v, const py::object& dtype, const py::object& device) {
    return full(shape_arg(shape), v, TensorOptions(dtype_arg(dtype), device_arg(device)));
  }, py::arg("shape"), py::arg("value"), py::arg("dtype") = "f32", py::arg("device") = "cpu");
  m.def("arange", [](std::int64_t n, const py::object& dtype) { return arange(n, TensorOptions(dtype_arg(dtype))); },
        py::arg("end"), py::arg("dtype") = "i64");
  m.def("randn", [](const py::object& shape, const py::object& dtype, const py::object& device, bool rg) {
    Tensor t = randn(shape_arg(shape), TensorOptions(dtype_arg(dtype), device_arg(device)));
    if (rg) t.set_requires_grad(true);
    return t;
  }, py::arg("shape"), py::arg("dtype") = "f32", py::arg("device") = "cpu", py::arg("requires_grad") = false,
     "Standard normal values from the device's default generator (remat.manual_seed).");
  m.def("rand", [](const py::object& shape, const py::object& dtype, const py::object& device) {
    return rand(shape_arg(shape), TensorOptions(dtype_arg(dtype), device_arg(device)));
  }, py::arg("shape"), py::arg("dtype") = "f32", py::arg("device") = "cpu");
  m.def("manual_seed", &manual_seed, py::arg("seed"), "Seeds every device's default generator.");
}

}  // namespace remat::python
