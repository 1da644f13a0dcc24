#include "engine/device.h"

#include "engine/error.h"

namespace remat {

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
    case DeviceType::Meta: return "meta";
  }
  return "?";
}

std::string Device::str() const {
  if (is_cuda()) return "cuda:" + std::to_string(index);
  return device_type_name(type);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return kCPU;
  if (text == "meta") return kMeta;
  if (text == "cuda") return cuda_device(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string n = text.substr(5);
    if (!n.empty() && n.find_first_not_of("0123456789") == std::string::npos)
      return cuda_device(std::stoi(n));
  }
  throw DeviceError("unknown device '" + text + "'; expected cpu, cuda, cuda:N or meta");
}

namespace {
thread_local Device t_default_device = kCPU;
}  // namespace

Device default_device() { return t_default_device; }

DefaultDeviceScope::DefaultDeviceScope(Device d) : previous_(t_default_device) { t_default_device = d; }
DefaultDeviceScope::~DefaultDeviceScope() { t_default_device = previous_; }

std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

}  // namespace remat
