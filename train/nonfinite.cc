#include "train/nonfinite.h"

#include <cmath>
#include <sstream>

namespace remat {

NonFiniteAction parse_nonfinite_action(const std::string& name) {
  if (name == "stop") return NonFiniteAction::stop;
  if (name == "skip") return NonFiniteAction::skip;
  throw Error("TrainOptions.on_nonfinite (--on-nonfinite) must be stop or skip, got '" + name + "'");
}

const char* nonfinite_action_name(NonFiniteAction a) { return a == NonFiniteAction::skip ? "skip" : "stop"; }

const char* nonfinite_name(double value) { return std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf"; }

NonFinitePolicy::NonFinitePolicy(NonFiniteAction action, std::int64_t max_skips_in_row)
    : action_(action), max_in_row_(max_skips_in_row) {}

void NonFinitePolicy::reject(std::int64_t step, const std::string& what, double value, double loss,
                             const std::string& stop_note) {
  const bool skip = action_ == NonFiniteAction::skip;
  const bool too_many = skip && in_row_ >= max_in_row_;
  if (skip && !too_many) {
    ++in_row_;
    ++skipped_;
    return;
  }
  std::ostringstream msg;
  msg << "step " << step << ": the " << what << " is " << nonfinite_name(value) << " (not finite)";
  if (what != "loss") msg << ", loss " << loss;
  if (too_many)
    msg << ", and the " << in_row_ << " step(s) before it were skipped for non-finite values"
        << " (--max-nonfinite-skips " << max_in_row_ << ")";
  msg << stop_note;
  if (!skip) msg << "; lower --lr, or --on-nonfinite skip to drop such steps";
  throw NonFiniteError(msg.str(), step, value);
}

}  // namespace remat
