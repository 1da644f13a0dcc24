// Saved tensors: the stack of saved-tensor hooks, the checkpoint region new
// saves belong to, and SavedTensor itself (pack through the hooks at save
// time, version check and unpack at backward, release).
#include <cxxabi.h>

#include <algorithm>
#include <any>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/autograd_internal.h"

namespace remat {

namespace {
thread_local std::vector<std::shared_ptr<SavedTensorHooks>> tls_hooks;
thread_local std::int64_t tls_region = -1;
std::atomic<std::uint64_t> g_save_id{0};
}  // namespace

// ---------------------------------------------------------------------------
// Hooks and regions

SavedTensorHooksScope::SavedTensorHooksScope(std::shared_ptr<SavedTensorHooks> hooks) {
  REMAT_CHECK(hooks != nullptr, Error, "SavedTensorHooksScope: hooks must not be null");
  tls_hooks.push_back(std::move(hooks));
}
SavedTensorHooksScope::~SavedTensorHooksScope() { tls_hooks.pop_back(); }

DisableSavedTensorHooks::DisableSavedTensorHooks() : saved_(std::move(tls_hooks)) {
  tls_hooks.clear();
}
DisableSavedTensorHooks::~DisableSavedTensorHooks() { tls_hooks = std::move(saved_); }

std::string type_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(type.name());
}

std::string SavedTensorHooks::name() const { return type_name(typeid(*this)); }

std::size_t SavedTensorHooks::held_bytes(const std::any& packed) const {
  if (const Tensor* t = std::any_cast<Tensor>(&packed)) return t->defined() ? t->nbytes() : 0;
  return 0;
}

bool TypedSavedTensorHooks::accepts(const std::any& value, const SaveInfo& info) const {
  const Tensor* t = std::any_cast<Tensor>(&value);
  return t != nullptr && wants(*t, info);
}

std::any TypedSavedTensorHooks::pack(std::any value, const SaveInfo& info) {
  return pack_tensor(std::any_cast<const Tensor&>(value), info);
}

std::any TypedSavedTensorHooks::unpack(std::any packed, const SaveInfo& info) {
  return unpack_tensor(std::move(packed), info);
}

namespace {

// "save #7 of op 'matmul' (shape [4, 8] f32)": which save an error is about.
std::string describe_save(const SaveInfo& info) {
  std::ostringstream o;
  o << "save #" << info.id << " of op '" << info.op << "' (shape " << shape_str(info.meta.sizes) << " "
    << info.meta.dtype;
  if (info.region >= 0) o << ", checkpoint region " << info.region;
  o << ")";
  return o.str();
}

std::string describe_value(const std::any& v) {
  if (const Tensor* t = std::any_cast<Tensor>(&v)) {
    if (!t->defined()) return "an undefined Tensor";
    std::ostringstream o;
    o << "a Tensor of shape " << shape_str(t->sizes()) << " " << t->dtype();
    return o.str();
  }
  if (!v.has_value()) return "an empty value";
  return "a value of type " + type_name(v.type());
}

}  // namespace

std::int64_t current_save_region() { return tls_region; }
RegionScope::RegionScope(std::int64_t region) : previous_(tls_region) { tls_region = region; }
RegionScope::~RegionScope() { tls_region = previous_; }

// ---------------------------------------------------------------------------
// SavedTensor

SavedTensor::SavedTensor(const Tensor& t, const char* op, bool is_output) {
  info_.id = ++g_save_id;
  info_.op = op;
  info_.is_output = is_output;
  info_.region = tls_region;
  if (!t.defined()) return;
  defined_ = true;
  info_.meta = TensorMeta{t.sizes(), t.dtype(), t.device()};
  info_.bytes = t.nbytes();
  saved_version_ = t.version();
  version_ = t.impl().version;
  std::any value = t.detach();
  // Innermost (last pushed) first; a hook that declines the value is skipped.
  for (auto it = tls_hooks.rbegin(); it != tls_hooks.rend(); ++it) {
    const auto& h = *it;
    if (!h->accepts(value, info_)) continue;
    Packer p{h, false, {}};
    if (const Tensor* v = std::any_cast<Tensor>(&value); v && v->defined()) {
      p.got_tensor = true;
      p.meta = TensorMeta{v->sizes(), v->dtype(), v->device()};
    }
    const std::type_info& given = value.type();
    std::optional<SaveInfo> own;
    if (p.got_tensor && (p.meta.sizes != info_.meta.sizes || p.meta.dtype != info_.meta.dtype)) {
      own = info_;
      own->meta = p.meta;
    }
    try {
      value = h->pack(std::move(value), own ? *own : info_);
    } catch (const std::bad_any_cast&) {
      throw AutogradError("saved-tensor hook '" + h->name() + "' failed on " + describe_save(info_) +
                          ": its pack was given " +
                          (p.got_tensor ? "a Tensor" : "a value of type " + type_name(given)) +
                          " and cast it to another type (std::bad_any_cast). Hooks outside a checkpoint region "
                          "or another hook receive what the inner hook packed; derive from TypedSavedTensorHooks "
                          "to see only tensors");
    }
    hooks_.push_back(std::move(p));
  }
  if (hooks_.empty())
    held_bytes_ = info_.bytes;
  else
    held_bytes_ = hooks_.back().hooks->held_bytes(value);
  packed_ = std::move(value);
  // The registry counts the packed tensor's storage (deduplicated), or what
  // the hook reports it keeps.
  if (const Tensor* p = std::any_cast<Tensor>(&packed_); p && p->defined() && held_bytes_ > 0) {
    held_ = *p;
    detail::saved_bytes_tensor(held_, info_.op, info_.region, +1, 1);
  } else if (held_bytes_ > 0) {
    detail::saved_bytes_raw(this, std::int64_t(held_bytes_), info_.op, info_.region, +1, 1);
  }
}

SavedTensor::~SavedTensor() { release(); }

void SavedTensor::release() {
  if (released_) return;
  released_ = true;
  if (!defined_) return;
  if (held_.defined())
    detail::saved_bytes_tensor(held_, info_.op, info_.region, -1, -1);
  else if (held_bytes_ > 0)
    detail::saved_bytes_raw(this, std::int64_t(held_bytes_), info_.op, info_.region, -1, -1);
  held_ = Tensor();
  held_bytes_ = 0;
  // Tell the hooks, outermost first (the order unpack would run in).
  // Only the outermost packer holds packed_; inner ones' values live inside
  // it and go with it.
  if (!hooks_.empty()) hooks_.back().hooks->on_release(packed_, info_);
  packed_.reset();
}

Tensor SavedTensor::unpack() const {
  REMAT_CHECK(!released_, AutogradError, "backward through op '", info_.op,
              "' a second time: its saved tensors were freed after the first backward; pass "
              "retain_graph=true to the first backward if you need to run it twice");
  if (!defined_) return Tensor();
  const std::uint64_t now = version_->value.load();
  REMAT_CHECK(now == saved_version_, AutogradError, "a tensor of shape ",
              shape_str(info_.meta.sizes), " saved by op '", info_.op,
              "' for backward was modified in place afterwards (saved at version ",
              saved_version_, ", now version ", now,
              "); clone it before the in-place op, or use an out-of-place op");
  std::any value = packed_;
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) {
    const auto& h = *it->hooks;
    // A hook sees the shape and dtype of what it packed (an inner hook's
    // tensor may differ from the original save's).
    std::optional<SaveInfo> own;
    if (it->got_tensor && (it->meta.sizes != info_.meta.sizes || it->meta.dtype != info_.meta.dtype)) {
      own = info_;
      own->meta = it->meta;
    }
    try {
      value = it->hooks->unpack(std::move(value), own ? *own : info_);
    } catch (const std::bad_any_cast&) {
      throw AutogradError("saved-tensor hook '" + h.name() + "' failed to unpack " + describe_save(info_) +
                          ": it cast its packed value to another type (std::bad_any_cast)");
    }
    if (!it->got_tensor) continue;
    const Tensor* t = std::any_cast<Tensor>(&value);
    const bool same = t && t->defined() && t->sizes() == it->meta.sizes && t->dtype() == it->meta.dtype;
    REMAT_CHECK(same, AutogradError, "saved-tensor hook '", h.name(), "' unpacked ", describe_save(info_), " to ",
                describe_value(value), ", expected the Tensor it packed (shape ", shape_str(it->meta.sizes), " ",
                it->meta.dtype, ")");
  }
  const Tensor* t = std::any_cast<Tensor>(&value);
  REMAT_CHECK(t != nullptr, AutogradError, "saved-tensor hooks for op '", info_.op,
              "' did not unpack to a tensor (got ", describe_value(value), ")");
  REMAT_CHECK(t->sizes() == info_.meta.sizes && t->dtype() == info_.meta.dtype, AutogradError,
              "saved-tensor hooks for op '", info_.op, "' unpacked shape ", shape_str(t->sizes()),
              " ", t->dtype(), ", expected ", shape_str(info_.meta.sizes), " ", info_.meta.dtype);
  return *t;
}

}  // namespace remat
