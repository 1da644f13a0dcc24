// Which device a meta run mirrors, and how it runs that device's code.
//
// By default meta stands for the CPU: it runs the CPU's kernels, which stop
// before touching memory (ops/kernel_table.h). set_meta_kernels(CUDA) makes
// it stand for a GPU: meta then runs CUDA's op code as it is, allocating its
// outputs, staging copies and workspaces on meta in a GPU run's order and
// passing its tensors' made-up addresses to the launchers, which return at
// once (inside a MetaAddressScope). Host reads of device values (to_vector's
// copies) land in host memory on a GPU, so they allocate nothing on meta.
// This header is all a launcher (a .cu file) needs to know about it.
#pragma once

#include "engine/device.h"

namespace remat {

// Which device's kernels a meta run mirrors, process-wide: the CPU's (the
// default) or CUDA's (what a GPU run allocates; needs a build with the CUDA
// back end, not a GPU). Throws DeviceError for another device type, or for
// CUDA in a build without the CUDA back end.
void set_meta_kernels(DeviceType t);
DeviceType meta_kernels();

// Whether tensors on `d` run CUDA's kernels: a CUDA device, or meta while it
// mirrors CUDA's (code choosing a device's path asks this, not is_cuda()).
bool runs_cuda_kernels(Device d);

// RAII: set_meta_kernels(t) for a scope, then the previous setting again.
class MetaKernelsScope {
 public:
  explicit MetaKernelsScope(DeviceType t);
  ~MetaKernelsScope();
  MetaKernelsScope(const MetaKernelsScope&) = delete;
  MetaKernelsScope& operator=(const MetaKernelsScope&) = delete;

 private:
  DeviceType previous_;
};

// RAII, this thread: inside, Tensor::raw_data() of a meta tensor returns the
// made-up address of its storage (never to be dereferenced) instead of
// throwing, and meta_addresses_active() is true. item(), at(), set() and
// to_vector() still throw.
class MetaAddressScope {
 public:
  MetaAddressScope();
  ~MetaAddressScope();
  MetaAddressScope(const MetaAddressScope&) = delete;
  MetaAddressScope& operator=(const MetaAddressScope&) = delete;

 private:
  bool previous_;
};

// Whether this thread is inside a MetaAddressScope: a kernel launcher, a
// cuBLASLt call or a runtime call on a kernel's behalf returns without
// touching the device.
bool meta_addresses_active();

}  // namespace remat
