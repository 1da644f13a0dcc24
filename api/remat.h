// remat's public C++ API: include this one header.
//
//   #include <remat/remat.h>
//
// It brings in, all in namespace remat:
//   tensors and dtypes ........ engine/tensor.h, engine/dtype.h, engine/device.h
//   devices ................... engine/device_runtime.h (CUDA devices, the current
//                               device and stream, streams, events, syncs)
//   ops ....................... ops/ops.h (every differentiable op)
//   autograd .................. engine/autograd.h (backward, grad, hooks on
//                               gradients and on saved tensors, typed saved-tensor
//                               hooks), engine/grad_mode.h
//   custom ops ................ engine/custom_op.h (a differentiable op from a forward
//                               and a backward), engine/gradcheck.h (finite differences)
//   memory .................... engine/allocator.h (stats, categories, history)
//   random numbers ............ engine/rng.h
//   op hooks ......... engine/op_hooks.h
//   checkpointing ............. checkpoint/checkpoint.h, checkpoint/policy.h,
//                               checkpoint/output_discard.h, checkpoint/plan.h,
//                               checkpoint/dynamic_remat.h (DynamicRematScope: evict
//                               and recompute saved tensors under a byte budget)
//   modules and models ........ models/module.h, models/layers.h, models/block_stack.h
//                               (blocks run under any recompute plan), models/decoder.h,
//                               models/moe_layer.h, models/config.h, models/recompute.h
//   training .................. train/optimizer.h (AdamW, clipping, schedule),
//                               train/safetensors.h, train/data.h,
//                               train/adapter_files.h (LoRA adapters as PEFT folders)
//   errors .................... engine/error.h (remat::Error and its subclasses)
//
// Everything reachable from here is installed by `./remat install`; headers
// that are not (kernel helpers, the CUDA seam) are internal.
#pragma once

#include "checkpoint/checkpoint.h"
#include "checkpoint/dynamic_remat.h"
#include "checkpoint/output_discard.h"
#include "checkpoint/plan.h"
#include "checkpoint/policy.h"
#include "checkpoint/replay_memo.h"
#include "checkpoint/time_estimate.h"
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/custom_op.h"
#include "engine/device.h"
#include "engine/device_runtime.h"
#include "engine/op_hooks.h"
#include "engine/producer_observer.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/grad_mode.h"
#include "engine/gradcheck.h"
#include "engine/parallel_for.h"
#include "engine/rng.h"
#include "engine/tensor.h"
#include "models/block_stack.h"
#include "models/config.h"
#include "models/decoder.h"
#include "models/layers.h"
#include "models/module.h"
#include "models/moe_layer.h"
#include "models/recompute.h"
#include "moe/expert_parallel.h"
#include "ops/ops.h"
#include "parallel/comm_ops.h"
#include "parallel/grad_reducer.h"
#include "parallel/process_group.h"
#include "train/adapter_files.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/parallel_layout.h"
#include "train/safetensors.h"
#include "train/trainer.h"
