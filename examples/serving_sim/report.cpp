#include "report.h"

#include <algorithm>
#include <cmath>

namespace sim {

std::string with_commas(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string percent(double x) { return fmt("%.1f %%", 100.0 * x); }

}  // namespace

Summary summarize(const RunInfo& run) {
  Summary s;
  const double bpt = run.bytes_per_token;
  double reserved_sum = 0, filled_sum = 0, static_reserved_sum = 0, static_filled_sum = 0;
  for (const StepSample& x : run.timeline.samples) {
    const double reserved = double(x.used_blocks) * double(run.bytes_per_block);
    s.paged_peak_bytes = std::max(s.paged_peak_bytes, reserved);
    reserved_sum += reserved;
    filled_sum += double(x.physical_tokens) * bpt;
    static_reserved_sum += double(x.running) * run.opts.max_context * bpt;
    static_filled_sum += double(x.logical_tokens) * bpt;
    s.paged_peak_running = std::max(s.paged_peak_running, x.running);
    if (x.logical_tokens > x.physical_tokens)
      s.shared_tokens_peak = std::max(s.shared_tokens_peak, x.logical_tokens - x.physical_tokens);
  }
  const size_t n = run.timeline.samples.size();
  s.paged_mean_bytes = n ? reserved_sum / double(n) : 0;
  s.paged_util = reserved_sum > 0 ? filled_sum / reserved_sum : 0;
  s.static_util = static_reserved_sum > 0 ? static_filled_sum / static_reserved_sum : 0;
  s.static_per_seq_bytes = run.opts.max_context * bpt;
  s.static_capacity = uint64_t(std::floor(double(run.opts.memory_budget) / s.static_per_seq_bytes));
  s.static_needed_at_peak = s.paged_peak_running * s.static_per_seq_bytes;
  s.lookup_tokens = run.stats.prefix_query_tokens -
                    std::min(run.stats.prefix_query_tokens, run.counters.failed_lookup_tokens);
  s.hit_tokens = run.stats.prefix_hit_tokens -
                 std::min(run.stats.prefix_hit_tokens, run.counters.failed_lookup_hits);
  s.hit_rate = s.lookup_tokens ? double(s.hit_tokens) / double(s.lookup_tokens) : 0;
  s.kernel_seconds = run.times.prepare + run.times.write + run.times.attention;
  return s;
}

bool run_passed(const RunInfo& run) {
  return run.check.rows_failed == 0 && run.validate_error.empty() && run.chart_written &&
         (!run.opts.expect_preemption || run.counters.preemptions > 0);
}

void print_report(std::FILE* out, const RunInfo& run, const Summary& s) {
  const Options& o = run.opts;
  const Counters& c = run.counters;
  const CheckStats& ck = run.check;
  const double wall = std::max(run.wall_seconds, 1e-9);
  auto p = [out](const std::string& line) { std::fprintf(out, "%s\n", line.c_str()); };
  auto row3 = [out](const std::string& a, const std::string& b, const std::string& cc) {
    std::fprintf(out, "  %-32s %-28s %s\n", a.c_str(), b.c_str(), cc.c_str());
  };

  p("");
  p("pagedkv serving simulation: " + with_commas(o.requests) + " requests in " +
    with_commas(uint64_t(run.steps)) + " steps, " + fmt("%.1f s", run.wall_seconds) + " on " +
    run.device_name);
  p("  model      " + std::to_string(o.layers) + " layers, " + std::to_string(o.q_heads) +
    " query / " + std::to_string(o.kv_heads) + " KV heads, head dim " + std::to_string(o.head_dim) +
    ", " + run.dtype_name + ": " + format_bytes(run.bytes_per_token) + " of K+V per token");
  p("  workload   prompt p50 " + with_commas(run.prompt_p50) + " / p90 " +
    with_commas(run.prompt_p90) + " tokens, output p50 " + with_commas(run.output_p50) + " / p90 " +
    with_commas(run.output_p90) + "; " + with_commas(run.with_system_prompt) +
    " requests open with one of " + std::to_string(o.system_prompts) + " system prompts (seed " +
    std::to_string(o.seed) + ")");
  p("  pool       " + format_bytes(double(o.memory_budget)) +
    " budget: " + with_commas(run.num_blocks - 1) + " blocks of " + std::to_string(o.block_size) +
    " tokens (" + format_bytes(double(run.bytes_per_block)) +
    " each) = " + with_commas((run.num_blocks - 1) * o.block_size) + " token slots; step budget " +
    with_commas(o.step_tokens) + " tokens");
  p("");
  row3("KV memory", "paged (pagedkv)",
       "static (" + with_commas(o.max_context) + "-token reservation each)");
  row3("  reserved per sequence", "blocks as tokens arrive", format_bytes(s.static_per_seq_bytes));
  row3("  sequences admitted", with_commas(s.paged_peak_running) + " (peak concurrent)",
       with_commas(s.static_capacity) + " (= floor(" + format_bytes(double(o.memory_budget)) +
           " / " + format_bytes(s.static_per_seq_bytes) + "))");
  row3("  KV memory, peak", format_bytes(s.paged_peak_bytes) + " (blocks in use)",
       format_bytes(s.static_needed_at_peak) + " to hold as many (" +
           fmt("%.1fx the budget)", s.static_needed_at_peak / double(o.memory_budget)));
  row3("  utilisation (mean over steps)", percent(s.paged_util), percent(s.static_util));
  if (s.static_capacity > 0)
    row3("  concurrency gain",
         fmt("%.1fx", double(s.paged_peak_running) / double(s.static_capacity)), "1.0x");
  p("");
  p("  prefix cache     hit rate " + percent(s.hit_rate) + ": " + with_commas(s.hit_tokens) +
    " of " + with_commas(s.lookup_tokens) +
    " tokens looked up at admission were cached (pkv_pool_get_stats)");
  p("                   stored once for several running sequences: up to " +
    with_commas(s.shared_tokens_peak) + " tokens (" +
    format_bytes(double(s.shared_tokens_peak) * run.bytes_per_token) + ")");
  p("  preemptions      " + with_commas(c.preemptions) +
    " (PKV_E_OUT_OF_BLOCKS, victim freed and requeued); " + with_commas(c.recomputed_tokens) +
    " tokens recomputed");
  p("  throughput       prompt " + with_commas(uint64_t(double(c.prompt_tokens) / wall)) +
    " tok/s, decode " + with_commas(uint64_t(double(c.generated_tokens) / wall)) +
    " tok/s, all computed rows " +
    with_commas(uint64_t(double(c.prompt_tokens + c.decode_tokens + c.recomputed_tokens) / wall)) +
    " tok/s");
  p("  time             " + fmt("%.1f s", run.wall_seconds) + ": library " +
    fmt("%.1f s", s.kernel_seconds) + " (plan " + fmt("%.2f", run.times.prepare) + ", write " +
    fmt("%.2f", run.times.write) + ", attention " + fmt("%.2f", run.times.attention) +
    "), making K/V+queries " + fmt("%.2f", run.times.host) + ", reference check " +
    fmt("%.2f", run.times.check));
  std::string check = "  attention check  " + with_commas(ck.rows) + " rows x " +
                      std::to_string(o.q_heads) + " heads x " + std::to_string(o.head_dim) +
                      " vs float64 reference (" + with_commas(ck.rows_on_cached_prefix) +
                      " on prefix-cache hits, " + with_commas(ck.rows_after_preemption) +
                      " after preemption, context up to " + with_commas(ck.max_context_checked) +
                      "): max abs err " + fmt("%.2e", ck.max_abs_err);
  if (run.lse_checked) check += ", lse " + fmt("%.2e", ck.max_lse_abs_err);
  check += ck.rows == 0     ? ": NOT RUN"
           : ck.rows_failed ? ": FAIL (" + with_commas(ck.rows_failed) + " rows)"
                            : ": PASS";
  p(check);
  p("                   (tolerance " + fmt("%.0e", ck.atol) + " + " + fmt("%.1e", ck.rtol) +
    " x |ref| for " + run.dtype_name + " outputs" +
    (run.lse_checked ? fmt(", %.0e for lse", ck.lse_tol) : std::string()) +
    "; worst error/tolerance " + fmt("%.2f", ck.worst_ratio) + ")");
  p("  pool invariants  pkv_pool_validate x" + with_commas(run.validations) + ": " +
    (run.validate_error.empty() ? std::string("PASS") : "FAIL: " + run.validate_error));
  if (run.stats_mismatch_steps)
    p("  note             pkv_pool_stats.kv_bytes_used differed from the simulator's count in " +
      with_commas(run.stats_mismatch_steps) + " steps");
  if (o.expect_preemption)
    p(std::string("  expectation      at least one preemption: ") +
      (c.preemptions > 0 ? "PASS" : "FAIL"));
  p("  chart            " + (run.chart_written ? o.out : "NOT WRITTEN: " + run.chart_error));
  p(std::string("  result           ") + (run_passed(run) ? "PASS" : "FAIL"));
}

}  // namespace sim
