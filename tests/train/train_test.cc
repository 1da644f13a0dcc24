#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "engine/autograd.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/safetensors.h"
#include "train/trainer.h"
#include "tests/train/train_test_util.h"

using namespace remat;

namespace {
using test::losses_of;
using test::small_options;
std::string temp_dir() { return test::temp_dir("train"); }
}  // namespace

TEST_CASE("AdamW matches a hand-computed update", "[train][adamw]") {
  Tensor p = from_vector<float>({1.0f, -2.0f, 0.5f, 3.0f}, {2, 2});
  p.set_requires_grad(true);
  Tensor b = from_vector<float>({1.0f});
  b.set_requires_grad(true);
  AdamWOptions o;
  o.weight_decay = 0.1;
  AdamW opt({{"w", p}, {"b", b}}, o);
  p.set_grad(from_vector<float>({0.1f, -0.2f, 0.3f, 0.0f}, {2, 2}));
  b.set_grad(from_vector<float>({0.5f}));
  opt.step(0.01);
  // Step 1: m = 0.1 g, v = 0.05 g^2; bias corrections 0.1 and 0.05, so the
  // update is lr * g / (|g| + eps) = lr * sign(g); weight decay on 2-D only.
  auto pv = p.to_vector<float>();
  CHECK(pv[0] == Approx(1.0 * (1 - 0.001) - 0.01).epsilon(1e-6));
  CHECK(pv[1] == Approx(-2.0 * (1 - 0.001) + 0.01).epsilon(1e-6));
  CHECK(pv[3] == Approx(3.0 * (1 - 0.001)).epsilon(1e-6));
  CHECK(b.to_vector<float>()[0] == Approx(1.0 - 0.01).epsilon(1e-6));  // no decay on 1-D
  CHECK(opt.steps() == 1);
  CHECK(opt.state().size() == 4);
  CHECK(opt.state()[0].first == "optimizer.exp_avg.w");
}

TEST_CASE("clip_grad_norm and the cosine schedule", "[train]") {
  Tensor a = from_vector<float>({3.0f});
  a.set_requires_grad(true);
  a.set_grad(from_vector<float>({3.0f}));
  Tensor b = from_vector<float>({0.0f});
  b.set_requires_grad(true);
  b.set_grad(from_vector<float>({4.0f}));
  CHECK(clip_grad_norm({a, b}, 1.0) == Approx(5.0));
  CHECK(a.grad().item() == Approx(0.6).epsilon(1e-5));
  CHECK(b.grad().item() == Approx(0.8).epsilon(1e-5));
  CHECK(cosine_lr(0, 10, 100, 1.0, 0.1) == Approx(0.1));
  CHECK(cosine_lr(9, 10, 100, 1.0, 0.1) == Approx(1.0));
  CHECK(cosine_lr(10, 10, 100, 1.0, 0.1) == Approx(1.0));
  CHECK(cosine_lr(55, 10, 100, 1.0, 0.1) == Approx(0.55));
  CHECK(cosine_lr(100, 10, 100, 1.0, 0.1) == Approx(0.1));
}

TEST_CASE("the generated corpus is deterministic and has the stated entropy", "[train][data]") {
  Corpus a = generated_corpus(3, 1 << 16, 1 << 10), b = generated_corpus(3, 1 << 16, 1 << 10);
  CHECK(a.train == b.train);
  CHECK(a.train != generated_corpus(4, 1 << 16, 1 << 10).train);
  CHECK(a.entropy_floor == Approx(-(0.5 * std::log(0.5) + 0.25 * std::log(0.25) + 0.15 * std::log(0.15) +
                                    0.1 * std::log(0.1))));
  // The empirical conditional entropy of the next byte given two bytes comes
  // out at the stated floor.
  std::map<std::string, std::map<char, int>> counts;
  for (std::size_t i = 2; i < a.train.size(); ++i)
    counts[std::string{char(a.train[i - 2]), char(a.train[i - 1])}][char(a.train[i])]++;
  double h = 0, n = double(a.train.size() - 2);
  for (auto& [ctx, next] : counts) {
    double total = 0;
    for (auto& [c, k] : next) total += k;
    for (auto& [c, k] : next) h -= k / n * std::log(k / total);
  }
  CHECK(h == Approx(a.entropy_floor).margin(0.02));
  BatchSampler s1(a.train, 4, 16, 9), s2(a.train, 4, 16, 9);
  Tensor x = s1.next();
  CHECK(x.sizes() == Shape{4, 17});
  CHECK(x.dtype() == DType::i64);
  CHECK(x.to_vector<std::int64_t>() == s2.next().to_vector<std::int64_t>());
  const RngState st = s1.state();
  Tensor y = s1.next();
  s1.set_state(st);
  CHECK(s1.next().to_vector<std::int64_t>() == y.to_vector<std::int64_t>());
}

TEST_CASE("training lowers the loss", "[train]") {
  TrainOptions o = small_options(30);
  o.config.dropout = 0.0;
  o.lr = 1e-2;
  Trainer t(o);
  const double before = t.evaluate();
  losses_of(t);
  const double after = t.evaluate();
  CHECK(before == Approx(std::log(256.0)).margin(0.2));
  CHECK(after < before - 1.5);
}

TEST_CASE("resume: 20 + resume + 20 steps equal 40 straight, bit for bit", "[train][resume]") {
  const std::string dir = temp_dir();
  Trainer straight(small_options(40));
  const std::vector<double> all = losses_of(straight);
  REQUIRE(all.size() == 40);

  TrainOptions first = small_options(40);
  first.save_dir = dir;
  first.stop_after = 20;  // as if interrupted after step 20
  Trainer a(first);
  std::vector<double> resumed = losses_of(a);

  TrainOptions second = small_options(40);
  second.resume_dir = dir;
  Trainer b(second);
  CHECK(b.step() == 20);
  const auto rest = losses_of(b);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  REQUIRE(resumed.size() == 40);
  for (std::size_t i = 0; i < 40; ++i) {
    INFO("step " << i + 1);
    CHECK(resumed[i] == all[i]);  // exact equality
  }
  // The final weights are identical too.
  CHECK(b.model().parameter("lm_head.weight").to_vector<float>() ==
        straight.model().parameter("lm_head.weight").to_vector<float>());
}

TEST_CASE("train_step: a program's own loop gives run()'s steps bit for bit", "[train]") {
  Trainer straight(small_options(12));
  const std::vector<double> all = losses_of(straight);
  Trainer stepped(small_options(12));
  for (std::size_t i = 0; i < all.size(); ++i) {
    const StepStats s = stepped.train_step();
    INFO("step " << i + 1);
    CHECK(s.step == std::int64_t(i) + 1);
    CHECK(s.loss == all[i]);  // exact equality
  }
  CHECK(stepped.step() == 12);
  CHECK_THROWS_WITH(stepped.train_step(), Catch::Contains("the run's 12 steps are done"));
}

TEST_CASE("a corrupt state file is rejected and the previous good state is still there",
          "[train][resume]") {
  const std::string dir = temp_dir();
  TrainOptions o = small_options(4);
  o.save_dir = dir;
  o.save_every = 2;  // saves at step 2 (kept as .prev) and step 4
  Trainer t(o);
  losses_of(t);
  const std::string cur = dir + "/state.safetensors", prev = dir + "/state.prev.safetensors";
  REQUIRE(load_safetensors(prev).metadata.at("step") == "2");
  const std::string bytes = test::read_all(cur);
  test::write_all(cur, bytes.substr(0, bytes.size() / 2));  // truncated
  TrainOptions r = small_options(8);
  r.resume_dir = dir;
  try {
    Trainer bad(r);
    FAIL("expected IOError");
  } catch (const IOError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("not a valid safetensors file"));
    CHECK_THAT(std::string(e.what()), Catch::Contains("state.prev.safetensors is intact"));
  }
  // The previous state loads and resumes.
  REQUIRE(::rename(prev.c_str(), cur.c_str()) == 0);
  Trainer good(r);
  CHECK(good.step() == 2);
  // A state of another config is refused before anything is loaded.
  TrainOptions other = small_options(8);
  other.config.d_model = 64;
  other.resume_dir = dir;
  CHECK_THROWS_WITH(Trainer(other), Catch::Contains("was trained with config"));
}
