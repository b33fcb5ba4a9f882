// The chart: SVG written by hand (no dependency), two panels over the
// steps of the run: KV memory (paged vs a static max-context reservation for
// the same running sequences, and the budget), and running sequences
// (paged vs what a static allocator admits in the same budget).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "report.h"

namespace sim {
namespace {

struct Line {
  std::vector<double> y;
  const char* color;
  std::string label;
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

struct Panel {
  double x, y, w, h;  // plot area
  double xmax, ymax;
  double px(double v) const { return x + w * (xmax > 0 ? v / xmax : 0); }
  double py(double v) const { return y + h - h * std::min(v, ymax) / ymax; }
};

std::string axes(const Panel& p, const std::string& title, const std::string& ylabel,
                 const std::string& xlabel) {
  std::string s;
  s += "<rect x=\"" + num(p.x) + "\" y=\"" + num(p.y) + "\" width=\"" + num(p.w) + "\" height=\"" +
       num(p.h) + "\" fill=\"#fafafa\" stroke=\"#999\"/>\n";
  const double ys = tick_step(p.ymax, 5);
  for (double v = 0; v <= p.ymax * 1.0001; v += ys) {
    s += "<line x1=\"" + num(p.x) + "\" x2=\"" + num(p.x + p.w) + "\" y1=\"" + num(p.py(v)) +
         "\" y2=\"" + num(p.py(v)) + "\" stroke=\"#e3e3e3\"/>\n";
    s += text(p.x - 6, p.py(v) + 4, tick_label(v), "text-anchor=\"end\" class=\"tick\"");
  }
  const double xs = tick_step(p.xmax, 8);
  for (double v = 0; v <= p.xmax * 1.0001; v += xs)
    s += text(p.px(v), p.y + p.h + 16, tick_label(v), "text-anchor=\"middle\" class=\"tick\"");
  s += text(p.x, p.y - 10, title, "class=\"panel\"");
  s += text(p.x - 52, p.y + p.h / 2, ylabel,
            ("transform=\"rotate(-90 " + num(p.x - 52) + " " + num(p.y + p.h / 2) +
             ")\" text-anchor=\"middle\" class=\"axis\"")
                .c_str());
  s += text(p.x + p.w / 2, p.y + p.h + 34, xlabel, "text-anchor=\"middle\" class=\"axis\"");
  return s;
}

std::string polyline(const Panel& p, const std::vector<double>& xs, const Line& l) {
  std::string pts;
  for (size_t i = 0; i < xs.size(); ++i) pts += num(p.px(xs[i])) + "," + num(p.py(l.y[i])) + " ";
  std::string s;
  if (l.area && !xs.empty()) {
    s += "<polygon points=\"" + num(p.px(xs.front())) + "," + num(p.py(0)) + " " + pts +
         num(p.px(xs.back())) + "," + num(p.py(0)) + "\" fill=\"" + l.color +
         "\" fill-opacity=\"0.15\" stroke=\"none\"/>\n";
  }
  s += "<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"" + l.color +
       "\" stroke-width=\"2\"" + (l.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
  return s;
}

std::string legend(double x, double y, const std::vector<Line>& lines) {
  std::string s;
  for (const Line& l : lines) {
    s += "<line x1=\"" + num(x) + "\" x2=\"" + num(x + 22) + "\" y1=\"" + num(y - 4) + "\" y2=\"" +
         num(y - 4) + "\" stroke=\"" + l.color + "\" stroke-width=\"2\"" +
         (l.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
    s += text(x + 28, y, l.label, "class=\"legend\"");
    y += 18;
  }
  return s;
}

}  // namespace

bool write_svg_chart(const std::string& path, const RunInfo& run, const Summary& sm,
                     std::string* error) {
  const auto& samples = run.timeline.samples;
  const double mib = 1024.0 * 1024.0;
  const double bpt = run.bytes_per_token;
  const double budget = double(run.opts.memory_budget) / mib;

  // At most ~800 points per line: the max of each bucket keeps the peaks.
  const size_t bucket = std::max<size_t>(1, (samples.size() + 799) / 800);
  std::vector<double> xs;
  Line stat{{}, "#d62728", "static: running seqs x max context"};
  Line used{{}, "#1f77b4", "paged: blocks in use"};
  Line filled{{}, "#2ca02c", "paged: slots holding tokens"};
  Line budget_line{{}, "#444444", "memory budget", true};
  Line running{{}, "#1f77b4", "paged: running sequences"};
  Line static_cap{{}, "#d62728", "static: admitted in the same budget", true};
  used.area = true;
  for (size_t i = 0; i < samples.size(); i += bucket) {
    double a = 0, b = 0, c = 0, d = 0;
    for (size_t j = i; j < std::min(samples.size(), i + bucket); ++j) {
      const StepSample& x = samples[j];
      a = std::max(a, x.running * run.opts.max_context * bpt / mib);
      b = std::max(b, double(x.used_blocks) * double(run.bytes_per_block) / mib);
      c = std::max(c, double(x.physical_tokens) * bpt / mib);
      d = std::max(d, double(x.running));
    }
    xs.push_back(double(samples[i].step));
    stat.y.push_back(a);
    used.y.push_back(b);
    filled.y.push_back(c);
    budget_line.y.push_back(budget);
    running.y.push_back(d);
    static_cap.y.push_back(double(sm.static_capacity));
  }
  const double xmax = samples.empty() ? 1 : std::max(1.0, double(samples.back().step));
  const double static_peak = stat.y.empty() ? 0 : *std::max_element(stat.y.begin(), stat.y.end());
  // Keep the paged lines readable: a static line far above the budget is
  // cut at 3x the budget and its peak written on the chart.
  const double mem_top = std::max(budget * 1.1, std::min(static_peak * 1.05, budget * 3.0));

  const double W = 1080, H = 700;
  Panel p1{80, 80, 640, 300, xmax, mem_top};
  Panel p2{
      80,
      470,
      640,
      160,
      xmax,
      std::max<double>({1.0, double(sm.paged_peak_running), double(sm.static_capacity)}) * 1.15};

  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
       "\" viewBox=\"0 0 " + num(W) + " " + num(H) + "\" font-family=\"sans-serif\">\n";
  s += "<style>.tick{font-size:11px;fill:#555}.axis{font-size:12px;fill:#333}"
       ".panel{font-size:14px;font-weight:bold;fill:#222}.legend{font-size:12px;fill:#222}"
       ".note{font-size:12px;fill:#222}.title{font-size:17px;font-weight:bold}</style>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += text(20, 28, "pagedkv serving simulation: paged vs static KV-cache allocation",
            "class=\"title\"");
  s += text(20, 48,
            with_commas(run.opts.requests) + " requests, " +
                format_bytes(double(run.opts.memory_budget)) + " KV budget, max context " +
                with_commas(run.opts.max_context) + ", block " +
                std::to_string(run.opts.block_size) + " tokens, " +
                std::to_string(run.opts.layers) + " layers, " + run.dtype_name + " on " +
                run.device_name + ", seed " + std::to_string(run.opts.seed),
            "class=\"axis\"");

  s += axes(p1, "KV-cache memory over the run", "MiB", "engine step");
  for (const Line* l : {&used, &filled, &stat, &budget_line}) s += polyline(p1, xs, *l);
  if (static_peak > mem_top)
    s += text(p1.x + p1.w, p1.y - 10,
              "static line cut at 3x the budget; it peaks at " + format_bytes(static_peak * mib),
              "text-anchor=\"end\" class=\"note\" style=\"fill:#d62728\"");
  s += legend(p1.x + p1.w + 20, p1.y + 10, {stat, used, filled, budget_line});

  s += axes(p2, "Sequences running at once", "sequences", "engine step");
  s += polyline(p2, xs, running);
  s += polyline(p2, xs, static_cap);
  // Preemptions as ticks under the plot.
  std::string ticks;
  for (int64_t st : run.preemption_steps)
    ticks += "M" + num(p2.px(double(st))) + " " + num(p2.y + p2.h - 8) + "v8";
  if (!ticks.empty()) s += "<path d=\"" + ticks + "\" stroke=\"#ff7f0e\" stroke-width=\"1\"/>\n";
  Line preempt{{}, "#ff7f0e", "preemption (tick on the axis)"};
  s += legend(p2.x + p2.w + 20, p2.y + 10, {running, static_cap, preempt});

  // The figures the chart is about.
  const double nx = p1.x + p1.w + 20;
  double ny = p1.y + 110;
  auto note = [&](const std::string& line) {
    s += text(nx, ny, line, "class=\"note\"");
    ny += 18;
  };
  char buf[160];
  note("utilisation (tokens / reserved):");
  std::snprintf(buf, sizeof buf, "  paged %.1f %%, static %.1f %%", 100 * sm.paged_util,
                100 * sm.static_util);
  note(buf);
  std::snprintf(buf, sizeof buf, "sequences in budget: paged %u, static %llu",
                sm.paged_peak_running, (unsigned long long)sm.static_capacity);
  note(buf);
  std::snprintf(buf, sizeof buf, "prefix-cache hit rate %.1f %%", 100 * sm.hit_rate);
  note(buf);
  note("preemptions " + with_commas(run.counters.preemptions));
  std::snprintf(buf, sizeof buf, "attention check: %s (max err %.1e)",
                run.check.rows_failed ? "FAIL" : "PASS", run.check.max_abs_err);
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
