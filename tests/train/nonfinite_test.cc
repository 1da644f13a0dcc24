// Non-finite values in training and f16 loss scaling: a non-finite loss or
// gradient norm stops the run (NonFiniteError naming the step and the value)
// before any update or save, so the state on disk stays the last good one;
// --on-nonfinite skip drops such steps (parameters untouched, counted) and
// stops after N in a row; f16 compute scales the loss dynamically (overflow:
// skip and halve; growth after an interval). TrainOptions are validated by
// the Trainer. The "[mpi]" case also runs under `mpirun -np 2`
// (tests/train/nonfinite_cli_test.sh): every rank takes the same decision
// when only one rank's values go bad.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <unistd.h>

#include "parallel/process_group.h"
#include "train/trainer.h"
#include "tests/train/train_test_util.h"

using namespace remat;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string temp_dir() { return test::temp_dir("nonfinite"); }

// A small model in one process (also when the binary runs under mpirun).
TrainOptions small_options(std::int64_t steps) {
  TrainOptions o = test::small_options(steps);
  o.config.dropout = 0;
  o.group = single_process_group();
  return o;
}

using Params = std::map<std::string, std::vector<float>>;
Params params_of(Trainer& t) {
  Params p;
  for (auto& [name, v] : t.model().named_parameters()) p[name] = v.to_vector<float>();
  return p;
}

// The NonFiniteError run() throws (fails the test if it throws nothing).
NonFiniteError run_expecting_error(Trainer& t, const std::function<void(const StepStats&)>& on_step) {
  try {
    t.run(on_step);
  } catch (const NonFiniteError& e) {
    return e;
  }
  FAIL("run() finished without a NonFiniteError");
  return NonFiniteError("", 0, 0);
}

}  // namespace

TEST_CASE("TrainOptions are validated by the Trainer, naming the option and the value", "[train][nonfinite]") {
  auto rejects = [](const std::function<void(TrainOptions&)>& edit, const std::string& option,
                    const std::string& value) {
    TrainOptions o = small_options(4);
    edit(o);
    INFO(option << " = " << value);
    CHECK_THROWS_WITH([&] { Trainer t(o); }(), Catch::Contains("TrainOptions." + option) && Catch::Contains("got " + value));
  };
  rejects([](TrainOptions& o) { o.lr = kNaN; }, "lr", "nan");
  rejects([](TrainOptions& o) { o.lr = kInf; }, "lr", "inf");
  rejects([](TrainOptions& o) { o.lr = 0; }, "lr", "0");
  rejects([](TrainOptions& o) { o.min_lr = -1e-4; }, "min_lr", "-0.0001");
  rejects([](TrainOptions& o) { o.min_lr = 1.0; }, "min_lr must be <= lr", "1");
  rejects([](TrainOptions& o) { o.clip = kNaN; }, "clip", "nan");
  rejects([](TrainOptions& o) { o.clip = -1; }, "clip", "-1");
  rejects([](TrainOptions& o) { o.weight_decay = kInf; }, "weight_decay", "inf");
  rejects([](TrainOptions& o) { o.weight_decay = -0.1; }, "weight_decay", "-0.1");
  rejects([](TrainOptions& o) { o.steps = 0; }, "steps", "0");
  rejects([](TrainOptions& o) { o.warmup = -1; }, "warmup", "-1");
  rejects([](TrainOptions& o) { o.eval_batches = 0; }, "eval_batches", "0");
  rejects([](TrainOptions& o) { o.bucket_bytes = 0; }, "bucket_bytes", "0");
  rejects([](TrainOptions& o) { o.max_nonfinite_skips = 0; }, "max_nonfinite_skips", "0");
  rejects([](TrainOptions& o) { o.loss_scale_init = kNaN; }, "loss_scale_init", "nan");
  rejects([](TrainOptions& o) { o.loss_scale_init = 0.5; }, "loss_scale_init must be >= loss_scale_min", "0.5");
  rejects([](TrainOptions& o) { o.loss_scale_min = 0; }, "loss_scale_min", "0");
  rejects([](TrainOptions& o) { o.loss_scale_growth_interval = 0; }, "loss_scale_growth_interval", "0");
  // Names are enums in TrainOptions, parsed at the edge with the same messages.
  CHECK_THROWS_WITH(parse_nonfinite_action("ignore"),
                    Catch::Contains("TrainOptions.on_nonfinite") && Catch::Contains("got 'ignore'"));
  CHECK(parse_nonfinite_action("skip") == NonFiniteAction::skip);
  CHECK(std::string(nonfinite_action_name(NonFiniteAction::stop)) == "stop");
  // A finite but huge learning rate is accepted (it is the run that fails).
  TrainOptions ok = small_options(4);
  ok.lr = 1e30;
  CHECK_NOTHROW([&] { Trainer t(ok); }());
}

TEST_CASE("a non-finite loss stops the run naming the step and the value; the saved state is untouched",
          "[train][nonfinite]") {
  const std::string dir = temp_dir();
  TrainOptions o = small_options(10);
  o.save_dir = dir;
  o.save_every = 2;
  o.fault_loss = [](std::int64_t step, double& loss) {
    if (step == 5) loss = kNaN;
  };
  Trainer t(o);
  std::string saved_at_4, prev_at_4;
  Params params_at_4;
  std::vector<std::int64_t> steps;
  const NonFiniteError e = run_expecting_error(t, [&](const StepStats& s) {
    steps.push_back(s.step);
    CHECK_FALSE(s.skipped);
    if (s.step == 4) {
      saved_at_4 = test::read_all(dir + "/state.safetensors");
      prev_at_4 = test::read_all(dir + "/state.prev.safetensors");
      params_at_4 = params_of(t);
    }
  });
  CHECK(steps == std::vector<std::int64_t>{1, 2, 3, 4});
  CHECK(e.step() == 5);
  CHECK(std::isnan(e.value()));
  const std::string what = e.what();
  CHECK_THAT(what, Catch::Contains("step 5") && Catch::Contains("loss is nan") &&
                       Catch::Contains("nothing saved after step 4") && Catch::Contains(dir + "/state.safetensors"));
  CHECK(t.step() == 4);
  // Nothing was saved or updated after the bad step: the files are the ones
  // written at step 4, byte for byte, and so are the parameters.
  CHECK(test::read_all(dir + "/state.safetensors") == saved_at_4);
  CHECK(test::read_all(dir + "/state.prev.safetensors") == prev_at_4);
  CHECK(params_of(t) == params_at_4);
  // And the state resumes: a fresh trainer continues from step 4.
  TrainOptions r = small_options(10);
  r.resume_dir = dir;
  Trainer resumed(r);
  CHECK(resumed.step() == 4);
  CHECK(params_of(resumed) == params_at_4);
}

TEST_CASE("a learning rate that diverges stops at the first non-finite loss without saving it",
          "[train][nonfinite]") {
  const std::string dir = temp_dir();
  TrainOptions o = small_options(20);
  o.lr = 1e30;  // finite, so accepted; the first update throws the weights far out
  o.min_lr = 0;
  o.save_dir = dir;
  o.save_every = 1;
  Trainer t(o);
  std::string last_saved;
  std::int64_t last_good = 0;
  const NonFiniteError e = run_expecting_error(t, [&](const StepStats& s) {
    CHECK(std::isfinite(s.loss));
    last_good = s.step;
    last_saved = test::read_all(dir + "/state.safetensors");
  });
  INFO(e.what());
  CHECK(e.step() == last_good + 1);
  CHECK(e.step() <= 3);
  CHECK_FALSE(std::isfinite(e.value()));
  CHECK(t.step() == last_good);
  CHECK(test::read_all(dir + "/state.safetensors") == last_saved);
}

TEST_CASE("a non-finite gradient norm stops the run before the update", "[train][nonfinite]") {
  TrainOptions o = small_options(10);
  o.fault_seed = [](std::int64_t step, double& seed) {
    if (step == 3) seed = kInf;  // the gradients become inf / NaN; the loss stays finite
  };
  Trainer t(o);
  Params params_at_2;
  const NonFiniteError e = run_expecting_error(t, [&](const StepStats& s) {
    if (s.step == 2) params_at_2 = params_of(t);
  });
  CHECK(e.step() == 3);
  CHECK_FALSE(std::isfinite(e.value()));
  CHECK_THAT(std::string(e.what()), Catch::Contains("step 3") && Catch::Contains("gradient norm is") &&
                                        Catch::Contains("--on-nonfinite skip"));
  CHECK(t.step() == 2);
  CHECK(params_of(t) == params_at_2);
}

TEST_CASE("--on-nonfinite skip drops the update, counts it, retries the step on the next batch",
          "[train][nonfinite]") {
  // The reference: no faults.
  std::vector<StepStats> ref;
  {
    Trainer t(small_options(8));
    t.run([&](const StepStats& s) { ref.push_back(s); });
  }
  TrainOptions o = small_options(8);
  o.on_nonfinite = NonFiniteAction::skip;
  o.max_nonfinite_skips = 3;
  int loss_faults = 0, seed_faults = 0;
  double faulted_local_loss = 0;
  o.fault_loss = [&](std::int64_t step, double& loss) {
    if (step == 4 && loss_faults < 2) {  // two attempts at step 4 in a row
      if (loss_faults == 0) faulted_local_loss = loss;
      ++loss_faults;
      loss = kNaN;
    }
  };
  o.fault_seed = [&](std::int64_t step, double& seed) {
    if (step == 6 && seed_faults++ == 0) seed = kInf;  // once at step 6: non-finite gradients
  };
  Trainer t(o);
  std::vector<StepStats> got;
  std::vector<bool> untouched;
  Params last = params_of(t);
  t.run([&](const StepStats& s) {
    got.push_back(s);
    const Params now = params_of(t);
    if (s.skipped) untouched.push_back(now == last);
    last = now;
  });
  REQUIRE(got.size() == 11);  // 8 steps + 3 skipped attempts
  const std::vector<std::int64_t> steps = {1, 2, 3, 4, 4, 4, 5, 6, 6, 7, 8};
  const std::vector<bool> skipped = {false, false, false, true, true, false, false, true, false, false, false};
  const std::vector<std::int64_t> counts = {0, 0, 0, 1, 2, 2, 2, 3, 3, 3, 3};
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("entry " << i);
    CHECK(got[i].step == steps[i]);
    CHECK(got[i].skipped == skipped[i]);
    CHECK_FALSE(got[i].overflow);
    CHECK(got[i].skipped_steps == counts[i]);
    CHECK(got[i].loss_scale == 1.0);
  }
  CHECK(untouched == std::vector<bool>{true, true, true});  // parameters untouched by skipped steps
  CHECK(t.step() == 8);
  // Until the first skip the run is the reference's; the skipped step saw the
  // reference's batch (its loss before the fault), and the schedule did not
  // advance: a retried step has the lr of its first attempt.
  for (std::size_t i = 0; i < 3; ++i) CHECK(got[i].loss == ref[i].loss);
  CHECK(faulted_local_loss == ref[3].loss);
  CHECK(std::isnan(got[3].loss));
  CHECK(std::isnan(got[3].grad_norm));  // backward did not run
  CHECK(got[5].lr == got[3].lr);
  CHECK(got[5].lr == ref[3].lr);
  CHECK(std::isfinite(got[7].loss));
  CHECK_FALSE(std::isfinite(got[7].grad_norm));
  // The data moved on: the retried step 4 trained on a later batch.
  CHECK(got[5].loss != ref[3].loss);
}

TEST_CASE("a run with skipped steps saves and resumes bit-identically (skips advance the data, not the step)",
          "[train][nonfinite][resume]") {
  auto options = [](std::int64_t stop_after, const std::string& save, const std::string& resume) {
    TrainOptions o = small_options(8);
    o.config.dropout = 0.1;  // the dropout stream has to be restored too
    o.on_nonfinite = NonFiniteAction::skip;
    o.stop_after = stop_after;
    o.save_dir = save;
    o.resume_dir = resume;
    o.fault_loss = [n = 0](std::int64_t step, double& loss) mutable {
      if (step == 3 && n++ < 2) loss = kNaN;
    };
    return o;
  };
  std::vector<double> straight, split;
  {
    Trainer t(options(0, "", ""));
    t.run([&](const StepStats& s) {
      if (!s.skipped) straight.push_back(s.loss);
    });
  }
  const std::string dir = temp_dir();
  {
    Trainer t(options(5, dir, ""));
    t.run([&](const StepStats& s) {
      if (!s.skipped) split.push_back(s.loss);
    });
    CHECK(t.step() == 5);
  }
  Trainer t(options(0, "", dir));
  CHECK(t.step() == 5);
  t.run([&](const StepStats& s) { split.push_back(s.loss); });
  CHECK(split == straight);
}

TEST_CASE("--on-nonfinite skip stops after max_nonfinite_skips skipped steps in a row", "[train][nonfinite]") {
  const std::string dir = temp_dir();
  TrainOptions o = small_options(10);
  o.on_nonfinite = NonFiniteAction::skip;
  o.max_nonfinite_skips = 3;
  o.save_dir = dir;
  o.save_every = 1;
  o.fault_loss = [](std::int64_t step, double& loss) {
    if (step >= 3) loss = kNaN;  // for good
  };
  Trainer t(o);
  std::vector<std::int64_t> counts;
  std::string saved_at_2;
  const NonFiniteError e = run_expecting_error(t, [&](const StepStats& s) {
    counts.push_back(s.skipped_steps);
    if (s.step == 2) saved_at_2 = test::read_all(dir + "/state.safetensors");
  });
  CHECK(counts == std::vector<std::int64_t>{0, 0, 1, 2, 3});
  CHECK(e.step() == 3);
  CHECK_THAT(std::string(e.what()), Catch::Contains("step 3") && Catch::Contains("loss is nan") &&
                                        Catch::Contains("3 step(s) before it were skipped") &&
                                        Catch::Contains("--max-nonfinite-skips 3"));
  CHECK(t.step() == 2);
  CHECK(test::read_all(dir + "/state.safetensors") == saved_at_2);
}

TEST_CASE("f32 and bf16 do not scale the loss", "[train][f16]") {
  for (const std::string dtype : {"f32", "bf16"}) {
    TrainOptions o = small_options(3);
    o.dtype = compute_dtype_from_name(dtype);
    Trainer t(o);
    CHECK(t.loss_scale() == 1.0);
    t.run([&](const StepStats& s) {
      CHECK(s.loss_scale == 1.0);
      CHECK_FALSE(s.skipped);
    });
  }
}

TEST_CASE("training in f16 with dynamic loss scaling lowers the loss like f32", "[train][f16]") {
  auto train = [](const std::string& dtype, std::vector<StepStats>& stats) {
    TrainOptions o;
    o.config = ModelConfig::named("tiny");
    o.config.seq = 64;  // small enough for the suite: about 10 s of CPU for both runs
    o.config.batch = 4;
    o.steps = 20;
    o.warmup = 5;
    o.eval_every = 0;
    o.eval_batches = 1;
    o.dtype = compute_dtype_from_name(dtype);
    o.group = single_process_group();
    Trainer t(o);
    t.run([&](const StepStats& s) { stats.push_back(s); });
    return t.loss_scale();
  };
  std::vector<StepStats> f, h;
  train("f32", f);
  const double final_scale = train("f16", h);
  std::vector<double> losses;
  for (const StepStats& s : h)
    if (!s.skipped) losses.push_back(s.loss);
  REQUIRE(losses.size() == 20);
  CHECK(h.front().loss_scale == 65536.0);
  CHECK(losses.back() < losses.front() - 1.0);
  CHECK(std::fabs(losses.back() - f.back().loss) <= 0.05 * f.back().loss);
  for (const StepStats& s : h) {
    CHECK(std::isfinite(s.loss));
    CHECK(s.skipped == s.overflow);  // the only skips are overflows
  }
  CHECK(final_scale >= 1.0);
}

TEST_CASE("the f16 loss scale halves on an overflow (skipping the step) and doubles after the interval",
          "[train][f16]") {
  TrainOptions o = small_options(12);
  o.dtype = DType::f16;
  o.loss_scale_init = 1024;
  o.loss_scale_growth_interval = 4;
  int faults = 0;
  o.fault_seed = [&](std::int64_t step, double& seed) {
    if (step == 6 && faults++ == 0) seed *= 1e30;  // the f16 gradients overflow
  };
  Trainer t(o);
  std::vector<StepStats> got;
  Params last = params_of(t);
  bool untouched = false;
  t.run([&](const StepStats& s) {
    got.push_back(s);
    const Params now = params_of(t);
    if (s.skipped) untouched = now == last;
    last = now;
  });
  // Steps 1-4 at 1024, then 2048 for step 5 and the overflowing attempt at
  // step 6, 1024 again for steps 6-9, then 2048.
  REQUIRE(got.size() == 13);
  const std::vector<double> scales = {1024, 1024, 1024, 1024, 2048, 2048, 1024, 1024, 1024, 1024, 2048, 2048, 2048};
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("entry " << i << " step " << got[i].step);
    CHECK(got[i].loss_scale == scales[i]);
    CHECK(got[i].skipped == (i == 5));
    CHECK(got[i].overflow == (i == 5));
    CHECK(got[i].overflow_steps == (i >= 5 ? 1 : 0));
    CHECK(got[i].skipped_steps == 0);  // an overflow is not a non-finite event
    CHECK(std::isfinite(got[i].loss));
  }
  CHECK(got[5].step == 6);
  CHECK(got[6].step == 6);
  CHECK(untouched);
  CHECK(t.step() == 12);
  CHECK(t.loss_scale() == 2048);
  CHECK(t.loss_scale_good_steps() == 3);
  // Unscaled, the gradient norm is the f32-master gradient's: finite and
  // of a plausible size (a scaled norm would be ~1000x larger).
  CHECK(got[0].grad_norm > 0.01);
  CHECK(got[0].grad_norm < 100);
}

TEST_CASE("an f16 run saved and resumed continues with the same loss scale and bits", "[train][f16]") {
  auto options = [] {
    TrainOptions o = small_options(8);
    o.dtype = DType::f16;
    o.loss_scale_init = 1024;
    o.loss_scale_growth_interval = 3;
    return o;
  };
  std::vector<double> whole;
  {
    Trainer t(options());
    t.run([&](const StepStats& s) { whole.push_back(s.loss); });
  }
  const std::string dir = temp_dir();
  std::vector<double> resumed;
  double scale_at_save = 0;
  std::int64_t good_at_save = 0;
  {
    TrainOptions o = options();
    o.stop_after = 5;  // the scale doubled after step 3; two good steps since
    o.save_dir = dir;
    Trainer t(o);
    t.run([&](const StepStats& s) { resumed.push_back(s.loss); });
    scale_at_save = t.loss_scale();
    good_at_save = t.loss_scale_good_steps();
  }
  CHECK(scale_at_save == 2048);
  CHECK(good_at_save == 2);
  {
    TrainOptions o = options();
    o.resume_dir = dir;
    Trainer t(o);
    CHECK(t.loss_scale() == scale_at_save);
    CHECK(t.loss_scale_good_steps() == good_at_save);
    t.run([&](const StepStats& s) { resumed.push_back(s.loss); });
  }
  CHECK(resumed == whole);
}

TEST_CASE("an f16 loss scale that collapses below loss_scale_min stops the run; a non-finite loss stops it too",
          "[train][f16]") {
  {
    TrainOptions o = small_options(10);
    o.dtype = DType::f16;
    o.loss_scale_init = 4;
    o.loss_scale_min = 1;
    o.fault_seed = [](std::int64_t step, double& seed) {
      if (step >= 2) seed *= 1e35;  // overflows whatever the scale
    };
    Trainer t(o);
    std::vector<double> scales;
    const NonFiniteError e = run_expecting_error(t, [&](const StepStats& s) {
      if (s.skipped) scales.push_back(s.loss_scale);
    });
    CHECK(scales == std::vector<double>{4, 2});
    CHECK(e.step() == 2);
    CHECK(e.value() == 1.0);
    CHECK_THAT(std::string(e.what()), Catch::Contains("step 2") && Catch::Contains("loss_scale_min") &&
                                          Catch::Contains("overflow"));
    CHECK(t.step() == 1);
  }
  {
    TrainOptions o = small_options(10);
    o.dtype = DType::f16;
    o.fault_loss = [](std::int64_t step, double& loss) {
      if (step == 2) loss = kInf;
    };
    Trainer t(o);
    const NonFiniteError e = run_expecting_error(t, nullptr);
    CHECK(e.step() == 2);
    CHECK(e.value() == kInf);
    CHECK_THAT(std::string(e.what()), Catch::Contains("loss is inf"));
  }
}

TEST_CASE("every rank takes the same decision when one rank's values go bad", "[train][nonfinite][mpi]") {
  // One process: trivially; under mpirun: the last rank alone gets the fault.
  auto world = world_group();
  const int bad = world->size() - 1;
  auto options = [&](const std::string& on_nonfinite) {
    TrainOptions o = small_options(6);
    o.group = world;
    o.on_nonfinite = parse_nonfinite_action(on_nonfinite);
    o.fault_loss = [&, n = 0](std::int64_t step, double& loss) mutable {
      if (world->rank() == bad && step == 3 && n++ == 0) loss = kNaN;
    };
    o.fault_seed = [&, n = 0](std::int64_t step, double& seed) mutable {
      if (world->rank() == bad && step == 5 && n++ == 0) seed = kInf;
    };
    return o;
  };
  {
    Trainer t(options("stop"));
    const NonFiniteError e = run_expecting_error(t, nullptr);
    CHECK(e.step() == 3);
    CHECK(t.step() == 2);
  }
  {
    Trainer t(options("skip"));
    std::vector<std::int64_t> steps;
    std::vector<double> losses;
    t.run([&](const StepStats& s) {
      steps.push_back(s.step);
      losses.push_back(s.loss);
    });
    CHECK(steps == std::vector<std::int64_t>{1, 2, 3, 3, 4, 5, 5, 6});
    CHECK(t.step() == 6);
    // The ranks agree: the same last loss and the same parameters (a sum of
    // their bit patterns) on every rank.
    const double last = losses.back();
    std::int64_t bits = 0;
    std::memcpy(&bits, &last, sizeof last);
    const auto all = world->all_gather(from_vector<std::int64_t>({bits}, {1})).to_vector<std::int64_t>();
    for (std::int64_t b : all) CHECK(b == bits);
    std::int64_t wsum = 0;
    for (auto& [name, p] : t.model().named_parameters())
      for (float v : p.to_vector<float>()) {
        std::int32_t x = 0;
        std::memcpy(&x, &v, sizeof v);
        wsum += x;
      }
    const auto sums = world->all_gather(from_vector<std::int64_t>({wsum}, {1})).to_vector<std::int64_t>();
    for (std::int64_t b : sums) CHECK(b == wsum);
  }
}
