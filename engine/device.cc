#include "engine/device.h"

#include "engine/error.h"

namespace remat {

const char* device_type_name(DeviceType t) { return t == DeviceType::CPU ? "cpu" : "cuda"; }

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return kCPU;
  if (text == "cuda") return cuda_device(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string n = text.substr(5);
    if (!n.empty() && n.find_first_not_of("0123456789") == std::string::npos)
      return cuda_device(std::stoi(n));
  }
  throw DeviceError("unknown device '" + text + "'; expected cpu, cuda or cuda:N");
}

std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

}  // namespace remat
