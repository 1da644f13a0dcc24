// Output-discard checkpoints: an op's output is kept only as long as its
// forward consumers hold it; where a later op saves that output for backward,
// the save holds a recipe (the producing function and its inputs) instead of
// the data, and the output is regenerated right before the backward that
// needs it. Several saves of it share one regeneration: the first unpack
// keeps the output until the last of those saves is released. (The MoE
// router's FP32 cast of its input uses this, and sequence parallelism's
// gathered inputs of the column-parallel projections: models/layers.h.)
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/autograd.h"

namespace remat {

class DiscardedOutput {
 public:
  using Producer = std::function<Tensor(const std::vector<Tensor>&)>;

  // Runs producer(inputs) now. `name` labels the region in errors. Keep this
  // object alive while the consumers run; the recipes keep the inputs alive
  // after it is gone.
  DiscardedOutput(const char* name, Producer producer, std::vector<Tensor> inputs);

  // The output; drop every handle to it once the forward consumers are done.
  const Tensor& output() const { return output_; }
  // Drops this object's handle to the output.
  void release_output() { output_ = Tensor(); }
  // Hooks to activate (SavedTensorHooksScope) around the consumers: their
  // saves of output() become recipes; other saves pass through unchanged.
  std::shared_ptr<SavedTensorHooks> hooks() const { return hooks_; }

  // Regenerations run on this thread since it started.
  static std::int64_t regenerations();

 private:
  std::shared_ptr<const std::vector<Tensor>> inputs_;
  Tensor output_;
  std::shared_ptr<SavedTensorHooks> hooks_;
};

}  // namespace remat
