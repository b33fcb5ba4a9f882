// The chart: SVG written by hand (no dependency), three panels over the
// engine steps of both servers' runs on one x axis: KV memory in use (paged
// blocks; static reservations and the tokens they hold; the budget),
// sequences running at once, and requests completed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "report.h"

namespace sim {
namespace {

struct Line {
  std::vector<double> x, y;
  const char* color;
  std::string label;
  double width = 2;
  double opacity = 1;
  bool dashed = false;
  bool area = false;
};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '&')
      r += "&amp;";
    else if (c == '<')
      r += "&lt;";
    else if (c == '>')
      r += "&gt;";
    else if (c == '"')
      r += "&quot;";
    else
      r += c;
  }
  return r;
}

std::string text(double x, double y, const std::string& s, const char* extra = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" " + extra + ">" + escape(s) + "</text>\n";
}

// A "nice" tick step (1, 2 or 5 times a power of ten) for about n ticks.
double tick_step(double range, int n) {
  if (range <= 0) return 1;
  const double raw = range / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

std::string tick_label(double v) {
  char buf[32];
  if (std::fabs(v - std::round(v)) < 1e-9)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The first tick at or above v: the axis ends on a labelled tick.
double nice_top(double v, int n) {
  const double step = tick_step(v, n);
  return std::max(step, std::ceil(v / step - 1e-9) * step);
}

struct Panel {
  double x, y, w, h;  // plot area
  double xmax, ymax;  // both nice_top values, so no line is ever clipped
  double px(double v) const { return x + w * (xmax > 0 ? v / xmax : 0); }
  double py(double v) const { return y + h - h * v / ymax; }
};

std::string axes(const Panel& p, const std::string& title, const std::string& ylabel,
                 const std::string& xlabel) {
  std::string s;
  s += "<rect x=\"" + num(p.x) + "\" y=\"" + num(p.y) + "\" width=\"" + num(p.w) + "\" height=\"" +
       num(p.h) + "\" fill=\"#fcfcfc\" stroke=\"#999\"/>\n";
  const double ys = tick_step(p.ymax, 5);
  for (double v = 0; v <= p.ymax * 1.0001; v += ys) {
    s += "<line x1=\"" + num(p.x) + "\" x2=\"" + num(p.x + p.w) + "\" y1=\"" + num(p.py(v)) +
         "\" y2=\"" + num(p.py(v)) + "\" stroke=\"#e6e6e6\"/>\n";
    s += text(p.x - 6, p.py(v) + 4, tick_label(v), "text-anchor=\"end\" class=\"tick\"");
  }
  const double xs = tick_step(p.xmax, 10);
  for (double v = 0; v <= p.xmax * 1.0001; v += xs) {
    s += "<line x1=\"" + num(p.px(v)) + "\" x2=\"" + num(p.px(v)) + "\" y1=\"" + num(p.y) +
         "\" y2=\"" + num(p.y + p.h) + "\" stroke=\"#f0f0f0\"/>\n";
    s += text(p.px(v), p.y + p.h + 15, with_commas(uint64_t(v)),
              "text-anchor=\"middle\" class=\"tick\"");
  }
  s += text(p.x, p.y - 9, title, "class=\"panel\"");
  s += text(p.x - 50, p.y + p.h / 2, ylabel,
            ("transform=\"rotate(-90 " + num(p.x - 50) + " " + num(p.y + p.h / 2) +
             ")\" text-anchor=\"middle\" class=\"axis\"")
                .c_str());
  if (!xlabel.empty())
    s += text(p.x + p.w / 2, p.y + p.h + 32, xlabel, "text-anchor=\"middle\" class=\"axis\"");
  return s;
}

std::string stroke(const Line& l) {
  std::string s = "stroke=\"" + std::string(l.color) + "\" stroke-width=\"" + num(l.width) + "\"";
  if (l.opacity < 1) s += " stroke-opacity=\"" + num(l.opacity) + "\"";
  if (l.dashed) s += " stroke-dasharray=\"7 5\"";
  return s;
}

std::string polyline(const Panel& p, const Line& l) {
  std::string pts;
  for (size_t i = 0; i < l.x.size(); ++i) pts += num(p.px(l.x[i])) + "," + num(p.py(l.y[i])) + " ";
  std::string s;
  if (l.area && !l.x.empty()) {
    s += "<polygon points=\"" + num(p.px(l.x.front())) + "," + num(p.py(0)) + " " + pts +
         num(p.px(l.x.back())) + "," + num(p.py(0)) + "\" fill=\"" + l.color +
         "\" fill-opacity=\"0.12\" stroke=\"none\"/>\n";
  }
  s += "<polyline points=\"" + pts + "\" fill=\"none\" stroke-linejoin=\"round\" " + stroke(l) +
       "/>\n";
  return s;
}

std::string legend(double x, double y, const std::vector<const Line*>& lines) {
  std::string s;
  for (const Line* l : lines) {
    s += "<line x1=\"" + num(x) + "\" x2=\"" + num(x + 24) + "\" y1=\"" + num(y - 4) + "\" y2=\"" +
         num(y - 4) + "\" " + stroke(*l) + "/>\n";
    s += text(x + 30, y, l->label, "class=\"legend\"");
    y += 17;
  }
  return s;
}

// One point per bucket of steps (at most ~1000 per line), the bucket's
// largest value of f: peaks survive the thinning.
template <typename F>
Line series(const std::vector<StepSample>& samples, F f, const char* color, std::string label) {
  Line l;
  l.color = color;
  l.label = std::move(label);
  const size_t bucket = std::max<size_t>(1, (samples.size() + 999) / 1000);
  for (size_t i = 0; i < samples.size(); i += bucket) {
    double v = 0;
    for (size_t j = i; j < std::min(samples.size(), i + bucket); ++j)
      v = std::max(v, f(samples[j]));
    l.x.push_back(double(samples[i].step));
    l.y.push_back(v);
  }
  return l;
}

double top_of(const std::vector<const Line*>& lines) {
  double m = 0;
  for (const Line* l : lines)
    for (double v : l->y) m = std::max(m, v);
  return m;
}

}  // namespace

bool write_svg_chart(const std::string& path, const RunInfo& run, const Summary& sm,
                     std::string* error) {
  const Options& o = run.opts;
  const auto& P = run.paged.timeline.samples;
  const auto& S = run.statik.timeline.samples;
  const double mib = 1024.0 * 1024.0;
  const double bpt = run.bytes_per_token;
  const char* blue = "#1f5fbf";
  const char* red = "#d62728";

  Line p_used = series(
      P, [&](const StepSample& x) { return double(x.reserved_bytes) / mib; }, blue,
      "paged: blocks in use");
  p_used.area = true;
  Line s_res = series(
      S, [&](const StepSample& x) { return double(x.reserved_bytes) / mib; }, red,
      "static: reserved (running x max context)");
  s_res.width = 7;
  s_res.opacity = 0.35;
  Line s_held = series(
      S, [&](const StepSample& x) { return double(x.physical_tokens) * bpt / mib; }, red,
      "static: holding tokens");
  // 3% room on the right, so the last server's finish is not on the frame.
  const double xmax =
      nice_top(std::max(1.0, 1.03 * double(std::max(run.paged.steps, run.statik.steps))), 10);
  Line budget{{0, xmax},
              {double(o.memory_budget) / mib, double(o.memory_budget) / mib},
              "#222222",
              "memory budget",
              1.2};
  budget.dashed = true;
  Line p_run = series(
      P, [](const StepSample& x) { return double(x.running); }, blue, "paged");
  Line s_run = series(
      S, [](const StepSample& x) { return double(x.running); }, red, "static");
  Line p_done = series(
      P, [](const StepSample& x) { return double(x.finished); }, blue, "paged");
  Line s_done = series(
      S, [](const StepSample& x) { return double(x.finished); }, red, "static");
  // Static lines wide and pale, paged narrow and solid: equal values (a
  // light load) show as a blue line inside a red band, not one line.
  for (Line* l : {&s_held, &s_run, &s_done}) {
    l->width = 5;
    l->opacity = 0.5;
  }
  for (Line* l : {&p_used, &p_run, &p_done}) l->width = 1.6;

  const double W = 1120, H = 1010, left = 84, plot_w = 720;
  // Headroom above the highest value, so no line runs along the frame.
  const double room = 1.08;
  Panel p1{left, 104,  plot_w,
           290,  xmax, nice_top(room * top_of({&p_used, &s_res, &s_held, &budget}), 5)};
  Panel p2{left, 466,  plot_w,
           200,  xmax, nice_top(room * std::max(1.0, top_of({&p_run, &s_run})), 5)};
  // More room here: the finish labels sit above the completion lines.
  Panel p3{left, 738, plot_w, 200, xmax, nice_top(1.15 * double(o.requests), 5)};

  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
       "\" viewBox=\"0 0 " + num(W) + " " + num(H) + "\" font-family=\"sans-serif\">\n";
  s += "<style>.tick{font-size:11px;fill:#555}.axis{font-size:12px;fill:#333}"
       ".panel{font-size:14px;font-weight:bold;fill:#222}.legend{font-size:12px;fill:#222}"
       ".note{font-size:12px;fill:#222}.title{font-size:17px;font-weight:bold}</style>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += text(20, 28,
            "pagedkv serving simulation: the same " + with_commas(o.requests) +
                " requests through a paged and a static KV-cache server",
            "class=\"title\"");
  s +=
      text(20, 48,
           format_bytes(double(o.memory_budget)) + " KV budget each, max context " +
               with_commas(o.max_context) + " (static: " + std::to_string(run.statik.static_slots) +
               " reservations of " + format_bytes(sm.static_slot_bytes) + "), block " +
               std::to_string(o.block_size) + " tokens, " + std::to_string(o.layers) + " layers, " +
               run.dtype_name + " on " + run.device_name + ", seed " + std::to_string(o.seed),
           "class=\"axis\"");
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "paged finished after %s steps, static after %s (%.1fx as many); median "
                "running %.0f vs %.0f (paged peak %u)",
                with_commas(uint64_t(sm.paged.steps)).c_str(),
                with_commas(uint64_t(sm.statik.steps)).c_str(),
                sm.paged.steps ? double(sm.statik.steps) / double(sm.paged.steps) : 0.0,
                sm.paged.running_median, sm.statik.running_median, sm.paged.running_peak);
  s += text(20, 68, buf, "class=\"axis\"");

  const double lx = left + plot_w + 22;
  s += axes(p1, "KV-cache memory in use", "MiB", "");
  // Wide translucent static lines first, the thinner paged line over them,
  // the thin budget line on top: where lines coincide, each stays visible
  // (a narrow line inside a wider pale one).
  for (const Line* l : {&s_res, &s_held, &p_used, &budget}) s += polyline(p1, *l);
  s += legend(lx, p1.y + 12, {&p_used, &s_res, &s_held, &budget});
  double ny = p1.y + 100;
  auto note = [&](const std::string& line) {
    s += text(lx, ny, line, "class=\"note\"");
    ny += 17;
  };
  note("tokens / reserved, mean over steps:");
  std::snprintf(buf, sizeof buf, "  paged %.1f %%, static %.1f %%", 100 * sm.paged.util,
                100 * sm.statik.util);
  note(buf);
  std::snprintf(buf, sizeof buf, "paged prefix-cache hits %.1f %%", 100 * sm.paged.hit_rate);
  note(buf);
  note("(paged slots holding tokens: within");
  std::snprintf(buf, sizeof buf, " %.1f %% of its blocks in use)", 100 * (1 - sm.paged.util));
  note(buf);

  s += axes(p2, "Sequences running at once", "sequences", "");
  s += polyline(p2, s_run);
  s += polyline(p2, p_run);
  std::string ticks;
  for (int64_t st : run.paged.preemption_steps)
    ticks += "M" + num(p2.px(double(st))) + " " + num(p2.y + p2.h - 7) + "v7";
  Line preempt{{}, {}, "#ff7f0e", "paged preemption (tick)", 1};
  if (!ticks.empty()) s += "<path d=\"" + ticks + "\" " + stroke(preempt) + "/>\n";
  s += legend(lx, p2.y + 12, {&p_run, &s_run, &preempt});
  ny = p2.y + 75;
  std::snprintf(buf, sizeof buf, "median (peak): paged %.0f (%u),", sm.paged.running_median,
                sm.paged.running_peak);
  note(buf);
  std::snprintf(buf, sizeof buf, "  static %.0f (%u)", sm.statik.running_median,
                sm.statik.running_peak);
  note(buf);
  note("preemptions: paged " + with_commas(run.paged.counters.preemptions) + ", static " +
       with_commas(run.statik.counters.preemptions));

  s += axes(p3, "Requests completed", "requests", "engine step");
  s += polyline(p3, s_done);
  s += polyline(p3, p_done);
  // Where each server finished: a dotted rule through all three panels and
  // the step written beside the end of its completion line.
  for (const auto* r : {&run.paged, &run.statik}) {
    if (r->timeline.samples.empty()) continue;
    const double end = double(r->steps);
    const char* color = r == &run.paged ? blue : red;
    for (const Panel* p : {&p1, &p2, &p3})
      s += "<line x1=\"" + num(p->px(end)) + "\" x2=\"" + num(p->px(end)) + "\" y1=\"" + num(p->y) +
           "\" y2=\"" + num(p->y + p->h) + "\" stroke=\"" + color +
           "\" stroke-width=\"1\" stroke-dasharray=\"2 3\"/>\n";
    // Paged on the first row, right of its rule (left if near the frame);
    // static on the second, left of its rule: the two never overlap, and
    // both stay above the completion lines, which end at the requests count.
    const bool paged = r == &run.paged;
    const bool right_of = paged && p3.px(end) < p3.x + p3.w - 230;
    s += text(p3.px(end) + (right_of ? 6 : -6), p3.y + (paged ? 13 : 27),
              std::string(server_name(r->kind)) + ": all done after " + with_commas(uint64_t(end)) +
                  " steps",
              (std::string(right_of ? "" : "text-anchor=\"end\" ") +
               "class=\"note\" style=\"fill:" + color + "\"")
                  .c_str());
  }
  s += legend(lx, p3.y + 12, {&p_done, &s_done});
  ny = p3.y + 58;
  std::snprintf(buf, sizeof buf, "time to first token p50: paged %.0f,", sm.paged.ttft.p50);
  note(buf);
  std::snprintf(buf, sizeof buf, "  static %.0f steps", sm.statik.ttft.p50);
  note(buf);
  std::snprintf(buf, sizeof buf, "output tokens per step: paged %.1f,", sm.paged.tokens_per_step);
  note(buf);
  std::snprintf(buf, sizeof buf, "  static %.1f", sm.statik.tokens_per_step);
  note(buf);
  std::snprintf(buf, sizeof buf, "attention check: %s",
                run.paged.check.rows_failed + run.statik.check.rows_failed ? "FAIL" : "PASS");
  note(buf);
  s += "</svg>\n";

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    *error = "cannot open '" + path + "' for writing";
    return false;
  }
  const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  if (std::fclose(f) != 0 || !ok) {
    *error = "cannot write '" + path + "'";
    return false;
  }
  return true;
}

}  // namespace sim
