// The state folder of a training run and its crash-safe save:
//   DIR/state.safetensors        the newest complete state
//   DIR/state.prev.safetensors   the one before it
//   DIR/state.safetensors.tmp, DIR/state.prev.safetensors.tmp
//                                only while a save is under way (or left by
//                                one that was interrupted; never read)
// A save writes the new state to the temporary file and fsyncs it, then
// rotates (the current state is hard-linked as the previous one, so it stays
// in place), then renames the temporary file over state.safetensors, then
// fsyncs the folder. At every instant state.safetensors is a complete state
// (once the first save has got that far).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace remat {

// The steps of a save, in order; a fault hook runs after each.
enum class SaveStep {
  begin,    // the folder exists, stale temporary files are removed, nothing written
  writing,  // half of the temporary file is written
  written,  // the temporary file is complete and fsynced
  rotated,  // state.prev.safetensors is the current state (state.safetensors unchanged)
  renamed,  // state.safetensors is the new state
  synced,   // the folder is fsynced: the save is done
};
inline constexpr SaveStep kSaveSteps[] = {SaveStep::begin,   SaveStep::writing, SaveStep::written,
                                          SaveStep::rotated, SaveStep::renamed, SaveStep::synced};

const char* save_step_name(SaveStep step);  // "begin", "writing", ...
// The step of that name; throws Error listing the names otherwise.
SaveStep parse_save_step(const std::string& name);

// Fault injection for tests: `hook` runs after each step of every
// save_state_files in this process (on the thread that saves); it may throw
// (the save stops there, leaving the files as a crash would) or end the
// process. An empty hook removes it. Thread-safe.
using SaveFaultHook = std::function<void(SaveStep)>;
void set_save_fault_hook(SaveFaultHook hook);

std::string state_file(const std::string& dir);       // DIR/state.safetensors
std::string prev_state_file(const std::string& dir);  // DIR/state.prev.safetensors
std::string temp_state_file(const std::string& dir);  // DIR/state.safetensors.tmp

// Saves `bytes` (a whole safetensors file) as DIR/state.safetensors in the
// sequence above, creating DIR if needed; the state it replaces becomes
// DIR/state.prev.safetensors. Throws IOError naming the file and the step.
void save_state_files(const std::string& dir, const std::string& bytes);

// The file a resume from DIR reads: state.safetensors, or, when it is
// missing, state.prev.safetensors (with a note). Leftover temporary files are
// ignored, with a note. Throws IOError when DIR holds neither state.
struct StateChoice {
  std::string path;
  bool from_prev = false;
  std::vector<std::string> notes;  // for the user: what was chosen or ignored, and why
};
StateChoice choose_state_file(const std::string& dir);

}  // namespace remat
