#include "train/state_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "engine/error.h"
#include "train/safetensors.h"

namespace remat {

namespace {

std::mutex g_hook_mutex;
SaveFaultHook g_hook;  // guarded by g_hook_mutex

void fault_point(SaveStep step) {
  SaveFaultHook hook;
  {
    std::lock_guard<std::mutex> lock(g_hook_mutex);
    hook = g_hook;
  }
  if (hook) hook(step);
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string errno_text() { return std::strerror(errno); }

void remove_if_present(const std::string& p) {
  REMAT_CHECK(::unlink(p.c_str()) == 0 || errno == ENOENT, IOError, "cannot remove the stale ", p, ": ",
              errno_text());
}

std::string prev_temp_file(const std::string& dir) { return prev_state_file(dir) + ".tmp"; }

}  // namespace

const char* save_step_name(SaveStep step) {
  switch (step) {
    case SaveStep::begin: return "begin";
    case SaveStep::writing: return "writing";
    case SaveStep::written: return "written";
    case SaveStep::rotated: return "rotated";
    case SaveStep::renamed: return "renamed";
    case SaveStep::synced: return "synced";
  }
  return "?";
}

SaveStep parse_save_step(const std::string& name) {
  std::string all;
  for (SaveStep s : kSaveSteps) {
    if (name == save_step_name(s)) return s;
    all += std::string(all.empty() ? "" : ", ") + save_step_name(s);
  }
  throw Error("unknown save step '" + name + "'; the steps are " + all);
}

void set_save_fault_hook(SaveFaultHook hook) {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_hook = std::move(hook);
}

std::string state_file(const std::string& dir) { return dir + "/state.safetensors"; }
std::string prev_state_file(const std::string& dir) { return dir + "/state.prev.safetensors"; }
std::string temp_state_file(const std::string& dir) { return state_file(dir) + ".tmp"; }

void save_state_files(const std::string& dir, const std::string& bytes) {
  REMAT_CHECK(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST, IOError, "--save: cannot create the folder ", dir,
              ": ", errno_text());
  const std::string cur = state_file(dir), prev = prev_state_file(dir), tmp = temp_state_file(dir),
                    prev_tmp = prev_temp_file(dir);
  remove_if_present(tmp);
  remove_if_present(prev_tmp);
  fault_point(SaveStep::begin);

  // 1. The new state, complete and on disk, under a name nobody reads.
  write_file_synced(tmp, bytes, [] { fault_point(SaveStep::writing); });
  fault_point(SaveStep::written);

  // 2. Rotate: the current state also becomes the previous one (a second
  // name for the same file, so state.safetensors never goes away), replacing
  // the older previous state in one rename.
  struct stat cur_st, prev_st;
  const bool have_cur = ::stat(cur.c_str(), &cur_st) == 0;
  // A save interrupted after its rotation left the previous state as a
  // second name of the current one: nothing to rotate (and rename() of one
  // name of a file onto another of the same file does nothing).
  const bool rotated_already = have_cur && ::stat(prev.c_str(), &prev_st) == 0 && prev_st.st_dev == cur_st.st_dev &&
                               prev_st.st_ino == cur_st.st_ino;
  if (have_cur && !rotated_already) {
    if (::link(cur.c_str(), prev_tmp.c_str()) != 0) {
      // No hard links here (some file systems): a synced copy instead.
      std::ifstream in(cur, std::ios::binary);
      REMAT_CHECK(in.good(), IOError, "--save: cannot read ", cur, " to keep it as ", prev);
      std::stringstream ss;
      ss << in.rdbuf();
      write_file_synced(prev_tmp, ss.str());
    }
    REMAT_CHECK(::rename(prev_tmp.c_str(), prev.c_str()) == 0, IOError, "--save: cannot rename ", prev_tmp, " to ",
                prev, ": ", errno_text());
  }
  fault_point(SaveStep::rotated);

  // 3. The new state takes the name, atomically.
  REMAT_CHECK(::rename(tmp.c_str(), cur.c_str()) == 0, IOError, "--save: cannot rename ", tmp, " to ", cur, ": ",
              errno_text());
  fault_point(SaveStep::renamed);

  // 4. The renames themselves durable.
  fsync_dir(dir);
  fault_point(SaveStep::synced);
}

StateChoice choose_state_file(const std::string& dir) {
  StateChoice c;
  const std::string cur = state_file(dir), prev = prev_state_file(dir);
  for (const std::string& t : {temp_state_file(dir), prev_temp_file(dir)})
    if (exists(t))
      c.notes.push_back("ignored " + t + ", left by an interrupted save (never read; the next save replaces it)");
  if (exists(cur)) {
    c.path = cur;
    return c;
  }
  if (exists(prev)) {
    c.path = prev;
    c.from_prev = true;
    c.notes.push_back(cur + " is missing (a save was interrupted); resuming from the previous state " + prev);
    return c;
  }
  const std::string tmp_note = exists(temp_state_file(dir))
      ? " (" + temp_state_file(dir) + " is left by a save interrupted before the first state was complete; it is "
        "not used: start the run again)"
      : "";
  throw IOError("--resume: no state file " + cur + " nor " + prev + tmp_note);
}

}  // namespace remat
