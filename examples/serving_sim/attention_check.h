// The float64 reference for sampled attention rows: rebuilds the row's
// keys and values contiguously from the request's context hashes (the same
// numbers the step wrote into the paged cache, possibly steps ago and
// possibly by another request that shared the prefix) and compares every
// output element, and the log-sum-exp, with what pagedkv returned.
#pragma once

#include <cstdint>
#include <vector>

#include "workload.h"

namespace sim {

struct CheckStats {
  uint64_t rows = 0;
  uint64_t rows_on_cached_prefix = 0;  // the request attached prefix-cache blocks
  uint64_t rows_after_preemption = 0;  // the request had been preempted and recomputed
  uint64_t rows_failed = 0;
  uint64_t lse_rows = 0;
  double max_abs_err = 0;      // output elements
  double max_lse_abs_err = 0;  // log-sum-exp values
  double worst_ratio = 0;      // max over elements of error / tolerance (> 1 fails)
  double atol = 0, rtol = 0, lse_tol = 0;
  uint64_t max_context_checked = 0;
};

class AttentionCheck {
 public:
  AttentionCheck(uint32_t dtype, uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim);

  // q_row and out_row: [q_heads * head_dim] as the kernels saw and produced
  // them; lse_row: [q_heads] or nullptr. Query at position pos of r.
  void check_row(const Request& r, uint64_t pos, uint32_t layer, const float* q_row,
                 const float* out_row, const float* lse_row);

  const CheckStats& stats() const { return stats_; }
  bool passed() const { return stats_.rows_failed == 0; }

 private:
  uint32_t q_heads_, kv_heads_, head_dim_;
  CheckStats stats_;
  std::vector<float> k_, v_;  // [pos + 1][kv_heads][head_dim]
  std::vector<double> logits_;
};

}  // namespace sim
