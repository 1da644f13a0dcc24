// tools/progress: the --progress modes of `remat train`, the launcher
// detection behind `auto` (on a fake environment, never the real one), and
// the text each mode writes for a run's progress events.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "engine/error.h"
#include "tools/progress.h"

using remat::Error;
using remat::tools::detect_launcher;
using remat::tools::EnvLookup;
using remat::tools::kProgressLineEvery;
using remat::tools::progress_mode_name;
using remat::tools::ProgressMode;
using remat::tools::ProgressOutput;
using remat::tools::resolve_progress;

namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const EnvLookup kShell = env_of({{"HOME", "/root"}, {"TERM", "xterm"}});

}  // namespace

TEST_CASE("progress: explicit modes ignore the terminal and the launcher", "[tools][progress]") {
  const EnvLookup mpi = env_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  for (const bool tty : {false, true}) {
    for (const EnvLookup& env : {kShell, mpi}) {
      CHECK(resolve_progress("bar", tty, env) == ProgressMode::bar);
      CHECK(resolve_progress("lines", tty, env) == ProgressMode::lines);
      CHECK(resolve_progress("off", tty, env) == ProgressMode::off);
    }
  }
  CHECK(std::string(progress_mode_name(ProgressMode::bar)) == "bar");
  CHECK(std::string(progress_mode_name(ProgressMode::lines)) == "lines");
  CHECK(std::string(progress_mode_name(ProgressMode::off)) == "off");
}

TEST_CASE("progress: auto is the bar only on a terminal no launcher started", "[tools][progress]") {
  CHECK(resolve_progress("auto", true, kShell) == ProgressMode::bar);
  CHECK(resolve_progress("auto", false, kShell) == ProgressMode::lines);
  // Each launcher's variable on its own turns the terminal's bar into lines.
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                          "MV2_COMM_WORLD_RANK"}) {
    INFO(var);
    const EnvLookup env = env_of({{"HOME", "/root"}, {var, "1"}});
    CHECK(detect_launcher(env) == std::optional<std::string>(var));
    CHECK(resolve_progress("auto", true, env) == ProgressMode::lines);
    CHECK(resolve_progress("auto", false, env) == ProgressMode::lines);
    // Set but empty does not count.
    CHECK_FALSE(detect_launcher(env_of({{var, ""}})));
  }
  CHECK_FALSE(detect_launcher(kShell));
}

TEST_CASE("progress: Slurm counts only for the tasks srun starts", "[tools][progress]") {
  // srun: a job step and a task rank.
  const EnvLookup srun = env_of({{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}});
  CHECK(detect_launcher(srun) == std::optional<std::string>("SLURM_STEP_ID"));
  CHECK(resolve_progress("auto", true, srun) == ProgressMode::lines);
  // An allocation's shell (salloc, sbatch): a job but no step.
  const EnvLookup salloc = env_of({{"SLURM_JOB_ID", "77"}, {"SLURM_NODELIST", "n1"}});
  CHECK_FALSE(detect_launcher(salloc));
  CHECK(resolve_progress("auto", true, salloc) == ProgressMode::bar);
  CHECK_FALSE(detect_launcher(env_of({{"SLURM_JOB_ID", "77"}, {"SLURM_PROCID", "0"}})));
  CHECK_FALSE(detect_launcher(env_of({{"SLURM_STEP_ID", "0"}})));
}

TEST_CASE("progress: a bad value names the flag, the value and the choices", "[tools][progress]") {
  for (const char* bad : {"", "Bar", "line", "none", "auto ", "1"}) {
    INFO(bad);
    try {
      resolve_progress(bad, true, kShell);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()) ==
            std::string("flag --progress expects auto, bar, lines or off, got '") + bad + "'");
    }
  }
}

TEST_CASE("progress: bar redraws one line and ends it before anything else prints", "[tools][progress]") {
  ProgressOutput out(ProgressMode::bar);
  CHECK(out.end_line().empty());  // nothing drawn yet
  CHECK(out.step(1, "step 1", false) == "\rstep 1");
  CHECK(out.step(2, "step 2", false) == "\rstep 2");
  CHECK(out.end_line() == "\n");  // e.g. before a warning
  CHECK(out.end_line().empty());  // once
  CHECK(out.step(3, "step 3", false) == "\rstep 3");
  CHECK(out.step(4, "step 4  val 1.5", true) == "\rstep 4  val 1.5\n");  // an evaluation ends the line
  CHECK(out.end_line().empty());
}

TEST_CASE("progress: lines prints every 10th step and every evaluation, with no carriage return",
          "[tools][progress]") {
  REQUIRE(kProgressLineEvery == 10);
  ProgressOutput out(ProgressMode::lines);
  std::string all;
  for (std::int64_t step = 1; step <= 25; ++step) {
    const bool eval = step == 15 || step == 25;
    const std::string text = out.step(step, "step " + std::to_string(step), eval);
    if (step == 10 || step == 15 || step == 20 || step == 25)
      CHECK(text == "step " + std::to_string(step) + "\n");
    else
      CHECK(text.empty());
    all += text + out.end_line();
  }
  CHECK(all == "step 10\nstep 15\nstep 20\nstep 25\n");
}

TEST_CASE("progress: off prints no step lines, not even evaluations", "[tools][progress]") {
  ProgressOutput out(ProgressMode::off);
  for (std::int64_t step = 1; step <= 20; ++step) {
    CHECK(out.step(step, "step", step == 20).empty());
    CHECK(out.end_line().empty());
  }
}
