// Device tags: where a tensor's storage lives.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace remat {

enum class DeviceType : std::uint8_t { CPU, CUDA };
// The number of device types (kernel tables keep one slot per type).
inline constexpr int kDeviceTypes = 2;
// "cpu" or "cuda".
const char* device_type_name(DeviceType t);

// A device: its type and, for CUDA, the ordinal. Cheap to copy and compare.
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  friend constexpr bool operator==(Device a, Device b) {
    return a.type == b.type && a.index == b.index;
  }

  // "cpu" or "cuda:N".
  std::string str() const;
  // Parses "cpu", "cuda" or "cuda:N"; throws DeviceError otherwise.
  static Device parse(const std::string& text);
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
inline constexpr Device cuda_device(int index = 0) { return Device(DeviceType::CUDA, index); }

std::ostream& operator<<(std::ostream& os, Device d);

}  // namespace remat
