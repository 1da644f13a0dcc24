#include "ops/kernel_table.h"

namespace remat {

std::vector<DeviceType> KernelTableBase::devices() const {
  std::vector<DeviceType> d;
  for (int i = 0; i < kDeviceTypes; ++i)
    if (has(DeviceType(i))) d.push_back(DeviceType(i));
  return d;
}

void KernelTableBase::mark(DeviceType t) { registered_[std::size_t(t)] = true; }

void KernelTableBase::missing(Device device) const {
  std::string have;
  for (DeviceType t : devices()) have += std::string(have.empty() ? "" : ", ") + device_type_name(t);
  throw DeviceError(detail::concat(name_, ": no kernel for ", device, " (kernels registered for: ",
                                   have.empty() ? std::string("none") : have, ")"));
}

void KernelTableBase::duplicate(DeviceType t) const {
  throw Error(detail::concat(name_, ": ", device_type_name(t), " kernels registered twice"));
}

void KernelTableBase::meta_registration() const {
  throw Error(detail::concat(name_, ": meta kernels are not registered; meta runs the CPU's kernels, which stop "
                                    "before touching memory (ops/kernel_table.h)"));
}

Tensor stage_f32(const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::f32 || !is_floating(t.dtype())) return t;
  return t.detach().to(DType::f32);
}

}  // namespace remat
