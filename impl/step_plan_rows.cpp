#include "step_plan_rows.h"

#include <cstring>

namespace pagedkv {

std::shared_ptr<PlanHost> take_plan_host(std::shared_ptr<PlanHost>& spare) {
  if (spare) return std::move(spare);
  return std::make_shared<PlanHost>();
}

void reserve_plan_words(PlanHost& h, size_t words) {
  if (h.words >= words) return;
  // Headroom: decode plans grow by a page per sequence every block_size steps.
  const size_t cap = words + words / 8 + 64;
  h.data.reset(new int64_t[cap]);
  h.words = cap;
}

size_t fill_page_rows(const PlanHost* prev, PlanHost& now, const SeqId* seqs, Sequence* const* live,
                      const int32_t* pptr, int32_t* pidx, uint32_t num_seqs) noexcept {
  const uint32_t prev_n = prev ? uint32_t(prev->seqs.size()) : 0;
  const char* pbase = prev ? reinterpret_cast<const char*>(prev->data.get()) : nullptr;
  const int32_t* prev_pptr =
      prev ? reinterpret_cast<const int32_t*>(pbase + prev->page_indptr_off) : nullptr;
  const int32_t* prev_pidx =
      prev ? reinterpret_cast<const int32_t*>(pbase + prev->page_indices_off) : nullptr;
  size_t copied = 0;
  uint32_t run = 0, run_len = 0;  // rows [run, run + run_len) to copy from prev
  const auto flush = [&] {
    if (run_len == 0) return;
    std::memcpy(pidx + pptr[run], prev_pidx + prev_pptr[run],
                size_t(pptr[run + run_len] - pptr[run]) * sizeof(int32_t));
    copied += run_len;
    run_len = 0;
  };
  for (uint32_t i = 0; i < num_seqs; ++i) {
    const Sequence& s = *live[i];
    now.seqs[i] = seqs[i];
    now.table_versions[i] = s.table_version;
    const int32_t np = pptr[i + 1] - pptr[i];
    const bool same = i < prev_n && prev->seqs[i] == seqs[i] &&
                      prev->table_versions[i] == s.table_version &&
                      prev_pptr[i + 1] - prev_pptr[i] == np;
    if (same) {
      if (run_len == 0) run = i;
      ++run_len;
      continue;
    }
    flush();
    std::memcpy(pidx + pptr[i], s.blocks.data(), size_t(np) * sizeof(int32_t));
  }
  flush();
  return copied;
}

void remember_plan(std::shared_ptr<PlanHost>& last, std::shared_ptr<PlanHost>& spare,
                   std::shared_ptr<PlanHost> now) noexcept {
  std::shared_ptr<PlanHost> old = std::move(last);
  last = std::move(now);
  recycle_plan_host(spare, std::move(old));
}

void recycle_plan_host(std::shared_ptr<PlanHost>& spare, std::shared_ptr<PlanHost> host) noexcept {
  if (host && host.use_count() == 1 && (!spare || spare->words < host->words))
    spare = std::move(host);
}

}  // namespace pagedkv
