// The memory timeline of `./remat mem`: turns the caching allocator's history
// over one training step into bytes per memory category over time, phases
// (forward, backward, replay, optimizer) and the peak, and writes them as
// JSON and as a self-contained HTML page (inline SVG, no scripts, no external
// resources). Pure functions of the recording, so they are unit-testable.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/allocator.h"

namespace remat::tools {

// What `./remat mem` recorded.
struct MemRecording {
  std::string config;
  std::string plan;
  // The allocator history, oldest first. Marker events start phases: each
  // phase runs until the next marker; a marker labelled "end" closes the last
  // phase without starting one.
  std::vector<MemoryEvent> events;
  // Bytes per category (and reserved bytes) when the history was enabled:
  // what was already allocated (parameters, optimizer state, ...).
  std::array<std::int64_t, kNumMemoryCategories> initial_bytes{};
  std::int64_t initial_reserved = 0;
  // Bytes held for backward, by the op that saved them, when allocated bytes
  // reached their peak (engine/autograd.h saved_bytes_report()), and the
  // total held then (each storage once).
  std::map<std::string, std::int64_t> saved_at_peak_by_op;
  std::int64_t saved_at_peak_total = 0;
  // Per block, in order: the bytes held for backward that the recorded
  // step's forward added from the end of the block before (block 0: from the
  // step's start) to the block's end: what it keeps until its backward (its
  // saves, or under a block region its boundary).
  std::vector<std::int64_t> block_saved_bytes;
  std::int64_t first_block = 0;  // the blocks this rank runs (a pipeline stage's), [first_block, end_block)
  std::int64_t end_block = 0;
  // Extra facts for the reader (seed, replays, ...), as (key, value) pairs;
  // values are written as JSON strings and shown in the HTML summary.
  std::vector<std::pair<std::string, std::string>> info;
};

// The state right after one event (or the initial state).
struct TimelinePoint {
  std::int64_t t_ns = 0;
  std::int64_t event = -1;  // index into MemRecording::events; -1: the initial state
  std::array<std::int64_t, kNumMemoryCategories> bytes{};
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
};

struct TimelinePhase {
  std::string name;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t peak_allocated = 0;  // highest allocated bytes while the phase ran
};

// A dynamic rematerialization event (checkpoint/dynamic_remat.h markers).
struct RematMark {
  std::int64_t t_ns = 0;
  std::int64_t allocated = 0;  // allocated bytes then
  bool evict = true;           // an eviction (else a rebuild)
  std::string op;              // the op that made the tensor
};

struct Timeline {
  // The initial state, then the state after every alloc, free and segment
  // event (markers add no point).
  std::vector<TimelinePoint> points;
  std::vector<TimelinePhase> phases;
  std::vector<RematMark> remat_marks;  // evictions and rebuilds (--recompute dynamic), in time order
  std::size_t peak_point = 0;  // first point with the highest allocated bytes
  std::string peak_tag;        // the op whose allocation reached the peak ("" if none)
  std::string peak_phase;      // the phase running at the peak ("" if none)
  std::int64_t reserved_peak = 0;
  std::int64_t end_ns = 0;     // time of the last event
  // Per category, its highest value anywhere in the recording.
  std::array<std::int64_t, kNumMemoryCategories> category_max{};
};

// Replays the events over the initial bytes. Throws Error when the events do
// not add up: the ring buffer lost its oldest events (seq does not start at
// 0), a category goes negative, or a reconstructed total disagrees with the
// allocator's own count after an event.
Timeline build_timeline(const MemRecording& r);

// {"format", "config", "plan", "info", "initial", "peak", "phases",
//  "saved_at_peak_by_op", "saved_at_peak_total", "duration_us", "events"}.
std::string timeline_json(const MemRecording& r, const Timeline& t);

// The HTML page: a stacked area chart of allocated bytes by category over
// time with shaded phases, the peak marked, a legend, MiB and ms axes, and
// tables of the bytes at the peak (by category, by phase, saved by op).
std::string timeline_html(const MemRecording& r, const Timeline& t);

}  // namespace remat::tools
