// Tensor: a handle to sizes, strides and an offset over a shared Storage.
// Copying a Tensor copies the handle (both name the same data); views share
// storage and the version counter with their base. In-place writes bump that
// counter, which is how autograd detects a saved tensor modified behind its back.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <vector>

#include "engine/allocator.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/rng.h"
#include "engine/shape.h"

namespace remat {

// A block of device memory from the caching allocator, shared by all views of it.
class Storage {
 public:
  // Allocates `nbytes` on `device` through its caching allocator (with the
  // thread's current memory category and tag).
  Storage(std::size_t nbytes, Device device);
  // Wraps `nbytes` of host memory at `data` that remat does not own (a NumPy
  // array's buffer, an embedding program's block): `keeper` keeps it alive
  // and is dropped when the last tensor over the storage goes. The caching
  // allocator never sees it (its stats do not count it). CPU only.
  Storage(void* data, std::size_t nbytes, std::shared_ptr<void> keeper);
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return keeper_ ? external_ : data_.get(); }
  // True for memory wrapped by the constructor above.
  bool external() const { return keeper_ != nullptr; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // The memory category the storage was allocated under.
  MemoryCategory category() const { return category_; }
  // Creation order, process-wide: a storage made later has a larger serial.
  std::uint64_t serial() const { return serial_; }
  // The serial the next storage made (on any thread) gets at least.
  static std::uint64_t next_serial();

 private:
  DataPtr data_;
  void* external_ = nullptr;
  std::shared_ptr<void> keeper_;  // non-null for external memory
  std::size_t nbytes_;
  Device device_;
  MemoryCategory category_;
  std::uint64_t serial_;
};

// Counts in-place writes to a storage's elements; shared by a base and its views.
struct VersionCounter {
  std::atomic<std::uint64_t> value{0};
};

struct AutogradMeta;  // engine/autograd.h
class Node;          // engine/autograd.h

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;            // in elements
  std::int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  bool released = false;    // release_storage() dropped the elements
  Device released_device = kCPU;  // ... which lived here (device() still says so)
  std::shared_ptr<VersionCounter> version;
  std::shared_ptr<AutogradMeta> autograd;  // null for tensors autograd never saw
};

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = default_device();  // kCPU unless a DefaultDeviceScope says otherwise

  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}   // NOLINT: implicit on purpose
  TensorOptions(Device d) : device(d) {}  // NOLINT
  TensorOptions(DType t, Device d) : dtype(t), device(d) {}
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // False for a default-constructed (undefined) tensor.
  bool defined() const { return impl_ != nullptr; }

  const Shape& sizes() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  // Size / stride of `dim` (negative counts from the end).
  std::int64_t size(std::int64_t dim) const;
  std::int64_t stride(std::int64_t dim) const;
  std::int64_t dim() const { return std::int64_t(impl().sizes.size()); }
  std::int64_t numel() const { return shape_numel(impl().sizes); }
  DType dtype() const { return impl().dtype; }
  Device device() const {
    const TensorImpl& im = impl();
    return im.storage ? im.storage->device() : im.released ? im.released_device : kCPU;
  }
  std::int64_t storage_offset() const { return impl().offset; }
  // Bytes of the elements this tensor covers (numel * element size).
  std::size_t nbytes() const { return std::size_t(numel()) * element_size(dtype()); }
  bool is_contiguous() const;

  // Pointer to element 0 (storage data + offset). Checks that T matches the dtype.
  template <typename T>
  T* data() const {
    REMAT_CHECK(dtype_v<T> == dtype(), DTypeError, "data<", dtype_name(dtype_v<T>),
                ">(): tensor has dtype ", dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;
  // Drops the elements (the storage every handle of this tensor shares),
  // keeping shape and dtype: for a parameter whose values live on another
  // rank (a pipeline stage's copy of the other stages' weights). Any later
  // access to the elements is an Error naming the shape.
  void release_storage() const;
  bool released() const { return impl().released; }
  // Points this tensor at `src`'s elements (src: the same shape and dtype,
  // contiguous; the two then share storage), keeping every handle to this
  // tensor, its version counter and its autograd state: a released tensor
  // holds elements again. For parameters gathered from shards on other
  // ranks just before they are used (train/zero.h); release_storage() lets
  // them go again. Does not bump the version (the values are the ones the
  // tensor had).
  void alias_storage_(const Tensor& src) const;
  // Points this tensor at `src`'s elements and takes its shape (src:
  // contiguous, the same dtype and device), keeping every handle and the
  // autograd state; bumps the version. For a parameter that a tensor-parallel
  // rank keeps only a slice of (models/tensor_parallel.h), before any
  // gradient exists (Error if one does).
  void reshape_storage_(const Tensor& src) const;

  // ---- Views (share storage and version counter) ----
  // Same data with new sizes; one size may be -1. Throws ShapeError if the
  // strides cannot express it (use reshape).
  Tensor view(const Shape& sizes) const;
  // A view when possible, otherwise a contiguous copy.
  Tensor reshape(const Shape& sizes) const;
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;
  // Transpose of a 2-D tensor.
  Tensor t() const;
  Tensor permute(const Shape& dims) const;
  // Elements [start, start + length) of `dim`.
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  // Elements start, start + step, ... < end of `dim` (Python slice semantics
  // for negative start/end; step >= 1).
  Tensor slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1) const;
  // Removes `dim` by taking element `index` of it.
  Tensor select(std::int64_t dim, std::int64_t index) const;
  // Broadcasts size-1 dims (stride 0) and prepends dims; -1 keeps a size.
  Tensor expand(const Shape& sizes) const;
  Tensor squeeze(std::int64_t dim) const;
  Tensor squeeze() const;
  Tensor unsqueeze(std::int64_t dim) const;
  // Merges dims start..end into one.
  Tensor flatten(std::int64_t start = 0, std::int64_t end = -1) const;
  // A view with explicit sizes, strides and offset over the same storage.
  Tensor as_strided(const Shape& sizes, const Shape& strides, std::int64_t offset) const;

  // ---- Copies ----
  // This tensor if already contiguous, else a contiguous copy.
  Tensor contiguous() const;
  // A contiguous copy with its own storage.
  Tensor clone() const;
  // A copy converted to `dtype` (this tensor itself if already that dtype).
  Tensor to(DType dtype) const;
  // A copy on `device` (this tensor itself if already there).
  Tensor to(Device device) const;
  // Moves this tensor's elements to `device` in place: every handle to it (a
  // layer's member, a module's parameter list) sees the new storage, which is
  // contiguous; its gradient, if any, moves too. For leaves such as
  // parameters, before they are used; views of the old storage keep the old.
  void move_to_(Device device);
  // Converts this leaf's elements to `dtype` in place (rounded as to(dtype)
  // rounds), every handle seeing the new storage: for a frozen parameter
  // kept in its checkpoint's dtype. Error if it requires grad, has a
  // gradient or is not floating (nor `dtype`).
  void convert_(DType dtype);

  // ---- In-place writes (bump the version counter) ----
  // Copies `src` (broadcast to this shape, converted to this dtype) into this.
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor& zero_();

  // ---- Element access (for tests and tools; not for hot loops) ----
  // The single element of a one-element tensor, as double.
  double item() const;
  // Element at `index` (one entry per dim, negative counts from the end).
  double at(const Shape& index) const;
  // Writes element `index` (bumps the version).
  void set(const Shape& index, double value);
  // All elements in row-major order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;

  // ---- Autograd (engine/autograd.h) ----
  // True if gradients flow to this tensor (a leaf marked so, or an op output).
  bool requires_grad() const;
  // Marks a leaf as needing gradients. Floating dtypes only; throws
  // AutogradError for non-leaves and DTypeError for integer tensors.
  Tensor& set_requires_grad(bool enable = true);
  // The gradient accumulated into this leaf (undefined before any backward).
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  // True for tensors no op produced (with or without requires_grad).
  bool is_leaf() const;
  // The node that produced this tensor (null for leaves).
  std::shared_ptr<Node> grad_fn() const;
  // Same data and version counter, no history, requires_grad false.
  Tensor detach() const;
  // Gradient of this tensor w.r.t. the graph's leaves, accumulated into their
  // .grad; `seed` may be omitted for one-element tensors.
  void backward(const Tensor& seed = Tensor(), bool retain_graph = false) const;
  // Calls `hook` with the gradient flowing into this tensor during backward;
  // a defined return value replaces the gradient.
  void register_hook(std::function<Tensor(const Tensor&)> hook) const;
  // Leaves only: calls `hook` with this tensor each time backward has
  // accumulated a gradient into its .grad.
  void register_post_accumulate_hook(std::function<void(const Tensor&)> hook) const;
  // Leaves only: when backward brings a gradient and .grad is undefined, it
  // is copied into the tensor `place` returns (same shape, dtype and device;
  // e.g. a view into a flat buffer a collective then reads whole) instead of
  // a fresh copy; an undefined return means a fresh copy. Replaces any
  // previous placement; a null function removes it.
  void set_grad_placement(std::function<Tensor(const Tensor&)> place) const;

  // ---- Versions and identity ----
  std::uint64_t version() const { return impl().version->value.load(); }
  void bump_version() const { impl().version->value.fetch_add(1); }
  bool shares_storage_with(const Tensor& other) const {
    return defined() && other.defined() && impl_->storage == other.impl_->storage;
  }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  TensorImpl& impl() const {
    REMAT_CHECK(impl_ != nullptr, Error, "operation on an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  Tensor make_view(Shape sizes, Shape strides, std::int64_t offset) const;
  // copy_ without the version bump (for tensors nobody has seen yet).
  void copy_from(const Tensor& src);
  std::int64_t element_offset(const Shape& index, const char* op) const;

  std::shared_ptr<TensorImpl> impl_;
};

// Prints values (nested brackets, long dims elided) and the shape, dtype and device.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- Factories ----
// Uninitialised contiguous tensor.
Tensor empty(const Shape& sizes, TensorOptions opts = {});
Tensor zeros(const Shape& sizes, TensorOptions opts = {});
Tensor ones(const Shape& sizes, TensorOptions opts = {});
Tensor full(const Shape& sizes, double value, TensorOptions opts = {});
// 0, 1, ..., end - 1 (default dtype i64).
Tensor arange(std::int64_t end, TensorOptions opts = DType::i64);
// start, start + step, ... < end.
Tensor arange(double start, double end, double step, TensorOptions opts = DType::f32);
// A tensor holding `values` with shape `sizes` (shape [n] when omitted).
template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape sizes = {}, Device device = default_device());

// Meta's stand-in for t.to_vector<T>() with dtype_v<T> == `dtype`: the
// allocations the read makes when t is on the CPU (a cast, a contiguous
// copy), without values, so a shape-only path keeps the CPU's allocation
// sequence. Does nothing unless t is a meta tensor, or when meta mirrors a
// GPU (engine/meta_mirror.h: there the read's copies are in host memory).
void mirror_host_read(const Tensor& t, DType dtype);
// A CPU tensor over memory the caller owns (no copy): `sizes` and `strides`
// (in elements) from `data`, which must hold every element they reach;
// `keeper` keeps the memory alive for as long as any tensor or view over it
// lives. Writes through remat are visible to the owner and the other way
// round. Throws ShapeError for a negative size or stride.
Tensor from_blob(void* data, const Shape& sizes, const Shape& strides, DType dtype, std::shared_ptr<void> keeper);

// Standard normal / uniform [0, 1) values drawn from `gen` (the device's
// default generator when null). Floating dtypes only.
Tensor randn(const Shape& sizes, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor rand(const Shape& sizes, TensorOptions opts = {}, Generator* gen = nullptr);

// ---- Internal helpers shared with ops ----
namespace detail {
// Copies src into dst elementwise (same shape; dtypes may differ; any strides;
// both on the CPU).
void copy_cpu(const Tensor& dst, const Tensor& src);
}  // namespace detail

}  // namespace remat
