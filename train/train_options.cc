#include "train/train_options.h"

#include <cmath>
#include <string>

#include "engine/error.h"
#include "train/zero.h"

namespace remat {

void validate_train_options(const TrainOptions& o) {
  auto real = [](const char* name, double v, double lo, bool lo_open, const char* range) {
    REMAT_CHECK(std::isfinite(v) && (lo_open ? v > lo : v >= lo), Error, "TrainOptions.", name, " must be ", range,
                ", got ", v);
  };
  auto integer = [](const char* name, std::int64_t v, std::int64_t lo) {
    REMAT_CHECK(v >= lo, Error, "TrainOptions.", name, " must be >= ", lo, ", got ", v);
  };
  integer("steps (--steps)", o.steps, 1);
  integer("stop_after (--stop-after)", o.stop_after, 0);
  integer("warmup (--warmup)", o.warmup, 0);
  integer("grad_accum (--grad-accum)", o.grad_accum, 1);
  real("lr (--lr)", o.lr, 0, true, "a finite number > 0");
  real("min_lr", o.min_lr, 0, false, "a finite number >= 0");
  REMAT_CHECK(o.min_lr <= o.lr, Error, "TrainOptions.min_lr must be <= lr (", o.lr, "), got ", o.min_lr);
  real("clip", o.clip, 0, false, "a finite number >= 0 (0: no clipping)");
  real("weight_decay", o.weight_decay, 0, false, "a finite number >= 0");
  integer("eval_every (--eval-every)", o.eval_every, 0);
  integer("eval_batches", o.eval_batches, 1);
  integer("save_every (--save-every)", o.save_every, 0);
  integer("dp (--dp)", o.dp, 0);
  integer("ep (--ep)", o.ep, 1);
  integer("tp (--tp)", o.tp, 1);
  integer("bucket_bytes (--bucket-mb)", o.bucket_bytes, 1);
  check_zero_stage(o.zero);
  integer("max_nonfinite_skips (--max-nonfinite-skips)", o.max_nonfinite_skips, 1);
  real("loss_scale_min", o.loss_scale_min, 0, true, "a finite number > 0");
  real("loss_scale_init", o.loss_scale_init, 0, true, "a finite number > 0");
  REMAT_CHECK(o.loss_scale_init >= o.loss_scale_min, Error, "TrainOptions.loss_scale_init must be >= loss_scale_min (",
              o.loss_scale_min, "), got ", o.loss_scale_init);
  integer("loss_scale_growth_interval", o.loss_scale_growth_interval, 1);
  REMAT_CHECK(o.adapter.empty() || (!o.init_model.empty() && o.config.lora.enabled()), Error,
              "TrainOptions.adapter (--adapter ", o.adapter, ") needs its base model (init_model, --model DIR) and "
              "config.lora set to the adapter's");
  if (const auto& r = o.seq_range) {
    const std::string text = seq_range_text(*r);
    REMAT_CHECK(r->min >= 1 && r->min <= r->max, Error, "TrainOptions.seq_range (--seq-range) ", text,
                ": expected 1 <= MIN <= MAX");
    REMAT_CHECK(r->max == o.config.seq, Error, "TrainOptions.seq_range (--seq-range) ", text,
                ": MAX must equal config.seq (", o.config.seq, "): the model is built for the longest sequence");
    REMAT_CHECK(!o.sp, Error, "--seq-range ", text, " with --sp: sequence parallelism splits every sequence over the ",
                o.tp, " --tp ranks, so each batch's length would have to divide by ", o.tp,
                "; drop --sp (plain --tp takes any length) or --seq-range");
  }
}

}  // namespace remat
