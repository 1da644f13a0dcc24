// Dynamic loss scaling for f16 compute (as PyTorch's GradScaler): backward
// is seeded with the scale, the gradients are divided by it before the norm
// and clipping; a step whose scaled gradients overflow is skipped and the
// scale halves; after growth_interval good steps in a row it doubles.
// Powers of two keep the unscaling exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace remat {

class LossScaler {
 public:
  struct Options {
    double init = 65536;                   // the first scale
    std::int64_t growth_interval = 2000;   // good steps in a row before it doubles
    double min = 1;                        // halving below this throws NonFiniteError
  };
  // Scaling when `enabled` (f16 compute); otherwise the scale stays 1.
  LossScaler(bool enabled, Options options);

  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }  // 1 when not scaling
  std::int64_t good_steps() const { return good_steps_; }  // since the scale last changed (0 when not scaling)
  // Resuming: the saved scale and count (ignored, 1 and 0, when not scaling).
  void restore(double scale, std::int64_t good_steps);

  // True when the scaled gradients' norm `norm` shows an overflow (scaling, not finite).
  bool overflowed(double norm) const;
  // After an overflow at 1-based `step` (norm `norm`, finite loss `loss`):
  // halves the scale and restarts the count, or throws NonFiniteError when
  // the scale would fall below Options::min (`stop_note` appended).
  void back_off(std::int64_t step, double norm, double loss, const std::string& stop_note);
  // Divides the gradients of `params` and their `norm` by the scale
  // (exact: a power of two); nothing when not scaling.
  void unscale(const std::vector<Tensor>& params, double& norm) const;
  // A step updated: counts it, doubling the scale after growth_interval in a row.
  void grow();

 private:
  bool enabled_;
  Options options_;
  double scale_ = 1;
  std::int64_t good_steps_ = 0;
};

}  // namespace remat
