#include "tools/mem_timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <numeric>

#include "engine/error.h"
#include "tools/html.h"
#include "tools/json.h"

namespace remat::tools {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string num(std::int64_t v) { return std::to_string(v); }
std::string us(std::int64_t ns) { return fmt("%.3f", double(ns) / 1e3); }
std::string ms(std::int64_t ns) { return fmt("%.2f ms", double(ns) / 1e6); }

MemoryCategory cat_of(std::size_t i) { return static_cast<MemoryCategory>(i); }

std::string by_category_json(const std::array<std::int64_t, kNumMemoryCategories>& b) {
  std::string out = "{";
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    out += (c ? ", " : "") + JsonObject::quote(category_name(cat_of(c))) + ": " + num(b[c]);
  return out + "}";
}


// Colours of the categories (stacked bottom to top in enum order) and phases.
const char* category_colour(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameter: return "#4e79a7";
    case MemoryCategory::gradient: return "#f28e2b";
    case MemoryCategory::optimizer: return "#59a14f";
    case MemoryCategory::activation: return "#e15759";
    case MemoryCategory::recompute: return "#9b59b6";
    case MemoryCategory::workspace: return "#edc948";
    case MemoryCategory::communication: return "#76b7b2";
    case MemoryCategory::other: return "#a0a0a0";
  }
  return "#a0a0a0";
}

const char* phase_colour(const std::string& name) {
  if (name == "forward") return "#dbe9f7";
  if (name == "backward") return "#fbe6cf";
  if (name == "replay") return "#e8d5f0";
  if (name == "optimizer") return "#dcefd9";
  return "#eeeeee";
}

// 1, 2 or 5 times a power of ten, so that `range` gets about `target` ticks.
double nice_step(double range, double target) {
  if (!(range > 0)) return 1;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double n = raw / mag;
  return (n < 1.5 ? 1 : n < 3 ? 2 : n < 7 ? 5 : 10) * mag;
}

std::string tick_label(double v, double step) {
  // Enough decimals to tell ticks apart.
  const int decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
  return fmt("%.*f", decimals, v);
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

namespace {

// Geometry of the chart's plot area.
struct Plot {
  double x0 = 80, y0 = 34, w = 860, h = 420;
  double t_max_ms = 1, y_max_mib = 1;
  double x(std::int64_t ns) const { return x0 + w * (double(ns) / 1e6) / t_max_ms; }
  double y(std::int64_t bytes) const { return y0 + h - h * (double(bytes) / kMiB) / y_max_mib; }
};

// Points to draw: per pixel column the lowest and the highest state (in time
// order), plus the first, the last and the peak, so that no spike is lost.
std::vector<std::size_t> select_points(const Timeline& t, const Plot& p) {
  const std::size_t n = t.points.size();
  const int cols = std::max(1, int(p.w));
  std::vector<std::int64_t> lo(std::size_t(cols), -1), hi(std::size_t(cols), -1);
  for (std::size_t k = 0; k < n; ++k) {
    const int col = std::clamp(int(p.x(t.points[k].t_ns) - p.x0), 0, cols - 1);
    auto& l = lo[std::size_t(col)];
    auto& h = hi[std::size_t(col)];
    if (l < 0 || t.points[k].allocated < t.points[std::size_t(l)].allocated) l = std::int64_t(k);
    if (h < 0 || t.points[k].allocated > t.points[std::size_t(h)].allocated) h = std::int64_t(k);
  }
  std::vector<std::size_t> sel{0, n - 1, t.peak_point};
  for (int c = 0; c < cols; ++c) {
    if (lo[std::size_t(c)] >= 0) sel.push_back(std::size_t(lo[std::size_t(c)]));
    if (hi[std::size_t(c)] >= 0) sel.push_back(std::size_t(hi[std::size_t(c)]));
  }
  std::sort(sel.begin(), sel.end());
  sel.erase(std::unique(sel.begin(), sel.end()), sel.end());
  return sel;
}

// "x,y" vertices of a step line (memory stays put until the next event).
void step_vertices(const std::vector<std::pair<double, double>>& pts, std::vector<std::pair<double, double>>& out) {
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (i > 0) out.emplace_back(pts[i].first, pts[i - 1].second);
    out.push_back(pts[i]);
  }
}

std::string path_of(const std::vector<std::pair<double, double>>& v, bool close) {
  std::string d;
  d.reserve(v.size() * 14);
  for (std::size_t i = 0; i < v.size(); ++i) d += fmt("%s%.1f,%.1f", i ? "L" : "M", v[i].first, v[i].second);
  if (close) d += "Z";
  return d;
}

std::string svg_chart(const MemRecording& r, const Timeline& t) {
  Plot p;
  const double width = 1180, height = p.y0 + p.h + 70;
  const TimelinePoint& peak = t.points.at(t.peak_point);
  p.t_max_ms = t.end_ns > 0 ? double(t.end_ns) / 1e6 : 1.0;
  const double peak_mib = std::max(double(peak.allocated) / kMiB, 1e-3);
  const double y_step = nice_step(peak_mib * 1.12, 6);
  p.y_max_mib = std::ceil(peak_mib * 1.12 / y_step) * y_step;
  const double x_step = nice_step(p.t_max_ms, 10);

  std::string s;
  s += fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
           "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" role=\"img\" "
           "style=\"max-width: 100%%; height: auto\">\n",
           width, height, width, height);
  s += "<title>" + html_escape("Allocated bytes over one training step: " + r.config + ", plan " + r.plan) +
       "</title>\n";
  s += fmt("<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", width, height);

  // Phase bands, with a tooltip each, and their labels above the plot.
  s += "<g class=\"phases\">\n";
  double label_end = -1e9;
  for (const auto& ph : t.phases) {
    const double xa = p.x(ph.start_ns), xb = p.x(ph.end_ns);
    s += fmt("<rect class=\"phase\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">", xa, p.y0,
             std::max(xb - xa, 0.6), p.h, phase_colour(ph.name));
    s += "<title>" + html_escape(ph.name) + ": " + ms(ph.start_ns) + " to " + ms(ph.end_ns) + ", peak " +
         html_escape(format_bytes(ph.peak_allocated)) + "</title></rect>\n";
    const double text_w = 6.6 * double(ph.name.size());
    const double mid = (xa + xb) / 2;
    if (xb - xa >= text_w + 4 && mid - text_w / 2 > label_end + 4) {
      s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">", mid, p.y0 - 8) +
           html_escape(ph.name) + "</text>\n";
      label_end = mid + text_w / 2;
    }
  }
  s += "</g>\n";

  // Grid and axes.
  s += "<g class=\"axes\" stroke=\"#d0d0d0\" stroke-width=\"1\">\n";
  for (double v = 0; v <= p.y_max_mib + y_step * 1e-6; v += y_step) {
    const double y = p.y(std::int64_t(v * kMiB));
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke-opacity=\"0.7\"/>\n", p.x0, y, p.x0 + p.w, y);
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" stroke=\"none\" fill=\"#333\">", p.x0 - 6, y + 4) +
         tick_label(v, y_step) + "</text>\n";
  }
  for (double v = 0; v <= p.t_max_ms + x_step * 1e-6; v += x_step) {
    const double x = p.x0 + p.w * v / p.t_max_ms;
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, p.y0 + p.h, x, p.y0 + p.h + 5);
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" stroke=\"none\" fill=\"#333\">", x, p.y0 + p.h + 19) +
         tick_label(v, x_step) + "</text>\n";
  }
  s += "</g>\n";
  s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#333\">time since the step began (ms)</text>\n",
           p.x0 + p.w / 2, p.y0 + p.h + 40);
  s += fmt("<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">allocated "
           "(MiB)</text>\n",
           p.x0 - 52, p.y0 + p.h / 2);

  // The stacked areas, bottom to top in category order.
  const std::vector<std::size_t> sel = select_points(t, p);
  std::vector<std::int64_t> below(sel.size(), 0);
  s += "<g class=\"areas\" stroke=\"none\">\n";
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    if (t.category_max[c] == 0) continue;
    std::vector<std::pair<double, double>> top, bottom, vt, vb;
    for (std::size_t i = 0; i < sel.size(); ++i) {
      const TimelinePoint& pt = t.points[sel[i]];
      const double x = p.x(pt.t_ns);
      bottom.emplace_back(x, p.y(below[i]));
      below[i] += pt.bytes[c];
      top.emplace_back(x, p.y(below[i]));
    }
    step_vertices(top, vt);
    step_vertices(bottom, vb);
    vt.insert(vt.end(), vb.rbegin(), vb.rend());
    s += fmt("<path class=\"area\" data-category=\"%s\" fill=\"%s\" fill-opacity=\"0.9\" d=\"", category_name(cat_of(c)),
             category_colour(cat_of(c))) +
         path_of(vt, true) + "\"><title>" + category_name(cat_of(c)) + ": up to " +
         html_escape(format_bytes(t.category_max[c])) + "</title></path>\n";
  }
  s += "</g>\n";
  // The total as a dark outline.
  {
    std::vector<std::pair<double, double>> total, v;
    for (std::size_t k : sel) total.emplace_back(p.x(t.points[k].t_ns), p.y(t.points[k].allocated));
    step_vertices(total, v);
    s += "<path class=\"total\" fill=\"none\" stroke=\"#222\" stroke-width=\"0.8\" d=\"" + path_of(v, false) +
         "\"/>\n";
  }

  // Major phase boundaries (forward, backward, optimizer; not each replay).
  std::string prev;
  for (const auto& ph : t.phases) {
    if (ph.name == "replay") continue;
    if (!prev.empty() && ph.name != prev) {
      const double x = p.x(ph.start_ns);
      s += fmt("<line class=\"boundary\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#666\" "
               "stroke-dasharray=\"4 3\"/>\n",
               x, p.y0, x, p.y0 + p.h);
    }
    prev = ph.name;
  }

  // Plot frame.
  s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", p.x0, p.y0,
           p.w, p.h);

  // The peak.
  {
    const double x = p.x(peak.t_ns), y = p.y(peak.allocated);
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" stroke-dasharray=\"2 2\"/>\n", x,
             y, x, p.y0 + p.h);
    s += fmt("<circle class=\"peak\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#ffffff\" stroke=\"#c0392b\" "
             "stroke-width=\"2.5\"/>\n",
             x, y);
    const std::string l1 = "peak " + format_bytes(peak.allocated) + " at " + ms(peak.t_ns);
    std::string l2 = t.peak_phase.empty() ? "" : "in " + t.peak_phase;
    if (!t.peak_tag.empty()) l2 += (l2.empty() ? "" : ", ") + std::string("op ") + t.peak_tag;
    const double tw = std::max(7.6 * double(l1.size()), 6.6 * double(l2.size())) + 12;
    const bool left = x > p.x0 + p.w * 0.6;
    const double bx = left ? x - 10 - tw : x + 10;
    const double by = std::max(p.y0 + 4, y - 8);
    s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"3\" fill=\"#ffffff\" "
             "fill-opacity=\"0.92\" stroke=\"#c0392b\"/>\n",
             bx, by, tw, l2.empty() ? 22.0 : 38.0);
    s += fmt("<text class=\"peak-label\" x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\" fill=\"#c0392b\">", bx + 6,
             by + 15) +
         html_escape(l1) + "</text>\n";
    if (!l2.empty())
      s += fmt("<text x=\"%.1f\" y=\"%.1f\" fill=\"#333\">", bx + 6, by + 31) + html_escape(l2) + "</text>\n";
  }

  // Legend on the right: categories (with their highest value), then phases.
  double ly = p.y0 + 4;
  const double lx = p.x0 + p.w + 22;
  s += fmt("<g class=\"legend\"><text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">category (max)</text>\n", lx, ly + 8);
  ly += 22;
  for (std::size_t c = kNumMemoryCategories; c-- > 0;) {  // top of the stack first
    if (t.category_max[c] == 0) continue;
    s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\"/>", lx, ly, category_colour(cat_of(c)));
    s += fmt("<text x=\"%.1f\" y=\"%.1f\">", lx + 20, ly + 11) + category_name(cat_of(c)) + " (" +
         html_escape(format_bytes(t.category_max[c])) + ")</text>\n";
    ly += 20;
  }
  ly += 12;
  s += fmt("<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">phase</text>\n", lx, ly + 8);
  ly += 22;
  std::vector<std::string> seen;
  for (const auto& ph : t.phases) {
    if (std::find(seen.begin(), seen.end(), ph.name) != seen.end()) continue;
    seen.push_back(ph.name);
    s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\" stroke=\"#bbb\"/>", lx, ly,
             phase_colour(ph.name));
    s += fmt("<text x=\"%.1f\" y=\"%.1f\">", lx + 20, ly + 11) + html_escape(ph.name) + "</text>\n";
    ly += 20;
  }
  ly += 12;
  s += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#fff\" stroke=\"#c0392b\" stroke-width=\"2.5\"/>", lx + 7,
           ly + 7);
  s += fmt("<text x=\"%.1f\" y=\"%.1f\">peak allocated</text>\n", lx + 20, ly + 11);
  ly += 20;
  s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#222\"/>", lx, ly + 7, lx + 14, ly + 7);
  s += fmt("<text x=\"%.1f\" y=\"%.1f\">total allocated</text>\n", lx + 20, ly + 11);
  s += "</g>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace

std::string timeline_html(const MemRecording& r, const Timeline& t) {
  const TimelinePoint& peak = t.points.at(t.peak_point);
  const std::string title = "remat mem: " + r.config + ", recompute " + r.plan;
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + html_escape(title) +
       "</title>\n";
  h += page_style() + "</head>\n<body>\n";
  h += "<h1>Memory over one training step: <code>" + html_escape(r.config) + "</code>, recompute <code>" +
       html_escape(r.plan) + "</code></h1>\n";
  h += "<p class=\"summary\">Peak allocated <b>" + html_escape(format_bytes(peak.allocated)) + "</b> at " +
       ms(peak.t_ns);
  if (!t.peak_phase.empty()) h += " during <b>" + html_escape(t.peak_phase) + "</b>";
  if (!t.peak_tag.empty()) h += " (allocation by op <code>" + html_escape(t.peak_tag) + "</code>)";
  h += "; peak reserved " + html_escape(format_bytes(t.reserved_peak)) + "; the step took " + ms(t.end_ns) + ", " +
       std::to_string(r.events.size()) + " allocator events.";
  h += "</p>\n";
  if (!r.info.empty()) {
    h += "<p class=\"info\">";
    for (std::size_t i = 0; i < r.info.size(); ++i)
      h += (i ? " &middot; " : "") + html_escape(r.info[i].first) + " <b>" + html_escape(r.info[i].second) + "</b>";
    h += "</p>\n";
  }
  h += svg_chart(r, t);

  h += "<div class=\"tables\">\n";
  // Bytes by category at the peak.
  h += "<div><h2>At the peak, by category</h2>\n<table class=\"categories\">\n"
       "<tr><th>category</th><th>at the peak</th><th>highest</th></tr>\n";
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    if (t.category_max[c] == 0 && peak.bytes[c] == 0) continue;
    h += std::string("<tr><td><span class=\"sw\" style=\"background:") + category_colour(cat_of(c)) + "\"></span>" +
         category_name(cat_of(c)) + "</td><td class=\"n\">" + html_escape(format_bytes(peak.bytes[c])) +
         "</td><td class=\"n\">" + html_escape(format_bytes(t.category_max[c])) + "</td></tr>\n";
  }
  h += "<tr><th>total</th><th class=\"n\">" + html_escape(format_bytes(peak.allocated)) + "</th><th></th></tr>\n";
  h += "</table></div>\n";

  // Peak per phase (replays and the backward stretches between them merged).
  h += "<div><h2>Peak per phase</h2>\n<table class=\"phases\">\n"
       "<tr><th>phase</th><th>count</th><th>time</th><th>peak allocated</th></tr>\n";
  std::vector<std::string> order;
  std::map<std::string, std::array<std::int64_t, 3>> agg;  // count, ns, peak
  for (const auto& ph : t.phases) {
    if (!agg.count(ph.name)) order.push_back(ph.name);
    auto& a = agg[ph.name];
    a[0] += 1;
    a[1] += ph.end_ns - ph.start_ns;
    a[2] = std::max(a[2], ph.peak_allocated);
  }
  for (const auto& name : order) {
    const auto& a = agg[name];
    h += std::string("<tr><td><span class=\"sw\" style=\"background:") + phase_colour(name) + "\"></span>" +
         html_escape(name) + "</td><td class=\"n\">" + std::to_string(a[0]) + "</td><td class=\"n\">" + ms(a[1]) +
         "</td><td class=\"n\">" + html_escape(format_bytes(a[2])) + "</td></tr>\n";
  }
  h += "</table></div>\n";

  // Saved tensors at the peak, by op.
  std::vector<std::pair<std::string, std::int64_t>> ops(r.saved_at_peak_by_op.begin(), r.saved_at_peak_by_op.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::int64_t attributed = 0;
  for (const auto& o : ops) attributed += o.second;
  h += "<div><h2>Held for backward at the peak, by op</h2>\n<table class=\"saved\">\n"
       "<tr><th>op</th><th>bytes</th><th>share</th></tr>\n";
  const std::size_t shown = std::min<std::size_t>(ops.size(), 20);
  for (std::size_t i = 0; i < shown; ++i) {
    const double share = attributed > 0 ? double(ops[i].second) / double(attributed) : 0.0;
    h += "<tr><td><code>" + html_escape(ops[i].first) + "</code></td><td class=\"n\">" +
         html_escape(format_bytes(ops[i].second)) + "</td><td><span class=\"bar\" style=\"width:" +
         fmt("%.0f", 120 * share) + "px\"></span> " + fmt("%.1f%%", 100 * share) + "</td></tr>\n";
  }
  if (ops.empty()) h += "<tr><td colspan=\"3\">nothing was held for backward at the peak</td></tr>\n";
  if (ops.size() > shown)
    h += "<tr><td colspan=\"3\">... and " + std::to_string(ops.size() - shown) + " more ops</td></tr>\n";
  h += "<tr><th>held (each storage once)</th><th class=\"n\">" + html_escape(format_bytes(r.saved_at_peak_total)) +
       "</th><th></th></tr>\n";
  h += "</table></div>\n</div>\n";

  h += "<p class=\"note\">The chart stacks the bytes the caching allocator had handed out (block sizes) by memory "
       "category, replayed from its event history over one training step; each pixel column shows the lowest and "
       "the highest state inside it, so no spike is lost. Shaded bands are the phases of the step: replay bands are "
       "checkpoint regions recomputed during backward, whose allocations are the recompute category. The by-op table "
       "counts each holder's own tensors, so a tensor saved by two ops appears under both; "
       "<code>checkpoint_boundary</code> are region inputs kept for the replay, <code>recompute</code> tensors a "
       "replay regenerated that backward has not used yet.</p>\n";
  h += "</body>\n</html>\n";
  return h;
}

}  // namespace remat::tools
