// Replay memos: values the original forward computed that a recompute replay
// must reuse rather than compute again (e.g. the per-expert slot counts that
// ranks exchanged: a replay routes the same tokens, so it can skip the
// exchange). While a checkpoint region runs its original forward, each
// replay_memo() call records its value in that region (and in every region
// around it); when the region is replayed, the same call, reached in the same
// order, returns the recorded value without running `compute`.
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "engine/error.h"

namespace remat {

// The values one region recorded, in call order, and how far a replay has
// read them.
struct MemoLog {
  std::vector<std::any> values;
  std::size_t next = 0;
};

namespace memo_detail {
// The log a replay on this thread reads from (null: not replaying a region
// that has one).
MemoLog* replay_source();
// Appends `v` to the log of every region whose forward is running on this
// thread (since the innermost replay began).
void record(const std::any& v);
// Increments the number of memos reused by replays on this thread.
void count_reuse();
}  // namespace memo_detail

// RAII: the forward of a region records into `log` (used by checkpoint()).
class MemoRecordScope {
 public:
  explicit MemoRecordScope(MemoLog& log);
  ~MemoRecordScope();
  MemoRecordScope(const MemoRecordScope&) = delete;
  MemoRecordScope& operator=(const MemoRecordScope&) = delete;
};

// RAII: a replay reads from `log` (rewound to its start); regions created
// during the replay record on their own (used by checkpoint()).
class MemoReplayScope {
 public:
  explicit MemoReplayScope(MemoLog& log);
  ~MemoReplayScope();
  MemoReplayScope(const MemoReplayScope&) = delete;
  MemoReplayScope& operator=(const MemoReplayScope&) = delete;

 private:
  MemoLog* previous_source_;
  std::vector<MemoLog*> previous_recorders_;
};

// In a replay: the value the original forward recorded at this point (a
// CheckpointMismatchError, naming `what`, if the replay asks for more memos
// than were recorded or for another type). Otherwise: compute(), recorded for
// replays of the enclosing regions.
template <typename T, typename Fn>
T replay_memo(const char* what, Fn&& compute) {
  if (MemoLog* log = memo_detail::replay_source()) {
    REMAT_CHECK(log->next < log->values.size(), CheckpointMismatchError, "replay memo '", what,
                "': the replay asked for memo #", log->next, " but the original forward recorded only ",
                log->values.size());
    const std::any& v = log->values[log->next++];
    const T* p = std::any_cast<T>(&v);
    REMAT_CHECK(p != nullptr, CheckpointMismatchError, "replay memo '", what, "': memo #", log->next - 1,
                " was recorded with another type (", v.type().name(), ")");
    memo_detail::count_reuse();
    memo_detail::record(v);  // regions created during this replay
    return *p;
  }
  T value = std::forward<Fn>(compute)();
  memo_detail::record(std::any(value));
  return value;
}

// Memos replays on this thread reused instead of computing.
std::int64_t replay_memos_reused();

}  // namespace remat
