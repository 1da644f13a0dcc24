// DLPack in and out: t.__dlpack__() / __dlpack_device__() for consumers
// (torch.from_dlpack(t), numpy.from_dlpack(t)) and remat.from_dlpack(x) for
// any producer's tensor, both without a copy. The capsule protocol is the
// Python array API's: a PyCapsule named "dltensor" holding a
// DLManagedTensor, renamed "used_dltensor" by the consumer that takes it
// (and then owns calling its deleter). Unlike NumPy's buffer protocol this
// carries bf16 and CUDA tensors.
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine/error.h"
#include "engine/tensor.h"
#include "python/bindings.h"

namespace remat::python {
namespace {

constexpr const char* kCapsule = "dltensor";
constexpr const char* kUsedCapsule = "used_dltensor";
// kDLBool: DLPack 0.8's code for booleans (Debian's 0.6 header predates it).
constexpr std::uint8_t kDLBoolCode = 6;

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
    case DType::boolean: return {kDLBoolCode, 8, 1};
    default:
      throw DTypeError(std::string("__dlpack__: a ") + dtype_name(t) + " tensor has no DLPack type; convert it "
                       "first (t.to(remat.bf16))");
  }
}

DType remat_dtype(DLDataType d) {
  const auto is = [&](std::uint8_t code, std::uint8_t bits) { return d.code == code && d.bits == bits; };
  if (d.lanes == 1) {
    if (is(kDLFloat, 32)) return DType::f32;
    if (is(kDLFloat, 16)) return DType::f16;
    if (is(kDLBfloat, 16)) return DType::bf16;
    if (is(kDLInt, 32)) return DType::i32;
    if (is(kDLInt, 64)) return DType::i64;
    if (is(kDLBoolCode, 8)) return DType::boolean;
  }
  throw DTypeError("remat.from_dlpack: DLPack type (code " + std::to_string(d.code) + ", " + std::to_string(d.bits) +
                   " bits, " + std::to_string(d.lanes) + " lanes) has no remat dtype; remat takes float32, float16, "
                   "bfloat16, int32, int64 and bool");
}

// What a capsule remat made keeps alive: the tensor and the arrays the
// DLTensor points at.
struct Export {
  DLManagedTensor managed{};
  Tensor tensor;
  std::vector<std::int64_t> shape, strides;
};

void delete_export(DLManagedTensor* self) { std::unique_ptr<Export> owned(static_cast<Export*>(self->manager_ctx)); }

// A capsule no consumer took is freed with it.
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsule)) return;  // taken: the consumer owns it
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (managed && managed->deleter) managed->deleter(managed);
}

py::capsule to_dlpack(const Tensor& t) {
  REMAT_CHECK(!t.device().is_meta(), DeviceError, "__dlpack__: a meta tensor has no elements to share");
  REMAT_CHECK(!t.requires_grad(), AutogradError, "__dlpack__: a tensor that requires grad (shape ",
              shape_str(t.sizes()), ") is not exported, as the consumer's writes would bypass autograd: use "
              "t.detach()");
  auto ex = std::make_unique<Export>();
  ex->tensor = t.detach();  // (a handle of its own: it keeps the storage even if t moves in place)
  ex->shape.assign(t.sizes().begin(), t.sizes().end());
  ex->strides.assign(t.strides().begin(), t.strides().end());
  DLTensor& d = ex->managed.dl_tensor;
  d.data = t.numel() == 0 ? nullptr : t.raw_data();
  d.device = {t.device().is_cuda() ? kDLCUDA : kDLCPU, t.device().is_cuda() ? t.device().index : 0};
  d.ndim = int(t.dim());
  d.dtype = dl_dtype(t.dtype());
  d.shape = ex->shape.data();
  d.strides = ex->strides.data();
  d.byte_offset = 0;
  ex->managed.manager_ctx = ex.get();
  ex->managed.deleter = &delete_export;
  DLManagedTensor* managed = &ex.release()->managed;  // (owned by the capsule, or by its consumer)
  PyObject* cap = PyCapsule_New(managed, kCapsule, &capsule_destructor);
  if (!cap) {
    managed->deleter(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

Tensor from_dlpack(const py::object& obj) {
  const py::object cap = py::hasattr(obj, "__dlpack__") ? obj.attr("__dlpack__")() : obj;
  if (!PyCapsule_IsValid(cap.ptr(), kCapsule))
    throw py::type_error("remat.from_dlpack: expected an object with __dlpack__ or an unused \"dltensor\" capsule");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), kCapsule));
  if (PyCapsule_SetName(cap.ptr(), kUsedCapsule) != 0) throw py::error_already_set();
  // Taken: whatever happens next, the keeper calls its deleter (once).
  std::shared_ptr<void> keeper(managed, [](void* m) {
    auto* p = static_cast<DLManagedTensor*>(m);
    if (p->deleter) p->deleter(p);
  });
  const DLTensor& d = managed->dl_tensor;
  REMAT_CHECK(d.device.device_type == kDLCPU || d.device.device_type == kDLCUDAHost, DeviceError,
              "remat.from_dlpack: the tensor is on DLPack device type ", int(d.device.device_type),
              "; remat wraps host memory only (copy it to the CPU first)");
  const DType dtype = remat_dtype(d.dtype);
  Shape sizes(d.shape, d.shape + d.ndim);
  Shape strides = d.strides ? Shape(d.strides, d.strides + d.ndim) : contiguous_strides(sizes);
  void* data = static_cast<char*>(d.data) + d.byte_offset;
  return from_blob(data, sizes, strides, dtype, std::move(keeper));
}

}  // namespace

void bind_dlpack(py::module_& m) {
  py::class_<Tensor> c = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));
  c.def("__dlpack__", [](const Tensor& t, const py::object&) { return to_dlpack(t); }, py::arg("stream") = py::none(),
        "A DLPack capsule over this tensor's elements (no copy; it keeps the tensor alive).")
      .def("__dlpack_device__", [](const Tensor& t) {
        return py::make_tuple(int(t.device().is_cuda() ? kDLCUDA : kDLCPU), t.device().is_cuda() ? t.device().index : 0);
      });
  m.def("from_dlpack", &from_dlpack, py::arg("x"),
        "A tensor over another library's tensor (anything with __dlpack__, e.g. a torch tensor or a NumPy "
        "array), no copy; host memory only.");
}

}  // namespace remat::python
