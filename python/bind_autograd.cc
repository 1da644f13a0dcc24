// Autograd from Python: grad mode, backward, saved-tensor hooks written in
// Python (pack/unpack callables, with or without the SaveInfo), custom
// differentiable ops (forward/backward callables with save_for_backward)
// and remat.gradcheck.
//
// Every Python callable remat keeps is held through PyRef and called with
// the GIL taken: backward runs with the GIL released, and a hook, a custom
// op's backward or a checkpoint replay may call back into Python from it.
// A Python exception raised inside one travels through remat's C++ frames
// (whose RAII scopes unwind) and comes out as itself.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine/autograd.h"
#include "engine/custom_op.h"
#include "engine/grad_mode.h"
#include "engine/gradcheck.h"
#include "python/bindings.h"

namespace remat::python {

py::object scope_context(std::function<std::shared_ptr<void>()> make, py::object value) {
  auto s = std::make_unique<ScopeContext>();
  s->make = std::move(make);
  s->value = std::move(value);
  return py::cast(std::move(s));
}

py::object hooks_scope(std::shared_ptr<SavedTensorHooks> hooks, py::object value) {
  return scope_context([hooks = std::move(hooks)] { return std::make_shared<SavedTensorHooksScope>(hooks); },
                       std::move(value));
}

namespace {

// The scopes this thread has entered and not left, innermost last.
thread_local std::vector<const ScopeContext*> open_scopes;

bool innermost_here(const ScopeContext& s) {
  return s.owner == std::this_thread::get_id() && !open_scopes.empty() && open_scopes.back() == &s;
}

void enter_scope(ScopeContext& s) {
  if (s.active) throw AutogradError("this scope is already entered (make a new one for each with-block)");
  s.active = s.make();
  s.owner = std::this_thread::get_id();
  open_scopes.push_back(&s);
}

void exit_scope(ScopeContext& s) {
  if (!s.active) return;
  if (!innermost_here(s))
    throw py::value_error(s.owner != std::this_thread::get_id()
                              ? "a remat scope must be left by the thread that entered it"
                              : "remat scopes must be left innermost first (this one encloses a scope still open)");
  open_scopes.pop_back();
  s.active.reset();
}

}  // namespace

ScopeContext::~ScopeContext() {
  if (!active) return;
  if (innermost_here(*this)) {
    open_scopes.pop_back();
    return;  // (active closes the scope here, on its thread)
  }
  // Closing it here would pop another scope off a stack (or another
  // thread's): leave it open, as the program did.
  (void)new std::shared_ptr<void>(std::move(active));
}

namespace {

// Saved-tensor hooks written in Python. pack(tensor[, info]) returns any
// Python object; unpack(packed[, info]) must return a remat.Tensor of the
// saved tensor's shape, dtype and device (the engine checks). wants(tensor,
// info), if given, picks which saves the hooks take.
class PythonSavedTensorHooks final : public TypedSavedTensorHooks {
 public:
  PythonSavedTensorHooks(PyRef pack, PyRef unpack, PyRef wants, bool with_info, std::string name)
      : pack_(std::move(pack)), unpack_(std::move(unpack)), wants_(std::move(wants)), with_info_(with_info),
        name_(std::move(name)) {}
  std::string name() const override { return name_; }
  bool wants(const Tensor& t, const SaveInfo& info) const override {
    if (!wants_) return true;
    py::gil_scoped_acquire gil;
    return py::bool_(call_python(wants_.get(), t, info));
  }
  // A remat.Tensor that pack returns is kept as a Tensor, so that hooks
  // outside this scope (offload, compression) take it as they take any save.
  std::any pack_tensor(const Tensor& t, const SaveInfo& info) override {
    py::gil_scoped_acquire gil;
    py::object packed = with_info_ ? call_python(pack_.get(), t, info) : call_python(pack_.get(), t);
    if (py::isinstance<Tensor>(packed)) return packed.cast<Tensor>();
    return PyRef(std::move(packed));
  }
  Tensor unpack_tensor(std::any packed, const SaveInfo& info) override {
    py::gil_scoped_acquire gil;
    const Tensor* as_tensor = std::any_cast<Tensor>(&packed);
    const py::object obj = as_tensor ? py::cast(*as_tensor) : std::any_cast<const PyRef&>(packed).get();
    py::object r = with_info_ ? call_python(unpack_.get(), obj, info) : call_python(unpack_.get(), obj);
    if (!py::isinstance<Tensor>(r))
      throw py::type_error("saved-tensor hooks '" + name_ + "': unpack must return a remat.Tensor (the " +
                           std::string(info.op) + " save of shape " + shape_str(info.meta.sizes) + "), got a " +
                           std::string(py::str(r.get_type().attr("__name__"))));
    return r.cast<Tensor>();
  }
  // A packed Tensor's bytes count as held (the base class's rule); another
  // Python object counts as nothing.

 private:
  PyRef pack_, unpack_, wants_;
  bool with_info_;
  std::string name_;
};

// A custom op's context as Python sees it: valid only during the forward or
// backward call that received it. Attributes set on it in forward are read
// back in backward (they live in the C++ context, as a Python dict).
struct PyOpContext {
  CustomOpContext* ctx = nullptr;
  bool forward = false;
  CustomOpContext& get() const {
    if (!ctx) throw AutogradError("a custom op's ctx was used after the forward or backward call it was given to");
    return *ctx;
  }
  // The attributes' dict (call_with_context puts one in every forward's context).
  py::dict attributes() const { return py::reinterpret_borrow<py::dict>(get().get<PyRef>("python").get()); }
};

// Calls `fn` with a fresh PyOpContext over `ctx` and the tensors as
// arguments; the context is invalidated when the call returns or throws.
std::vector<Tensor> call_with_context(const PyRef& fn, CustomOpContext& ctx, bool forward,
                                      const std::vector<Tensor>& tensors, const std::string& what) {
  py::gil_scoped_acquire gil;
  if (forward) ctx.set("python", PyRef(py::dict()));
  py::object pctx = py::cast(PyOpContext{&ctx, forward});
  struct Invalidate {
    py::object& o;
    ~Invalidate() { o.cast<PyOpContext&>().ctx = nullptr; }
  } invalidate{pctx};
  py::tuple args(tensors.size() + 1);
  args[0] = pctx;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    args[i + 1] = tensors[i].defined() ? py::cast(tensors[i]) : py::object(py::none());
  return tensors_from_result(call_python(fn.get(), *args), what);
}

void bind_custom_op(py::module_& m) {
  py::class_<PyOpContext>(m, "OpContext", "A custom op's context (remat.custom_op).")
      .def("save_for_backward", [](const PyOpContext& c, const py::args& ts) {
        std::vector<Tensor> v;
        for (const py::handle& h : ts) v.push_back(h.cast<Tensor>());
        c.get().save_for_backward(v);
      })
      .def_property_readonly("saved_tensors", [](const PyOpContext& c) {
        std::vector<Tensor> v;
        {
          py::gil_scoped_release nogil;  // (unpacking may replay a region that calls back into Python)
          v = c.get().saved_tensors();
        }
        return py::tuple(py::cast(v));
      })
      .def("needs_input_grad", [](const PyOpContext& c, std::size_t i) { return c.get().needs_input_grad(i); })
      .def("mark_non_differentiable", [](const PyOpContext& c, const py::args& ts) {
        std::vector<Tensor> v;
        for (const py::handle& h : ts) v.push_back(h.cast<Tensor>());
        c.get().mark_non_differentiable(v);
      })
      .def_property_readonly("op", [](const PyOpContext& c) { return c.get().op(); })
      .def("__setattr__", [](const PyOpContext& c, const std::string& k, py::object v) {
        if (!c.forward) throw AutogradError("custom op '" + c.get().op() + "': set attributes on ctx in forward");
        // A tensor is kept detached: ctx.y = y would otherwise make a cycle
        // (y's node -> ctx -> y) the garbage collector cannot see. Tensors
        // backward needs with their history checked go through save_for_backward.
        if (py::isinstance<Tensor>(v)) v = py::cast(v.cast<Tensor>().detach());
        c.attributes()[py::str(k)] = std::move(v);
      })
      .def("__getattr__", [](const PyOpContext& c, const std::string& k) -> py::object {
        py::dict d = c.attributes();
        if (!d.contains(k)) throw py::attribute_error("custom op ctx has no attribute '" + k + "'");
        return d[py::str(k)];
      });
  py::class_<CustomOp>(m, "CustomOp", "A differentiable op from Python forward and backward functions.")
      .def_property_readonly("name", &CustomOp::name)
      .def("__call__", [](const CustomOp& op, const py::args& args) {
        std::vector<Tensor> in;
        for (const py::handle& h : args) in.push_back(h.is_none() ? Tensor() : h.cast<Tensor>());
        return tensors_to_result(op(in));
      });
  m.def("custom_op", [](const std::string& name, const py::function& forward, const py::function& backward) {
    PyRef f(forward), b(backward);
    return CustomOp(
        name,
        [f, name](CustomOpContext& ctx, const std::vector<Tensor>& in) {
          return call_with_context(f, ctx, true, in, "custom op '" + name + "' forward");
        },
        [b, name](CustomOpContext& ctx, const std::vector<Tensor>& grads) {
          return call_with_context(b, ctx, false, grads, "custom op '" + name + "' backward");
        });
  }, py::arg("name"), py::arg("forward"), py::arg("backward"),
     "A differentiable op: forward(ctx, *inputs) returns a Tensor or a tuple; backward(ctx, *grad_outputs) "
     "returns one gradient per input (None where none is needed). ctx.save_for_backward(*tensors) in forward, "
     "ctx.saved_tensors in backward; other values as ctx attributes.");
}

void bind_saved_tensor_hooks(py::module_& m) {
  py::class_<SaveInfo>(m, "SaveInfo", "What a saved-tensor hook is told about a save.")
      .def_readonly("id", &SaveInfo::id)
      .def_property_readonly("op", [](const SaveInfo& i) { return std::string(i.op); })
      .def_property_readonly("shape", [](const SaveInfo& i) { return shape_tuple(i.meta.sizes); })
      .def_property_readonly("dtype", [](const SaveInfo& i) { return i.meta.dtype; })
      .def_readonly("bytes", &SaveInfo::bytes)
      .def_readonly("is_output", &SaveInfo::is_output)
      .def_readonly("region", &SaveInfo::region)
      .def("__repr__", [](const SaveInfo& i) {
        return "remat.SaveInfo(op=" + std::string(i.op) + ", shape=" + shape_str(i.meta.sizes) +
               ", bytes=" + std::to_string(i.bytes) + ", region=" + std::to_string(i.region) + ")";
      });
  m.def("saved_tensors_hooks", [](const py::function& pack, const py::function& unpack, const py::object& wants,
                                  bool with_info, const std::string& name) {
    auto hooks = std::make_shared<PythonSavedTensorHooks>(PyRef(pack), PyRef(unpack),
                                                          wants.is_none() ? PyRef() : PyRef(wants), with_info, name);
    return hooks_scope(std::move(hooks));
  }, py::arg("pack"), py::arg("unpack"), py::arg("wants") = py::none(), py::arg("with_info") = false,
     py::arg("name") = "python",
     "A context manager: tensors saved for backward inside it go through pack(tensor) -> object, and backward "
     "gets them back through unpack(object) -> Tensor. with_info=True passes a remat.SaveInfo as a second "
     "argument; wants(tensor, info) -> bool picks the saves. Stacks with checkpoint regions, offload and "
     "compression (docs/RECOMPUTE.md, the saved-tensor hook stack).");
  m.def("disable_saved_tensors_hooks", [] { return scope_context([] {
    return std::make_shared<DisableSavedTensorHooks>(); }); });
}

void bind_grad_mode(py::module_& m) {
  m.def("no_grad", [] { return scope_context([] { return std::make_shared<NoGradGuard>(); }); },
        "A context manager: ops inside record no history.");
  m.def("enable_grad", [] { return scope_context([] { return std::make_shared<EnableGradGuard>(); }); });
  m.def("is_grad_enabled", &grad_enabled);
  m.def("set_grad_enabled", &set_grad_enabled, py::arg("enabled"));
  m.def("backward", [](const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads, bool retain) {
    py::gil_scoped_release nogil;
    backward(outputs, grads, retain);
  }, py::arg("outputs"), py::arg("grad_outputs") = std::vector<Tensor>{}, py::arg("retain_graph") = false);
}

void bind_gradcheck(py::module_& m) {
  py::class_<GradcheckResult>(m, "GradcheckResult")
      .def_readonly("ok", &GradcheckResult::ok)
      .def_readonly("checked", &GradcheckResult::checked)
      .def_readonly("max_abs_error", &GradcheckResult::max_abs_error)
      .def_readonly("failures", &GradcheckResult::failures)
      .def("report", &GradcheckResult::report)
      .def("__bool__", [](const GradcheckResult& r) { return r.ok; })
      .def("__repr__", &GradcheckResult::report);
  m.def("gradcheck", [](const py::function& fn, const std::vector<Tensor>& inputs, double eps, double atol,
                        double rtol, std::int64_t max_elements) {
    PyRef f(fn);
    GradcheckOptions o;
    o.eps = eps;
    o.atol = atol;
    o.rtol = rtol;
    o.max_elements = max_elements;
    return gradcheck([f](const std::vector<Tensor>& in) {
      py::gil_scoped_acquire gil;
      const std::vector<Tensor> out = tensors_from_result(call_python(f.get(), *py::cast(in)), "gradcheck's function");
      if (out.size() != 1) throw py::value_error("gradcheck's function must return one tensor");
      return out[0];
    }, inputs, o);
  }, py::arg("fn"), py::arg("inputs"), py::arg("eps") = 1e-2, py::arg("atol") = 2e-3, py::arg("rtol") = 2e-2,
     py::arg("max_elements") = 64,
     "Compares fn's analytic gradients with central differences (f32: the defaults suit it); the result is "
     "truthy when every comparison passed, and .report() lists the failures.");
}

}  // namespace

void bind_autograd(py::module_& m) {
  py::class_<ScopeContext>(m, "Scope", "A context manager over one of remat's scopes.")
      .def("__enter__", [](ScopeContext& s) {
        enter_scope(s);
        return s.value;
      })
      .def("__exit__", [](ScopeContext& s, const py::args&) {
        exit_scope(s);
        return false;
      });
  bind_grad_mode(m);
  bind_saved_tensor_hooks(m);
  bind_custom_op(m);
  bind_gradcheck(m);
}

}  // namespace remat::python
