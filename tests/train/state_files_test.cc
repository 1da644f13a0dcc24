// Crash-safe saves and state integrity of the training loop: a crash
// (simulated by a fault hook that throws) at every step of a save leaves a
// complete state that resumes and continues bit for bit; a flipped byte in a
// saved state is rejected naming the tensor; states without checksums, or
// with only the previous state left, still resume with a note.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/json.h"
#include "train/safetensors.h"
#include "train/state_files.h"
#include "train/trainer.h"
#include "tests/train/train_test_util.h"

using namespace remat;

namespace {
using test::losses_of;
using test::read_all;
using test::write_all;
std::string temp_dir() { return test::temp_dir("state"); }
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
std::string step_of(const std::string& path) { return load_safetensors(path).metadata.at("step"); }

TrainOptions small_options(std::int64_t steps) {
  TrainOptions o = test::small_options(steps);
  o.warmup = 2;
  return o;
}

struct SimulatedCrash {
  SaveStep step;
};

// Removes the hook however the test ends.
struct HookGuard {
  explicit HookGuard(SaveFaultHook h) { set_save_fault_hook(std::move(h)); }
  ~HookGuard() { set_save_fault_hook(nullptr); }
};

// A hook that "crashes" at `at` of the `nth` save (1-based).
SaveFaultHook crash_at(SaveStep at, int nth) {
  auto saves = std::make_shared<int>(0);
  return [=](SaveStep s) {
    if (s == SaveStep::begin) ++*saves;
    if (*saves == nth && s == at) throw SimulatedCrash{s};
  };
}

bool has_note(const Trainer& t, const std::string& text) {
  for (const auto& n : t.resume_notes())
    if (n.find(text) != std::string::npos) return true;
  return false;
}

// The byte offset in `path` of tensor `name`'s data.
std::size_t data_offset(const std::string& bytes, const std::string& name) {
  std::uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= std::uint64_t(static_cast<unsigned char>(bytes[std::size_t(k)])) << (8 * k);
  const Json header = Json::parse(bytes.substr(8, n));
  return 8 + n + std::size_t(header.at(name).at("data_offsets").items()[0].as_int());
}
}  // namespace

TEST_CASE("save steps have names", "[state][fault]") {
  for (SaveStep s : kSaveSteps) CHECK(parse_save_step(save_step_name(s)) == s);
  CHECK_THROWS_WITH(parse_save_step("halfway"),
                    Catch::Contains("'halfway'") && Catch::Contains("begin, writing, written, rotated, renamed, synced"));
}

TEST_CASE("a crash at any step of a save leaves a complete state that resumes bit for bit", "[state][fault]") {
  Trainer straight(small_options(6));
  const std::vector<double> all = losses_of(straight);
  REQUIRE(all.size() == 6);

  for (SaveStep at : kSaveSteps) {
    const std::string name = save_step_name(at);
    INFO("crash after save step " << name);
    const std::string dir = temp_dir();
    TrainOptions first = small_options(6);
    first.save_dir = dir;
    first.save_every = 2;  // saves at 2 (completes) and 4 (crashes)
    first.stop_after = 4;
    {
      HookGuard hook(crash_at(at, 2));
      Trainer a(first);
      try {
        a.run(nullptr);
        FAIL("the save did not crash");
      } catch (const SimulatedCrash& c) {
        CHECK(c.step == at);
      }
    }
    // On disk: a complete, checksummed state, whichever step the crash hit.
    const bool new_one = at == SaveStep::renamed || at == SaveStep::synced;
    REQUIRE(exists(state_file(dir)));
    CHECK(load_safetensors(state_file(dir)).checksummed);
    CHECK(step_of(state_file(dir)) == (new_one ? "4" : "2"));
    // The previous state: the one before the current (after the rotation: the
    // current one, hard-linked).
    if (at == SaveStep::begin || at == SaveStep::writing || at == SaveStep::written)
      CHECK_FALSE(exists(prev_state_file(dir)));
    else
      CHECK(step_of(prev_state_file(dir)) == "2");
    const bool temp_left = at == SaveStep::writing || at == SaveStep::written || at == SaveStep::rotated;
    CHECK(exists(temp_state_file(dir)) == temp_left);

    TrainOptions second = small_options(6);
    second.resume_dir = dir;
    second.save_dir = dir;
    Trainer b(second);
    const std::int64_t from = new_one ? 4 : 2;
    CHECK(b.step() == from);
    CHECK(has_note(b, "ignored " + temp_state_file(dir)) == temp_left);
    const std::vector<double> rest = losses_of(b);
    REQUIRE(rest.size() == std::size_t(6 - from));
    for (std::size_t i = 0; i < rest.size(); ++i) {
      INFO("step " << from + std::int64_t(i) + 1);
      CHECK(rest[i] == all[std::size_t(from) + i]);  // exact
    }
    // The next save cleaned up: no temporary files, the state at step 6.
    CHECK_FALSE(exists(temp_state_file(dir)));
    CHECK_FALSE(exists(prev_state_file(dir) + ".tmp"));
    CHECK(step_of(state_file(dir)) == "6");
    CHECK(step_of(prev_state_file(dir)) == (new_one ? "4" : "2"));
  }
}

TEST_CASE("a crash in the first save leaves no state, and resume says so", "[state][fault]") {
  const std::string dir = temp_dir();
  TrainOptions o = small_options(2);
  o.save_dir = dir;
  {
    HookGuard hook(crash_at(SaveStep::written, 1));
    Trainer a(o);
    CHECK_THROWS_AS(a.run(nullptr), SimulatedCrash);
  }
  CHECK(exists(temp_state_file(dir)));
  CHECK_FALSE(exists(state_file(dir)));
  TrainOptions r = small_options(2);
  r.resume_dir = dir;
  CHECK_THROWS_WITH(Trainer(r), Catch::Contains("no state file " + state_file(dir)) &&
                                    Catch::Contains(temp_state_file(dir)) && Catch::Contains("not used"));
}

TEST_CASE("with only the previous state left, resume uses it with a note", "[state]") {
  const std::string dir = temp_dir();
  TrainOptions o = small_options(4);
  o.save_dir = dir;
  o.save_every = 2;
  Trainer a(o);
  a.run(nullptr);
  // As an interrupted save of an older remat left it: no state.safetensors.
  REQUIRE(::unlink(state_file(dir).c_str()) == 0);
  TrainOptions r = small_options(4);
  r.resume_dir = dir;
  Trainer b(r);
  CHECK(b.step() == 2);
  CHECK(has_note(b, state_file(dir) + " is missing"));
  CHECK(has_note(b, "resuming from the previous state " + prev_state_file(dir)));
}

TEST_CASE("a saved state with one flipped byte is rejected naming the tensor; nothing is loaded",
          "[state][checksum]") {
  const std::string dir = temp_dir();
  TrainOptions o = small_options(4);
  o.save_dir = dir;
  o.save_every = 2;
  Trainer a(o);
  a.run(nullptr);
  const std::string cur = state_file(dir);
  const std::string good = read_all(cur);
  // A parameter, and an optimizer moment (loaded after the parameters are
  // checked: the checksum still stops it before anything is touched).
  for (const std::string tensor : {"lm_head.weight", "optimizer.exp_avg_sq.model.embed_tokens.weight"}) {
    INFO(tensor);
    std::string bad = good;
    bad[data_offset(good, tensor) + 3] ^= 0x01;  // the lowest bit of one byte
    write_all(cur, bad);
    Trainer t(small_options(4));
    const std::vector<float> before = t.model().parameter("lm_head.weight").to_vector<float>();
    try {
      t.resume(dir);
      FAIL("expected IOError");
    } catch (const IOError& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains("checksum mismatch in tensor '" + tensor + "'"));
      CHECK_THAT(msg, Catch::Contains(cur));
      CHECK_THAT(msg, Catch::Contains("the previous state " + prev_state_file(dir) +
                                      " is intact: step 2, every checksum matches"));
    }
    CHECK(t.step() == 0);
    CHECK(t.model().parameter("lm_head.weight").to_vector<float>() == before);
  }
  // Both damaged: the hint says so.
  std::string bad_prev = read_all(prev_state_file(dir));
  bad_prev[data_offset(bad_prev, "lm_head.weight")] ^= 0x40;
  write_all(prev_state_file(dir), bad_prev);
  TrainOptions r = small_options(4);
  r.resume_dir = dir;
  CHECK_THROWS_WITH(Trainer(r), Catch::Contains("the previous state is damaged too") &&
                                    Catch::Contains("checksum mismatch in tensor 'lm_head.weight'"));
  write_all(cur, good);
  CHECK(Trainer(r).step() == 4);
}

TEST_CASE("a state without checksums (an older file) resumes, with a note", "[state][checksum]") {
  const std::string dir = temp_dir();
  TrainOptions o = small_options(6);
  o.save_dir = dir;
  o.stop_after = 3;
  Trainer a(o);
  a.run(nullptr);
  const SafetensorsFile f = load_safetensors(state_file(dir));
  std::vector<std::pair<std::string, Tensor>> tensors(f.tensors.begin(), f.tensors.end());
  save_safetensors(state_file(dir), tensors, f.metadata, {.checksums = false});
  REQUIRE_FALSE(load_safetensors(state_file(dir)).checksummed);
  TrainOptions r = small_options(6);
  r.resume_dir = dir;
  Trainer b(r);
  CHECK(b.step() == 3);
  CHECK(has_note(b, state_file(dir) + " has no checksums"));
  // A state with checksums resumes without notes.
  TrainOptions again = small_options(6);
  again.save_dir = dir;
  again.resume_dir = dir;
  Trainer c(again);
  c.run(nullptr);
  Trainer d(again);
  CHECK(d.step() == 6);
  CHECK(d.resume_notes().empty());
}
