// serving_sim: a continuous-batching LLM server simulated on pagedkv, to
// show what paged KV memory buys over static max-context allocation. It
// uses only the public C ABI, as an engine would. See docs/demo.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "attention_check.h"
#include "device_memory.h"
#include "model_runner.h"
#include "options.h"
#include "pagedkv/pagedkv.h"
#include "progress.h"
#include "report.h"
#include "rng.h"
#include "scheduler.h"
#include "workload.h"

namespace sim {
namespace {

constexpr int kExitUsage = 2;
constexpr uint32_t kValidateEvery = 8;  // steps between pkv_pool_validate calls

uint32_t percentile(std::vector<uint32_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

// Checks the options against what this library build and machine offer.
// Returns -1 to go on, or an exit code after printing why not.
int resolve_environment(Options* o, RunInfo* run, uint32_t* dtype, int32_t* device_type) {
  const uint32_t features = pkv_features();
  if (o->dtype == "bf16" && !(features & PKV_FEATURE_BF16)) {
    if (o->dtype_given) {
      std::fprintf(stderr, "serving_sim: --dtype bf16: this libpagedkv has no bf16 support\n");
      return kExitUsage;
    }
    o->dtype = "f32";
  }
  *dtype = o->dtype == "bf16" ? PKV_DTYPE_BF16 : o->dtype == "f16" ? PKV_DTYPE_F16 : PKV_DTYPE_F32;
  run->dtype_name = o->dtype;

  const uint32_t sizes[] = {8, 16, 32, 64};
  if (std::find(std::begin(sizes), std::end(sizes), o->block_size) == std::end(sizes)) {
    std::fprintf(stderr,
                 "serving_sim: --block-size %u: the attention kernels take 8, 16, 32 or 64\n",
                 o->block_size);
    return kExitUsage;
  }
  const uint32_t dims[] = {64, 80, 96, 128, 256};
  if (std::find(std::begin(dims), std::end(dims), o->head_dim) == std::end(dims)) {
    std::fprintf(stderr,
                 "serving_sim: --head-dim %u: the attention kernels take 64, 80, 96, 128 or 256\n",
                 o->head_dim);
    return kExitUsage;
  }

  if (o->device == "cuda") {
    if (!(features & PKV_FEATURE_CUDA)) {
      std::fprintf(stderr,
                   "serving_sim: --device cuda: this libpagedkv %s was built without CUDA "
                   "(pkv_features() lacks PKV_FEATURE_CUDA); rebuild with nvcc on PATH, or use "
                   "--device cpu\n",
                   pkv_version_string());
      return kExitUsage;
    }
    const int32_t count = pkv_cuda_device_count();
    if (count <= o->device_id) {
      std::fprintf(stderr,
                   "serving_sim: --device cuda: pkv_cuda_device_count() is %d, so there is no "
                   "CUDA device %d; use --device cpu\n",
                   count, o->device_id);
      return kExitUsage;
    }
    if (!cuda_runtime_linked()) {
      std::fprintf(stderr,
                   "serving_sim: --device cuda: this serving_sim was built without the CUDA "
                   "runtime (it needs it for its own query/output buffers)\n");
      return kExitUsage;
    }
    *device_type = PKV_DEVICE_CUDA;
    run->device_name = "cuda:" + std::to_string(o->device_id);
  } else {
    *device_type = PKV_DEVICE_CPU;
    const uint32_t threads =
        o->threads ? o->threads : std::max(1u, std::thread::hardware_concurrency());
    run->device_name = "cpu, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  }
  return -1;
}

std::string progress_line(int64_t step, const Scheduler& sched, const pkv_pool_stats& st,
                          double seconds, uint64_t rows, uint32_t total) {
  const Counters& c = sched.counters();
  // As in the report: lookups of admissions that did not fit left out.
  const uint64_t looked =
      st.prefix_query_tokens - std::min(st.prefix_query_tokens, c.failed_lookup_tokens);
  const uint64_t hits = st.prefix_hit_tokens - std::min(st.prefix_hit_tokens, c.failed_lookup_hits);
  const double hit = looked ? 100.0 * double(hits) / double(looked) : 0.0;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %lld | running %zu waiting %u done %u/%u | blocks %llu/%llu (%.0f%%) | "
                "hit %.0f%% | %.0f tok/s | preempted %llu",
                (long long)step, sched.running().size(), sched.waiting(step), c.finished, total,
                (unsigned long long)st.num_used_blocks, (unsigned long long)(st.num_blocks - 1),
                100.0 * st.usage, hit, seconds > 0 ? double(rows) / seconds : 0.0,
                (unsigned long long)c.preemptions);
  return buf;
}

// Fails early, before a long run, if the chart cannot be written.
bool chart_path_writable(const std::string& path) {
  const bool existed = access(path.c_str(), F_OK) == 0;
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) return false;
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
  return true;
}

int run(Options o) {
  RunInfo run;
  if (!chart_path_writable(o.out)) {
    std::fprintf(stderr, "serving_sim: --out %s: cannot write there\n", o.out.c_str());
    return kExitUsage;
  }
  uint32_t dtype = PKV_DTYPE_F32;
  int32_t device_type = PKV_DEVICE_CPU;
  int rc = resolve_environment(&o, &run, &dtype, &device_type);
  if (rc >= 0) return rc;

  pkv_pool_options po;
  pkv_pool_options_init(&po);
  po.block_size = o.block_size;
  po.num_blocks = 0;  // as many as the budget holds
  po.memory_budget_bytes = o.memory_budget;
  po.enable_prefix_caching = 1;
  po.num_layers = o.layers;
  po.num_kv_heads = o.kv_heads;
  po.head_dim = o.head_dim;
  po.dtype = dtype;
  // FP8 storage: one K and one V scale per layer, 1/256, so that the K/V
  // values (multiples of 1/128 in [-1, 1)) use the formats' upper range.
  const std::vector<float> kv_scales(o.layers, 1.0f / 256);
  const uint32_t kv_dtype = o.kv_dtype == "fp8_e4m3"   ? PKV_DTYPE_FP8_E4M3
                            : o.kv_dtype == "fp8_e5m2" ? PKV_DTYPE_FP8_E5M2
                                                       : dtype;
  if (kv_dtype != dtype) {
    po.dtype = kv_dtype;
    po.num_kv_scales = o.layers;
    po.k_scales = kv_scales.data();
    po.v_scales = kv_scales.data();
    run.dtype_name = o.kv_dtype + " KV, " + o.dtype;
  }
  po.device_type = device_type;
  po.device_id = device_type == PKV_DEVICE_CUDA ? o.device_id : 0;
  po.num_threads = o.threads;
  pkv_pool* raw_pool = nullptr;
  const pkv_status ps = pkv_pool_create(&po, &raw_pool);
  if (ps != PKV_OK) {
    std::fprintf(stderr, "serving_sim: cannot create the pool: %s: %s\n", pkv_status_string(ps),
                 pkv_last_error_message());
    return ps == PKV_E_INVALID_ARGUMENT || ps == PKV_E_UNSUPPORTED ? kExitUsage : 1;
  }
  std::unique_ptr<pkv_pool, void (*)(pkv_pool*)> pool(raw_pool, pkv_pool_destroy);

  pkv_pool_options got;
  pkv_pool_options_init(&got);
  check_status(pkv_pool_get_options(pool.get(), &got), "pkv_pool_get_options");
  check_status(pkv_pool_bytes_per_block(pool.get(), &run.bytes_per_block),
               "pkv_pool_bytes_per_block");
  run.num_blocks = got.num_blocks;
  run.bytes_per_token = double(run.bytes_per_block) / o.block_size;
  const uint64_t usable = run.num_blocks - 1;
  const uint64_t blocks_per_max_seq = (o.max_context + o.block_size - 1) / o.block_size;
  if (usable < blocks_per_max_seq) {
    std::fprintf(stderr,
                 "serving_sim: --memory-budget %s holds %llu blocks of %u tokens, but one "
                 "%u-token sequence needs %llu: raise --memory-budget or lower --max-context\n",
                 format_bytes(double(o.memory_budget)).c_str(), (unsigned long long)usable,
                 o.block_size, o.max_context, (unsigned long long)blocks_per_max_seq);
    return kExitUsage;
  }

  Workload workload = make_workload(o);
  {
    std::vector<uint32_t> prompts, outputs;
    for (const Request& r : workload.requests) {
      prompts.push_back(r.prompt_len);
      outputs.push_back(r.output_len);
      run.with_system_prompt += r.system_prompt >= 0;
    }
    run.prompt_p50 = percentile(prompts, 0.5);
    run.prompt_p90 = percentile(prompts, 0.9);
    run.output_p50 = percentile(outputs, 0.5);
    run.output_p90 = percentile(outputs, 0.9);
  }

  Scheduler sched(pool.get(), &workload, o, usable);
  ModelRunner runner(pool.get(), o, dtype, device_type);
  AttentionCheck check(kv_dtype != dtype ? kv_dtype : dtype, o.q_heads, o.kv_heads, o.head_dim);
  Rng check_rng(mix64(o.seed ^ 0xC4EC4ull));
  Progress progress(o.quiet);

  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  int64_t step = 0;
  uint64_t rows_total = 0;
  pkv_pool_stats st;
  while (!sched.done()) {
    if (sched.idle(step)) {
      step = sched.next_arrival();
      continue;
    }
    const std::vector<Chunk> chunks = sched.schedule(step);
    if (chunks.empty())
      throw std::runtime_error("no request could be scheduled at step " + std::to_string(step) +
                               " although the pool holds a max-context sequence");
    runner.run_step(chunks, &check_rng, &check, &run.times);

    // Memory this step, while the scheduled tokens hold their slots.
    pkv_pool_stats_init(&st);
    check_status(pkv_pool_get_stats(pool.get(), &st), "pkv_pool_get_stats");
    StepSample x{};
    x.step = step;
    x.seconds = elapsed();
    x.running = uint32_t(sched.running().size());
    x.waiting = sched.waiting(step);
    x.used_blocks = st.num_used_blocks;
    x.pool_bytes_used = st.kv_bytes_used;
    uint64_t waste = 0;
    for (const Request* r : sched.running()) {
      x.logical_tokens += r->num_appended;
      const uint64_t blocks = (r->num_appended + o.block_size - 1) / o.block_size;
      waste += blocks * o.block_size - r->num_appended;  // only a sequence's last block is partial
    }
    x.physical_tokens = x.used_blocks * o.block_size - waste;
    for (const Chunk& c : chunks) x.scheduled_tokens += c.count;
    rows_total += x.scheduled_tokens;
    if (st.kv_bytes_per_block &&
        uint64_t(double(x.physical_tokens) * run.bytes_per_token) != st.kv_bytes_used)
      run.stats_mismatch_steps++;
    run.timeline.samples.push_back(x);

    sched.complete(chunks, step);
    if (step % kValidateEvery == 0 || sched.done()) {
      run.validations++;
      if (pkv_pool_validate(pool.get()) != PKV_OK) {
        run.validate_error = "step " + std::to_string(step) + ": " + pkv_last_error_message();
        break;
      }
    }
    progress.update(progress_line(step, sched, st, x.seconds, rows_total, o.requests));
    ++step;
  }
  progress.finish();
  run.wall_seconds = elapsed();
  run.steps = step;

  pkv_pool_stats_init(&run.stats);
  check_status(pkv_pool_get_stats(pool.get(), &run.stats), "pkv_pool_get_stats");
  run.opts = o;
  run.counters = sched.counters();
  run.check = check.stats();
  run.lse_checked = runner.lse_checked();
  run.preemption_steps = sched.preemption_steps;

  const Summary summary = summarize(run);
  run.chart_written = write_svg_chart(o.out, run, summary, &run.chart_error);
  print_report(stdout, run, summary);
  return run_passed(run) ? 0 : 1;
}

}  // namespace
}  // namespace sim

int main(int argc, char** argv) {
  sim::Options opts;
  const int rc = sim::parse_options(argc, argv, &opts);
  if (rc >= 0) return rc;
  try {
    return sim::run(opts);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nserving_sim: error: %s\n", e.what());
    return 1;
  }
}
