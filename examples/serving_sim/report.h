// The end-of-run report: figures derived from both servers' runs, the
// terminal table and the SVG chart.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "options.h"
#include "server.h"

namespace sim {

struct RunInfo {
  Options opts;
  std::string dtype_name;
  std::string device_name;
  double bytes_per_token = 0;
  // Workload shape.
  uint32_t prompt_p50 = 0, prompt_p90 = 0, output_p50 = 0, output_p90 = 0;
  uint32_t with_system_prompt = 0;
  ServerRun paged, statik;
  bool chart_written = false;
  std::string chart_error;
};

// p50 / p90 / p99 of a per-request figure.
struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0;
};

struct ServerSummary {
  int64_t steps = 0;
  double wall_seconds = 0;
  double requests_per_s = 0, tokens_per_s = 0;         // generated tokens
  double requests_per_kstep = 0, tokens_per_step = 0;  // in engine steps
  Percentiles ttft, tpot, queue;                       // steps
  double running_median = 0;
  uint32_t running_peak = 0;
  double reserved_median = 0, reserved_peak = 0;  // bytes
  double util = 0;  // mean over steps of bytes holding tokens / bytes reserved
  uint64_t lookup_tokens = 0, hit_tokens = 0;  // over admissions that went ahead
  double hit_rate = 0;
  double kernel_seconds = 0;
};

struct Summary {
  ServerSummary paged, statik;
  uint64_t shared_tokens_peak = 0;  // paged: tokens stored once for several sequences
  double static_slot_bytes = 0;
};

Summary summarize(const RunInfo& run);
// True if every check passed on both servers (attention, invariants,
// expected preemption, every request finished, the chart).
bool run_passed(const RunInfo& run);
void print_report(std::FILE* out, const RunInfo& run, const Summary& s);
// Writes the chart; false with *error set when the file cannot be written.
bool write_svg_chart(const std::string& path, const RunInfo& run, const Summary& s,
                     std::string* error);

// 1234567 -> "1,234,567".
std::string with_commas(uint64_t n);

}  // namespace sim
