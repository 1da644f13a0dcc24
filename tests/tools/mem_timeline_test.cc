// tools/mem_timeline: per-category reconstruction from allocator events,
// phases and peak, the JSON and the HTML page.
#include <catch2/catch.hpp>

#include <string>

#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/json.h"
#include "tools/mem_timeline.h"

using namespace remat;
using remat::tools::build_timeline;
using remat::tools::MemRecording;
using remat::tools::Timeline;

namespace {

using Kind = MemoryEvent::Kind;
using Cat = MemoryCategory;

// Appends events with consistent seq, time and allocator totals.
struct EventLog {
  MemRecording rec;
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
  std::int64_t t = 0;

  explicit EventLog(std::int64_t params) {
    rec.config = "tiny";
    rec.plan = "per_block";
    rec.initial_bytes[std::size_t(Cat::parameter)] = params;
    allocated = params;
    reserved = 1 << 20;
    rec.initial_reserved = reserved;
  }
  void add(Kind k, std::int64_t size, Cat c, const std::string& tag) {
    MemoryEvent e;
    e.seq = rec.events.size();
    t += 1000000;  // 1 ms apart
    e.time_ns = t;
    e.kind = k;
    e.size = size;
    e.category = c;
    e.tag = tag;
    if (k == Kind::alloc) allocated += size;
    if (k == Kind::free) allocated -= size;
    if (k == Kind::segment_alloc) reserved += size;
    if (k == Kind::segment_free) reserved -= size;
    e.allocated_after = allocated;
    e.reserved_after = reserved;
    rec.events.push_back(e);
  }
  void alloc(std::int64_t size, Cat c, const std::string& tag) { add(Kind::alloc, size, c, tag); }
  void free(std::int64_t size, Cat c, const std::string& tag) { add(Kind::free, size, c, tag); }
  void mark(const std::string& label) { add(Kind::marker, 0, Cat::other, label); }
};

// A step in miniature: forward saves activations, backward replays a region
// (recompute bytes rise and fall), gradients appear, the optimizer runs.
EventLog sample_step() {
  EventLog g(4096);
  g.mark("forward");
  g.alloc(1024, Cat::activation, "matmul");
  g.add(Kind::segment_alloc, 2 << 20, Cat::activation, "matmul");
  g.alloc(2048, Cat::activation, "swiglu");
  g.mark("backward");
  g.mark("replay");
  g.alloc(4096, Cat::recompute, "matmul");  // the peak: 4096 + 1024 + 2048 + 4096
  g.mark("backward");
  g.free(4096, Cat::recompute, "matmul");
  g.alloc(512, Cat::gradient, "");
  g.free(2048, Cat::activation, "swiglu");
  g.mark("optimizer");
  g.free(1024, Cat::activation, "matmul");
  g.mark("end");
  g.rec.saved_at_peak_by_op = {{"matmul", 3000}, {"recompute", 4096}, {"<b>odd&op</b>", 10}};
  g.rec.saved_at_peak_total = 7106;
  g.rec.info = {{"seed", "0"}, {"replays", "1"}};
  return g;
}

std::int64_t at(const tools::TimelinePoint& p, Cat c) { return p.bytes[std::size_t(c)]; }

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("timeline reconstructs bytes per category from alloc and free events") {
  const EventLog g = sample_step();
  const Timeline t = build_timeline(g.rec);
  // The initial state plus one point per non-marker event.
  REQUIRE(t.points.size() == 1 + 8);
  CHECK(t.points[0].event == -1);
  CHECK(t.points[0].allocated == 4096);
  CHECK(at(t.points[0], Cat::parameter) == 4096);
  CHECK(at(t.points[1], Cat::activation) == 1024);
  CHECK(t.points[2].reserved == (1 << 20) + (2 << 20));  // the segment event
  CHECK(t.points[2].allocated == 4096 + 1024);
  CHECK(at(t.points[3], Cat::activation) == 3072);
  CHECK(at(t.points[4], Cat::recompute) == 4096);
  CHECK(at(t.points[5], Cat::recompute) == 0);
  CHECK(at(t.points[6], Cat::gradient) == 512);
  CHECK(at(t.points[8], Cat::activation) == 0);
  CHECK(t.points[8].allocated == 4096 + 512);
  for (const auto& p : t.points) {
    std::int64_t sum = 0;
    for (auto b : p.bytes) sum += b;
    CHECK(sum == p.allocated);
  }
  CHECK(t.category_max[std::size_t(Cat::recompute)] == 4096);
  CHECK(t.category_max[std::size_t(Cat::activation)] == 3072);
  CHECK(t.category_max[std::size_t(Cat::workspace)] == 0);
  CHECK(t.reserved_peak == (3 << 20));
  CHECK(t.end_ns == g.rec.events.back().time_ns);
}

TEST_CASE("timeline finds phases, replays and the peak") {
  const EventLog g = sample_step();
  const Timeline t = build_timeline(g.rec);
  REQUIRE(t.phases.size() == 5);
  const char* names[] = {"forward", "backward", "replay", "backward", "optimizer"};
  for (std::size_t i = 0; i < 5; ++i) CHECK(t.phases[i].name == names[i]);
  for (std::size_t i = 0; i + 1 < t.phases.size(); ++i) CHECK(t.phases[i].end_ns == t.phases[i + 1].start_ns);
  CHECK(t.phases.back().end_ns == g.rec.events.back().time_ns);  // closed by "end"
  CHECK(t.phases[0].peak_allocated == 4096 + 3072);
  CHECK(t.phases[2].peak_allocated == 4096 + 3072 + 4096);
  CHECK(t.phases[4].peak_allocated == 4096 + 512 + 1024);  // the state when it began counts
  CHECK(t.peak_point == 4);
  CHECK(t.points[t.peak_point].allocated == 4096 + 3072 + 4096);
  CHECK(t.peak_tag == "matmul");
  CHECK(t.peak_phase == "replay");
}

TEST_CASE("timeline rejects events that do not add up") {
  SECTION("a total the allocator disagrees with") {
    EventLog g = sample_step();
    g.rec.events[3].allocated_after += 512;
    CHECK_THROWS_WITH(build_timeline(g.rec), Catch::Contains("the allocator counted"));
  }
  SECTION("initial bytes missing") {
    EventLog g = sample_step();
    g.rec.initial_bytes[std::size_t(Cat::parameter)] = 0;
    CHECK_THROWS_AS(build_timeline(g.rec), Error);
  }
  SECTION("a ring buffer that lost its oldest events") {
    EventLog g = sample_step();
    g.rec.events.erase(g.rec.events.begin());
    CHECK_THROWS_WITH(build_timeline(g.rec), Catch::Contains("lost its oldest 1 events"));
  }
  SECTION("a free of more than the category holds") {
    EventLog g(0);
    g.alloc(512, Cat::activation, "add");
    g.free(512, Cat::gradient, "add");
    CHECK_THROWS_WITH(build_timeline(g.rec), Catch::Contains("only 0 bytes of that category"));
  }
}

TEST_CASE("timeline of a real allocator's history adds up") {
  CachingAllocator alloc(make_cpu_memory_backend());
  DataPtr keep;
  {
    CategoryScope c(Cat::parameter);
    keep = alloc.allocate(3000);
  }
  MemRecording rec;
  const MemoryStats before = alloc.stats();
  rec.initial_bytes = before.category_bytes;
  rec.initial_reserved = before.reserved_bytes;
  alloc.enable_history(1000);
  alloc.mark("forward");
  DataPtr a, b;
  {
    CategoryScope c(Cat::activation);
    TagScope tag("matmul");
    a = alloc.allocate(5000);
    b = alloc.allocate(3 << 20);  // a new segment
  }
  alloc.mark("replay");
  {
    CategoryScope c(Cat::recompute);
    DataPtr r = alloc.allocate(7000);
  }
  alloc.mark("backward");
  a.reset();
  b.reset();
  alloc.mark("end");
  rec.events = alloc.history();
  const Timeline t = build_timeline(rec);
  const std::int64_t params = before.category_bytes[std::size_t(Cat::parameter)];
  CHECK(params >= 3000);
  CHECK(t.points.front().allocated == params);
  CHECK(t.points.back().allocated == params);
  CHECK(t.points.back().reserved == alloc.stats().reserved_bytes);
  CHECK(t.category_max[std::size_t(Cat::recompute)] >= 7000);
  CHECK(t.points[t.peak_point].allocated == alloc.stats().allocated_peak);
  CHECK(t.peak_phase == "replay");
  REQUIRE(t.phases.size() == 3);
  CHECK(t.phases[1].name == "replay");
}

TEST_CASE("timeline JSON carries events, phases, the peak and the saved bytes by op") {
  const EventLog g = sample_step();
  const Timeline t = build_timeline(g.rec);
  const Json j = Json::parse(tools::timeline_json(g.rec, t), "timeline JSON");
  CHECK(j.at("format").as_string() == "remat-mem-1");
  CHECK(j.at("config").as_string() == "tiny");
  CHECK(j.at("plan").as_string() == "per_block");
  REQUIRE(j.at("events").items().size() == g.rec.events.size());
  const Json& e1 = j.at("events").items()[1];
  CHECK(e1.at("kind").as_string() == "alloc");
  CHECK(e1.at("category").as_string() == "activation");
  CHECK(e1.at("tag").as_string() == "matmul");
  CHECK(e1.at("size").as_int() == 1024);
  CHECK(e1.at("allocated").as_int() == 4096 + 1024);
  CHECK(e1.at("t_us").as_number() == Approx(2000.0));
  REQUIRE(j.at("phases").items().size() == 5);
  CHECK(j.at("phases").items()[2].at("name").as_string() == "replay");
  CHECK(j.at("phases").items()[2].at("t_us").as_number() == Approx(6000.0));
  const Json& peak = j.at("peak");
  CHECK(peak.at("allocated").as_int() == 4096 + 3072 + 4096);
  CHECK(peak.at("phase").as_string() == "replay");
  CHECK(peak.at("tag").as_string() == "matmul");
  CHECK(peak.at("by_category").at("recompute").as_int() == 4096);
  CHECK(peak.at("by_category").at("parameter").as_int() == 4096);
  CHECK(j.at("saved_at_peak_by_op").at("recompute").as_int() == 4096);
  CHECK(j.at("saved_at_peak_total").as_int() == 7106);
  CHECK(j.at("info").at("replays").as_string() == "1");
  CHECK(j.at("initial").at("allocated").as_int() == 4096);
}

TEST_CASE("timeline HTML is a self-contained page with the chart, legend, phases, peak and tables") {
  EventLog g = sample_step();
  g.rec.config = "my<config>";
  const Timeline t = build_timeline(g.rec);
  const std::string h = tools::timeline_html(g.rec, t);
  CHECK(h.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(count(h, "<svg") == 1);
  CHECK(count(h, "</svg>") == 1);
  CHECK(h.find("</html>") != std::string::npos);
  // Self-contained: no scripts, no external resources.
  CHECK(h.find("<script") == std::string::npos);
  CHECK(h.find("src=") == std::string::npos);
  CHECK(h.find("href=") == std::string::npos);
  CHECK(h.find("@import") == std::string::npos);
  // Title with config and plan, escaped.
  CHECK(h.find("my&lt;config&gt;") != std::string::npos);
  CHECK(h.find("my<config>") == std::string::npos);
  CHECK(h.find("per_block") != std::string::npos);
  // One area per category that ever held bytes, none for the others.
  CHECK(count(h, "class=\"area\"") == 4);
  for (const char* c : {"parameter", "gradient", "activation", "recompute"})
    CHECK(h.find(std::string("data-category=\"") + c + "\"") != std::string::npos);
  CHECK(h.find("data-category=\"workspace\"") == std::string::npos);
  // Phases shaded, replay among them; the peak marked with its value.
  CHECK(count(h, "class=\"phase\"") == 5);
  CHECK(h.find(">replay<") != std::string::npos);
  CHECK(h.find("class=\"peak\"") != std::string::npos);
  CHECK(h.find("peak " + format_bytes(4096 + 3072 + 4096)) != std::string::npos);
  // Axes in MiB and ms, a legend.
  CHECK(h.find("allocated (MiB)") != std::string::npos);
  CHECK(h.find("(ms)") != std::string::npos);
  CHECK(h.find("class=\"legend\"") != std::string::npos);
  // The saved-bytes table, biggest first, op names escaped.
  const auto rec_pos = h.find("<code>recompute</code></td>");
  const auto mm_pos = h.find("<code>matmul</code></td>");
  REQUIRE(rec_pos != std::string::npos);
  REQUIRE(mm_pos != std::string::npos);
  CHECK(rec_pos < mm_pos);
  CHECK(h.find("&lt;b&gt;odd&amp;op&lt;/b&gt;") != std::string::npos);
  CHECK(h.find("<b>odd&op</b>") == std::string::npos);
  CHECK(h.find("class=\"categories\"") != std::string::npos);
}

TEST_CASE("timeline of an empty history is the initial state") {
  MemRecording rec;
  rec.config = "c";
  rec.plan = "none";
  rec.initial_bytes[std::size_t(Cat::optimizer)] = 1024;
  const Timeline t = build_timeline(rec);
  REQUIRE(t.points.size() == 1);
  CHECK(t.points[0].allocated == 1024);
  CHECK(t.phases.empty());
  CHECK(t.peak_tag.empty());
  const std::string h = tools::timeline_html(rec, t);
  CHECK(h.find("<svg") != std::string::npos);
  CHECK(Json::parse(tools::timeline_json(rec, t)).at("events").items().empty());
}
