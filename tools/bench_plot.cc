#include "tools/bench_plot.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tools/html.h"

namespace remat::tools {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
const char* kColors[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"};

// A "nice" axis limit and step above `v`.
void axis(double v, double& limit, double& step) {
  const double raw = std::max(v, 1e-9) * 1.1 / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  step = (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
  limit = step * std::ceil(std::max(v, 1e-9) * 1.1 / step);
}

// An MiB cell, or "-" when the planner gave no value.
std::string mib_or_dash(double bytes) { return bytes > 0 ? fmt("%.1f", bytes / kMiB) : "-"; }

}  // namespace

std::vector<std::size_t> pareto_frontier(const std::vector<BenchPoint>& points) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < points.size(); ++i)
    if (std::isfinite(points[i].step_ms) && std::isfinite(points[i].peak_allocated_bytes)) order.push_back(i);
  // By time, then peak, then index: a point is dominated exactly when one
  // before it in this order has a peak no larger (identical pairs: the first wins).
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto &pa = points[a], &pb = points[b];
    if (pa.step_ms != pb.step_ms) return pa.step_ms < pb.step_ms;
    if (pa.peak_allocated_bytes != pb.peak_allocated_bytes) return pa.peak_allocated_bytes < pb.peak_allocated_bytes;
    return a < b;
  });
  std::vector<std::size_t> front;
  for (std::size_t i : order)
    if (front.empty() || points[i].peak_allocated_bytes < points[front.back()].peak_allocated_bytes) front.push_back(i);
  return front;
}

namespace {

// The plot: memory (MiB) against step time (ms), one marker pair per plan
// (activations, peak allocated), the budgets of auto rows, the frontier.
class BenchChart {
 public:
  explicit BenchChart(const std::vector<BenchPoint>& points)
      : points_(points), front_(pareto_frontier(points)), on_front_(points.size(), false),
        any_auto_(std::any_of(points.begin(), points.end(), [](const BenchPoint& p) { return p.is_auto; })) {
    for (std::size_t i : front_) on_front_[i] = true;
    double xmax = 0, ymax = 0;
    for (const auto& p : points) {
      xmax = std::max({xmax, p.step_ms, p.step_ms_max});
      ymax = std::max({ymax, p.peak_allocated_bytes / kMiB, p.activation_bytes / kMiB});
      if (p.is_auto) ymax = std::max(ymax, p.budget_bytes / kMiB);
    }
    axis(xmax, xlim_, xstep_);
    axis(ymax, ylim_, ystep_);
  }

  // Whether point i is on the Pareto frontier.
  bool on_front(std::size_t i) const { return on_front_[i]; }
  bool any_auto() const { return any_auto_; }

  // The <svg> element for `config`.
  std::string svg(const std::string& config) const {
    std::string s = fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                        "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" role=\"img\">\n",
                        W, H);
    s += "<title>" + html_escape("Memory against step time per recompute plan: " + config) + "</title>\n";
    s += axes();
    // Budgets first, then the frontier, so the markers sit on top of both.
    s += budgets();
    s += frontier();
    for (std::size_t i = 0; i < points_.size(); ++i) s += marker(i);
    s += legend();
    s += "</svg>\n";
    return s;
  }

 private:
  static constexpr double W = 980, H = 520, L = 80, R = 240, T = 30, B = 60;
  double X(double ms) const { return L + (W - L - R) * ms / xlim_; }
  double Y(double mib) const { return H - B - (H - T - B) * mib / ylim_; }

  // Grid lines with their values, the frame and the axis titles.
  std::string axes() const {
    std::string s;
    for (double v = 0; v <= xlim_ + 1e-9; v += xstep_) {
      s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>\n", X(v), Y(0), X(v),
               Y(ylim_));
      s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#444\">%.0f</text>\n", X(v), Y(0) + 16, v);
    }
    for (double v = 0; v <= ylim_ + 1e-9; v += ystep_) {
      s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>\n", X(0), Y(v), X(xlim_),
               Y(v));
      s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#444\">%.0f</text>\n", X(0) - 6, Y(v) + 4, v);
    }
    s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", X(0),
             Y(ylim_), X(xlim_) - X(0), Y(0) - Y(ylim_));
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step time (ms; median, bar = min-max over "
             "repeats)</text>\n",
             (X(0) + X(xlim_)) / 2, H - 18);
    s += fmt("<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">memory (MiB)</text>\n", 22.0,
             (Y(0) + Y(ylim_)) / 2);
    return s;
  }

  // Each auto row's memory budget as a dashed line across the plot.
  std::string budgets() const {
    std::string s;
    for (std::size_t i = 0; i < points_.size(); ++i) {
      const auto& p = points_[i];
      if (!p.is_auto || p.budget_bytes <= 0) continue;
      const double yb = Y(p.budget_bytes / kMiB);
      s += "<g class=\"budget\"><title>" +
           html_escape(fmt("%s: memory budget %.1f MiB", p.plan.c_str(), p.budget_bytes / kMiB)) + "</title>\n";
      s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1\" "
               "stroke-dasharray=\"6 4\"/>\n",
               X(0), yb, X(xlim_), yb, kColors[i % 8]);
      // At the left end: every plan is at least as slow as the fastest, so that side is mostly empty.
      s += fmt("<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", X(0) + 6, yb - 4, kColors[i % 8]) +
           html_escape("budget " + p.plan) + "</text></g>\n";
    }
    return s;
  }

  // A staircase: a frontier point's peak is the least any plan reaches at
  // its step time or faster, until the next frontier point's step time.
  std::string frontier() const {
    if (front_.empty()) return "";
    std::string pts;
    for (std::size_t k = 0; k < front_.size(); ++k) {
      const auto& p = points_[front_[k]];
      const double x = X(p.step_ms), y = Y(p.peak_allocated_bytes / kMiB);
      if (k > 0) pts += fmt(" %.1f,%.1f", x, Y(points_[front_[k - 1]].peak_allocated_bytes / kMiB));
      pts += fmt("%s%.1f,%.1f", k > 0 ? " " : "", x, y);
    }
    std::string s = "<g class=\"frontier\"><title>Pareto frontier (peak allocated): " +
                    html_escape(std::accumulate(front_.begin(), front_.end(), std::string(),
                                                [&](std::string a, std::size_t i) {
                                                  return a.empty() ? points_[i].plan : a + ", " + points_[i].plan;
                                                })) +
                    "</title>\n";
    s += "<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"#222\" stroke-width=\"2\"/></g>\n";
    return s;
  }

  // Plan i: its step's min-max bar at the activations, a circle there, a
  // square (a diamond for auto) at the peak, its name, and a tooltip.
  std::string marker(std::size_t i) const {
    const auto& p = points_[i];
    const char* c = kColors[i % 8];
    const double x = X(p.step_ms), ya = Y(p.activation_bytes / kMiB), yp = Y(p.peak_allocated_bytes / kMiB);
    std::string tip = fmt("%s: step %.0f ms, activations %.1f MiB, peak allocated %.1f MiB", p.plan.c_str(), p.step_ms,
                          p.activation_bytes / kMiB, p.peak_allocated_bytes / kMiB);
    if (p.is_auto)
      tip += fmt("; budget %.1f MiB, chose %s (predicted peak %s MiB)", p.budget_bytes / kMiB, p.chosen_plan.c_str(),
                 mib_or_dash(p.predicted_peak_bytes).c_str());
    if (on_front_[i]) tip += "; on the Pareto frontier";
    std::string s =
        std::string("<g class=\"") + (p.is_auto ? "plan auto" : "plan") + "\"><title>" + html_escape(tip) + "</title>\n";
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"/>\n",
             X(p.step_ms_min), ya, X(p.step_ms_max), ya, c);
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"3 3\"/>\n", x, ya,
             x, yp, c);
    s += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"%s\"/>\n", x, ya, c);
    if (p.is_auto)
      s += fmt("<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"#fff\" stroke=\"%s\" "
               "stroke-width=\"2\"/>\n",
               x, yp - 7, x + 7, yp, x, yp + 7, x - 7, yp, c);
    else
      s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#fff\" stroke=\"%s\" "
               "stroke-width=\"2\"/>\n",
               x - 5, yp - 5, c);
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" font-weight=\"bold\">", x + 9, ya - 8, c) + html_escape(p.plan) +
         "</text></g>\n";
    return s;
  }

  std::string legend() const {
    const double lx = W - R + 24;
    std::string s = fmt("<g class=\"legend\"><circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"#666\"/>"
                        "<text x=\"%.1f\" y=\"%.1f\">activations (peak - persistent)</text>\n",
                        lx, T + 10.0, lx + 12, T + 14.0);
    s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#fff\" stroke=\"#666\" stroke-width=\"2\"/>"
             "<text x=\"%.1f\" y=\"%.1f\">peak allocated</text></g>\n",
             lx - 5, T + 26.0, lx + 12, T + 35.0);
    double ly = T + 52.0;
    if (!front_.empty()) {
      s += fmt("<g class=\"legend\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#222\" "
               "stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">Pareto frontier (peak allocated)</text></g>\n",
               lx - 7, ly, lx + 7, ly, lx + 12, ly + 4);
      ly += 16;
    }
    if (any_auto_) {
      s += fmt("<g class=\"legend\"><polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"#fff\" "
               "stroke=\"#666\" stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">auto: peak allocated</text>\n",
               lx, ly - 7, lx + 7, ly, lx, ly + 7, lx - 7, ly, lx + 12, ly + 4);
      ly += 16;
      s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#666\" stroke-dasharray=\"6 4\"/>"
               "<text x=\"%.1f\" y=\"%.1f\">auto: memory budget</text></g>\n",
               lx - 7, ly, lx + 7, ly, lx + 12, ly + 4);
    }
    return s;
  }

  const std::vector<BenchPoint>& points_;
  const std::vector<std::size_t> front_;
  std::vector<bool> on_front_;
  const bool any_auto_;
  double xlim_ = 1, xstep_ = 1, ylim_ = 1, ystep_ = 1;
};

// The per-plan table: medians, ratios and frontier membership.
std::string plan_table(const std::vector<BenchPoint>& points, const BenchChart& chart) {
  std::string h = "<h2>Per plan</h2>\n<table>\n<tr><th>plan</th><th>step ms</th><th>min-max</th><th>activations</th>"
                  "<th>peak allocated</th><th>MFU</th><th>HFU</th><th>time ratio</th><th>memory ratio</th>"
                  "<th>frontier</th></tr>\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    h += fmt("<tr><td><span class=\"sw\" style=\"background:%s\"></span>", kColors[i % 8]) + html_escape(p.plan) +
         fmt("</td><td class=\"n\">%.0f</td><td class=\"n\">%.0f-%.0f</td><td class=\"n\">%.1f MiB</td>"
             "<td class=\"n\">%.1f MiB</td><td class=\"n\">%.1f%%</td><td class=\"n\">%.1f%%</td><td class=\"n\">%.2fx</td>"
             "<td class=\"n\">%.2fx</td><td>%s</td></tr>\n",
             p.step_ms, p.step_ms_min, p.step_ms_max, p.activation_bytes / kMiB, p.peak_allocated_bytes / kMiB,
             100 * p.mfu, 100 * p.hfu, p.time_ratio, p.memory_ratio, chart.on_front(i) ? "yes" : "");
  }
  h += "</table>\n";
  return h;
}

// The planner's rows: budget, choice, predicted against measured.
std::string planner_table(const std::vector<BenchPoint>& points) {
  std::string h = "<h2>Planner (--recompute auto)</h2>\n<table>\n<tr><th>row</th><th>budget MiB</th><th>chosen plan</th>"
                  "<th>predicted peak MiB</th><th>measured peak MiB</th><th>predicted step ms</th><th>measured step ms</th>"
                  "<th>fits</th></tr>\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    if (!p.is_auto) continue;
    const std::string fits = p.budget_bytes > 0 ? (p.peak_allocated_bytes <= p.budget_bytes ? "yes" : "NO") : "-";
    h += fmt("<tr><td style=\"white-space:nowrap\"><span class=\"sw\" style=\"background:%s\"></span>",
             kColors[i % 8]) +
         html_escape(p.plan) + "</td><td class=\"n\">" + mib_or_dash(p.budget_bytes) + "</td><td><code>" + html_escape(p.chosen_plan) +
         "</code></td><td class=\"n\">" + mib_or_dash(p.predicted_peak_bytes) + "</td><td class=\"n\">" +
         fmt("%.1f", p.peak_allocated_bytes / kMiB) + "</td><td class=\"n\">" +
         (p.predicted_step_ms > 0 ? fmt("%.1f", p.predicted_step_ms) : std::string("-")) +
         fmt("</td><td class=\"n\">%.1f</td><td>", p.step_ms) + fits + "</td></tr>\n";
  }
  h += "</table>\n";
  return h;
}

}  // namespace

std::string bench_html(const std::string& config, const std::string& subtitle, const std::vector<BenchPoint>& points) {
  const BenchChart chart(points);
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  html_escape("remat bench: " + config) + "</title>\n" + page_style() + "</head>\n<body>\n";
  h += "<h1>Recompute plans: <code>" + html_escape(config) + "</code></h1>\n";
  h += "<p class=\"summary\">" + html_escape(subtitle) + "</p>\n" + chart.svg(config);
  h += plan_table(points, chart);
  if (chart.any_auto()) h += planner_table(points);
  h += "</body>\n</html>\n";
  return h;
}

}  // namespace remat::tools
