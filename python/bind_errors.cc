// remat's errors as Python exceptions: remat.Error (a RuntimeError) and one
// subclass per C++ error type, each also deriving from the built-in
// exception a Python user would catch for it (ShapeError is a ValueError,
// DTypeError a TypeError, OutOfMemoryError a MemoryError, IOError an
// OSError). The message is remat's, unchanged.
#include <pybind11/pybind11.h>

#include <exception>
#include <utility>

#include "engine/error.h"
#include "python/bindings.h"

namespace remat::python {
namespace {

// The foreign exception in flight on this thread (see rethrow_if_foreign).
thread_local std::exception_ptr pending_foreign;
// The exception classes, set once at import (the module's attributes keep
// them alive for as long as the module lives).
py::handle foreign_class, error, shape, dtype, device, oom, mismatch, autograd, io;

// remat's errors (and foreign exceptions) as Python errors; rethrows the
// others (pybind11's own and the standard ones: the next translator's).
// Most derived first: a C++ subclass must not be caught as remat::Error.
void translate_remat(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const ShapeError& e) {
    PyErr_SetString(shape.ptr(), e.what());
  } catch (const DTypeError& e) {
    PyErr_SetString(dtype.ptr(), e.what());
  } catch (const DeviceError& e) {
    PyErr_SetString(device.ptr(), e.what());
  } catch (const OutOfMemoryError& e) {
    PyErr_SetString(oom.ptr(), e.what());
  } catch (const CheckpointMismatchError& e) {
    PyErr_SetString(mismatch.ptr(), e.what());
  } catch (const AutogradError& e) {
    PyErr_SetString(autograd.ptr(), e.what());
  } catch (const IOError& e) {
    PyErr_SetString(io.ptr(), e.what());
  } catch (const Error& e) {
    PyErr_SetString(error.ptr(), e.what());
  } catch (const py::cast_error& e) {  // a Python value of the wrong type for a parameter
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const std::exception&) {
    throw;
  } catch (...) {
    pending_foreign = std::current_exception();
    PyErr_SetString(foreign_class.ptr(), "a C++ exception crossing Python frames (remat internal)");
  }
}

// A new exception class remat.NAME with `bases` (a tuple of classes).
py::object make_exception(py::module_& m, const char* name, const py::tuple& bases, const char* doc) {
  const std::string qualified = std::string("remat.") + name;
  py::object cls = py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr));
  if (!cls) throw py::error_already_set();
  m.attr(name) = cls;
  return cls;
}

}  // namespace

void rethrow_if_foreign(const py::error_already_set& e) {
  if (!foreign_class || !e.matches(foreign_class) || !pending_foreign) return;
  std::exception_ptr p = std::exchange(pending_foreign, nullptr);
  std::rethrow_exception(p);
}

void bind_errors(py::module_& m) {
  py::handle builtins = py::module_::import("builtins");
  error = make_exception(m, "Error", py::make_tuple(builtins.attr("RuntimeError")),
                         "Every error remat raises derives from this.");
  shape = make_exception(m, "ShapeError", py::make_tuple(error, builtins.attr("ValueError")),
                         "Shapes that do not fit the op (remat::ShapeError).");
  dtype = make_exception(m, "DTypeError", py::make_tuple(error, builtins.attr("TypeError")),
                         "A dtype the op does not take (remat::DTypeError).");
  device = make_exception(m, "DeviceError", py::make_tuple(error),
                          "Tensors on the wrong device, or a device that is not there (remat::DeviceError).");
  oom = make_exception(m, "OutOfMemoryError", py::make_tuple(error, builtins.attr("MemoryError")),
                       "An allocation the device (or a memory limit) refused; the message names the "
                       "allocator's state (remat::OutOfMemoryError).");
  mismatch = make_exception(m, "CheckpointMismatchError", py::make_tuple(error),
                            "A checkpoint replay that did not reproduce the forward (remat::CheckpointMismatchError).");
  autograd = make_exception(m, "AutogradError", py::make_tuple(error),
                            "Misuse of autograd: a freed graph, a modified saved tensor, ... (remat::AutogradError).");
  io = make_exception(m, "IOError", py::make_tuple(error, builtins.attr("OSError")),
                      "A file remat could not read or write (remat::IOError).");
  // A BaseException, so that a user's `except Exception` does not swallow it.
  foreign_class = make_exception(m, "_ForeignException", py::make_tuple(builtins.attr("BaseException")),
                                 "Internal: a C++ control-flow exception crossing Python frames.");
  py::register_exception_translator(&translate_remat);
}

void set_python_error(std::exception_ptr p) {
  try {
    translate_remat(p);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace remat::python
