// What the simulation records every step, for the report and the chart.
#pragma once

#include <cstdint>
#include <vector>

namespace sim {

struct StepSample {
  int64_t step;
  double seconds;             // since the first step
  uint32_t running;           // sequences holding KV this step
  uint32_t waiting;           // arrived, not running (incl. preempted)
  uint32_t scheduled_tokens;  // query rows computed this step
  uint64_t used_blocks;       // pool blocks with a reference
  uint64_t physical_tokens;   // token slots filled in those blocks (shared prefixes once)
  uint64_t logical_tokens;    // sum of the running sequences' lengths
  uint64_t pool_bytes_used;   // pkv_pool_stats.kv_bytes_used, for a cross-check
  uint64_t reserved_bytes;    // what the memory policy holds for the running sequences
  uint64_t budget_bytes;      // --memory-budget
  uint32_t finished;          // requests completed by the end of this step
};

struct Timeline {
  std::vector<StepSample> samples;
};

}  // namespace sim
