#include "server.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "progress.h"
#include "rng.h"

namespace sim {
namespace {

constexpr uint32_t kValidateEvery = 8;  // steps between pkv_pool_validate calls

std::string progress_line(const char* label, int64_t step, const Scheduler& sched,
                          const StepSample& x, uint64_t rows, uint32_t total) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s: step %lld | running %u waiting %u done %u/%u | KV %.0f%% | %.0f tok/s | "
                "preempted %llu",
                label, (long long)step, x.running, x.waiting, sched.counters().finished, total,
                x.budget_bytes ? 100.0 * double(x.reserved_bytes) / double(x.budget_bytes) : 0.0,
                x.seconds > 0 ? double(rows) / x.seconds : 0.0,
                (unsigned long long)sched.counters().preemptions);
  return buf;
}

}  // namespace

ServerRun serve(KvAllocator* alloc, const ServeContext& ctx) {
  const Options& o = *ctx.opts;
  ServerRun run;
  run.kind = alloc->kind();
  run.usable_blocks = alloc->usable_blocks();
  run.bytes_per_block = alloc->bytes_per_block();
  if (auto* st = dynamic_cast<StaticAllocator*>(alloc)) run.static_slots = st->slots();

  Workload workload = make_workload(o);
  Scheduler sched(alloc, &workload, o);
  ModelRunner runner(alloc->pool(), o, ctx.dtype, ctx.device_type);
  AttentionCheck check(ctx.dtype, o.q_heads, o.kv_heads, o.head_dim);
  Rng check_rng(mix64(o.seed ^ 0xC4EC4ull ^ (uint64_t(run.kind) << 32)));
  Progress progress(o.quiet);

  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  int64_t step = 0;
  uint64_t rows_total = 0;
  // --check-rows rows per step_tokens rows computed: the same share of the
  // work is checked on both servers, however full their steps are.
  double check_credit = o.check_rows;
  pkv_pool_stats st;
  while (!sched.done()) {
    if (sched.idle(step)) {
      step = sched.next_arrival();
      continue;
    }
    const std::vector<Chunk> chunks = sched.schedule(step);
    if (chunks.empty())
      throw std::runtime_error(std::string(server_name(run.kind)) +
                               " server: no request could be scheduled at step " +
                               std::to_string(step) + " although nothing else runs");
    uint32_t step_rows = 0;
    for (const Chunk& c : chunks) step_rows += c.count;
    const auto n_check = uint32_t(check_credit);
    check_credit += double(o.check_rows) * step_rows / o.step_tokens - n_check;
    runner.run_step(chunks, n_check, &check_rng, &check, &run.times);

    // Memory this step, while the scheduled tokens hold their slots.
    pkv_pool_stats_init(&st);
    check_status(pkv_pool_get_stats(alloc->pool(), &st), "pkv_pool_get_stats");
    StepSample x{};
    x.step = step;
    x.seconds = elapsed();
    x.running = uint32_t(sched.running().size());
    x.waiting = sched.waiting(step);
    x.used_blocks = st.num_used_blocks;
    x.pool_bytes_used = st.kv_bytes_used;
    x.reserved_bytes = alloc->reserved_bytes();
    x.budget_bytes = o.memory_budget;
    uint64_t waste = 0;
    for (const Request* r : sched.running()) {
      x.logical_tokens += r->num_appended;
      const uint64_t blocks = (r->num_appended + o.block_size - 1) / o.block_size;
      waste += blocks * o.block_size - r->num_appended;  // only a sequence's last block is partial
    }
    x.physical_tokens = x.used_blocks * o.block_size - waste;
    x.scheduled_tokens = step_rows;
    rows_total += step_rows;
    if (st.kv_bytes_per_block &&
        uint64_t(double(x.physical_tokens) * ctx.bytes_per_token) != st.kv_bytes_used)
      run.stats_mismatch_steps++;

    sched.complete(chunks, step);
    x.finished = sched.counters().finished;
    run.timeline.samples.push_back(x);
    if (step % kValidateEvery == 0 || sched.done()) {
      run.validations++;
      if (pkv_pool_validate(alloc->pool()) != PKV_OK) {
        run.validate_error = "step " + std::to_string(step) + ": " + pkv_last_error_message();
        break;
      }
    }
    progress.update(progress_line(ctx.label, step, sched, x, rows_total, o.requests));
    ++step;
  }
  progress.finish();
  run.wall_seconds = elapsed();
  run.steps = step;

  pkv_pool_stats_init(&run.stats);
  check_status(pkv_pool_get_stats(alloc->pool(), &run.stats), "pkv_pool_get_stats");
  run.counters = sched.counters();
  run.check = check.stats();
  run.lse_checked = runner.lse_checked();
  run.preemption_steps = sched.preemption_steps;
  for (const Request& r : workload.requests)
    if (r.finished)
      run.requests.push_back({r.arrival_step, r.first_admit_step, r.first_token_step, r.finish_step,
                              r.output_len, r.preemptions});
  return run;
}

}  // namespace sim
