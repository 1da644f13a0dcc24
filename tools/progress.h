// How `remat train` shows its progress (--progress auto|bar|lines|off), and
// the launcher detection behind `auto`. Launchers such as OpenMPI's mpirun
// give each rank a pty, so isatty() is true even when the job's output goes
// to a file; `auto` therefore draws the redrawing bar only on a terminal of a
// process no launcher started. See docs/REFERENCE.md#command-line.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace remat::tools {

enum class ProgressMode {
  bar,    // one line redrawn in place with '\r'; evaluation steps end it with '\n'
  lines,  // newline-terminated lines: every kProgressLineEvery-th step and every evaluation step
  off,    // no per-step lines (the header, the 'done:' summary, warnings and errors still print)
};

// `lines` prints a line on steps divisible by this (and on evaluation steps).
inline constexpr std::int64_t kProgressLineEvery = 10;

// The value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Reads the real environment (std::getenv).
EnvLookup process_env();

// The environment variable that shows a launcher started this process, or
// nullopt when none did. Any one of these, set and non-empty, counts:
// OpenMPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), PMIx (PMIX_RANK),
// PMI-1/2, e.g. MPICH's Hydra and Intel MPI (PMI_RANK, PMI_SIZE), MVAPICH2
// (MV2_COMM_WORLD_RANK), and Slurm's srun (SLURM_STEP_ID together with
// SLURM_PROCID: a task of a job step; SLURM_JOB_ID alone is a salloc/sbatch
// shell, which does not count).
std::optional<std::string> detect_launcher(const EnvLookup& env);

// The mode for a --progress value: "bar", "lines" and "off" as given; "auto"
// is `bar` when stdout is a terminal and detect_launcher(env) finds nothing,
// else `lines`. Throws Error naming the flag, the value and the valid choices
// for anything else.
ProgressMode resolve_progress(const std::string& flag, bool stdout_is_tty, const EnvLookup& env);

// "bar", "lines" or "off".
const char* progress_mode_name(ProgressMode m);

// What train writes to stdout for each progress event in one mode (the caller
// prints the returned text and flushes). Keeps track of an open bar line (a
// '\r' line not yet ended), so that whatever prints next starts on a fresh
// line, and no mode but `bar` ever produces a '\r'.
class ProgressOutput {
 public:
  explicit ProgressOutput(ProgressMode mode) : mode_(mode) {}

  // The text for step `step`'s progress line `line` (without a newline);
  // `evaluated` when the step ran a validation (`line` then shows it). Empty
  // when this mode shows nothing for the step.
  std::string step(std::int64_t step, const std::string& line, bool evaluated);

  // "\n" when a bar line is open (and closes it), else "": print it before a
  // warning, an error or the summary.
  std::string end_line();

  ProgressMode mode() const { return mode_; }

 private:
  ProgressMode mode_;
  bool open_ = false;  // a bar line was drawn and not yet ended
};

}  // namespace remat::tools
