// Tensor: storage, basic queries, element access and the factories. The view
// algebra is in tensor_views.cc, copies, casts and fills (on and between
// devices) in tensor_copy.cc, printing in tensor_print.cc.
#include "engine/tensor.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "engine/autograd.h"
#include "engine/device_backend.h"
#include "engine/meta_mirror.h"
#include "engine/tensor_internal.h"

namespace remat {

// ---------------------------------------------------------------------------
// Helpers shared by the Tensor files (engine/tensor_internal.h)

void detail::check_dims(const Shape& sizes, const char* op) {
  REMAT_CHECK(std::int64_t(sizes.size()) <= kMaxTensorDims, ShapeError, op, ": ", sizes.size(),
              " dims requested; at most ", kMaxTensorDims, " are supported");
  std::int64_t bytes = 8;  // (the widest element: the element count times 8 must fit too)
  for (auto s : sizes) {
    REMAT_CHECK(s >= 0, ShapeError, op, ": negative size in ", shape_str(sizes));
    REMAT_CHECK(!__builtin_mul_overflow(bytes, s, &bytes), ShapeError, op, ": shape ", shape_str(sizes),
                " has more elements than 64-bit byte counts can address");
  }
}

Tensor detail::with_grad(const Tensor& input, Tensor out, const char* name,
                         std::function<Tensor(const Tensor&)> bw) {
  if (auto node = autograd::make_node(name, {&input})) {
    node->backward_fn = [bw = std::move(bw)](Node&, std::vector<Tensor>& g) {
      return std::vector<Tensor>{bw(g[0])};
    };
    autograd::set_history(out, node);
  }
  return out;
}

Tensor detail::with_view_grad(const Tensor& input, Tensor out, const char* name,
                              std::function<Tensor(const Tensor&)> pick) {
  if (auto node = autograd::make_node(name, {&input})) {
    const Shape sizes = input.sizes();
    const DType dtype = input.dtype();
    node->backward_fn = [sizes, dtype, pick](Node&, std::vector<Tensor>& g) {
      Tensor r = zeros(sizes, TensorOptions(dtype, g[0].device()));
      pick(r).copy_(g[0]);
      return std::vector<Tensor>{r};
    };
    node->view_region = std::move(pick);
    autograd::set_history(out, node);
  }
  return out;
}

void detail::check_inplace(const Tensor& self, const char* op) {
  REMAT_CHECK(!(grad_enabled() && self.requires_grad()), AutogradError, op,
              ": in-place write to a tensor of shape ", shape_str(self.sizes()),
              " that requires grad; use an out-of-place op, or no_grad for parameter updates");
}

// ---------------------------------------------------------------------------
// Storage

namespace {
std::atomic<std::uint64_t> storage_serials{1};  // the next Storage's serial
}  // namespace

Storage::Storage(std::size_t nbytes, Device device)
    : data_(allocator_for(device).allocate(nbytes, device.is_cuda() ? current_stream() : 0)),
      nbytes_(nbytes),
      device_(device),
      category_(current_category()),
      serial_(storage_serials.fetch_add(1, std::memory_order_relaxed)) {}

Storage::Storage(void* data, std::size_t nbytes, std::shared_ptr<void> keeper)
    : external_(data),
      keeper_(std::move(keeper)),
      nbytes_(nbytes),
      device_(kCPU),
      category_(MemoryCategory::other),
      serial_(storage_serials.fetch_add(1, std::memory_order_relaxed)) {
  REMAT_CHECK(keeper_ != nullptr, Error, "Storage over external memory: a keeper is required (it keeps the ",
              nbytes, " bytes alive)");
}

std::uint64_t Storage::next_serial() { return storage_serials.load(std::memory_order_relaxed); }

// ---------------------------------------------------------------------------
// Basic queries

std::int64_t Tensor::size(std::int64_t d) const {
  return impl().sizes[std::size_t(wrap_dim(d, dim(), "size"))];
}

std::int64_t Tensor::stride(std::int64_t d) const {
  return impl().strides[std::size_t(wrap_dim(d, dim(), "stride"))];
}

bool Tensor::is_contiguous() const {
  const auto& s = impl().sizes;
  const auto& st = impl().strides;
  std::int64_t expected = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    if (s[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

void detail::check_has_values(const Tensor& t, const char* what) {
  if (!t.device().is_meta()) return;
  const char* op = current_tag();
  throw DeviceError(std::string(*op ? op : what) + ": a meta tensor (" + dtype_name(t.dtype()) + " " +
                    shape_str(t.sizes()) + ") has a shape but no values" + (*op ? std::string(" (") + what + ")" : "") +
                    "; meta runs only what shapes decide (docs/META.md): run on cpu or cuda to read values");
}

namespace {
thread_local bool tls_meta_addresses = false;
}  // namespace

MetaAddressScope::MetaAddressScope() : previous_(tls_meta_addresses) { tls_meta_addresses = true; }
MetaAddressScope::~MetaAddressScope() { tls_meta_addresses = previous_; }
bool meta_addresses_active() { return tls_meta_addresses; }

void* Tensor::raw_data() const {
  const auto& im = impl();
  if (!(tls_meta_addresses && device().is_meta())) detail::check_has_values(*this, "data access");
  REMAT_CHECK(!im.released, Error, "a ", dtype_name(im.dtype), " tensor of shape ", shape_str(im.sizes),
              " was released (release_storage: its values live on another rank) and has no elements to read or write");
  if (!im.storage || !im.storage->data()) return nullptr;
  return static_cast<char*>(im.storage->data()) + im.offset * std::int64_t(element_size(im.dtype));
}


void Tensor::release_storage() const {
  auto& im = impl();
  if (im.storage) im.released_device = im.storage->device();
  im.storage.reset();
  im.released = true;
}

void Tensor::alias_storage_(const Tensor& src) const {
  REMAT_CHECK(src.defined() && src.sizes() == sizes() && src.dtype() == dtype() && src.is_contiguous(), ShapeError,
              "alias_storage_: the source must be a contiguous ", dtype_name(dtype()), " tensor of shape ",
              shape_str(sizes()), ", got ", src.defined() ? shape_str(src.sizes()) + " " + dtype_name(src.dtype())
                                                          : std::string("an undefined tensor"));
  auto& im = impl();
  const auto& from = src.impl();
  im.storage = from.storage;
  im.offset = from.offset;
  im.strides = from.strides;
  im.released = false;
}

void Tensor::reshape_storage_(const Tensor& src) const {
  REMAT_CHECK(src.defined() && src.dtype() == dtype() && src.device() == device() && src.is_contiguous(), ShapeError,
              "reshape_storage_: the source must be a contiguous ", dtype_name(dtype()), " tensor on ", device().str(),
              ", got ", src.defined() ? shape_str(src.sizes()) + " " + dtype_name(src.dtype()) + " on " + src.device().str()
                                      : std::string("an undefined tensor"));
  REMAT_CHECK(!grad().defined(), Error, "reshape_storage_: the ", shape_str(sizes()),
              " tensor already has a gradient (reshape a parameter before any backward)");
  auto& im = impl();
  const auto& from = src.impl();
  im.storage = from.storage;
  im.sizes = from.sizes;
  im.offset = from.offset;
  im.strides = from.strides;
  im.released = false;
  im.version->value.fetch_add(1);
}

// ---------------------------------------------------------------------------
// Element access

std::int64_t Tensor::element_offset(const Shape& index, const char* op) const {
  REMAT_CHECK(std::int64_t(index.size()) == dim(), ShapeError, op, ": index ", shape_str(index),
              " has ", index.size(), " entries for a tensor of shape ", shape_str(sizes()));
  std::int64_t off = storage_offset();
  for (std::size_t i = 0; i < index.size(); ++i) {
    std::int64_t k = index[i] < 0 ? index[i] + sizes()[i] : index[i];
    REMAT_CHECK(k >= 0 && k < sizes()[i], ShapeError, op, ": index ", shape_str(index),
                " is out of range for shape ", shape_str(sizes()));
    off += k * strides()[i];
  }
  return off;
}

double detail::read_element(const Tensor& t, std::int64_t off) {
  const std::size_t es = element_size(t.dtype());
  alignas(8) unsigned char buf[8];
  const char* src = static_cast<const char*>(t.impl().storage->data()) + off * std::int64_t(es);
  if (t.device().is_cuda())
    detail::cuda_backend("read_element", t.device()).copy_device_to_host(buf, src, es, current_stream());
  else
    std::memcpy(buf, src, es);
  return visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, buf, sizeof(T));
    return to_double(v);
  });
}

double Tensor::item() const {
  detail::check_has_values(*this, "item");
  REMAT_CHECK(numel() == 1, ShapeError, "item: expected a one-element tensor, got shape ",
              shape_str(sizes()));
  return detail::read_element(*this, element_offset(Shape(std::size_t(dim()), 0), "item"));
}

double Tensor::at(const Shape& index) const {
  detail::check_has_values(*this, "at");
  return detail::read_element(*this, element_offset(index, "at"));
}

void Tensor::set(const Shape& index, double value) {
  detail::check_inplace(*this, "set");
  detail::check_has_values(*this, "set");
  const std::int64_t off = element_offset(index, "set");
  const std::size_t es = element_size(dtype());
  char* dst = static_cast<char*>(impl().storage->data()) + off * std::int64_t(es);
  visit_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = from_double<T>(value);
    if (device().is_cuda())
      detail::cuda_backend("set", device()).copy_host_to_device(dst, &v, sizeof(T), current_stream());
    else
      std::memcpy(dst, &v, sizeof(T));
  });
  bump_version();
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(kCPU).to(dtype_v<T>).contiguous();
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}

void mirror_host_read(const Tensor& t, DType dtype) {
  // (Mirroring a GPU, the read's copies land in host memory: nothing on meta.)
  if (!t.defined() || !t.device().is_meta() || meta_kernels() != DeviceType::CPU) return;
  const Tensor c = t.detach().to(dtype).contiguous();  // to_vector's copies on a CPU tensor
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<bf16> Tensor::to_vector<bf16>() const;
template std::vector<f16> Tensor::to_vector<f16>() const;
template std::vector<std::int32_t> Tensor::to_vector<std::int32_t>() const;
template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

// ---------------------------------------------------------------------------
// Factories

Tensor empty(const Shape& sizes, TensorOptions opts) {
  detail::check_dims(sizes, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(std::size_t(shape_numel(sizes)) * element_size(opts.dtype), opts.device);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = opts.dtype;
  impl->version = std::make_shared<VersionCounter>();
  return Tensor(std::move(impl));
}

Tensor from_blob(void* data, const Shape& sizes, const Shape& strides, DType dtype, std::shared_ptr<void> keeper) {
  detail::check_dims(sizes, "from_blob");
  REMAT_CHECK(strides.size() == sizes.size(), ShapeError, "from_blob: ", sizes.size(), " sizes but ", strides.size(),
              " strides");
  std::int64_t span = 1;  // elements from the first to one past the last reached
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    REMAT_CHECK(strides[d] >= 0, ShapeError, "from_blob: stride ", strides[d], " of dim ", d,
                " is negative (remat's views have non-negative strides)");
    if (sizes[d] == 0) span = 0;
    if (span != 0) span += (sizes[d] - 1) * strides[d];
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, std::size_t(span) * element_size(dtype), std::move(keeper));
  impl->sizes = sizes;
  impl->strides = strides;
  impl->dtype = dtype;
  impl->version = std::make_shared<VersionCounter>();
  return Tensor(std::move(impl));
}

// Factories hand out fresh tensors at version 0: filling them is not an
// in-place write anyone could have observed.
Tensor full(const Shape& sizes, double value, TensorOptions opts) {
  Tensor t = empty(sizes, opts);
  t.fill_(value);
  t.impl().version->value.store(0);
  return t;
}
Tensor zeros(const Shape& sizes, TensorOptions opts) { return full(sizes, 0.0, opts); }
Tensor ones(const Shape& sizes, TensorOptions opts) { return full(sizes, 1.0, opts); }

Tensor arange(std::int64_t end, TensorOptions opts) { return arange(0.0, double(end), 1.0, opts); }

Tensor arange(double start, double end, double step, TensorOptions opts) {
  REMAT_CHECK(step != 0.0, Error, "arange: step must be non-zero");
  const auto n = std::max<std::int64_t>(0, std::int64_t(std::ceil((end - start) / step)));
  Tensor cpu = empty({n}, TensorOptions(opts.dtype, kCPU));
  visit_dtype(opts.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(cpu.raw_data());
    for (std::int64_t i = 0; i < n; ++i) p[i] = from_double<T>(start + double(i) * step);
  });
  return cpu.to(opts.device);
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape sizes, Device device) {
  if (sizes.empty() && values.size() != 1) sizes = {std::int64_t(values.size())};
  REMAT_CHECK(shape_numel(sizes) == std::int64_t(values.size()), ShapeError, "from_vector: ",
              values.size(), " values do not fill shape ", shape_str(sizes));
  Tensor cpu = empty(sizes, TensorOptions(dtype_v<T>, kCPU));
  if constexpr (std::is_same_v<T, bool>) {
    bool* p = static_cast<bool*>(cpu.raw_data());
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else {
    if (!values.empty()) std::memcpy(cpu.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return cpu.to(device);
}

template Tensor from_vector<float>(const std::vector<float>&, Shape, Device);
template Tensor from_vector<bf16>(const std::vector<bf16>&, Shape, Device);
template Tensor from_vector<f16>(const std::vector<f16>&, Shape, Device);
template Tensor from_vector<std::int32_t>(const std::vector<std::int32_t>&, Shape, Device);
template Tensor from_vector<std::int64_t>(const std::vector<std::int64_t>&, Shape, Device);
template Tensor from_vector<bool>(const std::vector<bool>&, Shape, Device);

namespace {
Tensor random_tensor(const Shape& sizes, TensorOptions opts, Generator* gen, bool normal,
                     const char* op) {
  REMAT_CHECK(is_floating(opts.dtype), DTypeError, op, ": expected a floating dtype (f32, bf16, ",
              "f16), got ", opts.dtype);
  Generator& g = gen ? *gen : default_generator(opts.device);
  const std::int64_t n = shape_numel(sizes);
  const RngState s = g.reserve(std::uint64_t(n));
  Tensor f = empty(sizes, TensorOptions(DType::f32, opts.device));
  if (opts.device.is_cpu()) {
    if (normal)
      philox_fill_normal(f.data<float>(), n, s);
    else
      philox_fill_uniform(f.data<float>(), n, s);
  } else {
    DeviceBackend& b = detail::cuda_backend(op, opts.device);
    if (normal)
      b.philox_normal(f.data<float>(), n, s.seed, s.offset, current_stream());
    else
      b.philox_uniform(f.data<float>(), n, s.seed, s.offset, current_stream());
  }
  return opts.dtype == DType::f32 ? f : f.to(opts.dtype);
}
}  // namespace

Tensor randn(const Shape& sizes, TensorOptions opts, Generator* gen) {
  return random_tensor(sizes, opts, gen, true, "randn");
}

Tensor rand(const Shape& sizes, TensorOptions opts, Generator* gen) {
  return random_tensor(sizes, opts, gen, false, "rand");
}


}  // namespace remat
