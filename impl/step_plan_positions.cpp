// Token positions and last-token rows of a step plan: what a model's rotary
// embedding and its logits selection need, derived from the host plan's
// query offsets and context lengths. Kept apart from the page-table builder
// (step_plan.cpp) and built only when asked for.
#include <cstring>

#include "step_plan.h"

namespace pagedkv {

const char* Batch::positions_base() const {
  std::call_once(positions_once_, [this] {
    const PlanView& h = host_view_;
    const size_t T = size_t(info_.num_tokens), S = info_.num_seqs;
    std::vector<int64_t> buf(T + S);
    // Sequence s's queries are its last (qptr[s+1] - qptr[s]) tokens.
    for (size_t s = 0; s < S; ++s) {
      const int64_t lo = h.query_indptr[s], hi = h.query_indptr[s + 1];
      const int64_t first = int64_t(h.context_lens[s]) - (hi - lo);
      for (int64_t r = lo; r < hi; ++r) buf[size_t(r)] = first + (r - lo);
      buf[T + s] = hi - 1;
    }
    if (device_) {
      // Under the pool's lock like every other use of its backend; a
      // failure leaves the flag unset, so a later call tries again.
      std::lock_guard<OpMutex> lock(pool_->mu_);
      Backend& be = *pool_->backend_;
      void* d = be.allocate_async(buf.size() * sizeof(int64_t), stream_);
      try {
        be.upload(d, buf.data(), buf.size() * sizeof(int64_t), stream_);
      } catch (...) {
        be.deallocate_async(d, stream_);
        throw;
      }
      positions_device_ = d;
    }
    positions_host_ = std::move(buf);  // the upload is ordered before any free
  });
  return positions_device_ ? static_cast<const char*>(positions_device_)
                           : reinterpret_cast<const char*>(positions_host_.data());
}

TensorArg Batch::positions_arg(size_t offset_elems, int64_t len) const {
  TensorArg t;
  t.data = const_cast<char*>(positions_base() + offset_elems * sizeof(int64_t));
  t.dtype = uint32_t(DType::kI64);
  t.device_type = pool_->opts_.device_type;
  t.device_id = pool_->opts_.device_id;
  t.ndim = 1;
  t.shape[0] = len;
  t.strides[0] = 1;
  return t;
}

TensorArg Batch::token_positions() const { return positions_arg(0, int64_t(info_.num_tokens)); }

TensorArg Batch::last_token_indices() const {
  return positions_arg(size_t(info_.num_tokens), int64_t(info_.num_seqs));
}

}  // namespace pagedkv
