// Kernels registered per (op, device). An op (or a family of ops sharing
// kernels) declares a struct of kernel function pointers and one
// KernelTable<Kernels> for it; each device registers its implementation of
// that struct at static initialisation: ops/ registers the CPU's next to the
// op, cuda/ registers CUDA's from its own files (ops/ never includes cuda/).
// Adding a device is registering its kernels; no op file changes.
//
// The dtype rule, written once: a device registers its kernels with the
// dtypes they compute in (KernelDTypes). The table stages every floating
// Tensor argument of an `f32` kernel to f32 before the call (a CPU kernel
// sees only f32 operands), and passes a `native` kernel's operands as they
// are (CUDA's kernels read bf16 and f16 themselves). The op's runner then
// converts each output to the dtype its OpSpec declares and each input
// gradient to its input's dtype (ops/op.h), so no op decides per device.
//
// The meta device registers no kernels: it runs the CPU's, under a
// DefaultDeviceScope(meta), so their staging copies, scratch and outputs are
// made on the meta allocator in the CPU's order; each CPU kernel returns
// before it touches memory when its operands are meta (skip_compute in
// ops/kernel_util.h). Meta's allocation sequence is the CPU's by
// construction, not by a second copy of every kernel. set_meta_kernels(CUDA)
// makes meta run CUDA's kernels instead, inside a MetaAddressScope
// (engine/meta_mirror.h): their native dtypes, outputs, staging copies and
// workspaces, in a GPU run's order, with every launch skipped.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/error.h"
#include "engine/meta_mirror.h"  // meta_kernels(), MetaAddressScope
#include "engine/op_hooks.h"    // ObservedWork
#include "engine/tensor.h"

namespace remat {

// The dtypes a device's kernels compute in.
enum class KernelDTypes : std::uint8_t {
  f32,     // f32 only: floating Tensor arguments arrive staged to f32
  native,  // the operands' own floating dtypes (f32, bf16, f16)
};

// What KernelTable<K> shares with every other table: its name and which
// devices registered kernels.
class KernelTableBase {
 public:
  // `name`: the op (or op family) the kernels serve, as errors name it.
  explicit KernelTableBase(const char* name) : name_(name) {}
  KernelTableBase(const KernelTableBase&) = delete;
  KernelTableBase& operator=(const KernelTableBase&) = delete;

  const char* name() const { return name_; }
  // Whether `t` has kernels (meta has whenever the device it mirrors has).
  bool has(DeviceType t) const { return registered_[std::size_t(kernel_slot(t))]; }
  // The device types with kernels, in DeviceType order (meta when the device it mirrors has).
  std::vector<DeviceType> devices() const;
  // The device type whose kernels `t` runs: meta_kernels() for meta, its own otherwise.
  static DeviceType kernel_slot(DeviceType t) { return t == DeviceType::Meta ? meta_kernels() : t; }

 protected:
  void mark(DeviceType t);
  // Throws DeviceError "<name>: no kernel for <device> (kernels registered
  // for: cpu, cuda)".
  [[noreturn]] void missing(Device device) const;
  // Throws Error: `t` registered twice.
  [[noreturn]] void duplicate(DeviceType t) const;
  // Throws Error: meta runs the CPU's kernels and registers none.
  [[noreturn]] void meta_registration() const;

 private:
  const char* name_;
  std::array<bool, kDeviceTypes> registered_{};
};

// `t` as a KernelDTypes::f32 kernel takes it: floating tensors of another
// dtype as an f32 copy (detached), anything else unchanged.
Tensor stage_f32(const Tensor& t);

template <class Kernels>
class KernelTable final : public KernelTableBase {
 public:
  using KernelTableBase::KernelTableBase;

  struct Entry {
    Kernels fns;
    KernelDTypes dtypes;
  };

  // Registers `t`'s kernels. Call at static initialisation (through
  // KernelRegistration below); throws Error if `t` already has kernels.
  void add(DeviceType t, Kernels fns, KernelDTypes dtypes) {
    if (t == DeviceType::Meta) meta_registration();
    if (has(t)) duplicate(t);
    entries_[std::size_t(t)] = Entry{std::move(fns), dtypes};
    mark(t);
  }

  // `device`'s kernels; throws DeviceError naming the table and the device
  // when it has none.
  const Entry& on(Device device) const {
    const auto& e = entries_[std::size_t(kernel_slot(device.type))];
    if (!e) missing(device);
    return *e;
  }

  // The dtype `device`'s kernels compute an operand of dtype `dtype` in (f32
  // for an f32 kernel's floating operands), e.g. for a buffer they write.
  DType compute_dtype(Device device, DType dtype) const {
    return on(device).dtypes == KernelDTypes::f32 && is_floating(dtype) ? DType::f32 : dtype;
  }
  // `t` as `device`'s kernels take it (stage_f32 for f32 kernels).
  Tensor stage(Device device, const Tensor& t) const {
    return on(device).dtypes == KernelDTypes::f32 ? stage_f32(t) : t;
  }

  // Runs kernel `fn` (a member of Kernels) of `device` on `args`. Each
  // argument the kernel takes as `const Tensor&` (or `Tensor`) is staged as
  // its dtypes require; one it takes as `Tensor&` is a buffer it writes (in
  // its compute dtype) and passes as it is.
  template <class R, class... P, class... A>
  R run(Device device, R (*Kernels::*fn)(P...), A&&... args) const {
    const Entry& e = on(device);
    const bool stage = e.dtypes == KernelDTypes::f32;
    if (device.is_meta()) {  // the mirrored device's kernel, allocating on meta and computing nothing
      DefaultDeviceScope scope(device);
      if (meta_kernels() == DeviceType::CPU) return (e.fns.*fn)(pass<P>(stage, std::forward<A>(args))...);
      MetaAddressScope addresses;  // a native device's code: its launches return at once
      return (e.fns.*fn)(pass<P>(stage, std::forward<A>(args))...);
    }
    const ObservedWork observed(name(), device);  // a profiler's, if one watches (engine/op_hooks.h)
    return (e.fns.*fn)(pass<P>(stage, std::forward<A>(args))...);
  }

 private:
  template <class P, class A>
  static decltype(auto) pass(bool stage, A&& a) {
    constexpr bool buffer = std::is_lvalue_reference_v<P> && !std::is_const_v<std::remove_reference_t<P>>;
    if constexpr (std::is_same_v<std::decay_t<P>, Tensor> && !buffer)
      return stage ? stage_f32(a) : Tensor(a);
    else
      return std::forward<A>(a);
  }

  std::array<std::optional<Entry>, kDeviceTypes> entries_;
};

// RAII registration at static initialisation:
//   const KernelRegistration<SwigluKernels> kCpu(swiglu_kernels(), DeviceType::CPU, {...}, KernelDTypes::f32);
template <class Kernels>
struct KernelRegistration {
  KernelRegistration(KernelTable<Kernels>& table, DeviceType t, Kernels fns, KernelDTypes dtypes) {
    table.add(t, std::move(fns), dtypes);
  }
};

}  // namespace remat
