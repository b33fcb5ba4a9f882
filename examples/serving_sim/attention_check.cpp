#include "attention_check.h"

#include <algorithm>
#include <cmath>

#include "kv_values.h"
#include "pagedkv/pagedkv.h"

namespace sim {

AttentionCheck::AttentionCheck(uint32_t dtype, uint32_t q_heads, uint32_t kv_heads,
                               uint32_t head_dim)
    : q_heads_(q_heads), kv_heads_(kv_heads), head_dim_(head_dim) {
  // Inputs are exact in every dtype; what differs is the kernels' internal
  // precision and the rounding of the output (bf16 keeps 8 significant
  // bits, f16 11). A wrong or stale K/V entry moves outputs by about their
  // own magnitude, far beyond these.
  if (dtype == PKV_DTYPE_FP8_E4M3 || dtype == PKV_DTYPE_FP8_E5M2) {
    // FP8 storage rounds each K/V value to 3 (E4M3) or 2 (E5M2) mantissa
    // bits: up to 6% / 12% of its magnitude (values are at most 1).
    stats_.atol = dtype == PKV_DTYPE_FP8_E4M3 ? 0.1 : 0.2;
    stats_.rtol = 0.0;
  } else if (dtype == PKV_DTYPE_BF16) {
    stats_.atol = 1e-3;
    stats_.rtol = 1.6e-2;
  } else if (dtype == PKV_DTYPE_F16) {
    stats_.atol = 2e-4;
    stats_.rtol = 2e-3;
  } else {
    stats_.atol = 5e-5;
    stats_.rtol = 5e-5;
  }
  // FP8 keys move the logits by about |q| |k| 2^-4 / sqrt(D) each.
  stats_.lse_tol = dtype == PKV_DTYPE_FP8_E4M3 ? 0.5 : dtype == PKV_DTYPE_FP8_E5M2 ? 1.0 : 2e-3;
}

void AttentionCheck::check_row(const Request& r, uint64_t pos, uint32_t layer, const float* q_row,
                               const float* out_row, const float* lse_row) {
  const uint64_t n = pos + 1;  // causal: keys 0..pos
  const size_t row = size_t(kv_heads_) * head_dim_;
  k_.resize(n * row);
  v_.resize(n * row);
  logits_.resize(n);
  for (uint64_t j = 0; j < n; ++j)
    for (uint32_t h = 0; h < kv_heads_; ++h) {
      kv_head_values(r.context_hash[j], layer, 0, h, head_dim_, &k_[j * row + h * head_dim_]);
      kv_head_values(r.context_hash[j], layer, 1, h, head_dim_, &v_[j * row + h * head_dim_]);
    }

  const double scale = 1.0 / std::sqrt(double(head_dim_));
  const uint32_t group = q_heads_ / kv_heads_;
  bool failed = false;
  for (uint32_t qh = 0; qh < q_heads_; ++qh) {
    const uint32_t kh = qh / group;
    const float* q = q_row + size_t(qh) * head_dim_;
    double max_logit = -INFINITY;
    for (uint64_t j = 0; j < n; ++j) {
      const float* k = &k_[j * row + kh * head_dim_];
      double dot = 0;
      for (uint32_t d = 0; d < head_dim_; ++d) dot += double(q[d]) * double(k[d]);
      logits_[j] = dot * scale;
      max_logit = std::max(max_logit, logits_[j]);
    }
    double sum = 0;
    for (uint64_t j = 0; j < n; ++j) sum += (logits_[j] = std::exp(logits_[j] - max_logit));
    for (uint32_t d = 0; d < head_dim_; ++d) {
      double acc = 0;
      for (uint64_t j = 0; j < n; ++j) acc += logits_[j] * double(v_[j * row + kh * head_dim_ + d]);
      const double ref = acc / sum;
      const double got = out_row[size_t(qh) * head_dim_ + d];
      const double err = std::fabs(got - ref);  // NaN compares false below
      const double tol = stats_.atol + stats_.rtol * std::fabs(ref);
      if (!(err <= tol)) failed = true;
      if (std::isfinite(err)) {
        stats_.max_abs_err = std::max(stats_.max_abs_err, err);
        stats_.worst_ratio = std::max(stats_.worst_ratio, err / tol);
      } else {
        stats_.max_abs_err = INFINITY;
        stats_.worst_ratio = INFINITY;
      }
    }
    if (lse_row) {
      const double ref = max_logit + std::log(sum);
      const double err = std::fabs(double(lse_row[qh]) - ref);
      if (!(err <= stats_.lse_tol)) failed = true;
      stats_.max_lse_abs_err =
          std::max(stats_.max_lse_abs_err, std::isfinite(err) ? err : INFINITY);
    }
  }
  stats_.rows++;
  stats_.lse_rows += lse_row != nullptr;
  stats_.rows_on_cached_prefix += r.cached_at_admit > 0;
  stats_.rows_after_preemption += r.preemptions > 0;
  stats_.rows_failed += failed;
  stats_.max_context_checked = std::max(stats_.max_context_checked, n);
}

}  // namespace sim
