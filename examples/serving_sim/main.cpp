// serving_sim: a continuous-batching LLM server simulated on pagedkv, run
// twice on the same request stream, once with paged KV memory and once
// with static max-context reservations, to show what paging buys. It uses
// only the public C ABI, as an engine would. See docs/demo.md.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "attention_check.h"
#include "device_memory.h"
#include "kv_allocator.h"
#include "options.h"
#include "pagedkv/pagedkv.h"
#include "report.h"
#include "server.h"
#include "workload.h"

namespace sim {
namespace {

constexpr int kExitUsage = 2;

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
  PoolShape shape;
  int rc = resolve_environment(&o, &run, &shape.dtype, &shape.device_type);
  if (rc >= 0) return rc;
  run.opts = o;

  pkv_status ps = PKV_OK;
  std::unique_ptr<KvAllocator> paged = make_paged_allocator(o, shape, &ps);
  if (!paged) {
    std::fprintf(stderr, "serving_sim: cannot create the pool: %s: %s\n", pkv_status_string(ps),
                 pkv_last_error_message());
    return ps == PKV_E_INVALID_ARGUMENT || ps == PKV_E_UNSUPPORTED ? kExitUsage : 1;
  }
  run.bytes_per_token = double(paged->bytes_per_block()) / o.block_size;
  const uint64_t blocks_per_max_seq = (o.max_context + o.block_size - 1) / o.block_size;
  std::unique_ptr<StaticAllocator> statik =
      make_static_allocator(o, shape, paged->bytes_per_block(), &ps);
  if (!statik || paged->usable_blocks() < blocks_per_max_seq) {
    if (ps != PKV_OK) {
      std::fprintf(stderr, "serving_sim: cannot create the static server's pool: %s: %s\n",
                   pkv_status_string(ps), pkv_last_error_message());
      return 1;
    }
    std::fprintf(stderr,
                 "serving_sim: --memory-budget %s holds %llu blocks of %u tokens, but one "
                 "%u-token sequence needs %llu (%s): raise --memory-budget or lower "
                 "--max-context\n",
                 format_bytes(double(o.memory_budget)).c_str(),
                 (unsigned long long)paged->usable_blocks(), o.block_size, o.max_context,
                 (unsigned long long)blocks_per_max_seq,
                 format_bytes(double(blocks_per_max_seq * paged->bytes_per_block())).c_str());
    return kExitUsage;
  }

  {
    const Workload workload = make_workload(o);
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

  // The same request stream through the same scheduler, once per memory
  // policy; each server has its own pool, so the two runs share nothing.
  ServeContext ctx{&run.opts, shape.dtype, shape.device_type, run.bytes_per_token, "paged"};
  run.paged = serve(paged.get(), ctx);
  paged.reset();
  ctx.label = "static";
  run.statik = serve(statik.get(), ctx);
  statik.reset();

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
