// The memory timeline from the allocator history, and its JSON
// (tools/mem_timeline_html.cc draws the page).
#include "tools/mem_timeline.h"

#include "checkpoint/dynamic_remat.h"

#include <algorithm>
#include <cstdio>

#include "checkpoint/dynamic_remat.h"
#include "engine/error.h"
#include "tools/html.h"
#include "tools/json.h"

namespace remat::tools {

namespace {

std::string num(std::int64_t v) { return std::to_string(v); }
std::string us(std::int64_t ns) { return fmt("%.3f", double(ns) / 1e3); }

MemoryCategory cat_of(std::size_t i) { return static_cast<MemoryCategory>(i); }

std::string by_category_json(const std::array<std::int64_t, kNumMemoryCategories>& b) {
  std::string out = "{";
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    out += (c ? ", " : "") + JsonObject::quote(category_name(cat_of(c))) + ": " + num(b[c]);
  return out + "}";
}

}  // namespace

namespace {
// A dynamic rematerialization marker (an eviction or a rebuild) goes to
// t.remat_marks, not to the phases; returns whether `e` was one.
bool take_remat_mark(const MemoryEvent& e, std::int64_t allocated, Timeline& t) {
  const bool evict = e.tag.rfind(kEvictMarker, 0) == 0;
  if (!evict && e.tag.rfind(kRebuildMarker, 0) != 0) return false;
  t.remat_marks.push_back(
      {e.time_ns, allocated, evict, e.tag.substr(std::string(evict ? kEvictMarker : kRebuildMarker).size())});
  return true;
}
}  // namespace

Timeline build_timeline(const MemRecording& r) {
  Timeline t;
  TimelinePoint cur;
  cur.bytes = r.initial_bytes;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    REMAT_CHECK(cur.bytes[c] >= 0, Error, "memory timeline: initial ", category_name(cat_of(c)), " bytes are ",
                cur.bytes[c], ", expected >= 0");
    cur.allocated += cur.bytes[c];
  }
  cur.reserved = r.initial_reserved;
  t.points.push_back(cur);
  t.category_max = cur.bytes;
  t.reserved_peak = cur.reserved;

  std::vector<int> point_phase{-1};  // phase running at each point
  int open = -1;                     // index of the running phase
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    const MemoryEvent& e = r.events[i];
    if (i == 0)
      REMAT_CHECK(e.seq == 0, Error, "memory timeline: the history lost its oldest ", e.seq,
                  " events (the ring buffer was full); record again with a larger capacity");
    else
      REMAT_CHECK(e.seq == r.events[i - 1].seq + 1, Error, "memory timeline: event ", i, " has seq ", e.seq,
                  " after seq ", r.events[i - 1].seq, "; the history must be consecutive");
    const std::size_t c = std::size_t(e.category);
    REMAT_CHECK(c < kNumMemoryCategories, Error, "memory timeline: event ", e.seq, " has an invalid category ", c);
    switch (e.kind) {
      case MemoryEvent::Kind::marker:
        if (take_remat_mark(e, cur.allocated, t)) continue;
        if (open >= 0) t.phases[std::size_t(open)].end_ns = e.time_ns;
        open = -1;
        if (e.tag != "end") {
          t.phases.push_back(TimelinePhase{e.tag, e.time_ns, e.time_ns, cur.allocated});
          open = int(t.phases.size()) - 1;
        }
        continue;
      case MemoryEvent::Kind::alloc:
        REMAT_CHECK(e.size >= 0, Error, "memory timeline: event ", e.seq, " allocates ", e.size, " bytes");
        cur.bytes[c] += e.size;
        cur.allocated += e.size;
        break;
      case MemoryEvent::Kind::free:
        REMAT_CHECK(e.size >= 0 && cur.bytes[c] >= e.size, Error, "memory timeline: event ", e.seq, " frees ",
                    e.size, " bytes of ", category_name(e.category), " (op '", e.tag, "') but only ", cur.bytes[c],
                    " bytes of that category are allocated");
        cur.bytes[c] -= e.size;
        cur.allocated -= e.size;
        break;
      case MemoryEvent::Kind::segment_alloc:
      case MemoryEvent::Kind::segment_free:
        break;
    }
    REMAT_CHECK(cur.allocated == e.allocated_after, Error, "memory timeline: after event ", e.seq, " (",
                event_kind_name(e.kind), " of ", e.size, " bytes) the events add up to ", cur.allocated,
                " allocated bytes but the allocator counted ", e.allocated_after,
                " (were the initial bytes taken when the history was enabled?)");
    cur.reserved = e.reserved_after;
    cur.t_ns = e.time_ns;
    cur.event = std::int64_t(i);
    t.points.push_back(cur);
    point_phase.push_back(open);
    if (open >= 0) {
      auto& p = t.phases[std::size_t(open)];
      p.peak_allocated = std::max(p.peak_allocated, cur.allocated);
    }
    for (std::size_t k = 0; k < kNumMemoryCategories; ++k)
      t.category_max[k] = std::max(t.category_max[k], cur.bytes[k]);
    t.reserved_peak = std::max(t.reserved_peak, cur.reserved);
  }
  t.end_ns = r.events.empty() ? 0 : r.events.back().time_ns;
  if (open >= 0) t.phases[std::size_t(open)].end_ns = t.end_ns;

  for (std::size_t k = 1; k < t.points.size(); ++k)
    if (t.points[k].allocated > t.points[t.peak_point].allocated) t.peak_point = k;
  const TimelinePoint& peak = t.points[t.peak_point];
  if (peak.event >= 0) t.peak_tag = r.events[std::size_t(peak.event)].tag;
  if (point_phase[t.peak_point] >= 0) t.peak_phase = t.phases[std::size_t(point_phase[t.peak_point])].name;
  return t;
}

std::string timeline_json(const MemRecording& r, const Timeline& t) {
  const TimelinePoint& peak = t.points.at(t.peak_point);
  std::string out = "{\n";
  out += "\"format\": \"remat-mem-1\",\n";
  out += "\"config\": " + JsonObject::quote(r.config) + ",\n";
  out += "\"plan\": " + JsonObject::quote(r.plan) + ",\n";
  out += "\"info\": {";
  for (std::size_t i = 0; i < r.info.size(); ++i)
    out += (i ? ", " : "") + JsonObject::quote(r.info[i].first) + ": " + JsonObject::quote(r.info[i].second);
  out += "},\n";
  const TimelinePoint& init = t.points.front();
  out += "\"initial\": {\"allocated\": " + num(init.allocated) + ", \"reserved\": " + num(init.reserved) +
         ", \"by_category\": " + by_category_json(init.bytes) + "},\n";
  out += "\"peak\": {\"allocated\": " + num(peak.allocated) + ", \"reserved\": " + num(peak.reserved) +
         ", \"t_us\": " + us(peak.t_ns) + ", \"phase\": " + JsonObject::quote(t.peak_phase) +
         ", \"tag\": " + JsonObject::quote(t.peak_tag) + ", \"reserved_peak\": " + num(t.reserved_peak) +
         ", \"by_category\": " + by_category_json(peak.bytes) + "},\n";
  out += "\"category_max\": " + by_category_json(t.category_max) + ",\n";
  out += "\"phases\": [";
  for (std::size_t i = 0; i < t.phases.size(); ++i) {
    const auto& p = t.phases[i];
    out += std::string(i ? ",\n  " : "\n  ") + "{\"name\": " + JsonObject::quote(p.name) + ", \"t_us\": " +
           us(p.start_ns) + ", \"end_us\": " + us(p.end_ns) + ", \"peak_allocated\": " + num(p.peak_allocated) + "}";
  }
  out += "\n],\n";
  out += "\"saved_at_peak_by_op\": {";
  bool first = true;
  for (const auto& [op, bytes] : r.saved_at_peak_by_op) {
    out += (first ? "" : ", ") + JsonObject::quote(op) + ": " + num(bytes);
    first = false;
  }
  out += "},\n";
  out += "\"saved_at_peak_total\": " + num(r.saved_at_peak_total) + ",\n";
  out += "\"block_saved_bytes\": [";
  for (std::size_t i = 0; i < r.block_saved_bytes.size(); ++i) out += (i ? ", " : "") + num(r.block_saved_bytes[i]);
  out += "],\n";
  out += "\"duration_us\": " + us(t.end_ns) + ",\n";
  out += "\"events\": [";
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    const MemoryEvent& e = r.events[i];
    out += std::string(i ? ",\n  " : "\n  ") + "{\"t_us\": " + us(e.time_ns) + ", \"kind\": \"" +
           event_kind_name(e.kind) + "\", \"size\": " + num(e.size) + ", \"category\": \"" +
           category_name(e.category) + "\", \"tag\": " + JsonObject::quote(e.tag) +
           ", \"allocated\": " + num(e.allocated_after) + ", \"reserved\": " + num(e.reserved_after) + "}";
  }
  out += "\n]\n}\n";
  return out;
}

}  // namespace remat::tools
