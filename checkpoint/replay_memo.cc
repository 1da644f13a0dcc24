#include "checkpoint/replay_memo.h"

namespace remat {

namespace {
thread_local MemoLog* tls_source = nullptr;
thread_local std::vector<MemoLog*> tls_recorders;
thread_local std::int64_t tls_reused = 0;
}  // namespace

namespace memo_detail {
MemoLog* replay_source() { return tls_source; }
void record(const std::any& v) {
  for (MemoLog* log : tls_recorders) log->values.push_back(v);
}
void count_reuse() { ++tls_reused; }
}  // namespace memo_detail

MemoRecordScope::MemoRecordScope(MemoLog& log) { tls_recorders.push_back(&log); }
MemoRecordScope::~MemoRecordScope() { tls_recorders.pop_back(); }

MemoReplayScope::MemoReplayScope(MemoLog& log)
    : previous_source_(tls_source), previous_recorders_(std::move(tls_recorders)) {
  tls_recorders.clear();
  log.next = 0;
  tls_source = &log;
}

MemoReplayScope::~MemoReplayScope() {
  tls_source = previous_source_;
  tls_recorders = std::move(previous_recorders_);
}

std::int64_t replay_memos_reused() { return tls_reused; }

}  // namespace remat
