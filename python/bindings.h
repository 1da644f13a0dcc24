// The `remat` Python module (python/module.cc): what its binding files
// share. Each bind_*.cc adds one part of the API to the module; this header
// holds the conversions between Python and remat values and the rule for
// Python objects that C++ keeps (hooks, policies, custom ops): they are held
// through PyRef, whose last owner takes the GIL to drop them, because remat
// may release them on a thread that does not hold it (a training step runs
// with the GIL released).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/autograd.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/shape.h"
#include "engine/tensor.h"

namespace remat::python {

namespace py = pybind11;

// A Python object owned from C++: copies share it; the last one drops it
// with the GIL held (or leaks it if the interpreter has already finalized).
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(py::object obj);
  // The object (call with the GIL held).
  const py::object& get() const { return *obj_; }
  explicit operator bool() const { return obj_ != nullptr; }

 private:
  std::shared_ptr<py::object> obj_;
};

// If `e` stands for a C++ exception that is not a std::exception and
// crossed Python frames (a checkpoint replay's early stop, thrown from an op
// inside a region function written in Python), rethrows that exception
// itself; otherwise returns. The module's exception translator stashes such
// exceptions (per thread) and raises an internal BaseException for them.
void rethrow_if_foreign(const py::error_already_set& e);

// Sets the Python error for exception `p` (remat's as remat.Error and its
// subclasses, pybind11's as theirs, others as RuntimeError): for C entry
// points that must not let an exception out (the buffer protocol).
void set_python_error(std::exception_ptr p);

// fn(args...) for a Python callable remat calls back (a hook, a region, a
// policy, a custom op's forward or backward). Call with the GIL held.
template <typename... Args>
py::object call_python(const py::object& fn, Args&&... args) {
  try {
    return fn(std::forward<Args>(args)...);
  } catch (const py::error_already_set& e) {
    rethrow_if_foreign(e);
    throw;
  }
}

// "f32", "bf16", ... or a DType value -> the DType (ValueError naming the
// accepted names otherwise).
DType dtype_arg(const py::handle& obj);
// "cpu", "cuda:0", "meta" or a Device -> the Device.
Device device_arg(const py::handle& obj);
// A tuple or list of ints (or one int) -> a Shape.
Shape shape_arg(const py::handle& obj);
// A tuple of ints from a Shape.
py::tuple shape_tuple(const Shape& s);

// A Python callable's result as the tensors of an op's outputs: one Tensor,
// or a tuple/list of them. `what` names the caller in the TypeError.
std::vector<Tensor> tensors_from_result(const py::object& result, const std::string& what);
// One tensor as itself, several as a tuple.
py::object tensors_to_result(const std::vector<Tensor>& tensors);

void bind_errors(py::module_& m);
void bind_tensor(py::module_& m);
void bind_dlpack(py::module_& m);
void bind_ops(py::module_& m);
void bind_autograd(py::module_& m);
void bind_checkpoint(py::module_& m);
void bind_memory(py::module_& m);
void bind_models(py::module_& m);
void bind_training(py::module_& m);

}  // namespace remat::python

namespace remat::python {

// A Python context manager over one of remat's RAII scopes: __enter__ makes
// the scope (through `make`) and returns `value`; __exit__ destroys it.
// Scopes are thread-local stacks: enter and exit on one thread, innermost
// first (a with-statement does).
// A scope is left only by the thread that entered it and innermost first:
// __exit__ raises otherwise and leaves the scope in place, and a scope still
// open when its object is collected is closed only if that is safe (its
// thread, innermost), else deliberately leaked: the engine's scope stacks
// are per thread and popped from the top.
struct ScopeContext {
  std::function<std::shared_ptr<void>()> make;
  py::object value = py::none();
  std::shared_ptr<void> active;
  std::thread::id owner;  // the thread that entered it
  ~ScopeContext();
};

// `make`'s scope as a context manager yielding `value` from __enter__.
py::object scope_context(std::function<std::shared_ptr<void>()> make, py::object value = py::none());

// A context manager pushing `hooks` on the saved-tensor hook stack
// (SavedTensorHooksScope) while it is entered; yields `value`.
py::object hooks_scope(std::shared_ptr<SavedTensorHooks> hooks, py::object value = py::none());

}  // namespace remat::python
