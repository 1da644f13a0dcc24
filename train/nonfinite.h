// The non-finite policy of a training run (TrainOptions::on_nonfinite): a
// step whose loss or gradient norm is inf or NaN stops the run, or its
// update is dropped and the step tried again on the next batch.
#pragma once

#include <cstdint>
#include <string>

#include "engine/error.h"

namespace remat {

enum class NonFiniteAction {
  stop,  // throw NonFiniteError before any update or save
  skip,  // drop the step's update; stop after max_nonfinite_skips in a row
};
// "stop" or "skip"; Error naming TrainOptions.on_nonfinite (--on-nonfinite) and the value otherwise.
NonFiniteAction parse_nonfinite_action(const std::string& name);
const char* nonfinite_action_name(NonFiniteAction a);

// A step's loss or gradient norm was not finite (or the f16 loss scale
// collapsed) and the run stopped. Nothing was saved after the last good step.
class NonFiniteError : public Error {
 public:
  NonFiniteError(const std::string& message, std::int64_t step, double value)
      : Error(message), step_(step), value_(value) {}
  std::int64_t step() const { return step_; }  // the 1-based step that failed
  double value() const { return value_; }      // the offending loss, gradient norm or scale

 private:
  std::int64_t step_;
  double value_;
};

// "nan", "inf" or "-inf" for a value that is not finite.
const char* nonfinite_name(double value);

// The decisions of one Trainer::run on non-finite steps: what to do with
// one, and how many were skipped (in all, and in a row).
class NonFinitePolicy {
 public:
  NonFinitePolicy(NonFiniteAction action, std::int64_t max_skips_in_row);
  // A non-finite `value` ("loss" or "gradient norm", `what`) at 1-based
  // `step`, whose loss is `loss`: counts a skipped step, or throws
  // NonFiniteError naming them (action stop, or max_skips_in_row steps
  // skipped in a row before it), `stop_note` (what is on disk) appended.
  void reject(std::int64_t step, const std::string& what, double value, double loss, const std::string& stop_note);
  // A step updated: the run of skipped steps ends.
  void updated() { in_row_ = 0; }
  std::int64_t skipped() const { return skipped_; }  // steps skipped so far

 private:
  NonFiniteAction action_;
  std::int64_t max_in_row_;
  std::int64_t skipped_ = 0, in_row_ = 0;
};

}  // namespace remat
