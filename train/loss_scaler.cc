#include "train/loss_scaler.h"

#include <cmath>
#include <sstream>

#include "train/nonfinite.h"
#include "train/optimizer.h"

namespace remat {

LossScaler::LossScaler(bool enabled, Options options)
    : enabled_(enabled), options_(options), scale_(enabled ? options.init : 1.0) {}

void LossScaler::restore(double scale, std::int64_t good_steps) {
  scale_ = enabled_ ? scale : 1.0;
  good_steps_ = enabled_ ? good_steps : 0;
}

bool LossScaler::overflowed(double norm) const { return enabled_ && !std::isfinite(norm); }

void LossScaler::back_off(std::int64_t step, double norm, double loss, const std::string& stop_note) {
  good_steps_ = 0;
  if (scale_ / 2 < options_.min) {
    std::ostringstream msg;
    msg << "step " << step << ": f16 gradients overflow (norm " << (std::isnan(norm) ? "nan" : "inf")
        << ") at loss scale " << scale_ << ", and halving it would go below loss_scale_min " << options_.min
        << " (the loss " << loss << " is finite; the model's values outgrow f16)" << stop_note
        << "; lower --lr, or train with --dtype bf16";
    throw NonFiniteError(msg.str(), step, scale_);
  }
  scale_ /= 2;
}

void LossScaler::unscale(const std::vector<Tensor>& params, double& norm) const {
  if (!enabled_) return;
  scale_grads(params, float(1.0 / scale_));  // a power of two: exact
  norm /= scale_;
}

void LossScaler::grow() {
  if (enabled_ && ++good_steps_ >= options_.growth_interval) {
    scale_ *= 2;
    good_steps_ = 0;
  }
}

}  // namespace remat
