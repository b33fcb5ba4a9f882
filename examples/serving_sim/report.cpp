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

// Nearest-rank percentile.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(q * double(v.size())));
  return v[std::min(v.size() - 1, rank ? rank - 1 : 0)];
}

Percentiles percentiles(const std::vector<double>& v) {
  return {percentile(v, 0.5), percentile(v, 0.9), percentile(v, 0.99)};
}

ServerSummary summarize_server(const ServerRun& r, double bytes_per_token) {
  ServerSummary s;
  s.steps = r.steps;
  s.wall_seconds = r.wall_seconds;
  const double wall = std::max(r.wall_seconds, 1e-9);
  const double steps = double(std::max<int64_t>(r.steps, 1));
  s.requests_per_s = double(r.requests.size()) / wall;
  s.tokens_per_s = double(r.counters.generated_tokens) / wall;
  s.requests_per_kstep = 1000.0 * double(r.requests.size()) / steps;
  s.tokens_per_step = double(r.counters.generated_tokens) / steps;

  std::vector<double> ttft, tpot, queue;
  for (const RequestOutcome& q : r.requests) {
    ttft.push_back(double(q.first_token - q.arrival + 1));
    queue.push_back(double(q.first_admit - q.arrival));
    if (q.output_len > 1)
      tpot.push_back(double(q.finish - q.first_token) / double(q.output_len - 1));
  }
  s.ttft = percentiles(ttft);
  s.tpot = percentiles(tpot);
  s.queue = percentiles(queue);

  std::vector<double> running, reserved;
  double reserved_sum = 0, held_sum = 0;
  for (const StepSample& x : r.timeline.samples) {
    running.push_back(x.running);
    reserved.push_back(double(x.reserved_bytes));
    s.running_peak = std::max(s.running_peak, x.running);
    s.reserved_peak = std::max(s.reserved_peak, double(x.reserved_bytes));
    reserved_sum += double(x.reserved_bytes);
    held_sum += double(x.physical_tokens) * bytes_per_token;
  }
  s.running_median = percentile(running, 0.5);
  s.reserved_median = percentile(reserved, 0.5);
  s.util = reserved_sum > 0 ? held_sum / reserved_sum : 0;

  s.lookup_tokens = r.counters.first_lookup_tokens + r.counters.readmit_lookup_tokens;
  s.hit_tokens = r.counters.first_hits_system + r.counters.first_hits_other +
                 r.counters.readmit_hits_system + r.counters.readmit_hits_own;
  s.hit_rate = s.lookup_tokens ? double(s.hit_tokens) / double(s.lookup_tokens) : 0;
  s.kernel_seconds = r.times.prepare + r.times.write + r.times.attention;
  return s;
}

bool server_passed(const RunInfo& run, const ServerRun& r) {
  // A reservation never runs out of blocks: a static preemption is a bug.
  return r.check.rows_failed == 0 && (run.opts.check_rows == 0 || r.check.rows > 0) &&
         r.validate_error.empty() && r.requests.size() == run.opts.requests &&
         (r.kind == ServerKind::kPaged || r.counters.preemptions == 0);
}

std::string pcts(const Percentiles& p, const char* f) {
  return fmt(f, p.p50) + " / " + fmt(f, p.p90) + " / " + fmt(f, p.p99);
}

std::string step_pcts(const Percentiles& p) {
  auto c = [](double v) { return with_commas(uint64_t(std::llround(v))); };
  return c(p.p50) + " / " + c(p.p90) + " / " + c(p.p99) + " steps";
}

}  // namespace

Summary summarize(const RunInfo& run) {
  Summary s;
  s.paged = summarize_server(run.paged, run.bytes_per_token);
  s.statik = summarize_server(run.statik, run.bytes_per_token);
  for (const StepSample& x : run.paged.timeline.samples)
    if (x.logical_tokens > x.physical_tokens)
      s.shared_tokens_peak = std::max(s.shared_tokens_peak, x.logical_tokens - x.physical_tokens);
  const uint64_t blocks_per_slot =
      (run.opts.max_context + run.opts.block_size - 1) / run.opts.block_size;
  s.static_slot_bytes = double(blocks_per_slot * run.statik.bytes_per_block);
  return s;
}

bool run_passed(const RunInfo& run) {
  return server_passed(run, run.paged) && server_passed(run, run.statik) && run.chart_written &&
         (!run.opts.expect_preemption || run.paged.counters.preemptions > 0);
}

void print_report(std::FILE* out, const RunInfo& run, const Summary& s) {
  const Options& o = run.opts;
  const ServerRun& P = run.paged;
  const ServerRun& S = run.statik;
  const ServerSummary& p = s.paged;
  const ServerSummary& st = s.statik;
  auto line = [out](const std::string& text) { std::fprintf(out, "%s\n", text.c_str()); };
  auto row = [out](const std::string& a, const std::string& b, const std::string& c) {
    std::fprintf(out, "  %-34s %-30s %s\n", a.c_str(), b.c_str(), c.c_str());
  };
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };

  line("");
  line("pagedkv serving simulation: " + with_commas(o.requests) +
       " requests, the same stream through two servers, on " + run.device_name);
  line("  model      " + std::to_string(o.layers) + " layers, " + std::to_string(o.q_heads) +
       " query / " + std::to_string(o.kv_heads) + " KV heads, head dim " +
       std::to_string(o.head_dim) + ", " + run.dtype_name + ": " +
       format_bytes(run.bytes_per_token) + " of K+V per token");
  line("  workload   prompt p50 " + with_commas(run.prompt_p50) + " / p90 " +
       with_commas(run.prompt_p90) + " tokens, output p50 " + with_commas(run.output_p50) +
       " / p90 " + with_commas(run.output_p90) + "; " + with_commas(run.with_system_prompt) +
       " requests open with one of " + std::to_string(o.system_prompts) + " system prompts; " +
       (o.arrival_rate > 0 ? fmt("%g arriving per step", o.arrival_rate)
                           : std::string("all arrive at step 0")) +
       " (seed " + std::to_string(o.seed) + ")");
  line("  budget     " + format_bytes(double(o.memory_budget)) +
       " of KV each. paged: " + with_commas(P.usable_blocks) + " blocks of " +
       std::to_string(o.block_size) + " tokens, taken as tokens arrive, prefix cache on. static: " +
       std::to_string(S.static_slots) + " reservations of " + with_commas(o.max_context) +
       " tokens (" + format_bytes(s.static_slot_bytes) + " each), one per running sequence");
  line("  scheduler  the same for both: " + with_commas(o.step_tokens) +
       " tokens per step (decode first, then chunked prefill), at most " + with_commas(o.max_seqs) +
       " running");
  line("");
  row("", "paged (pagedkv)", "static (max-context reservation)");
  row("all requests finished after",
      with_commas(uint64_t(p.steps)) + " steps, " + fmt("%.1f s", p.wall_seconds),
      with_commas(uint64_t(st.steps)) + " steps, " + fmt("%.1f s", st.wall_seconds));
  row("requests per 1,000 steps (per s)",
      fmt("%.1f", p.requests_per_kstep) + " (" + fmt("%.1f/s", p.requests_per_s) + ")",
      fmt("%.1f", st.requests_per_kstep) + " (" + fmt("%.1f/s", st.requests_per_s) + ")");
  row("output tokens per step (per s)",
      fmt("%.1f", p.tokens_per_step) + " (" + with_commas(uint64_t(p.tokens_per_s)) + "/s)",
      fmt("%.1f", st.tokens_per_step) + " (" + with_commas(uint64_t(st.tokens_per_s)) + "/s)");
  row("time to first token p50/p90/p99", step_pcts(p.ttft), step_pcts(st.ttft));
  row("time per output token p50/p90/p99", pcts(p.tpot, "%.2f") + " steps",
      pcts(st.tpot, "%.2f") + " steps");
  row("queueing delay p50/p90/p99", step_pcts(p.queue), step_pcts(st.queue));
  row("running sequences median (peak)",
      fmt("%.0f", p.running_median) + " (" + std::to_string(p.running_peak) + ")",
      fmt("%.0f", st.running_median) + " (" + std::to_string(st.running_peak) + ")");
  row("KV reserved median (peak)",
      format_bytes(p.reserved_median) + " (" + format_bytes(p.reserved_peak) + ")",
      format_bytes(st.reserved_median) + " (" + format_bytes(st.reserved_peak) + ")");
  row("KV utilisation (tokens / reserved)", percent(p.util), percent(st.util));
  row("preemptions (tokens recomputed)",
      with_commas(P.counters.preemptions) + " (" + with_commas(P.counters.recomputed_tokens) + ")",
      with_commas(S.counters.preemptions) + " (" + with_commas(S.counters.recomputed_tokens) + ")");
  row("prefix-cache hit rate", percent(p.hit_rate), "- (no prefix cache)");
  row("prompt tokens computed", with_commas(P.counters.prompt_tokens),
      with_commas(S.counters.prompt_tokens));
  if (o.host_tier > 0)
    row("host-tier hits (prompt tokens loaded)", with_commas(P.counters.tier_hit_tokens), "-");
  line("");
  line("  headline   in the same " + format_bytes(double(o.memory_budget)) +
       ", paging ran a median " + fmt("%.0f", p.running_median) + " sequences at once against " +
       fmt("%.0f", st.running_median) + " (" +
       fmt("%.1fx", ratio(p.running_median, st.running_median)) + "; peak " +
       std::to_string(p.running_peak) + ", " +
       fmt("%.1fx", ratio(p.running_peak, st.running_median)) + ") and finished the stream in " +
       fmt("%.1fx", ratio(double(st.steps), double(p.steps))) + " fewer engine steps");

  // Prefix-cache hits by cause (paged only).
  const Counters& c = P.counters;
  line("  prefix cache (paged)  " + with_commas(p.hit_tokens) + " of " +
       with_commas(p.lookup_tokens) + " tokens looked up at admission were cached, by cause:");
  line("    shared system prompts        " +
       with_commas(c.first_hits_system + c.readmit_hits_system) + " tokens (" +
       with_commas(c.first_hits_system) + " on first admissions, " +
       with_commas(c.readmit_hits_system) + " on re-admissions): " +
       percent(ratio(double(c.first_hits_system), double(c.first_lookup_tokens))) +
       " of first-admission lookups");
  line("    re-admission after preemption  " + with_commas(c.readmit_hits_own) + " tokens: in " +
       with_commas(c.readmissions) +
       " re-admissions, preempted requests found their own earlier blocks still cached (" +
       percent(ratio(double(c.readmit_hits_system + c.readmit_hits_own),
                     double(c.readmit_lookup_tokens))) +
       " of their lookups)");
  if (c.first_hits_other)
    line("    other                          " + with_commas(c.first_hits_other) +
         " tokens beyond a system prompt on first admissions (unexpected: user prompts are "
         "random)");
  if (run.with_system_prompt == 0)
    line(
        "    (no request opens with a system prompt, so every hit is a re-admitted request "
        "finding the blocks it computed before it was preempted: freed blocks stay in the "
        "prefix cache until evicted)");
  line("    stored once for several running sequences: up to " + with_commas(s.shared_tokens_peak) +
       " tokens (" + format_bytes(double(s.shared_tokens_peak) * run.bytes_per_token) + ")");
  if (P.stats.prefix_query_tokens - std::min(P.stats.prefix_query_tokens, c.failed_lookup_tokens) !=
      p.lookup_tokens)
    line("    note: pkv_pool_get_stats counted a different number of looked-up tokens");

  for (const ServerRun* r : {&P, &S}) {
    const ServerSummary& m = r == &P ? p : st;
    const CheckStats& ck = r->check;
    const std::string name = server_name(r->kind);
    line("  " + name + (r == &P ? "  " : " ") + " time " + fmt("%.1f s", r->wall_seconds) +
         ": library " + fmt("%.1f s", m.kernel_seconds) + " (plan " +
         fmt("%.2f", r->times.prepare) + ", write " + fmt("%.2f", r->times.write) + ", attention " +
         fmt("%.2f", r->times.attention) + "), making K/V+queries " + fmt("%.2f", r->times.host) +
         ", reference check " + fmt("%.2f", r->times.check));
    std::string check = "         attention check " + with_commas(ck.rows) + " rows x " +
                        std::to_string(o.q_heads) + " heads x " + std::to_string(o.head_dim) +
                        " vs float64 (" + with_commas(ck.rows_on_cached_prefix) +
                        " on prefix-cache hits, " + with_commas(ck.rows_after_preemption) +
                        " after preemption, context up to " + with_commas(ck.max_context_checked) +
                        "): max abs err " + fmt("%.2e", ck.max_abs_err);
    if (r->lse_checked) check += ", lse " + fmt("%.2e", ck.max_lse_abs_err);
    check += fmt(", worst error/tolerance %.2f", ck.worst_ratio);
    check += ck.rows == 0     ? ": NOT RUN"
             : ck.rows_failed ? ": FAIL (" + with_commas(ck.rows_failed) + " rows)"
                              : ": PASS";
    line(check);
    line("         pool invariants pkv_pool_validate x" + with_commas(r->validations) + ": " +
         (r->validate_error.empty() ? std::string("PASS") : "FAIL: " + r->validate_error) +
         "; requests finished " + with_commas(r->requests.size()) + "/" + with_commas(o.requests));
    if (r->stats_mismatch_steps)
      line("         note: pkv_pool_stats.kv_bytes_used differed from the simulator's count in " +
           with_commas(r->stats_mismatch_steps) + " steps");
  }
  line("  tolerance  " + fmt("%.0e", P.check.atol) + " + " + fmt("%.1e", P.check.rtol) +
       " x |ref| for " + run.dtype_name + " outputs" +
       (P.lse_checked ? fmt(", %.0e for lse", P.check.lse_tol) : std::string()));
  if (o.expect_preemption)
    line(std::string("  expectation at least one preemption (paged): ") +
         (c.preemptions > 0 ? "PASS" : "FAIL"));
  line("  chart      " + (run.chart_written ? o.out : "NOT WRITTEN: " + run.chart_error));
  line(std::string("  result     ") + (run_passed(run) ? "PASS" : "FAIL"));
}

}  // namespace sim
