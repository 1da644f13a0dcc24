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

std::string bench_html(const std::string& config, const std::string& subtitle, const std::vector<BenchPoint>& points) {
  const double W = 980, H = 520, L = 80, R = 240, T = 30, B = 60;
  const std::vector<std::size_t> front = pareto_frontier(points);
  std::vector<bool> on_front(points.size(), false);
  for (std::size_t i : front) on_front[i] = true;
  const bool any_auto = std::any_of(points.begin(), points.end(), [](const BenchPoint& p) { return p.is_auto; });
  double xmax = 0, ymax = 0;
  for (const auto& p : points) {
    xmax = std::max({xmax, p.step_ms, p.step_ms_max});
    ymax = std::max({ymax, p.peak_allocated_bytes / kMiB, p.activation_bytes / kMiB});
    if (p.is_auto) ymax = std::max(ymax, p.budget_bytes / kMiB);
  }
  double xlim, xstep, ylim, ystep;
  axis(xmax, xlim, xstep);
  axis(ymax, ylim, ystep);
  auto X = [&](double ms) { return L + (W - L - R) * ms / xlim; };
  auto Y = [&](double mib) { return H - B - (H - T - B) * mib / ylim; };

  std::string s = fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" role=\"img\">\n",
                      W, H);
  s += "<title>" + html_escape("Memory against step time per recompute plan: " + config) + "</title>\n";
  for (double v = 0; v <= xlim + 1e-9; v += xstep) {
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>\n", X(v), Y(0), X(v), Y(ylim));
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#444\">%.0f</text>\n", X(v), Y(0) + 16, v);
  }
  for (double v = 0; v <= ylim + 1e-9; v += ystep) {
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>\n", X(0), Y(v), X(xlim), Y(v));
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#444\">%.0f</text>\n", X(0) - 6, Y(v) + 4, v);
  }
  s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", X(0), Y(ylim),
           X(xlim) - X(0), Y(0) - Y(ylim));
  s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step time (ms; median, bar = min-max over repeats)</text>\n",
           (X(0) + X(xlim)) / 2, H - 18);
  s += fmt("<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">memory (MiB)</text>\n", 22.0,
           (Y(0) + Y(ylim)) / 2);
  // Budgets first, then the frontier, so the markers sit on top of both.
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    if (!p.is_auto || p.budget_bytes <= 0) continue;
    const double yb = Y(p.budget_bytes / kMiB);
    s += "<g class=\"budget\"><title>" +
         html_escape(fmt("%s: memory budget %.1f MiB", p.plan.c_str(), p.budget_bytes / kMiB)) + "</title>\n";
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1\" "
             "stroke-dasharray=\"6 4\"/>\n",
             X(0), yb, X(xlim), yb, kColors[i % 8]);
    // At the left end: every plan is at least as slow as the fastest, so that side is mostly empty.
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", X(0) + 6, yb - 4, kColors[i % 8]) +
         html_escape("budget " + p.plan) + "</text></g>\n";
  }
  if (!front.empty()) {
    // A staircase: a frontier point's peak is the least any plan reaches at
    // its step time or faster, until the next frontier point's step time.
    std::string pts;
    for (std::size_t k = 0; k < front.size(); ++k) {
      const auto& p = points[front[k]];
      const double x = X(p.step_ms), y = Y(p.peak_allocated_bytes / kMiB);
      if (k > 0) pts += fmt(" %.1f,%.1f", x, Y(points[front[k - 1]].peak_allocated_bytes / kMiB));
      pts += fmt("%s%.1f,%.1f", k > 0 ? " " : "", x, y);
    }
    s += "<g class=\"frontier\"><title>Pareto frontier (peak allocated): " +
         html_escape(std::accumulate(front.begin(), front.end(), std::string(),
                                     [&](std::string a, std::size_t i) {
                                       return a.empty() ? points[i].plan : a + ", " + points[i].plan;
                                     })) +
         "</title>\n";
    s += "<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"#222\" stroke-width=\"2\"/></g>\n";
  }
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    const char* c = kColors[i % 8];
    const double x = X(p.step_ms), ya = Y(p.activation_bytes / kMiB), yp = Y(p.peak_allocated_bytes / kMiB);
    std::string tip = fmt("%s: step %.0f ms, activations %.1f MiB, peak allocated %.1f MiB", p.plan.c_str(), p.step_ms,
                          p.activation_bytes / kMiB, p.peak_allocated_bytes / kMiB);
    if (p.is_auto)
      tip += fmt("; budget %.1f MiB, chose %s (predicted peak %s MiB)", p.budget_bytes / kMiB, p.chosen_plan.c_str(),
                 mib_or_dash(p.predicted_peak_bytes).c_str());
    if (on_front[i]) tip += "; on the Pareto frontier";
    s += std::string("<g class=\"") + (p.is_auto ? "plan auto" : "plan") + "\"><title>" + html_escape(tip) + "</title>\n";
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"/>\n", X(p.step_ms_min),
             ya, X(p.step_ms_max), ya, c);
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"3 3\"/>\n", x, ya, x,
             yp, c);
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
  }
  const double lx = W - R + 24;
  s += fmt("<g class=\"legend\"><circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"#666\"/>"
           "<text x=\"%.1f\" y=\"%.1f\">activations (peak - persistent)</text>\n",
           lx, T + 10.0, lx + 12, T + 14.0);
  s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#fff\" stroke=\"#666\" stroke-width=\"2\"/>"
           "<text x=\"%.1f\" y=\"%.1f\">peak allocated</text></g>\n",
           lx - 5, T + 26.0, lx + 12, T + 35.0);
  double ly = T + 52.0;
  if (!front.empty()) {
    s += fmt("<g class=\"legend\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#222\" "
             "stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">Pareto frontier (peak allocated)</text></g>\n",
             lx - 7, ly, lx + 7, ly, lx + 12, ly + 4);
    ly += 16;
  }
  if (any_auto) {
    s += fmt("<g class=\"legend\"><polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"#fff\" "
             "stroke=\"#666\" stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">auto: peak allocated</text>\n",
             lx, ly - 7, lx + 7, ly, lx, ly + 7, lx - 7, ly, lx + 12, ly + 4);
    ly += 16;
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#666\" stroke-dasharray=\"6 4\"/>"
             "<text x=\"%.1f\" y=\"%.1f\">auto: memory budget</text></g>\n",
             lx - 7, ly, lx + 7, ly, lx + 12, ly + 4);
  }
  s += "</svg>\n";

  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  html_escape("remat bench: " + config) + "</title>\n" + page_style() + "</head>\n<body>\n";
  h += "<h1>Recompute plans: <code>" + html_escape(config) + "</code></h1>\n";
  h += "<p class=\"summary\">" + html_escape(subtitle) + "</p>\n" + s;
  h += "<h2>Per plan</h2>\n<table>\n<tr><th>plan</th><th>step ms</th><th>min-max</th><th>activations</th>"
       "<th>peak allocated</th><th>MFU</th><th>HFU</th><th>time ratio</th><th>memory ratio</th><th>frontier</th></tr>\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    h += fmt("<tr><td><span class=\"sw\" style=\"background:%s\"></span>", kColors[i % 8]) + html_escape(p.plan) +
         fmt("</td><td class=\"n\">%.0f</td><td class=\"n\">%.0f-%.0f</td><td class=\"n\">%.1f MiB</td>"
             "<td class=\"n\">%.1f MiB</td><td class=\"n\">%.1f%%</td><td class=\"n\">%.1f%%</td><td class=\"n\">%.2fx</td>"
             "<td class=\"n\">%.2fx</td><td>%s</td></tr>\n",
             p.step_ms, p.step_ms_min, p.step_ms_max, p.activation_bytes / kMiB, p.peak_allocated_bytes / kMiB,
             100 * p.mfu, 100 * p.hfu, p.time_ratio, p.memory_ratio, on_front[i] ? "yes" : "");
  }
  h += "</table>\n";
  if (any_auto) {
    h += "<h2>Planner (--recompute auto)</h2>\n<table>\n<tr><th>row</th><th>budget MiB</th><th>chosen plan</th>"
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
  }
  h += "</body>\n</html>\n";
  return h;
}

}  // namespace remat::tools
