// Runs one engine step on the real library: one step plan for the
// scheduled chunks, then per layer the new K/V written into the paged cache
// and paged attention for every query row; sampled rows go to the
// reference check.
#pragma once

#include <cstdint>
#include <vector>

#include "attention_check.h"
#include "device_memory.h"
#include "options.h"
#include "pagedkv/pagedkv.h"
#include "rng.h"
#include "scheduler.h"

namespace sim {

struct StepTimes {
  double prepare = 0;    // pkv_batch_prepare (+ destroy)
  double write = 0;      // pkv_cache_write, all layers
  double attention = 0;  // pkv_attention_forward, all layers
  double host = 0;       // making the step's random K/V and queries, copies
  double check = 0;      // the float64 reference
};

class ModelRunner {
 public:
  ModelRunner(pkv_pool* pool, const Options& opts, uint32_t dtype, int32_t device_type);

  // Computes the chunks; check_rows query rows, picked at random, go to
  // the float64 reference.
  void run_step(const std::vector<Chunk>& chunks, uint32_t check_rows, Rng* rng,
                AttentionCheck* check, StepTimes* times);
  bool lse_checked() const { return use_lse_; }

 private:
  pkv_tensor tensor(void* data, uint32_t dtype, int64_t rows, int64_t heads, int64_t dim) const;

  pkv_pool* pool_;
  const Options& opts_;
  uint32_t dtype_;
  uint32_t elem_;
  int32_t device_type_;
  bool use_lse_ = true;
  uint64_t q_state_;
  // Host copies of the step's q, k, v (one layer), out and lse; on CUDA the
  // device buffers mirror them.
  std::vector<unsigned char> q_, k_, v_, out_;
  std::vector<float> lse_;
  DeviceBuffer dq_, dk_, dv_, dout_, dlse_;
};

}  // namespace sim
