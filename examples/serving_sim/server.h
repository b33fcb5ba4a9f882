// One server run: the scheduler, a memory policy and the model step, from
// the first arrival until every request has finished, with what the report
// and the chart need recorded per step and per request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention_check.h"
#include "kv_allocator.h"
#include "model_runner.h"
#include "options.h"
#include "scheduler.h"
#include "timeline.h"

namespace sim {

// Steps are engine iterations: a request arriving at step a whose first
// token comes out of step f has waited f - a + 1 steps for it.
struct RequestOutcome {
  int64_t arrival = 0, first_admit = 0, first_token = 0, finish = 0;
  uint32_t output_len = 0;
  uint32_t preemptions = 0;
};

struct ServerRun {
  ServerKind kind = ServerKind::kPaged;
  uint64_t usable_blocks = 0;
  uint64_t bytes_per_block = 0;
  uint32_t static_slots = 0;  // static only: max-context reservations
  Counters counters;
  pkv_pool_stats stats;
  CheckStats check;
  bool lse_checked = false;
  StepTimes times;
  double wall_seconds = 0;
  int64_t steps = 0;  // steps until the last request finished
  uint64_t validations = 0;
  std::string validate_error;  // empty = every pkv_pool_validate passed
  uint64_t stats_mismatch_steps = 0;
  Timeline timeline;
  std::vector<int64_t> preemption_steps;
  std::vector<RequestOutcome> requests;
};

struct ServeContext {
  const Options* opts;
  uint32_t dtype;
  int32_t device_type;
  double bytes_per_token;
  const char* label;  // progress line prefix
};

// Serves a fresh copy of the workload (make_workload(opts): the same
// request stream for every server) with alloc's memory policy.
ServerRun serve(KvAllocator* alloc, const ServeContext& ctx);

}  // namespace sim
