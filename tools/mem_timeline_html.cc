// The HTML page of `./remat mem` (tools/mem_timeline.h): the stacked area
// chart of allocated bytes by category over the step, as inline SVG, and the
// tables of the bytes at the peak.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tools/html.h"
#include "tools/mem_timeline.h"

namespace remat::tools {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string ms(std::int64_t ns) { return fmt("%.2f ms", double(ns) / 1e6); }

MemoryCategory cat_of(std::size_t i) { return static_cast<MemoryCategory>(i); }

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
    case MemoryCategory::loss: return "#ff9da7";
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

// The chart: phase bands, axes, the stacked category areas and the total,
// phase boundaries, the peak and a legend, drawn in that order (later on top).
class SvgChart {
 public:
  SvgChart(const MemRecording& r, const Timeline& t) : r_(r), t_(t), peak_(t.points.at(t.peak_point)) {
    p_.t_max_ms = t.end_ns > 0 ? double(t.end_ns) / 1e6 : 1.0;
    const double peak_mib = std::max(double(peak_.allocated) / kMiB, 1e-3);
    y_step_ = nice_step(peak_mib * 1.12, 6);
    p_.y_max_mib = std::ceil(peak_mib * 1.12 / y_step_) * y_step_;
    x_step_ = nice_step(p_.t_max_ms, 10);
  }

  std::string svg() {
    const double width = 1180, height = p_.y0 + p_.h + 70;
    s_ += fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
              "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" role=\"img\" "
              "style=\"max-width: 100%%; height: auto\">\n",
              width, height, width, height);
    s_ += "<title>" + html_escape("Allocated bytes over one training step: " + r_.config + ", plan " + r_.plan) +
          "</title>\n";
    s_ += fmt("<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", width, height);
    phase_bands();
    axes();
    const std::vector<std::size_t> sel = select_points(t_, p_);
    areas(sel);
    total(sel);
    phase_boundaries();
    // Plot frame.
    s_ += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", p_.x0,
              p_.y0, p_.w, p_.h);
    remat_marks();
    peak_marker();
    legend();
    s_ += "</svg>\n";
    return s_;
  }

 private:
  // Phase bands, with a tooltip each, and their labels above the plot.
  void phase_bands() {
    s_ += "<g class=\"phases\">\n";
    double label_end = -1e9;
    for (const auto& ph : t_.phases) {
      const double xa = p_.x(ph.start_ns), xb = p_.x(ph.end_ns);
      s_ += fmt("<rect class=\"phase\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">", xa, p_.y0,
                std::max(xb - xa, 0.6), p_.h, phase_colour(ph.name));
      s_ += "<title>" + html_escape(ph.name) + ": " + ms(ph.start_ns) + " to " + ms(ph.end_ns) + ", peak " +
            html_escape(format_bytes(ph.peak_allocated)) + "</title></rect>\n";
      const double text_w = 6.6 * double(ph.name.size());
      const double mid = (xa + xb) / 2;
      if (xb - xa >= text_w + 4 && mid - text_w / 2 > label_end + 4) {
        s_ += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">", mid, p_.y0 - 8) +
              html_escape(ph.name) + "</text>\n";
        label_end = mid + text_w / 2;
      }
    }
    s_ += "</g>\n";
  }

  // Grid, ticks and axis labels (MiB up, ms across).
  void axes() {
    s_ += "<g class=\"axes\" stroke=\"#d0d0d0\" stroke-width=\"1\">\n";
    for (double v = 0; v <= p_.y_max_mib + y_step_ * 1e-6; v += y_step_) {
      const double y = p_.y(std::int64_t(v * kMiB));
      s_ += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke-opacity=\"0.7\"/>\n", p_.x0, y,
                p_.x0 + p_.w, y);
      s_ += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" stroke=\"none\" fill=\"#333\">", p_.x0 - 6, y + 4) +
            tick_label(v, y_step_) + "</text>\n";
    }
    for (double v = 0; v <= p_.t_max_ms + x_step_ * 1e-6; v += x_step_) {
      const double x = p_.x0 + p_.w * v / p_.t_max_ms;
      s_ += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, p_.y0 + p_.h, x, p_.y0 + p_.h + 5);
      s_ += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" stroke=\"none\" fill=\"#333\">", x,
                p_.y0 + p_.h + 19) +
            tick_label(v, x_step_) + "</text>\n";
    }
    s_ += "</g>\n";
    s_ += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#333\">time since the step began (ms)</text>\n",
              p_.x0 + p_.w / 2, p_.y0 + p_.h + 40);
    s_ += fmt("<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">allocated "
              "(MiB)</text>\n",
              p_.x0 - 52, p_.y0 + p_.h / 2);
  }

  // The stacked areas over the points `sel`, bottom to top in category order.
  void areas(const std::vector<std::size_t>& sel) {
    std::vector<std::int64_t> below(sel.size(), 0);
    s_ += "<g class=\"areas\" stroke=\"none\">\n";
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
      if (t_.category_max[c] == 0) continue;
      std::vector<std::pair<double, double>> top, bottom, vt, vb;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        const TimelinePoint& pt = t_.points[sel[i]];
        const double x = p_.x(pt.t_ns);
        bottom.emplace_back(x, p_.y(below[i]));
        below[i] += pt.bytes[c];
        top.emplace_back(x, p_.y(below[i]));
      }
      step_vertices(top, vt);
      step_vertices(bottom, vb);
      vt.insert(vt.end(), vb.rbegin(), vb.rend());
      s_ += fmt("<path class=\"area\" data-category=\"%s\" fill=\"%s\" fill-opacity=\"0.9\" d=\"",
                category_name(cat_of(c)), category_colour(cat_of(c))) +
            path_of(vt, true) + "\"><title>" + category_name(cat_of(c)) + ": up to " +
            html_escape(format_bytes(t_.category_max[c])) + "</title></path>\n";
    }
    s_ += "</g>\n";
  }

  // The total as a dark outline.
  void total(const std::vector<std::size_t>& sel) {
    std::vector<std::pair<double, double>> total, v;
    for (std::size_t k : sel) total.emplace_back(p_.x(t_.points[k].t_ns), p_.y(t_.points[k].allocated));
    step_vertices(total, v);
    s_ += "<path class=\"total\" fill=\"none\" stroke=\"#222\" stroke-width=\"0.8\" d=\"" + path_of(v, false) +
          "\"/>\n";
  }

  // Major phase boundaries (forward, backward, optimizer; not each replay).
  void phase_boundaries() {
    std::string prev;
    for (const auto& ph : t_.phases) {
      if (ph.name == "replay") continue;
      if (!prev.empty() && ph.name != prev) {
        const double x = p_.x(ph.start_ns);
        s_ += fmt("<line class=\"boundary\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#666\" "
                  "stroke-dasharray=\"4 3\"/>\n",
                  x, p_.y0, x, p_.y0 + p_.h);
      }
      prev = ph.name;
    }
  }

  // Dynamic rematerialization: a tick on the total per eviction (red, down)
  // and per rebuild (blue, up), with a tooltip naming the op.
  void remat_marks() {
    if (t_.remat_marks.empty()) return;
    s_ += "<g class=\"remat\">\n";
    for (const RematMark& m : t_.remat_marks) {
      const double x = p_.x(m.t_ns), y = p_.y(m.allocated);
      s_ += fmt("<path class=\"%s\" d=\"M%.1f %.1f l-3 %d l6 0 z\" fill=\"%s\"><title>", m.evict ? "evict" : "rebuild",
                x, y, m.evict ? -6 : 6, m.evict ? "#c0392b" : "#2471a3") +
            html_escape((m.evict ? "evicted a tensor made by " : "computed again: ") + m.op + " at " + ms(m.t_ns)) +
            "</title></path>\n";
    }
    s_ += "</g>\n";
  }

  // The peak: a marker and a label with its bytes, time, phase and op.
  void peak_marker() {
    const double x = p_.x(peak_.t_ns), y = p_.y(peak_.allocated);
    s_ += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" stroke-dasharray=\"2 2\"/>\n",
              x, y, x, p_.y0 + p_.h);
    s_ += fmt("<circle class=\"peak\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#ffffff\" stroke=\"#c0392b\" "
              "stroke-width=\"2.5\"/>\n",
              x, y);
    const std::string l1 = "peak " + format_bytes(peak_.allocated) + " at " + ms(peak_.t_ns);
    std::string l2 = t_.peak_phase.empty() ? "" : "in " + t_.peak_phase;
    if (!t_.peak_tag.empty()) l2 += (l2.empty() ? "" : ", ") + std::string("op ") + t_.peak_tag;
    const double tw = std::max(7.6 * double(l1.size()), 6.6 * double(l2.size())) + 12;
    const bool left = x > p_.x0 + p_.w * 0.6;
    const double bx = left ? x - 10 - tw : x + 10;
    const double by = std::max(p_.y0 + 4, y - 8);
    s_ += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"3\" fill=\"#ffffff\" "
              "fill-opacity=\"0.92\" stroke=\"#c0392b\"/>\n",
              bx, by, tw, l2.empty() ? 22.0 : 38.0);
    s_ += fmt("<text class=\"peak-label\" x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\" fill=\"#c0392b\">", bx + 6,
              by + 15) +
          html_escape(l1) + "</text>\n";
    if (!l2.empty())
      s_ += fmt("<text x=\"%.1f\" y=\"%.1f\" fill=\"#333\">", bx + 6, by + 31) + html_escape(l2) + "</text>\n";
  }

  // Legend on the right: categories (with their highest value), then phases.
  void legend() {
    double ly = p_.y0 + 4;
    const double lx = p_.x0 + p_.w + 22;
    s_ += fmt("<g class=\"legend\"><text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">category (max)</text>\n", lx,
              ly + 8);
    ly += 22;
    for (std::size_t c = kNumMemoryCategories; c-- > 0;) {  // top of the stack first
      if (t_.category_max[c] == 0) continue;
      s_ += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\"/>", lx, ly,
                category_colour(cat_of(c)));
      s_ += fmt("<text x=\"%.1f\" y=\"%.1f\">", lx + 20, ly + 11) + category_name(cat_of(c)) + " (" +
            html_escape(format_bytes(t_.category_max[c])) + ")</text>\n";
      ly += 20;
    }
    ly += 12;
    s_ += fmt("<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">phase</text>\n", lx, ly + 8);
    ly += 22;
    std::vector<std::string> seen;
    for (const auto& ph : t_.phases) {
      if (std::find(seen.begin(), seen.end(), ph.name) != seen.end()) continue;
      seen.push_back(ph.name);
      s_ += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\" stroke=\"#bbb\"/>", lx, ly,
                phase_colour(ph.name));
      s_ += fmt("<text x=\"%.1f\" y=\"%.1f\">", lx + 20, ly + 11) + html_escape(ph.name) + "</text>\n";
      ly += 20;
    }
    ly += 12;
    s_ += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#fff\" stroke=\"#c0392b\" stroke-width=\"2.5\"/>",
              lx + 7, ly + 7);
    s_ += fmt("<text x=\"%.1f\" y=\"%.1f\">peak allocated</text>\n", lx + 20, ly + 11);
    ly += 20;
    s_ += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#222\"/>", lx, ly + 7, lx + 14, ly + 7);
    s_ += fmt("<text x=\"%.1f\" y=\"%.1f\">total allocated</text>\n", lx + 20, ly + 11);
    if (!t_.remat_marks.empty()) {
      const auto evictions = std::count_if(t_.remat_marks.begin(), t_.remat_marks.end(),
                                           [](const RematMark& m) { return m.evict; });
      const auto rebuilds = std::int64_t(t_.remat_marks.size()) - evictions;
      ly += 20;
      s_ += fmt("<path d=\"M%.1f %.1f l-3 -6 l6 0 z\" fill=\"#c0392b\"/>", lx + 7, ly + 10);
      s_ += fmt("<text x=\"%.1f\" y=\"%.1f\">%lld evictions</text>\n", lx + 20, ly + 11, static_cast<long long>(evictions));
      ly += 20;
      s_ += fmt("<path d=\"M%.1f %.1f l-3 6 l6 0 z\" fill=\"#2471a3\"/>", lx + 7, ly + 4);
      s_ += fmt("<text x=\"%.1f\" y=\"%.1f\">%lld rebuilds</text>\n", lx + 20, ly + 11, static_cast<long long>(rebuilds));
    }
    s_ += "</g>\n";
  }

  const MemRecording& r_;
  const Timeline& t_;
  const TimelinePoint& peak_;
  Plot p_;
  double y_step_ = 1, x_step_ = 1;
  std::string s_;
};

// The page's heading and summary line, and the recording's info line.
std::string summary_html(const MemRecording& r, const Timeline& t) {
  const TimelinePoint& peak = t.points.at(t.peak_point);
  std::string h = "<h1>Memory over one training step: <code>" + html_escape(r.config) + "</code>, recompute <code>" +
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
  return h;
}

// Bytes by category at the peak.
std::string category_table(const Timeline& t) {
  const TimelinePoint& peak = t.points.at(t.peak_point);
  std::string h = "<div><h2>At the peak, by category</h2>\n<table class=\"categories\">\n"
                  "<tr><th>category</th><th>at the peak</th><th>highest</th></tr>\n";
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    if (t.category_max[c] == 0 && peak.bytes[c] == 0) continue;
    h += std::string("<tr><td><span class=\"sw\" style=\"background:") + category_colour(cat_of(c)) + "\"></span>" +
         category_name(cat_of(c)) + "</td><td class=\"n\">" + html_escape(format_bytes(peak.bytes[c])) +
         "</td><td class=\"n\">" + html_escape(format_bytes(t.category_max[c])) + "</td></tr>\n";
  }
  h += "<tr><th>total</th><th class=\"n\">" + html_escape(format_bytes(peak.allocated)) + "</th><th></th></tr>\n";
  h += "</table></div>\n";
  return h;
}

// Peak per phase (replays and the backward stretches between them merged).
std::string phase_table(const Timeline& t) {
  std::string h = "<div><h2>Peak per phase</h2>\n<table class=\"phases\">\n"
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
  return h;
}

// Saved tensors at the peak, by op (the largest 20).
std::string saved_table(const MemRecording& r) {
  std::vector<std::pair<std::string, std::int64_t>> ops(r.saved_at_peak_by_op.begin(), r.saved_at_peak_by_op.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::int64_t attributed = 0;
  for (const auto& o : ops) attributed += o.second;
  std::string h = "<div><h2>Held for backward at the peak, by op</h2>\n<table class=\"saved\">\n"
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
  h += "</table></div>\n";
  return h;
}

}  // namespace

std::string timeline_html(const MemRecording& r, const Timeline& t) {
  const std::string title = "remat mem: " + r.config + ", recompute " + r.plan;
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + html_escape(title) +
       "</title>\n";
  h += page_style() + "</head>\n<body>\n";
  h += summary_html(r, t);
  h += SvgChart(r, t).svg();
  h += "<div class=\"tables\">\n";
  h += category_table(t);
  h += phase_table(t);
  h += saved_table(r);
  h += "</div>\n";
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
