// Device tags: where a tensor's storage lives.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace remat {

// Meta is the shape-only device: its tensors have shapes, dtypes, strides and
// storage sizes (drawn from a caching allocator that hands out addresses but
// no memory), and no values. Ops on meta run every check, shape rule,
// autograd record, save and hook, and the CPU's kernels up to the point where
// they would touch memory, so the allocation sequence is the CPU's exactly
// (docs/META.md).
enum class DeviceType : std::uint8_t { CPU, CUDA, Meta };
// The number of device types (kernel tables keep one slot per type).
inline constexpr int kDeviceTypes = 3;
// "cpu", "cuda" or "meta".
const char* device_type_name(DeviceType t);

// A device: its type and, for CUDA, the ordinal. Cheap to copy and compare.
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  constexpr bool is_meta() const { return type == DeviceType::Meta; }
  friend constexpr bool operator==(Device a, Device b) {
    return a.type == b.type && a.index == b.index;
  }

  // "cpu", "cuda:N" or "meta".
  std::string str() const;
  // Parses "cpu", "cuda", "cuda:N" or "meta"; throws DeviceError otherwise.
  static Device parse(const std::string& text);
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
inline constexpr Device cuda_device(int index = 0) { return Device(DeviceType::CUDA, index); }
inline constexpr Device kMeta{DeviceType::Meta, 0};

// The device a TensorOptions gets when none is named (kCPU unless a
// DefaultDeviceScope is active on this thread).
Device default_device();

// RAII: tensors created on this thread without a device while the scope lives
// go to `d`. Meta runs the CPU's kernels under one (ops/kernel_table.h), so
// their scratch and outputs land on the meta allocator.
class DefaultDeviceScope {
 public:
  explicit DefaultDeviceScope(Device d);
  ~DefaultDeviceScope();
  DefaultDeviceScope(const DefaultDeviceScope&) = delete;
  DefaultDeviceScope& operator=(const DefaultDeviceScope&) = delete;

 private:
  Device previous_;
};

std::ostream& operator<<(std::ostream& os, Device d);

}  // namespace remat
