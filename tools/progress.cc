#include "tools/progress.h"

#include <cstdlib>

#include "engine/error.h"

namespace remat::tools {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

std::optional<std::string> detect_launcher(const EnvLookup& env) {
  const auto set = [&](const char* name) {
    const auto v = env(name);
    return v && !v->empty();
  };
  // Each of these is set for the ranks a launcher starts, and for no shell.
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                           "MV2_COMM_WORLD_RANK"})
    if (set(name)) return std::string(name);
  // srun sets SLURM_STEP_ID and SLURM_PROCID for the tasks of a job step; an
  // allocation's shell (salloc, an sbatch script) has SLURM_JOB_ID without a step.
  if (set("SLURM_STEP_ID") && set("SLURM_PROCID")) return std::string("SLURM_STEP_ID");
  return std::nullopt;
}

ProgressMode resolve_progress(const std::string& flag, bool stdout_is_tty, const EnvLookup& env) {
  if (flag == "bar") return ProgressMode::bar;
  if (flag == "lines") return ProgressMode::lines;
  if (flag == "off") return ProgressMode::off;
  REMAT_CHECK(flag == "auto", Error, "flag --progress expects auto, bar, lines or off, got '", flag, "'");
  return stdout_is_tty && !detect_launcher(env) ? ProgressMode::bar : ProgressMode::lines;
}

const char* progress_mode_name(ProgressMode m) {
  switch (m) {
    case ProgressMode::bar: return "bar";
    case ProgressMode::lines: return "lines";
    case ProgressMode::off: return "off";
  }
  return "?";
}

std::string ProgressOutput::step(std::int64_t step, const std::string& line, bool evaluated) {
  switch (mode_) {
    case ProgressMode::bar:
      open_ = !evaluated;
      return "\r" + line + (evaluated ? "\n" : "");
    case ProgressMode::lines:
      if (evaluated || step % kProgressLineEvery == 0) return line + "\n";
      return "";
    case ProgressMode::off:
      return "";
  }
  return "";
}

std::string ProgressOutput::end_line() {
  if (!open_) return "";
  open_ = false;
  return "\n";
}

}  // namespace remat::tools
