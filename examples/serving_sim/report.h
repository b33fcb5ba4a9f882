// The end-of-run report: figures derived from the run, the terminal table
// and the SVG chart.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_check.h"
#include "model_runner.h"
#include "options.h"
#include "pagedkv/pagedkv.h"
#include "scheduler.h"
#include "timeline.h"

namespace sim {

struct RunInfo {
  Options opts;
  std::string dtype_name;
  std::string device_name;
  uint64_t num_blocks = 0;  // incl. the null block
  uint64_t bytes_per_block = 0;
  double bytes_per_token = 0;
  // Workload shape.
  uint32_t prompt_p50 = 0, prompt_p90 = 0, output_p50 = 0, output_p90 = 0;
  uint32_t with_system_prompt = 0;
  // Results.
  Counters counters;
  pkv_pool_stats stats;
  CheckStats check;
  bool lse_checked = false;
  StepTimes times;
  double wall_seconds = 0;
  int64_t steps = 0;
  uint64_t validations = 0;
  std::string validate_error;  // empty = every pkv_pool_validate passed
  uint64_t stats_mismatch_steps = 0;
  bool chart_written = false;
  std::string chart_error;
  Timeline timeline;
  std::vector<int64_t> preemption_steps;
};

struct Summary {
  double paged_peak_bytes = 0, paged_mean_bytes = 0, paged_util = 0;
  uint32_t paged_peak_running = 0;
  double static_per_seq_bytes = 0, static_needed_at_peak = 0, static_util = 0;
  uint64_t static_capacity = 0;
  uint64_t shared_tokens_peak = 0;  // tokens stored once for several sequences
  double hit_rate = 0;              // over admissions that went ahead
  uint64_t lookup_tokens = 0, hit_tokens = 0;
  double kernel_seconds = 0;
};

Summary summarize(const RunInfo& run);
// True if every check passed (attention, invariants, expected preemption).
bool run_passed(const RunInfo& run);
void print_report(std::FILE* out, const RunInfo& run, const Summary& s);
// Writes the chart; false with *error set when the file cannot be written.
bool write_svg_chart(const std::string& path, const RunInfo& run, const Summary& s,
                     std::string* error);

// 1234567 -> "1,234,567".
std::string with_commas(uint64_t n);

}  // namespace sim
